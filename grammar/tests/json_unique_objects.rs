//! `uniqueItems` on arrays of objects (open objects, an `anyOf` of them, free strings beside
//! them): items compared as JSON values (keys in any order, numbers by value, strings by
//! character), the `}` that would close a repeat refused, masks and the planned close
//! agreeing with it. Checked against an independent comparison of serde_json values on
//! random walks. The string, integer and number items are in `json_unique.rs`.

mod common;

use common::{g_bytes, llama3_grammar};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

/// Object items with free property names (`additionalProperties` absent): an item equal to
/// an earlier one as a value — keys in another order, a number or a string spelt another
/// way, a repeated key whose last value makes it equal — is refused at its `}`; anything
/// else is not.
const OBJS: &str = r#"{"type":"array","uniqueItems":true,"items":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"]}}"#;

#[test]
fn repeated_object_items_are_refused() {
    let g = g_bytes(OBJS);
    for ok in [
        "[]",
        r#"[{"a":1}]"#,
        r#"[{"a":1},{"a":2},{"a":1,"b":""},{"a":1,"b":"x"},{"a":1,"x":1}]"#,
        r#"[{"a":1,"x":1},{"a":1,"x":"1"},{"a":1,"x":[1]},{"a":1,"x":{"y":1}}]"#,
        r#"[{"a":1,"x":1,"y":2},{"a":1,"x":2,"y":1}]"#,
        r#"[{"a":1,"x":{"p":1,"q":2}},{"a":1,"x":{"p":2,"q":1}}]"#,
        r#"[{"a":1,"x":1e2},{"a":1,"x":1e3}]"#,
        r#"[{"a":1,"x":1,"x":2},{"a":1,"x":1}]"#,
    ] {
        assert!(common::accepts_text(&g, ok), "{ok}");
    }
    for bad in [
        r#"[{"a":1},{"a":1}]"#,
        r#"[{"a":1},{"a":2},{"a":1}]"#,
        r#"[{"a":1,"b":"x"},{"a":1,"b":"x"}]"#,
        // Keys in another order.
        r#"[{"a":1,"x":1,"y":2},{"a":1,"y":2,"x":1}]"#,
        r#"[{"a":1,"x":{"p":1,"q":[true,null]}},{"a":1,"x":{"q":[true,null],"p":1}}]"#,
        // Numbers by value.
        r#"[{"a":1,"x":1},{"a":1,"x":1.0}]"#,
        r#"[{"a":1,"x":100},{"a":1,"x":1e2}]"#,
        r#"[{"a":1,"x":0.5},{"a":1,"x":5E-1}]"#,
        r#"[{"a":1,"x":0},{"a":1,"x":-0.0}]"#,
        // Strings by characters.
        r#"[{"a":1,"b":"A"},{"a":1,"b":"\u0041"}]"#,
        r#"[{"a":1,"x":"é/"},{"a":1,"x":"\u00e9\/"}]"#,
        // The last of a repeated key counts.
        r#"[{"a":1,"x":2},{"a":1,"x":1,"x":2}]"#,
    ] {
        assert!(!common::accepts_text(&g, bad), "{bad}");
    }
    // The repeat is refused at its `}`, and the text goes on from there.
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"[{"a":1,"x":1},{"x":1,"a":1"#));
    assert!(!m.clone().try_advance_bytes(b"}"));
    assert!(m.try_advance_bytes(br#","y":1}]"#) && m.is_accepting());
}

/// Flexible whitespace between and inside items changes nothing.
#[test]
fn object_items_under_the_flexible_policy() {
    let opts = CompileOptions {
        whitespace: sglrs_grammar::Whitespace::Flexible,
        ..CompileOptions::default()
    };
    let g = CompiledGrammar::json_schema(OBJS, common::byte_vocab(), &opts).unwrap();
    assert!(common::accepts_text(&g, "[ {\"a\": 1} , {\"a\": 2} ]"));
    assert!(!common::accepts_text(&g, "[ {\"a\": 1} , { \"a\" : 1 } ]"));
    assert!(!common::accepts_text(
        &g,
        "[\n  {\"a\": 1, \"x\": 1},\n  {\"a\": 1,\n \"x\": 1.0}\n]"
    ));
}

/// Nested arrays: each item counts in its innermost array only. `p` allows repeats (not
/// unique), `q` is a unique array of strings, `r` a unique array of objects.
#[test]
fn object_items_count_in_their_innermost_array() {
    let g = g_bytes(
        r#"{"type":"array","uniqueItems":true,"items":{"type":"object","properties":{"p":{"type":"array","items":{"type":"object"}},"q":{"type":"array","items":{"type":"string"},"uniqueItems":true},"r":{"type":"array","items":{"type":"object"},"uniqueItems":true}}}}"#,
    );
    for ok in [
        r#"[{"p":[{"a":1},{"a":1}]}]"#,
        r#"[{"p":[{"a":1}]},{"p":[{"a":1},{"a":1}]}]"#,
        r#"[{"q":["a","b"]},{"q":["b","a"]}]"#,
        r#"[{"r":[{},{"a":1}]},{"r":[{"a":1},{}]}]"#,
        r#"[{"x":[{"a":1},{"a":1}]}]"#,
    ] {
        assert!(common::accepts_text(&g, ok), "{ok}");
    }
    for bad in [
        r#"[{"p":[{"a":1},{"a":1}]},{"p":[{"a":1},{"a":1}]}]"#,
        r#"[{"q":["a","a"]}]"#,
        r#"[{"r":[{"a":1},{"a":1.0}]}]"#,
        r#"[{"r":[{}]},{"r":[{}]}]"#,
        r#"[{"x":[{"a":1},{"a":1}]},{"x":[{"a":1},{"a":1}]}]"#,
    ] {
        assert!(!common::accepts_text(&g, bad), "{bad}");
    }
}

/// Items under an `anyOf` of open objects (each branch takes undeclared names too).
#[test]
fn object_items_under_an_any_of_of_open_objects() {
    let g = g_bytes(
        r#"{"type":"array","uniqueItems":true,"items":{"type":"object","anyOf":[{"properties":{"u":{"type":"string"}},"required":["u"]},{"properties":{"m":{"type":"integer"}},"required":["m"]}]}}"#,
    );
    assert!(common::accepts_text(
        &g,
        r#"[{"u":"a"},{"m":1},{"u":"a","m":1},{"u":"b"}]"#
    ));
    assert!(!common::accepts_text(
        &g,
        r#"[{"u":"a"},{"m":1},{"u":"a"}]"#
    ));
    assert!(!common::accepts_text(
        &g,
        r#"[{"u":"a","m":1},{"m":1,"u":"a"}]"#
    ));
    // A closed branch could run out of new values: the array is searched instead
    // (`json_unique_closed.rs`), repeats are refused all the same.
    let g = g_bytes(
        r#"{"type":"array","uniqueItems":true,"items":{"type":"object","anyOf":[{"properties":{"u":{"type":"string"}}},{"properties":{"m":{"type":"boolean"}},"additionalProperties":false}]}}"#,
    );
    assert!(common::accepts_text(
        &g,
        r#"[{"m":true},{"m":false},{"m":true,"x":1}]"#
    ));
    assert!(!common::accepts_text(
        &g,
        r#"[{"m":true},{"m":false},{"m":true}]"#
    ));
}

/// Another reading of the same text that allows repeats keeps the text going.
#[test]
fn object_items_beside_a_reading_that_allows_repeats() {
    let g = g_bytes(
        r#"{"anyOf":[{"type":"array","items":{"type":"object"},"uniqueItems":true},{"type":"array","items":{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false},"maxItems":2}]}"#,
    );
    assert!(common::accepts_text(&g, r#"[{"a":1},{"a":1}]"#));
    assert!(common::accepts_text(
        &g,
        r#"[{"a":1},{"b":1},{"a":1,"b":1}]"#
    ));
    assert!(!common::accepts_text(&g, r#"[{"a":1},{"a":1},{"a":2}]"#));
    assert!(!common::accepts_text(&g, r#"[{"b":1},{"b":1}]"#));
}

/// No two items equal under [`common::json_eq`].
fn all_distinct(items: &[Value]) -> bool {
    items
        .iter()
        .enumerate()
        .all(|(i, x)| items[..i].iter().all(|y| !common::json_eq(x, y)))
}

/// Independent check for [`OBJS`]: an array of objects with an integer `a`, a string `b`
/// if any, no two equal.
fn objs_ok(text: &[u8]) -> bool {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(text) else {
        return false;
    };
    let shape = items.iter().all(|it| {
        it.get("a").is_some_and(|a| a.is_i64() || a.is_u64())
            && it.get("b").is_none_or(Value::is_string)
    });
    shape && all_distinct(&items)
}

#[test]
fn object_item_masks_refuse_exactly_the_tokens_that_close_a_repeat() {
    let Some(tok) = common::llama3() else { return };
    let g = llama3_grammar(OBJS).unwrap();
    let id = |s: &str| {
        let ids = tok.tokenize(s);
        assert_eq!(ids.len(), 1, "{s} is one token");
        ids[0]
    };
    let mut mask = vec![0u32; tok.vocab.mask_words()];
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"[{"a":1,"x":2},{"x":2,"a":1"#));
    let allowed = common::check_mask(&tok.vocab, &m, &mut mask, b"");
    for t in ["}", "},", "}]", "}}"] {
        assert!(!allowed.contains(&id(t)), "{t} after a repeat");
    }
    for t in [",", ",\"", "0", "2"] {
        assert!(allowed.contains(&id(t)), "{t}");
    }
    // The planned close adds what makes the item new.
    let close = m.closing_bytes();
    let mut c = m.clone();
    assert!(c.try_advance_bytes(&close) && c.is_accepting(), "{close:?}");
    let full = [br#"[{"a":1,"x":2},{"x":2,"a":1"#.as_slice(), &close].concat();
    assert!(objs_ok(&full), "{}", String::from_utf8_lossy(&full));
    // `},{` closes the repeat inside the token: refused too.
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"[{"a":1},{"a":1"#));
    let allowed = common::check_mask(&tok.vocab, &m, &mut mask, b"");
    assert!(!allowed.contains(&id("},{")) && !allowed.contains(&id("}")));
    assert!(allowed.contains(&id("2")) && allowed.contains(&id(",\"")));
}

/// Random walks over Llama-3 on [`OBJS`] drawing mostly among a few short tokens, so that
/// items repeat often (also through keys in another order): every mask against the
/// byte-by-byte reference, every planned close validated independently.
#[test]
fn object_item_masks_match_the_byte_reference_on_random_walks() {
    let Some(tok) = common::llama3() else { return };
    let g = llama3_grammar(OBJS).unwrap();
    let pieces = one_token_pieces(
        tok,
        &[
            "{\"", "a", "b", "x", "\":", "1", "2", "1.0", "}", "},", ",\"", "\"", "\"}", "},{\"",
        ],
    );
    assert!(pieces.len() >= 10, "{}", pieces.len());
    let prefer = |b: &[u8]| pieces.iter().any(|p| p == b);
    let start = |w: usize| match w % 3 {
        0 => b"[".to_vec(),
        1 => br#"[{"a":1,"x":2},{"a":2},"#.to_vec(),
        _ => br#"[{"x":1,"a":1},{"a":1,"x":"a"},"#.to_vec(),
    };
    common::random_walks(&g, 21, 6, 30, &start, &prefer, 0.9, &objs_ok);
    // Fewer pieces still: nearly every item is `{"a":1}`, `{"a":11}` or `{"a":2}`.
    let few: Vec<Vec<u8>> = ["{\"", "a", "\":", "1", "2", "}", "},"]
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    let prefer = |b: &[u8]| few.iter().any(|p| p == b);
    common::random_walks(&g, 22, 4, 30, &|_| b"[".to_vec(), &prefer, 0.95, &objs_ok);
}

/// Walks over Llama-3 that write items from a short list (equal values among them: keys
/// in another order, `1` and `1.0`, `"A"` and `"\u0041"`), token by token as Llama-3
/// splits them: at every position the whole mask is checked against the byte-by-byte
/// reference and the planned close validated independently; an item whose close is
/// refused is rolled back and another one drawn. The refusals are counted, so that the
/// walks do reach repeats.
#[test]
fn object_items_written_from_a_short_list_repeat_and_are_refused() {
    let Some(tok) = common::llama3() else { return };
    let vocab = &tok.vocab;
    let g = llama3_grammar(OBJS).unwrap();
    let items = [
        r#"{"a":1}"#,
        r#"{"a":2}"#,
        r#"{"a":1,"x":2}"#,
        r#"{"x":2,"a":1}"#,
        r#"{"a":1,"x":2.0}"#,
        r#"{"a":1,"b":"A"}"#,
        r#"{"a":1,"b":"\u0041"}"#,
        r#"{"a":1,"x":{"p":[1,2],"q":null}}"#,
        r#"{"a":1,"x":{"q":null,"p":[1,2.0]}}"#,
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut mask = vec![0u32; vocab.mask_words()];
    let (mut refused, mut written) = (0, 0);
    for _ in 0..3 {
        let mut m = Matcher::new(g.clone());
        let mut text = b"[".to_vec();
        assert!(m.try_advance_bytes(&text));
        let mut n = 0;
        for _ in 0..10 {
            let item = items[rng.random_range(0..items.len())];
            let sep = if n == 0 { "" } else { "," };
            let ids = tok.tokenize(&format!("{sep}{item}"));
            let mut taken = 0;
            for &id in &ids {
                let allowed = common::check_mask(vocab, &m, &mut mask, &text);
                let close = m.closing_bytes();
                let full = [text.as_slice(), close.as_slice()].concat();
                assert!(objs_ok(&full), "{}", String::from_utf8_lossy(&full));
                if !allowed.contains(&id) {
                    break;
                }
                m.accept_token(id).unwrap();
                text.extend_from_slice(vocab.token_bytes(id).unwrap());
                taken += 1;
            }
            if taken == ids.len() {
                n += 1;
                written += 1;
            } else {
                // Only the `}` of a repeat is ever refused.
                refused += 1;
                m.rollback(taken).unwrap();
                let keep = text.len()
                    - ids[..taken]
                        .iter()
                        .map(|&t| vocab.token_bytes(t).unwrap().len())
                        .sum::<usize>();
                text.truncate(keep);
            }
        }
        assert!(m.try_advance_bytes(b"]") && m.is_accepting());
        text.push(b']');
        assert!(objs_ok(&text), "{}", String::from_utf8_lossy(&text));
    }
    eprintln!("{refused} refused, {written} written");
    assert!(
        refused >= 5 && written >= 10,
        "{refused} refused, {written} written"
    );
}

/// Free strings beside open objects (`type: [string, object]`): strings are not written in
/// one spelling here (they are not item strings of their own), so they are compared by
/// value too: `"A"` and `"\u0041"` are one item.
const MIXED: &str = r#"{"type":"array","uniqueItems":true,"items":{"anyOf":[{"type":"string"},{"type":"object","properties":{"k":{"type":"string"}},"required":["k"]}]}}"#;

#[test]
fn free_strings_beside_open_objects() {
    for schema in [
        r#"{"type":"array","uniqueItems":true,"items":{"type":["string","object"]}}"#,
        MIXED,
    ] {
        let g = g_bytes(schema);
        for ok in [
            r#"["a",{"k":"a"},"b","",{"k":"a","x":1},"{}","\"a\""]"#,
            r#"["a\"b","a\\b","ab"]"#,
        ] {
            assert!(common::accepts_text(&g, ok), "{schema}: {ok}");
        }
        for bad in [
            r#"["a","a"]"#,
            r#"["A","\u0041"]"#,
            r#"["/","\/"]"#,
            r#"["é","\u00e9"]"#,
            r#"[{"k":"a"},"b",{"k":"a"}]"#,
            r#"[{"k":"a","x":1},{"x":1.0,"k":"a"}]"#,
        ] {
            assert!(!common::accepts_text(&g, bad), "{schema}: {bad}");
        }
    }
}

/// Independent check for [`MIXED`]: strings and objects with a string `k`, no two equal.
fn mixed_ok(text: &[u8]) -> bool {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(text) else {
        return false;
    };
    let shape = items
        .iter()
        .all(|it| it.is_string() || it.get("k").is_some_and(Value::is_string));
    shape && all_distinct(&items)
}

/// Llama-3 random walks on [`MIXED`] among a few short pieces (so that strings repeat,
/// also through `\u` escapes): masks against the byte-by-byte reference, planned closes
/// validated independently.
#[test]
fn free_strings_beside_open_objects_masks_match_the_byte_reference() {
    let Some(tok) = common::llama3() else { return };
    let g = llama3_grammar(MIXED).unwrap();
    let pieces = one_token_pieces(
        tok,
        &[
            "\"", "a", "\",\"", "\",", "\\u", "004", "1", "{\"", "k", "\":\"", "\"}", "},",
        ],
    );
    assert!(pieces.len() >= 9, "{}", pieces.len());
    let prefer = |b: &[u8]| pieces.iter().any(|p| p == b);
    let start = |w: usize| match w % 2 {
        0 => b"[".to_vec(),
        _ => br#"["a","A",{"k":"a"},"#.to_vec(),
    };
    common::random_walks(&g, 31, 6, 30, &start, &prefer, 0.9, &mixed_ok);
}

/// The pieces that are one token each: the bytes the random walks below prefer.
fn one_token_pieces(tok: &common::Tok, pieces: &[&str]) -> Vec<Vec<u8>> {
    pieces
        .iter()
        .filter(|p| tok.tokenize(p).len() == 1)
        .map(|p| p.as_bytes().to_vec())
        .collect()
}
