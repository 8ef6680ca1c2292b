//! Equality of JSON values as JSON Schema sees it (numbers by value, objects unordered), and
//! sets of values with that equality.
//!
//! `enum` lists and their complements (`not: {enum: …}`) can hold tens of thousands of
//! values. Asking "is `v` listed" by walking the list once per value makes a compile
//! quadratic in the list and holds a compile worker far past its deadline (no state is
//! built while it runs, so the deadline is never looked at); [`ValueSet`] answers in
//! constant time from a canonical key.

use std::collections::HashSet;

use serde_json::Value;

/// JSON Schema equality (numbers by value).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// Appends to `out` a text that is equal for two values iff [`json_eq`] holds: numbers as
/// the bits of their `f64` (`-0` as `0`, as `==` sees them), objects with sorted keys,
/// strings and keys length-prefixed (so no two different lists of them share a text).
fn key_into(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(b'n'),
        Value::Bool(b) => out.push(if *b { b't' } else { b'f' }),
        Value::Number(n) => {
            out.push(b'#');
            // A JSON number always has an f64 value (serde_json has no NaN / infinity).
            let x = n.as_f64().unwrap_or(f64::NAN);
            let x = if x == 0.0 { 0.0 } else { x };
            out.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        Value::String(s) => str_into(s, b'"', out),
        Value::Array(a) => {
            out.push(b'[');
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a {
                key_into(x, out);
            }
        }
        Value::Object(m) => {
            out.push(b'{');
            out.extend_from_slice(&(m.len() as u64).to_le_bytes());
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_unstable();
            for k in keys {
                str_into(k, b':', out);
                key_into(&m[k], out);
            }
        }
    }
}

fn str_into(s: &str, tag: u8, out: &mut Vec<u8>) {
    out.push(tag);
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The canonical key of `v` (see [`key_into`]).
fn key(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    key_into(v, &mut out);
    out
}

/// A set of JSON values under [`json_eq`].
#[derive(Default)]
pub(crate) struct ValueSet {
    keys: HashSet<Vec<u8>>,
}

impl ValueSet {
    /// The set of `values`.
    pub(crate) fn of<'a>(values: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut s = ValueSet::default();
        for v in values {
            s.insert(v);
        }
        s
    }

    /// Adds `v`; whether it was new.
    pub(crate) fn insert(&mut self, v: &Value) -> bool {
        self.keys.insert(key(v))
    }

    /// Whether a value equal to `v` is in the set.
    pub(crate) fn contains(&self, v: &Value) -> bool {
        self.keys.contains(&key(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The key agrees with `json_eq` on every pair of a list of near-equal values.
    #[test]
    fn the_canonical_key_is_json_schema_equality() {
        let vals = [
            json!(1),
            json!(1.0),
            json!(-0.0),
            json!(0),
            json!(1e0),
            json!(2),
            json!("1"),
            json!(""),
            json!(null),
            json!(false),
            json!(true),
            json!([]),
            json!({}),
            json!([1, "a"]),
            json!([1.0, "a"]),
            json!(["a", 1]),
            json!({"a": 1, "b": [2]}),
            json!({"b": [2.0], "a": 1}),
            json!({"a": 1}),
            json!({"ab": "c"}),
            json!({"a": "bc"}),
            json!(["ab", "c"]),
            json!(["a", "bc"]),
            json!(9007199254740993u64),
            json!(9007199254740992u64),
        ];
        for a in &vals {
            for b in &vals {
                assert_eq!(key(a) == key(b), json_eq(a, b), "{a} vs {b}");
            }
        }
        let set = ValueSet::of(&vals);
        assert!(set.contains(&json!(-0)) && set.contains(&json!({"b": [2], "a": 1.0})));
        assert!(!set.contains(&json!("2")) && !set.contains(&json!({"a": 2})));
    }
}
