//! `uniqueItems` on arrays whose items may run out of new values part-way: closed objects
//! (`additionalProperties: false`) of free strings, `enum`s and booleans, strings beside
//! them. Repeats are refused at the byte that closes them, and so is every prefix whose
//! completions are all earlier items (a search decides), in the matcher, the masks and the
//! planned close alike; checked against an independent comparison of serde_json values.
//! Open objects and free strings are in `json_unique_objects.rs` and `json_unique.rs`.

mod common;

use common::{g_bytes, llama3_grammar};
use serde_json::Value;
use sglrs_grammar::Matcher;

/// Closed objects over two two-valued `enum`s: four items in all, so prefixes get used up.
const PAIRS: &str = r#"{"type":"array","uniqueItems":true,"items":{"type":"object","additionalProperties":false,"required":["name","kind"],"properties":{"name":{"enum":["x","y"]},"kind":{"enum":["a","b"]}}}}"#;

/// Closed objects with a required free string and an optional one (Artifact Hub's
/// `ignore`, Swagger's `tags`): once the last free string is closed, the object may only
/// end, which may be a repeat.
const NAMED: &str = r#"{"type":"array","uniqueItems":true,"items":{"type":"object","additionalProperties":false,"required":["name"],"properties":{"name":{"type":"string"},"version":{"type":"string"},"optional":{"type":"boolean"}}}}"#;

/// Free strings beside closed objects (Compose's `volumes`, AdonisJS's `preloads`).
const MIXED: &str = r#"{"type":"array","uniqueItems":true,"items":{"oneOf":[{"type":"string"},{"type":"object","additionalProperties":false,"required":["file"],"properties":{"file":{"type":"string"},"optional":{"type":"boolean"}}}]}}"#;

/// A small set of numbers, literals and short strings.
const SMALL: &str = r#"{"type":"array","uniqueItems":true,"items":{"anyOf":[{"type":"integer","minimum":0,"maximum":20},{"type":["boolean","null"]},{"type":"string","pattern":"^a?$"}]}}"#;

fn small_ok(text: &[u8]) -> bool {
    distinct_items(text, &|v| {
        v.as_u64().is_some_and(|n| n <= 20)
            || v.is_boolean()
            || v.is_null()
            || v.as_str().is_some_and(|s| s.is_empty() || s == "a")
    })
}

#[test]
fn closed_object_items_refuse_repeats_and_dead_ends() {
    let g = g_bytes(PAIRS);
    for ok in [
        "[]",
        r#"[{"name":"x","kind":"a"}]"#,
        r#"[{"name":"x","kind":"a"},{"name":"x","kind":"b"},{"kind":"a","name":"y"},{"name":"y","kind":"b"}]"#,
    ] {
        assert!(common::accepts_text(&g, ok), "{ok}");
    }
    for bad in [
        r#"[{"name":"x","kind":"a"},{"name":"x","kind":"a"}]"#,
        r#"[{"name":"x","kind":"a"},{"kind":"a","name":"x"}]"#,
        r#"[{"name":"x","kind":"a"},{"name":"y","kind":"a"},{"name":"x","kind":"a"}]"#,
    ] {
        assert!(!common::accepts_text(&g, bad), "{bad}");
    }
    // Both "x" items written: an item that starts with "x" can only repeat, so the `x` is
    // refused already (in either key order), and "y" is not.
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"[{"name":"x","kind":"a"},{"kind":"b","name":"x"},{"name":""#));
    assert!(!m.clone().try_advance_bytes(b"x"));
    assert!(m.clone().try_advance_bytes(b"y"));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"[{"name":"x","kind":"a"},{"name":"y","kind":"a"},{"kind":""#));
    assert!(!m.clone().try_advance_bytes(b"a"));
    assert!(m.clone().try_advance_bytes(b"b"));
    // The same in schema order, as the server generates.
    let g2 = common::compile_bytes_with(
        &serde_json::from_str(PAIRS).unwrap(),
        &common::schema_order(),
    )
    .unwrap();
    let mut m = Matcher::new(g2.clone());
    assert!(m.try_advance_bytes(br#"[{"name":"x","kind":"a"},{"name":"x","kind":"b"},{"name":""#));
    assert!(!m.clone().try_advance_bytes(b"x"));
    assert!(m.try_advance_bytes(br#"y","kind":"b"}"#));
    assert!(!common::accepts_text(
        &g2,
        r#"[{"name":"y","kind":"b"},{"name":"y","kind":"b"}]"#
    ));
    // All four written: no other item can start.
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(
        br#"[{"name":"x","kind":"a"},{"name":"x","kind":"b"},{"name":"y","kind":"a"},{"name":"y","kind":"b"}"#
    ));
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(m.try_advance_bytes(b"]") && m.is_accepting());
}

#[test]
fn closed_objects_with_free_strings_end_new() {
    let g = g_bytes(NAMED);
    assert!(common::accepts_text(
        &g,
        r#"[{"name":"a"},{"name":"a","version":"1"},{"name":"a","optional":true},{"name":"b"}]"#
    ));
    assert!(!common::accepts_text(&g, r#"[{"name":"a"},{"name":"a"}]"#));
    assert!(!common::accepts_text(
        &g,
        r#"[{"name":"a","version":"1"},{"name":"\u0061","version":"1"}]"#
    ));
    // After `"version":"1` the string may go on; closing it leaves `}` or `,"optional"`.
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(
        br#"[{"name":"a","version":"1","optional":true},{"name":"a","version":"1","optional":false},{"name":"a","version":"1"}"#
    ));
    assert!(m.is_accepting() || m.clone().try_advance_bytes(b"]"));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(
        br#"[{"name":"a","version":"1"},{"name":"a","version":"1","optional":true},{"name":"a","version":"1","optional":false},{"name":"a","version":"1"#
    ));
    // Every completion after the closing quote repeats (in schema order or any order).
    assert!(!m.clone().try_advance_bytes(b"\""));
    assert!(m.clone().try_advance_bytes(b"2\"}"));
    // The planned close writes a new item.
    let close = m.closing_bytes();
    let mut c = m.clone();
    assert!(c.try_advance_bytes(&close) && c.is_accepting(), "{close:?}");
}

#[test]
fn strings_beside_closed_objects() {
    let g = g_bytes(MIXED);
    assert!(common::accepts_text(
        &g,
        r#"["a",{"file":"a"},{"file":"a","optional":true},"b"]"#
    ));
    assert!(!common::accepts_text(&g, r#"["a","b","a"]"#));
    assert!(!common::accepts_text(&g, r#"["a","\u0061"]"#));
    assert!(!common::accepts_text(
        &g,
        r#"[{"file":"a","optional":true},{"optional":true,"file":"a"}]"#
    ));
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(
        br#"[{"file":"a"},{"file":"a","optional":true},{"file":"a","optional":false},{"file":"a"#
    ));
    assert!(!m.clone().try_advance_bytes(b"\""));
}

/// Items of the kinds the other arrays leave out: closed objects, a capped or patterned
/// set of names, bounded strings beside objects, numbers, literals and `null` beside
/// others, listed values in several spellings, any value at all.
#[test]
fn items_of_every_other_kind_compare_as_values() {
    for (schema, ok, bad) in [
        (
            r#"{"type":"array","uniqueItems":true}"#,
            r#"[1,"1",[1],{"a":1},true,null,false,1.5,1e1,1.01]"#,
            r#"[1,"a",1.0]"#,
        ),
        (
            r#"{"type":"array","items":{"type":"object","maxProperties":1},"uniqueItems":true}"#,
            r#"[{},{"a":1},{"a":2},{"b":1}]"#,
            r#"[{"a":1},{"a":1.0}]"#,
        ),
        (
            r#"{"type":"array","items":{"type":"object","patternProperties":{"^x":{"type":"integer"}},"additionalProperties":false},"uniqueItems":true}"#,
            r#"[{"x":1},{"xx":1},{"x":1,"xx":1}]"#,
            r#"[{"x":1,"xy":2},{"xy":2,"x":1}]"#,
        ),
        (
            r#"{"type":"array","items":{"type":["object","string"],"maxLength":3},"uniqueItems":true}"#,
            r#"["abc",{"a":"abc"},"ab"]"#,
            r#"["abc","abc"]"#,
        ),
        (
            r#"{"type":"array","items":{"type":["object","number"]},"uniqueItems":true}"#,
            r#"[1,{},2,{"a":1},1.5]"#,
            r#"[1,{},10e-1]"#,
        ),
        (
            r#"{"type":"array","items":{"type":["string","null"],"maxLength":3},"uniqueItems":true}"#,
            r#"["a",null,"b"]"#,
            r#"[null,"a",null]"#,
        ),
        (
            r#"{"type":"array","items":{"type":"integer","enum":[0,1,2,3,4,5,6,7,8,9]},"uniqueItems":true}"#,
            r#"[0,1,2,9]"#,
            r#"[2,1,2]"#,
        ),
        (
            r#"{"type":"array","items":{"enum":["a\"b","c","d","e","f","g","h","i","j"]},"uniqueItems":true}"#,
            r#"["a\"b","c"]"#,
            r#"["a\"b","a\u0022b"]"#,
        ),
        (
            r#"{"type":"array","items":{"type":["boolean","null"]},"uniqueItems":true}"#,
            r#"[true,null,false]"#,
            r#"[true,false,true]"#,
        ),
    ] {
        let g = g_bytes(schema);
        assert!(common::accepts_text(&g, ok), "{schema}: {ok}");
        assert!(!common::accepts_text(&g, bad), "{schema}: {bad}");
    }
    // Bytes that lead the automaton to one configuration still write different values:
    // after an item `1`, `1e` and `1.` can end as `1e1` and `1.1` (byte by byte: each prefix
    // is checked).
    let g = g_bytes(r#"{"type":"array","uniqueItems":true}"#);
    for p in ["[1,1e", "[1,1.", "[1,1e+", "[10,1e"] {
        let mut m = Matcher::new(g.clone());
        assert!(p.bytes().all(|b| m.try_advance_bytes(&[b])), "{p}");
    }
    // Three values in all: after them no other item can start, and a number that can only
    // end as an earlier one is refused at the byte after it.
    let g = g_bytes(r#"{"type":"array","items":{"enum":[1,12,null]},"uniqueItems":true}"#);
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[12,null,1"));
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(m.try_advance_bytes(b"]") && m.is_accepting());
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(b"[1,null,1"));
    assert!(!m.clone().try_advance_bytes(b"]"));
    assert!(m.try_advance_bytes(b"2]") && m.is_accepting());
    let mut m = Matcher::new(g);
    assert!(m.try_advance_bytes(b"[null,"));
    assert!(!m.clone().try_advance_bytes(b"n"));
}

/// An array whose items `shape` accepts, no two equal.
fn distinct_items(text: &[u8], shape: &dyn Fn(&Value) -> bool) -> bool {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(text) else {
        return false;
    };
    items.iter().all(shape)
        && items
            .iter()
            .enumerate()
            .all(|(i, x)| items[..i].iter().all(|y| !common::json_eq(x, y)))
}

/// Exactly the keys `required`, plus any of `optional`, each value checked.
fn closed(
    v: &Value,
    required: &[&str],
    optional: &[&str],
    value_ok: &dyn Fn(&str, &Value) -> bool,
) -> bool {
    let Some(o) = v.as_object() else { return false };
    required.iter().all(|k| o.contains_key(*k))
        && o.iter().all(|(k, x)| {
            (required.contains(&k.as_str()) || optional.contains(&k.as_str())) && value_ok(k, x)
        })
}

fn pairs_ok(text: &[u8]) -> bool {
    distinct_items(text, &|v| {
        closed(v, &["name", "kind"], &[], &|k, x| match k {
            "name" => x == "x" || x == "y",
            _ => x == "a" || x == "b",
        })
    })
}

fn named_ok(text: &[u8]) -> bool {
    distinct_items(text, &|v| {
        closed(v, &["name"], &["version", "optional"], &|k, x| match k {
            "optional" => x.is_boolean(),
            _ => x.is_string(),
        })
    })
}

fn mixed_ok(text: &[u8]) -> bool {
    distinct_items(text, &|v| {
        v.is_string()
            || closed(v, &["file"], &["optional"], &|k, x| match k {
                "optional" => x.is_boolean(),
                _ => x.is_string(),
            })
    })
}

/// Random walks over Llama-3 drawing mostly among a few short tokens, so that items repeat
/// and run out often: every mask against the byte-by-byte reference (which refuses dead
/// ends), every planned close validated independently.
#[test]
fn closed_item_masks_match_the_byte_reference_on_random_walks() {
    let Some(tok) = common::llama3() else { return };
    let pieces = |ps: &[&str]| -> Vec<Vec<u8>> {
        ps.iter()
            .filter(|p| tok.tokenize(p).len() == 1)
            .map(|p| p.as_bytes().to_vec())
            .collect()
    };
    let g = llama3_grammar(PAIRS).unwrap();
    let few = pieces(&[
        "{\"", "name", "kind", "\":\"", "x", "y", "a", "b", "\",\"", "\"}", "\"},{\"", ",",
    ]);
    assert!(few.len() >= 8, "{}", few.len());
    let prefer = |b: &[u8]| few.iter().any(|p| p == b);
    common::random_walks(&g, 31, 3, 25, &|_| b"[".to_vec(), &prefer, 0.9, &pairs_ok);

    let g = llama3_grammar(NAMED).unwrap();
    let few = pieces(&[
        "{\"", "name", "version", "optional", "\":\"", "\":", "a", "1", "true", "false", "\",\"",
        "\"}", "\"},{\"", "},{\"", ",\"", "}",
    ]);
    let prefer = |b: &[u8]| few.iter().any(|p| p == b);
    let start = |w: usize| {
        match w % 2 {
        0 => b"[".to_vec(),
        _ => br#"[{"name":"a","version":"1"},{"name":"a","version":"1","optional":true},{"name":"a"},"#.to_vec(),
    }
    };
    common::random_walks(&g, 32, 3, 25, &start, &prefer, 0.9, &named_ok);

    // Few values of mixed kinds: prefixes and whole sets get used up.
    let g = llama3_grammar(SMALL).unwrap();
    let few = pieces(&[
        "1", "12", "2", "null", "true", "false", ",", "]", "\"a", "\"", "\",", "1,", "2,",
    ]);
    let prefer = |b: &[u8]| few.iter().any(|p| p == b);
    common::random_walks(&g, 34, 3, 25, &|_| b"[".to_vec(), &prefer, 0.9, &small_ok);

    let g = llama3_grammar(MIXED).unwrap();
    let few = pieces(&[
        "{\"", "file", "optional", "\":\"", "\":", "a", "b", "true", "\",\"", "\"}", "\"},{\"",
        "\",\"", ",\"", "},", "\",", "}",
    ]);
    let prefer = |b: &[u8]| few.iter().any(|p| p == b);
    common::random_walks(&g, 33, 3, 25, &|_| b"[".to_vec(), &prefer, 0.9, &mixed_ok);
}
