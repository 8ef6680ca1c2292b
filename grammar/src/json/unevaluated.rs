//! `unevaluatedProperties` and `unevaluatedItems`, rewritten into keywords the compiler
//! already enforces.
//!
//! A key (an item) is *evaluated* when a `properties` / `patternProperties` /
//! `additionalProperties` (a `prefixItems` / `items` / `additionalItems`) of the schema
//! itself or of a subschema that applied successfully to the same value matched it; an
//! unevaluated one must satisfy the `unevaluated*` schema. Which subschemas apply is fixed
//! for the parts that always apply (`allOf`, `$ref`, the schema itself) and depends on the
//! value at a branch point (`anyOf`, `oneOf`, `if`/`then`/`else`). So the schema
//!
//! ```text
//! S = {…, anyOf: [B1, B2], unevaluatedProperties: U}
//! ```
//!
//! becomes `allOf: [S without U, anyOf: [B1 ∧ P1, B2 ∧ P2]]`, where `Pi` is
//! `{properties: {k: true…}, patternProperties: {p: true…}, additionalProperties: U}` over
//! the names and patterns the always-applying parts and `Bi` declare: a key outside them
//! must satisfy `U`. Exact for `oneOf` (one branch applies) and `if`/`then`/`else` (the
//! branches are `if ∧ then` and `¬if ∧ else`; a failed `if` evaluates nothing). An `anyOf`
//! of up to [`MAX_SUBSET_BRANCHES`] branches is read as every subset of branches matching
//! together (exact); beyond that one branch at a time, where a key evaluated only by a
//! second matching branch counts as unevaluated: stricter, never looser. Several branch
//! points multiply (at most [`MAX_COMBINATIONS`] readings).
//!
//! A nested `unevaluated*` is rewritten in its own scope where its schema is compiled (and
//! merged: `merge_schemas` rewrites each side first); for the enclosing one it evaluates
//! everything its part left, so every key (item) of a valid value.
//!
//! Refused (the caller reports the keyword as not enforced): a branch point inside a branch,
//! `dependentSchemas` / schema-valued `dependencies`, `$dynamicRef`, and `contains` beside
//! `unevaluatedItems` (the items a `contains` matches are evaluated: value-dependent).

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::JsonCompiler;
use crate::CompileError;

/// Most readings (products of branch choices) a rewrite may spell out.
const MAX_COMBINATIONS: usize = 16;
/// Deepest `allOf` / `$ref` chain the walk follows.
const MAX_WALK_DEPTH: u32 = 32;

/// What the subschemas that apply to a value evaluate of it.
#[derive(Clone, Default, Debug)]
struct Evaluated {
    /// Property names of `properties`.
    props: BTreeSet<String>,
    /// Patterns of `patternProperties`.
    patterns: BTreeSet<String>,
    /// An `additionalProperties` applied: every key is evaluated.
    all_props: bool,
    /// Longest tuple (`prefixItems`, or `items` as an array).
    prefix: usize,
    /// A schema for the items after the tuple applied: every item is evaluated.
    all_items: bool,
    /// A `contains` applied (it evaluates the items it matches).
    contains: bool,
}

impl Evaluated {
    fn union(&mut self, o: &Evaluated) {
        self.props.extend(o.props.iter().cloned());
        self.patterns.extend(o.patterns.iter().cloned());
        self.all_props |= o.all_props;
        self.prefix = self.prefix.max(o.prefix);
        self.all_items |= o.all_items;
        self.contains |= o.contains;
    }
}

/// Most `anyOf` branches read as every subset of them that may match together (exact);
/// more are read one at a time (stricter where several match).
const MAX_SUBSET_BRANCHES: usize = 4;

/// Every non-empty subset of `anyOf` branches as one reading: all of them match, and the
/// keys (items) any of them evaluates are evaluated. A value whose matching branches are
/// exactly `T` is read by `T`; one read by `T` matches at least `T`, so evaluates at least
/// as much: exact.
fn subsets(branches: &[Branch]) -> Vec<Branch> {
    let n = branches.len();
    (1..1usize << n)
        .map(|mask| {
            let chosen: Vec<&Branch> = (0..n)
                .filter(|i| mask >> i & 1 == 1)
                .map(|i| &branches[i])
                .collect();
            let mut e = Evaluated::default();
            for (_, be) in &chosen {
                e.union(be);
            }
            let schema = match chosen.as_slice() {
                [(b, _)] => b.clone(),
                _ => json!({ "allOf": chosen.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>() }),
            };
            (schema, e)
        })
        .collect()
}

/// One branch of a branch point: the schema that holds in this reading and what it
/// evaluates.
type Branch = (Value, Evaluated);

impl JsonCompiler<'_> {
    /// `map` (which has `unevaluatedProperties` or `unevaluatedItems`) rewritten without
    /// them, or `Err(reason)` when the rewrite does not apply.
    pub(super) fn unevaluated_rewrite(&self, map: &Map<String, Value>) -> Result<Value, String> {
        let up = map.get("unevaluatedProperties");
        let ui = map.get("unevaluatedItems");
        let mut rest = map.clone();
        rest.remove("unevaluatedProperties");
        rest.remove("unevaluatedItems");
        let rest = Value::Object(rest);
        let mut base = Evaluated::default();
        let mut points: Vec<Vec<Branch>> = Vec::new();
        let mut seen = Vec::new();
        self.walk(&rest, &mut base, Some(&mut points), &mut seen, 0)?;
        let mut combos: Vec<(Vec<Value>, Evaluated)> = vec![(Vec::new(), base)];
        for point in &points {
            let mut next = Vec::new();
            for (schemas, e) in &combos {
                for (b, be) in point {
                    let mut s = schemas.clone();
                    s.push(b.clone());
                    let mut e = e.clone();
                    e.union(be);
                    next.push((s, e));
                }
            }
            if next.len() > MAX_COMBINATIONS {
                return Err(format!(
                    "more than {MAX_COMBINATIONS} combinations of anyOf/oneOf/if branches"
                ));
            }
            combos = next;
        }
        let mut readings = Vec::with_capacity(combos.len());
        let mut constrained = false;
        for (mut schemas, e) in combos {
            let mut p = Map::new();
            if let Some(u) = up.filter(|_| !e.all_props) {
                let props: Map<String, Value> = e
                    .props
                    .iter()
                    .map(|k| (k.clone(), Value::Bool(true)))
                    .collect();
                let pats: Map<String, Value> = e
                    .patterns
                    .iter()
                    .map(|k| (k.clone(), Value::Bool(true)))
                    .collect();
                p.insert("properties".into(), Value::Object(props));
                if !pats.is_empty() {
                    p.insert("patternProperties".into(), Value::Object(pats));
                }
                p.insert("additionalProperties".into(), u.clone());
            }
            if let Some(u) = ui.filter(|_| !e.all_items) {
                if e.contains {
                    return Err("`contains` evaluates the items it matches".into());
                }
                p.insert(
                    "prefixItems".into(),
                    Value::Array(vec![Value::Bool(true); e.prefix]),
                );
                p.insert("items".into(), u.clone());
            }
            constrained |= !p.is_empty();
            if !p.is_empty() {
                schemas.push(Value::Object(p));
            }
            readings.push(match schemas.len() {
                0 => Value::Bool(true),
                1 => schemas.pop().unwrap_or(Value::Bool(true)),
                _ => json!({ "allOf": schemas }),
            });
        }
        if !constrained {
            return Ok(rest);
        }
        let constraint = if readings.len() == 1 {
            readings.pop().unwrap_or(Value::Bool(true))
        } else {
            json!({ "anyOf": readings })
        };
        Ok(json!({ "allOf": [rest, constraint] }))
    }

    /// `m` rewritten without its `unevaluated*` (`None` when it has none). Where the rewrite
    /// does not apply the keyword is refused (kept, under `lenient`).
    pub(super) fn own_unevaluated(
        &self,
        m: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Option<Value>, CompileError> {
        let kw = ["unevaluatedProperties", "unevaluatedItems"]
            .into_iter()
            .find(|k| m.contains_key(*k));
        let Some(kw) = kw else {
            return Ok(None);
        };
        if m.contains_key("$ref") && !self.is_modern_draft() {
            // Old drafts: `$ref` ignores its siblings (and `unevaluated*` is not a keyword).
            return Ok(None);
        }
        match self.unevaluated_rewrite(m) {
            Ok(s) => Ok(Some(s)),
            Err(why) => {
                self.unsupported(kw, ptr, &format!("cannot be enforced exactly: {why}"))?;
                Ok(None)
            }
        }
    }

    /// Adds to `acc` what `s` evaluates of a value it applies to. `points` receives the
    /// branch points met (`None` inside a branch, where another one is refused).
    fn walk(
        &self,
        s: &Value,
        acc: &mut Evaluated,
        mut points: Option<&mut Vec<Vec<Branch>>>,
        seen: &mut Vec<String>,
        depth: u32,
    ) -> Result<(), String> {
        if depth > MAX_WALK_DEPTH {
            return Err("allOf/$ref nesting too deep".into());
        }
        let Value::Object(m) = s else {
            return Ok(());
        };
        for (k, v) in m {
            match k.as_str() {
                "properties" => {
                    if let Value::Object(p) = v {
                        acc.props.extend(p.keys().cloned());
                    }
                }
                "patternProperties" => {
                    if let Value::Object(p) = v {
                        acc.patterns.extend(p.keys().cloned());
                    }
                }
                "additionalProperties" => acc.all_props = true,
                "prefixItems" => {
                    if let Value::Array(a) = v {
                        acc.prefix = acc.prefix.max(a.len());
                    }
                }
                "items" => match v {
                    Value::Array(a) => acc.prefix = acc.prefix.max(a.len()),
                    _ => acc.all_items = true,
                },
                "additionalItems" if m.get("items").is_some_and(|i| i.is_array()) => {
                    acc.all_items = true;
                }
                "contains" => acc.contains = true,
                // A nested one (rewritten in its own scope where its schema is compiled)
                // evaluates every key (item) its part's keywords left: in a valid value,
                // all of them.
                "unevaluatedProperties" => acc.all_props = true,
                "unevaluatedItems" => acc.all_items = true,
                "dependentSchemas" | "$dynamicRef" | "$recursiveRef" => {
                    return Err(format!("`{k}` beside it"));
                }
                "dependencies"
                    if v.as_object()
                        .is_some_and(|d| d.values().any(|x| !x.is_array())) =>
                {
                    return Err("schema-valued `dependencies` beside it".into());
                }
                "allOf" => {
                    for part in v.as_array().into_iter().flatten() {
                        self.walk(part, acc, points.as_deref_mut(), seen, depth + 1)?;
                    }
                }
                "$ref" => {
                    let Some(r) = v.as_str() else {
                        return Err("$ref must be a string".into());
                    };
                    if seen.iter().any(|x| x == r) {
                        continue;
                    }
                    let target = self.resolve(r, "").map_err(|e| e.to_string())?;
                    seen.push(r.to_string());
                    self.walk(target, acc, points.as_deref_mut(), seen, depth + 1)?;
                }
                "anyOf" | "oneOf" => {
                    let Some(list) = points.as_deref_mut() else {
                        return Err(format!("`{k}` inside an anyOf/oneOf/if branch"));
                    };
                    let mut branches = Vec::new();
                    for b in v.as_array().into_iter().flatten() {
                        let mut e = Evaluated::default();
                        self.walk(b, &mut e, None, &mut seen.clone(), depth + 1)?;
                        branches.push((b.clone(), e));
                    }
                    if k == "anyOf" && (2..=MAX_SUBSET_BRANCHES).contains(&branches.len()) {
                        branches = subsets(&branches);
                    }
                    list.push(branches);
                }
                "if" => {
                    let Some(list) = points.as_deref_mut() else {
                        return Err("`if` inside an anyOf/oneOf/if branch".into());
                    };
                    let then = m.get("then").cloned().unwrap_or(Value::Bool(true));
                    let els = m.get("else").cloned().unwrap_or(Value::Bool(true));
                    let mut yes = Evaluated::default();
                    self.walk(v, &mut yes, None, &mut seen.clone(), depth + 1)?;
                    self.walk(&then, &mut yes, None, &mut seen.clone(), depth + 1)?;
                    let mut no = Evaluated::default();
                    self.walk(&els, &mut no, None, &mut seen.clone(), depth + 1)?;
                    list.push(vec![
                        (json!({ "allOf": [v, then] }), yes),
                        (json!({ "allOf": [{ "not": v }, els] }), no),
                    ]);
                }
                // `then` / `else` apply (and evaluate) only through their `if`; `not`
                // evaluates nothing.
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfa::{Budget, Builder};
    use crate::CompileOptions;

    fn rewrite(schema: Value) -> Result<Value, String> {
        let mut b = Builder::new(Budget {
            max_states: 1000,
            deadline: None,
        });
        let opts = CompileOptions::default();
        let c = JsonCompiler::new(&mut b, &schema, &opts);
        let m = schema.as_object().cloned().unwrap_or_default();
        c.unevaluated_rewrite(&m)
    }

    #[test]
    fn always_applying_parts_declare_the_evaluated_keys() {
        let s = json!({
            "$defs": {"base": {"properties": {"id": {"type": "integer"}}}},
            "allOf": [{"$ref": "#/$defs/base"}, {"patternProperties": {"^x-": {}}}],
            "properties": {"name": {"type": "string"}},
            "unevaluatedProperties": false
        });
        let r = rewrite(s).unwrap();
        let p = &r["allOf"][1];
        assert_eq!(p["additionalProperties"], json!(false));
        assert_eq!(p["properties"], json!({"id": true, "name": true}));
        assert_eq!(p["patternProperties"], json!({"^x-": true}));
        assert!(r["allOf"][0].get("unevaluatedProperties").is_none());
    }

    #[test]
    fn an_additional_properties_evaluates_every_key() {
        let s = json!({"additionalProperties": {"type": "string"}, "unevaluatedProperties": false});
        let r = rewrite(s).unwrap();
        assert_eq!(r, json!({"additionalProperties": {"type": "string"}}));
    }

    #[test]
    fn each_branch_is_its_own_reading() {
        let s = json!({
            "anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
            "unevaluatedProperties": false
        });
        let r = rewrite(s).unwrap();
        // a alone, b alone, both together.
        let readings = r["allOf"][1]["anyOf"].as_array().unwrap();
        assert_eq!(readings.len(), 3);
        assert_eq!(
            readings[2]["allOf"][0]["allOf"].as_array().unwrap().len(),
            2
        );
        assert_eq!(
            readings[2]["allOf"][1]["properties"],
            json!({"a": true, "b": true})
        );
        let s = json!({
            "properties": {"kind": {}},
            "oneOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
            "unevaluatedProperties": false
        });
        let r = rewrite(s).unwrap();
        let readings = r["allOf"][1]["anyOf"].as_array().unwrap();
        assert_eq!(readings.len(), 2);
        assert_eq!(
            readings[0]["allOf"][1]["properties"],
            json!({"a": true, "kind": true})
        );
        assert_eq!(
            readings[1]["allOf"][1]["properties"],
            json!({"b": true, "kind": true})
        );
    }

    #[test]
    fn if_then_else_splits_into_if_and_then_or_not_if_and_else() {
        let s = json!({
            "if": {"properties": {"t": {"const": 1}}},
            "then": {"properties": {"a": {}}},
            "else": {"properties": {"b": {}}},
            "unevaluatedProperties": false
        });
        let r = rewrite(s).unwrap();
        let readings = r["allOf"][1]["anyOf"].as_array().unwrap();
        assert_eq!(
            readings[0]["allOf"][1]["properties"],
            json!({"a": true, "t": true})
        );
        assert_eq!(
            readings[1]["allOf"][0]["allOf"][0]["not"],
            json!({"properties": {"t": {"const": 1}}})
        );
        assert_eq!(readings[1]["allOf"][1]["properties"], json!({"b": true}));
    }

    #[test]
    fn items_after_the_longest_tuple_are_unevaluated() {
        let s =
            json!({"allOf": [{"prefixItems": [{}, {}]}], "unevaluatedItems": {"type": "integer"}});
        let r = rewrite(s).unwrap();
        assert_eq!(
            r["allOf"][1],
            json!({"prefixItems": [true, true], "items": {"type": "integer"}})
        );
        assert!(rewrite(json!({"items": {}, "unevaluatedItems": false}))
            .unwrap()
            .get("allOf")
            .is_none());
    }

    #[test]
    fn a_nested_unevaluated_evaluates_everything_its_part_left() {
        let s = json!({"allOf": [{"unevaluatedProperties": {"type": "string"}}], "unevaluatedProperties": false});
        let inner = json!({"allOf": [{"unevaluatedProperties": {"type": "string"}}]});
        assert_eq!(rewrite(s).unwrap(), inner);
    }

    #[test]
    fn value_dependent_evaluations_are_refused() {
        for s in [
            json!({"contains": {}, "unevaluatedItems": false}),
            json!({"dependentSchemas": {"a": {}}, "unevaluatedProperties": false}),
            json!({"anyOf": [{"anyOf": [{}]}], "unevaluatedProperties": false}),
        ] {
            assert!(rewrite(s.clone()).is_err(), "{s}");
        }
    }
}
