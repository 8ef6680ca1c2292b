//! Dependencies that only say which keys are present and which listed values some keys
//! hold (`dependentRequired`, array `dependencies`, and schema dependencies made of
//! `required`, `properties: {p: {enum | const}}`, `not`, `anyOf`, `oneOf`, `allOf` alone)
//! as one formula, written as disjoint alternatives.
//!
//! Each dependency compiled on its own is `k absent or (k present and what it needs)`, and
//! their `allOf` is distributed into every combination: beyond six dependencies that is
//! refused. A formula over the keys they mention is expanded instead key by key, in the
//! order the schema declares them (Shannon expansion): a key is decided only where the
//! formula so far depends on it, and a branch stops where the keys decided make it true
//! (the keys left are free) or false (no alternative). A key whose value the formula
//! names (a discriminator such as `type` in "`analyzer` only where `type` is `string` or
//! `autocomplete`") is decided among absent, each class of its listed values (the values
//! listed by the same conditions) and any other value. Each alternative is an object with
//! the keys decided present `required` (their class as an `enum`, or "none of the listed
//! values" as `not: {enum}`) and the ones decided absent forbidden; no two alternatives
//! share a value, so no text is read twice. Exact: an alternative is written only where
//! Kleene's three-valued evaluation says the formula holds whatever the free keys are.

use serde_json::{json, Map, Value};

use super::{is_annotation, json_eq};

/// Most keys a presence formula may mention.
const MAX_PRESENCE_KEYS: usize = 24;

/// Most alternatives a presence formula may be written as.
pub(super) const MAX_PRESENCE_ALTERNATIVES: usize = 64;

/// Most formula evaluations an expansion makes: branches that end false count too, and a
/// formula Kleene's evaluation leaves unknown until its last key (`a and not a` beside
/// other keys) would otherwise visit every assignment.
const MAX_PRESENCE_STEPS: u32 = 1 << 16;

/// Most listed values of one key the formula names.
const MAX_LISTED_VALUES: usize = 62;

/// A formula over which keys an object has and which listed values they hold.
#[derive(Clone, Debug)]
enum Formula {
    /// Key (an index into the formula's keys) present.
    Has(usize),
    /// Key absent, or present with one of these values (`properties: {k: {enum}}`); an
    /// index into the key's value lists, turned into a set of classes before expansion.
    In(usize, usize),
    All(Vec<Formula>),
    Any(Vec<Formula>),
    /// Exactly one holds.
    One(Vec<Formula>),
    Not(Box<Formula>),
}

/// Three-valued truth: `None` is "depends on keys not decided yet".
type Truth = Option<bool>;

impl Formula {
    /// Kleene evaluation under `decided` (per key: `None` undecided, else its class: 0
    /// absent), `masks[k][l]` the classes of key `k` in which its value list `l` holds.
    fn eval(&self, decided: &[Option<u8>], masks: &[Vec<u64>]) -> Truth {
        match self {
            Formula::Has(k) => decided[*k].map(|c| c != 0),
            Formula::In(k, l) => decided[*k].map(|c| masks[*k][*l] >> c & 1 == 1),
            Formula::Not(f) => f.eval(decided, masks).map(|b| !b),
            Formula::All(fs) => Self::either(fs, decided, masks, false),
            Formula::Any(fs) => Self::either(fs, decided, masks, true),
            Formula::One(fs) => {
                let (mut yes, mut unknown) = (0, 0);
                for f in fs {
                    match f.eval(decided, masks) {
                        Some(true) => yes += 1,
                        None => unknown += 1,
                        Some(false) => {}
                    }
                }
                match (yes, unknown) {
                    (y, _) if y > 1 => Some(false),
                    (1, 0) => Some(true),
                    (0, 0) => Some(false),
                    _ => None,
                }
            }
        }
    }
}

impl Formula {
    /// `All` (`decisive: false`) or `Any` (`true`) of `fs`: `decisive` as soon as one part
    /// is, unknown where a part is and none is decisive, else `!decisive`.
    fn either(fs: &[Formula], decided: &[Option<u8>], masks: &[Vec<u64>], decisive: bool) -> Truth {
        let mut out = Some(!decisive);
        for f in fs {
            match f.eval(decided, masks) {
                Some(b) if b == decisive => return Some(decisive),
                None => out = None,
                Some(_) => {}
            }
        }
        out
    }
}

/// The key-presence formula of one schema dependency, when it says nothing else.
fn schema_formula(s: &Value, keys: &mut Keys) -> Option<Formula> {
    let m = match s {
        Value::Bool(true) => return Some(Formula::All(vec![])),
        Value::Bool(false) => return Some(Formula::Any(vec![])),
        Value::Object(m) => m,
        _ => return None,
    };
    let mut parts = Vec::new();
    for (k, v) in m {
        match (k.as_str(), v) {
            (k, _) if is_annotation(k) => {}
            // A dependency applies to objects only (its key is present).
            ("type", t) if t == "object" => {}
            ("required", Value::Array(req)) => {
                for r in req {
                    parts.push(Formula::Has(keys.index(r.as_str()?)));
                }
            }
            ("properties", Value::Object(props)) => {
                for (p, ps) in props {
                    let values = listed_values(ps)?;
                    let k = keys.index(p);
                    keys.lists[k].push(values);
                    parts.push(Formula::In(k, keys.lists[k].len() - 1));
                }
            }
            ("not", n) => parts.push(Formula::Not(Box::new(schema_formula(n, keys)?))),
            ("anyOf" | "oneOf" | "allOf", Value::Array(bs)) => {
                let fs = bs
                    .iter()
                    .map(|b| schema_formula(b, keys))
                    .collect::<Option<Vec<_>>>()?;
                parts.push(match k.as_str() {
                    "anyOf" => Formula::Any(fs),
                    "oneOf" => Formula::One(fs),
                    _ => Formula::All(fs),
                });
            }
            _ => return None,
        }
    }
    Some(Formula::All(parts))
}

/// The values a property schema lists when it says nothing else (`enum` or `const`).
fn listed_values(s: &Value) -> Option<Vec<Value>> {
    let m = s.as_object()?;
    let mut out: Option<Vec<Value>> = None;
    for (k, v) in m {
        match k.as_str() {
            k if is_annotation(k) => {}
            "enum" if out.is_none() => out = Some(v.as_array()?.clone()),
            "const" if out.is_none() => out = Some(vec![v.clone()]),
            _ => return None,
        }
    }
    out
}

/// The keys a formula names, and per key the value lists its `In` atoms name.
#[derive(Default)]
struct Keys {
    names: Vec<String>,
    lists: Vec<Vec<Vec<Value>>>,
}

impl Keys {
    fn index(&mut self, k: &str) -> usize {
        match self.names.iter().position(|x| x == k) {
            Some(i) => i,
            None => {
                self.names.push(k.to_string());
                self.lists.push(Vec::new());
                self.names.len() - 1
            }
        }
    }
}

/// A key's classes past "absent" (class 0): the listed values grouped by which lists hold
/// them, then (last) any value none lists. Per list, the classes (bits) where it holds.
fn classes(lists: &[Vec<Value>]) -> Option<(Vec<Vec<Value>>, Vec<u64>)> {
    // A value's signature has a bit per list.
    if lists.len() > 64 {
        return None;
    }
    let mut values: Vec<(Value, u64)> = Vec::new();
    for (l, list) in lists.iter().enumerate() {
        for v in list {
            match values.iter_mut().find(|(x, _)| json_eq(x, v)) {
                Some((_, sig)) => *sig |= 1 << l,
                None => values.push((v.clone(), 1 << l)),
            }
        }
    }
    if values.len() > MAX_LISTED_VALUES {
        return None;
    }
    let mut groups: Vec<(u64, Vec<Value>)> = Vec::new();
    for (v, sig) in values {
        match groups.iter_mut().find(|g| g.0 == sig) {
            Some(g) => g.1.push(v),
            None => groups.push((sig, vec![v])),
        }
    }
    // Absent holds every list; a class holds the lists of its signature; "other" none.
    let masks = (0..lists.len())
        .map(|l| {
            groups
                .iter()
                .enumerate()
                .filter(|(_, g)| g.0 >> l & 1 == 1)
                .fold(1u64, |m, (c, _)| m | 1 << (c + 1))
        })
        .collect();
    Some((groups.into_iter().map(|g| g.1).collect(), masks))
}

/// Why a set of dependencies is not written as a presence formula.
#[derive(Debug, PartialEq)]
pub(super) enum NotPresence {
    /// Some dependency says more than which keys are present.
    Other,
    /// The formula mentions too many keys or needs too many alternatives.
    TooLarge,
}

/// The dependencies of object schema `s` (`dependencies`, `dependentRequired`,
/// `dependentSchemas`) as disjoint object alternatives (see the module docs); `Ok(vec![])`
/// when no object satisfies them.
pub(super) fn presence_alternatives(s: &Map<String, Value>) -> Result<Vec<Value>, NotPresence> {
    let mut keys = Keys::default();
    let mut parts = Vec::new();
    for kw in ["dependencies", "dependentRequired", "dependentSchemas"] {
        let Some(Value::Object(d)) = s.get(kw) else {
            continue;
        };
        for (k, need) in d {
            let trigger = Formula::Has(keys.index(k));
            let need = match need {
                Value::Array(req) => Formula::All(
                    req.iter()
                        .map(|r| r.as_str().map(|r| Formula::Has(keys.index(r))))
                        .collect::<Option<Vec<_>>>()
                        .ok_or(NotPresence::Other)?,
                ),
                other => schema_formula(other, &mut keys).ok_or(NotPresence::Other)?,
            };
            parts.push(Formula::Any(vec![Formula::Not(Box::new(trigger)), need]));
        }
    }
    let n = keys.names.len();
    if n > MAX_PRESENCE_KEYS {
        return Err(NotPresence::TooLarge);
    }
    // Per key: its present classes' values (`None`: plain presence) and its lists' masks.
    let mut values: Vec<Option<Vec<Vec<Value>>>> = Vec::with_capacity(n);
    let mut masks: Vec<Vec<u64>> = Vec::with_capacity(n);
    for lists in &keys.lists {
        if lists.is_empty() {
            values.push(None);
            masks.push(Vec::new());
        } else {
            let (v, m) = classes(lists).ok_or(NotPresence::TooLarge)?;
            values.push(Some(v));
            masks.push(m);
        }
    }
    // Decide keys in the order the schema declares them (related keys sit together), then
    // the others as first mentioned.
    let declared: Vec<&String> = s
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|p| p.keys().collect())
        .unwrap_or_default();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| {
        declared
            .iter()
            .position(|d| **d == keys.names[i])
            .unwrap_or(usize::MAX)
    });
    // Classes per key: absent, then present (plain), or each value class and "other".
    let domain: Vec<u8> = values
        .iter()
        .map(|v| v.as_ref().map_or(2, |v| v.len() as u8 + 2))
        .collect();
    let formula = Formula::All(parts);
    let mut decided = vec![None; n];
    let mut cubes = Vec::new();
    let plan = Plan {
        f: &formula,
        masks: &masks,
        order: &order,
        domain: &domain,
    };
    let mut steps = MAX_PRESENCE_STEPS;
    plan.expand(0, &mut decided, &mut cubes, &mut steps)?;
    Ok(cubes
        .into_iter()
        .map(|cube| {
            let mut alt = Map::new();
            alt.insert("type".into(), json!("object"));
            let (mut has, mut not, mut props) = (Vec::new(), Vec::new(), Map::new());
            for (k, d) in cube.iter().enumerate() {
                let name = &keys.names[k];
                match (d, &values[k]) {
                    (None, _) => {}
                    (Some(0), _) => not.push(json!(name)),
                    (Some(_), None) => has.push(json!(name)),
                    (Some(c), Some(classes)) => {
                        has.push(json!(name));
                        let schema = match classes.get(*c as usize - 1) {
                            Some(vals) => json!({ "enum": vals }),
                            None => json!({ "not": { "enum": classes.concat() } }),
                        };
                        props.insert(name.clone(), schema);
                    }
                }
            }
            if !has.is_empty() {
                alt.insert("required".into(), Value::Array(has));
            }
            if !not.is_empty() {
                alt.insert("__forbidden".into(), Value::Array(not));
            }
            if !props.is_empty() {
                alt.insert("properties".into(), Value::Object(props));
            }
            Value::Object(alt)
        })
        .collect())
}

/// What the expansion reads: the formula, its keys' class masks, the order keys are
/// decided in and each key's number of classes.
struct Plan<'a> {
    f: &'a Formula,
    masks: &'a [Vec<u64>],
    order: &'a [usize],
    domain: &'a [u8],
}

impl Plan<'_> {
    /// Shannon expansion of the formula from the `at`-th key of the order under `decided`.
    fn expand(
        &self,
        at: usize,
        decided: &mut [Option<u8>],
        out: &mut Vec<Vec<Option<u8>>>,
        steps: &mut u32,
    ) -> Result<(), NotPresence> {
        *steps = steps.checked_sub(1).ok_or(NotPresence::TooLarge)?;
        match self.f.eval(decided, self.masks) {
            Some(false) => Ok(()),
            Some(true) => {
                if out.len() >= MAX_PRESENCE_ALTERNATIVES {
                    return Err(NotPresence::TooLarge);
                }
                out.push(decided.to_vec());
                Ok(())
            }
            // Every key decided leaves no unknown (Kleene evaluation is then exact), so a
            // key is left whenever the formula is undecided.
            None => {
                let Some(&k) = self.order.get(at) else {
                    return Err(NotPresence::Other);
                };
                for c in 0..self.domain[k] {
                    decided[k] = Some(c);
                    self.expand(at + 1, decided, out, steps)?;
                }
                decided[k] = None;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many alternatives admit an object with the keys `present` (`t`'s value, if
    /// present, is `t`).
    fn admitted(alts: &[Value], present: &[&str], t: Option<&str>) -> usize {
        alts.iter()
            .filter(|a| {
                let list = |k: &str| -> Vec<String> {
                    a.get(k)
                        .and_then(|v| v.as_array())
                        .map(|v| v.iter().map(|x| x.as_str().unwrap().to_string()).collect())
                        .unwrap_or_default()
                };
                let holds = |schema: &Value, v: &str| match schema.get("enum") {
                    Some(vals) => vals.as_array().unwrap().contains(&json!(v)),
                    None => !schema["not"]["enum"]
                        .as_array()
                        .unwrap()
                        .contains(&json!(v)),
                };
                let value_ok = match (t, a.get("properties").and_then(|p| p.get("t"))) {
                    (Some(v), Some(schema)) => holds(schema, v),
                    _ => true,
                };
                list("required")
                    .iter()
                    .all(|k| present.contains(&k.as_str()))
                    && list("__forbidden")
                        .iter()
                        .all(|k| !present.contains(&k.as_str()))
                    && value_ok
            })
            .count()
    }

    #[test]
    fn alternatives_admit_exactly_the_key_sets_the_dependencies_allow() {
        let s = json!({
            "properties": {"a": {}, "b": {}, "c": {}, "d": {}},
            "dependencies": {
                "a": ["b"],
                "c": {"anyOf": [{"required": ["a"]}, {"not": {"required": ["d"]}}]},
                "d": {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
            }
        });
        let alts = presence_alternatives(s.as_object().unwrap()).unwrap();
        let names = ["a", "b", "c", "d"];
        for bits in 0..16u32 {
            let present: Vec<&str> = (0..4)
                .filter(|i| bits >> i & 1 == 1)
                .map(|i| names[i])
                .collect();
            let has = |k: &str| present.contains(&k);
            let valid = (!has("a") || has("b"))
                && (!has("c") || has("a") || !has("d"))
                && (!has("d") || (has("a") != has("b")));
            // Disjoint: at most one alternative admits a key set.
            assert_eq!(
                admitted(&alts, &present, None),
                valid as usize,
                "{present:?}"
            );
        }
    }

    #[test]
    fn a_discriminating_value_is_split_into_the_classes_the_dependencies_list() {
        let s = json!({
            "properties": {"t": {"type": "string"}, "a": {}, "b": {}},
            "dependencies": {
                "a": {"properties": {"t": {"enum": ["x", "y"]}}},
                "b": {"properties": {"t": {"const": "y"}}},
            }
        });
        let alts = presence_alternatives(s.as_object().unwrap()).unwrap();
        for t in [None, Some("x"), Some("y"), Some("z")] {
            for bits in 0..4u32 {
                let mut present: Vec<&str> = Vec::new();
                if bits & 1 == 1 {
                    present.push("a");
                }
                if bits & 2 == 2 {
                    present.push("b");
                }
                if t.is_some() {
                    present.push("t");
                }
                let has = |k: &str| present.contains(&k);
                let valid = (!has("a") || t.is_none() || matches!(t, Some("x" | "y")))
                    && (!has("b") || t.is_none() || t == Some("y"));
                assert_eq!(
                    admitted(&alts, &present, t),
                    valid as usize,
                    "{present:?} {t:?}"
                );
            }
        }
    }

    #[test]
    fn a_formula_unknown_until_its_last_key_is_refused_within_its_step_budget() {
        // `a` needs some `x_i` both present and absent: false, but only once every `x` is
        // decided; 23 keys would be 2^23 branches without the step budget.
        let xs: Vec<Value> = (0..23)
            .map(|i| json!({"required": [format!("x{i}")], "not": {"required": [format!("x{i}")]}}))
            .collect();
        let mut props = Map::new();
        props.insert("a".into(), json!({}));
        let s = json!({"properties": props, "dependencies": {"a": {"anyOf": xs}}});
        let t = std::time::Instant::now();
        assert_eq!(
            presence_alternatives(s.as_object().unwrap()),
            Err(NotPresence::TooLarge)
        );
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn more_value_lists_on_one_key_than_a_signature_holds_are_refused() {
        let lists: Vec<Value> = (0..70)
            .map(|i| json!({"properties": {"t": {"enum": [i, i + 1]}}}))
            .collect();
        let s = json!({"dependencies": {"a": {"anyOf": lists}}});
        assert_eq!(
            presence_alternatives(s.as_object().unwrap()),
            Err(NotPresence::TooLarge)
        );
    }

    #[test]
    fn dependencies_that_say_more_than_presence_are_left_to_the_schema_compiler() {
        let s = json!({"dependencies": {"a": {"properties": {"b": {"type": "string"}}}}});
        assert_eq!(
            presence_alternatives(s.as_object().unwrap()),
            Err(NotPresence::Other)
        );
    }

    #[test]
    fn a_formula_past_the_alternatives_limit_is_refused_not_cut() {
        // `k_i -> not k_{i+1}` over a chain: the alternatives grow like Fibonacci numbers.
        let deps: Map<String, Value> = (0..20)
            .map(|i| {
                (
                    format!("k{i}"),
                    json!({"not": {"required": [format!("k{}", i + 1)]}}),
                )
            })
            .collect();
        let s = json!({ "dependencies": deps });
        assert_eq!(
            presence_alternatives(s.as_object().unwrap()),
            Err(NotPresence::TooLarge)
        );
    }
}
