//! Keywords made exact for coverage in session 6: the `duration` format, `uri` /
//! `uri-reference` with IP literals (and the complements of these formats, for `oneOf` and
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
    // A second top-level branch, a look-ahead inside a loop, a look-behind, and a negated
    // look-ahead pattern: refused, never loosened.
    for p in ["^(?!a)b|c", "^((?!mode).)*$", "(?<=a)b"] {
        assert!(
            compile(&json!({"type": "string", "pattern": p})).is_err(),
            "{p}"
        );
    }
    assert!(compile(&json!({"type": "string", "not": {"pattern": "^(?!a)"}})).is_err());
}
