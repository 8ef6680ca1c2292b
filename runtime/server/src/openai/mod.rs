//! The OpenAI-compatible routes: `/v1/completions` and `/v1/chat/completions`.

mod chat;
pub(crate) mod tools;

pub use chat::chat_completions;

use super::dispatch::{self, Job, SampleResult, Timing};
use super::error::{parse_json, ApiError};
use super::sse;
use super::validate::{self, GrammarSpec, OneOrMany, RawSamplingParams};
use super::AppState;
use crate::auth::Tenant;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use sglrs_model::chat::RenderOptions;
use sglrs_scheduler::{AbortReason, FinishReason, SchedEvent, TokenLogprob};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
    continuous_usage_stats: Option<bool>,
}

/// `prompt` of `/v1/completions`.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<i64>),
    IdBatch(Vec<Vec<i64>>),
}

/// The sampling fields `/v1/completions` and `/v1/chat/completions` share (OpenAI's plus
/// SGLang's extensions), flattened into both request bodies.
#[derive(Deserialize, Debug, Clone, Default)]
struct SamplingFields {
    temperature: Option<f64>,
    top_p: Option<f64>,
    n: Option<i64>,
    stop: Option<OneOrMany<String>>,
    seed: Option<u64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    repetition_penalty: Option<f64>,
    logit_bias: Option<HashMap<String, f64>>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    min_tokens: Option<i64>,
    ignore_eos: Option<bool>,
    stop_token_ids: Option<Vec<i64>>,
    stop_regex: Option<OneOrMany<String>>,
    regex: Option<String>,
    ebnf: Option<String>,
    /// SGLang's extension (sglang-router sends it on every request).
    no_stop_trim: Option<bool>,
    /// vLLM's and SGLang's extension (sglang-router sends it on every request).
    skip_special_tokens: Option<bool>,
    /// SGLang's extension; sglrs returns no hidden states, so only `false` is accepted.
    return_hidden_states: Option<bool>,
    /// vLLM's guided decoding: a JSON Schema (object or JSON text).
    guided_json: Option<Value>,
    /// vLLM's guided decoding: a regex.
    guided_regex: Option<String>,
    /// vLLM's guided decoding: the output is exactly one of these strings.
    guided_choice: Option<Vec<String>>,
    /// vLLM's guided decoding: a grammar (GBNF, as xgrammar reads it).
    guided_grammar: Option<String>,
    /// llama.cpp's name for `repetition_penalty`.
    repeat_penalty: Option<f64>,
    /// llama.cpp's name for the token budget.
    n_predict: Option<i64>,
    /// llama.cpp's GBNF grammar.
    grammar: Option<String>,
    /// A JSON Schema, as an object (llama.cpp's `json_schema`) or as JSON text (sglrs'
    /// extension on `/v1/completions`).
    json_schema: Option<Value>,
    /// llama.cpp's prompt-cache switch: prefix reuse is always on here, so only `true` is
    /// accepted.
    cache_prompt: Option<bool>,
    /// Prefill/decode disaggregation (SGLang's router adds these; `docs/pd.md`).
    bootstrap_host: Option<Value>,
    /// See `bootstrap_host`.
    bootstrap_port: Option<Value>,
    /// See `bootstrap_host`.
    bootstrap_room: Option<Value>,
}

impl SamplingFields {
    /// The request's bootstrap fields, checked against this server's role.
    fn bootstrap(
        &self,
        state: &AppState,
        batch: usize,
    ) -> Result<Option<crate::pd::Bootstrap>, ApiError> {
        self.bootstrap_for(
            state.pd.as_ref().map(|p| (p.mode(), p.bootstrap_port())),
            batch,
        )
    }

    /// [`bootstrap`](Self::bootstrap) for a server of PD role `role`.
    fn bootstrap_for(
        &self,
        role: Option<(crate::pd::DisaggMode, u16)>,
        batch: usize,
    ) -> Result<Option<crate::pd::Bootstrap>, ApiError> {
        crate::pd::bootstrap(
            role,
            self.bootstrap_host.as_ref(),
            self.bootstrap_port.as_ref(),
            self.bootstrap_room.as_ref(),
            batch,
            self.n.map_or(1, |n| n.max(1) as usize),
        )
    }
}

/// A JSON Schema given as an object or as JSON text, as text.
fn schema_text(name: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Object(_) | Value::Bool(_) => Ok(v.to_string()),
        _ => Err(ApiError::bad(
            name,
            "must be a JSON Schema object or its JSON text",
        )),
    }
}

/// A regex matching exactly one of `choices` (vLLM's `guided_choice`).
fn choice_regex(choices: &[String]) -> Result<String, ApiError> {
    if choices.is_empty() {
        return Err(ApiError::bad("guided_choice", "is empty"));
    }
    let alts: Vec<String> = choices.iter().map(|c| regex_escape(c)).collect();
    Ok(format!("(?:{})", alts.join("|")))
}

/// `s` with every regex metacharacter escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl SamplingFields {
    /// The native sampling parameters these fields stand for; other engines' names for the
    /// same things (vLLM's `guided_*`, llama.cpp's `repeat_penalty`, `n_predict`, `grammar`,
    /// `json_schema`) are mapped here, and two names given for one thing are a 400.
    fn to_raw(&self, max_new_tokens: Option<i64>) -> Result<RawSamplingParams, ApiError> {
        if self.return_hidden_states == Some(true) {
            return Err(ApiError::bad(
                "return_hidden_states",
                "hidden states are not returned by this server",
            ));
        }
        if self.cache_prompt == Some(false) {
            return Err(ApiError::bad(
                "cache_prompt",
                "prefix caching cannot be turned off per request here (use cache_salt to keep a request's prefix apart)",
            ));
        }
        let max_new_tokens = match (max_new_tokens, self.n_predict) {
            (Some(a), Some(b)) if a != b => {
                return Err(ApiError::bad("n_predict", "conflicts with max_tokens"))
            }
            (a, b) => a.or(b),
        };
        let repetition_penalty = match (self.repetition_penalty, self.repeat_penalty) {
            (Some(a), Some(b)) if a != b => {
                return Err(ApiError::bad(
                    "repeat_penalty",
                    "conflicts with repetition_penalty",
                ))
            }
            (a, b) => a.or(b),
        };
        let mut regex = None;
        let mut ebnf = None;
        let mut json_schema = None;
        let mut given: Vec<&str> = Vec::new();
        for (name, v) in [("regex", &self.regex), ("guided_regex", &self.guided_regex)] {
            if let Some(r) = v {
                given.push(name);
                regex = Some(r.clone());
            }
        }
        if let Some(c) = &self.guided_choice {
            given.push("guided_choice");
            regex = Some(choice_regex(c)?);
        }
        for (name, v) in [
            ("ebnf", &self.ebnf),
            ("guided_grammar", &self.guided_grammar),
            ("grammar", &self.grammar),
        ] {
            if let Some(g) = v {
                given.push(name);
                ebnf = Some(g.clone());
            }
        }
        for (name, v) in [
            ("guided_json", &self.guided_json),
            ("json_schema", &self.json_schema),
        ] {
            if let Some(j) = v {
                given.push(name);
                json_schema = Some(schema_text(name, j)?);
            }
        }
        if given.len() > 1 {
            return Err(ApiError::invalid(format!(
                "give only one grammar: {} were given",
                given.join(", ")
            )));
        }
        Ok(RawSamplingParams {
            max_new_tokens,
            min_new_tokens: self.min_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repetition_penalty,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            stop_regex: self.stop_regex.clone(),
            ignore_eos: self.ignore_eos,
            n: self.n,
            regex,
            ebnf,
            json_schema,
            logit_bias: self.logit_bias.clone(),
            sampling_seed: self.seed,
            no_stop_trim: self.no_stop_trim,
            skip_special_tokens: self.skip_special_tokens,
            ..Default::default()
        })
    }
}

/// Parses an OpenAI request body whose struct flattens [`SamplingFields`] and collects
/// whatever is left in `rest`: serde's `deny_unknown_fields` does not combine with
/// `flatten`, so an unknown field is refused here, by name, instead.
fn parse_body<T: serde::de::DeserializeOwned + HasRest>(body: &[u8]) -> Result<T, ApiError> {
    let v: T = parse_json(body)?;
    if let Some(k) = v.rest().keys().next() {
        return Err(ApiError::BadRequest {
            message: format!("invalid request body: unknown field `{k}`"),
            param: Some(k.clone()),
        });
    }
    Ok(v)
}

/// A request body with a catch-all map for the fields no struct member took.
trait HasRest {
    fn rest(&self) -> &serde_json::Map<String, Value>;
}

#[derive(Deserialize, Debug)]
struct RawCompletion {
    model: Option<String>,
    prompt: Prompt,
    max_tokens: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    logprobs: Option<i64>,
    echo: Option<bool>,
    user: Option<String>,
    /// Cache namespace (vLLM's `cache_salt`).
    cache_salt: Option<String>,
    #[serde(flatten)]
    sampling: SamplingFields,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

impl HasRest for RawCompletion {
    fn rest(&self) -> &serde_json::Map<String, Value> {
        &self.rest
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None => Ok(()),
        Some(m)
            if m == state.info.served_model_name
                || m == state.info.model_path
                || m == "default" =>
        {
            Ok(())
        }
        Some(m) => Err(ApiError::NotFound(format!(
            "model {m:?} is not served here (serving {:?})",
            state.info.served_model_name
        ))),
    }
}

/// OpenAI `finish_reason`.
fn finish_str(r: Option<&FinishReason>) -> Value {
    match r {
        None => Value::Null,
        Some(FinishReason::Length(_)) => json!("length"),
        Some(FinishReason::Abort(_)) => json!("abort"),
        Some(_) => json!("stop"),
    }
}

fn matched_stop(r: Option<&FinishReason>) -> Value {
    match r {
        Some(FinishReason::StopToken(t)) => json!(t),
        Some(FinishReason::StopString(s)) => json!(s),
        _ => Value::Null,
    }
}

fn usage(results: &[SampleResult]) -> Value {
    let prompt = results.first().map_or(0, |r| r.prompt_tokens);
    let cached = results.first().map_or(0, |r| r.cached_tokens);
    let details = results.first().map(|r| r.cached).unwrap_or_default();
    let completion: usize = results.iter().map(|r| r.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "cached_tokens_details": details},
    })
}

fn usage_sum(all: &[Vec<SampleResult>]) -> Value {
    let mut p = 0;
    let mut c = 0;
    let mut k = 0;
    for rs in all {
        let u = usage(rs);
        p += u["prompt_tokens"].as_u64().unwrap_or(0);
        c += u["completion_tokens"].as_u64().unwrap_or(0);
        k += u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
    }
    json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
           "prompt_tokens_details": {"cached_tokens": k}})
}

/// Internal failures surface as HTTP 500 for non-streaming requests.
fn fail_on_abort(all: &[Vec<SampleResult>]) -> Result<(), ApiError> {
    crate::dispatch::refused_in_queue(all)?;
    for r in all.iter().flatten() {
        match &r.finish {
            // The request's own grammar cannot be followed (too ambiguous): its fault.
            Some(FinishReason::Abort(AbortReason::Grammar(m))) => {
                return Err(ApiError::BadRequest {
                    message: format!("grammar: {m}"),
                    param: None,
                });
            }
            Some(FinishReason::Abort(m)) => {
                return Err(ApiError::Internal(format!("generation aborted: {m}")));
            }
            _ => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- /v1/completions

fn completion_logprobs(state: &AppState, entries: &[TokenLogprob], offset0: usize) -> Value {
    let mut offset = offset0;
    let mut tokens = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for e in entries {
        let t = state.token_text(e.token);
        offsets.push(offset);
        offset += t.len();
        tokens.push(t);
        lps.push(e.logprob);
        tops.push(if e.logprob.is_none() {
            Value::Null
        } else {
            let m: serde_json::Map<String, Value> = e
                .top
                .iter()
                .map(|&(id, l)| (state.token_text(id), json!(l)))
                .collect();
            Value::Object(m)
        });
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// A `/v1/completions` body's jobs, checked (everything short of the model name, compiling
/// the grammars and submitting), with its `echo` and `logprobs`. `encode` tokenizes a text
/// prompt.
fn completion_jobs(
    raw: &RawCompletion,
    limits: validate::Limits,
    role: Option<(crate::pd::DisaggMode, u16)>,
    encode: &dyn Fn(&str) -> Result<Vec<u32>, ApiError>,
) -> Result<(Vec<Job>, bool, Option<i64>), ApiError> {
    let _ = &raw.user;
    let prompts: Vec<Vec<u32>> = match &raw.prompt {
        Prompt::Text(t) => vec![encode(t)?],
        Prompt::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        Prompt::Ids(ids) => vec![validate::check_input_ids(ids, limits)?],
        Prompt::IdBatch(b) => b
            .iter()
            .map(|ids| validate::check_input_ids(ids, limits))
            .collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::bad("prompt", "is empty"));
    }
    // OpenAI's default of 16 tokens, unless llama.cpp's n_predict names the budget.
    let max = raw.max_tokens.or(if raw.sampling.n_predict.is_some() {
        None
    } else {
        Some(16)
    });
    let sp = raw.sampling.to_raw(max)?;
    let echo = raw.echo.unwrap_or(false);
    let top = match raw.logprobs {
        None => None,
        Some(v) if (0..=5).contains(&v) => Some(v),
        Some(v) => return Err(ApiError::bad("logprobs", format!("{v} is outside 0..=5"))),
    };
    let namespace = validate::cache_salt(raw.cache_salt.as_deref())?;
    let bootstrap = raw.sampling.bootstrap_for(role, prompts.len())?;
    let mut jobs = Vec::new();
    for ids in prompts {
        let max_name = if raw.max_tokens.is_some() {
            "max_tokens"
        } else {
            "max_tokens (default 16)"
        };
        let params = validate::check_params(&sp, ids.len(), limits, max_name)?;
        let logprobs = validate::check_logprobs(
            top.is_some(),
            if echo { Some(0) } else { None },
            top,
            None,
            ids.len(),
            limits,
        )?;
        jobs.push(Job {
            input_ids: ids,
            params,
            logprobs,
            priority: 0,
            namespace,
            bootstrap: bootstrap.clone(),
        });
    }
    Ok((jobs, echo, top))
}

/// Parses and checks a `POST /v1/completions` body exactly as the handler does before it
/// compiles grammars and submits, without an engine (tests and fuzzing): the checked
/// parameters of each job. `encode` stands for the tokenizer; the server is not a PD role.
pub fn check_completion_body(
    body: &[u8],
    limits: validate::Limits,
    encode: &dyn Fn(&str) -> Result<Vec<u32>, ApiError>,
) -> Result<Vec<validate::ValidParams>, ApiError> {
    let raw: RawCompletion = parse_body(body)?;
    let (jobs, _, _) = completion_jobs(&raw, limits, None, encode)?;
    Ok(jobs.into_iter().map(|j| j.params).collect())
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    tenant: Option<Extension<Tenant>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    state
        .metrics
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let raw: RawCompletion = parse_body(&body)?;
    check_model(&state, raw.model.as_deref())?;
    let role = state.pd.as_ref().map(|p| (p.mode(), p.bootstrap_port()));
    let (jobs, echo, top) = completion_jobs(&raw, state.limits(), role, &|t| state.encode(t))?;
    let prompt_texts: Vec<String> = jobs
        .iter()
        .map(|j| {
            if echo {
                state
                    .tokenizer
                    .decode(&j.input_ids, false)
                    .unwrap_or_default()
            } else {
                String::new()
            }
        })
        .collect();
    for j in &jobs {
        if let Some(g) = &j.params.grammar {
            state.grammars.get(g).await?;
        }
    }
    let running = dispatch::submit_all(&state, &tenant.unwrap_or_default().0, jobs).await?;
    let id = format!("cmpl-{:016x}", running.first().map_or(0, |r| r.id));
    let model = state.info.served_model_name.clone();
    let created = now_secs();
    if raw.stream.unwrap_or(false) {
        let include_usage = raw
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let _ = raw
            .stream_options
            .as_ref()
            .and_then(|o| o.continuous_usage_stats);
        let (tx, resp) = sse::channel();
        sse::spawn(tx.clone(), async move {
            let mut all = Vec::new();
            for (pi, mut job) in running.into_iter().enumerate() {
                let mut results = job.results();
                let mut timing = Timing::new(start);
                if echo {
                    for s in 0..job.n {
                        let c = json!({"id": id, "object": "text_completion", "created": created, "model": model,
                            "choices": [{"index": pi * job.n + s, "text": prompt_texts[pi], "logprobs": null, "finish_reason": null}]});
                        if tx.send(c.to_string()).await.is_err() {
                            return;
                        }
                    }
                }
                while results.iter().any(|r| r.finish.is_none()) {
                    let Ok(ev) = sse::recv(&mut job.rx, &tx).await else {
                        return; // client gone: dropping `job.rx` aborts the request
                    };
                    let Some(ev) = ev else { break };
                    let (text, finished) = match &ev {
                        SchedEvent::Delta { text, tokens, .. } => {
                            if !tokens.is_empty() {
                                timing.on_tokens(&state);
                            }
                            (text.clone(), false)
                        }
                        SchedEvent::Finished { .. } => (String::new(), true),
                        SchedEvent::InputLogprobs { .. } | SchedEvent::KvExport { .. } => continue,
                    };
                    let Some(s) = dispatch::apply(&mut results, ev) else {
                        continue;
                    };
                    if text.is_empty() && !finished {
                        continue;
                    }
                    let c = json!({"id": id, "object": "text_completion", "created": created, "model": model,
                        "choices": [{"index": pi * job.n + s, "text": text, "logprobs": null,
                                     "finish_reason": if finished { finish_str(results[s].finish.as_ref()) } else { Value::Null },
                                     "matched_stop": if finished { matched_stop(results[s].finish.as_ref()) } else { Value::Null }}]});
                    if tx.send(c.to_string()).await.is_err() {
                        return;
                    }
                }
                state.metrics.e2e.observe(timing.elapsed());
                all.push(results);
            }
            if include_usage {
                let c = json!({"id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [], "usage": usage_sum(&all)});
                let _ = tx.send(c.to_string()).await;
            }
            let _ = tx.send("[DONE]".to_string()).await;
        });
        return Ok(resp);
    }
    let all = dispatch::collect_all(&state, running, start).await;
    fail_on_abort(&all)?;
    let mut choices = Vec::new();
    for (pi, results) in all.iter().enumerate() {
        for (s, r) in results.iter().enumerate() {
            let mut text = r.text.clone();
            let mut lp = Value::Null;
            if top.is_some() {
                let mut entries = Vec::new();
                if echo {
                    entries.extend(r.input_logprobs.iter().cloned());
                }
                entries.extend(r.logprobs.iter().cloned());
                lp = completion_logprobs(&state, &entries, 0);
            }
            if echo {
                text = format!("{}{}", prompt_texts[pi], text);
            }
            choices.push(json!({"index": pi * results.len() + s, "text": text, "logprobs": lp,
                "finish_reason": finish_str(r.finish.as_ref()), "matched_stop": matched_stop(r.finish.as_ref())}));
        }
    }
    Ok(Json(
        json!({"id": id, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "usage": usage_sum(&all)}),
    )
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: validate::Limits = validate::Limits {
        max_context: 64,
        vocab_size: 100,
    };

    fn bytes(t: &str) -> Result<Vec<u32>, ApiError> {
        Ok(t.bytes().map(u32::from).collect())
    }

    #[test]
    fn a_completion_body_is_checked_without_an_engine() {
        let ok = br#"{"prompt": ["ab", "c"], "guided_choice": ["yes", "no"]}"#;
        let jobs = check_completion_body(ok, LIMITS, &bytes).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].stop.max_new_tokens, 16);
        assert_eq!(
            jobs[0].grammar,
            Some(GrammarSpec::Regex("(?:yes|no)".into()))
        );
        for body in [
            &br#"{"prompt": "a", "max_tokens": 99}"#[..],
            br#"{"prompt": "a", "regex": "a", "grammar": "root ::= \"a\""}"#,
            br#"{"prompt": "a", "logprobs": 6}"#,
            br#"{"prompt": "a", "nope": 1}"#,
        ] {
            let e = check_completion_body(body, LIMITS, &bytes).unwrap_err();
            assert!(matches!(e, ApiError::BadRequest { .. }), "{e:?}");
        }
    }
}
