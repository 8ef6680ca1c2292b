//! Objects with more declared properties than the any-order subset automaton takes (more
//! than 16, or past its state budget): a loop over the declared keys, whose repeats the
//! matcher refuses (`json/any_order.rs::key_loop`, `crate::unique`). Keys in any order, each
//! at most once, every required key before `}`; no key prefix that only earlier keys
//! complete; no `,` once every key of a closed object is written. Masks and the planned close
//! are checked against an independent validator on random walks.

mod common;

use common::{check_opts, compile_bytes_with, llama3, schema_order};
use serde_json::{json, Value};
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

/// 20 declared keys (18 integers `k00`…`k17`, `name` from an enum, `nation` a boolean), two
/// required, `additionalProperties` as given.
fn schema(additional: bool) -> Value {
    let mut props = serde_json::Map::new();
    for i in 0..18 {
        props.insert(format!("k{i:02}"), json!({"type": "integer"}));
    }
    props.insert("name".into(), json!({"enum": ["a", "b"]}));
    props.insert("nation".into(), json!({"type": "boolean"}));
    json!({
        "type": "object",
        "properties": props,
        "required": ["k03", "name"],
        "additionalProperties": additional,
    })
}

/// All 20 keys, in reverse schema order.
fn all_keys_reversed() -> String {
    let mut parts = vec![r#""nation":true"#.to_string(), r#""name":"b""#.to_string()];
    for i in (0..18).rev() {
        parts.push(format!(r#""k{i:02}":{i}"#));
    }
    format!("{{{}}}", parts.join(","))
}

fn accepts(g: &std::sync::Arc<CompiledGrammar>, text: &str) -> bool {
    common::accepts_text(g, text)
}

#[test]
fn many_keys_come_in_any_order_each_once() {
    let s = schema(false);
    let full = all_keys_reversed();
    let valid = [
        r#"{"name":"a","k03":1}"#,
        r#"{"k03":1,"name":"a"}"#,
        r#"{"k17":0,"nation":false,"k03":1,"k00":2,"name":"b","k09":3}"#,
        full.as_str(),
    ];
    let invalid = [
        // An optional key twice, a required key twice.
        r#"{"k00":1,"k03":2,"name":"a","k00":3}"#,
        r#"{"k03":1,"name":"a","k03":2}"#,
        r#"{"name":"a","name":"b","k03":1}"#,
        // A required key missing, an undeclared key, a value of the wrong type.
        r#"{"k00":1,"name":"a"}"#,
        r#"{"k03":1,"name":"a","other":1}"#,
        r#"{"k03":1,"name":"c"}"#,
        r#"{"k03":"1","name":"a"}"#,
    ];
    check_opts(&s, &CompileOptions::default(), &valid, &invalid);
    // In schema order the same object only takes its keys as listed.
    check_opts(&s, &schema_order(), &valid[1..2], &invalid);
    let g = compile_bytes_with(&s, &schema_order()).unwrap();
    assert!(!accepts(&g, valid[0]));
}

#[test]
fn a_closed_object_with_every_key_written_takes_no_comma() {
    let g = compile_bytes_with(&schema(false), &CompileOptions::default()).unwrap();
    let full = all_keys_reversed();
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(&full.as_bytes()[..full.len() - 1]));
    assert!(!m.clone().try_advance_bytes(b","));
    assert!(!m.clone().try_advance_bytes(b" ,"));
    assert!(m.try_advance_bytes(b"}") && m.is_accepting());
    // One key short, the comma is offered and only the missing key follows it.
    let short = full.replacen(r#""k05":5,"#, "", 1);
    let mut m = Matcher::new(g);
    assert!(m.try_advance_bytes(&short.as_bytes()[..short.len() - 1]));
    assert!(m.try_advance_bytes(b","));
    assert!(!m.clone().try_advance_bytes(br#""k04""#));
    assert!(!m.clone().try_advance_bytes(br#""k1"#));
    assert!(m.try_advance_bytes(br#""k05":0}"#) && m.is_accepting());
}

#[test]
fn a_key_prefix_only_written_keys_complete_is_refused() {
    let g = compile_bytes_with(&schema(false), &CompileOptions::default()).unwrap();
    let mut m = Matcher::new(g.clone());
    assert!(m.try_advance_bytes(br#"{"name":"a","#));
    // `nam` only continues as `name`, written: refused at once. `na` may still be `nation`.
    assert!(!m.clone().try_advance_bytes(br#""nam"#));
    assert!(m.clone().try_advance_bytes(br#""na"#));
    assert!(m.clone().try_advance_bytes(br#""nat"#));
    assert!(m.try_advance_bytes(br#""nation":true,"#));
    assert!(!m.clone().try_advance_bytes(br#""n"#));
    assert!(m.try_advance_bytes(br#""k03":1}"#) && m.is_accepting());
    // Open to other keys, `nam` may become one (`namex`); only the repeat itself is refused.
    let g = compile_bytes_with(&schema(true), &CompileOptions::default()).unwrap();
    let mut m = Matcher::new(g);
    assert!(m.try_advance_bytes(br#"{"name":"a","nam"#));
    assert!(!m.clone().try_advance_bytes(br#"e""#));
    assert!(m.try_advance_bytes(br#"ex":[1,"x"],"k03":1}"#) && m.is_accepting());
}

#[test]
fn other_objects_keep_repeated_undeclared_keys_as_before() {
    // Repeated keys elsewhere are not the loop's business: an open object in schema order
    // beside a loop object still takes an undeclared key twice, as it did.
    let s = json!({
        "type": "object",
        "properties": {"loop": schema(false), "open": {"type": "object"}},
    });
    check_opts(
        &s,
        &CompileOptions::default(),
        &[r#"{"open":{"x":1,"x":2},"loop":{"name":"a","k03":1}}"#],
        &[r#"{"loop":{"name":"a","k03":1,"name":"b"}}"#],
    );
}

/// [`schema`]`(false)` with `k00`…`k13` required: more than the loop takes in any order.
fn many_required() -> Value {
    let mut s = schema(false);
    let required: Vec<String> = (0..14).map(|i| format!("k{i:02}")).collect();
    s["required"] = json!(required);
    s
}

#[test]
fn required_keys_past_the_tracked_ones_keep_their_order_among_themselves_only() {
    // 14 required keys, nothing else: more than the loop takes in any order.
    let mut props = serde_json::Map::new();
    for i in 0..14 {
        props.insert(format!("k{i:02}"), json!({"type": "integer"}));
    }
    let required: Vec<String> = props.keys().cloned().collect();
    let s = json!({"type": "object", "properties": props, "required": required,
                   "additionalProperties": false});
    let g = compile_bytes_with(&s, &CompileOptions::default()).unwrap();
    let text = |keys: &[usize]| {
        let fields: Vec<String> = keys.iter().map(|i| format!(r#""k{i:02}":{i}"#)).collect();
        format!("{{{}}}", fields.join(","))
    };
    let declared: Vec<usize> = (0..14).collect();
    assert!(accepts(&g, &text(&declared)));
    // The first six in reverse, then the rest: at least six come in any order.
    let mut first_reversed: Vec<usize> = (0..6).rev().collect();
    first_reversed.extend(6..14);
    assert!(accepts(&g, &text(&first_reversed)));
    let mut first_last: Vec<usize> = (1..14).collect();
    first_last.push(0);
    assert!(accepts(&g, &text(&first_last)));
    // The last two swapped: past the tracked keys, declaration order holds (stricter).
    let mut swapped = declared.clone();
    swapped.swap(12, 13);
    assert!(!accepts(&g, &text(&swapped)));
    // A required key missing, or one written twice, is refused as before.
    assert!(!accepts(&g, &text(&declared[..13])));
    let mut twice = declared.clone();
    twice.insert(5, 3);
    assert!(!accepts(&g, &text(&twice)));
}

/// Masks against the byte reference and every planned close checked on random walks over
/// [`many_required`]: the close writes the required keys still missing, in the order the
/// automaton allows.
#[test]
fn many_required_keys_close_with_every_one_written() {
    let start = |w: usize| match w % 3 {
        0 => b"{".to_vec(),
        1 => br#"{"k04":4,"k00":0,"name":"a","#.to_vec(),
        // Every required key but the last.
        _ => {
            let fields: Vec<String> = (0..13).map(|i| format!(r#""k{i:02}":{i}"#)).collect();
            format!("{{{},", fields.join(",")).into_bytes()
        }
    };
    let required: Vec<String> = (0..14).map(|i| format!("k{i:02}")).collect();
    let ok = |text: &[u8]| closed_ok(text, &required);
    loop_walks(&many_required(), 11, &start, &ok);
}

/// Valid for [`schema`]`(false)`: a JSON object whose keys (read from the text, so repeats
/// count) are declared, distinct, and include the required ones, with values of their type.
fn loop_ok(text: &[u8]) -> bool {
    closed_ok(text, &["k03".to_string(), "name".to_string()])
}

/// [`loop_ok`] with `required` the required keys.
fn closed_ok(text: &[u8], required: &[String]) -> bool {
    let Ok(t) = std::str::from_utf8(text) else {
        return false;
    };
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(t) else {
        return false;
    };
    let keys = top_level_keys(t);
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != keys.len() || !required.iter().all(|k| map.contains_key(k)) {
        return false;
    }
    map.iter().all(|(k, v)| match k.as_str() {
        "name" => v == "a" || v == "b",
        "nation" => v.is_boolean(),
        k if k.len() == 3 && k.starts_with('k') => {
            k[1..].parse::<u32>().is_ok_and(|i| i < 18)
                && v.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    })
}

#[test]
fn key_loop_masks_match_the_byte_reference_on_random_walks() {
    let start = |w: usize| match w % 3 {
        0 => b"{".to_vec(),
        1 => br#"{"name":"a","nation":true,"#.to_vec(),
        _ => {
            // Two keys short of the whole object.
            let s =
                all_keys_reversed()
                    .replacen(r#""k05":5,"#, "", 1)
                    .replacen(r#""k11":11,"#, "", 1);
            format!("{},", &s[..s.len() - 1]).into_bytes()
        }
    };
    loop_walks(&schema(false), 7, &start, &loop_ok);
}

/// Random walks on Llama-3 from the texts `start` gives, masks against the byte reference,
/// every planned close checked by `ok`.
fn loop_walks(
    schema: &Value,
    seed: u64,
    start: &dyn Fn(usize) -> Vec<u8>,
    ok: &dyn Fn(&[u8]) -> bool,
) {
    let Some(tok) = llama3() else { return };
    let g =
        CompiledGrammar::json_schema_value(schema, tok.vocab.clone(), &CompileOptions::default())
            .unwrap();
    // Keys and commas most of the time, so that walks write many keys, repeats tried.
    let prefer = |b: &[u8]| b.contains(&b'"') || b.contains(&b',');
    common::random_walks(&g, seed, 6, 40, start, &prefer, 0.8, ok);
}

/// Valid for [`schema`]`(true)`: as [`loop_ok`], but keys that are not declared take any
/// value, and may repeat (only the loop's declared keys are tracked). Keys are written in
/// one spelling (no `\u` escapes), so the text decides which keys are declared.
fn open_loop_ok(text: &[u8]) -> bool {
    let Ok(t) = std::str::from_utf8(text) else {
        return false;
    };
    let Ok(Value::Object(_)) = serde_json::from_str::<Value>(t) else {
        return false;
    };
    let declared = |k: &str| {
        k == "name"
            || k == "nation"
            || (k.len() == 3 && k.starts_with('k') && k[1..].parse::<u32>().is_ok_and(|i| i < 18))
    };
    let keys = top_level_keys(t);
    let mut seen: Vec<&str> = keys.iter().copied().filter(|k| declared(k)).collect();
    let n = seen.len();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != n || !seen.contains(&"k03") || !seen.contains(&"name") {
        return false;
    }
    // Each declared key once: the parsed map holds its value.
    let map: serde_json::Map<String, Value> = serde_json::from_str(t).unwrap();
    seen.iter().all(|&k| {
        let v = &map[k];
        match k {
            "name" => v == "a" || v == "b",
            "nation" => v.is_boolean(),
            _ => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        }
    })
}

#[test]
fn open_key_loop_masks_match_the_byte_reference_on_random_walks() {
    // Undeclared keys beside the loop's: a key prefix stays alive through them (`nam` may
    // become `namex`), while the closing quote of a declared key written before is refused.
    let start = |w: usize| match w % 3 {
        0 => b"{".to_vec(),
        1 => br#"{"name":"a","nation":true,"other":[1],"#.to_vec(),
        _ => {
            let s = all_keys_reversed().replacen(r#""k05":5,"#, "", 1);
            format!("{},", &s[..s.len() - 1]).into_bytes()
        }
    };
    loop_walks(&schema(true), 11, &start, &open_loop_ok);
}

/// Tokens that finish, repeat or stop inside the keys of [`schema`], or cross from a
/// value into the next key.
const KEY_TOKENS: &[&str] = &[
    "e\"",
    "me\"",
    "ame\"",
    "ame\":\"a\",\"",
    "ation\"",
    "ation\":true,\"n",
    "ex\"",
    "\"name\"",
    "\"nam",
    "\"na",
    "\"k0",
    "\"k03\"",
    "03\"",
    "3\":1,\"k0",
    "\":1,\"k03",
    "\",\"name",
    "\",\"nam",
    "1,\"k1",
    "true,\"name\":",
    "\"namex\":",
    "namex",
    "k1",
];

/// Masks in key-loop objects, closed and open to other keys, are exact at every position
/// of texts that write keys in any order, and on random walks from there, with tokens
/// made to finish or repeat a written key (`ame"` after `"n`) and to cross from a value
/// into the next key (`3":1,"k0`).
#[test]
fn key_loop_masks_exact_with_crossing_tokens() {
    let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
    toks.extend((0u8..=255).map(|b| vec![b]));
    toks.extend(KEY_TOKENS.iter().map(|t| t.as_bytes().to_vec()));
    // Enough plain tokens that a mask inside an open key is wide (the refinement follows
    // candidates there; narrow masks it decides token by token).
    toks.extend((0..400).map(|i| format!("zq{i}").into_bytes()));
    let vocab = std::sync::Arc::new(sglrs_grammar::TokenVocab::new(toks, &[], &[0]).unwrap());
    // Closed; open to any other key; open only to keys matching `^x_` (whose thread dies
    // on `"n`, so a key prefix only written keys complete is refused there too).
    let mut patterned = schema(false);
    patterned["patternProperties"] = json!({"^x_": {"type": "integer"}});
    let cases = [
        (
            schema(false),
            r#"{"nation":true,"name":"a","k03":1,"k01":2}"#,
            &["\"k", "\"k0", "\"", ""][..],
        ),
        (
            schema(true),
            r#"{"name":"a","namex":1,"nation":true,"na":[],"k03":1}"#,
            &["\"n", "\"na", "\"nam", "\"k0", "\"", ""][..],
        ),
        (
            patterned,
            r#"{"name":"a","x_n":1,"nation":true,"x_":2,"k03":1}"#,
            &["\"x", "\"x_", "\"k0", "\"", ""][..],
        ),
    ];
    for (i, (schema, text, stops)) in cases.iter().enumerate() {
        let compile = || {
            CompiledGrammar::json_schema_value(schema, vocab.clone(), &CompileOptions::default())
                .unwrap()
        };
        for cut in [0, text.len() / 2, text.len() / 3, 2] {
            let ids = vocab
                .greedy_tokenize(&text.as_bytes()[..text.len() - cut])
                .unwrap();
            common::check_path(&vocab, &compile(), &ids, (i * 5 + cut) as u64, 30);
        }
        // Inside a key that written keys continue, and where one may open.
        for stop in stops.iter() {
            let prefix = format!("{{\"name\":\"a\",\"k03\":1,\"nation\":false,{stop}");
            let ids = vocab.greedy_tokenize(prefix.as_bytes()).unwrap();
            common::check_path(&vocab, &compile(), &ids, i as u64, 3);
        }
    }
}

/// The keys of the object `t` (valid JSON) as written, repeats included: the strings at
/// depth 1 followed by `:`.
fn top_level_keys(t: &str) -> Vec<&str> {
    let b = t.as_bytes();
    let (mut depth, mut i, mut keys) = (0usize, 0usize, Vec::new());
    while i < b.len() {
        match b[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b'"' => {
                let start = i + 1;
                i += 1;
                while b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                let mut j = i + 1;
                while b[j].is_ascii_whitespace() {
                    j += 1;
                }
                if depth == 1 && b[j] == b':' {
                    keys.push(&t[start..i]);
                }
            }
            _ => {}
        }
        i += 1;
    }
    keys
}

#[test]
fn property_counts_hold_in_key_loops() {
    for additional in [false, true] {
        let mut s = schema(additional);
        s["minProperties"] = json!(3);
        s["maxProperties"] = json!(4);
        check_opts(
            &s,
            &CompileOptions::default(),
            &[
                r#"{"k10":1,"name":"a","k03":1}"#,
                r#"{"name":"a","nation":true,"k03":1,"k17":2}"#,
            ],
            &[
                r#"{"name":"a","k03":1}"#,
                r#"{"name":"a","nation":true,"k03":1,"k17":2,"k00":1}"#,
                r#"{"k00":1,"k01":1,"k02":1,"k03":1}"#,
            ],
        );
        let g = compile_bytes_with(&s, &CompileOptions::default()).unwrap();
        let mut m = Matcher::new(g);
        assert!(m.try_advance_bytes(br#"{"k00":1,"k01":1,"name":"a""#));
        // Three written, one left: the required key it must be.
        assert!(m.clone().try_advance_bytes(br#","k03":1}"#));
        assert!(!m.clone().try_advance_bytes(br#","k02"#));
        assert!(!m.clone().try_advance_bytes(b"}"));
    }
}

/// A closed object of `n` integer keys `{prefix}_{i:02}`, padded with `x` to `len` bytes.
fn closed_object(prefix: &str, n: usize, len: usize) -> Value {
    let props: serde_json::Map<String, Value> = (0..n)
        .map(|i| {
            let key = format!("{prefix}_{i:02}{}", "x".repeat(len));
            (key[..len].to_string(), json!({"type": "integer"}))
        })
        .collect();
    json!({"type": "object", "properties": props, "additionalProperties": false})
}

/// A schema whose objects spend the any-order automaton's budget before its key-loop objects
/// are built (properties are compiled last to first: three of eleven keys, about 120,000
/// estimated states each in any order, twelve of eight, seventy of three, then four of
/// twenty long keys, past the subset automaton): the key loops still take their keys in any
/// order, each once — they have a budget of their own, where sharing the any-order one left
/// them in schema order.
#[test]
fn key_loops_past_the_any_order_budget_still_take_any_order() {
    let mut props = serde_json::Map::new();
    for i in 0..4 {
        props.insert(format!("loop{i}"), closed_object(&format!("l{i}"), 20, 40));
    }
    for i in 0..70 {
        props.insert(format!("sm{i}"), closed_object(&format!("s{i}"), 3, 5));
    }
    for i in 0..12 {
        props.insert(format!("mid{i}"), closed_object(&format!("m{i}"), 8, 5));
    }
    for i in 0..3 {
        props.insert(format!("big{i}"), closed_object(&format!("b{i}"), 11, 5));
    }
    let s = json!({"type": "object", "properties": props, "additionalProperties": false});
    let key = |i: usize, k: usize| format!("l{i}_{k:02}{}", "x".repeat(35));
    let (mut valid, mut invalid) = (Vec::new(), Vec::new());
    for i in 0..4 {
        let (a, b) = (key(i, 19), key(i, 0));
        valid.push(format!(r#"{{"loop{i}":{{"{a}":1,"{b}":2}}}}"#));
        invalid.push(format!(r#"{{"loop{i}":{{"{a}":1,"{b}":2,"{a}":3}}}}"#));
    }
    let valid: Vec<&str> = valid.iter().map(String::as_str).collect();
    let invalid: Vec<&str> = invalid.iter().map(String::as_str).collect();
    check_opts(&s, &CompileOptions::default(), &valid, &invalid);
}
