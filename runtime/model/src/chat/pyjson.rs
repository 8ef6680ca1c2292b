//! JSON text as Python's `json.dumps(v, ensure_ascii=False, indent=indent)` writes it (what
//! HF's `tojson` filter produces): `", "` and `": "` separators when compact, no HTML escaping.

use serde_json::Value;

/// Serializes `v` like Python's `json.dumps` with `ensure_ascii=False`.
pub(crate) fn dumps(v: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write(v, indent, 0, &mut out);
    out
}

fn newline(indent: Option<usize>, level: usize, out: &mut String) {
    if let Some(n) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write(v: &Value, indent: Option<usize>, level: usize, out: &mut String) {
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(indent, level + 1, out);
                write(x, indent, level + 1, out);
            }
            newline(indent, level, out);
            out.push(']');
        }
        Value::Object(o) if !o.is_empty() => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(indent, level + 1, out);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write(x, indent, level + 1, out);
            }
            newline(indent, level, out);
            out.push('}');
        }
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
        // serde_json escapes only what JSON requires and keeps non-ASCII as is.
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_layout() {
        let v = serde_json::json!({"a": [1, {"b": null}], "c": "x\"y", "e": {}});
        assert_eq!(
            dumps(&v, None),
            r#"{"a": [1, {"b": null}], "c": "x\"y", "e": {}}"#
        );
        assert_eq!(
            dumps(&serde_json::json!({"a": [1, 2]}), Some(2)),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
    }
}
