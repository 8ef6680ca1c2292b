//! SGLang's native `POST /generate`.

use super::dispatch::{self, Job, Running, SampleResult, Timing};
use super::error::{parse_json, ApiError};
use super::rids::RidClaim;
use super::sse;
use super::validate::{self, Limits, OneOrMany, RawSamplingParams, ValidParams};
use super::AppState;
use crate::auth::Tenant;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use sglrs_scheduler::{FinishReason, SchedEvent, TokenLogprob};
use std::sync::Arc;
use std::time::Instant;

/// `input_ids`: one prompt or a batch.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum InputIds {
    Batch(Vec<Vec<i64>>),
    One(Vec<i64>),
}

/// The body of `/generate` as sent.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct RawGenerate {
    text: Option<OneOrMany<String>>,
    input_ids: Option<InputIds>,
    sampling_params: Option<Value>,
    return_logprob: Option<OneOrMany<bool>>,
    logprob_start_len: Option<OneOrMany<i64>>,
    top_logprobs_num: Option<OneOrMany<i64>>,
    token_ids_logprob: Option<Vec<i64>>,
    return_text_in_logprobs: Option<bool>,
    stream: Option<bool>,
    rid: Option<OneOrMany<String>>,
    priority: Option<i64>,
    extra_key: Option<String>,
    bootstrap_host: Option<Value>,
    bootstrap_port: Option<Value>,
    bootstrap_room: Option<Value>,
    image_data: Option<Value>,
    /// The model, as sglang-router adds it (`null`, or a name this server serves).
    model: Option<String>,
    /// SGLang's per-request metrics switch; this server counts every request, so only
    /// `true` is accepted.
    log_metrics: Option<bool>,
    /// SGLang's switch against logging the request; sglrs never logs request content, so
    /// both values are honoured.
    no_logs: Option<bool>,
    /// Not supported: only `false` is accepted.
    return_hidden_states: Option<bool>,
    /// Not supported: only `false` is accepted.
    background: Option<bool>,
    /// Not supported: only `false` is accepted.
    return_bytes: Option<bool>,
    /// Not supported: only `false` is accepted.
    return_entropy: Option<bool>,
}

impl RawGenerate {
    /// The fields sglang-router and SGLang clients send that this server has no use for:
    /// accepted at their defaults, refused by name when they ask for something.
    /// (`model` is checked by the handler, against the served model's names.)
    fn check_extensions(&self) -> Result<(), ApiError> {
        let _ = self.no_logs;
        if self.log_metrics == Some(false) {
            return Err(ApiError::bad(
                "log_metrics",
                "every request is counted in the metrics; false is not supported",
            ));
        }
        for (name, v) in [
            ("return_hidden_states", self.return_hidden_states),
            ("background", self.background),
            ("return_bytes", self.return_bytes),
            ("return_entropy", self.return_entropy),
        ] {
            if v == Some(true) {
                return Err(ApiError::bad(name, "is not supported by this server"));
            }
        }
        Ok(())
    }
}

fn pick<T: Clone>(
    v: &Option<OneOrMany<T>>,
    i: usize,
    name: &str,
    batch: usize,
) -> Result<Option<T>, ApiError> {
    match v {
        None => Ok(None),
        Some(OneOrMany::One(x)) => Ok(Some(x.clone())),
        Some(OneOrMany::Many(xs)) if xs.len() == batch => Ok(Some(xs[i].clone())),
        Some(OneOrMany::Many(xs)) => Err(ApiError::bad(
            name,
            format!("{} entries for a batch of {batch}", xs.len()),
        )),
    }
}

/// The `sampling_params` of batch item `i`: one object for all, or a list with one per item.
/// Parsed from a JSON value here (not through an untagged enum) so that an unknown field
/// is named in the error.
fn sampling_params(
    v: Option<&Value>,
    i: usize,
    batch: usize,
) -> Result<RawSamplingParams, ApiError> {
    let item = match v {
        None | Some(Value::Null) => return Ok(RawSamplingParams::default()),
        Some(Value::Array(items)) if items.len() == batch => &items[i],
        Some(Value::Array(items)) => {
            return Err(ApiError::bad(
                "sampling_params",
                format!("{} entries for a batch of {batch}", items.len()),
            ))
        }
        Some(obj) => obj,
    };
    serde_json::from_value(item.clone())
        .map_err(|e| ApiError::bad("sampling_params", e.to_string()))
}

/// `POST /generate`.
pub async fn generate(
    State(state): State<Arc<AppState>>,
    tenant: Option<Extension<Tenant>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    state
        .metrics
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let raw: RawGenerate = parse_json(&body)?;
    if let Some(m) = &raw.model {
        crate::openai::check_model(&state, Some(m))?;
    }
    let role = state.pd.as_ref().map(|p| (p.mode(), p.bootstrap_port()));
    let (jobs, is_batch) =
        generate_jobs(&raw, state.limits(), state.sched.max_queued(), role, &|t| {
            state.encode(t)
        })?;
    let batch = jobs.len();
    let return_text = raw.return_text_in_logprobs.unwrap_or(false);
    // A prefill host answers in one JSON object even for a streamed request: its answer
    // carries no output for the client (the decode host's does), and SGLang's router reads
    // it as JSON (for the prompt's logprobs).
    let exporting = role.is_some_and(|(m, _)| m == crate::pd::DisaggMode::Prefill)
        && jobs.iter().any(|j| j.bootstrap.is_some());
    let want_lp: Vec<bool> = jobs.iter().map(|j| j.logprobs.is_some()).collect();
    // Compile every grammar before submitting anything, so a bad one rejects the whole batch.
    for j in &jobs {
        if let Some(g) = &j.params.grammar {
            state.grammars.get(g).await?;
        }
    }
    let rids: Vec<Option<String>> = (0..batch)
        .map(|i| pick(&raw.rid, i, "rid", batch))
        .collect::<Result<_, _>>()?;
    // Held until the request ends, however it ends (dropped with this handler or the
    // stream's task).
    let tenant = tenant.unwrap_or_default().0;
    let claim = state.rids.claim(tenant.id(), &rids)?;
    let running = dispatch::submit_all(&state, &tenant, jobs).await?;
    claim.bind(
        &state.sched,
        &running.iter().map(|r| r.id).collect::<Vec<_>>(),
    )?;
    let rid_of = |i: usize, id: u64| {
        claim
            .rid(i)
            .map_or_else(|| format!("{id:032x}"), str::to_string)
    };
    let n = running.first().map_or(1, |r| r.n);
    let many = is_batch || n > 1;
    if raw.stream.unwrap_or(false) && !exporting {
        return Ok(stream(
            state,
            running,
            claim,
            want_lp,
            return_text,
            start,
            many,
        ));
    }
    let ids: Vec<u64> = running.iter().map(|r| r.id).collect();
    let mut results = dispatch::collect_all(&state, running, start).await;
    dispatch::refused_in_queue(&results)?;
    if exporting {
        // The decode server's answer carries the prompt's logprobs, and SGLang's router
        // puts the prefill's in front of them: the prefill's are left out.
        for r in results.iter_mut().flatten() {
            r.input_logprobs.clear();
        }
    }
    let e2e = start.elapsed().as_secs_f64();
    let mut out = Vec::new();
    for (i, samples) in results.iter().enumerate() {
        let report = state.pd.as_ref().and_then(|pd| pd.take_report(ids[i]));
        for r in samples {
            let mut v = sample_json(&state, r, &rid_of(i, ids[i]), e2e, want_lp[i], return_text);
            if let Some(rep) = &report {
                v["meta_info"]["disaggregation"] = rep.clone();
            }
            out.push(v);
        }
    }
    if many {
        Ok(Json(Value::Array(out)).into_response())
    } else {
        Ok(Json(out.into_iter().next().unwrap_or(Value::Null)).into_response())
    }
}

/// A `/generate` body's jobs, checked (everything short of the model name, compiling the
/// grammars and submitting), and whether the request was a batch. `encode` tokenizes a
/// text prompt.
fn generate_jobs(
    raw: &RawGenerate,
    limits: Limits,
    max_queued: usize,
    role: Option<(crate::pd::DisaggMode, u16)>,
    encode: &dyn Fn(&str) -> Result<Vec<u32>, ApiError>,
) -> Result<(Vec<Job>, bool), ApiError> {
    raw.check_extensions()?;
    if raw.image_data.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad(
            "image_data",
            "image input is not supported by this model",
        ));
    }
    // A batch is queued all or nothing: one larger than the queue could never be.
    let batch_len = match (&raw.text, &raw.input_ids) {
        (Some(OneOrMany::Many(ts)), _) => Some(("text", ts.len())),
        (_, Some(InputIds::Batch(b))) => Some(("input_ids", b.len())),
        _ => None,
    };
    if let Some((name, n)) = batch_len.filter(|(_, n)| *n > max_queued) {
        return Err(ApiError::bad(
            name,
            format!(
                "a batch of {n} prompts is larger than the waiting queue \
                 (--max-queued-requests {}); split it",
                max_queued
            ),
        ));
    }
    // Prompts as token ids, and whether the request was a batch.
    let (prompts, is_batch): (Vec<Vec<u32>>, bool) = match (&raw.text, &raw.input_ids) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("give either text or input_ids, not both"))
        }
        (None, None) => return Err(ApiError::invalid("one of text or input_ids is required")),
        (Some(OneOrMany::One(t)), None) => (vec![encode(t)?], false),
        (Some(OneOrMany::Many(ts)), None) => (
            ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
            true,
        ),
        (None, Some(InputIds::One(ids))) => (vec![validate::check_input_ids(ids, limits)?], false),
        (None, Some(InputIds::Batch(b))) => (
            b.iter()
                .map(|ids| validate::check_input_ids(ids, limits))
                .collect::<Result<_, _>>()?,
            true,
        ),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad("text", "the batch is empty"));
    }
    let batch = prompts.len();
    let mut jobs = Vec::with_capacity(batch);
    for (i, input_ids) in prompts.into_iter().enumerate() {
        let sp = sampling_params(raw.sampling_params.as_ref(), i, batch)?;
        let params = validate::check_params(&sp, input_ids.len(), limits, "max_new_tokens")?;
        let logprobs = validate::check_logprobs(
            pick(&raw.return_logprob, i, "return_logprob", batch)?.unwrap_or(false),
            pick(&raw.logprob_start_len, i, "logprob_start_len", batch)?,
            pick(&raw.top_logprobs_num, i, "top_logprobs_num", batch)?,
            raw.token_ids_logprob.as_deref(),
            input_ids.len(),
            limits,
        )?;
        let bootstrap = crate::pd::bootstrap(
            role,
            raw.bootstrap_host.as_ref(),
            raw.bootstrap_port.as_ref(),
            raw.bootstrap_room.as_ref(),
            if is_batch { batch } else { 1 },
            params.n,
        )?;
        jobs.push(Job {
            input_ids,
            params,
            logprobs,
            priority: raw.priority.unwrap_or(0),
            namespace: validate::namespace(raw.extra_key.as_deref()),
            bootstrap,
        });
    }
    Ok((jobs, is_batch))
}

/// Parses and checks a `POST /generate` body exactly as the handler does before it compiles
/// grammars and submits, without an engine (tests and fuzzing): the checked parameters of
/// each job. `encode` stands for the tokenizer; the server is not a PD role.
pub fn check_generate_body(
    body: &[u8],
    limits: Limits,
    max_queued: usize,
    encode: &dyn Fn(&str) -> Result<Vec<u32>, ApiError>,
) -> Result<Vec<ValidParams>, ApiError> {
    let raw: RawGenerate = parse_json(body)?;
    let (jobs, _) = generate_jobs(&raw, limits, max_queued, None, encode)?;
    Ok(jobs.into_iter().map(|j| j.params).collect())
}

/// SGLang's `finish_reason` object.
pub fn finish_json(reason: Option<&FinishReason>) -> Value {
    match reason {
        None => Value::Null,
        Some(FinishReason::Length(n)) => json!({"type": "length", "length": n}),
        Some(FinishReason::StopToken(t)) => json!({"type": "stop", "matched": t}),
        Some(FinishReason::StopString(s)) => json!({"type": "stop", "matched": s}),
        Some(FinishReason::GrammarEnd) => json!({"type": "stop", "matched": null}),
        Some(FinishReason::Abort(m)) => json!({"type": "abort", "message": m.to_string()}),
    }
}

fn entry(state: &AppState, lp: Option<f32>, id: u32, text: bool) -> Value {
    json!([
        lp,
        id,
        if text {
            Value::String(state.token_text(id))
        } else {
            Value::Null
        }
    ])
}

/// `(token_logprobs, top_logprobs, token_ids_logprobs)` lists in SGLang's shape.
fn logprob_lists(state: &AppState, entries: &[TokenLogprob], text: bool) -> (Value, Value, Value) {
    let tokens = entries
        .iter()
        .map(|e| entry(state, e.logprob, e.token, text))
        .collect();
    let top = entries
        .iter()
        .map(|e| {
            if e.logprob.is_none() {
                Value::Null
            } else {
                Value::Array(
                    e.top
                        .iter()
                        .map(|&(t, l)| entry(state, Some(l), t, text))
                        .collect(),
                )
            }
        })
        .collect();
    let chosen = entries
        .iter()
        .map(|e| {
            if e.logprob.is_none() {
                Value::Null
            } else {
                Value::Array(
                    e.chosen
                        .iter()
                        .map(|&(t, l)| entry(state, Some(l), t, text))
                        .collect(),
                )
            }
        })
        .collect();
    (
        Value::Array(tokens),
        Value::Array(top),
        Value::Array(chosen),
    )
}

fn sample_json(
    state: &AppState,
    r: &SampleResult,
    rid: &str,
    e2e: f64,
    want_lp: bool,
    text: bool,
) -> Value {
    let mut meta = json!({
        "id": rid,
        "finish_reason": finish_json(r.finish.as_ref()),
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "cached_tokens": r.cached_tokens,
        "cached_tokens_details": r.cached,
        "e2e_latency": e2e,
    });
    if want_lp {
        let (it, itop, iids) = logprob_lists(state, &r.input_logprobs, text);
        let (ot, otop, oids) = logprob_lists(state, &r.logprobs, text);
        if let Some(m) = meta.as_object_mut() {
            m.insert("input_token_logprobs".into(), it);
            m.insert("input_top_logprobs".into(), itop);
            m.insert("input_token_ids_logprobs".into(), iids);
            m.insert("output_token_logprobs".into(), ot);
            m.insert("output_top_logprobs".into(), otop);
            m.insert("output_token_ids_logprobs".into(), oids);
            // SGLang's count of the output logprobs so far (its frontend reads it from
            // every streamed event).
            m.insert(
                "output_token_logprobs_length".into(),
                json!(r.logprobs.len()),
            );
        }
    }
    json!({"text": r.text, "output_ids": r.tokens, "meta_info": meta})
}

/// Streams cumulative text per sample (`index` = prompt × n + sample when `many`).
fn stream(
    state: Arc<AppState>,
    running: Vec<Running>,
    claim: RidClaim,
    want_lp: Vec<bool>,
    return_text: bool,
    start: Instant,
    many: bool,
) -> Response {
    let (tx, resp) = sse::channel();
    sse::spawn(tx.clone(), async move {
        let mut tasks = Vec::new();
        for (i, mut job) in running.into_iter().enumerate() {
            let tx = tx.clone();
            let state = state.clone();
            let rid = claim
                .rid(i)
                .map_or_else(|| format!("{:032x}", job.id), str::to_string);
            let want = want_lp[i];
            tasks.push(tokio::spawn(async move {
                let mut results = job.results();
                let mut timing = Timing::new(start);
                while results.iter().any(|r| r.finish.is_none()) {
                    let Ok(ev) = sse::recv(&mut job.rx, &tx).await else {
                        return; // client gone: dropping `job.rx` aborts the request
                    };
                    let Some(ev) = ev else { break };
                    let has_tokens =
                        matches!(&ev, SchedEvent::Delta { tokens, .. } if !tokens.is_empty());
                    let finished = matches!(&ev, SchedEvent::Finished { .. });
                    if has_tokens {
                        timing.on_tokens(&state);
                    }
                    let Some(s) = dispatch::apply(&mut results, ev) else {
                        continue;
                    };
                    if !has_tokens && !finished {
                        continue;
                    }
                    let mut v = sample_json(
                        &state,
                        &results[s],
                        &rid,
                        timing.elapsed(),
                        want,
                        return_text,
                    );
                    if many {
                        v["index"] = json!(i * job.n + s);
                    }
                    if finished {
                        if let Some(rep) = state.pd.as_ref().and_then(|pd| pd.take_report(job.id)) {
                            v["meta_info"]["disaggregation"] = rep;
                        }
                    }
                    if tx.send(v.to_string()).await.is_err() {
                        return; // client gone: dropping `job.rx` aborts the request
                    }
                }
                state.metrics.e2e.observe(timing.elapsed());
            }));
        }
        for t in tasks {
            sse::report_panic(&tx, t.await).await;
        }
        drop(claim);
        let _ = tx.send("[DONE]".to_string()).await;
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_context: 64,
        vocab_size: 100,
    };

    fn bytes(t: &str) -> Result<Vec<u32>, ApiError> {
        Ok(t.bytes().map(u32::from).collect())
    }

    #[test]
    fn a_generate_body_is_checked_without_an_engine() {
        let ok = br#"{"input_ids": [[1, 2], [3]], "sampling_params": [{"n": 2}, {"max_new_tokens": 4}]}"#;
        let jobs = check_generate_body(ok, LIMITS, 8, &bytes).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!((jobs[0].n, jobs[1].stop.max_new_tokens), (2, 4));
        let refused = [
            &br#"{"text": ["a", "b", "c"]}"#[..], // larger than the queue of 2
            br#"{"input_ids": [100]}"#,
            br#"{"text": "a", "return_bytes": true}"#,
            br#"{"text": "a", "image_data": "x"}"#,
            br#"{"text": "a", "input_ids": [1]}"#,
        ];
        for body in refused {
            let e = check_generate_body(body, LIMITS, 2, &bytes).unwrap_err();
            assert!(matches!(e, ApiError::BadRequest { .. }), "{e:?}");
        }
    }
}
