//! End-to-end tests of tenants (`--api-keys-file`): each key's tenant has its own cache
//! namespaces, keys are checked, and one tenant flooding the server neither starves
//! another's requests in the waiting queue nor takes all of its places. Real binary, real
//! model, 127.0.0.1 only.
//!
//! Each test starts its own server; a mutex runs them one at a time (timing checks on a
//! small machine).

use serde_json::{json, Value};
use sglrs_tests::{Reply, Server};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const KEY_A: &str = "key-of-alice-0123";
const KEY_B: &str = "key-of-bob-4567";

/// A keys file of two tenants, `alice` and `bob`.
fn keys_file() -> PathBuf {
    let path = std::env::temp_dir().join(format!("sglrs-tenants-{}.keys", std::process::id()));
    std::fs::write(
        &path,
        format!("# two tenants\n{KEY_A} alice\n\n{KEY_B}\tbob   # the second\n"),
    )
    .expect("writing the keys file");
    path
}

fn server(extra: &[&str]) -> (Server, MutexGuard<'static, ()>) {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let keys = keys_file();
    let mut args = vec!["--api-keys-file", keys.to_str().unwrap()];
    args.extend_from_slice(extra);
    (Server::start(&args), guard)
}

fn generate(s: &Server, key: &str, body: &Value) -> Reply {
    s.request(
        "POST",
        "/generate",
        &[("Authorization", &format!("Bearer {key}"))],
        Some(&body.to_string()),
    )
}

#[test]
fn tenants_never_share_cached_pages_and_each_key_is_checked() {
    let (s, _g) = server(&[]);
    let s = &s;
    let prompt: String = (0..40)
        .map(|i| format!("Record {i}: the value is {}. ", i * 7))
        .collect();
    let cached = |key: &str, salt: Option<&str>| -> u64 {
        let mut body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        let r = s.request(
            "POST",
            "/v1/completions",
            &[("Authorization", &format!("Bearer {key}"))],
            Some(&body.to_string()),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body["usage"]["prompt_tokens"].as_u64().unwrap() >= 200);
        r.body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached(KEY_A, None), 0, "alice, cold");
    assert!(cached(KEY_A, None) > 0, "alice shares her own pages");
    assert_eq!(cached(KEY_B, None), 0, "bob must not see alice's pages");
    assert!(cached(KEY_B, None) > 0, "bob shares his own pages");
    // The same salt on both keys still names two namespaces.
    assert_eq!(cached(KEY_A, Some("shared-salt")), 0);
    assert_eq!(
        cached(KEY_B, Some("shared-salt")),
        0,
        "a salt is per tenant"
    );
    assert!(cached(KEY_B, Some("shared-salt")) > 0);
    // `/generate`'s `extra_key` names the tenant's namespace of the same name.
    let native = |key: &str, extra: &str| {
        let b =
            json!({"text": prompt, "extra_key": extra, "sampling_params": {"max_new_tokens": 1}});
        let r = generate(s, key, &b);
        assert_eq!(r.status, 200, "{}", r.body);
        r.body["meta_info"]["cached_tokens"].as_u64().unwrap()
    };
    assert!(
        native(KEY_A, "shared-salt") > 0,
        "alice's salt on /generate"
    );

    // Keys: each right key works, a wrong one (or none, or a near miss) is 401.
    let body = json!({"text": "Hi", "sampling_params": {"max_new_tokens": 1}});
    for key in [KEY_A, KEY_B] {
        assert_eq!(generate(s, key, &body).status, 200, "{key}");
    }
    for wrong in [
        "nope",
        "key-of-alice-012",
        "key-of-alice-01234",
        "alice",
        "bob",
    ] {
        assert_eq!(generate(s, wrong, &body).status, 401, "{wrong}");
    }
    let r = s.request("POST", "/generate", &[], Some(&body.to_string()));
    assert_eq!(r.status, 401);
    assert_eq!(s.get("/health").0, 200, "/health stays open");
    assert_eq!(s.get("/get_server_info").0, 401);
}

/// Percentile `p` (0..=100) of `xs`.
fn percentile<T: Ord + Copy>(xs: &[T], p: usize) -> T {
    let mut v = xs.to_vec();
    v.sort();
    v[((v.len() - 1) * p).div_ceil(100)]
}

/// Forward passes the server has run.
fn passes(s: &Server) -> u64 {
    s.server_info_with(&format!("Bearer {KEY_B}"))["internal_states"][0]["forward_passes"]
        .as_u64()
        .expect("forward_passes")
}

#[test]
fn a_tenant_flooding_the_queue_neither_delays_nor_crowds_out_another() {
    // Four running places, 16 waiting places (8 per tenant by default). Alice floods with
    // 14 clients sending requests of 4 to 16 new tokens back to back (4 run, 8 wait, the
    // rest are refused and retry after 200 ms); bob sends one-token requests with a
    // ~300-token prompt one at a time. Bob's request is admitted at the next step with a
    // free place (alice's lengths differ, so one of her four frees every few passes); behind
    // alice's 8 queued requests (the order without tenants) it would wait two rounds of them.
    let (s, _g) = server(&[
        "--max-running-requests",
        "4",
        "--max-queued-requests",
        "16",
        "--chunked-prefill-size",
        "2048",
        "--max-batch-tokens",
        "2048",
        "--admission-hold-ms",
        "0",
    ]);
    let s = &s;
    let bob_prompt = |i: usize| -> Value {
        // A new first word each time: nothing of it is cached.
        let text: String = format!("Question {i} from bob: ")
            + &(0..150).map(|j| format!("w{j} ")).collect::<String>();
        json!({"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    };
    // Bob's latency and the forward passes the server ran meanwhile.
    let bob = |i: usize| -> (u16, Duration, u64) {
        let p0 = passes(s);
        let t = Instant::now();
        let r = generate(s, KEY_B, &bob_prompt(i));
        let d = t.elapsed();
        (r.status, d, passes(s) - p0)
    };
    for i in 0..3 {
        assert_eq!(bob(10_000 + i).0, 200, "warm-up");
    }
    let mut unloaded = Vec::new();
    for i in 0..10 {
        let (st, d, _) = bob(i);
        assert_eq!(st, 200);
        unloaded.push(d);
    }
    let unloaded_p50 = percentile(&unloaded, 50);

    let stop = AtomicBool::new(false);
    let (a_ok, a_refused) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (loaded, steps, b_status) = std::thread::scope(|sc| {
        for c in 0..14 {
            let (stop, a_ok, a_refused) = (&stop, &a_ok, &a_refused);
            sc.spawn(move || {
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({"text": format!("Alice {c}.{k}: tell me a story"),
                        "sampling_params": {"max_new_tokens": 4 + (c * 5 + k * 3) % 13, "temperature": 0, "ignore_eos": true}});
                    k += 1;
                    let r = generate(s, KEY_A, &body);
                    match r.status {
                        200 => a_ok.fetch_add(1, Ordering::Relaxed),
                        503 => {
                            let msg = r.body["error"]["message"].as_str().unwrap_or("");
                            assert!(
                                msg.contains("--max-queued-requests-per-tenant"),
                                "{}",
                                r.body
                            );
                            std::thread::sleep(Duration::from_millis(200));
                            a_refused.fetch_add(1, Ordering::Relaxed)
                        }
                        other => panic!("alice got {other}: {}", r.body),
                    };
                }
            });
        }
        std::thread::sleep(Duration::from_secs(2));
        let (mut loaded, mut steps, mut statuses) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..20 {
            let (st, d, n) = bob(100 + i);
            statuses.push(st);
            loaded.push(d);
            steps.push(n);
        }
        stop.store(true, Ordering::Relaxed);
        (loaded, steps, statuses)
    });
    let loaded_p99 = percentile(&loaded, 99);
    let report = format!(
        "bob unloaded p50 {unloaded_p50:?}, under alice's flood p50 {:?} p99 {loaded_p99:?}, \
         forward passes per request {steps:?}; alice {} ok, {} refused; bob's statuses \
         {b_status:?}",
        percentile(&loaded, 50),
        a_ok.load(Ordering::Relaxed),
        a_refused.load(Ordering::Relaxed),
    );
    eprintln!("{report}");
    assert!(b_status.iter().all(|&st| st == 200), "{report}");
    assert!(
        a_refused.load(Ordering::Relaxed) > 0,
        "alice never hit her share: {report}"
    );
    assert!(a_ok.load(Ordering::Relaxed) > 0, "{report}");
    // Counted in the server's own steps (what other load on the machine does not change):
    // admitted at the next free place, bob's request spans a few passes, HTTP included
    // (2 to 9 measured, once 13 on a loaded 2-core CI machine, where the client's own
    // threads compete with the server's); behind alice's queue about twenty for every one
    // of them. So the bound is on the 90th percentile: the queue would lift them all.
    assert!(percentile(&steps, 90) <= 12, "{report}");
    assert!(percentile(&steps, 50) <= 8, "{report}");
    // Wall time follows the passes but also the machine: on a 2-core CI box, alice's 14
    // client threads compete with the server's, and the slowest of bob's 20 requests
    // (p99 is the maximum here) once came in at 2.17x his unloaded median with no more
    // than 9 passes. The median carries the fairness claim; the tail is bounded looser.
    assert!(percentile(&loaded, 50) <= unloaded_p50 * 2, "{report}");
    assert!(loaded_p99 <= unloaded_p50 * 3, "{report}");
}

#[test]
fn rids_belong_to_their_tenant_and_no_tenant_can_abort_another() {
    let (s, _g) = server(&["--max-running-requests", "2"]);
    let s = &s;
    let long = |rid: &str| {
        json!({"text": "Tell me a long story about a dragon.", "rid": rid,
               "sampling_params": {"max_new_tokens": 300, "temperature": 0, "ignore_eos": true}})
    };
    let abort = |key: &str, body: &str| {
        s.request(
            "POST",
            "/abort_request",
            &[("Authorization", &format!("Bearer {key}"))],
            Some(body),
        )
    };
    let rids = || {
        s.server_info_with(&format!("Bearer {KEY_A}"))["internal_states"][0]["rids_in_flight"]
            .as_u64()
            .unwrap()
    };
    std::thread::scope(|sc| {
        let alice = sc.spawn(|| generate(s, KEY_A, &long("job-1")));
        let deadline = Instant::now() + Duration::from_secs(60);
        while rids() < 1 {
            assert!(Instant::now() < deadline, "alice's rid never appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Bob may use the same rid: it is his own.
        let bob = sc.spawn(|| generate(s, KEY_B, &long("job-1")));
        while rids() < 2 {
            assert!(Instant::now() < deadline, "bob's rid never appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Bob's abort, by rid or abort_all, reaches only his request.
        let r = abort(KEY_B, r#"{"rid": "job-1"}"#);
        assert_eq!((r.status, &r.body), (200, &json!({"aborted": 1})));
        let r = abort(KEY_B, r#"{"abort_all": true}"#);
        assert_eq!(r.status, 200, "{}", r.body);
        let b = bob.join().unwrap();
        assert_eq!(
            b.body["meta_info"]["finish_reason"]["type"], "abort",
            "{}",
            b.body
        );
        // Alice's request ran to its end.
        let a = alice.join().unwrap();
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(
            a.body["meta_info"]["finish_reason"]["type"], "length",
            "{}",
            a.body
        );
        assert_eq!(a.body["meta_info"]["completion_tokens"], 300);
    });
    assert_eq!(rids(), 0);
}
