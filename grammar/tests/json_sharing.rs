//! Schemas whose repeated parts are shared (rules called) instead of copied at every use,
//! which made them too large. Each test checks that the shared form stays small (a state
//! bound that copying exceeds many times over) and that the language is unchanged: valid
//! texts accepted, near misses rejected (byte vocabulary, compact policy).

mod common;

use common::{accepts_text as accepts, check, compile_bytes as compile};
use serde_json::{json, Value};

/// An object nested `depth` levels through optional property "n", with a leaf of a few
/// hundred states at every level.
fn nested_optional(depth: usize) -> Value {
    let mut s = json!({"type": "integer", "minimum": 0, "maximum": 123456789});
    for _ in 0..depth {
        s = json!({
            "type": "object",
            "properties": {
                "n": s,
                "v": {"type": "integer", "minimum": -987654321, "maximum": 987654321}
            }
        });
    }
    s
}

#[test]
fn nested_optional_properties_are_not_copied_per_count_track() {
    // Optional properties reach the same saturated count slot from "first property" and
    // "after a comma"; the value used to be compiled once per track, doubling per level
    // (2^14 copies of the leaf here).
    let schema = nested_optional(14);
    let g = compile(&schema).expect("compiles");
    assert!(g.num_states() < 60_000, "{} states", g.num_states());
    let mut deep = json!(7);
    for i in 0..14 {
        deep = if i % 2 == 0 {
            json!({"n": deep, "v": -5})
        } else {
            json!({"n": deep})
        };
    }
    let text = serde_json::to_string(&deep).unwrap();
    assert!(accepts(&g, &text));
    assert!(accepts(&g, r#"{"v":1,"x":[true]}"#));
    assert!(accepts(&g, "{}"));
    assert!(accepts(&g, r#"{"n":{"n":{}},"v":0}"#));
    assert!(!accepts(&g, &text.replace(":7", ":-7")));
    assert!(!accepts(&g, r#"{"v":1,}"#));
    assert!(!accepts(&g, r#"{,"v":1}"#));
    assert!(!accepts(&g, r#"{"v":1"n":{}}"#));
    assert!(!accepts(&g, r#"{"n":{"v":987654322}}"#));
}

#[test]
fn large_ref_is_called_after_its_first_copy() {
    // `big` is a few thousand states; used eight times at each of three levels it used to
    // be copied eight times (then called); now once, then called.
    let mut props = serde_json::Map::new();
    for i in 0..48 {
        props.insert(
            format!("p{i}"),
            json!({"type": "integer", "minimum": -99999 - i, "maximum": 99999 + i}),
        );
    }
    let uses = |r: &str| {
        let mut m = serde_json::Map::new();
        for i in 0..8 {
            m.insert(format!("u{i}"), json!({"$ref": r}));
        }
        Value::Object(m)
    };
    let schema = json!({
        "$defs": {
            "big": {"type": "object", "properties": props, "additionalProperties": false},
            "mid": {"type": "object", "properties": uses("#/$defs/big")},
            "top": {"type": "object", "properties": uses("#/$defs/mid")}
        },
        "type": "object",
        "properties": uses("#/$defs/top")
    });
    // In schema order the eight-key levels are a few states each: all but `big` is small.
    let g = common::compile_bytes_with(&schema, &common::schema_order()).expect("compiles");
    let one = compile(&schema["$defs"]["big"])
        .expect("compiles")
        .num_states();
    assert!(one > 2_000, "big is {one} states");
    assert!(
        g.num_states() < 3 * one,
        "{} states, big {one}",
        g.num_states()
    );
    // In any order each eight-key level is one state per set of keys written (256), but
    // `big` is still not copied: eight copies alone would be `8 * one`.
    let g = compile(&schema).expect("compiles");
    assert!(
        g.num_states() < 8 * one,
        "{} states, big {one}",
        g.num_states()
    );
    let invalid = [
        r#"{"u0":{"u3":{"u7":{"p0":-100000}}}}"#,
        r#"{"u0":{"u3":{"u7":{"p23":100023}}}}"#,
        r#"{"u0":{"u3":{"u7":{"q":1}}}}"#,
        r#"{"u0":{"u3":{"u7":{"p1":1,"p1":2}}}}"#,
    ];
    check(
        schema.clone(),
        &[
            r#"{"u0":{"u3":{"u7":{"p0":-99999,"p23":100022}}}}"#,
            r#"{"u1":{},"u7":{"u0":{"u0":{}}}}"#,
        ],
        &invalid,
    );
    // `big` (48 keys) takes its keys in any order by default (`json_key_loops.rs`), only
    // as listed in schema order.
    let reordered = r#"{"u0":{"u3":{"u7":{"p1":1,"p0":1}}}}"#;
    common::check_opts(&schema, &Default::default(), &[reordered], &invalid);
    common::check_opts(&schema, &common::schema_order(), &[], &[reordered]);
}

#[test]
fn repeated_large_regex_is_one_rule() {
    // A word-count pattern is ~30k states; five properties used to hold five copies.
    let re = r"^(?:\S+\s+){0,99}\S+$";
    let mut props = serde_json::Map::new();
    for i in 0..5 {
        props.insert(format!("f{i}"), json!({"type": "string", "pattern": re}));
    }
    let schema = json!({"type": "object", "properties": props, "additionalProperties": false});
    let g = compile(&schema).expect("compiles");
    let one = compile(&json!({"type": "string", "pattern": re}))
        .expect("compiles")
        .num_states();
    assert!(
        g.num_states() < 3 * one,
        "{} states, one copy {one}",
        g.num_states()
    );
    let many = vec!["w"; 100].join(" ");
    let too_many = vec!["w"; 101].join(" ");
    check(
        schema,
        &[
            r#"{"f0":"a b","f4":"c"}"#,
            &format!(r#"{{"f1":"{many}","f2":"x","f3":"y z"}}"#),
        ],
        &[
            r#"{"f0":"a ","f4":"c"}"#,
            r#"{"f3":""}"#,
            &format!(r#"{{"f2":"{too_many}"}}"#),
        ],
    );
}

#[test]
fn bounded_array_items_share_one_rule() {
    // `maxItems: 60` called a fresh rule with the same body at every position.
    let item = json!({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 200},
        "b": {"type": "integer", "minimum": 3, "maximum": 77777},
        "c": {"enum": ["x", "y", "zz"]}
    }, "required": ["b"], "additionalProperties": false});
    let schema = json!({"type": "array", "items": item, "minItems": 1, "maxItems": 60});
    let g = compile(&schema).expect("compiles");
    assert!(g.num_states() < 5_000, "{} states", g.num_states());
    let sixty = vec![r#"{"b":3}"#; 60].join(",");
    let sixty_one = vec![r#"{"b":3}"#; 61].join(",");
    check(
        schema,
        &[r#"[{"a":"hi","b":77777,"c":"zz"}]"#, &format!("[{sixty}]")],
        &[
            "[]",
            &format!("[{sixty_one}]"),
            r#"[{"b":2}]"#,
            r#"[{"a":"hi"}]"#,
            r#"[{"b":5,"c":"z"}]"#,
        ],
    );
}

#[test]
fn long_free_strings_are_one_rule_per_bound() {
    // `maxLength: 255` on many properties: one counted-string rule, called.
    let mut props = serde_json::Map::new();
    for i in 0..40 {
        props.insert(format!("s{i}"), json!({"type": "string", "maxLength": 255}));
    }
    let schema = json!({"type": "object", "properties": props});
    let g = compile(&schema).expect("compiles");
    assert!(g.num_states() < 4_000, "{} states", g.num_states());
    let s255 = "é".repeat(255);
    let s256 = "a".repeat(256);
    check(
        schema,
        &[
            &format!(r#"{{"s0":"{s255}","s39":""}}"#),
            r#"{"s7":"x\"y"}"#,
        ],
        &[&format!(r#"{{"s5":"{s256}"}}"#), r#"{"s7":"x"y"}"#],
    );
}

#[test]
fn unbounded_array_item_is_compiled_once() {
    // `[` item (`,` item)* `]` with one copy of the item (was: the first item and the
    // loop each held one), also with `contains` layers.
    let big = nested_optional(6);
    let one = compile(&big).expect("compiles").num_states();
    let schema = json!({"type": "array", "items": big});
    let g = compile(&schema).expect("compiles");
    assert!(
        g.num_states() < one + one / 2,
        "{} states, item {one}",
        g.num_states()
    );
    check(
        schema,
        &["[]", r#"[{},{"v":1},{"n":{"n":{}}}]"#],
        &["[,]", "[{},]", r#"[{"v":"1"}]"#, "[{}{}]"],
    );
    check(
        json!({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}),
        &["[5]", "[1,5]", "[5,2,3]", "[1,2,5,5]"],
        &["[]", "[1]", "[1,2,3]", "[5,]", "[,5]"],
    );
}

#[test]
fn any_of_branches_contradicting_their_siblings_are_dropped_before_pairing() {
    // Complements write "not an object" branches; beside `type: object` they are empty.
    // 10 x 10 pairs used to exceed the 96-pair limit; 9 x 9 remain once they are dropped.
    let side = |p: &str| {
        let mut alts = vec![json!({"not": {"type": "object"}})];
        for i in 0..9 {
            alts.push(json!({"required": [format!("{p}{i}")]}));
        }
        json!({"anyOf": alts})
    };
    check(
        json!({"type": "object", "allOf": [side("a"), side("b")]}),
        &[r#"{"a0":1,"b3":2}"#, r#"{"a8":"s","x":[],"b8":null}"#],
        &[
            "{}",
            r#"{"a0":1}"#,
            r#"{"b0":1,"a9":2}"#,
            "1",
            "[]",
            "\"a0\"",
        ],
    );
    // Count bounds beside the `anyOf` rule out branches the same way.
    let arr = |k: usize| {
        json!({"anyOf": [
            {"type": "array", "minItems": 5},
            {"type": "array", "contains": {"const": k}},
            {"type": "array", "minItems": 7}
        ]})
    };
    check(
        json!({"type": "array", "maxItems": 4, "items": {"type": "integer"},
               "allOf": [arr(1), arr(2)]}),
        &["[1,2]", "[2,0,1]"],
        &["[1]", "[2]", "[1,2,3,4,5]", "[]"],
    );
}

#[test]
fn long_max_length_on_a_pattern_is_clamped_not_refused() {
    // maxLength 32767 beside a pattern: the product is built up to 4096 characters, as
    // free strings are (stricter, never looser); it used to be refused.
    let schema = json!({"type": "string", "maxLength": 32767,
                        "pattern": "^data:image/(png|jpeg);base64,[0-9a-zA-Z+/=]*$"});
    let g = compile(&schema).expect("compiles");
    assert!(accepts(&g, "\"data:image/png;base64,iVBORw0KGgo=\""));
    assert!(accepts(
        &g,
        &format!("\"data:image/jpeg;base64,{}\"", "A".repeat(4000))
    ));
    assert!(!accepts(&g, "\"data:image/gif;base64,AAAA\""));
    assert!(!accepts(&g, "\"data:image/png;base64,AA AA\""));
    assert!(!accepts(
        &g,
        &format!("\"data:image/png;base64,{}\"", "A".repeat(40000))
    ));
}

#[test]
fn all_of_properties_beside_pattern_properties() {
    // A key one side declares that the other side's pattern takes gets the pattern's
    // schema (was refused).
    check(
        json!({"allOf": [
            {"patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": false},
            {"properties": {"x-a": {"minimum": 3}, "x-b": {}}}
        ]}),
        &["{}", r#"{"x-a":3}"#, r#"{"x-a":4,"x-b":-1,"x-zz":0}"#],
        &[
            r#"{"x-a":2}"#,
            r#"{"x-b":"s"}"#,
            r#"{"x-a":3.5}"#,
            r#"{"y":1}"#,
            r#"{"x-q":"1"}"#,
        ],
    );
    // A declared key no pattern takes must satisfy additionalProperties.
    check(
        json!({"allOf": [
            {"patternProperties": {"^x-": {}}, "additionalProperties": {"type": "string"}},
            {"properties": {"name": {"maxLength": 3}}}
        ]}),
        &[r#"{"name":"abc"}"#, r#"{"x-1":1,"other":"s"}"#],
        &[r#"{"name":1}"#, r#"{"name":"abcd"}"#, r#"{"other":2}"#],
    );
}

#[test]
fn all_of_patterns_respect_the_other_sides_additional_properties() {
    // Loosening fixed: a key matching only the other side's pattern is additional here, so
    // `additionalProperties: false` on one side forbids it (was accepted).
    check(
        json!({"allOf": [{"additionalProperties": false},
                         {"patternProperties": {"^a": {}}}]}),
        &["{}"],
        &[r#"{"a1":1}"#, r#"{"b":1}"#],
    );
    check(
        json!({"allOf": [{"additionalProperties": {"type": "integer"}},
                         {"patternProperties": {"^a": {"minimum": 0}}}]}),
        &["{}", r#"{"a1":1,"b":-4}"#],
        &[r#"{"a1":"s"}"#, r#"{"a1":-1}"#, r#"{"b":"s"}"#],
    );
    // When the other side declares a key the pattern takes, or has patterns of its own,
    // the merged object cannot tell the keys apart: refused, never looser.
    for schema in [
        json!({"allOf": [{"properties": {"a": {}}, "additionalProperties": false},
                         {"patternProperties": {"^a": {}}}]}),
        json!({"allOf": [{"patternProperties": {"^b": {}}, "additionalProperties": false},
                         {"patternProperties": {"^a": {}}}]}),
    ] {
        match compile(&schema) {
            Err(e) => assert!(e.to_string().contains("additionalProperties"), "{e}"),
            Ok(g) => assert!(!accepts(&g, r#"{"ab":1}"#) || accepts(&g, r#"{"a":1}"#)),
        }
    }
}

#[test]
fn all_of_patterns_on_both_sides_with_additional_properties() {
    // Side 2 allows keys matching `a`, side 3 keys matching `b`: a key must match both
    // (each side's additionalProperties forbids the other's keys), and at least 2 keys.
    check(
        json!({"type": "object", "minProperties": 2, "allOf": [
            {"patternProperties": {"^.{1,2}$": {"type": "integer"}}},
            {"patternProperties": {"a": true}, "additionalProperties": false},
            {"patternProperties": {"b": true}, "additionalProperties": false}
        ]}),
        &[r#"{"ab":1,"ba":2}"#, r#"{"abc":"s","xab":[]}"#],
        &[
            r#"{"ab":1}"#,
            r#"{"ab":1,"a1":2}"#,
            r#"{"ab":1,"b1":2}"#,
            r#"{"ab":"s","ba":2}"#,
            r#"{"ab":1,"c":2}"#,
        ],
    );
    // additionalProperties with a schema: keys matching only the other side's pattern
    // must satisfy it; keys matching both get both pattern schemas.
    check(
        json!({"allOf": [
            {"patternProperties": {"^x": {"type": "string"}},
             "additionalProperties": {"type": "integer"}},
            {"patternProperties": {"y$": {"minimum": 5}}}
        ]}),
        &[r#"{"ay":5}"#, r#"{"xy":"s","q":1}"#, r#"{"x":"t"}"#],
        &[
            r#"{"ay":4}"#,
            r#"{"ay":"s"}"#,
            r#"{"xy":1}"#,
            r#"{"q":"s"}"#,
        ],
    );
}

#[test]
fn property_names_enum_limits_undeclared_keys() {
    check(
        json!({"type": "object", "properties": {"north": {"type": "string"}},
               "additionalProperties": {"type": "integer"},
               "propertyNames": {"enum": ["north", "south", "e.st", "w(x)"]}}),
        &["{}", r#"{"north":"a","south":1}"#, r#"{"e.st":2,"w(x)":3}"#],
        &[
            r#"{"east":1}"#,
            r#"{"eXst":1}"#,
            r#"{"wx":1}"#,
            r#"{"south":"s"}"#,
            r#"{"southx":1}"#,
            r#"{"":1}"#,
        ],
    );
    check(
        json!({"type": "object", "propertyNames": {"const": "k"}}),
        &["{}", r#"{"k":[1]}"#],
        &[r#"{"kk":1}"#, r#"{"K":1}"#],
    );
    check(
        json!({"type": "object", "propertyNames": {"enum": []}}),
        &["{}"],
        &[r#"{"a":1}"#],
    );
}

#[test]
fn pattern_and_format_with_length_bounds() {
    // pattern + format + minLength/maxLength: one DFA product with a length regex (was
    // refused as "cannot be intersected").
    check(
        json!({"type": "string", "format": "uuid", "pattern": "^[0-9a-f-]+$",
               "minLength": 36, "maxLength": 36}),
        &[r#""123e4567-e89b-12d3-a456-426614174000""#],
        &[
            r#""123E4567-E89B-12D3-A456-426614174000""#,
            r#""123e4567e89b12d3a456426614174000""#,
            r#""123e4567-e89b-12d3-a456-42661417400""#,
        ],
    );
    check(
        json!({"type": "string", "format": "date", "pattern": "^2", "minLength": 1}),
        &[r#""2024-02-29""#],
        &[r#""1999-01-01""#, r#""2023-02-29""#, "\"\""],
    );
    check(
        json!({"type": "string", "format": "ipv4", "pattern": "^10\\.", "maxLength": 8}),
        &[r#""10.0.0.1""#],
        &[r#""10.0.0.10""#, r#""11.0.0.1""#, r#""10.0.0""#],
    );
}

/// A recursion through `anyOf` branches beside another keyword (`.resjson`: a resource maps
/// names to strings or resources, each value with at least one property where it is an
/// object): each level calls one rule instead of merging the reference again, which nested
/// past the depth limit and was refused.
#[test]
fn recursion_through_union_branches_beside_other_keywords() {
    let schema = json!({
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "additionalProperties": {"minProperties": 1, "anyOf": [
            {"type": "string"}, {"$ref": "#/definitions/resource"}
        ]},
        "definitions": {"resource": {"type": "object", "additionalProperties": {
            "minProperties": 1, "anyOf": [{"type": "string"}, {"$ref": "#/definitions/resource"}]
        }}}
    });
    let g = compile(&schema).expect("compiles");
    assert!(g.num_states() < 5_000, "{} states", g.num_states());
    let deep = (0..40).fold(r#"{"k":"v"}"#.to_string(), |acc, _| {
        format!(r#"{{"a":{acc}}}"#)
    });
    check(
        schema,
        &[r#"{}"#, r#"{"a":"x","b":{"c":"y","d":{"e":"z"}}}"#, &deep],
        &[
            r#"{"a":{}}"#,
            r#"{"a":{"b":{}}}"#,
            r#"{"a":1}"#,
            r#"{"a":{"b":[1]}}"#,
            &deep.replace(r#""v""#, "{}"),
        ],
    );
}
