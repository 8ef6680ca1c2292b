//! `propertyNames` with combinators over key schemas: `anyOf` / `oneOf` / `not` of key
//! patterns, lengths and enums, beside branches of other types that no key can match (the
//! shapes of CI configuration and identifier-keyed maps). For each schema, listed valid
//! texts are accepted and listed invalid texts rejected (byte vocabulary, compact policy).

mod common;

use common::{check, compile_bytes as compile};
use serde_json::json;

#[test]
fn any_of_key_schemas() {
    // A scope name (two or more word characters) or a glob.
    check(
        json!({"type": "object", "additionalProperties": {"type": "integer"},
               "propertyNames": {"anyOf": [
                   {"type": "string", "minLength": 2, "pattern": "^[A-Za-z0-9_-]+$"},
                   {"pattern": "[*?]"}]}}),
        &["{}", r#"{"ab":1}"#, r#"{"a*":1,"x_y":2}"#, r#"{"?":3}"#],
        &[r#"{"a":1}"#, r#"{"a b":1}"#, r#"{"":1}"#, r#"{"ab":"x"}"#],
    );
}

#[test]
fn one_of_enum_inside_pattern_excludes_the_names() {
    // Both branches take a listed name, so only unlisted names of the pattern are keys.
    check(
        json!({"type": "object", "additionalProperties": {"type": "boolean"},
               "propertyNames": {"oneOf": [
                   {"type": "string", "enum": ["fqcn", "name[play]"]},
                   {"type": "string", "pattern": "^[a-z0-9-\\[\\]]+$"}]}}),
        &[
            "{}",
            r#"{"fqcn2":true}"#,
            r#"{"name[x]":false,"jinja":true}"#,
        ],
        &[
            r#"{"fqcn":true}"#,
            r#"{"name[play]":true}"#,
            r#"{"Fqcn":true}"#,
            r#"{"a b":true}"#,
        ],
    );
}

#[test]
fn one_of_with_a_branch_no_key_matches() {
    // An identifier that is a positive number or a string of digits: keys are the strings.
    check(
        json!({"type": "object",
               "definitions": {"id": {"oneOf": [{"type": "number", "minimum": 1},
                                                 {"type": "string", "pattern": "^[1-9]\\d*$"}]}},
               "additionalProperties": false,
               "propertyNames": {"$ref": "#/definitions/id"},
               "patternProperties": {".+": {"type": "string"}}}),
        &["{}", r#"{"4896":"x"}"#, r#"{"1":"a","22":"b"}"#],
        &[
            r#"{"0":"x"}"#,
            r#"{"a1":"x"}"#,
            r#"{"12":1}"#,
            r#"{"":"x"}"#,
        ],
    );
}

#[test]
fn not_of_a_conjunction() {
    // not (starts with `a` and at most 3 characters) = not `a…` or longer than 3.
    check(
        json!({"type": "object",
               "propertyNames": {"not": {"pattern": "^a", "maxLength": 3}}}),
        &["{}", r#"{"b":1}"#, r#"{"abcd":1}"#, r#"{"ba":1,"aaaa":2}"#],
        &[r#"{"a":1}"#, r#"{"abc":1}"#, r#"{"b":1,"ab":2}"#],
    );
}

#[test]
fn declared_keys_are_checked_against_the_combinator() {
    // A declared optional key that is no valid name is never written; a required one makes
    // the schema unsatisfiable.
    check(
        json!({"type": "object",
               "properties": {"ok1": {"type": "integer"}, "Bad": {"type": "integer"}},
               "additionalProperties": false,
               "propertyNames": {"anyOf": [{"pattern": "^[a-z]+$"}, {"pattern": "^[a-z]+[0-9]$"}]}}),
        &["{}", r#"{"ok1":1}"#],
        &[r#"{"Bad":1}"#, r#"{"ok1":1,"Bad":2}"#],
    );
    assert!(compile(&json!({"type": "object", "required": ["Bad"],
                           "propertyNames": {"anyOf": [{"pattern": "^[a-z]+$"},
                                                       {"type": "integer"}]}}))
    .is_err());
}

#[test]
fn keywords_without_a_key_form_are_refused_by_name() {
    let err = compile(&json!({"type": "object",
                             "propertyNames": {"anyOf": [{"if": {"pattern": "^a"}, "then": {"maxLength": 2}},
                                                         {"pattern": "^x"}]}}))
    .unwrap_err();
    assert!(err.to_string().contains("propertyNames"), "{err}");
    assert!(err.to_string().contains("`if`"), "{err}");
    let err = compile(&json!({"type": "object", "propertyNames": {"format": "idn-hostname"}}))
        .unwrap_err();
    assert!(err.to_string().contains("idn-hostname"), "{err}");
}

#[test]
fn formats_on_keys() {
    // The draft-07 meta-schema's `patternProperties`: every key is a regex.
    check(
        json!({"type": "object", "propertyNames": {"format": "regex"},
               "additionalProperties": {"type": "integer"}}),
        &["{}", r#"{"^a+$":1}"#, r#"{"[0-9]{2}":2,"x|y":3}"#],
        &[r#"{"(a":1}"#, r#"{"[z-a]":1}"#, r#"{"a**":1}"#],
    );
    // A key that is an e-mail address or the literal `default`.
    check(
        json!({"type": "object", "additionalProperties": {"type": "boolean"},
               "propertyNames": {"anyOf": [{"format": "email"}, {"const": "default"}]}}),
        &["{}", r#"{"a@b.io":true,"default":false}"#],
        &[r#"{"a":true}"#, r#"{"a@":true}"#, r#"{"defaults":true}"#],
    );
}

#[test]
fn excluded_key_patterns_stop_the_key_automaton_only_for_good() {
    // A key containing `tmp` is out for good; one ending in `_x` only while nothing follows,
    // and `ab\b` only while no word character follows.
    check(
        json!({"type": "object", "propertyNames": {"not": {"anyOf": [
            {"pattern": "tmp"}, {"pattern": "_x$"}, {"pattern": "ab\\b"}]}}}),
        &[r#"{"a_xy":1}"#, r#"{"abc":1}"#, r#"{"ok":1,"b":2}"#],
        &[
            r#"{"my_tmp_key":1}"#,
            r#"{"tmp":1}"#,
            r#"{"a_x":1}"#,
            r#"{"ab":1}"#,
            r#"{"ab-c":1}"#,
        ],
    );
    for (p, valid, invalid) in [
        ("tmp", r#"{"tm":1,"mp":2}"#, r#"{"a":1,"xtmpx":2}"#),
        ("_x$", r#"{"a_xy":1}"#, r#"{"a_x":1}"#),
        ("ab\\b", r#"{"abc":1}"#, r#"{"ab.":1}"#),
    ] {
        check(
            json!({"type": "object", "propertyNames": {"not": {"pattern": p}}}),
            &[valid],
            &[invalid],
        );
    }
}
