//! End-to-end tests of `sglrs serve` with the real default model over HTTP.
//!
//! Each test starts its own server process (killed when the test ends, pass or fail); a
//! mutex runs them one at a time so that page accounting and latency checks are not
//! disturbed by each other on a small machine.

use serde_json::{json, Value};
use sglrs_tests::Server;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

fn server_lock() -> ((), MutexGuard<'static, ()>) {
    static LOCK: Mutex<()> = Mutex::new(());
    ((), LOCK.lock().unwrap_or_else(|p| p.into_inner()))
}

fn server() -> (Server, MutexGuard<'static, ()>) {
    let (_, guard) = server_lock();
    (Server::start(&[]), guard)
}

fn message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn assert_400(s: &Server, path: &str, body: &str, needle: &str) {
    let (status, v) = s.post_raw(path, body);
    assert_eq!(status, 400, "{body} → {v}");
    let m = message(&v);
    assert!(
        m.contains(needle),
        "message {m:?} should name {needle:?} (body {body})"
    );
    assert!(
        v["error"]["type"].is_string() && v["error"]["code"].is_number(),
        "{v}"
    );
}

#[test]
fn bad_input_gets_400_naming_the_problem_and_the_server_keeps_serving() {
    let (s, _g) = server();
    let s = &s;
    assert_400(s, "/generate", "{\"text\": \"hi\"", "invalid request body");
    assert_400(
        s,
        "/generate",
        r#"{"text": "hi", "bogus_field": 1}"#,
        "bogus_field",
    );
    assert_400(
        s,
        "/generate",
        r#"{"text": "hi", "sampling_params": {"top_q": 1}}"#,
        "top_q",
    );
    assert_400(
        s,
        "/generate",
        r#"{"text": "hi", "sampling_params": {"max_new_tokens": -5}}"#,
        "max_new_tokens",
    );
    assert_400(
        s,
        "/generate",
        r#"{"text": "hi", "sampling_params": {"max_new_tokens": 1000000000}}"#,
        "max_new_tokens",
    );
    let long = "hello ".repeat(20_000);
    assert_400(
        s,
        "/generate",
        &json!({"text": long}).to_string(),
        "context length",
    );
    assert_400(
        s,
        "/generate",
        r#"{"text": "hi", "sampling_params": {"regex": "(("}}"#,
        "regex",
    );
    assert_400(
        s,
        "/generate",
        r#"{"text": "hi", "sampling_params": {"json_schema": "{not json"}}"#,
        "json_schema",
    );
    assert_400(
        s,
        "/generate",
        r#"{"text": "hi", "sampling_params": {"stop_regex": ["ok", "(("]}}"#,
        "stop_regex",
    );
    assert_400(
        s,
        "/v1/completions",
        r#"{"prompt": "hi", "stop_regex": "a*"}"#,
        "stop_regex",
    );
    assert_400(
        s,
        "/generate",
        r#"{"text": "hi", "sampling_params": {"json_schema": "{\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"additionalProperties\": false}, \"uniqueItems\": true, \"minItems\": 2}"}}"#,
        "uniqueItems",
    );
    assert_400(
        s,
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "hi"}], "functions": []}"#,
        "functions",
    );
    assert_400(
        s,
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}"#,
        "max_tokens",
    );
    assert_400(
        s,
        "/v1/completions",
        r#"{"prompt": "hi", "max_tokens": 99999999}"#,
        "max_tokens",
    );
    // Still serving.
    let (status, v) = s.post("/generate", &json!({"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["meta_info"]["completion_tokens"], 4);
    let (status, _) = s.get("/health");
    assert_eq!(status, 200);
}

#[test]
fn generate_is_deterministic_and_reports_meta_info() {
    let (s, _g) = server();
    let s = &s;
    let body = json!({"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 0}});
    let (_, a) = s.post("/generate", &body);
    let (_, b) = s.post("/generate", &body);
    assert_eq!(a["text"], b["text"]);
    assert_eq!(a["output_ids"].as_array().map(Vec::len), Some(12));
    assert_eq!(a["meta_info"]["finish_reason"]["type"], "length");
    assert!(a["meta_info"]["prompt_tokens"].as_u64().unwrap() > 0);
    // Seeded sampling repeats; n samples come back as a list.
    let body = json!({"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 7, "n": 2}});
    let (_, a) = s.post("/generate", &body);
    let (_, b) = s.post("/generate", &body);
    assert_eq!(a.as_array().map(Vec::len), Some(2), "{a}");
    assert_eq!(a, strip_latency(b.clone(), &a));
    // A stop string ends the text before it.
    let (_, v) = s.post("/generate", &json!({"text": "Count: 1, 2, 3,", "sampling_params": {"max_new_tokens": 30, "temperature": 0, "stop": [","]}}));
    assert_eq!(v["meta_info"]["finish_reason"]["type"], "stop", "{v}");
    assert!(!v["text"].as_str().unwrap().contains(','), "{v}");
}

/// `b` with the latency fields of `a` (everything else must match exactly).
#[test]
fn stop_regex_stops_trims_and_never_streams_the_match() {
    let (s, _g) = server();
    let s = &s;
    let prompt = "Count: 1, 2, 3,";
    let (_, v) = s.post(
        "/generate",
        &json!({"text": prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 0}}),
    );
    let full = v["text"].as_str().unwrap().to_string();
    // A two-character alphanumeric pair from the greedy output (not at its very start), as
    // a regex of two one-character classes; the first place it occurs is where it stops.
    let b = full.as_bytes();
    let i = (2..b.len().saturating_sub(1))
        .find(|&i| b[i].is_ascii_alphanumeric() && b[i + 1].is_ascii_alphanumeric())
        .or_else(|| {
            (1..b.len())
                .find(|&i| b[i].is_ascii_alphanumeric())
                .map(|i| i - 1)
        })
        .unwrap_or_else(|| panic!("no alphanumeric text in {full:?}"));
    let pair = &full[i..i + 2];
    let pattern: String = pair.chars().map(|c| format!("[{c}]")).collect();
    let cut = full.find(pair).unwrap();
    let sp = json!({"max_new_tokens": 24, "temperature": 0, "stop_regex": pattern});
    let (_, v) = s.post("/generate", &json!({"text": prompt, "sampling_params": sp}));
    assert_eq!(v["text"], full[..cut], "{pattern} on {full:?}: {v}");
    assert_eq!(v["meta_info"]["finish_reason"]["type"], "stop", "{v}");
    assert_eq!(v["meta_info"]["finish_reason"]["matched"], pattern, "{v}");
    // no_stop_trim keeps the match.
    let mut sp2 = sp.clone();
    sp2["no_stop_trim"] = json!(true);
    let (_, v) = s.post(
        "/generate",
        &json!({"text": prompt, "sampling_params": sp2}),
    );
    assert_eq!(v["text"], full[..cut + 2], "{v}");
    // Streamed: the text so far never shows the match, and ends where the plain one does.
    let (status, body) = s.post(
        "/generate",
        &json!({"text": prompt, "stream": true, "sampling_params": sp}),
    );
    assert_eq!(status, 200);
    let mut last = String::new();
    for line in body.as_str().unwrap().lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            break;
        }
        let ev: Value = serde_json::from_str(data).unwrap();
        last = ev["text"].as_str().unwrap().to_string();
        assert!(!last.contains(pair), "streamed {last:?} shows {pair:?}");
    }
    assert_eq!(last, full[..cut]);
    // The OpenAI routes take it too and report the pattern as matched_stop.
    let (_, v) = s.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "stop_regex": [pattern]}),
    );
    assert_eq!(v["choices"][0]["text"], full[..cut], "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["choices"][0]["matched_stop"], pattern, "{v}");
}

fn strip_latency(mut b: Value, a: &Value) -> Value {
    if let (Some(bs), Some(as_)) = (b.as_array_mut(), a.as_array()) {
        for (x, y) in bs.iter_mut().zip(as_) {
            x["meta_info"]["e2e_latency"] = y["meta_info"]["e2e_latency"].clone();
            x["meta_info"]["cached_tokens"] = y["meta_info"]["cached_tokens"].clone();
            x["meta_info"]["id"] = y["meta_info"]["id"].clone();
        }
    }
    b
}

#[test]
fn constrained_generation_is_valid() {
    let (s, _g) = server();
    let s = &s;
    let (_, v) = s.post("/generate", &json!({"text": "My phone number is", "sampling_params": {"max_new_tokens": 20, "temperature": 0.8, "regex": "[0-9]{3}-[0-9]{4}"}}));
    let t = v["text"].as_str().unwrap();
    assert_eq!(t.len(), 8, "{v}");
    assert!(
        t.chars()
            .enumerate()
            .all(|(i, c)| if i == 3 { c == '-' } else { c.is_ascii_digit() }),
        "{t}"
    );
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]});
    for temp in [0.0, 0.9] {
        let (_, v) = s.post("/generate", &json!({"text": "A person as JSON:", "sampling_params": {"max_new_tokens": 40, "temperature": temp, "json_schema": schema.to_string()}}));
        let text = v["text"].as_str().unwrap();
        let out: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {v}"));
        // An integer of any size (sampling may write 28 digits, which serde reads as f64):
        // digits after an optional minus, no fraction or exponent.
        let age = text.split("\"age\":").nth(1).unwrap_or("");
        let digits = age.strip_prefix('-').unwrap_or(age);
        let n = digits.bytes().take_while(u8::is_ascii_digit).count();
        let integer = n > 0 && !matches!(digits.as_bytes().get(n), Some(b'.' | b'e' | b'E'));
        assert!(
            out["name"].is_string() && out["age"].is_number() && integer,
            "{out}"
        );
    }
}

/// The tree node of issue #22 (`closed`: with `additionalProperties: false`).
fn tree_schema(closed: bool) -> Value {
    let mut s = json!({
        "type": "object",
        "properties": {
            "label": {"type": "string", "maxLength": 20},
            "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#"}}
        },
        "required": ["label", "children"]
    });
    if closed {
        s["additionalProperties"] = json!(false);
    }
    s
}

/// Whether `v` is a valid tree node; returns its depth.
fn tree_depth(v: &Value, closed: bool) -> Result<usize, String> {
    let o = v.as_object().ok_or_else(|| format!("not an object: {v}"))?;
    let label = o["label"].as_str().ok_or("label is not a string")?;
    if label.chars().count() > 20 {
        return Err(format!("label {label:?} is over 20 characters"));
    }
    let children = o["children"].as_array().ok_or("children is not an array")?;
    if children.len() > 2 {
        return Err(format!("{} children", children.len()));
    }
    if closed && o.len() != 2 {
        return Err(format!("undeclared keys in {v}"));
    }
    let mut depth = 0;
    for c in children {
        depth = depth.max(tree_depth(c, closed)?);
    }
    Ok(depth + 1)
}

#[test]
fn recursive_schema_closes_by_max_tokens_and_a_limit_below_its_shortest_output_is_a_400() {
    let (s, _g) = server();
    let s = &s;
    let body = |closed: bool, max_tokens: u32| {
        json!({
            "messages": [{"role": "user", "content": "Write a family tree as deep as you can, as JSON."}],
            "temperature": 0,
            "max_tokens": max_tokens,
            "response_format": {"type": "json_schema", "json_schema": {"name": "node", "schema": tree_schema(closed)}},
        })
    };
    for closed in [false, true] {
        let (status, v) = s.post("/v1/chat/completions", &body(closed, 200));
        assert_eq!(status, 200, "{v}");
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        let out: Value = serde_json::from_str(content)
            .unwrap_or_else(|e| panic!("closed {closed}: {e}: {content} ({v})"));
        let depth = tree_depth(&out, closed).unwrap_or_else(|e| panic!("{e}: {content}"));
        let used = v["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(used <= 200, "{v}");
        eprintln!(
            "closed {closed}: depth {depth}, {used} tokens, {:?}",
            v["choices"][0]["finish_reason"]
        );
    }
    assert_400(
        s,
        "/v1/chat/completions",
        &body(true, 3).to_string(),
        "max_tokens",
    );
    let (_, v) = s.post_raw("/v1/chat/completions", &body(true, 3).to_string());
    assert!(message(&v).contains("at least"), "{v}");
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");
    // The native route names its own field.
    let native = json!({"text": "A tree:", "sampling_params": {"max_new_tokens": 3, "json_schema": tree_schema(true).to_string()}});
    assert_400(s, "/generate", &native.to_string(), "max_new_tokens");
}

#[test]
fn select_style_scoring_returns_input_logprobs() {
    let (s, _g) = server();
    let s = &s;
    let prefix = "The color of the sky is";
    let (_, v) = s.post(
        "/generate",
        &json!({"text": prefix, "sampling_params": {"max_new_tokens": 0}}),
    );
    let plen = v["meta_info"]["prompt_tokens"].as_u64().unwrap();
    let (status, v) = s.post(
        "/generate",
        &json!({
            "text": [format!("{prefix} blue"), format!("{prefix} green")],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": true, "logprob_start_len": plen - 2, "top_logprobs_num": 2,
        }),
    );
    assert_eq!(status, 200, "{v}");
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 2);
    for item in arr {
        let lps = item["meta_info"]["input_token_logprobs"]
            .as_array()
            .unwrap();
        assert!(lps.len() >= 2, "{item}");
        for e in lps.iter().skip(1) {
            assert!(e[0].as_f64().unwrap() <= 0.0 && e[1].is_u64(), "{e}");
        }
    }
}

#[test]
fn openai_routes_answer() {
    let (s, _g) = server();
    let s = &s;
    let (status, v) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["choices"][0]["message"]["content"].is_string());
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    let (status, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "1, 2, 3,", "max_tokens": 5, "temperature": 0, "logprobs": 2}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .map(Vec::len),
        Some(5),
        "{v}"
    );
    let (status, models) = s.get("/v1/models");
    assert_eq!(status, 200);
    assert!(models.contains("\"object\":\"list\""));
    let (status, metrics) = s.get("/metrics");
    assert_eq!(status, 200);
    for name in [
        "sglrs_num_queue_reqs",
        "sglrs_num_running_reqs",
        "sglrs_cache_hit_rate",
        "sglrs_gen_throughput",
        "sglrs_time_to_first_token_seconds_bucket",
        "sglrs_inter_token_latency_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "missing {name}");
    }
    // SGLang's names too (what llm-d and SGLang dashboards read), with its labels; the
    // requests above counted.
    let sglang = |name: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{model_name=")))
            .unwrap_or_else(|| panic!("missing {name}"));
        assert!(line.contains("engine_type=\"unified\""), "{line}");
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a value")
    };
    assert!(sglang("sglang:prompt_tokens_total") > 0.0);
    assert!(sglang("sglang:generation_tokens_total") > 0.0);
    assert!(sglang("sglang:max_total_num_tokens") > 0.0);
    let usage = sglang("sglang:token_usage");
    assert!((0.0..=1.0).contains(&usage), "{usage}");
    for name in [
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:cache_hit_rate",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
        "sglang:e2e_request_latency_seconds_count",
        "sglang:cached_tokens_total",
    ] {
        assert!(metrics.contains(name), "missing {name}");
    }
    let (status, _) = s.get("/health_generate");
    assert_eq!(status, 200);
}

#[test]
fn shared_prefix_is_cached_and_much_faster() {
    let (s, _g) = server();
    let s = &s;
    let (status, _) = s.post("/flush_cache", &json!({}));
    assert_eq!(status, 200);
    // ~1,000 tokens of prefix.
    let mut prefix = String::new();
    for i in 0..110 {
        prefix.push_str(&format!(
            "Fact {i}: the number {i} is {}. ",
            if i % 2 == 0 { "even" } else { "odd" }
        ));
    }
    let ask = |q: &str| {
        let t = Instant::now();
        let (status, v) = s.post("/generate", &json!({"text": format!("{prefix}\nQuestion: {q}\nAnswer:"), "sampling_params": {"max_new_tokens": 1, "temperature": 0}}));
        assert_eq!(status, 200, "{v}");
        (t.elapsed().as_secs_f64(), v)
    };
    let (t1, v1) = ask("is 7 odd?");
    let (t2, v2) = ask("is 12 even?");
    let p1 = v1["meta_info"]["prompt_tokens"].as_u64().unwrap();
    let cached = v2["meta_info"]["cached_tokens"].as_u64().unwrap();
    eprintln!("prefix test: prompt {p1} tokens, first {t1:.3}s, second {t2:.3}s, cached {cached}");
    assert!(p1 >= 1000, "prefix too short: {p1}");
    assert!(cached >= 992, "cached_tokens {cached}");
    assert!(t2 <= 0.2 * t1, "second TTFT {t2:.3}s vs first {t1:.3}s");
}

#[test]
fn pages_return_to_the_free_list_after_load_and_flush() {
    let (s, _g) = server();
    let s = &s;
    let bodies = vec![
        json!({"text": "Write a poem about the sea.", "sampling_params": {"max_new_tokens": 24, "temperature": 0.7, "n": 3}}),
        json!({"text": ["Tell me a story.", "List three fruits:"], "sampling_params": {"max_new_tokens": 16}}),
        json!({"text": "A JSON person:", "sampling_params": {"max_new_tokens": 30, "json_schema": "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},\"required\":[\"name\"]}"}}),
        json!({"text": "Stream this", "stream": true, "sampling_params": {"max_new_tokens": 16}}),
        json!({"text": "The quick brown fox", "return_logprob": true, "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 8}}),
    ];
    std::thread::scope(|sc| {
        for b in &bodies {
            sc.spawn(move || {
                let (status, v) = s.post("/generate", b);
                assert_eq!(status, 200, "{b} → {v}");
            });
        }
        // A client that goes away mid-request.
        sc.spawn(|| {
            let agent = ureq::AgentBuilder::new().timeout(std::time::Duration::from_millis(300)).build();
            let _ = agent
                .post(&format!("{}/generate", s.base_url))
                .send_json(json!({"text": "Never mind", "sampling_params": {"max_new_tokens": 400, "ignore_eos": true}}));
        });
    });
    // The abandoned request is aborted within a step or two of the server noticing the
    // disconnect. On a loaded machine it may even reach the scheduler after the others have
    // finished (and a flush has already succeeded), so flush until the pool is whole.
    let t = Instant::now();
    let cache = loop {
        let (status, _) = s.post("/flush_cache", &json!({}));
        if status == 200 {
            let (_, info) = s.get("/get_server_info");
            let info: Value = serde_json::from_str(&info).unwrap();
            let cache = info["internal_states"][0]["cache"].clone();
            if cache["free_pages"] == cache["total_pages"] {
                break cache;
            }
        }
        assert!(
            t.elapsed().as_secs() < 60,
            "the pool never became whole again: requests still running or pages leaked"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(cache["held_locks"], 0, "{cache}");
    assert_eq!(cache["internal_errors"], 0, "{cache}");
}

/// Drafts by n-gram lookup (on by default) change the number of forward passes and nothing
/// else: the same ids, text, logprobs and finish reasons as a server that decodes one token
/// per step, for greedy requests that repeat themselves, copy their prompt, follow a JSON
/// schema, stop on a string, ask for logprobs, and run side by side.
#[test]
fn drafted_tokens_give_the_same_output_as_one_token_per_step() {
    let bodies = [
        json!({"text": "List the files: notes.txt, notes.txt.bak, report.txt, report.txt.bak. Repeat the list three times.\n", "sampling_params": {"max_new_tokens": 96, "temperature": 0}}),
        json!({"text": "Write the numbers from 1 to 40 separated by commas: 1, 2, 3,", "sampling_params": {"max_new_tokens": 80, "temperature": 0, "stop": [" 31,"]}}),
        json!({"text": "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n\n# The same function, renamed fib2:\ndef fib2(n):", "sampling_params": {"max_new_tokens": 48, "temperature": 0}}),
        json!({"text": "Files: a.txt b.txt c.txt a.txt b.txt. As JSON:", "sampling_params": {"max_new_tokens": 60, "temperature": 0, "json_schema": "{\"type\":\"object\",\"properties\":{\"files\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8}},\"required\":[\"files\"]}"}}),
        json!({"text": "a b c a b c a b c a b", "return_logprob": true, "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 24, "temperature": 0}}),
    ];
    let run = |extra: &[&str]| {
        let (_, g) = server_lock();
        let s = Server::start(extra);
        let s = &s;
        let mut outs: Vec<Value> = vec![Value::Null; bodies.len()];
        std::thread::scope(|sc| {
            let handles: Vec<_> = bodies
                .iter()
                .map(|b| sc.spawn(move || s.post("/generate", b)))
                .collect();
            for (o, h) in outs.iter_mut().zip(handles) {
                let (status, v) = h.join().unwrap();
                assert_eq!(status, 200, "{v}");
                *o = v;
            }
        });
        // The responses can come back before the scheduler has put the finished
        // sequences' pages into the tree: wait until nothing runs (bounded).
        let t = std::time::Instant::now();
        let stats = loop {
            let st = s.server_info()["internal_states"][0].clone();
            let idle = st["num_running_reqs"] == 0 && st["cache"]["running_pages"] == 0;
            if idle || t.elapsed() > std::time::Duration::from_secs(30) {
                break st;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        drop(g);
        (outs, stats)
    };
    let (plain, plain_stats) = run(&["--speculative-ngram-tokens", "0"]);
    let (drafted, stats) = run(&[]);
    for (a, b) in plain.iter().zip(&drafted) {
        for key in ["text", "output_ids"] {
            assert_eq!(a[key], b[key], "{key}: {a} vs {b}");
        }
        let m = [
            "finish_reason",
            "completion_tokens",
            "output_token_logprobs",
            "output_top_logprobs",
        ];
        for key in m {
            assert_eq!(a["meta_info"][key], b["meta_info"][key], "{key}");
        }
    }
    assert_eq!(plain_stats["spec_draft_tokens"], 0, "{plain_stats}");
    let accepted = stats["spec_accepted_tokens"].as_u64().unwrap();
    assert!(accepted > 40, "{stats}");
    assert!(stats["spec_draft_tokens"].as_u64().unwrap() >= accepted);
    assert_eq!(plain_stats["generated_tokens"], stats["generated_tokens"]);
    // Every drafted page went back: the pools hold only what the cache keeps.
    assert_eq!(plain_stats["cache"], stats["cache"]);
}
