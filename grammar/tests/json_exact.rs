//! Keywords enforced exactly for coverage: the `duration` format, `uri` /
//! `uri-reference` with IP literals, `iri`, `uri-template`, `relative-json-pointer` (and the complements of these formats, for `oneOf` and
//! `not`), `^`/`$` inside patterns, ECMA identity escapes `\<`/`\>`, and look-aheads at the
//! start of a pattern. Each schema is checked on valid texts and near misses (byte
//! vocabulary, compact policy).

mod common;

use common::{check, compile_bytes as compile};
use serde_json::json;

#[test]
fn duration_format_is_rfc3339_appendix_a() {
    check(
        json!({"type": "string", "format": "duration"}),
        &[
            r#""P3DT12H30M5S""#,
            r#""P1D""#,
            r#""PT1M""#,
            r#""PT36H""#,
            r#""P1W""#,
            r#""P1Y2M3DT4H5M6S""#,
            r#""P2M""#,
            r#""PT1H5M5S""#,
            r#""p1y2m""#,
        ],
        &[
            r#""P""#,
            r#""PT""#,
            r#""P1X""#,
            r#""P1DT""#,
            r#""P1H""#,
            r#""P1W1D""#,
            r#""PT1S2M""#,
            r#""1D""#,
            r#""P1.5D""#,
            r#""P1Y1D""#,
            r#""PT1H5S""#,
            r#""not a duration""#,
        ],
    );
}

#[test]
fn duration_complement_in_one_of() {
    // "P1D" is a duration and starts with P: both branches, rejected.
    check(
        json!({"type": "string", "oneOf": [{"format": "duration"}, {"pattern": "^P"}]}),
        &[r#""Pxyz""#, r#""p1d""#, r#""P""#],
        &[r#""P1D""#, r#""PT5M""#, r#""abc""#],
    );
}

#[test]
fn uri_ip_literals() {
    check(
        json!({"type": "string", "format": "uri"}),
        &[
            r#""http://[::1]:8080/x""#,
            r#""http://[2001:db8::7]/c=GB?objectClass?one""#,
            r#""http://[v1.fe:x]/""#,
            r#""urn:isbn:0451450523""#,
            r#""mailto:a@b.c""#,
        ],
        &[
            r#""http://[::1/""#,
            r#""http://[xyz]/""#,
            r#""http://[::1]x/""#,
            r#""//a/b""#,
            r#""http://a b""#,
        ],
    );
}

#[test]
fn uri_complements_in_one_of_and_not() {
    // A string matching the pattern but not a URI takes the second branch only.
    check(
        json!({"type": "string", "oneOf": [{"format": "uri"}, {"pattern": "^https?:"}]}),
        &[r#""ftp://a""#, r#""https:// a""#, r#""http:%zz""#],
        &[r#""https://a.b""#, r#""http://[::1]/""#, r#""a b""#],
    );
    check(
        json!({"type": "string", "not": {"format": "uri-reference"}}),
        &[r#""a b""#, r#""%zz""#, r#""http://[::1/""#],
        &[r#""../x""#, r#""""#, r#""http://[::1]/""#, r##""#frag""##],
    );
}

/// RFC 3987 IRIs (a URI whose unreserved characters include `ucschar`, and whose query
/// also takes `iprivate`), RFC 6570 URI Templates (level 4) and relative JSON pointers —
/// exact, so their complements are too.
#[test]
fn iri_uri_template_and_relative_json_pointer_formats() {
    check(
        json!({"type": "string", "format": "iri"}),
        &[
            r#""https://example.com/café""#,
            r#""http://ドメイン.テスト/パス?q=値#frag""#,
            r#""mailto:user@例え.jp""#,
            r#""urn:isbn:0451450523""#,
            r#""http://[::1]:80/""#,
            "\"http://a/?\u{E000}\"",
        ],
        &[
            r#""/relative/path""#,
            r#""http://a b""#,
            r#""http://a/%zz""#,
            r#""ドメイン:x""#,
            // `iprivate` is allowed in the query only.
            "\"http://a/\u{E000}\"",
            "\"http://a/#\u{E000}\"",
        ],
    );
    check(
        json!({"type": "string", "format": "iri-reference"}),
        &[r#""../パス""#, r#""""#, r##""#frag""##, r#""http://é.fr""#],
        &[r#""a b""#, r#""%zz""#],
    );
    check(
        json!({"type": "string", "format": "uri-template"}),
        &[
            r#""http://example.com/{user}/repos{?page,per_page}""#,
            r#""{+path:6}/here""#,
            r#""{/list*}{.ext}{;x,y}{&a}{#frag}""#,
            r#""/users/{user.name}/{%41b}""#,
            r#""no-expressions_at~all""#,
            r#""""#,
        ],
        &[
            r#""{}""#,
            r#""{user""#,
            r#""user}""#,
            r#""{a:0}""#,
            r#""{a:10000}""#,
            r#""{a b}""#,
            r#""{a..b}""#,
            r#""<tag>""#,
            r#""with space""#,
        ],
    );
    check(
        json!({"type": "string", "format": "relative-json-pointer"}),
        &[r#""0""#, r#""1/a~1b""#, r#""0#""#, r#""12/0/x""#],
        &[
            r#""""#,
            r#""01""#,
            r#""/a""#,
            r#""1#/a""#,
            r#""-1""#,
            r#""1/~2""#,
        ],
    );
    check(
        json!({"type": "string", "not": {"format": "uri-template"}}),
        &[r#""{}""#, r#""a b""#],
        &[r#""{x}""#, r#""abc""#],
    );
}

#[test]
fn anchors_inside_patterns() {
    check(
        json!({"type": "string", "pattern": "^([^,]|$)"}),
        &[r#""""#, r#""a""#, r#""ab,""#],
        &[r#"",""#, r#"",a""#],
    );
    check(
        json!({"type": "string", "pattern": "^([^,]|$)", "maxLength": 2}),
        &[r#""""#, r#""ab""#],
        &[r#""abc""#, r#"",""#],
    );
    check(
        json!({"type": "string", "pattern": "^([0-9x]+\\.[0-9x]+\\.*[0-9x]*$|\\%VERSION\\%)"}),
        &[
            r#""1.2""#,
            r#""1.2.3""#,
            r#""%VERSION%""#,
            r#""%VERSION%abc""#,
        ],
        &[r#""1.2a""#, r#""1""#, r#""x%VERSION%""#],
    );
    check(
        json!({"type": "string", "pattern": "^(\\/?((\\.{2})|([a-z0-9\\-]*))($|\\/))*$"}),
        &[r#""""#, r#""/a/b""#, r#""../x/""#, r#""a""#],
        &[r#""a..""#, r#""A""#, r#""a/b c""#],
    );
    // `/^x$/`: a `^` after a character never matches (no multiline flag).
    check(
        json!({"properties": {"y": {"type": "string", "pattern": "/^[0-9]{4}$/", "maxLength": 9}}}),
        &[r#"{}"#],
        &[r#"{"y":"/^2020$/"}"#, r#"{"y":"2020"}"#],
    );
}

#[test]
fn ecma_identity_escapes_are_literals() {
    check(
        json!({"type": "string", "pattern": "^.+\\<.+@.+\\..+\\>$"}),
        &[r#""Bob <b@c.d>""#],
        &[r#""Bob b@c.d""#, r#""Bob <b@c.d> x""#],
    );
}

#[test]
fn leading_look_aheads() {
    let java = "^(?!org\\.bukkit\\.)([a-zA-Z_$][a-zA-Z\\d_$]*\\.)*[a-zA-Z_$][a-zA-Z\\d_$]*$";
    check(
        json!({"type": "string", "pattern": java}),
        &[
            r#""com.x.Main""#,
            r#""org.bukkitx.A""#,
            r#""org.Bukkit.A""#,
            r#""A""#,
        ],
        &[r#""org.bukkit.A""#, r#""1abc""#, r#""""#, r#""a..b""#],
    );
    check(
        json!({"type": "string", "pattern": "^(?!^lucene\\.|builtin\\.|mongodb\\.).*"}),
        &[r#""luc""#, r#""my.lucene.x""#, r#""lucene""#, r#""""#],
        &[r#""lucene.x""#, r#""builtin.""#, r#""mongodb.a""#],
    );
    check(
        json!({"type": "string", "pattern": "^(?=[a-z])(?!ab)"}),
        &[r#""ac""#, r#""b""#, r#""a""#],
        &[r#""ab""#, r#""abc""#, r#""Ab""#, r#""""#, r#""1""#],
    );
    // Beside length bounds.
    check(
        json!({"type": "string", "pattern": "^(?![ \\t]*x)[\\s\\S]*", "minLength": 2}),
        &[r#""ab""#, r#""  y""#],
        &[r#""a""#, r#""xa""#, r#""  xa""#],
    );
}

#[test]
fn look_arounds_that_are_not_split_are_refused() {
    // A second top-level branch, a look-ahead with an alternation inside a loop, one
    // that can match the empty text, a look-behind: refused, never loosened.
    for p in ["^(?!a)b|c", "^((?!mo|de).)*$", "^((?!a?).)*$", "(?<=a)b"] {
        assert!(
            compile(&json!({"type": "string", "pattern": p})).is_err(),
            "{p}"
        );
    }
    // A negated look-ahead pattern goes through the key automaton, which splits it as
    // `pattern` is split: exact.
    check(
        json!({"type": "string", "not": {"pattern": "^(?!a)"}}),
        &["\"abc\"", "\"a\""],
        &["\"b\"", "\"\"", "\"ba\""],
    );
}

#[test]
fn additional_properties_schema_complement() {
    // Branch 1 allows any undeclared key with a string value; branch 0 any object with a
    // key "a". An object with "a" and only string-valued other keys matches both.
    check(
        json!({"type": "object", "oneOf": [
            {"required": ["a"]},
            {"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
        ]}),
        &[
            r#"{"a":1,"b":2}"#,
            r#"{"a":"x"}"#,
            r#"{"b":"x"}"#,
            r#"{}"#,
            r#"{"b":"x","a":1,"c":null}"#,
        ],
        &[
            r#"{"a":1}"#,
            r#"{"a":1,"b":"x"}"#,
            r#"{"b":1}"#,
            r#"{"b":"x","a":1,"c":"y"}"#,
        ],
    );
    // With patterns: keys matching a pattern are not "additional".
    check(
        json!({"type": "object", "not": {
            "patternProperties": {"^x": {}}, "additionalProperties": {"type": "string"}
        }}),
        &[r#"{"a":1}"#, r#"{"x1":1,"b":null}"#],
        &[r#"{}"#, r#"{"x1":1}"#, r#"{"a":"s","x2":[]}"#],
    );
}

#[test]
fn dependencies_complement() {
    // Branch 1: if "card" is present, "billing" must be too; branch 0: has "card".
    check(
        json!({"type": "object", "oneOf": [
            {"required": ["card"]},
            {"dependencies": {"card": ["billing"]}}
        ]}),
        &[
            r#"{"card":1}"#,
            r#"{"card":1,"x":2}"#,
            r#"{}"#,
            r#"{"billing":1}"#,
        ],
        &[
            r#"{"card":1,"billing":2}"#,
            r#"{"billing":1,"card":2,"x":3}"#,
        ],
    );
    // A dependent schema: "a" present needs "b" to be a string.
    check(
        json!({"type": "object", "not": {"dependentSchemas": {
            "a": {"properties": {"b": {"type": "string"}}, "required": ["b"]}
        }}}),
        // (schema order: the complement declares "b" before the trigger "a")
        &[r#"{"a":1}"#, r#"{"b":2,"a":1}"#],
        &[
            r#"{}"#,
            r#"{"b":1}"#,
            r#"{"b":"s","a":1}"#,
            r#"{"a":1,"b":"s"}"#,
        ],
    );
}

#[test]
fn if_then_else_complement() {
    // not (if a is a string then b is required else c is required).
    check(
        json!({"type": "object", "not": {
            "if": {"properties": {"a": {"type": "string"}}, "required": ["a"]},
            "then": {"required": ["b"]},
            "else": {"required": ["c"]}
        }}),
        &[
            r#"{"a":"x"}"#,
            r#"{"a":"x","c":1}"#,
            r#"{}"#,
            r#"{"a":1,"b":2}"#,
        ],
        &[r#"{"a":"x","b":1}"#, r#"{"a":1,"c":2}"#, r#"{"c":1}"#],
    );
    // In a `oneOf` with an overlapping branch; `then` alone.
    check(
        json!({"type": "object", "oneOf": [
            {"required": ["k"]},
            {"if": {"required": ["k"]}, "then": {"properties": {"k": {"type": "integer"}}}}
        ]}),
        &[r#"{"k":"s"}"#, r#"{}"#, r#"{"j":1}"#],
        &[r#"{"k":1}"#],
    );
}

/// Like `check`, under the default options only (declared properties in any order): the
/// valid texts may order keys otherwise than the schema.
fn check_any_order(schema: serde_json::Value, valid: &[&str], invalid: &[&str]) {
    common::check_opts(
        &schema,
        &sglrs_grammar::CompileOptions::default(),
        valid,
        invalid,
    );
}

#[test]
fn complement_of_a_recursive_ref() {
    // A tree node; the `oneOf` needs "an object with v that is not a node", whose
    // complement recurses into the children (a rule calling itself).
    let schema = json!({
        "definitions": {"node": {"type": "object",
            "properties": {"v": {"type": "integer"},
                           "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}}},
            "required": ["v"]}},
        "oneOf": [{"$ref": "#/definitions/node"}, {"type": "object", "required": ["v"]}]
    });
    check_any_order(
        schema.clone(),
        &[
            r#"{"v":"s"}"#,
            r#"{"v":1,"kids":[{"v":"x"}]}"#,
            r#"{"v":1,"kids":[{"v":2,"kids":[{}]}]}"#,
            r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":{}}]}]}"#,
            r#"{"v":1,"kids":7}"#,
        ],
        &[
            r#"{"v":1}"#,
            r#"{"v":1,"kids":[{"v":2}]}"#,
            r#"{"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]}"#,
            r#"{}"#,
            r#"{"kids":[]}"#,
            r#"[]"#,
        ],
    );
    // `not` of a recursive reference directly.
    check(
        json!({"definitions": {"list": {"anyOf": [{"type": "null"},
            {"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#/definitions/list"}],
             "minItems": 2, "maxItems": 2}]}},
            "not": {"$ref": "#/definitions/list"}}),
        &["1", "[1]", "[1,[2,3]]", r#"[1,[2,["x",null]]]"#],
        &["null", "[1,null]", "[1,[2,null]]"],
    );
}

#[test]
fn excluded_integer_values() {
    check(
        json!({"type": "integer", "minimum": 1024, "maximum": 65535,
               "not": {"enum": [6379, 6380, 43215]}}),
        &["1024", "6378", "6381", "43214", "43216", "65535"],
        &["6379", "6380", "43215", "1023", "65536"],
    );
    check(
        json!({"type": "integer", "not": {"const": 0}}),
        &["1", "-1", "10", "100"],
        &["0", "-0", "00"],
    );
    // With a remainder automaton (multipleOf 13) and a value excluded through a `$ref`.
    check(
        json!({"type": "integer", "multipleOf": 13, "$ref": "#/definitions/n",
               "definitions": {"n": {"not": {"const": 169}}}}),
        &["13", "156", "182", "-169", "0"],
        &["169", "170", "1"],
    );
}

#[test]
fn excluded_number_values() {
    check(
        json!({"type": "number", "not": {"enum": [1.5, 2, 0]}}),
        &["1.25", "3", "2.5", "1.05", "-1.5", "0.1", "20", "-2"],
        &[
            "1.5", "1.50", "2", "2.0", "2.000", "0", "-0", "0.0", "-0.00",
        ],
    );
    check(
        json!({"type": "number", "multipleOf": 0.5, "not": {"const": 1}}),
        &["0.5", "1.5", "2", "-1"],
        &["1", "1.0", "1.00", "0.25"],
    );
    check(
        json!({"type": "number", "minimum": -100, "maximum": -10, "not": {"const": -78.5}}),
        &["-78", "-78.25", "-10", "-78.55"],
        &["-78.5", "-78.50", "-9", "-100.5"],
    );
}

#[test]
fn excluded_numbers_need_a_numeric_type() {
    // Without `type: number|integer` the exponent-free form would constrain values the
    // schema leaves free: refused.
    assert!(compile(&json!({"not": {"enum": [1]}})).is_err());
    assert!(compile(&json!({"type": ["number", "string"], "not": {"const": 1}})).is_err());
    check(
        json!({"type": ["integer"], "not": {"const": 1}}),
        &["2", "0"],
        &["1"],
    );
}

#[test]
fn complement_of_a_key_and_value_witness() {
    // Two different `oneOf` in an `allOf`: one becomes an `anyOf` of complements, so
    // negating the whole negates a `patternProperties` complement again.
    let schema = json!({"type": "object", "not": {"allOf": [
        {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
        {"oneOf": [{"required": ["c"]}, {"patternProperties": {"^x": {"type": "integer"}}}]}
    ]}});
    check_any_order(
        schema,
        &[
            r#"{}"#,
            r#"{"a":1,"b":1}"#,
            r#"{"a":1,"c":1}"#,
            r#"{"a":1,"x1":"s"}"#,
            r#"{"x1":"s","b":2}"#,
        ],
        &[
            r#"{"a":1}"#,
            r#"{"b":1,"x":2}"#,
            r#"{"a":1,"c":1,"x":"s"}"#,
            r#"{"c":1,"b":1,"x2":[]}"#,
        ],
    );
}

#[test]
fn property_counts_up_to_128() {
    // A map of at most 100 entries (was refused above 32).
    let g = compile(&json!({"type": "object", "maxProperties": 100,
                           "additionalProperties": {"type": "integer"}}))
    .expect("compiles");
    let obj = |n: usize| {
        let body: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
        format!("{{{}}}", body.join(","))
    };
    assert!(common::accepts_text(&g, &obj(0)));
    assert!(common::accepts_text(&g, &obj(33)));
    assert!(common::accepts_text(&g, &obj(100)));
    assert!(!common::accepts_text(&g, &obj(101)));
    let g = compile(&json!({"type": "object", "minProperties": 40})).expect("compiles");
    assert!(!common::accepts_text(&g, &obj(39)));
    assert!(common::accepts_text(&g, &obj(40)));
    assert!(common::accepts_text(&g, &obj(41)));
    assert!(compile(&json!({"type": "object", "maxProperties": 129})).is_err());
}

#[test]
fn ecma_dot_excludes_line_terminators() {
    check(
        json!({"type": "string", "pattern": "^a.b$"}),
        &[r#""axb""#, r#""a b""#, r#""aéb""#],
        &[r#""a\rb""#, r#""a\nb""#, r#""a\u2028b""#, r#""ab""#],
    );
}

#[test]
fn look_aheads_in_a_loop() {
    // No position where "mode" or "Mode" starts, no line terminator.
    check(
        json!({"type": "string", "pattern": "^((?!mode)(?!Mode).)*$"}),
        &[
            r#""""#,
            r#""mod""#,
            r#""MODE""#,
            r#""mo de""#,
            r#""moDe x""#,
        ],
        &[
            r#""mode""#,
            r#""a Mode b""#,
            r#""xmodex""#,
            r#""line\nbreak""#,
        ],
    );
    check(
        json!({"type": "string", "pattern": "^(?:(?!ab)[\\s\\S])*$"}),
        &[r#""""#, r#""a\nb""#, r#""ba""#],
        &[r#""ab""#, r#""xxab""#],
    );
}

#[test]
fn look_aheads_in_merged_patterns() {
    // `allOf` puts the second pattern beside the first (`__patterns`): split there too.
    check(
        json!({"allOf": [{"type": "string", "pattern": "^[^\\n]+$"},
                         {"pattern": "^((?!mode)(?!Mode).)*$"}]}),
        &[r#""a""#, r#""mo de""#],
        &[r#""""#, r#""my mode""#, r#""Mode""#],
    );
}

#[test]
fn twenty_pattern_properties() {
    // 19 patterns on one object (was refused above 16).
    let mut pp = serde_json::Map::new();
    for i in 0..19 {
        pp.insert(format!("^k{i}:(en|nl)$"), json!({"type": "integer"}));
    }
    check(
        json!({"type": "object", "patternProperties": pp, "additionalProperties": false}),
        &[r#"{}"#, r#"{"k3:en":1,"k18:nl":2}"#, r#"{"k0:nl":0}"#],
        &[
            r#"{"k3:en":"x"}"#,
            r#"{"k19:en":1}"#,
            r#"{"k3:fr":1}"#,
            r#"{"b":1}"#,
        ],
    );
    let mut pp = serde_json::Map::new();
    for i in 0..25 {
        pp.insert(format!("^k{i}$"), json!({}));
    }
    assert!(compile(&json!({"type": "object", "patternProperties": pp})).is_err());
}

#[test]
fn hostname_complement_is_rfc1123() {
    // Labels up to 63 characters and names up to 253 are host names (the positive format
    // is enforced stricter, its complement exactly).
    let label40 = format!("\"{}\"", "a".repeat(40));
    let label64 = format!("\"{}\"", "a".repeat(64));
    let long = format!("\"{}aa\"", "a.".repeat(126)); // 254 characters
    let max = format!("\"{}a\"", "a.".repeat(126)); // 253 characters
    check(
        json!({"type": "string", "not": {"format": "hostname"}}),
        &[
            r#""-a""#,
            r#""a..b""#,
            r#""a_b""#,
            r#""""#,
            r#""a.""#,
            &label64,
            &long,
        ],
        &[r#""a""#, r#""example.com""#, r#""1.2.3.4""#, &label40, &max],
    );
    // Labels with `--` as their third and fourth characters are reserved, `xn--` ones IDNA
    // A-labels: the format refuses them all (valid A-labels too), elsewhere `--` is fine.
    check(
        json!({"type": "string", "format": "hostname"}),
        &[
            r#""a--b.com""#,
            r#""ab-c--d""#,
            r#""abc""#,
            r#""a-b""#,
            r#""a-bc""#,
            r#""ab-cd""#,
            r#""abcdefghijklmnopqrstuvwxyz1234""#,
        ],
        &[
            r#""xn--X""#,
            r#""XN--aa---o47jg78q""#,
            r#""www.xn--9t4b11yi5a""#,
            r#""ab--cd""#,
            r#""abcdefghijklmnopqrstuvwxyz12345""#,
            r#""a-""#,
        ],
    );
    // An IPv4 address is also a host name: `oneOf` accepts neither alone.
    check(
        json!({"type": "string", "oneOf": [{"format": "hostname"}, {"format": "ipv4"}]}),
        &[r#""example.com""#],
        &[r#""1.2.3.4""#, r#""a_b""#],
    );
}

#[test]
fn excluded_arrays_and_objects() {
    check(
        json!({"type": "array", "items": {"type": "string"}, "not": {"enum": [["deleted"]]}}),
        &[
            "[]",
            r#"["added"]"#,
            r#"["deleted","x"]"#,
            r#"["x","deleted"]"#,
        ],
        &[r#"["deleted"]"#, "[1]"],
    );
    check(
        json!({"type": "object", "not": {"const": {"type": "void"}}}),
        &[
            "{}",
            r#"{"type":"int"}"#,
            r#"{"type":"void","x":1}"#,
            r#"{"x":1}"#,
        ],
        &[r#"{"type":"void"}"#, "[]"],
    );
    // Nested: an array holding an object (numbers inside would need a numeric type).
    check(
        json!({"not": {"const": [{"a": ["x"]}]}}),
        &[
            "1",
            "[]",
            r#"[{"a":["y"]}]"#,
            r#"[{"a":["x"],"b":0}]"#,
            r#"[{}]"#,
            r#"[{"a":[]}]"#,
        ],
        &[r#"[{"a":["x"]}]"#],
    );
}

#[test]
fn multiple_of_checks_on_huge_values() {
    // 10^40 is a multiple of 5, 3 is not; 1e308 is no multiple of 0.123456789.
    check(
        json!({"enum": [1e40, 3], "multipleOf": 5}),
        &["1e+40"],
        &["3", "5"],
    );
    check(
        json!({"allOf": [{"enum": [1e308]}, {"not": {"multipleOf": 0.123456789, "type": "integer"}}]}),
        &["1e+308"],
        &["1"],
    );
    assert!(compile(&json!({"enum": [1e40], "multipleOf": 3})).is_err());
}

/// A single bound at zero is decided by the sign and whether the mantissa is zero, so
/// numbers with an exponent stay allowed under it (`minimum: 0` with `1e-6`); other bounds
/// keep numbers without one (stricter).
#[test]
fn exponents_under_a_bound_at_zero() {
    check(
        json!({"type": "number", "minimum": 0}),
        &["1e-6", "0e0", "-0e1", "-0.0E+2", "2.5E+3", "0.5", "0", "7"],
        &["-1e-6", "-2E3", "-0.5e1", "-1", "1e", "e5"],
    );
    check(
        json!({"type": "number", "exclusiveMinimum": 0}),
        &["1e-300", "0.5e1", "3E0", "0.001"],
        &["0e5", "0.0e1", "-0e1", "-1e2", "0"],
    );
    check(
        json!({"type": "number", "maximum": 0}),
        &["-1e5", "0E0", "-0e3", "0", "-2.5"],
        &["1e-9", "0.1e1"],
    );
    check(
        json!({"type": "number", "exclusiveMaximum": 0}),
        &["-1e-9", "-0.5E2"],
        &["-0e1", "0e1", "0", "1e1"],
    );
    // Draft 4's boolean exclusives.
    check(
        json!({"type": "number", "minimum": 0, "exclusiveMinimum": true}),
        &["2e-3"],
        &["0e0", "-1e1"],
    );
    // Other bounds: no exponent.
    check(
        json!({"type": "number", "minimum": 1}),
        &["1", "2.5"],
        &["1e1", "2E0"],
    );
}

/// Bounds past 10^15 are exact, as the schema writes them: a `minimum` of `1e20` used to
/// compile to a grammar that accepts no text, and `maximum: 9007199254740991` (JavaScript's
/// largest safe integer) was clamped to 10^15.
#[test]
fn bounds_of_any_size_are_exact() {
    check(
        json!({"type": "number", "minimum": 1e20}),
        &[
            "100000000000000000000",
            "100000000000000000000.5",
            "100000000000000000001",
            "1000000000000000000000000",
        ],
        &[
            "99999999999999999999.99",
            "99999999999999999999",
            "-100000000000000000000",
            "5",
        ],
    );
    check(
        json!({"type": "integer", "minimum": 1e15}),
        &[
            "1000000000000000",
            "1000000000000001",
            "99000000000000000000",
        ],
        &["999999999999999", "1000000000000000.5", "-1000000000000000"],
    );
    check(
        json!({"type": "integer", "maximum": 9007199254740991u64, "minimum": 0}),
        &["9007199254740991", "1000000000000001", "0", "42"],
        &["9007199254740992", "10000000000000000", "-1"],
    );
    check(
        json!({"type": "integer", "maximum": 18446744073709551615u64, "exclusiveMinimum": 18446744073709551613u64}),
        &["18446744073709551614", "18446744073709551615"],
        &[
            "18446744073709551613",
            "18446744073709551616",
            "18446744073709551612",
        ],
    );
    check(
        json!({"type": "integer", "maximum": -1e20}),
        &[
            "-100000000000000000000",
            "-100000000000000000001",
            "-3000000000000000000000",
        ],
        &["-99999999999999999999", "0", "100000000000000000000"],
    );
    check(
        json!({"type": "number", "exclusiveMaximum": 1.5e30, "minimum": 1e29}),
        &[
            "100000000000000000000000000000",
            "1499999999999999999999999999999.99",
        ],
        &[
            "1500000000000000000000000000000",
            "99999999999999999999999999999.9",
        ],
    );
    // Read as the schema text writes it: serde_json's default float parsing is off by one
    // unit in the last place here (9007199254740990), which made this minimum looser.
    let schema: serde_json::Value =
        serde_json::from_str(r#"{"type": "number", "minimum": 9007199254740991.0}"#).unwrap();
    check(
        schema,
        &["9007199254740991", "9007199254740991.5", "9007199254740992"],
        &["9007199254740990", "9007199254740990.5"],
    );
    // A bound of hundreds of digits stays a small grammar.
    check(
        json!({"type": "integer", "minimum": -5, "maximum": 1e300}),
        &[
            "-5",
            "0",
            "7",
            &format!("1{}", "0".repeat(300)),
            &"9".repeat(300),
        ],
        &[
            "-6",
            &format!("1{}1", "0".repeat(299)),
            &format!("2{}", "0".repeat(300)),
        ],
    );
}
