//! A small validator for literal values (`enum`/`const` members) against the keywords that
//! sit beside them: `Some(valid)`, or `None` when a keyword cannot be decided here (then the
//! caller refuses the schema rather than guess).

use serde_json::{Map, Value};

use super::formats::format_regex;
use super::norm::{num, type_bits};
use super::{is_annotation, json_eq};
use crate::regex::Flavor;

/// Full match of `re` (parsed as `flavor`) against `t`; `None` when it cannot be compiled.
/// Compiled patterns are kept per thread: an `enum` of thousands of strings beside a
/// `pattern` checks every value against the same one, and product checks the same few key
/// patterns against many branch pairs.
pub(super) fn regex_full_match(re: &str, flavor: Flavor, t: &str) -> Option<bool> {
    use std::cell::RefCell;
    use std::collections::HashMap;
    type Cache = HashMap<(String, Flavor), Option<super::norm::FullMatch>>;
    thread_local! {
        static CACHE: RefCell<Cache> = RefCell::new(HashMap::new());
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() > 256 {
            c.clear();
        }
        c.entry((re.to_string(), flavor))
            .or_insert_with(|| super::norm::full_match_regex_as(re, flavor).ok())
            .as_ref()
            .map(|r| r.is_match(t))
    })
}

/// Checks `v` against a schema value (`true`, `false` or an object).
pub(super) fn check_schema(v: &Value, s: &Value) -> Option<bool> {
    match s {
        Value::Bool(b) => Some(*b),
        Value::Object(m) => check_value(v, m),
        _ => None,
    }
}

fn all_of<'a>(mut it: impl Iterator<Item = Option<bool>> + 'a) -> Option<bool> {
    let mut unknown = false;
    for x in it.by_ref() {
        match x {
            Some(false) => return Some(false),
            None => unknown = true,
            Some(true) => {}
        }
    }
    if unknown {
        None
    } else {
        Some(true)
    }
}

/// Checks a value against a schema's keywords.
pub(super) fn check_value(v: &Value, s: &Map<String, Value>) -> Option<bool> {
    let mut unknown = false;
    for (k, x) in s {
        let r: Option<bool> = match (k.as_str(), v) {
            ("__false", _) => Some(false),
            (kw, _) if is_annotation(kw) => Some(true),
            ("then" | "else", _) if !s.contains_key("if") => Some(true),
            ("enum", _) => Some(x.as_array()?.iter().any(|e| json_eq(e, v))),
            ("const", _) => Some(json_eq(x, v)),
            ("__not_enum", _) => Some(!x.as_array()?.iter().any(|e| json_eq(e, v))),
            ("__not_pattern", Value::String(t)) => {
                let mut ok = true;
                for p in x.as_array()? {
                    ok &= !regex_full_match(p.as_str()?, Flavor::EcmaSearch, t)?;
                }
                Some(ok)
            }
            ("__not_pattern", _) => Some(true),
            ("__patterns", Value::String(t)) => {
                let mut ok = true;
                for p in x.as_array()? {
                    ok &= regex_full_match(p.as_str()?, Flavor::EcmaSearch, t)?;
                }
                Some(ok)
            }
            ("__patterns", _) => Some(true),
            ("type", _) => {
                let bits = type_bits(&Map::from_iter([("type".to_string(), x.clone())]));
                let vb = match v {
                    Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => 64 | 32,
                    other => type_bits(&Map::from_iter([("const".to_string(), other.clone())])),
                };
                Some(bits & vb != 0)
            }
            ("not", _) => check_schema(v, x).map(|b| !b),
            ("allOf", _) => all_of(x.as_array()?.iter().map(|b| check_schema(v, b))),
            ("anyOf" | "oneOf", _) => {
                let rs: Vec<Option<bool>> =
                    x.as_array()?.iter().map(|b| check_schema(v, b)).collect();
                if rs.iter().any(|r| r.is_none()) {
                    None
                } else {
                    let n = rs.iter().filter(|r| **r == Some(true)).count();
                    Some(if k == "anyOf" { n >= 1 } else { n == 1 })
                }
            }
            ("if", _) => match check_schema(v, x)? {
                true => s.get("then").map_or(Some(true), |t| check_schema(v, t)),
                false => s.get("else").map_or(Some(true), |t| check_schema(v, t)),
            },
            // Strings.
            ("minLength", Value::String(t)) => Some((t.chars().count() as f64) >= num(x)),
            ("maxLength", Value::String(t)) => Some((t.chars().count() as f64) <= num(x)),
            ("pattern", Value::String(t)) => regex_full_match(x.as_str()?, Flavor::EcmaSearch, t),
            ("format", Value::String(t)) => match format_regex(x.as_str()?) {
                Some(re) if re.is_empty() => Some(true),
                Some(re) => regex_full_match(&re, Flavor::FullMatch, t),
                None => None,
            },
            // Numbers.
            ("minimum", Value::Number(n)) => Some(n.as_f64()? >= num(x)),
            ("maximum", Value::Number(n)) => Some(n.as_f64()? <= num(x)),
            ("exclusiveMinimum", Value::Number(n)) => match x {
                Value::Bool(false) => Some(true),
                Value::Bool(true) => Some(n.as_f64()? > num(s.get("minimum")?)),
                _ => Some(n.as_f64()? > num(x)),
            },
            ("exclusiveMaximum", Value::Number(n)) => match x {
                Value::Bool(false) => Some(true),
                Value::Bool(true) => Some(n.as_f64()? < num(s.get("maximum")?)),
                _ => Some(n.as_f64()? < num(x)),
            },
            ("multipleOf", Value::Number(n)) => is_multiple(n, x.as_number()?),
            ("__multiples", Value::Number(n)) => {
                let mut all = true;
                for m in x.as_array()? {
                    all &= is_multiple(n, m.as_number()?)?;
                }
                Some(all)
            }
            ("__not_multiple", Value::Number(n)) => {
                let mut none = true;
                for m in x.as_array()? {
                    none &= !is_multiple(n, m.as_number()?)?;
                }
                Some(none)
            }
            // Objects.
            ("__forbidden", Value::Object(o)) => Some(
                !x.as_array()?
                    .iter()
                    .any(|k| k.as_str().is_some_and(|k| o.contains_key(k))),
            ),
            ("__fraction", Value::Number(n)) => Some(n.as_f64()?.fract() != 0.0),
            ("__fraction", _) => Some(true),
            ("__has_other", Value::Object(o)) => {
                let mut all = true;
                for c in x.as_array()? {
                    let keys = c.get("keys")?.as_array()?;
                    let pats = c.get("patterns")?.as_array()?;
                    let positive = c.get("match") == Some(&Value::Bool(true));
                    let value = c.get("value");
                    let mut found = false;
                    for (k, kv) in o {
                        let mut listed = keys.iter().any(|x| x.as_str() == Some(k.as_str()));
                        for p in pats {
                            listed |= regex_full_match(p.as_str()?, Flavor::EcmaSearch, k)?;
                        }
                        // A witness key (listed when positive, else not listed) whose value
                        // is in the condition's value schema, when it has one.
                        if listed == positive {
                            found |= match value {
                                Some(vs) => check_schema(kv, vs)?,
                                None => true,
                            };
                        }
                    }
                    all &= found;
                }
                Some(all)
            }
            ("required", Value::Object(o)) => Some(
                x.as_array()?
                    .iter()
                    .all(|k| k.as_str().is_some_and(|k| o.contains_key(k))),
            ),
            ("minProperties", Value::Object(o)) => Some(o.len() as f64 >= num(x)),
            ("maxProperties", Value::Object(o)) => Some(o.len() as f64 <= num(x)),
            ("properties", Value::Object(o)) => all_of(
                x.as_object()?
                    .iter()
                    .filter_map(|(k, ps)| o.get(k).map(|ov| check_schema(ov, ps))),
            ),
            ("patternProperties", Value::Object(o)) => {
                let mut out = Vec::new();
                for (p, ps) in x.as_object()? {
                    for (k, ov) in o {
                        if regex_full_match(p, Flavor::EcmaSearch, k)? {
                            out.push(check_schema(ov, ps));
                        }
                    }
                }
                all_of(out.into_iter())
            }
            ("additionalProperties", Value::Object(o)) => {
                let props = s.get("properties").and_then(|p| p.as_object());
                let pats: Vec<&String> = s
                    .get("patternProperties")
                    .and_then(|p| p.as_object())
                    .map(|p| p.keys().collect())
                    .unwrap_or_default();
                let mut out = Vec::new();
                for (k, ov) in o {
                    if props.is_some_and(|p| p.contains_key(k)) {
                        continue;
                    }
                    let mut matched = false;
                    for p in &pats {
                        matched |= regex_full_match(p, Flavor::EcmaSearch, k)?;
                    }
                    if !matched {
                        out.push(check_schema(ov, x));
                    }
                }
                all_of(out.into_iter())
            }
            ("propertyNames", Value::Object(o)) => all_of(
                o.keys()
                    .map(|k| check_schema(&Value::String(k.clone()), x))
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
            ("dependentRequired" | "dependencies" | "dependentSchemas", Value::Object(o)) => {
                let mut out = Vec::new();
                for (k, d) in x.as_object()? {
                    if !o.contains_key(k) {
                        continue;
                    }
                    out.push(match d {
                        Value::Array(keys) => Some(
                            keys.iter()
                                .all(|k| k.as_str().is_some_and(|k| o.contains_key(k))),
                        ),
                        other => check_schema(v, other),
                    });
                }
                all_of(out.into_iter())
            }
            // Arrays.
            ("minItems", Value::Array(a)) => Some(a.len() as f64 >= num(x)),
            ("maxItems", Value::Array(a)) => Some(a.len() as f64 <= num(x)),
            ("uniqueItems", Value::Array(a)) => Some(
                x != &Value::Bool(true)
                    || (0..a.len()).all(|i| (i + 1..a.len()).all(|j| !json_eq(&a[i], &a[j]))),
            ),
            ("items", Value::Array(a)) => match x {
                Value::Array(tuple) if !s.contains_key("prefixItems") => all_of(
                    a.iter()
                        .zip(tuple)
                        .map(|(e, t)| check_schema(e, t))
                        .collect::<Vec<_>>()
                        .into_iter(),
                ),
                _ => {
                    let skip = match (s.get("prefixItems"), x) {
                        (_, Value::Array(_)) => return None,
                        (Some(Value::Array(p)), _) => p.len(),
                        _ => 0,
                    };
                    all_of(
                        a.iter()
                            .skip(skip)
                            .map(|e| check_schema(e, x))
                            .collect::<Vec<_>>()
                            .into_iter(),
                    )
                }
            },
            ("prefixItems", Value::Array(a)) => all_of(
                a.iter()
                    .zip(x.as_array()?)
                    .map(|(e, t)| check_schema(e, t))
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
            ("additionalItems", Value::Array(a)) => match s.get("items") {
                Some(Value::Array(t)) => all_of(
                    a.iter()
                        .skip(t.len())
                        .map(|e| check_schema(e, x))
                        .collect::<Vec<_>>()
                        .into_iter(),
                ),
                _ => Some(true),
            },
            ("contains", Value::Array(a)) => {
                let rs: Vec<Option<bool>> = a.iter().map(|e| check_schema(e, x)).collect();
                if rs.iter().any(|r| r.is_none()) {
                    None
                } else {
                    let n = rs.iter().filter(|r| **r == Some(true)).count() as f64;
                    let lo = s.get("minContains").map_or(1.0, num);
                    let hi = s.get("maxContains").map_or(f64::INFINITY, num);
                    Some(n >= lo && n <= hi)
                }
            }
            ("__contains", Value::Array(a)) => {
                let mut all = true;
                for c in x.as_array()? {
                    let mut any = false;
                    for e in a {
                        any |= check_schema(e, c)?;
                    }
                    all &= any;
                }
                Some(all)
            }
            ("minContains" | "maxContains", _) => Some(true),
            // Keywords that do not apply to this value's type.
            ("minLength" | "maxLength" | "pattern" | "format", _) if !v.is_string() => Some(true),
            (
                "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf"
                | "__multiples" | "__not_multiple",
                _,
            ) if !v.is_number() => Some(true),
            (
                "properties"
                | "required"
                | "additionalProperties"
                | "patternProperties"
                | "minProperties"
                | "maxProperties"
                | "propertyNames"
                | "dependencies"
                | "dependentRequired"
                | "dependentSchemas"
                | "__forbidden"
                | "__has_other",
                _,
            ) if !v.is_object() => Some(true),
            (
                "items" | "prefixItems" | "additionalItems" | "minItems" | "maxItems"
                | "uniqueItems" | "contains" | "__contains",
                _,
            ) if !v.is_array() => Some(true),
            _ => None,
        };
        match r {
            Some(false) => return Some(false),
            None => unknown = true,
            Some(true) => {}
        }
    }
    if unknown {
        None
    } else {
        Some(true)
    }
}

/// A JSON number as `mantissa * 10^exp`, exactly (from its shortest decimal text).
pub(super) fn decimal(n: &serde_json::Number) -> Option<(i128, i32)> {
    let t = n.to_string();
    let (base, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().ok()?),
        None => (t.as_str(), 0),
    };
    let (int, frac) = base.split_once('.').unwrap_or((base, ""));
    let digits = format!("{int}{frac}");
    let m: i128 = digits.parse().ok()?;
    Some((m, exp - frac.len() as i32))
}

/// Exact `a` is a multiple of `m` (`None` on a non-positive divisor or an unreadable number).
pub(super) fn is_multiple(a: &serde_json::Number, m: &serde_json::Number) -> Option<bool> {
    let (am, ae) = decimal(a)?;
    let (mm, me) = decimal(m)?;
    if mm <= 0 {
        return None;
    }
    // a / m = (am / mm) * 10^d.
    let d = ae - me;
    if d >= 0 {
        // mm divides am * 10^d: modular arithmetic (10^d may be huge, e.g. 1e308).
        let mut p: i128 = 1 % mm;
        let mut base: i128 = 10 % mm;
        let mut k = d as u32;
        while k > 0 {
            if k & 1 == 1 {
                p = p.checked_mul(base)? % mm;
            }
            base = base.checked_mul(base)? % mm;
            k >>= 1;
        }
        Some((am % mm).checked_mul(p)? % mm == 0)
    } else {
        // mm * 10^-d divides am; when that divisor exceeds every mantissa, only 0 does.
        match 10i128
            .checked_pow(d.unsigned_abs())
            .and_then(|t| t.checked_mul(mm))
        {
            Some(q) => Some(am % q == 0),
            None => Some(am == 0),
        }
    }
}
