//! `uniqueItems` on arrays of free strings, bounded strings and integers: repeats are
//! refused exactly, by value, in the innermost array only, beside other readings of the same
//! text (`anyOf`), and masks, closing bytes and rollback agree with it. Checked against an independent validator
//! (serde_json + a uniqueness check) on random walks with the Llama-3 vocabulary.

mod common;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use serde_json::Value;
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

const TAGS: &str = r#"{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"},"uniqueItems":true},"n":{"type":"integer"}},"required":["tags"],"additionalProperties":false}"#;

use common::{g_bytes, llama3_grammar};

#[test]
fn repeated_string_items_are_refused() {
    let g = g_bytes(r#"{"type":"array","items":{"type":"string"},"uniqueItems":true}"#);
    for ok in [
        r#"[]"#,
        r#"["a"]"#,
        r#"["a","b","ab","ba",""]"#,
        r#"["é","e"]"#,
        // Escapes in their canonical spelling (serde_json's).
        r#"["a\"b","a\\b","\n","\t","\u0001","\u001f","\u000b"]"#,
    ] {
        assert!(common::accepts_text(&g, ok), "{ok}");
    }
    // Items have one spelling each (so equal texts are equal values): other spellings of a
    // character are refused even when nothing repeats — stricter, never looser.
    for other in [
        r#"["\/"]"#,
        r#"["\u0041"]"#,
        r#"["\u000a"]"#,
        r#"["\u001F"]"#,
    ] {
        assert!(!common::accepts_text(&g, other), "{other}");
    }
    for bad in [
        r#"["a","a"]"#,
        r#"["a","b","a"]"#,
        r#"["","x",""]"#,
        r#"["é","é"]"#,
        // One value, two spellings.
        r#"["A","\u0041"]"#,
        r#"["/","\/"]"#,
        r#"["\u00e9","é"]"#,
    ] {
        assert!(!common::accepts_text(&g, bad), "{bad}");
    }
    // minLength and maxItems / minItems still hold.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"string","minLength":2},"uniqueItems":true,"minItems":2,"maxItems":3}"#,
    );
    assert!(common::accepts_text(&g, r#"["ab","abc"]"#));
    assert!(!common::accepts_text(&g, r#"["ab"]"#));
    assert!(!common::accepts_text(&g, r#"["ab","a"]"#));
    assert!(!common::accepts_text(&g, r#"["ab","cd","ef","gh"]"#));
    assert!(!common::accepts_text(&g, r#"["ab","cd","ab"]"#));
}

#[test]
fn uniqueness_is_per_array() {
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"object","properties":{"t":{"type":"array","items":{"type":"string"},"uniqueItems":true}},"additionalProperties":false}}"#,
    );
    assert!(common::accepts_text(
        &g,
        r#"[{"t":["a","b"]},{"t":["a","b"]}]"#
    ));
    assert!(!common::accepts_text(
        &g,
        r#"[{"t":["a","b"]},{"t":["b","b"]}]"#
    ));
}

#[test]
fn other_readings_keep_a_repeat() {
    // Repeats are fine for short strings (second branch), not for long ones.
    let g = g_bytes(
        r#"{"anyOf":[{"type":"array","items":{"type":"string"},"uniqueItems":true},{"type":"array","items":{"type":"string","maxLength":3}}]}"#,
    );
    assert!(common::accepts_text(&g, r#"["ab","ab"]"#));
    assert!(common::accepts_text(&g, r#"["abcd","abce"]"#));
    assert!(!common::accepts_text(&g, r#"["abcd","abcd"]"#));
}

/// A finite item set might not reach `minItems` above 1: refused.
#[test]
fn items_that_might_not_reach_min_items_stay_refused() {
    for s in [
        r#"{"type":"array","items":{"type":"string","maxLength":3},"uniqueItems":true,"minItems":2}"#,
        r#"{"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"uniqueItems":true,"minItems":2}"#,
        r#"{"type":"array","items":{"type":"number","minimum":0,"maximum":1},"uniqueItems":true,"minItems":2}"#,
        r#"{"type":"array","items":{"type":"object","additionalProperties":false},"uniqueItems":true,"minItems":2}"#,
    ] {
        let e = common::compile_bytes(&serde_json::from_str(s).unwrap())
            .err()
            .unwrap_or_else(|| panic!("{s} compiled"));
        assert!(e.to_string().contains("uniqueItems"), "{s}: {e}");
    }
}

fn mask_bit(mask: &[u32], t: u32) -> bool {
    mask[(t / 32) as usize] >> (t % 32) & 1 == 1
}

/// Independent check: every `tags` array of the value has distinct strings.
fn tags_unique(v: &Value) -> bool {
    let Some(tags) = v.get("tags").and_then(|t| t.as_array()) else {
        return false;
    };
    let mut seen = std::collections::HashSet::new();
    tags.iter()
        .all(|t| t.as_str().is_some_and(|s| seen.insert(s.to_string())))
}

#[test]
fn masks_refuse_exactly_the_tokens_that_close_a_repeat() {
    let Some(tok) = common::llama3() else { return };
    let g =
        CompiledGrammar::json_schema(TAGS, tok.vocab.clone(), &CompileOptions::default()).unwrap();
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"{"tags":["ab","a"#));
    let mut mask = vec![0u32; tok.vocab.mask_words()];
    m.fill_mask(&mut mask).unwrap();
    let id = |s: &str| {
        let ids = tok.tokenize(s);
        assert_eq!(ids.len(), 1, "{s} is one token");
        ids[0]
    };
    // "a" itself is new: closing it is fine; "ab" would repeat.
    assert!(mask_bit(&mask, id("\",")));
    assert!(mask_bit(&mask, id("b")));
    assert!(m.clone().try_advance_bytes(b"b"));
    let mut m2 = m.clone();
    assert!(m2.try_advance_bytes(b"b"));
    m2.fill_mask(&mut mask).unwrap();
    for t in ["\"", "\",", "\"]"] {
        assert!(!mask_bit(&mask, id(t)), "{t} after a repeat");
        assert!(!m2.is_allowed(id(t)));
    }
    assert!(mask_bit(&mask, id("c")));
    // The shortest valid close avoids the repeat, and rollback forgets the text.
    let close = m2.closing_bytes();
    let mut m3 = m2.clone();
    assert!(
        m3.try_advance_bytes(&close) && m3.is_accepting(),
        "{close:?}"
    );
    m2.rollback(1).unwrap();
    assert!(!m2.clone().try_advance_bytes(br#"","ab"]}"#));
    assert!(m2.try_advance_bytes(br#"","b"]}"#));
    assert!(m2.is_accepting());
}

#[test]
fn random_walks_stay_valid_and_masks_match_the_byte_reference() {
    let Some(tok) = common::llama3() else { return };
    let vocab = &tok.vocab;
    let g = CompiledGrammar::json_schema(TAGS, vocab.clone(), &CompileOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut mask = vec![0u32; vocab.mask_words()];
    // Few distinct short strings, so that repeats come up often.
    let pieces: Vec<u32> = ["\"a", "\"b", "\"", ",", "a", "b", "\",\""]
        .iter()
        .filter_map(|p| {
            let ids = tok.tokenize(p);
            (ids.len() == 1).then(|| ids[0])
        })
        .collect();
    assert!(pieces.len() >= 5);
    for _ in 0..8 {
        let mut m = Matcher::new(g.clone());
        let mut text: Vec<u8> = br#"{"tags":["#.to_vec();
        assert!(m.try_advance_bytes(&text));
        for _ in 0..30 {
            // The mask against the byte-by-byte reference, for every token.
            let allowed: Vec<u32> = common::check_mask(vocab, &m, &mut mask, &text)
                .into_iter()
                .filter(|t| !vocab.eos().contains(t))
                .collect();
            // Every allowed token leaves a completable text: close it and validate it
            // independently.
            let close = m.closing_bytes();
            let mut c = m.clone();
            assert!(c.try_advance_bytes(&close) && c.is_accepting());
            let full = [text.as_slice(), close.as_slice()].concat();
            let v: Value = serde_json::from_slice(&full).expect("valid JSON");
            assert!(tags_unique(&v), "{}", String::from_utf8_lossy(&full));
            if allowed.is_empty() {
                break;
            }
            // Prefer the small pieces, so that items repeat.
            let small: Vec<u32> = pieces
                .iter()
                .copied()
                .filter(|p| allowed.contains(p))
                .collect();
            let next = if !small.is_empty() && rng.random_bool(0.9) {
                small[rng.random_range(0..small.len())]
            } else {
                allowed[rng.random_range(0..allowed.len())]
            };
            m.accept_token(next).unwrap();
            text.extend_from_slice(vocab.token_bytes(next).unwrap());
        }
    }
}

/// Bounded string items (more than 8 `enum` values, `maxLength`, `pattern`, formats): repeats
/// are refused, and so is a prefix that can only end as an earlier item or a new item where
/// none is left, while the text is followed byte by byte.
#[test]
fn bounded_string_items_refuse_repeats_and_dead_ends() {
    let methods = r#"{"type":"array","items":{"enum":["GET","POST","HEAD","PUT","PATCH","TRACE","DELETE","OPTIONS","CONNECT"]},"uniqueItems":true,"minItems":1}"#;
    let g = g_bytes(methods);
    assert!(common::accepts_text(&g, r#"["GET"]"#));
    assert!(common::accepts_text(&g, r#"["GET","POST","PUT","PATCH"]"#));
    assert!(!common::accepts_text(&g, r#"[]"#));
    assert!(!common::accepts_text(&g, r#"["GET","POST","GET"]"#));
    assert!(!common::accepts_text(&g, r#"["PUT","PATCH","PUT"]"#));
    // "G" can only become "GET", which is taken: refused at the "G" already.
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"["GET","P"#));
    assert!(!m.clone().try_advance_bytes(b"\""));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"["GET",""#));
    assert!(!m.clone().try_advance_bytes(b"G"));
    assert!(m.clone().try_advance_bytes(b"P"));

    // Two values: once both are used, no new item can start.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"string","pattern":"^[ab]$"},"uniqueItems":true}"#,
    );
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"["a","b""#));
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(m.try_advance_bytes(b"]") && m.is_accepting());

    // maxLength: "ab" written, "a" may still end new ("a" itself), but "ab" is taken.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"string","maxLength":2,"pattern":"^[ab]+$"},"uniqueItems":true}"#,
    );
    assert!(common::accepts_text(&g, r#"["ab","a","b","ba","aa","bb"]"#));
    assert!(!common::accepts_text(&g, r#"["ab","a","ab"]"#));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"["ab","a","b","aa","#));
    // Left: "ba" and "bb"; "a…" is used up.
    assert!(!m.clone().try_advance_bytes(br#""a"#));
    assert!(m.clone().try_advance_bytes(br#""b"#));
    assert!(m.try_advance_bytes(br#""bb","ba""#));
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(m.try_advance_bytes(b"]") && m.is_accepting());

    // Formats and patterns with infinitely many values.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"string","pattern":"^[A-Za-z_][A-Za-z0-9_]*$"},"uniqueItems":true}"#,
    );
    assert!(common::accepts_text(&g, r#"["a","a1","_"]"#));
    assert!(!common::accepts_text(&g, r#"["a1","a","a1"]"#));
}

/// Independent check for the bounded-items schema below: every item is one of `VALUES`,
/// and no value repeats.
fn bounded_ok(v: &Value) -> bool {
    let Some(items) = v.as_array() else {
        return false;
    };
    let mut seen = std::collections::HashSet::new();
    !items.is_empty()
        && items.iter().all(|t| {
            t.as_str()
                .is_some_and(|s| VALUES.contains(&s) && seen.insert(s.to_string()))
        })
}

const VALUES: [&str; 9] = ["a", "ab", "abc", "b", "ba", "c", "ca", "cab", "d"];

/// Masks over the Llama-3 vocabulary agree with following each token byte by byte (which
/// refuses dead ends too), and from every text a walk reaches, the planned close gives a
/// valid document. The values share prefixes, so prefixes get used up often.
#[test]
fn bounded_items_masks_match_the_byte_reference_on_random_walks() {
    let values: Vec<String> = VALUES.iter().map(|v| format!("\"{v}\"")).collect();
    let schema = format!(
        r#"{{"type":"array","items":{{"enum":[{}]}},"uniqueItems":true,"minItems":1}}"#,
        values.join(",")
    );
    let Some(g) = llama3_grammar(&schema) else {
        return;
    };
    let ok = |t: &[u8]| serde_json::from_slice(t).is_ok_and(|v: Value| bounded_ok(&v));
    check_random_walks(&g, 11, 12, 40, usize::MAX, &ok);
}

/// Integer items (pydantic's `set[int]`, zod's `z.set(z.number().int())`): an item ends at
/// the byte after its last digit, and that byte is refused after a repeat; a bounded set
/// refuses a prefix that can only end as an earlier item, or a `,` when no value is left.
#[test]
fn integer_items_refuse_repeats_and_dead_ends() {
    let g = g_bytes(r#"{"type":"array","items":{"type":"integer"},"uniqueItems":true}"#);
    for ok in [
        "[]",
        "[1]",
        "[1,2,3]",
        "[1,12,123,-1,-12,0]",
        "[12,1]",
        "[100,10,1000]",
    ] {
        assert!(common::accepts_text(&g, ok), "{ok}");
    }
    for bad in [
        "[1,1]",
        "[12,3,12]",
        "[-4,-4]",
        "[0,0]",
        "[10,1,10]",
        "[-0]",
        "[1.0]",
    ] {
        assert!(!common::accepts_text(&g, bad), "{bad}");
    }
    // "12" written again: it may go on ("120") but not end.
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[12,12"));
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(!m.clone().try_advance_bytes(b"]"));
    assert!(m.try_advance_bytes(b"0]") && m.is_accepting());

    // Unbounded on a side: infinitely many values, so minItems above 1 is fine.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"integer","minimum":1},"uniqueItems":true,"minItems":2,"maxItems":3}"#,
    );
    assert!(common::accepts_text(&g, "[5,6]"));
    assert!(common::accepts_text(&g, "[1,10,100]"));
    assert!(!common::accepts_text(&g, "[5]"));
    assert!(!common::accepts_text(&g, "[5,5]"));
    assert!(!common::accepts_text(&g, "[0,5]"));
    assert!(!common::accepts_text(&g, "[1,2,3,4]"));

    // Bounded: 1..=3. After three items no new one can start.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"integer","exclusiveMinimum":0,"maximum":3},"uniqueItems":true}"#,
    );
    assert!(common::accepts_text(&g, "[3,1,2]"));
    assert!(!common::accepts_text(&g, "[3,1,3]"));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[2,3,1"));
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(m.try_advance_bytes(b"]") && m.is_accepting());

    // 0..=12: "1" may end new or become 10, 11 or 12; once all four are used "1" is refused.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"integer","minimum":0,"maximum":12},"uniqueItems":true}"#,
    );
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[1,10,11,"));
    assert!(m.clone().try_advance_bytes(b"1"));
    assert!(m.try_advance_bytes(b"12,"));
    assert!(!m.clone().try_advance_bytes(b"1"));
    assert!(m.try_advance_bytes(b"2]") && m.is_accepting());

    // multipleOf and negatives: {-10, -5, 0, 5, 10}.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"integer","minimum":-10,"maximum":10,"multipleOf":5},"uniqueItems":true}"#,
    );
    assert!(common::accepts_text(&g, "[-5,5,-10,10,0]"));
    assert!(!common::accepts_text(&g, "[-5,5,-5]"));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[-5,-10,"));
    assert!(!m.clone().try_advance_bytes(b"-"));
    assert!(m.try_advance_bytes(b"5"));

    // Per array, and beside strings in other arrays of the same text.
    let g = g_bytes(
        r#"{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"},"uniqueItems":true},"b":{"type":"array","items":{"type":"integer"},"uniqueItems":true},"s":{"type":"array","items":{"type":"string"},"uniqueItems":true}},"additionalProperties":false}"#,
    );
    assert!(common::accepts_text(
        &g,
        r#"{"a":[1,2],"b":[1,2],"s":["1","2"]}"#
    ));
    assert!(!common::accepts_text(&g, r#"{"a":[1,2],"b":[2,2]}"#));
    // Another reading of the text keeps a repeat.
    let g = g_bytes(
        r#"{"anyOf":[{"type":"array","items":{"type":"integer"},"uniqueItems":true},{"type":"array","items":{"type":"integer","maximum":5}}]}"#,
    );
    assert!(common::accepts_text(&g, "[3,3]"));
    assert!(common::accepts_text(&g, "[30,31]"));
    assert!(!common::accepts_text(&g, "[30,30]"));
}

/// The flexible policy: whitespace after a number ends it as `,` and `]` do.
#[test]
fn integer_items_under_the_flexible_policy() {
    let opts = CompileOptions {
        whitespace: sglrs_grammar::Whitespace::Flexible,
        ..CompileOptions::default()
    };
    let g = CompiledGrammar::json_schema(
        r#"{"type":"array","items":{"type":"integer","minimum":0,"maximum":2},"uniqueItems":true}"#,
        common::byte_vocab(),
        &opts,
    )
    .unwrap();
    assert!(common::accepts_text(&g, "[ 0, 2 ,1 ]"));
    assert!(!common::accepts_text(&g, "[ 0, 2 ,0 ]"));
    assert!(!common::accepts_text(&g, "[1 ,1]"));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[ 0, 1"));
    assert!(m.clone().try_advance_bytes(b" , 2"));
    assert!(!m.clone().try_advance_bytes(b" , 0"));
    assert!(m.try_advance_bytes(b" , 2 "));
    // All three used: no `,`.
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(m.try_advance_bytes(b"]") && m.is_accepting());
}

const INT_MAX: i64 = 12;

/// Independent check for the integer schema below: 1..=12 distinct integers in 0..=12.
fn ints_ok(v: &Value) -> bool {
    let Some(items) = v.as_array() else {
        return false;
    };
    let mut seen = std::collections::HashSet::new();
    !items.is_empty()
        && items.iter().all(|t| {
            t.as_i64()
                .is_some_and(|x| (0..=INT_MAX).contains(&x) && seen.insert(x))
        })
}

/// Masks over the Llama-3 vocabulary (whose number tokens run up to three digits, and
/// tokens such as `],` or `,"`) agree with following each token byte by byte, and every
/// planned close gives a valid document. "1" prefixes four values, so items run out often.
#[test]
fn integer_items_masks_match_the_byte_reference_on_random_walks() {
    let schema = format!(
        r#"{{"type":"array","items":{{"type":"integer","minimum":0,"maximum":{INT_MAX}}},"uniqueItems":true,"minItems":1}}"#
    );
    let Some(g) = llama3_grammar(&schema) else {
        return;
    };
    let ok = |t: &[u8]| serde_json::from_slice(t).is_ok_and(|v: Value| ints_ok(&v));
    check_random_walks(&g, 12, 12, 40, usize::MAX, &ok);
}

/// Independent check for unbounded integer items: the text is `[`, integers in their one
/// spelling separated by `,`, `]`, and no integer twice (compared as text: each has one).
fn int_text_ok(text: &[u8]) -> bool {
    let Some(body) = text.strip_prefix(b"[").and_then(|t| t.strip_suffix(b"]")) else {
        return false;
    };
    if body.is_empty() {
        return true;
    }
    let mut seen = std::collections::HashSet::new();
    body.split(|&b| b == b',').all(|it| {
        let digits = it.strip_prefix(b"-").unwrap_or(it);
        !digits.is_empty()
            && digits.iter().all(u8::is_ascii_digit)
            && (digits == b"0" || digits[0] != b'0')
            && it != b"-0"
            && seen.insert(it.to_vec())
    })
}

/// Unbounded integers over Llama-3, whose number tokens (up to three digits) extend an item
/// or start one: digits that keep the item a prefix of no earlier item are not followed one
/// by one (`refine_mask`), and the masks must still match the byte-by-byte reference.
#[test]
fn unbounded_integer_items_masks_match_the_byte_reference_on_random_walks() {
    let Some(g) = llama3_grammar(
        r#"{"type":"array","items":{"type":"integer"},"uniqueItems":true,"maxItems":12}"#,
    ) else {
        return;
    };
    check_random_walks(&g, 13, 10, 30, 2, &int_text_ok);
}

/// Number items (zod's `z.set(z.number())`): written in one spelling per value (no exponent,
/// no trailing zero after the point, no `.0`, no `-0`) so that equal texts are equal values
/// — stricter than the schema, never looser — then handled as integer items are.
#[test]
fn number_items_take_one_spelling_and_refuse_repeats() {
    let g = g_bytes(r#"{"type":"array","items":{"type":"number"},"uniqueItems":true}"#);
    for ok in [
        "[]",
        "[1.5,2,-0.25,3.125]",
        "[0,-1,1,0.5,-0.5]",
        "[10,1,1.01,101]",
    ] {
        assert!(common::accepts_text(&g, ok), "{ok}");
    }
    for bad in ["[1.5,1.5]", "[2,3,2]", "[-0.25,-0.25]"] {
        assert!(!common::accepts_text(&g, bad), "{bad}");
    }
    // Other spellings are refused even alone (they would repeat `1` as another text).
    for other in [
        "[1.0]", "[1.50]", "[1e2]", "[-0]", "[-0.0]", "[0.0]", "[1E0]",
    ] {
        assert!(!common::accepts_text(&g, other), "{other}");
    }
    // "1.5" again may go on to "1.55" but not end.
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[1.5,1.5"));
    assert!(!m.clone().try_advance_bytes(b"]"));
    assert!(m.try_advance_bytes(b"5]") && m.is_accepting());

    // Bounds and a decimal multipleOf: 0, 0.5, 1 only.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"number","minimum":0,"maximum":1,"multipleOf":0.5},"uniqueItems":true}"#,
    );
    assert!(common::accepts_text(&g, "[0.5,0,1]"));
    assert!(!common::accepts_text(&g, "[0.5,0.50]"));
    assert!(!common::accepts_text(&g, "[1,0.5,1]"));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[1,0,0.5"));
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(m.try_advance_bytes(b"]") && m.is_accepting());
    // Unbounded on a side: any minItems.
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"number","exclusiveMinimum":0},"uniqueItems":true,"minItems":3}"#,
    );
    assert!(common::accepts_text(&g, "[0.1,0.2,3]"));
    assert!(!common::accepts_text(&g, "[0.1,0.2,0.1]"));
    assert!(!common::accepts_text(&g, "[0,0.2,3]"));
}

/// Independent check for the number schema below: `[`, canonical decimals in -2..=2
/// separated by `,`, `]`, at most 8, distinct (texts are canonical, so distinct texts are
/// distinct values).
fn num_text_ok(text: &[u8]) -> bool {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(text) else {
        return false;
    };
    let body = &text[1..text.len() - 1];
    let parts: Vec<&[u8]> = if body.is_empty() {
        Vec::new()
    } else {
        body.split(|&b| b == b',').collect()
    };
    let canonical = regex_lite(parts.iter().copied());
    let mut seen = std::collections::HashSet::new();
    items.len() == parts.len()
        && items.len() <= 8
        && canonical
        && items
            .iter()
            .all(|v| v.as_f64().is_some_and(|x| (-2.0..=2.0).contains(&x)))
        && parts.iter().all(|p| seen.insert(p.to_vec()))
}

/// Every text is a number in its shortest spelling (no exponent, no trailing fraction zero,
/// no `-0`, no leading zero).
fn regex_lite<'a>(mut parts: impl Iterator<Item = &'a [u8]>) -> bool {
    parts.all(|p| {
        let s = std::str::from_utf8(p).unwrap_or("");
        let unsigned = s.strip_prefix('-').unwrap_or(s);
        let (int, frac) = match unsigned.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (unsigned, None),
        };
        !int.is_empty()
            && int.bytes().all(|b| b.is_ascii_digit())
            && (int == "0" || !int.starts_with('0'))
            && frac.is_none_or(|f| {
                !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) && !f.ends_with('0')
            })
            && s != "-0"
    })
}

/// Masks over Llama-3 inside a unique array of bounded numbers match the byte-by-byte
/// reference, and every planned close is a valid document.
#[test]
fn number_items_masks_match_the_byte_reference_on_random_walks() {
    let Some(g) = llama3_grammar(
        r#"{"type":"array","items":{"type":"number","minimum":-2,"maximum":2},"uniqueItems":true,"maxItems":8}"#,
    ) else {
        return;
    };
    check_random_walks(&g, 14, 10, 30, 1, &num_text_ok);
}

/// [`common::random_walks`] from the start, drawing among the tokens of at most `short`
/// bytes with probability 0.7 (short items share prefixes).
fn check_random_walks(
    g: &Arc<CompiledGrammar>,
    seed: u64,
    walks: usize,
    steps: usize,
    short: usize,
    ok: &dyn Fn(&[u8]) -> bool,
) {
    let prefer = |b: &[u8]| b.len() <= short;
    common::random_walks(g, seed, walks, steps, &|_| Vec::new(), &prefer, 0.7, ok);
}

/// Tool calls after free text (`tool_choice: "auto"`): quotes and brackets in the text open
/// nothing, so repeats inside the call are still refused, and rolling back into the text
/// and writing the call again gives the same verdicts.
#[test]
fn free_text_before_tool_calls_does_not_confuse_uniqueness() {
    use sglrs_grammar::{Tag, TaggedSpec};
    let schema = r#"{"type":"object","properties":{"ids":{"type":"array","items":{"type":"integer"},"uniqueItems":true},"tags":{"type":"array","items":{"type":"string"},"uniqueItems":true}},"required":["ids","tags"]}"#;
    let spec = TaggedSpec {
        tags: vec![Tag {
            begin: "<tool_call>{\"name\":\"t\",\"arguments\":".into(),
            schema: schema.into(),
            end: "}</tool_call>".into(),
        }],
        open: String::new(),
        separator: String::new(),
        close: String::new(),
        min_calls: 1,
        max_calls: Some(1),
        text_until: Some("<tool_call>".into()),
    };
    let g =
        CompiledGrammar::tagged(&spec, common::byte_vocab(), &CompileOptions::default()).unwrap();
    let call =
        |args: &str| format!("<tool_call>{{\"name\":\"t\",\"arguments\":{args}}}</tool_call>");
    for pre in ["", "He said \"hi. ", "a [ b \" { ", "x\\\"[\"", "<tool ["] {
        for (args, ok) in [
            (r#"{"ids":[1,2],"tags":["a","b"]}"#, true),
            (r#"{"ids":[1,1],"tags":["a"]}"#, false),
            (r#"{"ids":[1],"tags":["a","a"]}"#, false),
        ] {
            let text = format!("{pre}{}", call(args));
            assert_eq!(common::accepts_text(&g, &text), ok, "{text}");
            // Byte by byte, then back into the call (or into the text) and again.
            let whole = call(args);
            for back in [4, 12, whole.len() + pre.len().min(2)] {
                let mut m = Matcher::new(g.clone());
                for b in pre.bytes() {
                    assert!(m.try_advance_bytes(&[b]), "{pre}");
                }
                let fed = whole
                    .bytes()
                    .take_while(|&b| m.try_advance_bytes(&[b]))
                    .count();
                let back = back.min(fed + pre.len());
                m.rollback(back).unwrap();
                let text = format!("{pre}{whole}");
                let start = pre.len() + fed - back;
                let all = text[start..].bytes().all(|b| m.try_advance_bytes(&[b]));
                assert_eq!(
                    all && m.is_accepting(),
                    ok,
                    "{text}, {back} bytes rolled back"
                );
            }
        }
    }
}

/// Items under a large regex (`format: uri-reference`, shared through a rule elsewhere) get
/// states of their own in a unique array, and free strings with an unknown `format` (an
/// annotation) are free strings: both enforced, where they were refused.
#[test]
fn large_regex_items_and_unknown_formats() {
    let g = g_bytes(
        r#"{"type":"array","items":{"type":"string","format":"uri-reference"},"uniqueItems":true}"#,
    );
    for ok in [r#"[]"#, r#"["https://a.org","../b","https://a.org/"]"#] {
        assert!(common::accepts_text(&g, ok), "{ok}");
    }
    for bad in [
        r#"["https://a.org","https://a.org"]"#,
        r#"["x","../b","x"]"#,
        r#"["a b"]"#,
    ] {
        assert!(!common::accepts_text(&g, bad), "{bad}");
    }
    let g =
        g_bytes(r#"{"type":"array","items":{"type":"string","format":"URI"},"uniqueItems":true}"#);
    assert!(common::accepts_text(&g, r#"["a b","a"]"#));
    assert!(!common::accepts_text(&g, r#"["a b","a b"]"#));
}
