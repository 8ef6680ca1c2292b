//! The direct path: `/generate` requests handed to the scheduler thread as Rust structs.
//!
//! A plain generation (one prompt as `text` or `input_ids`, `sampling_params`, `priority`,
//! `extra_key`) skips the HTTP machinery altogether: the body is checked by the server's own
//! validation functions ([`validate`]), tokenized by the server's tokenizer, turned into the
//! same [`SchedRequest`] the `/generate` route builds, and sent down the scheduler's channel;
//! the scheduler's events are read back on the calling thread (with the GIL released) and
//! shaped into the route's JSON answer. Anything else (logprobs, streaming, batches, `rid`)
//! goes through the router, so every body is answered exactly as `POST /generate` would.
//!
//! [`submit_group`] sends several requests in one scheduler message: they are admitted in
//! the same step, so a fork's branches prefill their suffixes and decode as one batch.

use crate::error::EngineError;
use serde::Deserialize;
use serde_json::{json, Value};
use sglrs_scheduler::{AbortReason, FinishReason, RequestId, SchedEvent, SchedRequest};
use sglrs_server::validate::{self, RawSamplingParams};
use sglrs_server::{apply_event, finish_json, ApiError, AppState, SampleResult, Timing};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc;

/// The `/generate` bodies the direct path serves: one prompt, its sampling parameters, a
/// priority and a cache namespace. Any other field makes the body go through the router.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct DirectBody {
    text: Option<String>,
    input_ids: Option<Vec<i64>>,
    sampling_params: Option<Value>,
    priority: Option<i64>,
    extra_key: Option<String>,
}

/// The body as a direct request, or `None` when it needs the router (other fields, a batch,
/// or not even JSON: the router gives the exact error).
pub fn parse(body: &[u8]) -> Option<DirectBody> {
    serde_json::from_slice(body).ok()
}

/// An [`ApiError`] as the engine reports it (the route's status class and message); client
/// errors count as rejected, as the server's middleware counts them.
pub fn api_error(state: &AppState, e: ApiError) -> EngineError {
    if e.status().is_client_error() {
        state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
        EngineError::BadRequest(e.to_string())
    } else {
        EngineError::Internal(e.to_string())
    }
}

/// `sampling_params` of a one-prompt body, as the route reads it.
fn sampling_params(v: Option<&Value>) -> Result<RawSamplingParams, ApiError> {
    let item = match v {
        None | Some(Value::Null) => return Ok(RawSamplingParams::default()),
        Some(Value::Array(items)) if items.len() == 1 => &items[0],
        Some(Value::Array(items)) => {
            return Err(ApiError::bad(
                "sampling_params",
                format!("{} entries for a batch of 1", items.len()),
            ))
        }
        Some(obj) => obj,
    };
    serde_json::from_value(item.clone())
        .map_err(|e| ApiError::bad("sampling_params", e.to_string()))
}

/// Validates and tokenizes a body into the scheduler request the route would submit
/// (compiling its grammar, if any, on `rt`'s blocking pool).
pub fn prepare(
    state: &AppState,
    rt: &tokio::runtime::Runtime,
    body: DirectBody,
) -> Result<SchedRequest, ApiError> {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let limits = state.limits();
    let input_ids = match (&body.text, &body.input_ids) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("give either text or input_ids, not both"))
        }
        (None, None) => return Err(ApiError::invalid("one of text or input_ids is required")),
        (Some(t), None) => state.encode(t)?,
        (None, Some(ids)) => validate::check_input_ids(ids, limits)?,
    };
    let sp = sampling_params(body.sampling_params.as_ref())?;
    let params = validate::check_params(&sp, input_ids.len(), limits, "max_new_tokens")?;
    let grammar = match &params.grammar {
        Some(spec) => Some(rt.block_on(state.grammars.get(spec))?),
        None => None,
    };
    Ok(SchedRequest {
        id: state.next_id(),
        input_ids,
        namespace: validate::namespace(body.extra_key.as_deref()),
        sampling: params.sampling,
        stop: params.stop,
        n: params.n,
        grammar,
        logprobs: None,
        priority: body.priority.unwrap_or(0),
        tenant: 0,
        disagg: None,
    })
}

/// A submitted direct request: its events until every sample finished.
pub struct Pending {
    id: RequestId,
    n: usize,
    rx: mpsc::UnboundedReceiver<SchedEvent>,
    start: Instant,
}

/// Submits prepared requests in one scheduler message (admitted in the same step).
pub fn submit_group(
    state: &AppState,
    reqs: Vec<SchedRequest>,
    start: Instant,
) -> Result<Vec<Pending>, EngineError> {
    let heads: Vec<(RequestId, usize)> = reqs.iter().map(|r| (r.id, r.n.max(1))).collect();
    let rxs = state
        .sched
        .submit_group(reqs)
        .map_err(|e| api_error(state, ApiError::from(e)))?;
    Ok(heads
        .into_iter()
        .zip(rxs)
        .map(|((id, n), rx)| Pending { id, n, rx, start })
        .collect())
}

impl Pending {
    /// Blocks until every sample finished; the route's JSON answer (an object, or a list
    /// when `n > 1`). Records the route's latency metrics.
    pub fn wait(mut self, state: &AppState) -> Result<String, EngineError> {
        let mut samples = vec![SampleResult::default(); self.n];
        let mut timing = Timing::new(self.start);
        while samples.iter().any(|s| s.finish.is_none()) {
            let Some(ev) = self.rx.blocking_recv() else {
                for s in samples.iter_mut().filter(|s| s.finish.is_none()) {
                    s.finish = Some(FinishReason::Abort(AbortReason::Shutdown));
                }
                break;
            };
            if matches!(&ev, SchedEvent::Delta { tokens, .. } if !tokens.is_empty()) {
                timing.on_tokens(state);
            }
            apply_event(&mut samples, ev);
        }
        let e2e = self.start.elapsed().as_secs_f64();
        state.metrics.e2e.observe(e2e);
        let rid = format!("{:032x}", self.id);
        let mut out: Vec<Value> = samples
            .iter()
            .map(|s| {
                json!({
                    "text": s.text,
                    "output_ids": s.tokens,
                    "meta_info": {
                        "id": rid,
                        "finish_reason": finish_json(s.finish.as_ref()),
                        "prompt_tokens": s.prompt_tokens,
                        "completion_tokens": s.completion_tokens,
                        "cached_tokens": s.cached_tokens,
                        "cached_tokens_details": s.cached,
                        "e2e_latency": e2e,
                    },
                })
            })
            .collect();
        let v = if out.len() == 1 {
            out.pop().unwrap_or(Value::Null)
        } else {
            Value::Array(out)
        };
        Ok(v.to_string())
    }
}
