//! Grammars that used to take the server down or hold a worker for seconds: each gets a 400
//! naming the limit, quickly, and the server keeps serving.

use serde_json::{json, Value};
use sglrs_tests::Server;
use std::time::{Duration, Instant};

/// Every refusal must come back well inside the 1 s compile deadline (plus HTTP and queueing
/// on a loaded 2-core box).
const MAX_ANSWER: Duration = Duration::from_secs(5);

fn generate(s: &Server, sampling: Value) -> (u16, Value, Duration) {
    let t = Instant::now();
    let (status, body) = s.post(
        "/generate",
        &json!({"text": "Say something:", "sampling_params": sampling}),
    );
    (status, body, t.elapsed())
}

fn assert_refused(s: &Server, what: &str, sampling: Value, needle: &str) {
    let (status, body, took) = generate(s, sampling);
    assert_eq!(status, 400, "{what}: expected 400, got {status}: {body}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(needle),
        "{what}: the error should name {needle:?}: {msg}"
    );
    assert!(
        msg.len() < 600,
        "{what}: the error quotes too much of the input ({} bytes)",
        msg.len()
    );
    assert!(took < MAX_ANSWER, "{what}: answered after {took:?}");
    still_serving(s, what);
}

fn still_serving(s: &Server, after: &str) {
    let (status, body, _) = generate(s, json!({"max_new_tokens": 2, "temperature": 0}));
    assert_eq!(status, 200, "after {after}: {body}");
    assert!(body["text"].is_string(), "after {after}: {body}");
}

#[test]
fn hostile_grammars_are_refused_and_the_server_keeps_serving() {
    let s = Server::start(&["--threads", "2"]);

    // 10,000 nested parentheses in one GBNF rule: overflowed a tokio worker's stack and
    // aborted the whole process.
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(10_000), ")".repeat(10_000));
    assert_refused(&s, "10,000-deep GBNF", json!({"ebnf": deep}), "limit");

    // A 50,000-rule chain: answered only after ~16 s despite the 1 s deadline.
    let mut chain = String::from("root ::= r0\n");
    for i in 0..50_000 {
        chain.push_str(&format!("r{i} ::= \"a\" r{}\n", i + 1));
    }
    chain.push_str("r50000 ::= \"a\"\n");
    assert_refused(
        &s,
        "50,000-rule GBNF chain",
        json!({"ebnf": chain}),
        "limit",
    );

    // 10,000 nested regex groups.
    let deep_regex = format!("{}a{}", "(".repeat(10_000), ")".repeat(10_000));
    assert_refused(
        &s,
        "10,000-deep regex",
        json!({"regex": deep_regex}),
        "regex",
    );

    // A JSON schema nested 10,000 objects deep.
    let mut schema = json!({"type": "string"});
    for _ in 0..200 {
        schema = json!({"type": "object", "properties": {"a": schema}, "required": ["a"]});
    }
    let text = schema.to_string();
    let deep_text = format!(
        "{}{}{}",
        r#"{"type":"object","properties":{"a":"#.repeat(10_000),
        r#"{"type":"string"}"#,
        "}}".repeat(10_000)
    );
    assert_refused(
        &s,
        "10,000-deep JSON schema",
        json!({"json_schema": deep_text}),
        "json_schema",
    );

    // A 200-deep schema is real work but within the limits: it compiles or is refused by
    // name, never a crash or a hang.
    let (status, body, took) = generate(&s, json!({"json_schema": text, "max_new_tokens": 4}));
    assert!(
        status == 200 || status == 400,
        "200-deep schema: {status} {body}"
    );
    assert!(
        took < Duration::from_secs(30),
        "200-deep schema took {took:?}"
    );
    still_serving(&s, "the 200-deep schema");

    // The same bad grammar again costs no second compile: its failure is remembered.
    let bad = json!({"ebnf": "root ::= undefined_rule"});
    let (status, body, _) = generate(&s, bad.clone());
    assert_eq!(status, 400, "{body}");
    let before = compiles(&s);
    let (status, again, _) = generate(&s, bad);
    assert_eq!(status, 400, "{again}");
    assert_eq!(again["error"]["message"], body["error"]["message"]);
    assert_eq!(
        compiles(&s),
        before,
        "a remembered failure must not compile again"
    );
}

fn compiles(s: &Server) -> u64 {
    let (status, info) = s.get("/get_server_info");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&info).expect("server info is JSON");
    v["internal_states"][0]["grammar_compiles"]
        .as_u64()
        .expect("grammar_compiles in /get_server_info")
}
