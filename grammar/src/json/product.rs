//! Intersections of two `anyOf` (an `allOf` of them, or a sibling `anyOf` beside an
//! `allOf` part): distributed over the branch pairs, `(x1 | x2 ..) & (y1 | y2 ..)` =
//! the union of every `xi & yj`, with the pairs known to be empty or redundant left out
//! before they are counted against the limit:
//! - a branch that contradicts the keywords beside the two `anyOf`, or a pair that does
//!   (`conflict`: no common type, count bounds, more required keys than `maxProperties`, a
//!   key or a witness key a closed object cannot have), or a pair of branches provably
//!   disjoint (`disjoint`: types, also through `anyOf`/`oneOf` branches, values, a
//!   discriminating property, a key one side requires and the other forbids), is empty;
//! - outer `enum`/`const` values: a pair none of them satisfies is empty;
//! - a branch that implies a branch of the other side (`x ⇒ y`: every keyword of `y` is in
//!   `x`, equal, or weaker in a way read off directly) is taken whole: `x & B = x`, so none of
//!   its pairs is needed. Complements of `oneOf` branches share most of their alternatives
//!   (`not: {type: object}`, a key absent, …), so this is what keeps `b_i & ¬b_j & ¬b_k`
//!   small.
//!
//! The pairs left are merged when there are at most 96, or at most 256 whose schema texts
//! add up to at most 64 KiB (small pairs compile to small automata); more is refused.

use serde_json::{Map, Value};

use super::check::check_value;
use super::norm::{type_bits, type_list};
use super::{is_annotation, json_eq, JsonCompiler, ValueSet};
use crate::CompileError;

/// Most branch pairs two `anyOf` merged in an `allOf` are checked for disjointness.
const MAX_ANY_OF_PAIRS: usize = 4096;

/// Most (not provably disjoint, not redundant) branch pairs two `anyOf` merged in an
/// `allOf` may leave.
const MAX_ANY_OF_MERGED: usize = 96;

/// Most pairs when they are small: their schema texts together at most
/// `MAX_ANY_OF_MERGED_BYTES` (each merged pair compiles to about the size of its two texts).
const MAX_ANY_OF_MERGED_SMALL: usize = 256;

/// Most bytes of schema text (both sides of every pair) beyond `MAX_ANY_OF_MERGED` pairs.
const MAX_ANY_OF_MERGED_BYTES: usize = 64 * 1024;

/// Most `enum` values checked one by one to tell two schemas apart.
const MAX_VALUE_CHECKS: usize = 64;

impl JsonCompiler<'_> {
    /// The branches of `anyOf: xa` ∧ `anyOf: xb`, the two sitting in the schemas `a` and `b`
    /// (whose other keywords also apply): one branch per pair that may be non-empty, and
    /// whole the branches that imply one of the other side.
    pub(super) fn merge_any_of(
        &mut self,
        xa: &[Value],
        xb: &[Value],
        a: &Map<String, Value>,
        b: &Map<String, Value>,
        ptr: &str,
        depth: u32,
    ) -> Result<Vec<Value>, CompileError> {
        let too_large = || CompileError::Unsupported {
            keyword: "allOf".into(),
            pointer: ptr.into(),
            reason: "intersection of two large anyOf".into(),
        };
        if xa.len() * xb.len() > MAX_ANY_OF_PAIRS * 16 {
            return Err(too_large());
        }
        // Branches that contradict the keywords beside the two `anyOf` (a type, count
        // bounds, a forbidden key, outer values) are empty and dropped first.
        let mut na = Vec::new();
        for x in xa.iter().chain(xb) {
            let x = match x {
                Value::Object(m) => Value::Object(self.normalize(m, ptr, depth + 1)?),
                other => other.clone(),
            };
            if x == Value::Bool(false) || x.as_object().is_some_and(|m| contradicts(m, a, b)) {
                na.push(None);
            } else {
                na.push(Some(x));
            }
        }
        let nb: Vec<Value> = na.split_off(xa.len()).into_iter().flatten().collect();
        let na: Vec<Value> = na.into_iter().flatten().collect();
        if na.len() * nb.len() > MAX_ANY_OF_PAIRS {
            return Err(too_large());
        }
        // Branches implying a branch of the other side: taken whole (`x & B = x` when
        // `x ⇒ y ∈ B`; every pair `x & y'` is inside `x`).
        let whole_a: Vec<bool> = na
            .iter()
            .map(|x| nb.iter().any(|y| implies(x, y)))
            .collect();
        let whole_b: Vec<bool> = nb
            .iter()
            .map(|y| na.iter().any(|x| implies(y, x)))
            .collect();
        let vals = value_set(a).or_else(|| value_set(b));
        let mut pairs = Vec::new();
        for (x, _) in na.iter().zip(&whole_a).filter(|(_, w)| !**w) {
            for (y, _) in nb.iter().zip(&whole_b).filter(|(_, w)| !**w) {
                if let (Value::Object(p), Value::Object(q)) = (x, y) {
                    if disjoint(p, q)
                        || vals.as_ref().is_some_and(|v| values_excluded(v, p, q))
                        || conflict(&[p, q, a, b])
                    {
                        continue;
                    }
                }
                pairs.push((x, y));
            }
        }
        if pairs.len() > MAX_ANY_OF_MERGED_SMALL
            || (pairs.len() > MAX_ANY_OF_MERGED
                && pairs
                    .iter()
                    .map(|(x, y)| text_len(x) + text_len(y))
                    .sum::<usize>()
                    > MAX_ANY_OF_MERGED_BYTES)
        {
            return Err(too_large());
        }
        let mut alts: Vec<Value> = Vec::new();
        let wholes = (na.iter().zip(&whole_a)).chain(nb.iter().zip(&whole_b));
        for (x, _) in wholes.filter(|(_, w)| **w) {
            if !alts.iter().any(|y| json_eq(x, y)) {
                alts.push(x.clone());
            }
        }
        for (x, y) in pairs {
            let m = self.merge_schemas(x, y, ptr, depth + 1)?;
            if !m.as_object().is_some_and(|m| contradicts(m, a, b)) {
                alts.push(m);
            }
        }
        if alts.is_empty() {
            alts.push(Value::Bool(false));
        }
        Ok(alts)
    }
}

/// The length of a schema's JSON text.
fn text_len(v: &Value) -> usize {
    serde_json::to_vec(v).map_or(usize::MAX / 1024, |t| t.len())
}

/// Keywords whose meaning depends on siblings: `x ⇒ y` through them only when the whole
/// group is equal in both.
const GROUPS: &[&[&str]] = &[
    &[
        "properties",
        "patternProperties",
        "additionalProperties",
        "__pattern_else",
    ],
    &["items", "prefixItems", "additionalItems"],
    &["if", "then", "else"],
    &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"],
    &["contains", "minContains", "maxContains"],
];

/// True when every value of `x` is a value of `y` for a reason read off their keywords
/// (conservative: false when unsure): each keyword of `y` is in `x` and equal, or — for
/// `type`, `required`, `__forbidden`, `properties` — weaker.
fn implies(x: &Value, y: &Value) -> bool {
    let (x, y) = match (x, y) {
        (_, Value::Bool(true)) | (Value::Bool(false), _) => return true,
        (Value::Object(x), Value::Object(y)) => (x, y),
        _ => return false,
    };
    let list = |m: &Map<String, Value>, k: &str| -> Vec<Value> {
        m.get(k)
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default()
    };
    y.iter().all(|(k, vy)| {
        if is_annotation(k) {
            return true;
        }
        let group = GROUPS.iter().find(|g| g.contains(&k.as_str()));
        match k.as_str() {
            "type" => {
                let ty = type_bits(&Map::from_iter([("type".to_string(), vy.clone())]));
                type_bits(x) & !ty == 0
            }
            "required" | "__forbidden" => {
                let lx = list(x, k);
                list(y, k).iter().all(|r| lx.contains(r))
            }
            // Each property `y` constrains, constrained alike by `x` (`properties` alone
            // is per key; beside `additionalProperties`/`patternProperties` the group must
            // be equal).
            "properties"
                if [
                    "patternProperties",
                    "additionalProperties",
                    "__pattern_else",
                ]
                .iter()
                .all(|g| !y.contains_key(*g)) =>
            {
                let (Some(px), Some(py)) = (x.get(k).and_then(|v| v.as_object()), vy.as_object())
                else {
                    return false;
                };
                py.iter()
                    .all(|(pk, s)| px.get(pk).is_some_and(|t| json_eq(s, t)))
            }
            "unevaluatedProperties" | "unevaluatedItems" => false,
            _ => match group {
                Some(g) => g.iter().all(|gk| match (x.get(*gk), y.get(*gk)) {
                    (None, None) => true,
                    (Some(p), Some(q)) => json_eq(p, q),
                    _ => false,
                }),
                None => x.get(k).is_some_and(|vx| json_eq(vx, vy)),
            },
        }
    })
}

/// True when no value satisfies `x` together with `a` and `b` (see `conflict`).
fn contradicts(x: &Map<String, Value>, a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    // A side with finite values (`enum`/`const`): none of them satisfies `x`.
    if let Some(vals) = value_set(a).or_else(|| value_set(b)) {
        if values_excluded(vals, x, x) {
            return true;
        }
    }
    conflict(&[x, a, b])
}

/// True when no value satisfies all of `all` for a reason read off their keywords directly
/// (conservative: false when unsure): no common type, or — when the common type is one
/// kind — contradictory count bounds for that kind, or, on objects, a key required by one
/// and forbidden by another, more required keys than `maxProperties`, a required key or a
/// witness key (`__has_other`) that a closed object (`additionalProperties: false`) cannot
/// have.
fn conflict(all: &[&Map<String, Value>]) -> bool {
    let t = all.iter().fold(127u8, |t, m| t & branch_type_bits(m, 0));
    if t == 0 {
        return true;
    }
    let lower = |k: &str| {
        all.iter()
            .filter_map(|m| m.get(k).and_then(|v| v.as_f64()))
            .fold(f64::NEG_INFINITY, f64::max)
    };
    let upper = |k: &str| {
        all.iter()
            .filter_map(|m| m.get(k).and_then(|v| v.as_f64()))
            .fold(f64::INFINITY, f64::min)
    };
    match t {
        8 => lower("minItems") > upper("maxItems"),
        16 => lower("minLength") > upper("maxLength"),
        4 => {
            let list = |k: &str| -> Vec<String> {
                let mut out: Vec<String> = Vec::new();
                for m in all {
                    for x in m.get(k).and_then(|v| v.as_array()).into_iter().flatten() {
                        if let Some(x) = x.as_str() {
                            if !out.iter().any(|y| y == x) {
                                out.push(x.to_string());
                            }
                        }
                    }
                }
                out
            };
            let (req, forb) = (list("required"), list("__forbidden"));
            let max = upper("maxProperties");
            if lower("minProperties") > max
                || (req.len() as f64) > max
                || forb.iter().any(|k| req.contains(k))
            {
                return true;
            }
            all.iter()
                .filter_map(|m| closed_keys(m))
                .any(|(keys, pats)| {
                    req.iter()
                        .any(|k| closed_allows(&keys, &pats, k) == Some(false))
                        || all.iter().any(|m| witness_excluded(m, &keys, &pats))
                })
        }
        _ => false,
    }
}

/// The declared keys and key patterns of a closed object (`additionalProperties: false`).
fn closed_keys(m: &Map<String, Value>) -> Option<(Vec<String>, Vec<String>)> {
    if m.get("additionalProperties") != Some(&Value::Bool(false)) {
        return None;
    }
    let keys = |k: &str| -> Vec<String> {
        m.get(k)
            .and_then(|p| p.as_object())
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    };
    Some((keys("properties"), keys("patternProperties")))
}

/// Whether a closed object with these declared keys and patterns may have `key` (`None`:
/// a pattern that cannot be checked here).
fn closed_allows(keys: &[String], pats: &[String], key: &str) -> Option<bool> {
    if keys.iter().any(|k| k == key) {
        return Some(true);
    }
    for p in pats {
        if cached_match(p, key)? {
            return Some(true);
        }
    }
    Some(false)
}

/// True when `m` needs a witness key (`__has_other`: some key listed by a condition, or
/// some key outside it) that a closed object without patterns cannot have: none of its
/// declared keys is such a key.
fn witness_excluded(m: &Map<String, Value>, keys: &[String], pats: &[String]) -> bool {
    if !pats.is_empty() {
        return false;
    }
    let Some(Value::Array(conds)) = m.get("__has_other") else {
        return false;
    };
    conds.iter().any(|c| {
        let positive = c.get("match") == Some(&Value::Bool(true));
        let listed_keys = c.get("keys").and_then(|v| v.as_array());
        let listed_pats = c.get("patterns").and_then(|v| v.as_array());
        let (Some(lk), Some(lp)) = (listed_keys, listed_pats) else {
            return false;
        };
        // Every declared key of the closed object decided, and none a witness.
        keys.iter().all(|k| {
            let mut listed = Some(lk.iter().any(|x| x.as_str() == Some(k)));
            for p in lp {
                listed = match (listed, p.as_str().and_then(|p| cached_match(p, k))) {
                    (Some(true), _) => Some(true),
                    (Some(false), Some(m)) => Some(m),
                    _ => None,
                };
            }
            listed == Some(!positive)
        })
    })
}

/// Full match of an ECMA `pattern` against `text` (`check::regex_full_match`, cached).
fn cached_match(pattern: &str, text: &str) -> Option<bool> {
    super::check::regex_full_match(pattern, crate::regex::Flavor::EcmaSearch, text)
}

/// The values of an `enum`/`const` schema.
pub(super) fn value_set(s: &Map<String, Value>) -> Option<&[Value]> {
    if let Some(c) = s.get("const") {
        return Some(std::slice::from_ref(c));
    }
    s.get("enum")
        .and_then(|e| e.as_array())
        .map(|e| e.as_slice())
}

/// The values a schema admits when it names them: its `enum`/`const`, or the one string of a
/// string schema whose `pattern` is a literal between `^` and `$` (`{"type": "string",
/// "pattern": "^SEQ$"}`, a tag that unions discriminate on as often as on a `const`). A
/// superset: other keywords may refuse some of them.
pub(super) fn named_values(s: &Map<String, Value>) -> Option<std::borrow::Cow<'_, [Value]>> {
    if let Some(v) = value_set(s) {
        return Some(std::borrow::Cow::Borrowed(v));
    }
    if s.get("type").and_then(|t| t.as_str()) != Some("string") {
        return None;
    }
    let lit = s
        .get("pattern")?
        .as_str()?
        .strip_prefix('^')?
        .strip_suffix('$')?;
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ' ' | ':' | '@');
    if !lit.chars().all(plain) {
        return None;
    }
    Some(std::borrow::Cow::Owned(vec![Value::String(
        lit.to_string(),
    )]))
}

/// Whether the two lists share a value (pairwise for short lists, through a set for long).
pub(super) fn share_a_value(x: &[Value], y: &[Value]) -> bool {
    if x.len().min(y.len()) <= 16 {
        return x.iter().any(|p| y.iter().any(|q| json_eq(p, q)));
    }
    let ys = ValueSet::of(y);
    x.iter().any(|p| ys.contains(p))
}

/// The types a schema admits, also through the branches of its `anyOf`/`oneOf` (a
/// superset: a value of the schema matches one of the branches).
fn branch_type_bits(s: &Map<String, Value>, depth: u32) -> u8 {
    let mut bits = type_bits(s);
    if depth > 4 {
        return bits;
    }
    for kw in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = s.get(kw) {
            let mut u = 0u8;
            for br in branches {
                u |= match br {
                    Value::Bool(false) => 0,
                    Value::Object(m) => branch_type_bits(m, depth + 1),
                    _ => 127,
                };
            }
            bits &= u;
        }
    }
    bits
}

/// True when every value of `vals` is rejected by `x` or by `y`, as far as the value
/// checker decides (a keyword it cannot decide keeps the value).
fn values_excluded(vals: &[Value], x: &Map<String, Value>, y: &Map<String, Value>) -> bool {
    vals.len() <= MAX_VALUE_CHECKS
        && vals
            .iter()
            .all(|v| check_value(v, x) == Some(false) || check_value(v, y) == Some(false))
}

/// True when no JSON value can satisfy both (conservative: false when unsure).
pub(super) fn disjoint(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    let common = branch_type_bits(a, 0) & branch_type_bits(b, 0);
    if common == 0 {
        return true;
    }
    match (named_values(a), named_values(b)) {
        (Some(x), Some(y)) if !share_a_value(&x, &y) => return true,
        // A finite side's values checked against both sides (the other side's keywords, or
        // its own beside the values: `enum` of every tag with a `pattern` picking one).
        (Some(x), _) if values_excluded(&x, a, b) => return true,
        (None, Some(y)) if values_excluded(&y, a, b) => return true,
        _ => {}
    }
    // A value of both is an object from here (non-object values could match both).
    if common != 4 {
        return false;
    }
    let req = |s: &Map<String, Value>| s.get("required").map(type_list).unwrap_or_default();
    let props = |s: &Map<String, Value>| {
        s.get("properties")
            .and_then(|p| p.as_object())
            .cloned()
            .unwrap_or_default()
    };
    let (ra, rb, pa, pb) = (req(a), req(b), props(a), props(b));
    // More properties a value of both needs (the keys either side requires, either side's
    // `minProperties`) than one side allows (`maxProperties`): `oneOf` of `required: [a]`
    // and `required: [b]` beside `maxProperties: 1`, or a side requiring two keys against
    // one allowing a single property.
    let count = |s: &Map<String, Value>, kw: &str| s.get(kw).and_then(|v| v.as_u64());
    let keys: std::collections::HashSet<&String> = ra.iter().chain(&rb).collect();
    let least = (keys.len() as u64)
        .max(count(a, "minProperties").unwrap_or(0))
        .max(count(b, "minProperties").unwrap_or(0));
    if [a, b]
        .iter()
        .any(|s| count(s, "maxProperties").is_some_and(|m| least > m))
    {
        return true;
    }
    // A discriminating property: required (so present) with disjoint value sets.
    for k in ra.iter().chain(&rb) {
        if let (Some(Value::Object(x)), Some(Value::Object(y))) = (pa.get(k), pb.get(k)) {
            if disjoint(x, y) {
                return true;
            }
        }
    }
    // A key one side requires and the other forbids.
    let closed = |s: &Map<String, Value>| {
        s.get("additionalProperties") == Some(&Value::Bool(false))
            && !s.contains_key("patternProperties")
    };
    if (closed(b) && ra.iter().any(|k| !pb.contains_key(k)))
        || (closed(a) && rb.iter().any(|k| !pa.contains_key(k)))
    {
        return true;
    }
    let forbidden = |s: &Map<String, Value>| {
        s.get("__forbidden")
            .and_then(|r| r.as_array())
            .cloned()
            .unwrap_or_default()
    };
    let (fa, fb) = (forbidden(a), forbidden(b));
    ra.iter().any(|k| fb.iter().any(|f| f.as_str() == Some(k)))
        || rb.iter().any(|k| fa.iter().any(|f| f.as_str() == Some(k)))
}
