//! The key conditions (`__has_other`) of an object schema: witnesses that some key lies
//! outside a set of names and patterns (or, positive, among them), from the complements of
//! `additionalProperties` and `propertyNames`. Each costs the object automaton a bit
//! (`object.rs`), so the ones others imply are dropped here.

use serde_json::{Map, Value};

/// One `__has_other` condition: (names, patterns, positive, value schema). With a value
/// schema, a witness key (listed when positive, else unlisted) whose value is in that
/// schema.
pub(super) type KeyCond = (Vec<String>, Vec<String>, bool, Option<Value>);

/// The `__has_other` conditions of an object schema, each asking for a key that is none of
/// the names and matches none of the patterns (or, when `positive` — `"match": true` —
/// a key that is one of the names or matches one of the patterns).
pub(super) fn has_other_conditions(s: &Map<String, Value>) -> Vec<KeyCond> {
    let strs = |v: Option<&Value>| -> Vec<String> {
        v.and_then(|x| x.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let conds: Vec<KeyCond> = s
        .get("__has_other")
        .and_then(|h| h.as_array())
        .map(|conds| {
            conds
                .iter()
                .map(|c| {
                    let positive = c.get("match") == Some(&Value::Bool(true));
                    let value = c.get("value").cloned();
                    (
                        strs(c.get("keys")),
                        strs(c.get("patterns")),
                        positive,
                        value,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    implied_conditions_dropped(conds, &strs(s.get("required")))
}

/// Key conditions without the ones every object that meets the rest meets too (each one
/// costs a witness bit, and at most four fit): a copy of another; a plain "some key outside
/// `K` and `P`" when another asks for a key outside a superset of both (and a plain "some
/// key among `K`, `P`" when another asks for one among a subset); and one that a required
/// key meets (outside `K` with no patterns, or among `K`). Exact.
fn implied_conditions_dropped(conds: Vec<KeyCond>, required: &[String]) -> Vec<KeyCond> {
    // Names and patterns compared as sets (their order is the order the names not declared
    // take as optional properties, so it stays).
    let sub = |a: &[String], b: &[String]| a.iter().all(|x| b.contains(x));
    let same = |c: &KeyCond, d: &KeyCond| {
        c.2 == d.2
            && c.3 == d.3
            && sub(&c.0, &d.0)
            && sub(&d.0, &c.0)
            && sub(&c.1, &d.1)
            && sub(&d.1, &c.1)
    };
    let implies = |j: &KeyCond, i: &KeyCond| {
        j.3.is_none()
            && i.3.is_none()
            && j.2 == i.2
            && if i.2 {
                sub(&j.0, &i.0) && sub(&j.1, &i.1)
            } else {
                sub(&i.0, &j.0) && sub(&i.1, &j.1)
            }
    };
    let met = |c: &KeyCond| {
        c.3.is_none()
            && if c.2 {
                required.iter().any(|k| c.0.contains(k))
            } else {
                c.1.is_empty() && required.iter().any(|k| !c.0.contains(k))
            }
    };
    let mut keep: Vec<KeyCond> = Vec::with_capacity(conds.len());
    for (i, c) in conds.iter().enumerate() {
        if met(c) || keep.iter().any(|k| same(k, c)) {
            continue;
        }
        // Implied by another condition that is not the same (the same is dropped above once
        // one copy is kept).
        let implied = conds
            .iter()
            .enumerate()
            .any(|(j, d)| j != i && !same(d, c) && implies(d, c));
        if !implied {
            keep.push(c.clone());
        }
    }
    keep
}
