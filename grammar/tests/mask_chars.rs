//! Masks are exact where a configuration and its donor differ only until a multi-byte
//! character is complete.
//!
//! A donor walk (`Lazy::paired_walk`) follows the token trie from a configuration `C` and
//! the configuration `G` most plain characters lead it to, skipping a subtree wherever both
//! reach the same configuration. After a UTF-8 lead byte they usually differ (`C` at a
//! string's first character, `G` inside its loop) until the character is complete; the walk
//! skips such a subtree when every continuation leads both to one configuration
//! (`Lazy::agree_within_char`). Where the first character matters — `minLength`, a pattern
//! anchored on a non-ASCII character, declared keys and enum values that start with one, a
//! one-character maximum — they do not agree, and the subtree must be walked. A vocabulary of
//! the 256 bytes plus tokens made of 2-, 3- and 4-byte characters, partial characters and
//! quotes is checked token by token against feeding the bytes one at a time, after every
//! byte of valid texts and on random walks; so are Llama-3 and Mistral.

mod common;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher, TokenVocab};

/// Tokens of whole and partial multi-byte characters, alone and before quotes.
const EXTRA: &[&[u8]] = &[
    "é".as_bytes(),
    "éé".as_bytes(),
    "é\"".as_bytes(),
    "éé\"".as_bytes(),
    "é\",\"".as_bytes(),
    "é\":".as_bytes(),
    "été".as_bytes(),
    "été\":".as_bytes(),
    "ñ\":\"".as_bytes(),
    "€".as_bytes(),
    "€\"".as_bytes(),
    "€x".as_bytes(),
    "€x\"".as_bytes(),
    "日本".as_bytes(),
    "日本\"".as_bytes(),
    "😀".as_bytes(),
    "😀\"".as_bytes(),
    "😀😀\"}".as_bytes(),
    b"\xC3",
    b"\xE2\x82",
    b"\xF0\x9F\x98",
    b"\xA9\"",
    b"\x82\xAC\"",
    b"\x98\x80\"",
    "aé\"".as_bytes(),
];

/// Strings, keys and enum values whose first character (or first few) decide the rest.
const SCHEMAS: &[&str] = &[
    r#"{"type":"string","minLength":2}"#,
    r#"{"type":"object","properties":{"s":{"type":"string","minLength":1,"maxLength":3},"t":{"type":"string","minLength":3}}}"#,
    r#"{"type":"string","pattern":"^é"}"#,
    r#"{"type":"string","pattern":"^[a-z€]+$"}"#,
    r#"{"type":"object","properties":{"été":{"type":"integer"},"ñ":{"type":"string"}},"additionalProperties":{"type":"string","minLength":2}}"#,
    r#"{"type":"array","items":{"enum":["é","éé","€x","日本"]}}"#,
    r#"{"type":"array","items":{"type":"string","maxLength":1}}"#,
];

/// Valid texts per schema (compact).
const TEXTS: &[&[&str]] = &[
    &["\"éé\"", "\"é😀\"", "\"€x\"", "\"ab\""],
    &[
        "{\"s\":\"é\",\"t\":\"日本x\"}",
        "{\"s\":\"😀😀😀\",\"t\":\"ééé\"}",
    ],
    &["\"é\"", "\"éé\"", "\"é😀\""],
    &["\"a€b\"", "\"€\""],
    &[
        "{\"été\":1,\"ñ\":\"é\"}",
        "{\"ét\":\"éé\",\"€\":\"日本\"}",
        "{\"😀\":\"€€\"}",
    ],
    &["[\"é\",\"éé\",\"€x\",\"日本\"]"],
    &["[\"é\",\"😀\",\"\",\"a\"]"],
];

fn small_vocab() -> Arc<TokenVocab> {
    let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
    toks.extend((0u8..=255).map(|b| vec![b]));
    toks.extend(EXTRA.iter().map(|t| t.to_vec()));
    Arc::new(TokenVocab::new(toks, &[], &[0]).unwrap())
}

/// Checks every mask after every byte of `text`, then random walks from a few points.
fn check_text(vocab: &TokenVocab, g: &Arc<CompiledGrammar>, text: &str, seed: u64) {
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut m = Matcher::new(g.clone());
    let bytes = text.as_bytes();
    let mut starts = Vec::new();
    for k in 0..=bytes.len() {
        common::check_mask(vocab, &m, &mut mask, &bytes[..k]);
        if k % 3 == 0 {
            starts.push(m.clone());
        }
        if k < bytes.len() {
            assert!(m.try_advance_bytes(&bytes[k..k + 1]), "{text} at {k}");
        }
    }
    assert!(m.is_accepting(), "{text} not accepted");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for start in starts {
        let mut m = start;
        let mut at = Vec::new();
        for _ in 0..12 {
            let allowed = common::check_mask(vocab, &m, &mut mask, &at);
            let usable: Vec<u32> = allowed
                .into_iter()
                .filter(|id| !vocab.eos().contains(id))
                .collect();
            if usable.is_empty() {
                break;
            }
            // Prefer the multi-byte tokens, which cross characters.
            let id = if rng.random_bool(0.6) {
                let multi: Vec<u32> = usable.iter().copied().filter(|&i| i > 256).collect();
                if multi.is_empty() {
                    usable[rng.random_range(0..usable.len())]
                } else {
                    multi[rng.random_range(0..multi.len())]
                }
            } else {
                usable[rng.random_range(0..usable.len())]
            };
            m.accept_token(id).unwrap();
            at.extend_from_slice(vocab.token_bytes(id).unwrap());
        }
    }
}

#[test]
fn masks_exact_where_first_characters_matter() {
    let vocab = small_vocab();
    for (i, (schema, texts)) in SCHEMAS.iter().zip(TEXTS).enumerate() {
        let g = CompiledGrammar::json_schema(schema, vocab.clone(), &CompileOptions::default())
            .unwrap_or_else(|e| panic!("{schema}: {e}"));
        for (j, text) in texts.iter().enumerate() {
            check_text(&vocab, &g, text, (i * 10 + j) as u64);
        }
    }
}

#[test]
fn masks_exact_where_first_characters_matter_real_vocabularies() {
    let toks: Vec<_> = [common::llama3(), common::mistral()]
        .into_iter()
        .flatten()
        .collect();
    // Empty only when the tokenizers are missing and allowed to be (`common::shared_path`).
    if toks.is_empty() {
        return;
    }
    for tok in toks {
        let vocab = tok.vocab.clone();
        let mut mask = vec![0u32; vocab.mask_words()];
        for (schema, texts) in SCHEMAS.iter().zip(TEXTS) {
            let g = CompiledGrammar::json_schema(schema, vocab.clone(), &CompileOptions::default())
                .unwrap_or_else(|e| panic!("{schema}: {e}"));
            for text in texts.iter() {
                // Every token boundary of the greedy tokenization.
                let mut m = Matcher::new(g.clone());
                let mut at = Vec::new();
                for id in tok.tokenize(text) {
                    common::check_mask(&vocab, &m, &mut mask, &at);
                    m.accept_token(id).unwrap();
                    at.extend_from_slice(vocab.token_bytes(id).unwrap());
                }
                common::check_mask(&vocab, &m, &mut mask, &at);
                assert!(m.is_accepting(), "{text}");
            }
        }
    }
}
