//! The multi-turn workload: seeded conversation text, the client loop that keeps
//! `--in-flight` conversations busy, and the figures of one run.

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::server::{Cached, Reply, Server};
pub(super) use crate::common::words_text;
use crate::common::{percentile, Rng};

/// The seed of one turn's text: distinct for every (seed, client, round).
pub(super) fn turn_seed(seed: u64, client: usize, round: usize) -> u64 {
    let mut r = Rng(seed ^ ((client as u64) << 32 | round as u64));
    r.next() ^ Rng(seed.rotate_left(17) ^ client as u64).next()
}

/// The user text of every turn: `turns[client][round]`.
pub(super) struct Workload {
    turns: Vec<Vec<String>>,
}

impl Workload {
    pub(super) fn new(clients: usize, rounds: usize, turn_tokens: usize, seed: u64) -> Self {
        let turns = (0..clients)
            .map(|c| {
                (0..rounds)
                    .map(|r| words_text(turn_seed(seed, c, r), turn_tokens))
                    .collect()
            })
            .collect();
        Workload { turns }
    }

    /// The prompt of turn `round` after the conversation `history`.
    fn prompt(&self, history: &str, client: usize, round: usize) -> String {
        format!("{history}User: {}\nAssistant:", self.turns[client][round])
    }
}

/// What every request of a workload run returned, and its wall time.
pub(super) struct WorkloadRun {
    pub(super) replies: Vec<Reply>,
    pub(super) wall: f64,
    /// Tokens of every conversation at its end (last prompt plus last answer).
    pub(super) conversation_tokens: u64,
}

/// Shared state of the workload's worker threads.
struct Turns {
    /// Conversations ready for their next turn: (client, next round, text so far).
    ready: VecDeque<(usize, usize, String)>,
    /// Conversations not yet finished.
    unfinished: usize,
    replies: Vec<Reply>,
    conversation_tokens: u64,
    error: Option<anyhow::Error>,
}

/// Runs every conversation of `w` on `server`, `in_flight` requests at a time.
pub(super) fn run_workload(
    server: &Server,
    w: &Workload,
    rounds: usize,
    output_tokens: usize,
    in_flight: usize,
) -> anyhow::Result<WorkloadRun> {
    let state = Mutex::new(Turns {
        ready: (0..w.turns.len()).map(|c| (c, 0, String::new())).collect(),
        unfinished: if rounds == 0 { 0 } else { w.turns.len() },
        replies: Vec::new(),
        conversation_tokens: 0,
        error: None,
    });
    let wake = Condvar::new();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..in_flight.max(1) {
            s.spawn(|| loop {
                // Bounded: every pass either takes a turn, or waits for one of the requests
                // in flight (each bounded by REQUEST_TIMEOUT) to finish or fail.
                let (client, round, history) = {
                    let mut st = state.lock().expect("workload state");
                    loop {
                        if st.error.is_some() || st.unfinished == 0 {
                            return;
                        }
                        if let Some(t) = st.ready.pop_front() {
                            break t;
                        }
                        st = wake
                            .wait_timeout(st, Duration::from_secs(1))
                            .expect("workload state")
                            .0;
                    }
                };
                let prompt = w.prompt(&history, client, round);
                let reply = server.generate(&prompt, output_tokens);
                let mut st = state.lock().expect("workload state");
                match reply {
                    Ok(r) => {
                        let history = format!("{prompt}{}\n", r.text);
                        if round + 1 < rounds {
                            st.ready.push_back((client, round + 1, history));
                        } else {
                            st.unfinished -= 1;
                            st.conversation_tokens += r.prompt_tokens + r.completion_tokens;
                        }
                        st.replies.push(r);
                    }
                    Err(e) => {
                        st.error = Some(e.context(format!("client {client}, round {round}")));
                    }
                }
                wake.notify_all();
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let st = state.into_inner().expect("workload state");
    if let Some(e) = st.error {
        return Err(e);
    }
    Ok(WorkloadRun {
        replies: st.replies,
        wall,
        conversation_tokens: st.conversation_tokens,
    })
}

/// The figures of one configuration's run.
pub(super) fn summarize(run: &WorkloadRun, pool_tokens: Option<u64>, ram_note: String) -> Value {
    let ttfts: Vec<f64> = run.replies.iter().map(|r| r.ttft).collect();
    let prompt: u64 = run.replies.iter().map(|r| r.prompt_tokens).sum();
    let mut by_source = Cached::default();
    for r in &run.replies {
        by_source.add(r.details.unwrap_or_default());
    }
    let n = run.replies.len();
    let wall = run.wall.max(1e-9);
    let mut v = json!({
        "ttft_p50_s": percentile(&ttfts, 50.0),
        "ttft_p90_s": percentile(&ttfts, 90.0),
        "throughput_req_s": n as f64 / wall,
        "input_tok_s": prompt as f64 / wall,
        "cached_tokens_by_source": by_source.to_json(),
        "cached_tokens": run.replies.iter().map(|r| r.cached_tokens).sum::<u64>(),
        "requests": n,
        "prompt_tokens": prompt,
        "wall_s": run.wall,
        "conversation_tokens": run.conversation_tokens,
        "ram_note": ram_note,
    });
    if let Some(p) = pool_tokens {
        v["pool_tokens"] = json!(p);
        v["pool_ratio"] = json!(run.conversation_tokens as f64 / p.max(1) as f64);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hicache::{RESTART_CONTEXT, RESTART_MIN_TOKENS};

    #[test]
    fn workload_is_deterministic_and_sized() {
        let a = Workload::new(16, 6, 300, 7);
        let b = Workload::new(16, 6, 300, 7);
        assert_eq!(a.turns, b.turns);
        assert_ne!(a.turns, Workload::new(16, 6, 300, 8).turns);
        let mut all: Vec<&String> = a.turns.iter().flatten().collect();
        assert_eq!(all.len(), 96);
        for t in &all {
            // ~1.087 tokens per word: 277 words for 300 tokens.
            assert_eq!(t.split_whitespace().count(), 277);
            assert!(t.ends_with(|c: char| c.is_ascii_lowercase() || c == '.'));
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 96, "every turn's text differs");
        // No two conversations start alike, so no page is shared across clients.
        let starts: std::collections::HashSet<String> = a
            .turns
            .iter()
            .map(|c| {
                c[0].split_whitespace()
                    .take(8)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        assert_eq!(starts.len(), 16);
        let restart = words_text(turn_seed(0, usize::MAX, 0), 4200);
        let words = restart.split_whitespace().count();
        // 4200 × 12/13 words ≈ 4,214 tokens at 1.087 per word: over 4,000, under 4,608.
        assert_eq!(words, 3877);
        let estimate = words as f64 * 1.087;
        assert!(estimate > RESTART_MIN_TOKENS as f64 && estimate < (RESTART_CONTEXT - 1) as f64);
    }

    #[test]
    fn prompts_extend_the_conversation() {
        let w = Workload::new(2, 2, 20, 1);
        let p0 = w.prompt("", 1, 0);
        assert_eq!(p0, format!("User: {}\nAssistant:", w.turns[1][0]));
        let history = format!("{p0} an answer\n");
        let p1 = w.prompt(&history, 1, 1);
        assert!(p1.starts_with(&history));
        assert!(p1.ends_with("\nAssistant:"));
    }

    #[test]
    fn summary_sums_sources() {
        let reply = |ttft: f64, d: Option<Cached>| Reply {
            text: String::new(),
            ttft,
            prompt_tokens: 100,
            completion_tokens: 8,
            cached_tokens: 64,
            details: d,
        };
        let run = WorkloadRun {
            replies: vec![
                reply(
                    0.1,
                    Some(Cached {
                        device: 16,
                        host: 32,
                        disk: 16,
                        remote: 0,
                    }),
                ),
                reply(
                    0.3,
                    Some(Cached {
                        device: 0,
                        host: 0,
                        disk: 64,
                        remote: 0,
                    }),
                ),
                reply(0.2, None),
            ],
            wall: 2.0,
            conversation_tokens: 1000,
        };
        let v = summarize(&run, Some(100), "note".into());
        assert_eq!(
            v["cached_tokens_by_source"],
            json!({"device": 16, "host": 32, "disk": 80, "remote": 0})
        );
        assert_eq!(v["requests"], 3);
        assert_eq!(v["throughput_req_s"], 1.5);
        assert_eq!(v["input_tok_s"], 150.0);
        assert_eq!(v["ttft_p50_s"], 0.2);
        assert_eq!(v["pool_ratio"], 10.0);
        assert_eq!(v["cached_tokens"], 192);
        assert!(summarize(&run, None, String::new())
            .get("pool_ratio")
            .is_none());
    }
}
