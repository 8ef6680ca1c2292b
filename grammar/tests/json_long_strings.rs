//! `maxLength` that the matcher counts (`src/length.rs`): strings whose regex × count product
//! would be too large — pydantic's `HttpUrl` (`format: uri`, `maxLength: 2083`), word-count
//! patterns with a character limit, free strings above the unrolled maximum. Exact at the
//! boundary (multi-byte characters and escapes count one), masks agree with feeding bytes,
//! the planned close stays within the limit, rollback restores the count.

mod common;

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

fn url_schema(max: u64) -> Value {
    json!({"properties": {"url": {"format": "uri", "maxLength": max, "minLength": 1,
        "title": "Url", "type": "string"}}, "required": ["url"], "title": "Fetch",
        "type": "object"})
}

fn url_call(url: &str) -> String {
    serde_json::to_string(&json!({ "url": url })).unwrap()
}

/// pydantic's `HttpUrl` / `AnyUrl` in a FastMCP tool: compiles, and URLs up to exactly
/// 2,083 characters are accepted, one more is refused.
#[test]
fn pydantic_http_url_compiles_and_counts_to_2083() {
    let g = common::compile_bytes(&url_schema(2083)).unwrap();
    let long_path = |n: usize| format!("https://example.com/{}", "a".repeat(n - 20));
    assert_eq!(long_path(2083).chars().count(), 2083);
    for url in [
        "https://example.com",
        "http://localhost:8080/api/v1/items?q=a%20b&limit=10#top",
        "mailto:someone@example.org",
        "urn:isbn:0451450523",
        &long_path(2083),
        &long_path(2000),
    ] {
        assert!(common::accepts_text(&g, &url_call(url)), "{url}");
    }
    for url in [
        long_path(2084).as_str(),
        &long_path(3000),
        "",
        "not a uri",
        "https://exa mple.com",
    ] {
        assert!(!common::accepts_text(&g, &url_call(url)), "{url}");
    }
    // A prefix past the limit is refused at the first character too many, not at the
    // closing quote.
    let mut m = Matcher::new(g.clone());
    let text = url_call(&long_path(2100));
    let fed = text
        .bytes()
        .take_while(|&b| m.try_advance_bytes(&[b]))
        .count();
    assert_eq!(fed, "{\"url\":\"".len() + 2083);
}

/// Free text of bounded length under a word-count pattern (`^(?:\S+\s+){0,49}\S+$` with
/// `maxLength: 500`, from real schemas): multi-byte characters and escapes (`\"`, `\\`,
/// `\n`, `\u0001`) count one character each, checked against a reference on random strings
/// around the limit.
#[test]
fn word_count_pattern_counts_characters_exactly() {
    let max = 120usize;
    let schema = json!({"type": "object", "properties": {"summary": {"type": "string",
        "pattern": "^(?:\\S+\\s+){0,49}\\S+$", "maxLength": max}},
        "required": ["summary"], "additionalProperties": false});
    let g = common::compile_bytes(&schema).unwrap();
    let words_ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with(char::is_whitespace)
            && !s.ends_with(char::is_whitespace)
            && s.split_whitespace().count() <= 50
    };
    let alphabet = [
        'a', 'b', ' ', 'é', '中', '😀', '"', '\\', '\n', '/', '\u{1}',
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut yes, mut no) = (0, 0);
    for _ in 0..600 {
        let len = rng.random_range(max - 6..max + 4);
        let s: String = (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        let want = s.chars().count() <= max && words_ok(&s);
        let text = serde_json::to_string(&json!({ "summary": s })).unwrap();
        assert_eq!(common::accepts_text(&g, &text), want, "{text}");
        if want {
            yes += 1;
        } else {
            no += 1;
        }
    }
    assert!(yes > 50 && no > 50, "{yes} accepted, {no} refused");
}

/// A free string above the unrolled maximum (4,096) is counted exactly instead of being
/// clamped.
#[test]
fn free_strings_above_the_unrolled_maximum_are_exact() {
    let g = common::compile_bytes(&json!({"type": "string", "maxLength": 10000})).unwrap();
    let s = |n: usize| serde_json::to_string(&"é".repeat(n)).unwrap();
    assert!(common::accepts_text(&g, &s(10000)));
    assert!(common::accepts_text(&g, &s(4097)));
    assert!(!common::accepts_text(&g, &s(10001)));
}

/// Rolling back tokens restores the count: after writing past half the limit, rolling
/// back and writing again reaches the same boundary.
#[test]
fn rollback_restores_the_count() {
    let g = common::compile_bytes(&url_schema(100)).unwrap();
    let vocab = g.vocab().clone();
    let mut m = Matcher::new(g.clone());
    let prefix = "{\"url\":\"https://e.com/";
    for b in prefix.bytes() {
        m.accept_token(u32::from(b) + 1).unwrap();
    }
    let used = "https://e.com/".len();
    for _ in 0..50 {
        m.accept_token(u32::from(b'a') + 1).unwrap();
    }
    m.rollback(50).unwrap();
    for i in 0..(100 - used) {
        m.accept_token(u32::from(b'b') + 1)
            .unwrap_or_else(|e| panic!("character {i}: {e}"));
    }
    let mut mask = vec![0u32; vocab.mask_words()];
    m.fill_mask(&mut mask).unwrap();
    let allowed = |t: u32| mask[(t / 32) as usize] >> (t % 32) & 1 == 1;
    assert!(!allowed(u32::from(b'b') + 1), "a character past the limit");
    assert!(allowed(u32::from(b'"') + 1), "the closing quote");
}

/// Random walks over Llama-3 tokens through URL strings with a limit of 100 characters:
/// every mask bit agrees with feeding the token's bytes, and the planned close from every
/// position is a valid call whose URL has at most 100 characters.
#[test]
fn llama3_masks_and_closes_respect_the_count() {
    let Some(tok) = common::llama3() else { return };
    let vocab = &tok.vocab;
    let schema = json!({"type": "object", "properties": {"urls": {"type": "array",
        "items": {"type": "string", "format": "uri", "maxLength": 100}, "maxItems": 2}},
        "required": ["urls"], "additionalProperties": false});
    let g = CompiledGrammar::json_schema_value(&schema, vocab.clone(), &CompileOptions::default())
        .unwrap();
    let ok = |text: &[u8]| -> bool {
        let Ok(v) = serde_json::from_slice::<Value>(text) else {
            return false;
        };
        v["urls"].as_array().is_some_and(|a| {
            a.iter()
                .all(|u| u.as_str().is_some_and(|s| s.chars().count() <= 100))
        })
    };
    // Long tokens mostly, from a URL already 60 to 80 characters long, so that walks reach
    // the limit.
    let start = |w: usize| {
        format!(
            "{{\"urls\":[\"https://example.com/{}",
            "x".repeat(40 + w * 10)
        )
        .into_bytes()
    };
    common::random_walks(&g, 11, 3, 60, &start, &|b| b.len() >= 4, 0.8, &ok);
}

/// A length or count bound that is not a non-negative integer is an invalid schema, refused
/// with its pointer (it used to be read as no bound, or as 0); names and data that only look
/// like the keyword are left alone.
#[test]
fn invalid_counts_are_refused_by_name() {
    for (schema, pointer) in [
        (
            json!({"type": "string", "maxLength": "long"}),
            "#/maxLength",
        ),
        (json!({"type": "string", "maxLength": -3}), "#/maxLength"),
        (json!({"type": "array", "minItems": 1.5}), "#/minItems"),
        (
            json!({"properties": {"a": {"items": {"type": "string", "minLength": null}}}}),
            "#/properties/a/items/minLength",
        ),
        (
            json!({"anyOf": [{"maxProperties": true}]}),
            "#/anyOf/0/maxProperties",
        ),
    ] {
        match common::compile_bytes(&schema) {
            Err(sglrs_grammar::CompileError::InvalidSchema { pointer: p, reason }) => {
                assert_eq!(p, pointer, "{schema}");
                assert!(reason.contains("non-negative integer"), "{reason}");
            }
            other => panic!("{schema}: {:?}", other.map(|_| ())),
        }
    }
    let g = common::compile_bytes(&json!({"type": "object",
        "properties": {"maxLength": {"type": "integer"}, "v": {"const": {"minItems": "x"}}},
        "required": ["maxLength"], "additionalProperties": false}))
    .unwrap();
    assert!(common::accepts_text(&g, r#"{"maxLength":3}"#));
    assert!(common::accepts_text(
        &g,
        r#"{"maxLength":3,"v":{"minItems":"x"}}"#
    ));
    let g = common::compile_bytes(&json!({"type": "string", "maxLength": 2.0})).unwrap();
    assert!(common::accepts_text(&g, r#""ab""#) && !common::accepts_text(&g, r#""abc""#));
}
