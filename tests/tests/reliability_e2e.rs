//! End-to-end tests of what keeps `sglrs serve` up under hostile or unlucky traffic: the
//! bounded queue, clients that leave while queued, rid ownership, the API key on every
//! route, cache namespaces on the OpenAI routes. Real binary, real model, 127.0.0.1 only.
//!
//! Each test starts its own server; a mutex runs them one at a time (timing checks on a
//! small machine).

use serde_json::{json, Value};
use sglrs_tests::{Reply, Server};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn server(args: &[&str]) -> (Server, MutexGuard<'static, ()>) {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    (Server::start(args), guard)
}

fn internal(s: &Server) -> Value {
    s.server_info()["internal_states"][0].clone()
}

/// Polls `/get_server_info` until `done` holds for its `internal_states[0]` (at most 60 s).
fn wait_until(s: &Server, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let st = internal(s);
        if done(&st) {
            return st;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{what}: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A request that keeps the only running slot busy for a while (greedy, no EOS).
fn long_request(tokens: u32) -> Value {
    json!({"text": "Tell me a long story about a dragon.",
           "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": true}})
}

#[test]
fn overload_is_refused_at_once_with_retry_after_and_the_accepted_requests_complete() {
    let (s, _g) = server(&["--max-queued-requests", "2", "--max-running-requests", "1"]);
    let s = &s;
    let body = long_request(48).to_string();
    let replies: Vec<(Reply, Duration)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let body = body.clone();
                sc.spawn(move || {
                    let t = Instant::now();
                    let r = s.request("POST", "/generate", &[], Some(&body));
                    (r, t.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (ok, refused): (Vec<_>, Vec<_>) = replies.iter().partition(|(r, _)| r.status == 200);
    let mut refusal_ms: Vec<f64> = refused.iter().map(|(_, t)| t.as_secs_f64() * 1e3).collect();
    refusal_ms.sort_by(f64::total_cmp);
    eprintln!(
        "overload: {} accepted, {} refused in {refusal_ms:.1?} ms",
        ok.len(),
        refused.len()
    );
    // One running and two waiting at most at any moment: 8 at once cannot all be taken.
    assert!(!refused.is_empty(), "nothing was refused");
    assert!(ok.len() >= 2, "fewer than the queue's 2 were accepted");
    for (r, _) in &refused {
        assert_eq!(r.status, 503, "{:?}", r.body);
        let secs: u64 = r
            .header("retry-after")
            .unwrap_or_else(|| panic!("503 without Retry-After: {:?}", r.headers))
            .parse()
            .expect("Retry-After in whole seconds");
        assert!(secs >= 1);
        assert_eq!(r.body["error"]["retry_after_ms"], secs * 1000, "{}", r.body);
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("overloaded")),
            "{}",
            r.body
        );
    }
    // Refusals do not wait for the queue: far faster than one accepted request (48 decode
    // steps), and the typical one well under 50 ms even on a busy 2-core box.
    let fastest_ok = ok.iter().map(|(_, t)| *t).min().unwrap();
    let median = refusal_ms[refusal_ms.len() / 2];
    assert!(median < 50.0, "median refusal {median:.1} ms");
    assert!(
        refusal_ms
            .iter()
            .all(|&ms| ms < fastest_ok.as_secs_f64() * 1e3),
        "a refusal took as long as an accepted request ({fastest_ok:?})"
    );
    for (r, _) in &ok {
        assert_eq!(r.body["meta_info"]["completion_tokens"], 48, "{}", r.body);
    }
    // Nothing is left holding a place, and the server still serves.
    let st = wait_until(s, "queue empties", |st| {
        st["queued_requests"] == 0 && st["num_running_reqs"] == 0
    });
    assert_eq!(st["num_waiting_reqs"], 0, "{st}");
    let r = s.request("POST", "/generate", &[], Some(&long_request(4).to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    // A batch larger than the queue is refused whole (nothing of it runs).
    let batch = json!({"text": ["a", "b", "c"], "sampling_params": {"max_new_tokens": 2}});
    let before = internal(s)["prompt_tokens"].as_u64().unwrap();
    let r = s.request("POST", "/generate", &[], Some(&batch.to_string()));
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(internal(s)["prompt_tokens"].as_u64().unwrap(), before);
    assert_eq!(s.server_info()["max_queued_requests"], 2);
}
