//! Complements that widen coverage: `not`/`oneOf`/`if` over `propertyNames`,
//! `patternProperties` with constraining schemas, and excluded strings beside other string
//! keywords. For each schema, listed valid texts are accepted and listed invalid texts
//! rejected (byte vocabulary, compact policy), including adversarial near misses.

mod common;

use common::{accepts_text as accepts, check, compile_bytes as compile};
use serde_json::json;
use sglrs_grammar::CompileError;

#[test]
fn not_property_names_pattern_needs_a_key_outside_it() {
    check(
        json!({"type": "object", "not": {"propertyNames": {"pattern": "^[a-z]+$"}}}),
        &[
            r#"{"A":1}"#,
            r#"{"a":1,"B1":2}"#,
            r#"{"":0}"#,
            r#"{"a b":null}"#,
        ],
        &["{}", r#"{"a":1}"#, r#"{"abc":1,"d":2}"#, "1", "\"A\""],
    );
}

#[test]
fn not_property_names_on_declared_keys() {
    // Declared keys are witnesses too; `additionalProperties: false` leaves only them.
    check(
        json!({"properties": {"ok": {}, "Bad": {}}, "additionalProperties": false,
               "not": {"propertyNames": {"pattern": "^[a-z]+$"}}}),
        &[r#"{"Bad":1}"#, r#"{"ok":1,"Bad":2}"#],
        &["{}", r#"{"ok":1}"#, r#"{"zz":1}"#],
    );
}

#[test]
fn not_property_names_length_enum_and_type() {
    check(
        json!({"type": "object", "not": {"propertyNames": {"maxLength": 2}}}),
        &[r#"{"abc":1}"#, r#"{"a":1,"éèà":2}"#],
        &["{}", r#"{"ab":1}"#, r#"{"é":1,"xy":2}"#],
    );
    check(
        json!({"type": "object", "not": {"propertyNames": {"minLength": 2}}}),
        &[r#"{"a":1}"#, r#"{"":1}"#, r#"{"ab":1,"é":2}"#],
        &["{}", r#"{"ab":1}"#, r#"{"éè":1}"#],
    );
    check(
        json!({"type": "object", "not": {"propertyNames": {"enum": ["x", "y"]}}}),
        &[r#"{"z":1}"#, r#"{"x":1,"xy":2}"#],
        &["{}", r#"{"x":1}"#, r#"{"x":1,"y":2}"#],
    );
    check(
        json!({"type": "object", "not": {"propertyNames": {"type": "number"}}}),
        &[r#"{"z":1}"#],
        &["{}"],
    );
    // Two key conditions: some key fails one of them.
    check(
        json!({"type": "object", "not": {"propertyNames": {"pattern": "^a", "maxLength": 3}}}),
        &[r#"{"b":1}"#, r#"{"abcd":1}"#, r#"{"ab":1,"x":2}"#],
        &["{}", r#"{"ab":1}"#, r#"{"a":1,"abc":2}"#],
    );
    // Excluded names: some key among them.
    check(
        json!({"type": "object", "not": {"propertyNames": {"not": {"enum": ["x", "y"]}}}}),
        &[r#"{"x":1}"#, r#"{"a":1,"y":2}"#],
        &["{}", r#"{"a":1}"#, r#"{"xx":1}"#],
    );
}

#[test]
fn one_of_with_property_names_branches() {
    // Branch 0: keys are lower case; branch 1: at most 2 properties. An object with both
    // lower-case keys and ≤ 2 properties matches both, so it is invalid.
    check(
        json!({"type": "object", "oneOf": [
            {"propertyNames": {"pattern": "^[a-z]+$"}},
            {"maxProperties": 2}
        ]}),
        &[r#"{"a":1,"b":2,"c":3}"#, r#"{"A":1}"#, r#"{"A":1,"b":2}"#],
        &[
            "{}",
            r#"{"a":1}"#,
            r#"{"a":1,"b":2}"#,
            r#"{"A":1,"B":2,"C":3}"#,
        ],
    );
}

#[test]
fn not_property_names_not_pattern_needs_a_matching_key() {
    // "Some key matches a1" and "some key matches b2", keys of 4 characters, one property.
    check(
        json!({"type": "object", "allOf": [
            {"not": {"propertyNames": {"not": {"pattern": "a1"}}}},
            {"not": {"propertyNames": {"not": {"pattern": "b2"}}}},
            {"propertyNames": {"pattern": "^....$"}},
            {"maxProperties": 1}
        ]}),
        &[r#"{"a1b2":1}"#, r#"{"b2a1":{}}"#],
        &[
            "{}",
            r#"{"a1xx":1}"#,
            r#"{"a1b2x":1}"#,
            r#"{"a1xx":1,"b2yy":2}"#,
        ],
    );
    // Up to four such conditions at once, over declared and undeclared keys.
    check(
        json!({"type": "object", "properties": {"ab": {"type": "integer"}}, "allOf": [
            {"not": {"propertyNames": {"not": {"pattern": "a"}}}},
            {"not": {"propertyNames": {"not": {"pattern": "b"}}}},
            {"not": {"propertyNames": {"not": {"pattern": "c"}}}},
            {"not": {"propertyNames": {"not": {"pattern": "d"}}}}
        ]}),
        &[
            r#"{"ab":1,"cd":2}"#,
            r#"{"abcd":1}"#,
            r#"{"ab":1,"c":2,"d":3}"#,
        ],
        &[
            "{}",
            r#"{"ab":1}"#,
            r#"{"ab":1,"c":2}"#,
            r#"{"ab":"x","cd":2}"#,
        ],
    );
}

#[test]
fn complement_of_a_false_pattern_property_is_a_matching_key() {
    check(
        json!({"type": "object", "not": {"patternProperties": {"^x": false}}}),
        &[r#"{"x":1}"#, r#"{"a":1,"xy":2}"#],
        &["{}", r#"{"a":1}"#, r#"{"ax":1}"#],
    );
    // As a condition: a key starting with x needs `y` too; no such key, `z`.
    check(
        json!({"type": "object",
               "if": {"not": {"patternProperties": {"^x": false}}},
               "then": {"required": ["y"]}, "else": {"required": ["z"]}}),
        &[r#"{"x":1,"y":2}"#, r#"{"z":1}"#, r#"{"xa":1,"y":2,"z":3}"#],
        &["{}", r#"{"x":1}"#, r#"{"x":1,"z":2}"#, r#"{"y":1}"#],
    );
}

#[test]
fn multiple_of_any_decimal_divisor() {
    check(
        json!({"type": "integer", "multipleOf": 3}),
        &["0", "3", "-3", "999", "123456789012"],
        &["1", "-4", "1000", "3.0", "\"3\""],
    );
    check(
        json!({"type": "number", "multipleOf": 2.5, "minimum": -10, "maximum": 10}),
        &["0", "2.5", "-7.5", "10", "5.0", "7.50"],
        &["1", "2.4", "12.5", "-12.5", "2.51", "0.25"],
    );
    check(
        json!({"type": "number", "multipleOf": 0.01}),
        &["1", "1.5", "1.25", "-0.07", "3.140"],
        &["1.255", "0.001", "-0.0001"],
    );
}

#[test]
fn multiple_of_merged_and_negated() {
    // allOf of two divisors: multiples of both (lcm of 6.75 and 4.5 = 13.5).
    check(
        json!({"allOf": [{"type": "number", "multipleOf": 6.75}, {"multipleOf": 4.5}]}),
        &["0", "13.5", "-27", "40.50"],
        &["6.75", "4.5", "20.25", "13.4", "13.55"],
    );
    // A common multiple too large to enforce is refused, naming the keyword.
    let e = compile(&json!({"allOf": [{"multipleOf": 99991}, {"multipleOf": 99989}]}));
    assert!(
        matches!(&e, Err(CompileError::Unsupported { keyword, .. }) if keyword == "multipleOf"),
        "{:?}",
        e.err()
    );
    // not multipleOf: integers that are not multiples of 2, 3 or 5.
    check(
        json!({"type": "integer", "minimum": 1, "maximum": 50,
               "not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 3}, {"multipleOf": 5}]}}),
        &["1", "7", "49", "11", "13"],
        &["2", "3", "5", "30", "0", "51", "-7"],
    );
    // oneOf with overlapping divisors: exactly one.
    check(
        json!({"type": "integer", "oneOf": [{"multipleOf": 2}, {"multipleOf": 3}]}),
        &["2", "3", "4", "9", "-8"],
        &["6", "12", "0", "1", "5", "-6"],
    );
    // Numbers: not a multiple of 0.5 includes finer fractions.
    check(
        json!({"type": "number", "not": {"multipleOf": 0.5}}),
        &["0.25", "1.1", "-3.75", "0.001"],
        &["0", "1", "1.5", "-2.50", "\"x\""],
    );
}

#[test]
fn one_of_with_exact_and_unknown_formats() {
    // ipv4 and uuid are enforced exactly, so their complements are exact.
    check(
        json!({"type": "string", "oneOf": [{"format": "ipv4"}, {"pattern": "^1"}]}),
        &["\"10\"", "\"1x\"", "\"2.3.4.5\"", "\"255.255.255.255\""],
        &["\"1.2.3.4\"", "\"100.0.0.1\"", "\"x\"", "\"256.1.1.1\""],
    );
    check(
        json!({"type": "string", "oneOf": [{"format": "uuid"}, {"pattern": "^[0-9a-f-]+$"}]}),
        &["\"0-1\"", "\"ABCDEF01-2345-6789-ABCD-EF0123456789\""],
        &["\"abcdef01-2345-6789-abcd-ef0123456789\"", "\"xyz\""],
    );
    // An unknown format is an annotation: it has nothing to negate.
    check(
        json!({"type": "string", "oneOf": [{"maxLength": 0}, {"format": "html-selector", "minLength": 1}]}),
        &["\"\"", "\"a\"", "\"div > p\""],
        &["1"],
    );
    // date-time and time are enforced stricter than RFC 3339 (no leap second); their
    // complement leaves out every RFC text, leap seconds included: a leap second that also
    // matches the other branch is refused, not taken for "not a date-time".
    check(
        json!({"type": "string", "oneOf": [{"format": "date-time"}, {"pattern": "^2"}]}),
        &[
            "\"1999-01-01T00:00:00Z\"",
            "\"2x\"",
            "\"2026-02-29T00:00:00Z\"",
            "\"20:61\"",
        ],
        &[
            "\"2026-01-01T00:00:00Z\"",
            "\"2998-12-31T23:59:60Z\"",
            "\"2016-12-31t23:59:60.5+01:00\"",
            "\"x\"",
        ],
    );
    check(
        json!({"type": "string", "oneOf": [{"format": "time"}, {"maxLength": 8}]}),
        &[
            "\"12:00:00Z\"",
            "\"12:00:00z\"",
            "\"12:00:00.12345+05:30\"",
            "\"23:59:60\"",
        ],
        &[
            "\"23:59:60Z\"",
            "\"12:00:60+01:00\"",
            "\"24:00:00Z\"",
            "\"1234567890\"",
        ],
    );
    // email: the complement is text without an `@` between two non-empty parts, so
    // addresses the format itself refuses (quoted local parts) stay refused either way.
    check(
        json!({"type": "string", "oneOf": [{"format": "email"}, {"minLength": 6}]}),
        &["\"a@b.c\"", "\"abcdef\"", "\"@abcde\"", "\"abcde@\""],
        &[
            "\"ab@cd.ef\"",
            "\"\\\"a b\\\"@example.com\"",
            "\"a@b\"",
            "\"ab\"",
        ],
    );
}

#[test]
fn excluded_strings_beside_format_and_length() {
    check(
        json!({"type": "string", "format": "ipv4", "not": {"enum": ["0.0.0.0", "127.0.0.1"]}}),
        &["\"1.2.3.4\"", "\"127.0.0.2\"", "\"0.0.0.1\""],
        &["\"0.0.0.0\"", "\"127.0.0.1\"", "\"1.2.3\"", "\"x\""],
    );
    check(
        json!({"type": "string", "minLength": 2, "maxLength": 3, "not": {"enum": ["ab", "xyz"]}}),
        &["\"ac\"", "\"xy\"", "\"éèà\"", "\"a\\nb\""],
        &["\"ab\"", "\"xyz\"", "\"a\"", "\"abcd\"", "\"\""],
    );
    check(
        json!({"type": "string", "pattern": "^[a-z]+$", "maxLength": 4,
               "not": {"pattern": "^x"}}),
        &["\"a\"", "\"abcd\"", "\"yx\""],
        &["\"x\"", "\"xa\"", "\"abcde\"", "\"A\"", "\"\""],
    );
}

#[test]
fn not_pattern_properties_needs_a_matching_key_with_a_value_outside() {
    check(
        json!({"type": "object", "not": {"patternProperties": {"^a": {"type": "integer"}}}}),
        &[
            r#"{"a":"x"}"#,
            r#"{"b":1,"ab":null}"#,
            r#"{"a1":1,"a2":[]}"#,
        ],
        &[
            "{}",
            r#"{"a":1}"#,
            r#"{"b":"x"}"#,
            r#"{"a1":1,"a2":2,"c":"s"}"#,
        ],
    );
    // Declared keys are witnesses too.
    check(
        json!({"properties": {"ax": {"type": ["integer", "string"]}, "b": {}},
               "additionalProperties": false,
               "not": {"patternProperties": {"^a": {"type": "integer"}}}}),
        &[r#"{"ax":"s"}"#, r#"{"ax":"s","b":1}"#],
        &["{}", r#"{"ax":1}"#, r#"{"b":"s"}"#, r#"{"ax":1,"b":"s"}"#],
    );
}

#[test]
fn one_of_pattern_properties_branches() {
    // Branch 0: a-keys hold multiples of 10 up to 35; branch 1: up to 40.
    check(
        json!({"type": "object", "oneOf": [
            {"patternProperties": {"a": {"multipleOf": 10, "maximum": 35}}},
            {"patternProperties": {"a": {"multipleOf": 10, "maximum": 40}}}
        ]}),
        &[r#"{"a":40}"#, r#"{"xa":40,"b":1}"#, r#"{"a":10,"ba":40}"#],
        &[
            "{}",
            r#"{"a":30}"#,
            r#"{"a":50}"#,
            r#"{"b":1}"#,
            r#"{"a":15}"#,
        ],
    );
}

#[test]
fn required_key_taken_by_a_pattern_gets_the_patterns_schema() {
    check(
        json!({"patternProperties": {"^[0-9]$": {"type": "array"}},
               "additionalProperties": false, "required": ["1"]}),
        &[r#"{"1":[]}"#, r#"{"1":[1],"2":[]}"#],
        &["{}", r#"{"1":1}"#, r#"{"1":[],"a":[]}"#],
    );
    check(
        json!({"patternProperties": {"^[0-9]$": {"type": "array"}},
               "additionalProperties": {"type": "string"}, "required": ["1"]}),
        &[r#"{"1":[]}"#, r#"{"1":[],"a":"s"}"#],
        &["{}", r#"{"1":"s"}"#, r#"{"1":[],"a":[]}"#],
    );
    // Some key among the names (complement of propertyNames: not enum), closed object.
    check(
        json!({"type": "object", "patternProperties": {"^[0-9]$": {"type": "array", "minItems": 2}},
               "additionalProperties": false, "maxProperties": 2,
               "not": {"anyOf": [{"propertyNames": {"not": {"enum": ["1", "3"]}}},
                                 {"propertyNames": {"not": {"enum": ["2", "3"]}}}]}}),
        &[r#"{"1":[1,2],"2":[3,4]}"#, r#"{"3":[1,2]}"#],
        &[
            r#"{"1":[1,2]}"#,
            r#"{"A":[1,2],"2":[3,4]}"#,
            r#"{"1":[1],"2":[3,4]}"#,
        ],
    );
}

#[test]
fn two_contains_in_all_of_need_an_item_for_each() {
    check(
        json!({"type": "array", "allOf": [
            {"contains": {"type": "integer", "minimum": 10}},
            {"contains": {"type": "string"}}
        ]}),
        &[r#"[10,"a"]"#, r#"["a",1,20]"#, r#"[null,"x",{},11]"#],
        &["[]", "[10]", r#"["a"]"#, r#"[9,"a"]"#, r#"[10,11]"#],
    );
    // One item may satisfy both.
    check(
        json!({"type": "array", "items": {"type": "integer"}, "allOf": [
            {"contains": {"minimum": 5}}, {"contains": {"maximum": 5}}, {"contains": {"multipleOf": 5}}
        ]}),
        &["[5]", "[6,4,10]", "[1,10]", "[0,9]"],
        &["[]", "[6]", "[4,6]", "[4,6,7]", r#"[5,"x"]"#],
    );
    // Complement: an array with no item matching one of them.
    check(
        json!({"type": "array", "not": {"allOf": [
            {"contains": {"type": "integer"}}, {"contains": {"type": "string"}}
        ]}}),
        &["[]", "[1,2]", r#"["a"]"#, "[null]"],
        &[r#"[1,"a"]"#, r#"["b",null,3]"#],
    );
}

#[test]
fn all_of_if_then_blocks_on_one_property_are_one_switch() {
    // Twelve blocks: distributing them would make 2^12 branches.
    let mut blocks = Vec::new();
    for i in 0..12 {
        blocks.push(
            json!({"if": {"properties": {"kind": {"const": format!("k{i}")}}},
                           "then": {"required": [format!("p{i}")]}}),
        );
    }
    blocks.push(
        json!({"if": {"properties": {"kind": {"enum": ["k0", "k1"]}}, "required": ["kind"]},
                       "then": {"required": ["both"]}, "else": {"required": ["other"]}}),
    );
    let schema = json!({"type": "object", "allOf": blocks});
    let g = compile(&schema).unwrap();
    for (text, ok) in [
        (r#"{"kind":"k0","p0":1,"both":2}"#, true),
        (r#"{"kind":"k1","p1":1,"both":2}"#, true),
        (r#"{"kind":"k5","p5":1,"other":0}"#, true),
        (r#"{"kind":"zz","other":0}"#, true),
        (r#"{"kind":"k0","p0":1}"#, false),
        (r#"{"kind":"k5","p5":1}"#, false),
        (r#"{"kind":"k5","other":1}"#, false),
        (r#"{"kind":"zz"}"#, false),
        // Absent: every block without `required` applies its `then`.
        (r#"{"other":1}"#, false),
        (
            r#"{"p0":1,"p1":1,"p2":1,"p3":1,"p4":1,"p5":1,"p6":1,"p7":1,"p8":1,"p9":1,"p10":1,"p11":1,"other":1}"#,
            true,
        ),
    ] {
        assert_eq!(accepts(&g, text), ok, "{text}");
    }
    // Non-objects: the conditions hold vacuously unless they ask for an object.
    check(
        json!({"allOf": [
            {"if": {"properties": {"k": {"const": "a"}}}, "then": {"type": "object"}},
            {"if": {"type": "object", "properties": {"k": {"const": "b"}}}, "then": {"required": ["x"]}}
        ]}),
        &[
            r#"{"x":1}"#,
            r#"{"k":"b","x":0}"#,
            r#"{"k":"a"}"#,
            r#"{"k":"c"}"#,
        ],
        &["{}", "1", "\"s\"", r#"{"k":"b"}"#],
    );
}

#[test]
fn all_of_two_large_any_of_skips_disjoint_pairs() {
    // 12 x 12 branch pairs, all but 12 disjoint by their `kind` constant.
    let side = |extra: &str| {
        let b: Vec<serde_json::Value> = (0..12)
            .map(|i| {
                json!({"type": "object", "required": ["kind", extra],
                            "properties": {"kind": {"const": format!("k{i}")}}})
            })
            .collect();
        json!({ "anyOf": b })
    };
    check(
        json!({"allOf": [side("a"), side("b")]}),
        &[
            r#"{"kind":"k3","a":1,"b":2}"#,
            r#"{"kind":"k11","a":1,"b":2}"#,
        ],
        &[
            r#"{"kind":"k3","a":1}"#,
            r#"{"kind":"k12","a":1,"b":2}"#,
            "{}",
        ],
    );
}

#[test]
fn one_of_objects_told_apart_by_a_discriminator_without_type_object() {
    // Any non-object matches both branches (their keywords are vacuous there): invalid.
    let schema = json!({"oneOf": [
        {"properties": {"type": {"enum": ["solid"]}, "colour": {"type": "string"}},
         "required": ["type", "colour"], "additionalProperties": false},
        {"properties": {"type": {"enum": ["texture"]}, "path": {"type": "string"}},
         "required": ["type", "path"], "additionalProperties": false}
    ]});
    check(
        schema,
        &[
            r#"{"type":"solid","colour":"red"}"#,
            r#"{"type":"texture","path":"p"}"#,
        ],
        &[
            "1",
            "\"s\"",
            "null",
            "[]",
            "{}",
            r#"{"type":"solid","path":"p"}"#,
            r#"{"type":"other","colour":"red"}"#,
        ],
    );
    // A branch that admits one non-object type on its own: that type is exactly-one.
    check(
        json!({"oneOf": [
            {"type": ["object", "string"], "required": ["k"], "properties": {"k": {"const": "a"}}},
            {"type": "object", "required": ["k"], "properties": {"k": {"const": "b"}}}
        ]}),
        &[r#"{"k":"a"}"#, r#"{"k":"b"}"#, "\"s\""],
        &["1", "{}", r#"{"k":"c"}"#, "null"],
    );
}

/// `oneOf` branches no value can match both of need no complement (here of an `email`
/// format): one side requires more keys than the other allows.
#[test]
fn one_of_objects_told_apart_by_property_counts() {
    check(
        json!({"oneOf": [
            {"type": "object", "required": ["type", "url"],
             "properties": {"type": {"type": "string"}, "url": {"type": "string", "format": "email"}}},
            {"type": "object", "maxProperties": 1, "additionalProperties": {"const": false}}
        ]}),
        &[
            r#"{"type":"a","url":"x@y.io"}"#,
            r#"{"type":"a","url":"x@y.io","more":1}"#,
            r#"{"pkg/name":false}"#,
            "{}",
        ],
        &[
            r#"{"type":"a","url":"not an email"}"#,
            r#"{"pkg/name":true}"#,
            r#"{"a":false,"b":false}"#,
            r#"{"type":"a"}"#,
            "[]",
        ],
    );
}

/// The same through a referenced union on one side (Composer's `repositories`: every kind
/// of repository requires two keys, the other branch allows one property): each of its
/// branches is disjoint from the other side, so the whole union is.
#[test]
fn one_of_told_apart_through_the_branches_of_a_referenced_union() {
    let schema = json!({
        "$defs": {
            "repository": {"type": "object", "oneOf": [
                {"required": ["type", "url"],
                 "properties": {"type": {"enum": ["composer"]}, "url": {"type": "string", "format": "email"}}},
                {"required": ["type", "package"],
                 "properties": {"type": {"enum": ["package"]}, "package": {"type": "string"}}}
            ]}
        },
        "type": "array",
        "items": {"oneOf": [
            {"$ref": "#/$defs/repository"},
            {"type": "object", "maxProperties": 1, "additionalProperties": {"const": false}}
        ]}
    });
    check(
        schema,
        &[
            r#"[{"type":"composer","url":"a@b.io"},{"x":false},{"type":"package","package":"p"}]"#,
            "[]",
        ],
        &[
            r#"[{"type":"composer","url":"a"}]"#,
            r#"[{"type":"package","url":"a@b.io"}]"#,
            r#"[{"x":true}]"#,
            r#"[{"type":"composer"}]"#,
        ],
    );
}

/// A wide `oneOf` whose branches all may overlap: each branch takes the complements of all
/// the others as one flat `allOf` (nested one per overlap, 19 levels were past the merge
/// depth and the schema was refused).
#[test]
fn wide_one_of_of_overlapping_branches() {
    let branches: Vec<serde_json::Value> = (0..20)
        .map(|i| json!({"type": "object", "required": [format!("k{i}")]}))
        .collect();
    check(
        json!({"oneOf": branches}),
        &[r#"{"k0":1}"#, r#"{"k19":true,"x":1}"#, r#"{"k7":{}}"#],
        &[
            "{}",
            r#"{"k0":1,"k19":2}"#,
            r#"{"k3":1,"k4":1}"#,
            "[]",
            r#"{"x":1}"#,
        ],
    );
}

/// "Exactly one of these keys": branches that each require one key beside `maxProperties: 1`
/// cannot both match (a value of both would have two properties), whatever their values —
/// no complement of either branch is written.
#[test]
fn one_of_required_keys_beside_max_properties_one() {
    check(
        json!({"type": "object", "maxProperties": 1, "oneOf": [
            {"required": ["when"], "properties": {"when": {"type": "string", "format": "date-time"}}},
            {"required": ["mail"], "properties": {"mail": {"type": "string", "format": "email"}}}
        ]}),
        &[r#"{"when":"2024-01-02T03:04:05Z"}"#, r#"{"mail":"a@b.io"}"#],
        &[
            "{}",
            r#"{"when":"yesterday"}"#,
            r#"{"mail":"a@b.io","when":"2024-01-02T03:04:05Z"}"#,
            r#"{"other":1}"#,
        ],
    );
}

/// A discriminated union (every branch an object requiring `kind` with its own values) is
/// negated in one pass over its branches: a value is outside it when its `kind` is missing
/// or unknown, or when it fails the one branch its `kind` picks. Here under `not` and as a
/// branch complement, with more branches than the general complement of a `oneOf` takes.
#[test]
fn complement_of_a_discriminated_union_of_many_branches() {
    let branches: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            json!({"type": "object", "required": ["kind", "v"],
                   "properties": {"kind": {"enum": [format!("k{i}"), format!("K{i}")]},
                                  "v": {"type": if i % 2 == 0 { "integer" } else { "string" }}}})
        })
        .collect();
    for kw in ["oneOf", "anyOf"] {
        check(
            json!({"not": {kw: branches.clone()}}),
            &[
                "1",
                "\"k0\"",
                "{}",
                r#"{"v":1}"#,
                r#"{"kind":"k10","v":1}"#,
                r#"{"kind":"k0","v":"x"}"#,
                r#"{"kind":"K3","v":3}"#,
                r#"{"kind":"k9"}"#,
                r#"{"kind":1,"v":1}"#,
            ],
            &[
                r#"{"kind":"k0","v":1}"#,
                r#"{"kind":"K3","v":"x"}"#,
                r#"{"v":"y","kind":"k9","extra":null}"#,
            ],
        );
    }
    // Inside a `oneOf` branch whose complement the other branch needs.
    check(
        json!({"oneOf": [
            {"type": "object", "properties": {"item": {"oneOf": branches}}},
            {"type": "object", "required": ["id"]}
        ]}),
        &[
            r#"{"item":{"kind":"k2","v":2}}"#,
            r#"{"item":{"kind":"k2","v":"two"},"id":1}"#,
            r#"{"item":{"kind":"k99","v":2},"id":1}"#,
            r#"{"item":3,"id":1}"#,
            "{}",
        ],
        &[
            r#"{"item":{"kind":"k2","v":2},"id":1}"#,
            r#"{"id":1}"#,
            r#"{"item":{"kind":"k2","v":"two"}}"#,
            r#"{"item":{"kind":"k2"}}"#,
        ],
    );
}

/// The complement of an `enum` beside a `type` stays within that type (excluded numbers
/// need a numeric type): here a `oneOf` branch's property.
#[test]
fn complement_of_a_typed_enum() {
    check(
        json!({"type": "object", "oneOf": [
            {"properties": {"n": {"type": "number", "enum": [1, 2]}}},
            {"required": ["m"]}
        ]}),
        &[
            r#"{"n":1}"#,
            r#"{"n":3,"m":1}"#,
            r#"{"n":"x","m":1}"#,
            r#"{"n":2.5,"m":1}"#,
        ],
        &[
            r#"{"m":1}"#,
            r#"{"n":2,"m":1}"#,
            r#"{"n":2.0,"m":1}"#,
            r#"{"n":3}"#,
        ],
    );
}

/// `within and not other` with `other`'s constraints that `within` repeats left out: the
/// same values as the full complement (shared properties, shared `required` keys, closed
/// objects with different names).
#[test]
fn one_of_branches_sharing_properties() {
    check(
        json!({"oneOf": [
            {"type": "object", "required": ["a"],
             "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
            {"type": "object", "required": ["a"],
             "properties": {"a": {"type": "integer"}, "c": {"type": "boolean"}}}
        ]}),
        &[
            r#"{"a":1,"b":2}"#,
            r#"{"a":1,"c":1}"#,
            r#"{"a":1,"b":"x","c":3}"#,
        ],
        &[
            r#"{"a":1}"#,
            r#"{"a":1,"b":"x","c":true}"#,
            r#"{"a":"x"}"#,
            r#"{"b":"x"}"#,
            r#"{"a":1,"b":1,"c":1}"#,
        ],
    );
    check(
        json!({"oneOf": [
            {"type": "object", "additionalProperties": false,
             "properties": {"a": {"type": "integer"}, "b": {}}},
            {"type": "object", "additionalProperties": false,
             "properties": {"a": {"type": "integer"}, "c": {}}}
        ]}),
        &[r#"{"b":1}"#, r#"{"c":1}"#, r#"{"a":1,"b":null}"#],
        &[
            "{}",
            r#"{"a":1}"#,
            r#"{"d":1}"#,
            r#"{"b":1,"c":1}"#,
            r#"{"a":"x","b":1}"#,
        ],
    );
    // The same bound on both sides, and one that differs.
    check(
        json!({"type": "integer", "oneOf": [
            {"minimum": 0, "maximum": 10},
            {"minimum": 0, "multipleOf": 4}
        ]}),
        &["1", "10", "12", "16"],
        &["0", "4", "8", "-4", "-1"],
    );
}

/// Strings longer than the enforced counts (4,096 characters) are left out of a `maxLength`
/// complement: stricter than the schema for values that long, never looser.
#[test]
fn complement_of_a_maximum_length_above_the_counts() {
    let long = format!("\"{}\"", "b".repeat(5001));
    check(
        json!({"type": "string", "oneOf": [{"maxLength": 5000}, {"pattern": "^a"}]}),
        &["\"b\"", "\"\""],
        &["\"a\"", "\"abc\"", &long],
    );
}

/// `if` without `then` needs no complement of its condition: `if or else`; without `then`
/// and `else` it says nothing. (Untyped excluded numbers have no complement here.)
#[test]
fn if_without_then() {
    check(
        json!({"if": {"const": 0}}),
        &["0", "1", "\"x\"", "1e5"],
        &["x"],
    );
    check(
        json!({"if": {"const": 0}, "else": {"type": "string"}}),
        &["0", "\"x\""],
        &["1", "null", "[]"],
    );
    check(
        json!({"allOf": [
            {"if": {"const": 0}, "else": {"type": "string"}},
            {"if": {"type": "string"}, "then": {"minLength": 2}}
        ]}),
        &["0", "\"xy\""],
        &["1", "\"x\""],
    );
}

/// `then`/`else` without an `if` in their own schema say nothing, also beside an `if` in
/// another part of an `allOf`.
#[test]
fn then_and_else_pair_only_with_their_own_if() {
    check(
        json!({"allOf": [
            {"type": "integer"},
            {"if": {"exclusiveMaximum": 0}},
            {"then": {"minimum": -10}},
            {"else": {"multipleOf": 2}}
        ]}),
        &["-100", "3", "0"],
        &["\"x\"", "[]", "1.5"],
    );
}

/// A union discriminated by literal patterns (`"pattern": "^SEQ$"` on a string, as
/// tree-sitter's grammar schema writes its rule kinds) is told apart and negated like one
/// discriminated by `const`.
#[test]
fn union_discriminated_by_literal_patterns() {
    let kinds = [
        "ALIAS", "BLANK", "SEQ", "CHOICE", "REPEAT", "TOKEN", "FIELD", "PREC",
    ];
    let branches: Vec<serde_json::Value> = kinds
        .iter()
        .map(|k| {
            json!({"type": "object", "required": ["type", "n"],
                   "properties": {"type": {"type": "string", "pattern": format!("^{k}$")},
                                  "n": {"type": "integer"}}})
        })
        .collect();
    check(
        json!({"not": {"oneOf": branches.clone()}}),
        &[
            r#"{"type":"ALIASX","n":1}"#,
            r#"{"type":"SEQ","n":"x"}"#,
            r#"{"type":"SEQ"}"#,
            "[]",
        ],
        &[r#"{"type":"SEQ","n":1}"#, r#"{"type":"PREC","n":-3}"#],
    );
    check(
        json!({"oneOf": [
            {"type": "object", "properties": {"rule": {"oneOf": branches}}},
            {"type": "object", "required": ["name"]}
        ]}),
        &[
            r#"{"rule":{"type":"SEQ","n":1}}"#,
            r#"{"rule":{"type":"SEQ"},"name":"x"}"#,
        ],
        &[
            r#"{"rule":{"type":"SEQ","n":1},"name":"x"}"#,
            r#"{"name":"x"}"#,
        ],
    );
}
