//! Masks inside strings whose regex (`pattern`, `format`) is combined with length bounds
//! are exact.
//!
//! Such a string is compiled as the product of the regex automaton with a character
//! counter (`regex::emit_hir_len`), so every position is a new configuration. The mask code
//! maps each product state `(q, c)` whose count `c` lies in `[min, cap − L − slack]` (`L`
//! the longest token in bytes, `slack` the longest shortest completion of the regex) to the
//! same regex state at the smallest such count (`Nfa::count_representatives`), and lets
//! class loops close through that mapping. A small vocabulary (the 256 bytes plus tokens of
//! up to 8 bytes that run into the count's end, finish the regex, close the string and go
//! on) is checked token by token against feeding the bytes one at a time, at every
//! position of texts that cross the shared range and reach the maximum, and on random
//! walks; so are Llama-3 and Mistral along a long URI under `maxLength`.

mod common;

use std::sync::Arc;

use sglrs_grammar::{CompileOptions, CompiledGrammar, TokenVocab};

/// Tokens of up to 8 bytes: letter and digit runs, regex endings, string endings.
const EXTRA: &[&str] = &[
    "aaaaaaaa",
    "abcdefgh",
    "abcd",
    "ab",
    "-1234567",
    "-123456\"",
    "-12345",
    "123456\"}",
    "23456\"",
    "6\"}",
    "a-123456",
    "z-",
    "\"}",
    "\",\"",
    "a\"",
    "aa\"}",
    "https://",
    "www.",
    ".com/",
    "/a/b?c=d",
    "%41",
    "x%4",
    "\\\"",
    "é",
    "éé",
    "00000000",
    "0000\"",
    "x0\"",
];

/// Strings with a regex and length bounds, in objects and arrays (the shared count range is
/// `[min, cap − 32 − slack]` for this vocabulary, whose longest tokens exceed the 32-byte
/// horizon), a `maxLength: 100` free string (a counted call chain), and unanchored
/// searches (their configurations hold the one at the string's start plus partial
/// matches, and take their masks as that part's cached mask plus the rest's).
const SCHEMAS: &[&str] = &[
    r#"{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z]+-[0-9]{6}$","maxLength":40},"n":{"type":"integer"}}}"#,
    r#"{"type":"object","properties":{"u":{"type":"string","format":"uri","maxLength":70}}}"#,
    r#"{"type":"array","items":{"type":"string","pattern":"^[a-z0-9]*$","minLength":5,"maxLength":36}}"#,
    r#"{"type":"object","properties":{"s":{"type":"string","pattern":"^[^0-9]*[0-9]$","maxLength":30}}}"#,
    r#"{"type":"object","properties":{"f":{"type":"string","minLength":3,"maxLength":100},"n":{"type":"integer"}}}"#,
    r#"{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z]+-[0-9]{6}$","maxLength":90}}}"#,
    r#"{"type":"object","properties":{"p":{"type":"string","pattern":"\\w+[\\\\](\\w+\\.)*\\w+\\.dll"},"u":{"type":"string","pattern":"[0-9a-f]{4}-[0-9a-f]{2}"}}}"#,
    // Counted runs of a class (a change id, host-name labels): every position is a new
    // configuration, which every byte of the class leads to one next one.
    r#"{"type":"object","properties":{"c":{"type":"array","items":{"type":"string","pattern":"^I[a-z0-f]{40}$"}},"h":{"type":"string","format":"hostname"}}}"#,
];

/// Valid texts per schema (compact): through the shared range to the maximum.
const TEXTS: &[&[&str]] = &[
    &[
        r#"{"id":"abcdefghabcdefghabcdefghabcdefgh-123456","n":1}"#,
        r#"{"id":"abcdefghabcdefghabcdefghab-123456"}"#,
        r#"{"id":"a-123456","n":2}"#,
    ],
    &[
        r#"{"u":"https://www.example.com/a/b?c=d"}"#,
        r#"{"u":"https://www.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.com/abcdefgh/x%41/abcd/ab"}"#,
    ],
    &[r#"["aaaaa","abcdefghabcdefghabcdefghabcdefgh0000","0000000000000000000000000000000000aa"]"#],
    &[
        r#"{"s":"aaaaaaaaaaaaaaaaaaaaaaaa\"éé1"}"#,
        r#"{"s":"ééééééééééééééééééééééééééééé0"}"#,
    ],
    &[
        r#"{"f":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","n":1}"#,
        r#"{"f":"================================================================é\"abababababababababab","n":1}"#,
        r#"{"f":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","n":1}"#,
    ],
    &[
        r#"{"id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-123456"}"#,
        r#"{"id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-123456"}"#,
    ],
    &[
        r#"{"p":"bins\\bts1.dll","u":"x 12ab-12ab-cd-ef \"end"}"#,
        r#"{"p":"ab.c d\\ab\\a.b.dll.dll x","u":"00000000-00"}"#,
    ],
    &[
        r#"{"c":["Iabcdefghabcdefghabcdefghabcdefghabcdefgh","I0000000000000000000000000000000000000000"],"h":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.b-c.www.com"}"#,
        r#"{"h":"a.abcdefgh.00000000.x0"}"#,
    ],
];

/// Tokens longer than the representatives' horizon (32 bytes), which are checked one by
/// one: letter and digit runs, a run of `=`, runs that close the string and go on.
fn long_tokens() -> Vec<String> {
    vec![
        "a".repeat(33),
        "a".repeat(40),
        "=".repeat(64),
        "ab".repeat(20),
        "0".repeat(36),
        format!("{}\"}}", "a".repeat(33)),
        format!("{}-123456\"", "a".repeat(30)),
        format!("{}\",\"n\":1}}", "b".repeat(30)),
    ]
}

/// The 256 single bytes, EOS (id 0), the [`EXTRA`] tokens and the [`long_tokens`].
fn small_vocab() -> Arc<TokenVocab> {
    let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
    toks.extend((0u8..=255).map(|b| vec![b]));
    toks.extend(EXTRA.iter().map(|t| t.as_bytes().to_vec()));
    toks.extend(long_tokens().into_iter().map(String::into_bytes));
    // Just under the horizon: decided through the representatives, so they catch a range
    // that ignores the regex's slack.
    toks.extend(["a".repeat(24), "a".repeat(32), "b".repeat(28)].map(String::into_bytes));
    Arc::new(TokenVocab::new(toks, &[], &[0]).unwrap())
}

/// Every position of each valid text, both the greedy tokenization (long tokens) and byte
/// by byte, then random walks from the start and from inside the strings.
#[test]
fn masks_exact_in_counted_regex_strings() {
    let vocab = small_vocab();
    let opts = CompileOptions::default();
    for (si, (schema, texts)) in SCHEMAS.iter().zip(TEXTS).enumerate() {
        let g = CompiledGrammar::json_schema(schema, vocab.clone(), &opts)
            .unwrap_or_else(|e| panic!("{schema}: {e}"));
        for (ti, text) in texts.iter().enumerate() {
            let greedy = vocab.greedy_tokenize(text.as_bytes()).unwrap();
            common::check_path(&vocab, &g, &greedy, (si * 10 + ti) as u64, 0);
            let bytes: Vec<u32> = text.bytes().map(|b| b as u32 + 1).collect();
            common::check_path(&vocab, &g, &bytes, (si * 10 + ti) as u64, 0);
            // Random walks from several points of the text (inside the string, past the
            // shared range, near the maximum).
            for (k, cut) in [8usize, 20, 30, 44, 70, 95].into_iter().enumerate() {
                let cut = cut.min(bytes.len() - 1);
                if !text.is_char_boundary(cut) {
                    continue;
                }
                common::check_path(
                    &vocab,
                    &g,
                    &bytes[..cut],
                    (si * 100 + ti * 10 + k) as u64,
                    50,
                );
            }
        }
        for seed in 0..6u64 {
            common::check_path(&vocab, &g, &[], 1000 + seed, 70);
        }
    }
}

/// A long URI under `maxLength: 255` (a Github_hard schema's `portrait`), through the
/// shared range (up to `255 − 32 − slack`) and past it; a `maxLength: 100` free string with
/// runs of long tokens; unanchored searches (a BizTalk schema's `Path`, a uuid) through
/// partial and complete matches: with both real vocabularies.
#[test]
fn masks_exact_along_strings_real_vocabularies() {
    let url = format!(
        "https://www.aarhusteater.dk/{}/hamlet.jpg?size=large&x=%41#top",
        "abcdefghij/".repeat(14)
    );
    let cases = [
        (
            r#"{"type":"object","properties":{"portrait":{"type":"string","maxLength":255,"format":"uri"},"n":{"type":"integer"}},"required":["portrait"]}"#.to_string(),
            format!(r#"{{"portrait":"{url}","n":1}}"#),
        ),
        (
            r#"{"type":"object","properties":{"f":{"type":"string","maxLength":100},"g":{"type":"string","maxLength":100}}}"#.to_string(),
            format!(
                r#"{{"f":"{}","g":"com.example.category {}"}}"#,
                " ".repeat(70),
                "=".repeat(40)
            ),
        ),
        (
            r#"{"type":"object","properties":{"p":{"type":"string","pattern":"\\w+[\\\\](\\w+\\.)*\\w+\\.dll"},"u":{"type":"string","pattern":"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}"}}}"#.to_string(),
            r#"{"p":"bins\\bts1.dll","u":"123e4567-e89b-12d3-a456-426655440000"}"#.to_string(),
        ),
        (
            // Counted class runs: a change id, host names (labels of up to 30 characters).
            r#"{"type":"object","properties":{"c":{"type":"array","items":{"type":"string","pattern":"^I[a-z0-f]{40}$"}},"w":{"type":"array","items":{"type":"string","format":"hostname"}}}}"#.to_string(),
            r#"{"c":["I1234567890abcdef1234567890abcdef12345678"],"w":["www.googleapis.com","sheets.googleapis.com","example-service.nl","abcdefghijabcdefghijabcdefghij.com"]}"#.to_string(),
        ),
        (
            // `format: uri` in several objects: from its second use on the URI regex is
            // a rule called under each use's stack, and a thread inside it whose
            // uncertain tokens overflow takes its mask with the other threads under the
            // real stacks (`Lazy::overflowing`).
            r##"{"type":"object","properties":{"a":{"$ref":"#/$defs/D"},"b":{"$ref":"#/$defs/D"},"c":{"type":"array","items":{"$ref":"#/$defs/D"}}},"$defs":{"D":{"type":"object","properties":{"title":{"type":"string"},"url":{"type":"string","format":"uri"},"n":{"type":"integer"}}}}}"##.to_string(),
            r#"{"a":{"title":"A","url":"https://example.com/a-1","n":1},"b":{"url":"https://example.com/b?x=1#f"},"c":[{"title":"C","url":"https://example.com/c/d.pdf"},{"url":"ftp://h.example.org/x","n":2}]}"#.to_string(),
        ),
    ];
    let opts = CompileOptions::default();
    for tok in [common::llama3(), common::mistral()].into_iter().flatten() {
        for (schema, text) in &cases {
            let g = CompiledGrammar::json_schema(schema, tok.vocab.clone(), &opts).unwrap();
            let ids = tok.tokenize(text);
            common::check_path(&tok.vocab, &g, &ids, 7, 0);
        }
    }
}
