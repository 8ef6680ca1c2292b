//! Raw request bodies become `Valid*` types here, once; the scheduler only sees those.
//!
//! Every check names the field it is about. Unknown fields are rejected by serde
//! (`deny_unknown_fields`), so a field sglrs does not support is a 400 naming it.

use super::error::ApiError;
use serde::Deserialize;
use sglrs_radix_cache::Namespace;
use sglrs_scheduler::detok::StopRegex;
use sglrs_scheduler::sampler::SamplingConfig;
use sglrs_scheduler::{LogprobConfig, StopConfig};
use std::collections::HashMap;

/// Longest stop string accepted, in bytes.
pub const MAX_STOP_BYTES: usize = 4096;

/// Largest `n`.
pub const MAX_N: usize = 16;
/// Largest `top_logprobs_num` / `top_logprobs`.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A value that may be given alone or as a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// A single value.
    One(T),
    /// A list.
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    /// As a list.
    pub fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(t) => vec![t],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A constraint on the output, before compilation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GrammarSpec {
    /// A regular expression the whole output must match.
    Regex(String),
    /// A JSON Schema (as JSON text).
    JsonSchema(String),
    /// Any JSON object.
    JsonObject,
    /// An EBNF / GBNF grammar.
    Ebnf(String),
    /// Tool calls in the model's syntax (built from `tools` and `tool_choice`).
    Tagged(sglrs_grammar::TaggedSpec),
}

/// The sampling knobs every API shares (native names; the OpenAI routes map onto these).
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct RawSamplingParams {
    /// `max_new_tokens`.
    pub max_new_tokens: Option<i64>,
    /// `min_new_tokens`.
    pub min_new_tokens: Option<i64>,
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k` (-1 = off).
    pub top_k: Option<i64>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f64>,
    /// `stop`.
    pub stop: Option<OneOrMany<String>>,
    /// `stop_token_ids`.
    pub stop_token_ids: Option<Vec<i64>>,
    /// `ignore_eos`.
    pub ignore_eos: Option<bool>,
    /// `skip_special_tokens`.
    pub skip_special_tokens: Option<bool>,
    /// `no_stop_trim`.
    pub no_stop_trim: Option<bool>,
    /// `spaces_between_special_tokens` (SGLang's frontend sends it). The detokenizer joins the
    /// tokens' bytes exactly, as HF's fast byte-level tokenizers do for either value, so both
    /// values decode the same.
    pub spaces_between_special_tokens: Option<bool>,
    /// `stop_regex`: a pattern or a list, matched on the output text like `stop` (trimmed
    /// unless `no_stop_trim`; `matched` is the pattern). SGLang's frontend always sends the
    /// field, null by default.
    pub stop_regex: Option<OneOrMany<String>>,
    /// `n`.
    pub n: Option<i64>,
    /// `regex`.
    pub regex: Option<String>,
    /// `json_schema` (a JSON string).
    pub json_schema: Option<String>,
    /// `ebnf`.
    pub ebnf: Option<String>,
    /// `logit_bias` (token id as a string → bias).
    pub logit_bias: Option<HashMap<String, f64>>,
    /// `sampling_seed`.
    pub sampling_seed: Option<u64>,
}

/// Checked per-request parameters.
#[derive(Clone, Debug)]
pub struct ValidParams {
    /// Sampling.
    pub sampling: SamplingConfig,
    /// Stop conditions.
    pub stop: StopConfig,
    /// Samples.
    pub n: usize,
    /// Output constraint.
    pub grammar: Option<GrammarSpec>,
    /// The name the client gave the token limit (`max_new_tokens`, `max_tokens`,
    /// `max_completion_tokens`), for errors about it found later (see [`check_budget`]).
    pub max_name: String,
}

/// Model limits the checks need.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Context length.
    pub max_context: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
}

fn finite_in(name: &str, v: Option<f64>, lo: f64, hi: f64, default: f64) -> Result<f32, ApiError> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x as f32),
        Some(x) => Err(ApiError::bad(name, format!("{x} is outside [{lo}, {hi}]"))),
    }
}

/// Checks the sampling knobs against the prompt length and the model.
///
/// `max_name` is the name the client used for the token limit (`max_new_tokens`,
/// `max_tokens`, `max_completion_tokens`), so the error names the field the client sent.
pub fn check_params(
    raw: &RawSamplingParams,
    prompt_len: usize,
    limits: Limits,
    max_name: &str,
) -> Result<ValidParams, ApiError> {
    let room = limits.max_context.saturating_sub(prompt_len);
    if prompt_len == 0 {
        return Err(ApiError::invalid("the prompt is empty"));
    }
    if prompt_len >= limits.max_context {
        return Err(ApiError::invalid(format!(
            "the prompt has {prompt_len} tokens; the model's context length is {}",
            limits.max_context
        )));
    }
    let max_new_tokens = match raw.max_new_tokens {
        None => 128.min(room),
        Some(v) if v < 0 => return Err(ApiError::bad(max_name, format!("{v} is negative"))),
        Some(v) if v as u64 > room as u64 => {
            return Err(ApiError::bad(
                max_name,
                format!(
                    "{v} tokens requested, but the prompt ({prompt_len} tokens) leaves room for {room} in the context of {}",
                    limits.max_context
                ),
            ))
        }
        Some(v) => v as usize,
    };
    let min_new_tokens = match raw.min_new_tokens {
        None => 0,
        Some(v) if v < 0 => {
            return Err(ApiError::bad("min_new_tokens", format!("{v} is negative")))
        }
        Some(v) if v as usize > max_new_tokens => {
            return Err(ApiError::bad(
                "min_new_tokens",
                format!("{v} exceeds {max_name} ({max_new_tokens})"),
            ))
        }
        Some(v) => v as usize,
    };
    let temperature = finite_in("temperature", raw.temperature, 0.0, 100.0, 1.0)?;
    let top_p = finite_in("top_p", raw.top_p, 0.0, 1.0, 1.0)?;
    if top_p <= 0.0 {
        return Err(ApiError::bad("top_p", "must be greater than 0"));
    }
    let top_k = match raw.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k >= 1 => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad(
                "top_k",
                format!("{k} is not -1 or a positive integer"),
            ))
        }
    };
    let min_p = finite_in("min_p", raw.min_p, 0.0, 1.0, 0.0)?;
    let frequency_penalty = finite_in("frequency_penalty", raw.frequency_penalty, -2.0, 2.0, 0.0)?;
    let presence_penalty = finite_in("presence_penalty", raw.presence_penalty, -2.0, 2.0, 0.0)?;
    let repetition_penalty =
        finite_in("repetition_penalty", raw.repetition_penalty, 0.0, 2.0, 1.0)?;
    if repetition_penalty <= 0.0 {
        return Err(ApiError::bad(
            "repetition_penalty",
            "must be greater than 0",
        ));
    }
    let n = match raw.n {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::bad("n", format!("{n} is outside 1..={MAX_N}"))),
    };
    let mut stop_token_ids = Vec::new();
    for &t in raw.stop_token_ids.iter().flatten() {
        if t < 0 || t as usize >= limits.vocab_size {
            return Err(ApiError::bad(
                "stop_token_ids",
                format!("{t} is not a token id"),
            ));
        }
        stop_token_ids.push(t as u32);
    }
    let stop_strings = raw
        .stop
        .clone()
        .map(OneOrMany::into_vec)
        .unwrap_or_default();
    let stop_regex = match raw.stop_regex.clone().map(OneOrMany::into_vec) {
        None => None,
        Some(v) if v.is_empty() => None,
        Some(v) => {
            if let Some(i) = v.iter().position(String::is_empty) {
                return Err(ApiError::bad("stop_regex", format!("pattern {i} is empty")));
            }
            Some(StopRegex::new(&v).map_err(|e| ApiError::bad("stop_regex", e.to_string()))?)
        }
    };
    if stop_strings.len() > 16 {
        return Err(ApiError::bad("stop", "at most 16 stop strings"));
    }
    // An empty stop string would end every output before its first token; vLLM refuses it
    // too (it used to be dropped here without a word).
    if let Some(i) = stop_strings.iter().position(String::is_empty) {
        return Err(ApiError::bad("stop", format!("stop string {i} is empty")));
    }
    // Each token is checked against every stop string: a 5 MB one cost 13 ms per token of
    // the scheduler thread, which every other request waits on.
    if let Some((i, s)) = stop_strings
        .iter()
        .enumerate()
        .find(|(_, s)| s.len() > MAX_STOP_BYTES)
    {
        return Err(ApiError::bad(
            "stop",
            format!(
                "stop string {i} is {} bytes; at most {MAX_STOP_BYTES}",
                s.len()
            ),
        ));
    }
    let mut logit_bias = Vec::new();
    for (k, &v) in raw.logit_bias.iter().flatten() {
        let id: u32 = k
            .parse()
            .ok()
            .filter(|&id: &u32| (id as usize) < limits.vocab_size)
            .ok_or_else(|| ApiError::bad("logit_bias", format!("{k:?} is not a token id")))?;
        if !v.is_finite() || !(-100.0..=100.0).contains(&v) {
            return Err(ApiError::bad(
                "logit_bias",
                format!("bias {v} for {k} is outside [-100, 100]"),
            ));
        }
        logit_bias.push((id, v as f32));
    }
    let grammars = [
        raw.regex.clone().map(GrammarSpec::Regex),
        raw.json_schema.clone().map(GrammarSpec::JsonSchema),
        raw.ebnf.clone().map(GrammarSpec::Ebnf),
    ];
    let mut grammar = None;
    for g in grammars.into_iter().flatten() {
        if grammar.is_some() {
            return Err(ApiError::invalid(
                "only one of regex, json_schema and ebnf may be given",
            ));
        }
        grammar = Some(g);
    }
    Ok(ValidParams {
        sampling: SamplingConfig {
            temperature,
            top_p,
            top_k,
            min_p,
            frequency_penalty,
            presence_penalty,
            repetition_penalty,
            logit_bias,
            seed: raw.sampling_seed,
        },
        stop: StopConfig {
            max_new_tokens,
            min_new_tokens,
            stop_strings,
            stop_regex,
            stop_token_ids,
            ignore_eos: raw.ignore_eos.unwrap_or(false),
            no_stop_trim: raw.no_stop_trim.unwrap_or(false),
            skip_special_tokens: raw.skip_special_tokens.unwrap_or(true),
        },
        n,
        grammar,
        max_name: max_name.to_string(),
    })
}

/// Checks that the token limit leaves room for the grammar's shortest output: below it a
/// constrained output cannot be complete, so the request is refused instead of returning
/// text cut off. `needed` is [`sglrs_grammar::CompiledGrammar::min_output_tokens`] (the
/// planned close from the start, which the scheduler's mask then keeps within the tokens
/// left). A limit of 0 generates nothing and is not refused.
pub fn check_budget(params: &ValidParams, needed: usize) -> Result<(), ApiError> {
    let max = params.stop.max_new_tokens;
    if max == 0 || needed <= max {
        return Ok(());
    }
    let message = if needed == usize::MAX {
        "the grammar's shortest output has no planned spelling in this vocabulary within 64 KiB"
            .to_string()
    } else {
        format!(
            "{max} is too small for the grammar: its shortest valid output takes {needed} \
             tokens; set {} to at least {needed}",
            params.max_name
        )
    };
    Err(ApiError::bad(params.max_name.clone(), message))
}

/// Checks a logprob request (native names).
pub fn check_logprobs(
    return_logprob: bool,
    logprob_start_len: Option<i64>,
    top_logprobs_num: Option<i64>,
    token_ids_logprob: Option<&[i64]>,
    prompt_len: usize,
    limits: Limits,
) -> Result<Option<LogprobConfig>, ApiError> {
    if !return_logprob {
        return Ok(None);
    }
    let input_start = match logprob_start_len {
        None | Some(-1) => None,
        Some(v) if v < -1 => {
            return Err(ApiError::bad(
                "logprob_start_len",
                format!("{v} is negative"),
            ))
        }
        Some(v) if v as usize >= prompt_len => None,
        Some(v) => Some(v as usize),
    };
    let top_n = match top_logprobs_num {
        None => 0,
        Some(v) if (0..=MAX_TOP_LOGPROBS as i64).contains(&v) => v as usize,
        Some(v) => {
            return Err(ApiError::bad(
                "top_logprobs_num",
                format!("{v} is outside 0..={MAX_TOP_LOGPROBS}"),
            ))
        }
    };
    let mut token_ids = Vec::new();
    for &t in token_ids_logprob.unwrap_or(&[]) {
        if t < 0 || t as usize >= limits.vocab_size {
            return Err(ApiError::bad(
                "token_ids_logprob",
                format!("{t} is not a token id"),
            ));
        }
        token_ids.push(t as u32);
    }
    Ok(Some(LogprobConfig {
        input_start,
        top_n,
        token_ids,
    }))
}

/// Checks explicit token ids.
pub fn check_input_ids(ids: &[i64], limits: Limits) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|&t| {
            if t < 0 || t as usize >= limits.vocab_size {
                Err(ApiError::bad("input_ids", format!("{t} is not a token id")))
            } else {
                Ok(t as u32)
            }
        })
        .collect()
}

/// The cache namespace of `extra_key` (tenant / salt).
pub fn namespace(extra_key: Option<&str>) -> Namespace {
    Namespace::from_name(extra_key.unwrap_or(""))
}

/// The cache namespace of the OpenAI routes' `cache_salt` (vLLM's field): requests with
/// different salts never share cached pages, and a salted request never matches pages of
/// unsalted ones. The same string names the same namespace as SGLang's `extra_key`. An
/// empty salt is refused (it would silently mean "no salt").
pub fn cache_salt(salt: Option<&str>) -> Result<Namespace, ApiError> {
    match salt {
        Some("") => Err(ApiError::bad("cache_salt", "must be a non-empty string")),
        s => Ok(namespace(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_salts_name_distinct_namespaces() {
        let a = cache_salt(Some("tenant-a")).unwrap();
        assert_ne!(a, cache_salt(Some("tenant-b")).unwrap());
        assert_ne!(a, cache_salt(None).unwrap());
        assert_eq!(cache_salt(None).unwrap(), Namespace::DEFAULT);
        assert_eq!(a, namespace(Some("tenant-a")));
        assert!(cache_salt(Some("")).is_err());
    }

    const L: Limits = Limits {
        max_context: 100,
        vocab_size: 1000,
    };

    fn raw(json: &str) -> RawSamplingParams {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_limit_below_the_grammars_shortest_output_is_a_400_naming_the_field() {
        let p = check_params(&raw(r#"{"max_new_tokens": 3}"#), 10, L, "max_tokens").unwrap();
        assert!(check_budget(&p, 3).is_ok());
        match check_budget(&p, 9) {
            Err(ApiError::BadRequest { message, param }) => {
                assert_eq!(param.as_deref(), Some("max_tokens"));
                assert!(message.contains("at least 9"), "{message}");
            }
            other => panic!("expected a 400, got {other:?}"),
        }
        let p = check_params(&raw(r#"{"max_new_tokens": 0}"#), 10, L, "max_new_tokens").unwrap();
        assert!(
            check_budget(&p, 9).is_ok(),
            "nothing generated, nothing cut"
        );
    }

    #[test]
    fn defaults_and_limits() {
        let p = check_params(&raw("{}"), 10, L, "max_new_tokens").unwrap();
        assert_eq!(p.stop.max_new_tokens, 90);
        assert_eq!(p.n, 1);
        assert!(p.stop.skip_special_tokens);
        let e =
            check_params(&raw(r#"{"max_new_tokens": -1}"#), 10, L, "max_new_tokens").unwrap_err();
        assert!(e.to_string().contains("max_new_tokens"), "{e}");
        let e =
            check_params(&raw(r#"{"max_new_tokens": 1000000}"#), 10, L, "max_tokens").unwrap_err();
        assert!(e.to_string().starts_with("max_tokens"), "{e}");
        let e = check_params(&raw("{}"), 100, L, "max_new_tokens").unwrap_err();
        assert!(e.to_string().contains("context length"), "{e}");
        let e = check_params(&raw(r#"{"top_p": 0}"#), 10, L, "m").unwrap_err();
        assert!(e.to_string().contains("top_p"));
        let e = check_params(&raw(r#"{"regex": "a", "ebnf": "b"}"#), 10, L, "m").unwrap_err();
        assert!(e.to_string().contains("only one"));
        let e = check_params(&raw(r#"{"logit_bias": {"5000": 1}}"#), 10, L, "m").unwrap_err();
        assert!(e.to_string().contains("logit_bias"));
        assert!(serde_json::from_str::<RawSamplingParams>(r#"{"bogus": 1}"#).is_err());
        // Stop strings: at most 16, each at most MAX_STOP_BYTES.
        let long = serde_json::json!({"stop": ["ok", "x".repeat(MAX_STOP_BYTES + 1)]});
        let e = check_params(&raw(&long.to_string()), 10, L, "m").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("stop: stop string 1 is 4097 bytes"),
            "{e}"
        );
        let fits = serde_json::json!({"stop": ["x".repeat(MAX_STOP_BYTES)]});
        assert!(check_params(&raw(&fits.to_string()), 10, L, "m").is_ok());
        let e = check_params(&raw(r#"{"stop": ["ok", ""]}"#), 10, L, "m").unwrap_err();
        assert_eq!(e.to_string(), "stop: stop string 1 is empty");
        let e = check_params(&raw(r#"{"stop": ""}"#), 10, L, "m").unwrap_err();
        assert_eq!(e.to_string(), "stop: stop string 0 is empty");
    }

    #[test]
    fn logprob_checks() {
        let lp = check_logprobs(true, Some(3), Some(2), Some(&[1, 2]), 10, L)
            .unwrap()
            .unwrap();
        assert_eq!(lp.input_start, Some(3));
        assert_eq!(lp.top_n, 2);
        assert!(check_logprobs(true, None, Some(99), None, 10, L).is_err());
        assert!(check_logprobs(false, None, None, None, 10, L)
            .unwrap()
            .is_none());
    }
}
