//! `unevaluatedProperties` / `unevaluatedItems` (`json/unevaluated.rs`): for each schema,
//! valid texts accepted and invalid ones rejected (byte vocabulary, compact policy). Each
//! invalid text is one a looser reading (the keyword ignored, or evaluations counted from the
//! wrong scope) would accept.

mod common;

use common::{check, compile_bytes as compile};
use serde_json::json;

#[test]
fn keys_declared_through_all_of_and_ref_are_evaluated() {
    check(
        json!({
            "$defs": {"base": {"properties": {"id": {"type": "integer"}}, "required": ["id"]}},
            "allOf": [{"$ref": "#/$defs/base"}],
            "properties": {"name": {"type": "string"}},
            "patternProperties": {"^x-": {"type": "boolean"}},
            "unevaluatedProperties": false
        }),
        &[
            r#"{"id":1}"#,
            r#"{"name":"a","id":1}"#,
            r#"{"id":1,"x-a":true}"#,
        ],
        &[
            r#"{"id":1,"other":1}"#,
            r#"{"id":1,"x-a":1}"#,
            r#"{"name":"a"}"#,
        ],
    );
}

#[test]
fn an_unevaluated_schema_constrains_the_other_keys() {
    check(
        json!({"properties": {"a": {"type": "integer"}}, "unevaluatedProperties": {"type": "string"}}),
        &[r#"{"a":1,"b":"x"}"#, r#"{"b":"x","c":"y"}"#],
        &[r#"{"a":1,"b":2}"#],
    );
}

#[test]
fn one_of_branches_evaluate_their_own_keys() {
    check(
        json!({
            "properties": {"kind": {"enum": ["a", "b"]}},
            "required": ["kind"],
            "oneOf": [
                {"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}},
                {"properties": {"kind": {"const": "b"}, "y": {"type": "integer"}}}
            ],
            "unevaluatedProperties": false
        }),
        &[
            r#"{"kind":"a","x":1}"#,
            r#"{"kind":"b","y":2}"#,
            r#"{"kind":"a"}"#,
        ],
        &[
            r#"{"kind":"a","y":1}"#,
            r#"{"kind":"b","x":1}"#,
            r#"{"kind":"a","z":1}"#,
        ],
    );
}

#[test]
fn any_of_branches_that_match_together_evaluate_together() {
    check(
        json!({
            "properties": {"foo": {"type": "string"}},
            "anyOf": [
                {"properties": {"bar": {"const": "bar"}}, "required": ["bar"]},
                {"properties": {"baz": {"const": "baz"}}, "required": ["baz"]}
            ],
            "unevaluatedProperties": false
        }),
        &[r#"{"foo":"f","bar":"bar"}"#, r#"{"bar":"bar","baz":"baz"}"#],
        // baz fails its branch, so that branch evaluates nothing.
        &[r#"{"bar":"bar","baz":"no"}"#, r#"{"bar":"bar","q":1}"#],
    );
}

#[test]
fn if_then_else_evaluates_the_side_taken() {
    check(
        json!({
            "if": {"properties": {"t": {"const": 1}}, "required": ["t"]},
            "then": {"properties": {"a": {"type": "integer"}}},
            "else": {"properties": {"b": {"type": "integer"}}},
            "unevaluatedProperties": false
        }),
        &[r#"{"t":1,"a":2}"#, r#"{"b":2}"#, r#"{"t":1}"#],
        // A failed `if` evaluates nothing: `t` is then unevaluated.
        &[r#"{"t":1,"b":2}"#, r#"{"a":2}"#, r#"{"t":2,"b":1}"#],
    );
}

#[test]
fn a_nested_one_does_not_see_its_uncles() {
    // `foo`'s own schema decides what is evaluated inside foo; the top-level anyOf that also
    // declares `faz` for foo does not count there.
    check(
        json!({
            "properties": {"foo": {"properties": {"bar": {"type": "string"}}, "unevaluatedProperties": false}},
            "anyOf": [{"properties": {"foo": {"properties": {"faz": {"type": "string"}}}}}]
        }),
        &[r#"{"foo":{"bar":"x"}}"#],
        &[r#"{"foo":{"bar":"x","faz":"y"}}"#],
    );
    // The same inside an allOf part: merged with its sibling, but rewritten in its own scope.
    check(
        json!({"allOf": [
            {"properties": {"a": {}}, "unevaluatedProperties": false},
            {"properties": {"b": {}}}
        ]}),
        &[r#"{"a":1}"#, "{}"],
        &[r#"{"a":1,"b":2}"#],
    );
}

#[test]
fn items_after_the_evaluated_tuple() {
    check(
        json!({"allOf": [{"prefixItems": [{"type": "string"}]}], "unevaluatedItems": {"type": "integer"}}),
        &[r#"["a"]"#, r#"["a",1,2]"#, "[]"],
        &[r#"["a","b"]"#, r#"[1]"#],
    );
    check(
        json!({"prefixItems": [{}], "unevaluatedItems": false}),
        &[r#"[1]"#, "[]"],
        &[r#"[1,2]"#],
    );
}

#[test]
fn value_dependent_evaluations_are_refused_by_name() {
    for s in [
        json!({"contains": {"type": "string"}, "unevaluatedItems": false}),
        json!({"dependentSchemas": {"a": {"properties": {"b": {}}}}, "unevaluatedProperties": false}),
    ] {
        let e = compile(&s).err().unwrap_or_else(|| panic!("{s} compiled"));
        assert!(e.to_string().contains("unevaluated"), "{s}: {e}");
    }
}
