//! JSON Schema keywords: for each schema, listed valid texts are accepted and listed
//! invalid texts rejected (byte vocabulary, compact policy), so an enforcement that loosens
//! or over-tightens a keyword fails here.

mod common;

use common::{accepts_text as accepts, check, compile_bytes as compile};
use serde_json::json;
use sglrs_grammar::CompileOptions;

#[test]
fn double_not_is_the_schema() {
    check(
        json!({"not": {"not": {"type": "integer", "minimum": 3}}}),
        &["3", "17"],
        &["2", "\"x\"", "null"],
    );
}

#[test]
fn not_required_admits_objects_without_the_key_only() {
    check(
        json!({"not": {"required": ["a"]}}),
        &["{}", r#"{"b":1}"#],
        &[r#"{"a":1}"#, "\"s\"", "1", "null"],
    );
}

#[test]
fn not_enum_excludes_strings_and_literals() {
    check(
        json!({"type": ["string", "boolean", "null"], "not": {"enum": ["a", "bc", false, null]}}),
        &["\"b\"", "\"abc\"", "\"\"", "true"],
        &["\"a\"", "\"bc\"", "false", "null"],
    );
}

#[test]
fn not_of_a_general_schema_is_its_complement() {
    // not (object with a:string required) = non-objects, objects without a, a not a string.
    check(
        json!({"type": ["object", "integer"], "not": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}),
        &["1", "{}", r#"{"a":1}"#, r#"{"b":"x"}"#],
        &[r#"{"a":"x"}"#, "\"s\""],
    );
    check(
        json!({"type": "integer", "not": {"minimum": 10}}),
        &["9", "-4"],
        &["10", "11"],
    );
}

#[test]
fn two_nots_in_all_of_are_both_enforced() {
    check(
        json!({"type": "string", "allOf": [{"not": {"const": "a"}}, {"not": {"const": "b"}}]}),
        &["\"c\"", "\"ab\""],
        &["\"a\"", "\"b\""],
    );
}

#[test]
fn overlapping_one_of_excludes_values_matching_two_branches() {
    // Both branches accept {"a":1,"b":2}: oneOf rejects it.
    let s = json!({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]});
    check(
        s,
        &[r#"{"a":1}"#, r#"{"b":2}"#],
        &[r#"{"a":1,"b":2}"#, "{}"],
    );
    check(
        json!({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]}),
        &["-5", "11", "100"],
        &["0", "5", "10"],
    );
}

#[test]
fn if_then_else_on_a_discriminator() {
    let s = json!({
        "type": "object",
        "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "num"}}},
        "then": {"required": ["n"]},
        "else": {"not": {"required": ["n"]}}
    });
    check(
        s,
        &[r#"{"kind":"num","n":1}"#, r#"{"kind":"txt"}"#],
        &[r#"{"kind":"num"}"#, r#"{"kind":"txt","n":1}"#],
    );
}

#[test]
fn dependencies_and_dependent_required() {
    let s = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        "dependencies": {"a": ["b"], "c": {"properties": {"a": {"minimum": 5}}}}
    });
    check(
        s,
        &[
            "{}",
            r#"{"b":1}"#,
            r#"{"a":1,"b":2}"#,
            r#"{"a":5,"b":1,"c":0}"#,
            r#"{"c":1}"#,
        ],
        &[r#"{"a":1}"#, r#"{"a":4,"b":1,"c":0}"#],
    );
    check(
        json!({"type": "object", "dependentRequired": {"x": ["y"]}}),
        &[r#"{"x":1,"y":2}"#, r#"{"y":2}"#],
        &[r#"{"x":1}"#],
    );
}

/// Past six dependencies on key presence (and on a discriminator's listed values) the
/// schema compiles, and every combination of keys and discriminator values is accepted
/// exactly when each dependency holds (checked here directly, not through the compiler).
#[test]
fn many_dependencies_on_key_presence_are_enforced_exactly() {
    let keys = [
        "t",
        "begin",
        "end",
        "while",
        "name",
        "captures",
        "endCaptures",
        "last",
    ];
    let mut properties = serde_json::Map::new();
    properties.insert("t".into(), json!({"enum": ["x", "y", "z"]}));
    for k in &keys[1..] {
        properties.insert(k.to_string(), json!({"type": "integer"}));
    }
    let s = json!({
        "type": "object",
        "properties": properties,
        "additionalProperties": false,
        "dependencies": {
            "begin": {"anyOf": [{"required": ["end"]}, {"required": ["while"]}]},
            "end": ["begin"],
            "while": {"allOf": [{"required": ["begin"]}, {"not": {"required": ["end"]}}]},
            "name": {"oneOf": [{"required": ["end"]}, {"required": ["while"]}]},
            "captures": {"properties": {"t": {"enum": ["x", "y"]}}},
            "endCaptures": ["begin", "end"],
            "last": {"properties": {"t": {"const": "y"}}, "required": ["end"]},
        }
    });
    let valid = |has: &dyn Fn(&str) -> bool, t: Option<&str>| {
        (!has("begin") || has("end") || has("while"))
            && (!has("end") || has("begin"))
            && (!has("while") || (has("begin") && !has("end")))
            && (!has("name") || (has("end") != has("while")))
            && (!has("captures") || matches!(t, None | Some("x" | "y")))
            && (!has("endCaptures") || (has("begin") && has("end")))
            && (!has("last") || (matches!(t, None | Some("y")) && has("end")))
    };
    for opts in [CompileOptions::default(), common::schema_order()] {
        let g = common::compile_bytes_with(&s, &opts).unwrap();
        let mut accepted = 0;
        for t in [None, Some("x"), Some("y"), Some("z")] {
            for bits in 0..1u32 << (keys.len() - 1) {
                let has = |k: &str| {
                    let i = keys[1..].iter().position(|x| *x == k).unwrap();
                    bits >> i & 1 == 1
                };
                let mut fields: Vec<String> =
                    t.map(|t| format!(r#""t":"{t}""#)).into_iter().collect();
                fields.extend(
                    keys[1..]
                        .iter()
                        .filter(|k| has(k))
                        .map(|k| format!(r#""{k}":1"#)),
                );
                let text = format!("{{{}}}", fields.join(","));
                let want = valid(&has, t);
                assert_eq!(accepts(&g, &text), want, "{text}");
                accepted += want as usize;
            }
        }
        assert!(
            accepted > 20,
            "too few valid combinations to mean much: {accepted}"
        );
    }
}

#[test]
fn enum_beside_unknown_keywords_compiles() {
    check(
        json!({"_id": "x", "enum": ["A", "B"], "x-extra": {"minimum": 3}}),
        &["\"A\""],
        &["\"C\""],
    );
}

#[test]
fn enum_filtered_by_sibling_keywords() {
    check(
        json!({"enum": [1, 5, "abc", "toolong"], "maxLength": 3, "minimum": 2}),
        &["5", "\"abc\""],
        &["1", "\"toolong\""],
    );
}

#[test]
fn recursive_ref_through_all_of_compiles() {
    let s = json!({
        "definitions": {"item": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"allOf": [{"$ref": "#/definitions/item"}]}}
        }, "additionalProperties": false}},
        "allOf": [{"$ref": "#/definitions/item"}]
    });
    check(
        s,
        &[r#"{"children":[{"children":[]}]}"#],
        &[r#"{"children":[{"x":1}]}"#],
    );
}

#[test]
fn very_deep_schema_is_an_error_not_a_crash() {
    let mut s = json!({"type": "integer"});
    for _ in 0..2000 {
        s = json!({"type": "array", "items": s});
    }
    // Run on a small stack like a cache worker's.
    let r = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || compile(&s).map(|_| ()))
        .unwrap()
        .join()
        .unwrap();
    assert!(r.is_err());
}

#[test]
fn min_and_max_properties_count_declared_and_undeclared_keys() {
    let s = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "minProperties": 2});
    check(
        s,
        &[
            r#"{"a":1,"b":2}"#,
            r#"{"a":1,"x":2}"#,
            r#"{"x":1,"y":2,"z":3}"#,
        ],
        &["{}", r#"{"a":1}"#, r#"{"x":1}"#],
    );
    let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "maxProperties": 2,
                   "minProperties": 1});
    check(
        s,
        &[r#"{"a":1}"#, r#"{"a":1,"x":2}"#, r#"{"x":1,"y":2}"#],
        &["{}", r#"{"a":1,"x":2,"y":3}"#, r#"{"x":1,"y":2,"z":3}"#],
    );
    // maxProperties below the required count: nothing is valid.
    assert!(
        compile(&json!({"type": "object", "required": ["a", "b"], "maxProperties": 1})).is_err()
    );
}

#[test]
fn decimal_bounds_and_multiple_of() {
    check(
        json!({"type": "number", "minimum": 0.5, "exclusiveMaximum": 2.25}),
        &["0.5", "1", "2.249", "2.2"],
        &["0.49", "2.25", "2.3", "-1", "3"],
    );
    check(
        json!({"type": "number", "multipleOf": 0.01, "minimum": 0}),
        &["0", "1.5", "2.25", "3.100"],
        &["1.255", "-0.01", "0.001"],
    );
    check(
        json!({"type": "number", "multipleOf": 1}),
        &["3", "-4", "2.0"],
        &["2.5"],
    );
    check(
        json!({"type": "integer", "multipleOf": 0.1}),
        &["3"],
        &["3.5"],
    );
}

#[test]
fn negative_zero_is_not_below_zero() {
    for s in [
        json!({"type": "number", "exclusiveMaximum": 0}),
        json!({"type": "number", "exclusiveMaximum": 0.5, "exclusiveMinimum": 0}),
    ] {
        let g = compile(&s).unwrap();
        for t in ["-0", "-0.0"] {
            assert!(!accepts(&g, t), "{s} accepts {t}");
        }
    }
}

#[test]
fn decimal_bounds_on_multi_digit_numbers() {
    check(
        json!({"type": "number", "minimum": 0.5, "maximum": 5000.5}),
        &["10.99", "100", "1000.5", "5000.5", "5000"],
        &["5000.51", "0.4"],
    );
    check(
        json!({"type": "number", "multipleOf": 0.01}),
        &["10.99", "100", "-12.5"],
        &["10.999"],
    );
}

#[test]
fn one_of_through_nested_one_of_types_is_disjoint() {
    let s = json!({"definitions": {
            "a": {"oneOf": [{"type": "string"}, {"type": "array"}]},
            "b": {"oneOf": [{"type": "object"}, {"type": "integer"}]}},
        "oneOf": [{"$ref": "#/definitions/a"}, {"$ref": "#/definitions/b"}]});
    check(s, &["\"x\"", "[]", "{}", "3"], &["null", "true"]);
}

#[test]
fn property_names_constrain_declared_and_undeclared_keys() {
    check(
        json!({"type": "object", "propertyNames": {"type": "string"}}),
        &[r#"{"a":1}"#],
        &["[]"],
    );
    check(
        json!({"type": "object", "properties": {"ok": {}, "Bad": {}},
               "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}}),
        &[r#"{"ok":1}"#, r#"{"abc":1}"#, "{}"],
        &[r#"{"Bad":1}"#, r#"{"abcd":1}"#, r#"{"A":1}"#],
    );
    check(
        json!({"type": "object", "propertyNames": {"not": {"enum": ["x", "y"]}}}),
        &[r#"{"z":1}"#, r#"{"xy":1}"#],
        &[r#"{"x":1}"#, r#"{"z":1,"y":2}"#],
    );
}

#[test]
fn all_of_with_two_ifs_and_two_one_ofs() {
    let s = json!({"type": "object",
        "properties": {"a": {}, "b": {}, "c": {}, "d": {}}, "allOf": [
        {"if": {"required": ["a"]}, "then": {"required": ["b"]}},
        {"if": {"required": ["c"]}, "then": {"required": ["d"]}},
    ]});
    check(
        s,
        &[
            "{}",
            r#"{"a":1,"b":1}"#,
            r#"{"c":1,"d":1}"#,
            r#"{"a":1,"b":1,"c":1,"d":1}"#,
        ],
        &[r#"{"a":1}"#, r#"{"c":1}"#, r#"{"a":1,"b":1,"c":1}"#],
    );
    let s = json!({"type": "integer", "allOf": [
        {"oneOf": [{"minimum": 5}, {"maximum": 10}]},
        {"oneOf": [{"minimum": 0}, {"maximum": -1}]},
    ]});
    // First: x < 5 or x > 10; second: always exactly one.
    check(s, &["4", "11", "-3"], &["5", "10", "7"]);
}

#[test]
fn unique_items_over_small_enums() {
    check(
        json!({"type": "array", "uniqueItems": true, "minItems": 1,
               "items": {"enum": ["a", "b", "c"]}}),
        &[r#"["a"]"#, r#"["c","a"]"#, r#"["b","a","c"]"#],
        &["[]", r#"["a","a"]"#, r#"["a","b","a"]"#, r#"["d"]"#],
    );
    check(
        json!({"type": "array", "uniqueItems": true, "items": {"type": "boolean"}}),
        &["[]", "[true,false]"],
        &["[true,true]", "[false,true,false]"],
    );
}

#[test]
fn long_max_length_strings() {
    let g = compile(&json!({"type": "string", "minLength": 70, "maxLength": 100})).unwrap();
    for n in [69usize, 70, 100, 101] {
        let t = format!("\"{}é\"", "a".repeat(n - 1));
        assert_eq!(accepts(&g, &t), (70..=100).contains(&n), "length {n}");
    }
    assert!(accepts(&g, &format!("\"{}\\n\"", "b".repeat(99))));
}

#[test]
fn properties_in_schema_order_when_asked_in_any_order_by_default() {
    let schema = json!({"type": "object", "additionalProperties": false,
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}});
    common::check_opts(
        &schema,
        &common::schema_order(),
        &[r#"{"a":1,"b":2}"#, r#"{"b":2}"#],
        &[r#"{"b":2,"a":1}"#, r#"{"a":1,"a":2}"#],
    );
    common::check_opts(
        &schema,
        &CompileOptions::default(),
        &[r#"{"a":1,"b":2}"#, r#"{"b":2}"#, r#"{"b":2,"a":1}"#],
        &[r#"{"a":1,"a":2}"#, r#"{"b":2,"a":1,"b":3}"#],
    );
}

#[test]
fn properties_in_any_order_with_required_keys_and_no_repeats() {
    // Closed object: every order of the declared keys, each at most once, required ones
    // present.
    check_any_order(
        json!({"type": "object", "additionalProperties": false,
               "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
               "required": ["a", "c"]}),
        &[
            r#"{"a":1,"c":true}"#,
            r#"{"c":true,"a":1}"#,
            r#"{"b":"x","c":false,"a":2}"#,
            r#"{"c":false,"b":"x","a":2}"#,
        ],
        &[
            r#"{"a":1}"#,
            r#"{"c":true,"b":"x"}"#,
            r#"{"c":true,"a":1,"a":2}"#,
            r#"{"b":"x","a":1,"c":true,"b":"y"}"#,
            r#"{"c":1,"a":1}"#,
            r#"{"a":1,"c":true,"d":1}"#,
            r#"{"a":1,,"c":true}"#,
            r#"{,"a":1,"c":true}"#,
        ],
    );
    // Open object: undeclared keys anywhere, declared ones in any order, counts exact.
    check_any_order(
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
               "required": ["b"], "maxProperties": 3, "minProperties": 2}),
        &[
            r#"{"b":"x","a":1}"#,
            r#"{"z":null,"b":"x"}"#,
            r#"{"b":"x","z":1,"a":1}"#,
            r#"{"z":1,"a":1,"b":"x"}"#,
        ],
        &[
            r#"{"b":"x"}"#,
            r#"{"a":1,"z":1}"#,
            r#"{"b":"x","a":1,"z":1,"y":2}"#,
            r#"{"b":"x","a":"s"}"#,
            r#"{"b":"x","b":"y"}"#,
        ],
    );
}

#[test]
fn recursive_ref_with_sibling_keywords_applies_them_at_each_level() {
    let s = json!({
        "$defs": {"node": {"type": "object", "additionalProperties": false, "properties": {
            "v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node", "required": ["v"]}}}}},
        "$ref": "#/$defs/node", "required": ["kids"]});
    check(
        s,
        &[
            r#"{"kids":[]}"#,
            r#"{"kids":[{"v":1}]}"#,
            r#"{"v":0,"kids":[{"v":1,"kids":[{"v":2}]}]}"#,
        ],
        &[
            "{}",
            r#"{"v":1}"#,
            r#"{"kids":[{"kids":[]}]}"#,
            r#"{"kids":[{"v":1,"kids":[{}]}]}"#,
            r#"{"kids":[{"v":1,"w":2}]}"#,
        ],
    );
    // The same through `allOf`.
    let s = json!({
        "definitions": {"t": {"type": "object", "properties": {
            "n": {"type": "string"},
            "sub": {"allOf": [{"$ref": "#/definitions/t"}, {"required": ["n"]}]}}}},
        "allOf": [{"$ref": "#/definitions/t"}]});
    check(
        s,
        &[
            r#"{}"#,
            r#"{"sub":{"n":"a"}}"#,
            r#"{"sub":{"n":"a","sub":{"n":"b"}}}"#,
        ],
        &[
            r#"{"sub":{}}"#,
            r#"{"sub":{"n":"a","sub":{}}}"#,
            r#"{"sub":{"n":1}}"#,
        ],
    );
}

#[test]
fn contains_needs_one_matching_item() {
    check(
        json!({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}}),
        &["[5]", "[1,2,7]", "[9,0]", "[5,5,5]"],
        &["[]", "[1]", "[1,2,3]", "[\"a\",7]", "[7,\"a\"]"],
    );
    check(
        json!({"type": "array", "prefixItems": [{"type": "string"}], "contains": {"const": 3},
               "maxItems": 3}),
        &["[\"a\",3]", "[\"a\",1,3]"],
        &["[\"a\"]", "[\"a\",1]", "[\"a\",1,2,3]", "[3]"],
    );
}

#[test]
fn one_of_over_item_schemas_uses_their_complements() {
    // Items ≤ 20 or items ≥ 10: [12] and [] match both, so they are invalid.
    check(
        json!({"oneOf": [{"type": "array", "items": {"type": "integer", "maximum": 20}},
                         {"type": "array", "items": {"type": "integer", "minimum": 10}}]}),
        &["[1,2]", "[30]", "[12,1]", "[12,30]"],
        &["[]", "[12]", "[10,20]", "[\"x\"]", "[1,30]"],
    );
    // Tuples: position 1 decides.
    check(
        json!({"oneOf": [{"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
                         {"type": "array", "prefixItems": [{"type": "string"}, {"type": "string"}]}]}),
        &[r#"["a",1]"#, r#"["a","b"]"#, r#"["a",1,null]"#],
        &[r#"["a"]"#, "[]", r#"["a",null]"#],
    );
    // not contains: no matching item.
    check(
        json!({"type": "array", "not": {"contains": {"type": "string"}}}),
        &["[]", "[1,null]"],
        &["[\"a\"]", "[1,\"a\"]"],
    );
}

#[test]
fn tuples_merge_with_the_other_sides_item_schema() {
    // The other side's `items` applies to the tuple positions too.
    check(
        json!({"allOf": [{"type": "array", "prefixItems": [{"type": "number"}]},
                         {"items": {"type": "integer"}}]}),
        &["[]", "[1]", "[1,2]"],
        &["[1.5]", "[\"a\"]", "[1,\"a\"]"],
    );
    check(
        json!({"allOf": [{"type": "array", "items": [{"type": "integer"}], "additionalItems": false},
                         {"items": [{"minimum": 2}, {"type": "string"}]}]}),
        &["[]", "[2]"],
        &["[1]", "[2,\"a\"]"],
    );
}

#[test]
fn one_of_closed_objects_sharing_optional_keys() {
    // {"a":1} matches both closed objects, so it is invalid; "b" or "c" decides.
    let s = json!({"oneOf": [
        {"type": "object", "additionalProperties": false,
         "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
        {"type": "object", "additionalProperties": false,
         "properties": {"a": {"type": "integer"}, "c": {"type": "boolean"}}}]});
    let valid = [
        r#"{"a":1,"b":"x"}"#,
        r#"{"b":"x"}"#,
        r#"{"a":1,"c":true}"#,
        r#"{"c":false}"#,
    ];
    let invalid = [
        "{}",
        r#"{"a":1}"#,
        r#"{"a":1,"b":"x","c":true}"#,
        r#"{"d":1}"#,
        r#"{"b":1}"#,
    ];
    check(s.clone(), &valid, &invalid);
    check_any_order(s, &[r#"{"b":"x","a":1}"#, r#"{"c":true,"a":1}"#], &invalid);
    // Open on one side: undeclared keys are witnesses too.
    check(
        json!({"oneOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            {"type": "object", "additionalProperties": false, "patternProperties": {"^x": {}},
             "properties": {"a": {"type": "integer"}}}]}),
        &[r#"{"a":1,"z":2}"#, r#"{"q":null}"#],
        &["{}", r#"{"a":1}"#, r#"{"x1":1}"#, r#"{"a":1,"xy":2}"#],
    );
    // not: a key outside the declared ones and patterns.
    check(
        json!({"type": "object", "not": {"additionalProperties": false,
               "properties": {"a": {}}, "patternProperties": {"^p": {}}}}),
        &[r#"{"b":1}"#, r#"{"a":1,"q":2}"#],
        &["{}", r#"{"a":1}"#, r#"{"p1":1,"a":2}"#],
    );
}

#[test]
fn not_one_of_is_none_or_two() {
    check(
        json!({"type": "integer", "not": {"oneOf": [{"minimum": 5}, {"maximum": 10}]}}),
        // Valid: matches neither (impossible here) or both: 5..=10.
        &["5", "7", "10"],
        &["4", "11", "0", "100"],
    );
    check(
        json!({"not": {"oneOf": [{"type": "string"}, {"type": "boolean"}]}}),
        &["null", "1.5", "3", "[]", "{}"],
        &["\"a\"", "true"],
    );
}

#[test]
fn numbers_that_are_not_integers() {
    check(
        json!({"type": "number", "not": {"type": "integer"}}),
        &["1.5", "-0.25", "10.01", "0.5"],
        &["1", "1.0", "0", "-3", "2.00", "\"x\""],
    );
    check(
        json!({"type": "number", "minimum": 1, "maximum": 2, "not": {"type": "integer"}}),
        &["1.5", "1.01", "1.999"],
        &["1", "2", "2.5", "0.5", "1.0"],
    );
    // Matches exactly one branch only when not an integer.
    check(
        json!({"oneOf": [{"type": "integer"}, {"type": "number"}]}),
        &["1.5", "-2.75"],
        &["1", "0", "3.0", "\"a\""],
    );
}

#[test]
fn anchors_and_references_through_the_root_id_resolve() {
    // `$anchor` (2019+), a draft-7 `$id: "#name"`, and a reference spelt with the root's `$id`.
    check(
        json!({"$defs": {"n": {"$anchor": "num", "type": "integer", "maximum": 9}},
               "properties": {"a": {"$ref": "#num"}}, "required": ["a"]}),
        &[r#"{"a":3}"#],
        &[r#"{"a":10}"#, r#"{"a":"x"}"#],
    );
    check(
        json!({"$schema": "http://json-schema.org/draft-07/schema#",
               "definitions": {"s": {"$id": "#short", "type": "string", "maxLength": 2}},
               "items": {"$ref": "#short"}, "type": "array"}),
        &[r#"["ab"]"#, "[]"],
        &[r#"["abc"]"#],
    );
    check(
        json!({"$id": "https://example.com/tree.json", "type": "object",
               "properties": {"kids": {"type": "array", "maxItems": 2,
                                       "items": {"$ref": "https://example.com/tree.json#"}},
                              "v": {"$ref": "https://example.com/tree.json#/$defs/v"}},
               "$defs": {"v": {"type": "boolean"}}}),
        &[r#"{"kids":[{"v":true},{"kids":[]}]}"#],
        &[r#"{"v":1}"#, r#"{"kids":[{"v":"x"}]}"#],
    );
    // An anchor inside another resource (its own `$id`) is not the root's.
    let other = json!({"$defs": {"x": {"$id": "https://other.example/x.json",
                                       "$defs": {"y": {"$anchor": "y", "type": "null"}}}},
                       "$ref": "#y"});
    assert!(compile(&other).is_err());
    // Another document stays refused.
    let remote = json!({"$ref": "https://example.com/elsewhere.json#/a"});
    let e = compile(&remote)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("only local references"), "{e}");
}

#[test]
fn draft_meta_schemas_referenced_by_url_resolve_to_bundled_copies() {
    // Swagger 2.0's schema takes its keywords' schemas from the draft-04 meta-schema by URL;
    // a config file's "schema" field is often "any draft-07 schema".
    check(
        json!({"type": "object", "properties": {
            "max": {"$ref": "http://json-schema.org/draft-04/schema#/definitions/positiveInteger"},
            "schema": {"$ref": "https://json-schema.org/draft-07/schema#"}}}),
        &[
            r#"{"max":3}"#,
            r#"{"schema":{"minLength":2,"type":"string"}}"#,
            r#"{"schema":{"properties":{"a":{"items":[{"type":"null"}]}}}}"#,
            r#"{"schema":true}"#,
        ],
        &[
            r#"{"max":-1}"#,
            r#"{"max":1.5}"#,
            r#"{"schema":{"type":"strin"}}"#,
            r#"{"schema":{"minLength":-1}}"#,
            r#"{"schema":{"properties":{"a":{"required":"b"}}}}"#,
        ],
    );
    // The rest of that site and other drafts stay refused like any other remote document.
    for uri in [
        "http://json-schema.org/draft-03/schema#",
        "https://json-schema.org/draft/2020-12/schema",
        "http://json-schema.org/draft-07/hyper-schema#",
    ] {
        let e = compile(&json!({"$ref": uri}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("only local references"), "{uri}: {e}");
    }
}

#[test]
fn min_and_max_contains_count_the_matching_items() {
    let ints = |extra: serde_json::Value| {
        let mut s = json!({"type": "array", "items": {"type": "integer"},
                           "contains": {"type": "integer", "minimum": 5}});
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        s
    };
    check(
        ints(json!({"minContains": 2})),
        &["[5,6]", "[1,5,9]", "[5,5,5]"],
        &["[5]", "[1,2]", "[]"],
    );
    check(
        ints(json!({"maxContains": 1})),
        &["[5]", "[1,5,2]"],
        &["[5,6]", "[1,2]", "[]"],
    );
    check(
        ints(json!({"minContains": 2, "maxContains": 3})),
        &["[5,6]", "[5,1,6,7]"],
        &["[5]", "[5,6,7,8]", "[1,5,2]"],
    );
    check(
        ints(json!({"minContains": 0, "maxContains": 1})),
        &["[]", "[1]", "[5,1]"],
        &["[5,6]"],
    );
    check(
        ints(json!({"minContains": 0})),
        &["[]", "[1,2]", "[7]"],
        &["[\"x\"]"],
    );
    // No array can have at least 2 and at most 1: nothing is valid.
    let none = compile(&ints(json!({"minContains": 2, "maxContains": 1}))).err();
    assert!(none.is_some_and(|e| e.to_string().contains("accepts no text")));
}

#[test]
fn contains_counts_apply_to_their_own_contains_only() {
    // A count beside no `contains` says nothing, also once `allOf` merges it with one.
    let strs = |parts: serde_json::Value| json!({"type": "array", "items": {"type": "string"}, "allOf": parts});
    check(
        strs(json!([{"contains": {"const": "a"}}, {"minContains": 0}])),
        &[r#"["a"]"#, r#"["b","a"]"#],
        &["[]", r#"["b"]"#],
    );
    check(
        strs(json!([{"contains": {"const": "a"}, "minContains": 2}, {"maxContains": 1}])),
        &[r#"["a","a"]"#, r#"["a","b","a","a"]"#],
        &[r#"["a"]"#, r#"["a","b"]"#],
    );
    // The same `contains` on both sides: the bounds meet.
    check(
        strs(json!([{"contains": {"const": "a"}, "minContains": 2},
                    {"contains": {"const": "a"}, "maxContains": 3}])),
        &[r#"["a","a"]"#, r#"["a","a","a"]"#],
        &[r#"["a"]"#, r#"["a","a","a","a"]"#],
    );
}

#[test]
fn an_integral_number_written_with_a_fraction_also_matches_its_integer_spelling() {
    // `enum: [2.0]` holds for `2` (equal numbers); `2` in the schema keeps its one spelling.
    common::check(
        json!({"type":"object","properties":{"since":{"enum":[2.0]},"n":{"const":-3.0}}}),
        &[
            r#"{"since":2}"#,
            r#"{"since":2.0}"#,
            r#"{"n":-3}"#,
            r#"{"n":-3.0}"#,
        ],
        &[
            r#"{"since":2.5}"#,
            r#"{"since":20}"#,
            r#"{"since":2.}"#,
            r#"{"n":3}"#,
        ],
    );
    common::check(
        json!({"enum":[1.5, 2, {"a":[4.0]}]}),
        &["1.5", "2", r#"{"a":[4]}"#, r#"{"a":[4.0]}"#],
        &["1.6", "15", r#"{"a":[40]}"#],
    );
    // Stricter, by choice: an integer in the schema is not matched by `2.0` (valid from
    // draft 6 on, not an integer under draft 4) nor by other spellings of 1.5.
    let g = compile(&json!({"enum":[1.5, 2]})).unwrap();
    assert!(!accepts(&g, "2.0") && !accepts(&g, "1.50"));
}

/// `format: regex` admits only strings that Python's `re` and ECMA-262 (with and without
/// the `u` flag) all accept as regular expressions: over the labelled candidates of
/// `fixtures/regex_format.jsonl` (`scripts/regex_format_fixture.py`), none that one of
/// them refuses is accepted, and the common forms are.
#[test]
fn regex_format_admits_only_regexes_every_dialect_accepts() {
    let g = compile(&json!({"type": "string", "format": "regex"})).unwrap();
    let (admitted, valid) = regex_format_fixture(&g);
    assert!(admitted * 2 > valid, "{admitted} of {valid}");
    for re in [
        "",
        "^[a-zA-Z0-9_]{3,16}$",
        r"^\d+(\.\d+)?$",
        r"^https?://[^\s/$.?#].[^\s]*$",
        r"\s*(\d+\.?\d*)%",
        r"^(?:[a-z0-9-]+\.)+[a-z]{2,}$",
        r"^(?!test).*$",
        r"^[\w.+-]+@[\w-]+\.[\w.-]+$",
        r"a{2}?b+?c*?",
        r"\bword\b",
        r"(a(b(c)))",
        r"[a-z-]",
        r".*\.ts$",
    ] {
        assert!(
            accepts(&g, &serde_json::to_string(re).unwrap()),
            "{re:?} rejected"
        );
    }
    for re in [
        "*", "\\", "a**", "[z-a]", "x{3,2}", "(a", "[^]", "^*", r"(a)\1",
    ] {
        assert!(
            !accepts(&g, &serde_json::to_string(re).unwrap()),
            "{re:?} accepted"
        );
    }
}

/// Beside a `pattern`, `format: regex` is a smaller subset (its DFA goes into a product with
/// the pattern's): still no string some dialect refuses, the common forms, groups one deep.
#[test]
fn regex_format_beside_a_pattern() {
    let g = compile(&json!({"type": "string", "format": "regex", "pattern": "[\\s\\S]*"})).unwrap();
    let (admitted, valid) = regex_format_fixture(&g);
    assert!(admitted * 3 > valid, "{admitted} of {valid}");
    // GitLab CI's `coverage`: a regex between slashes.
    let g = compile(&json!({"type": "string", "format": "regex", "pattern": "^/.+/$"})).unwrap();
    for re in [
        r"/Code coverage: \d+\.\d+/",
        r"/(\d+)%/",
        r"/^TOTAL.+?(\d+)%$/",
        r"/[a-f0-9]{2,8}/",
    ] {
        assert!(
            accepts(&g, &serde_json::to_string(re).unwrap()),
            "{re:?} rejected"
        );
    }
    for re in ["a", "/a(/", "/[z-a]/", "//", r"/(a)\1/"] {
        assert!(
            !accepts(&g, &serde_json::to_string(re).unwrap()),
            "{re:?} accepted"
        );
    }
}

/// Over the labelled candidates of `fixtures/regex_format.jsonl`: asserts that `g` admits
/// none of the invalid ones; (admitted, valid) counts of the valid ones.
fn regex_format_fixture(g: &std::sync::Arc<sglrs_grammar::CompiledGrammar>) -> (usize, usize) {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/regex_format.jsonl"),
    )
    .unwrap();
    let (mut valid, mut admitted) = (0, 0);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let re = v["regex"].as_str().unwrap();
        let ok = accepts(g, &serde_json::to_string(re).unwrap());
        if v["valid"] == true {
            valid += 1;
            admitted += ok as usize;
        } else {
            assert!(
                !ok,
                "{re:?} is not a valid regex everywhere, but was admitted"
            );
        }
    }
    eprintln!("{admitted} of {valid} valid candidates admitted");
    (admitted, valid)
}

/// Like `check`, under the default options only (declared properties in any order): the
/// valid texts may order keys otherwise than the schema.
fn check_any_order(schema: serde_json::Value, valid: &[&str], invalid: &[&str]) {
    common::check_opts(&schema, &CompileOptions::default(), valid, invalid);
}

/// Undeclared keys with control characters: those without a short escape are spelled
/// `\u00XY` (lowercase, as serde_json and Python write them), the others take their short
/// escape; key patterns see the decoded character.
#[test]
fn control_characters_in_undeclared_keys() {
    let g = compile(&json!({"type": "object"})).unwrap();
    for ok in [
        r#"{"\u0016":null}"#,
        r#"{"a\u001fb":1}"#,
        r#"{"\n\u0000":{}}"#,
        r#"{"\b":1}"#,
    ] {
        assert!(accepts(&g, ok), "{ok} rejected");
    }
    // A short escape's `\u` spelling, upper-case digits, and past U+001F are not canonical.
    for bad in [
        r#"{"\u0008":1}"#,
        r#"{"\u001F":1}"#,
        r#"{"\u0020":1}"#,
        r#"{"\u0":1}"#,
    ] {
        assert!(!accepts(&g, bad), "{bad} accepted");
    }
    let g = compile(&json!({"type": "object", "additionalProperties": false,
                            "patternProperties": {"^\\u0016$": {"type": "integer"}}}))
    .unwrap();
    assert!(accepts(&g, r#"{"\u0016":1}"#));
    assert!(!accepts(&g, r#"{"\u0016":"x"}"#));
    assert!(!accepts(&g, r#"{"\u0017":1}"#));
}
