//! Patterns: ECMA-262 regex semantics in `pattern`, `patternProperties` and `propertyNames`
//! (word boundaries, white space, look-aheads, anchors inside alternatives), patterns beside
//! lengths and formats, two patterns intersected; listed valid texts accepted, invalid ones
//! rejected (byte vocabulary, compact policy).

mod common;

use common::check;
use serde_json::json;

#[test]
fn pattern_with_length_bounds() {
    check(
        json!({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4}),
        &["\"ab\"", "\"abcd\""],
        &["\"a\"", "\"abcde\"", "\"AB\""],
    );
    // Search semantics plus a character (not byte) count.
    check(
        json!({"type": "string", "pattern": "x", "maxLength": 3}),
        &["\"x\"", "\"éxé\""],
        &["\"\"", "\"abcx\"", "\"éxéé\""],
    );
    check(
        json!({"type": "string", "format": "email", "maxLength": 7}),
        &["\"a@b.co\""],
        &["\"ab@cd.co\""],
    );
    // RFC 6531: non-ASCII characters in the local part; the domain stays ASCII.
    check(
        json!({"type": "string", "format": "idn-email"}),
        &[
            "\"a@b.co\"",
            "\"θσερ.ñ@example.com\"",
            "\"用户@example.org\"",
        ],
        &[
            "\"a@b\"",
            "\"@b.co\"",
            "\"a b@c.co\"",
            "\"a..b@c.co\"",
            "\"x\"",
        ],
    );
}

/// ECMA-262's `\b` is an ASCII word boundary (its `\w` is `[A-Za-z0-9_]`): `é` is not a
/// word character there, so `éfooé` has a boundary on each side of `foo`. In a class,
/// `\b` is the backspace.
#[test]
fn word_boundaries_are_ecma_ones() {
    check(
        json!({"type": "string", "pattern": "\\bfoo\\b"}),
        &["\"foo\"", "\"a foo b\"", "\"x-foo\"", "\"éfooé\""],
        &["\"afoob\"", "\"foobar\"", "\"_foo\"", "\"\""],
    );
    check(
        json!({"type": "string", "pattern": "^a\\B"}),
        &["\"ab\"", "\"a_\""],
        &["\"a\"", "\"a b\"", "\"aé\""],
    );
    check(
        json!({"type": "string", "pattern": "^[\\b]$"}),
        &["\"\\b\""],
        &["\"b\"", "\"\\\\\""],
    );
}

/// Key patterns with leading look-aheads take the same split as `pattern`: the main part,
/// the positive look-aheads, none of the negative ones.
#[test]
fn key_patterns_with_lookaheads() {
    check(
        json!({"type": "object", "additionalProperties": false,
               "patternProperties": {"^(?!tag$|cat)(?=.*s$|a)[a-z]+$": {"type": "integer"}}}),
        &["{}", r#"{"tags":1}"#, r#"{"ab":1,"dogs":2}"#, r#"{"a":3}"#],
        &[
            r#"{"tag":1}"#,
            r#"{"cats":1}"#,
            r#"{"dog":1}"#,
            r#"{"tags":"x"}"#,
            r#"{"A":1}"#,
        ],
    );
    check(
        json!({"type": "object", "propertyNames": {"pattern": "^((?!--).)*$"}}),
        &["{}", r#"{"a-b":1}"#, r#"{"-a-":[]}"#],
        &[r#"{"a--b":1}"#, r#"{"x":1,"--":2}"#],
    );
    // A declared key the pattern's look-ahead excludes keeps only its own schema.
    check(
        json!({"type": "object", "properties": {"tag": {"type": "string"}},
               "patternProperties": {"^(?!tag$)": {"type": "integer"}}}),
        &[r#"{"tag":"x","n":1}"#],
        &[r#"{"tag":1}"#, r#"{"n":"x"}"#],
    );
}

/// ECMA-262's `\s` is its WhiteSpace and LineTerminator: U+FEFF in, U+0085 out (Unicode's
/// White_Space the other way round); `[\s\S]` is any character.
#[test]
fn ecma_white_space() {
    check(
        json!({"type": "string", "pattern": "^\\s$"}),
        &[
            "\" \"",
            "\"\\t\"",
            "\"\\u000b\"",
            "\"\u{a0}\"",
            "\"\u{feff}\"",
            "\"\u{2029}\"",
            "\"\u{2003}\"",
        ],
        &["\"\\u0001\"", "\"\u{2013}\"", "\"\u{85}\"", "\"\""],
    );
    check(
        json!({"type": "string", "pattern": "^\\S$"}),
        &["\"\\u0001\"", "\"\u{2013}\"", "\"\u{85}\"", "\"x\""],
        &["\" \"", "\"\u{feff}\"", "\"\\n\"", "\"\u{3000}\""],
    );
    check(
        json!({"type": "string", "pattern": "^[\\s\\S]{2}$"}),
        &["\"a \"", "\"\u{feff}x\""],
        &["\"a\"", "\"abc\""],
    );
}

#[test]
fn not_pattern_excludes_matching_strings() {
    check(
        json!({"type": "string", "pattern": "^[a-z]+$", "not": {"pattern": "^x"}}),
        &["\"abc\""],
        &["\"xyz\"", "\"ABC\""],
    );
    // oneOf of two overlapping patterns: a string matching both is rejected.
    check(
        json!({"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "b$"}]}),
        &["\"ax\"", "\"xb\""],
        &["\"ab\"", "\"xx\""],
    );
}

#[test]
fn pattern_and_format_are_intersected() {
    check(
        json!({"type": "string", "format": "date", "pattern": "^2020-"}),
        &["\"2020-02-29\""],
        &["\"2021-01-01\"", "\"2020-02-30\"", "\"2020-\""],
    );
}

#[test]
fn pattern_properties_with_prefix_alternatives() {
    // Leftmost-first DFAs would stop at "a" and miss that "ab" matches too.
    check(
        json!({"type": "object", "patternProperties": {"^(a|ab)$": {"type": "integer"}}}),
        &[r#"{"ab":1}"#, r#"{"a":1}"#, r#"{"abc":"x"}"#],
        &[r#"{"ab":"x"}"#, r#"{"a":"x"}"#],
    );
}

#[test]
fn anchored_alternatives_in_patterns() {
    check(
        json!({"type": "string", "pattern": "^$|^[a-z]+$"}),
        &["\"\"", "\"abc\""],
        &["\"aB\"", "\"1\""],
    );
    check(
        json!({"type": "string", "pattern": "^\\S+$|^$"}),
        &["\"\"", "\"a-b\""],
        &["\"a b\""],
    );
}

#[test]
fn all_of_with_two_patterns_intersects_them() {
    check(
        json!({"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}]}),
        &["\"ab\"", "\"axb\""],
        &["\"a\"", "\"b\"", "\"xb\""],
    );
    check(
        json!({"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}],
               "not": {"pattern": "x"}}),
        &["\"ab\""],
        &["\"axb\"", "\"a\""],
    );
}
