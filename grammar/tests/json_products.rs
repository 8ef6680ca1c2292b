//! `allOf` of two large `anyOf` (`json/product.rs`): the branch pairs known to be empty or
//! redundant are left out before they are counted, so products that used to exceed the
//! limit compile, exactly. For each schema, listed valid texts are accepted and listed
//! invalid texts rejected (byte vocabulary, compact policy), including near misses.

mod common;

use common::{check, compile_bytes as compile};
use serde_json::{json, Value};
use sglrs_grammar::CompileError;

/// `anyOf` with one branch per key, each requiring it (objects only).
fn requires_one_of(keys: &[String]) -> Value {
    let b: Vec<Value> = keys
        .iter()
        .map(|k| json!({"type": "object", "required": [k]}))
        .collect();
    json!({ "anyOf": b })
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[test]
fn pairs_no_enum_value_satisfies_are_empty() {
    // 12 x 12 pairs, none disjoint by itself; the outer `enum` leaves two values, and
    // only the pairs one of them satisfies.
    let schema = json!({"allOf": [
        {"enum": [{"a1": 1, "b2": 2}, {"a5": 1, "b5": 2, "c": 3}, {"a1": 1}, {"b3": 0}, 7]},
        requires_one_of(&keys("a", 12)),
        requires_one_of(&keys("b", 12)),
    ]});
    check(
        schema,
        &[r#"{"a1":1,"b2":2}"#, r#"{"a5":1,"b5":2,"c":3}"#],
        &[
            r#"{"a1":1}"#,
            r#"{"b3":0}"#,
            "7",
            r#"{"a1":1,"b2":3}"#,
            r#"{"a2":1,"b2":2}"#,
            r#"{"a5":1,"b5":2}"#,
            "{}",
        ],
    );
}

#[test]
fn branches_implying_a_branch_of_the_other_side_are_taken_whole() {
    // Both sides share a string branch and two object branches (one of them weaker on
    // the right: `required: [c]` against `[c, e]` on the left); 9 x 9 other pairs. Pairing
    // everything is 1 + 11 x 11 pairs, over the limit of 96.
    let side = |p: &str, first: Value| {
        let mut b = vec![
            json!({"type": "string"}),
            first,
            json!({"type": "object", "required": ["d"]}),
        ];
        b.extend(
            keys(p, 9)
                .iter()
                .map(|k| json!({"type": "object", "required": [k]})),
        );
        json!({ "anyOf": b })
    };
    let schema = json!({"allOf": [
        side("a", json!({"type": "object", "required": ["c", "e"]})),
        side("b", json!({"type": "object", "required": ["c"]})),
    ]});
    check(
        schema,
        &[
            r#""x""#,
            r#"{"c":1,"e":2}"#,
            r#"{"d":1}"#,
            r#"{"a1":1,"b2":1}"#,
            r#"{"a8":1,"c":1}"#,
            r#"{"a0":{},"c":1}"#,
        ],
        &[
            r#"{"c":1}"#,
            r#"{"e":1}"#,
            r#"{"a1":1}"#,
            r#"{"b1":1}"#,
            r#"{"a9":1,"b9":1}"#,
            "1",
            "null",
            "{}",
        ],
    );
}

#[test]
fn pairs_a_closed_object_cannot_have_are_empty() {
    // 12 x 12 pairs; the closed object declares three keys of each side.
    let mut props = serde_json::Map::new();
    for k in ["a0", "a1", "a2", "b0", "b1", "b2", "z"] {
        props.insert(k.into(), json!({"type": "integer"}));
    }
    let closed = json!({"type": "object", "properties": props, "additionalProperties": false});
    check(
        json!({"allOf": [closed, requires_one_of(&keys("a", 12)), requires_one_of(&keys("b", 12))]}),
        &[r#"{"a1":1,"b2":2}"#, r#"{"a0":1,"b0":2,"z":3}"#],
        &[
            r#"{"a1":1}"#,
            r#"{"b1":1}"#,
            r#"{"a5":1,"b0":1}"#,
            r#"{"a1":1,"b2":2,"q":3}"#,
            r#"{"a1":"x","b2":2}"#,
        ],
    );
    // A closed object with a key pattern: required keys matching it are possible.
    let closed = json!({"type": "object", "properties": {"a0": {}},
        "patternProperties": {"^b[0-9]$": {"type": "integer"}}, "additionalProperties": false});
    check(
        json!({"allOf": [closed, requires_one_of(&keys("a", 12)), requires_one_of(&keys("b", 12))]}),
        &[r#"{"a0":1,"b7":2}"#, r#"{"a0":null,"b1":2,"b9":3}"#],
        &[
            r#"{"a0":1}"#,
            r#"{"a1":1,"b1":1}"#,
            r#"{"a0":1,"b10":1}"#,
            r#"{"a0":1,"b1":"x"}"#,
        ],
    );
    // More required keys than `maxProperties` allows.
    let mut left: Vec<Value> = keys("a", 12)
        .iter()
        .map(|k| json!({"type": "object", "required": [k, "x"]}))
        .collect();
    left.push(json!({"type": "object", "required": ["only"]}));
    check(
        json!({"allOf": [{"maxProperties": 2}, {"anyOf": left}, requires_one_of(&keys("b", 12))]}),
        &[r#"{"only":1,"b3":2}"#, r#"{"only":[],"b11":{}}"#],
        &[
            r#"{"only":1}"#,
            r#"{"only":1,"b3":2,"c":3}"#,
            r#"{"a1":1,"x":1,"b1":1}"#,
        ],
    );
}

#[test]
fn one_of_closed_objects_sharing_keys_needs_few_pairs() {
    // Each branch is `b_i and not b_j` for the overlapping j; the complements of closed
    // objects share their alternatives (not an object, a key absent, some other key).
    let r = json!({"type": "string"});
    let schema = json!({"oneOf": [
        {"type": "object", "properties": {"ios": r, "android": r},
         "required": ["ios", "android"], "additionalProperties": false},
        {"type": "object", "properties": {"ref": r}, "required": ["ref"],
         "additionalProperties": false},
        {"type": "object", "properties": {"inherit": {"enum": [true]}}, "required": ["inherit"],
         "additionalProperties": false},
        {"type": "object", "patternProperties": {"^[0-9]x$": r},
         "additionalProperties": false, "minProperties": 1},
        {"type": "object", "patternProperties": {"^[a-z]{2,3}$": r},
         "additionalProperties": false, "minProperties": 1, "not": {"required": ["ios"]}}
    ]});
    check(
        schema,
        &[
            r#"{"ios":"a","android":"b"}"#,
            r#"{"inherit":true}"#,
            r#"{"2x":"a","3x":"b"}"#,
            r#"{"en":"a","fr":"b"}"#,
            r#"{"ref":"a","en":"b"}"#,
        ],
        &[
            // `ref` alone matches the locale pattern too: two branches.
            r#"{"ref":"a"}"#,
            r#"{"ios":"a"}"#,
            r#"{"ios":"a","android":"b","en":"c"}"#,
            r#"{"inherit":false}"#,
            r#"{"2x":"a","en":"b"}"#,
            r#"{"en":1}"#,
            "{}",
            "\"s\"",
        ],
    );
}

#[test]
fn small_products_over_96_pairs_compile() {
    // 12 x 12 overlapping pairs of small branches: under the byte budget.
    let schema =
        json!({"allOf": [requires_one_of(&keys("a", 12)), requires_one_of(&keys("b", 12))]});
    check(
        schema,
        &[
            r#"{"a3":1,"b7":2}"#,
            r#"{"a11":[],"b0":{},"c":1}"#,
            r#"{"a1":2,"b1":1}"#,
        ],
        &[
            r#"{"a3":1}"#,
            r#"{"b7":1}"#,
            r#"{"a12":1,"b0":1}"#,
            "{}",
            "1",
        ],
    );
}

#[test]
fn products_beyond_the_limits_are_still_refused() {
    // 20 x 20 pairs of large, overlapping branches: refused, not loosened.
    let side = |p: &str| {
        let b: Vec<Value> = keys(p, 20)
            .iter()
            .map(|k| {
                json!({"type": "object", "required": [k],
                       "properties": {k.clone(): {"type": "string", "pattern": "^[a-z]+$",
                           "description": "x".repeat(200)}}})
            })
            .collect();
        json!({ "anyOf": b })
    };
    let err = compile(&json!({"allOf": [side("a"), side("b")]})).map(|_| ());
    assert!(
        matches!(err, Err(CompileError::Unsupported { ref reason, .. }) if reason.contains("anyOf")),
        "{err:?}"
    );
}
