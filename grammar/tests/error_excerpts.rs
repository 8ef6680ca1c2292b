//! Error messages quote at most a short excerpt of the input: a request's grammar can be
//! megabytes, its error (logged, returned to the client) should not be.

mod common;

use serde_json::json;
use sglrs_grammar::{CompileError, CompileOptions, CompiledGrammar, GrammarSpec};

/// Longest message accepted: an 80-character excerpt, the error's own words, a pointer.
const MAX_MESSAGE: usize = 400;

fn error_of(spec: GrammarSpec) -> CompileError {
    match CompiledGrammar::compile(&spec, common::byte_vocab(), &CompileOptions::default()) {
        Err(e) => e,
        Ok(_) => panic!(
            "compiled, must be refused: {}",
            format!("{spec:?}").chars().take(200).collect::<String>()
        ),
    }
}

/// Checks that `e`'s message is short, quotes the excerpt `head` and marks the cut.
fn assert_bounded(e: &CompileError, head: &str) {
    let msg = e.to_string();
    assert!(
        msg.chars().count() <= MAX_MESSAGE,
        "{} characters: {}…",
        msg.chars().count(),
        msg.chars().take(200).collect::<String>()
    );
    assert!(msg.contains(head), "excerpt missing: {msg}");
    assert!(msg.contains('…'), "cut not marked: {msg}");
}

#[test]
fn a_long_invalid_regex_is_quoted_in_part() {
    // 100,000 characters, then an unclosed group.
    let p = format!("{}(", "ab".repeat(50_000));
    let e = error_of(GrammarSpec::Regex(p));
    assert!(matches!(e, CompileError::Regex { .. }), "{e}");
    assert_bounded(&e, &"ab".repeat(40));
    // The quoted part is the first 80 characters exactly.
    let CompileError::Regex { pattern, .. } = &e else {
        unreachable!()
    };
    assert_eq!(pattern, &format!("{}…", "ab".repeat(40)));
}

#[test]
fn a_deeply_nested_regex_is_quoted_in_part() {
    let p = format!("{}a{}", "(".repeat(10_000), ")".repeat(10_000));
    let e = error_of(GrammarSpec::Regex(p));
    assert_bounded(&e, &"(".repeat(80));
}

#[test]
fn a_short_regex_is_quoted_whole() {
    let e = error_of(GrammarSpec::Regex("a(b".into()));
    let msg = e.to_string();
    assert!(msg.contains("\"a(b\""), "{msg}");
    assert!(!msg.contains('…'), "{msg}");
}

#[test]
fn schema_errors_quote_long_references_and_patterns_in_part() {
    let long_ref = format!("#/$defs/{}", "x".repeat(100_000));
    let e = error_of(GrammarSpec::JsonSchema(
        json!({"$defs": {"a": {"type": "string"}}, "properties": {"p": {"$ref": long_ref}},
               "required": ["p"]})
        .to_string(),
    ));
    assert!(matches!(e, CompileError::InvalidSchema { .. }), "{e}");
    assert_bounded(&e, "#/$defs/xxxx");

    let remote = format!("https://example.com/{}", "y".repeat(100_000));
    let e = error_of(GrammarSpec::JsonSchema(json!({"$ref": remote}).to_string()));
    assert!(matches!(e, CompileError::Unsupported { .. }), "{e}");
    assert_bounded(&e, "https://example.com/yyyy");

    let bad_pattern = format!("{}(", "z".repeat(100_000));
    let e = error_of(GrammarSpec::JsonSchema(
        json!({"type": "string", "pattern": bad_pattern}).to_string(),
    ));
    assert_bounded(&e, &"z".repeat(79));

    let e = error_of(GrammarSpec::JsonSchema(
        json!({"type": "t".repeat(100_000)}).to_string(),
    ));
    assert!(matches!(e, CompileError::InvalidSchema { .. }), "{e}");
    assert_bounded(&e, &"t".repeat(79));
}

#[test]
fn gbnf_errors_quote_long_rule_names_in_part() {
    let name = "n".repeat(100_000);
    let e = error_of(GrammarSpec::Ebnf(format!("root ::= {name}\n")));
    assert!(matches!(e, CompileError::Gbnf { line: 1, .. }), "{e}");
    assert_bounded(&e, &"n".repeat(80));

    let e = error_of(GrammarSpec::Ebnf(format!(
        "root ::= \"a\"\n{name} ::= \"b\"\n{name} ::= \"c\"\n"
    )));
    assert!(e.to_string().contains("defined twice"), "{e}");
    assert_bounded(&e, &"n".repeat(80));
}
