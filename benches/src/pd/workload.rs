//! The interference workload: seeded prompt text, a streamed `POST /generate` that notes
//! when every token-carrying event arrived, and the run of decode streams while long
//! prompts keep arriving.

use anyhow::{anyhow, bail};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bound on one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest wait for every stream's first token before the long prompts start.
const STREAMS_START_TIMEOUT: Duration = Duration::from_secs(300);

/// Seeded lowercase sentences, ~`tokens` tokens, each seed its own text from the first word
/// on, so no two prompts share a cached page.
pub(super) fn words_text(seed: u64, tokens: usize) -> String {
    crate::common::words_text(seed ^ 0x5044_6265_6e63_6821, tokens)
}

/// A chat-shaped prompt around `body`.
pub(super) fn prompt(body: &str) -> String {
    format!("User: {body}\nAssistant:")
}

/// `meta_info.disaggregation` of a decode host's answer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Transfer {
    pub(super) pages_received: u64,
    pub(super) pages_skipped: u64,
    /// From the room's first message to its last page written.
    pub(super) transfer_ms: f64,
    /// From registering the room to its first message (the prefill computing).
    pub(super) wait_ms: f64,
}

impl Transfer {
    fn from_json(v: &Value) -> Option<Transfer> {
        (v["role"].as_str()? == "decode").then(|| Transfer {
            pages_received: v["pages_received"].as_u64().unwrap_or(0),
            pages_skipped: v["pages_skipped"].as_u64().unwrap_or(0),
            transfer_ms: v["transfer_ms"].as_f64().unwrap_or(f64::NAN),
            wait_ms: v["wait_ms"].as_f64().unwrap_or(f64::NAN),
        })
    }
}

/// One streamed `/generate` reply.
#[derive(Clone, Debug, Default)]
pub(super) struct Streamed {
    /// Seconds from the request to every event that carried new tokens.
    pub(super) token_times: Vec<f64>,
    pub(super) text: String,
    pub(super) prompt_tokens: u64,
    pub(super) completion_tokens: u64,
    /// `None` where the last event has no decode-side `meta_info.disaggregation`.
    pub(super) transfer: Option<Transfer>,
}

impl Streamed {
    /// Seconds to the first event with a token.
    pub(super) fn ttft(&self) -> Option<f64> {
        self.token_times.first().copied()
    }

    /// Seconds between consecutive token-carrying events.
    pub(super) fn gaps(&self) -> impl Iterator<Item = f64> + '_ {
        self.token_times.windows(2).map(|w| w[1] - w[0])
    }
}

/// The client of every phase: a keep-alive agent with [`REQUEST_TIMEOUT`].
pub(super) fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(REQUEST_TIMEOUT).build()
}

/// Streams `POST {base}/generate` of `text` for `max_new_tokens` tokens at temperature 0,
/// ignoring EOS. `on_token` runs after each token-carrying event; when it returns false the
/// stream is dropped there (the server aborts the request) and the reply so far returned.
pub(super) fn generate(
    agent: &ureq::Agent,
    base: &str,
    text: &str,
    max_new_tokens: usize,
    on_token: &mut dyn FnMut() -> bool,
) -> anyhow::Result<Streamed> {
    let body = json!({
        "text": text,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": true},
        "stream": true,
    });
    let t0 = Instant::now();
    let resp = match agent.post(&format!("{base}/generate")).send_json(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => bail!(
            "POST /generate: HTTP {code}: {}",
            r.into_string().unwrap_or_default()
        ),
        Err(e) => return Err(anyhow!(e).context("POST /generate")),
    };
    let mut out = Streamed::default();
    let mut last = None;
    for v in crate::common::sse_events(resp) {
        let v = v?;
        let now = t0.elapsed().as_secs_f64();
        let meta = &v["meta_info"];
        // `output_ids` is cumulative; a streamed event's `completion_tokens` may stay 0
        // until the last one.
        let ids = v["output_ids"].as_array().map_or(0, |a| a.len() as u64);
        let done = meta["completion_tokens"].as_u64().unwrap_or(0).max(ids);
        let fresh = done > out.completion_tokens;
        out.completion_tokens = out.completion_tokens.max(done);
        out.prompt_tokens = meta["prompt_tokens"].as_u64().unwrap_or(out.prompt_tokens);
        last = Some(v);
        if fresh {
            out.token_times.push(now);
            if !on_token() {
                break;
            }
        }
    }
    let last = last.ok_or_else(|| anyhow!("POST /generate: no event before [DONE]"))?;
    out.text = last["text"].as_str().unwrap_or("").to_string();
    out.transfer = Transfer::from_json(&last["meta_info"]["disaggregation"]);
    Ok(out)
}

/// What one phase sends.
pub(super) struct Load {
    /// Concurrent decode streams.
    pub(super) streams: usize,
    /// New tokens of each stream request.
    pub(super) stream_tokens: usize,
    /// Prompt tokens of each stream request (approximate).
    pub(super) stream_prompt_tokens: usize,
    /// Long prompts, sent one after another once every stream has its first token.
    pub(super) long_prompts: Vec<String>,
    /// New tokens of each long prompt.
    pub(super) long_output_tokens: usize,
    /// Seed of the stream prompts.
    pub(super) seed: u64,
}

/// What a phase got back.
pub(super) struct LoadRun {
    /// Every stream request, finished or stopped when the long prompts were done.
    pub(super) streams: Vec<Streamed>,
    pub(super) long: Vec<Streamed>,
    pub(super) wall: f64,
}

/// Shared state of a phase's client threads.
struct Shared {
    /// Streams that have their first token.
    started: AtomicUsize,
    /// Set when the long prompts are all answered (or a client failed): streams stop at
    /// their next token.
    done: AtomicBool,
    streams: Mutex<Vec<Streamed>>,
    error: Mutex<Option<anyhow::Error>>,
}

impl Shared {
    fn fail(&self, e: anyhow::Error) {
        self.done.store(true, Ordering::SeqCst);
        self.error.lock().expect("load error").get_or_insert(e);
    }
}

/// Runs `load` against `base`: each stream client sends stream requests back to back until
/// the long prompts are done (at least one each; with no long prompts exactly one); the
/// long prompts go one after another once every stream has its first token, and when the
/// last is answered the streams stop at their next token.
pub(super) fn run_load(agent: &ureq::Agent, base: &str, load: &Load) -> anyhow::Result<LoadRun> {
    let shared = Shared {
        started: AtomicUsize::new(0),
        done: AtomicBool::new(false),
        streams: Mutex::new(Vec::new()),
        error: Mutex::new(None),
    };
    let again = !load.long_prompts.is_empty();
    let t0 = Instant::now();
    let long = std::thread::scope(|s| {
        for i in 0..load.streams {
            let shared = &shared;
            s.spawn(move || {
                let mut first = true;
                for round in 0.. {
                    let seed = load.seed ^ ((i as u64) << 40 | round);
                    let text = prompt(&words_text(seed, load.stream_prompt_tokens));
                    let mut on_token = || {
                        if std::mem::take(&mut first) {
                            shared.started.fetch_add(1, Ordering::SeqCst);
                        }
                        !shared.done.load(Ordering::SeqCst)
                    };
                    match generate(agent, base, &text, load.stream_tokens, &mut on_token) {
                        Ok(r) => shared.streams.lock().expect("streams").push(r),
                        Err(e) => return shared.fail(e.context(format!("stream {i}"))),
                    }
                    if !again || shared.done.load(Ordering::SeqCst) {
                        return;
                    }
                }
            });
        }
        let mut long = Vec::new();
        if load.long_prompts.is_empty() {
            return long;
        }
        let wait = Instant::now();
        while shared.started.load(Ordering::SeqCst) < load.streams {
            if shared.done.load(Ordering::SeqCst) {
                return long;
            }
            if wait.elapsed() > STREAMS_START_TIMEOUT {
                shared.fail(anyhow!(
                    "the streams had no first token within {} s",
                    STREAMS_START_TIMEOUT.as_secs()
                ));
                return long;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for (k, p) in load.long_prompts.iter().enumerate() {
            if shared.done.load(Ordering::SeqCst) {
                break;
            }
            match generate(agent, base, p, load.long_output_tokens, &mut || true) {
                Ok(r) => long.push(r),
                Err(e) => {
                    shared.fail(e.context(format!("long prompt {k}")));
                    break;
                }
            }
        }
        shared.done.store(true, Ordering::SeqCst);
        long
    });
    let wall = t0.elapsed().as_secs_f64();
    if let Some(e) = shared.error.into_inner().expect("load error") {
        return Err(e);
    }
    Ok(LoadRun {
        streams: shared.streams.into_inner().expect("streams"),
        long,
        wall,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_seeded_and_distinct() {
        let a = words_text(1, 2000);
        assert_eq!(a, words_text(1, 2000));
        assert_ne!(a, words_text(2, 2000));
        assert_eq!(a.split_whitespace().count(), 1847);
        // Distinct from the first words on: no shared first page.
        let start = |s: &str| s.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
        let starts: std::collections::HashSet<String> =
            (0..32).map(|s| start(&words_text(s, 100))).collect();
        assert_eq!(starts.len(), 32);
        assert_eq!(prompt("hi"), "User: hi\nAssistant:");
    }

    #[test]
    fn transfer_and_gaps() {
        let t = Transfer::from_json(&json!({"role": "decode", "bootstrap_room": 7,
            "pages_received": 125, "pages_skipped": 3, "transfer_ms": 4.5, "wait_ms": 900.0}));
        assert_eq!(
            t,
            Some(Transfer {
                pages_received: 125,
                pages_skipped: 3,
                transfer_ms: 4.5,
                wait_ms: 900.0
            })
        );
        assert_eq!(Transfer::from_json(&json!({"role": "prefill"})), None);
        assert_eq!(Transfer::from_json(&Value::Null), None);
        let s = Streamed {
            token_times: vec![0.5, 0.52, 0.56],
            ..Default::default()
        };
        assert_eq!(s.ttft(), Some(0.5));
        let g: Vec<f64> = s.gaps().collect();
        assert_eq!(g.len(), 2);
        assert!((g[0] - 0.02).abs() < 1e-12 && (g[1] - 0.04).abs() < 1e-12);
        assert_eq!(Streamed::default().ttft(), None);
    }
}
