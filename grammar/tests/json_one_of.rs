//! `oneOf` branches that may share values: each branch excludes the others' values, exactly
//! where the complement can be written and small enough, and through a subset of the
//! complement (stricter, never looser) where it cannot; `not` and `if` likewise. For each
//! schema, listed valid texts are accepted and listed invalid texts rejected (byte
//! vocabulary, both property orders).

mod common;

use common::{accepts_text as accepts, check, compile_bytes as compile};
use serde_json::{json, Value};

/// A `oneOf` of `n` branches, branch `i` requiring key `k{i}` (an object with an integer
/// `v`) and allowing every other key — the "exactly one of these keys" shape of test-suite
/// and CI configuration schemas.
fn one_key_each(n: usize) -> Value {
    let mut props = serde_json::Map::new();
    let mut branches = Vec::new();
    for i in 0..n {
        props.insert(format!("k{i}"), json!(true));
        branches.push(json!({
            "properties": {format!("k{i}"): {"type": "object", "required": ["v"],
                "properties": {"v": {"type": "integer"}}, "additionalProperties": false}},
            "required": [format!("k{i}")]
        }));
    }
    json!({"type": "object", "properties": props, "additionalProperties": false,
           "oneOf": branches})
}

#[test]
fn one_of_branches_each_requiring_their_own_key() {
    // Twelve branches: the exclusions used to multiply (two alternatives each: the key
    // absent, or present with a value outside) past the product limit.
    check(
        one_key_each(12),
        &[
            r#"{"k0":{"v":1}}"#,
            r#"{"k11":{"v":-4}}"#,
            // `k1` present but outside its branch: only branch 0 matches.
            r#"{"k0":{"v":1},"k1":{"v":"x"}}"#,
            r#"{"k3":{},"k7":{"v":2}}"#,
        ],
        &[
            "{}",
            r#"{"k0":{"v":1},"k1":{"v":2}}"#,
            r#"{"k5":{"v":1},"k11":{"v":0}}"#,
            r#"{"k0":{"v":"x"}}"#,
            r#"{"k0":{"v":1},"k12":{"v":2}}"#,
        ],
    );
}

#[test]
fn optional_discriminating_property_leaves_only_its_absence() {
    // `kind` tells the branches apart when present; without it, `size` must.
    let branches: Vec<Value> = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
        .iter()
        .enumerate()
        .map(|(i, k)| {
            json!({"properties": {"kind": {"enum": [k]},
                                  "size": {"type": "integer", "minimum": i * 10,
                                           "maximum": i * 10 + 14}}})
        })
        .collect();
    let schema = json!({"type": "object", "oneOf": branches});
    check(
        schema,
        &[
            r#"{"kind":"a","size":12}"#,
            r#"{"kind":"i","size":85}"#,
            r#"{"size":5}"#,
            r#"{"kind":"c"}"#,
        ],
        &[
            // No `kind`, 12 in branches a and b.
            r#"{"size":12}"#,
            "{}",
            r#"{"kind":"z"}"#,
            r#"{"kind":"a","kind2":1,"size":500}"#,
        ],
    );
}

#[test]
fn branches_extending_a_shared_base_are_told_apart_by_what_they_add() {
    // Each branch is `allOf: [{$ref: base}, {its own properties}]` (how configuration schemas
    // write "a meter of kind X"): the base's properties are the same in every branch, so
    // excluding another branch comes down to `kind` present (its values disjoint) or that
    // branch's own property of the wrong type. Compared unmerged, the base's five properties
    // made each exclusion eight alternatives, and the eight branches' products ran past the
    // compile deadline (with more properties, past the product limit: the coarse subset
    // left each branch only non-objects, and a meter of a valid kind was refused).
    let kinds = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let mut defs = serde_json::Map::new();
    defs.insert(
        "base".into(),
        json!({"type": "object", "properties": {
            "enabled": {"type": "boolean"}, "interval": {"type": "integer"},
            "name": {"type": "string"}, "tags": {"type": "array"},
            "limits": {"type": "object"}}}),
    );
    for k in kinds {
        defs.insert(
            format!("m_{k}"),
            json!({"allOf": [{"$ref": "#/$defs/base"}, {"properties": {
                "kind": {"enum": [k]}, format!("only_{k}"): {"type": "integer"}}}]}),
        );
    }
    let branches: Vec<Value> = kinds
        .iter()
        .map(|k| json!({"$ref": format!("#/$defs/m_{k}")}))
        .collect();
    let schema = json!({"$defs": defs, "oneOf": branches});
    // No `kind`, every other branch's own property of the wrong type: only branch a.
    let only_a = format!(
        "{{{}}}",
        kinds[1..]
            .iter()
            .map(|k| format!(r#""only_{k}":"x""#))
            .collect::<Vec<_>>()
            .join(",")
    );
    check(
        schema,
        &[
            r#"{"enabled":true,"interval":10,"kind":"d","only_d":35}"#,
            r#"{"interval":1,"kind":"a"}"#,
            r#"{"kind":"h","only_h":3,"only_a":"x"}"#,
            &only_a,
        ],
        &[
            // No `kind`: every branch matches; a kind outside every branch.
            r#"{"enabled":true}"#,
            r#"{"only_a":5}"#,
            r#"{"kind":"z"}"#,
            // `kind` d with its own property or a base property of the wrong type.
            r#"{"kind":"d","only_d":"x"}"#,
            r#"{"kind":"d","enabled":1}"#,
        ],
    );
}

#[test]
fn closed_branches_told_apart_by_their_own_keys() {
    // Two closed objects sharing `name`: the one with `extra` can only fail the other by
    // having a key the other does not declare — here exactly `extra`.
    let mut branches = Vec::new();
    for i in 0..7 {
        branches.push(json!({"type": "object", "additionalProperties": false,
            "properties": {"name": {"type": "string"}, format!("x{i}"): {"type": "integer"},
                           "note": {"type": "string", "maxLength": i + 1}}}));
    }
    check(
        json!({"oneOf": branches}),
        &[
            r#"{"x0":1}"#,
            r#"{"name":"n","x6":3}"#,
            r#"{"x3":1,"note":"abcd"}"#,
        ],
        &[
            // Every branch matches.
            r#"{"name":"n"}"#,
            "{}",
            r#"{"x0":1,"x1":2}"#,
            r#"{"x0":"s"}"#,
        ],
    );
}

#[test]
fn recursive_overlapping_branches_compile_through_an_approximation() {
    // A request item or a folder of distinct items (Postman collections): an item fails
    // the folder by lacking `item`, by `item` not being an array, by an element outside the
    // union (recursion) or by repeated elements (no complement). The approximation keeps the
    // first two; a value of both is still refused.
    let schema = json!({
        "definitions": {
            "node": {"oneOf": [{"$ref": "#/definitions/item"}, {"$ref": "#/definitions/group"}]},
            "item": {"type": "object", "required": ["request"],
                     "properties": {"name": {"type": "string"}, "request": {"type": "string"},
                                    "tags": {"type": "array", "items": {"type": "string"}}}},
            "group": {"type": "object", "required": ["item"],
                      "properties": {"name": {"type": "string"},
                                     "item": {"type": "array", "uniqueItems": true,
                                              "items": {"$ref": "#/definitions/node"}}}}
        },
        "$ref": "#/definitions/node"
    });
    check(
        schema,
        &[
            r#"{"request":"GET /"}"#,
            r#"{"name":"f","item":[]}"#,
            r#"{"name":"f","item":[{"request":"a"},{"item":[{"request":"b","tags":["t"]}]}]}"#,
        ],
        &[
            "{}",
            // Both branches match.
            r#"{"request":"GET /","item":[]}"#,
            r#"{"item":[{"request":"a","item":[{"request":"b"}]}]}"#,
            r#"{"item":[{"tags":[1]}]}"#,
        ],
    );
}

#[test]
fn approximated_exclusions_are_stricter_never_looser() {
    // Branch 0's values fail branch 1 by lacking `tags`, by `tags` not being an array, or by
    // repeated tags — `uniqueItems` has no complement, so that way out is left out: refused
    // though valid. Every value both branches match is still refused.
    let schema = json!({"oneOf": [
        {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}},
        {"type": "object", "required": ["id", "tags"],
         "properties": {"id": {"type": "integer"},
                        "tags": {"type": "array", "uniqueItems": true}}}
    ]});
    check(
        schema.clone(),
        &[r#"{"id":1}"#, r#"{"id":1,"tags":"x"}"#],
        &[
            r#"{"id":1,"tags":[]}"#,
            r#"{"id":1,"tags":[1,2]}"#,
            r#"{"tags":[1]}"#,
        ],
    );
    let g = compile(&schema).expect("compiles");
    assert!(
        !accepts(&g, r#"{"id":1,"tags":[1,1]}"#),
        "the approximation is documented as leaving this valid value out"
    );
}

#[test]
fn not_and_if_without_an_exact_complement_are_enforced_stricter() {
    // `not`: `a` absent or not an array are written out; an array with repeated items
    // (`uniqueItems` has no complement) is left out.
    let not = json!({"type": "object",
        "not": {"required": ["a"], "properties": {"a": {"type": "array", "uniqueItems": true}}}});
    check(
        not.clone(),
        &["{}", r#"{"a":1}"#, r#"{"b":[1]}"#],
        &[r#"{"a":[]}"#, r#"{"a":[1,2]}"#],
    );
    let g = compile(&not).expect("compiles");
    assert!(!accepts(&g, r#"{"a":[1,1]}"#), "documented as left out");
    // `if`: the condition fails by `t` being absent or not an array (written out), or by
    // repeated items (left out).
    let cond = json!({"type": "object",
        "if": {"required": ["t"], "properties": {"t": {"type": "array", "uniqueItems": true}}},
        "then": {"required": ["x"]}, "else": {"required": ["y"]}});
    check(
        cond.clone(),
        &[r#"{"t":[1],"x":0}"#, r#"{"y":0}"#, r#"{"t":"s","y":0}"#],
        &[r#"{"t":[1]}"#, "{}", r#"{"t":[1,2],"y":0}"#],
    );
    let g = compile(&cond).expect("compiles");
    assert!(
        !accepts(&g, r#"{"t":[1,1],"y":0}"#),
        "documented as left out"
    );
    // Nothing written out: refused, naming the keyword, as before.
    let e = compile(&json!({"type": "array", "not": {"uniqueItems": true}})).unwrap_err();
    assert!(e.to_string().contains("uniqueItems"), "{e}");
}

#[test]
fn key_witnesses_implied_by_others_or_by_required_keys_take_no_bit() {
    // Not any of six closed objects with nested key sets: some key outside each, i.e. a key
    // outside the largest — one witness where six were refused (at most four fit).
    let keys = ["a", "b", "c", "d", "e", "f"];
    let closed: Vec<serde_json::Value> = (1..=keys.len())
        .map(|n| {
            let props: serde_json::Map<String, serde_json::Value> = keys[..n]
                .iter()
                .map(|k| (k.to_string(), json!(true)))
                .collect();
            json!({"type": "object", "properties": props, "additionalProperties": false})
        })
        .collect();
    check(
        json!({"type": "object", "not": {"anyOf": closed}}),
        &[r#"{"g":1}"#, r#"{"a":1,"g":2}"#, r#"{"f":1,"zz":0}"#],
        &["{}", r#"{"a":1}"#, r#"{"a":1,"f":2}"#, r#"{"b":[]}"#],
    );
    // A required key outside the closed object's names meets its witness already.
    check(
        json!({"type": "object", "required": ["z"],
               "not": {"properties": {"a": {}}, "additionalProperties": false}}),
        &[r#"{"z":1}"#, r#"{"a":0,"z":1}"#],
        &["{}", r#"{"a":0}"#],
    );
}

#[test]
fn a_grammar_emptied_by_an_approximated_complement_is_not_called_unsatisfiable() {
    // A random schema (differential generator, seed 1, schema 2544) whose values include
    // `"abc"` and `[true]`: the exclusions between its outer branches have no exact form, and
    // the subsets written instead leave nothing. The error names the approximation.
    let s = json!({"oneOf": [
        {"oneOf": [{"if": {"type": "null"}, "then": {"type": "string"}},
                   {"type": "integer", "minimum": 0.01, "not": {"type": "number", "minimum": -100}}]},
        {"type": "array", "items": {"type": "boolean"}, "maxItems": 1},
        {"anyOf": [{"anyOf": [{"type": "integer"},
                              {"type": "string", "pattern": "(ab)+", "const": "ab"}]},
                   {"const": 1},
                   {"oneOf": [{"type": "integer", "minimum": 0.001, "maximum": 5,
                               "exclusiveMaximum": 0.1, "multipleOf": 3},
                              {"enum": ["b"]}]}]}]});
    let e = compile(&s).expect_err("refused").to_string();
    assert!(e.contains("subset") && e.contains("no text"), "{e}");
    assert!(!e.starts_with("the grammar accepts no text"), "{e}");
    // A schema no value satisfies still says so.
    let unsat = json!({"type": "object", "required": ["a", "b"],
                       "oneOf": [{"required": ["a"]}, {"required": ["b"]}]});
    let e = compile(&unsat).expect_err("refused").to_string();
    assert_eq!(e, "the grammar accepts no text");
}

#[test]
fn excluded_substring_patterns_stop_the_automaton_where_they_match() {
    // A `oneOf` of unanchored patterns (a workflow state written as "contains NEW", "contains
    // ON_APPROVAL", …): each branch excludes the others' patterns. Once an excluded
    // substring has appeared, no longer text can shed it, so the string automaton stops
    // there rather than following every pattern on: 369,421 states before, 5,512 now (the
    // public `o12278` compiled in ~0.9 s, now in ~20 ms).
    let states = [
        "NEW",
        "ON_APPROVAL",
        "ON_SIGNING",
        "ON_MODIFICATION",
        "EXECUTED",
        "DEPRECATED",
        "REJECTED",
    ];
    let branches: Vec<Value> = states.iter().map(|p| json!({"pattern": p})).collect();
    let schema = json!({"type": "string", "oneOf": branches});
    check(
        schema.clone(),
        &[r#""NEW""#, r#""is EXECUTED now""#, r#""REJECTED!""#],
        &[
            r#""NEW and EXECUTED""#,
            r#""EXECUTEDNEW""#,
            r#""nothing""#,
            r#""""#,
        ],
    );
    let g = compile(&schema).unwrap();
    assert!(g.num_states() < 20_000, "{} states", g.num_states());
    // Matches that more text can undo are followed on: a `$` and a word boundary.
    check(
        json!({"type": "string", "oneOf": [{"pattern": "ab$"}, {"pattern": "x"}]}),
        &[r#""xabc""#, r#""ab""#],
        &[r#""xab""#, r#""abc""#],
    );
    check(
        json!({"type": "string", "oneOf": [{"pattern": "foo\\b"}, {"pattern": "bar"}]}),
        &[r#""foo!""#, r#""barfoox""#],
        &[r#""barfoo""#, r#""foox""#, r#""foo bar""#],
    );
}
