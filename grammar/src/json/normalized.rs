//! Compiling one normalised schema (no `allOf` or sibling `$ref` left): the types it admits,
//! `enum`/`const` filtered by the rest of the schema, and the dispatch to the emitters of each
//! type (`types.rs`, `array.rs`, `object.rs`) and of `anyOf`/`oneOf`/`not`.

use serde_json::{Map, Value};

use super::{
    check, is_annotation, json_eq, push_list, static_type, JsonCompiler, NotForm, ValueSet,
};
use crate::nfa::StateId;
use crate::CompileError;

impl JsonCompiler<'_> {
    /// A schema without `allOf`/sibling `$ref` (already merged).
    pub(super) fn normalized(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        if s.get("__false").is_some() {
            return self.nothing();
        }
        // The complement of a recursive `$ref` (from `negate`): a call to its rule; beside
        // other keywords it cannot be intersected.
        if let Some(r) = s.get("__not_ref").and_then(|r| r.as_str()) {
            if s.keys()
                .all(|k| k == "__not_ref" || super::is_annotation(k))
            {
                let rule = self.not_ref_rule(r, ptr)?;
                return self.b.call(from, rule);
            }
            return Err(CompileError::Unsupported {
                keyword: "not".into(),
                pointer: ptr.into(),
                reason: format!(
                    "the complement of the recursive {:?} beside other keywords",
                    crate::excerpt(r)
                ),
            });
        }
        // enum/const: when every listed value can be checked against the rest, emit them.
        if let Some(values) = s
            .get("enum")
            .and_then(|e| e.as_array())
            .cloned()
            .or_else(|| s.get("const").map(|c| vec![c.clone()]))
        {
            let vc = ValueCheck::of(s);
            if values
                .iter()
                .all(|v| check::check_value(v, &vc.rest).is_some())
            {
                return self.enum_values(from, &values, &vc, ptr);
            }
        }
        if let Some(n) = s.get("not") {
            let mut owned = s.clone();
            owned.remove("not");
            let mut forms = Vec::new();
            self.not_forms(n, &mut forms);
            for form in forms {
                match form {
                    NotForm::Unsat => return self.nothing(),
                    NotForm::NoOp => {}
                    // Non-objects satisfy `required`, so `not required` admits objects only.
                    NotForm::ForbidKey(k) => {
                        let v = serde_json::json!({"type": "object", "__forbidden": [k]});
                        let mark = self.merged_refs.len();
                        let m = self.merge_schemas(&Value::Object(owned), &v, ptr, 0);
                        self.merged_refs.truncate(mark);
                        owned = match m? {
                            Value::Object(m) => m,
                            _ => return self.nothing(),
                        };
                    }
                    NotForm::NotPattern(p) => push_list(&mut owned, "__not_pattern", [p]),
                    NotForm::NotValues(vals) => push_list(&mut owned, "__not_enum", vals),
                    NotForm::Positive(v) => {
                        let mark = self.merged_refs.len();
                        let m = self.merge_schemas(&Value::Object(owned), &v, ptr, 0);
                        self.merged_refs.truncate(mark);
                        owned = match m? {
                            Value::Object(m) => m,
                            Value::Bool(true) => Map::new(),
                            _ => return self.nothing(),
                        };
                    }
                    NotForm::NotTypes(ts) => {
                        let mut keep: Vec<Value> = Vec::new();
                        for t in self.types_of(&owned, ptr)? {
                            let expanded: &[&str] = if t == "number" {
                                &["number", "integer"]
                            } else {
                                std::slice::from_ref(&t)
                            };
                            for &x in expanded {
                                let banned = ts
                                    .iter()
                                    .any(|b| b == x || (b == "number" && x == "integer"));
                                if !banned {
                                    keep.push(Value::String(x.into()));
                                }
                            }
                        }
                        // "number" minus "integer": numbers with a nonzero fraction.
                        if ts.iter().any(|b| b == "integer") && keep.iter().any(|k| k == "number") {
                            owned.insert("__fraction".into(), Value::Bool(true));
                        }
                        if keep.is_empty() {
                            return self.nothing();
                        }
                        owned.insert("type".into(), Value::Array(keep));
                    }
                    NotForm::Other => {
                        // The complement as a union of per-keyword complements (a subset of
                        // it where some keyword has none: stricter, `one_of.rs`).
                        match self.complement_or_subset(n, ptr)? {
                            Some(neg) => {
                                let all = serde_json::json!({"allOf": [Value::Object(owned), neg]});
                                return self.value(from, &all, ptr);
                            }
                            None => {
                                let k = self.unnegatable.take().unwrap_or_default();
                                self.unsupported(
                                    "not",
                                    ptr,
                                    &format!(
                                        "cannot be enforced exactly (`{k}` has no complement)"
                                    ),
                                )?
                            }
                        }
                    }
                }
            }
            return self.normalized(from, &owned, ptr);
        }
        // if/then/else = (if and then) or (not if and else), the two sides disjoint.
        if let Some(cond) = s.get("if") {
            let mut rest = s.clone();
            rest.remove("if");
            let then = rest.remove("then").unwrap_or(Value::Bool(true));
            let els = rest.remove("else").unwrap_or(Value::Bool(true));
            // Without `then`, `(if) or (not if and else)` is `if or else`: no complement.
            if then == Value::Bool(true) {
                if els == Value::Bool(true) {
                    return self.normalized(from, &rest, ptr);
                }
                let all =
                    serde_json::json!({"allOf": [Value::Object(rest), {"anyOf": [cond, els]}]});
                return self.value(from, &all, ptr);
            }
            let Some(neg) = self.complement_or_subset(cond, &format!("{ptr}/if"))? else {
                let k = self.unnegatable.take().unwrap_or_default();
                self.unsupported(
                    "if",
                    ptr,
                    &format!("the condition's complement cannot be expressed (`{k}`)"),
                )?;
                return self.normalized(from, &rest, ptr);
            };
            let all = serde_json::json!({"allOf": [Value::Object(rest), {"anyOf": [
                {"allOf": [cond, then]},
                {"allOf": [neg, els]},
            ]}]});
            return self.value(from, &all, ptr);
        }
        // Dependencies: for each trigger key, absent, or present with what it needs.
        if ["dependencies", "dependentRequired", "dependentSchemas"]
            .iter()
            .any(|k| s.contains_key(*k))
        {
            let mut rest = s.clone();
            let mut parts = vec![];
            for kw in ["dependencies", "dependentRequired", "dependentSchemas"] {
                let Some(d) = rest.remove(kw) else { continue };
                let d = d
                    .as_object()
                    .ok_or_else(|| self.invalid(ptr, &format!("{kw} must be an object")))?;
                for (k, need) in d {
                    let present = match need {
                        Value::Array(keys) => {
                            let mut r = vec![Value::String(k.clone())];
                            r.extend(keys.iter().cloned());
                            serde_json::json!({"required": r})
                        }
                        other => serde_json::json!({"allOf": [{"required": [k]}, other]}),
                    };
                    parts.push(serde_json::json!({"anyOf": [{"__forbidden": [k]}, present]}));
                }
            }
            // Past six, distributing them is too large: dependencies on key presence alone
            // are one formula written as disjoint alternatives (`presence.rs`).
            if parts.len() > 6 {
                use super::presence::{presence_alternatives, NotPresence};
                let why = match presence_alternatives(s) {
                    Ok(alts) => {
                        let all =
                            serde_json::json!({"allOf": [Value::Object(rest), {"anyOf": alts}]});
                        return self.value(from, &all, ptr);
                    }
                    Err(NotPresence::Other) => {
                        "more than 6 dependencies, not all on key presence alone".to_string()
                    }
                    Err(NotPresence::TooLarge) => format!(
                        "more than 6 dependencies, whose key presence needs more than {} \
                         alternatives",
                        super::presence::MAX_PRESENCE_ALTERNATIVES
                    ),
                };
                self.unsupported("dependencies", ptr, &why)?;
                return self.normalized(from, &rest, ptr);
            }
            parts.insert(0, Value::Object(rest));
            let all = serde_json::json!({ "allOf": parts });
            return self.value(from, &all, ptr);
        }
        // anyOf / oneOf: distribute the rest of the schema over the branches.
        for kw in ["anyOf", "oneOf"] {
            if let Some(branches) = s.get(kw) {
                let branches = branches
                    .as_array()
                    .ok_or_else(|| self.invalid(ptr, &format!("{kw} must be an array")))?;
                // The rest without the branches (a copy of those only where `oneOf` rewrites
                // them): a large schema's `anyOf` copied nothing but its siblings.
                let rest: Map<String, Value> = s
                    .iter()
                    .filter(|(k, _)| k.as_str() != kw)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let mut owned_branches = std::borrow::Cow::Borrowed(branches);
                let source = branches;
                let mut excluded: Vec<Vec<usize>> = vec![Vec::new(); branches.len()];
                if kw == "oneOf" {
                    // Branches that may overlap: each excludes the others' values.
                    let overlaps = self.check_one_of(branches, &rest, ptr)?;
                    if !overlaps.is_empty() {
                        if let Some(alt) =
                            self.one_of_object_split(branches, &rest, &overlaps, ptr)?
                        {
                            let all = serde_json::json!({"allOf": [Value::Object(rest), alt]});
                            return self.value(from, &all, ptr);
                        }
                    }
                    // Each branch with the complements of the branches it may overlap, as one
                    // flat `allOf` (nested one per overlap, a branch of a wide `oneOf` was
                    // past the merge depth); `one_of.rs`.
                    for (i, j) in overlaps {
                        excluded[i].push(j);
                        excluded[j].push(i);
                    }
                    for (a, others) in excluded.iter().enumerate() {
                        if !others.is_empty() {
                            let b = self.excluding(branches, a, others, ptr, None)?;
                            owned_branches.to_mut()[a] = b;
                        }
                    }
                }
                let branches: &[Value] = &owned_branches;
                let only_annotations = rest.keys().all(|k| is_annotation(k));
                let rest = Value::Object(rest);
                let exit = self.b.state()?;
                // A branch of an `anyOf` equal to an earlier one adds no value, only a second
                // parse of each value it matches (under a recursive `$ref`, one more per
                // level: the matcher's threads double at each).
                let mut seen = ValueSet::default();
                for (i, br) in branches.iter().enumerate() {
                    if kw == "anyOf" && !seen.insert(br) {
                        continue;
                    }
                    let bptr = format!("{ptr}/{kw}/{i}");
                    let snap = self.snapshot();
                    let excludes = excluded.get(i).is_some_and(|o| !o.is_empty());
                    let mut e = self.branch(from, &rest, br, &bptr, only_annotations);
                    if excludes {
                        e = e.and_then(|e| self.drain_pending(snap.pending()).map(|_| e));
                    }
                    // A branch refused (too large, most often) with its exclusions — also in a
                    // rule it declared: again with coarser ones (stricter, `one_of.rs`); the
                    // first error stands if every one fails.
                    if excludes && matches!(e, Err(CompileError::Unsupported { .. })) {
                        for d in super::one_of::COARSE_DEPTHS {
                            self.restore(&snap);
                            let coarse = self.excluding(source, i, &excluded[i], ptr, Some(d))?;
                            let again = self
                                .branch(from, &rest, &coarse, &bptr, only_annotations)
                                .and_then(|e| self.drain_pending(snap.pending()).map(|_| e));
                            if again.is_ok() {
                                e = again;
                                break;
                            }
                        }
                    }
                    let e = e?;
                    self.b.eps(e, exit);
                }
                return Ok(exit);
            }
        }
        for kw in s.keys() {
            match kw.as_str() {
                "unevaluatedProperties" | "unevaluatedItems" | "$dynamicRef" | "$recursiveRef" => {
                    self.unsupported(kw, ptr, "cannot be enforced exactly")?;
                }
                _ => {}
            }
        }
        if let Some(values) = s.get("enum").and_then(|e| e.as_array()).cloned() {
            return self.enum_values(from, &values, &ValueCheck::of(s), ptr);
        }
        if let Some(c) = s.get("const").cloned() {
            return self.enum_values(from, &[c], &ValueCheck::of(s), ptr);
        }
        // Excluded arrays and objects (`not: {const: [..]}`, from complements of `enum`):
        // a value differs from one of them iff it is of another type, has another length
        // or key set, or differs at a position or key (each difference a schema).
        if let Some(Value::Array(excl)) = s.get("__not_enum") {
            if excl.iter().any(|v| v.is_array() || v.is_object()) {
                let mut rest = s.clone();
                let scalars: Vec<Value> = excl
                    .iter()
                    .filter(|v| !v.is_array() && !v.is_object())
                    .cloned()
                    .collect();
                if scalars.is_empty() {
                    rest.remove("__not_enum");
                } else {
                    rest.insert("__not_enum".into(), Value::Array(scalars));
                }
                let mut parts = vec![Value::Object(rest)];
                for v in excl.iter().filter(|v| v.is_array() || v.is_object()) {
                    parts.push(serde_json::json!({ "anyOf": differs_from(v) }));
                }
                let all = serde_json::json!({ "allOf": parts });
                return self.value(from, &all, ptr);
            }
        }
        let types = self.types_of(s, ptr)?;
        let excluded: Vec<Value> = s
            .get("__not_enum")
            .and_then(|e| e.as_array())
            .cloned()
            .unwrap_or_default();
        let exit = self.b.state()?;
        for t in types {
            // Excluded numbers are taken out by the number emitters (no exponent then) when
            // the schema asks for numbers only; a schema that leaves the type free (`not:
            // {enum: [1]}`) would lose exponents on values it does not constrain: refused.
            let numeric_only = match s.get("type") {
                Some(Value::String(t)) => t == "integer" || t == "number",
                Some(Value::Array(ts)) => ts
                    .iter()
                    .all(|t| t.as_str().is_some_and(|t| t == "integer" || t == "number")),
                _ => false,
            };
            let excl_here = excluded.iter().any(|v| match v {
                Value::Number(_) => matches!(t, "number" | "integer") && !numeric_only,
                Value::Array(_) => t == "array",
                Value::Object(_) => t == "object",
                _ => false,
            });
            if excl_here {
                self.unsupported("not", ptr, &format!("excluded {t} values"))?;
            }
            let e = match t {
                "null" if excluded.contains(&Value::Null) => continue,
                "null" => self.b.lit(from, b"null")?,
                "boolean" => {
                    let x = self.b.state()?;
                    for (lit, v) in [("true", true), ("false", false)] {
                        if !excluded.contains(&Value::Bool(v)) {
                            let a = self.b.lit(from, lit.as_bytes())?;
                            self.b.eps(a, x);
                        }
                    }
                    x
                }
                "integer" if s.get("__fraction") == Some(&Value::Bool(true)) => continue,
                "integer" => self.integer(from, s, ptr)?,
                "number" => self.number(from, s, ptr)?,
                "string" => self.string(from, s, ptr)?,
                "array" => self.array(from, s, ptr)?,
                "object" => self.object(from, s, ptr)?,
                other => return Err(self.invalid(ptr, &format!("unknown type {other:?}"))),
            };
            self.b.eps(e, exit);
        }
        Ok(exit)
    }

    /// One branch of an `anyOf`/`oneOf` with the rest of its schema.
    fn branch(
        &mut self,
        from: StateId,
        rest: &Value,
        br: &Value,
        bptr: &str,
        only_annotations: bool,
    ) -> Result<StateId, CompileError> {
        // A branch that is a reference being expanded right now (a recursion through the
        // branches, beside other keywords): merging it here would expand it again at every
        // level; as `allOf: [rest, branch]` it is one rule per distinct text, called at the
        // next level (`JsonCompiler::recursive_merge`).
        let recursive_ref = br.as_object().is_some_and(|b| {
            b.keys().all(|k| k == "$ref" || is_annotation(k))
                && b.get("$ref")
                    .and_then(|r| r.as_str())
                    .is_some_and(|r| self.inlining.iter().any(|x| x == r))
        });
        if only_annotations {
            self.value(from, br, bptr)
        } else if recursive_ref {
            let all = serde_json::json!({"allOf": [rest.clone(), br.clone()]});
            self.value(from, &all, bptr)
        } else {
            let mark = self.merged_refs.len();
            match self.merge_schemas(rest, br, bptr, 0) {
                Ok(Value::Object(m)) => {
                    self.normalized_marked(from, Ok(std::borrow::Cow::Owned(m)), mark, bptr)
                }
                Ok(other) => {
                    self.merged_refs.truncate(mark);
                    self.value(from, &other, bptr)
                }
                Err(e) => {
                    self.merged_refs.truncate(mark);
                    Err(e)
                }
            }
        }
    }

    /// The types a schema admits, `number` absorbing `integer`.
    pub(super) fn types_of(
        &self,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Vec<&'static str>, CompileError> {
        const ALL: [&str; 6] = ["null", "boolean", "object", "array", "string", "number"];
        let mut out: Vec<&'static str> = match s.get("type") {
            None => ALL.to_vec(),
            Some(Value::String(t)) => vec![static_type(t).ok_or_else(|| {
                self.invalid(ptr, &format!("unknown type {:?}", crate::excerpt(t)))
            })?],
            Some(Value::Array(ts)) => {
                let mut v = Vec::new();
                for t in ts {
                    let t = t
                        .as_str()
                        .and_then(static_type)
                        .ok_or_else(|| self.invalid(ptr, "bad type list"))?;
                    if !v.contains(&t) {
                        v.push(t);
                    }
                }
                v
            }
            Some(_) => return Err(self.invalid(ptr, "bad type")),
        };
        if out.contains(&"number") {
            out.retain(|t| *t != "integer");
        }
        Ok(out)
    }

    /// `enum`/`const`: the listed values that also satisfy the rest of the schema (`vc`,
    /// the schema's [`ValueCheck`]).
    pub(super) fn enum_values(
        &mut self,
        from: StateId,
        values: &[Value],
        vc: &ValueCheck,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let exit = self.b.state()?;
        for (i, v) in values.iter().enumerate() {
            if i % 256 == 255 {
                self.b.check_deadline()?;
            }
            match vc.check(v) {
                Some(true) => {}
                Some(false) => continue,
                None => {
                    self.unsupported(
                        "enum",
                        ptr,
                        "enum/const combined with keywords the engine cannot check a value against",
                    )?;
                }
            }
            let e = self.literal(from, v)?;
            self.b.eps(e, exit);
        }
        Ok(exit)
    }
}

/// A schema's keywords as a listed value (an `enum`/`const` member, a candidate item) is
/// checked against them: `const`, `enum` and `__not_enum` through sets, linear in the lists
/// however long, the others by `check::check_value` on [`ValueCheck::rest`].
pub(super) struct ValueCheck {
    konst: Option<Value>,
    listed: Option<ValueSet>,
    excluded: ValueSet,
    /// The schema without its value lists.
    pub(super) rest: Map<String, Value>,
}

impl ValueCheck {
    pub(super) fn of(s: &Map<String, Value>) -> Self {
        let mut rest = s.clone();
        let konst = rest.remove("const");
        let listed = match rest.remove("enum") {
            Some(Value::Array(e)) => Some(ValueSet::of(&e)),
            _ => None,
        };
        let excluded = match rest.remove("__not_enum") {
            Some(Value::Array(e)) => ValueSet::of(&e),
            _ => ValueSet::default(),
        };
        ValueCheck {
            konst,
            listed,
            excluded,
            rest,
        }
    }

    /// Whether `v` satisfies the schema (`None`: a keyword cannot be decided here).
    pub(super) fn check(&self, v: &Value) -> Option<bool> {
        if self.konst.as_ref().is_some_and(|c| !json_eq(c, v))
            || self.listed.as_ref().is_some_and(|l| !l.contains(v))
            || self.excluded.contains(v)
        {
            return Some(false);
        }
        check::check_value(v, &self.rest)
    }
}

/// Schemas whose union is every value but `v` (an array or an object): another type,
/// another length or key set, or another value at a position or key.
fn differs_from(v: &Value) -> Vec<Value> {
    use serde_json::json;
    match v {
        Value::Array(items) => {
            let n = items.len();
            let mut alts = vec![
                json!({"not": {"type": "array"}}),
                json!({"type": "array", "minItems": n + 1}),
            ];
            if n > 0 {
                alts.push(json!({"type": "array", "maxItems": n - 1}));
            }
            for (i, x) in items.iter().enumerate() {
                let mut tuple = vec![Value::Bool(true); i];
                tuple.push(json!({"not": {"const": x}}));
                alts.push(json!({"type": "array", "minItems": i + 1, "prefixItems": tuple}));
            }
            alts
        }
        Value::Object(m) => {
            let keys: Vec<&String> = m.keys().collect();
            let mut alts = vec![
                json!({"not": {"type": "object"}}),
                json!({"type": "object", "__has_other": [{"keys": keys, "patterns": []}]}),
            ];
            for (k, x) in m {
                alts.push(json!({"type": "object", "__forbidden": [k]}));
                alts.push(json!({"type": "object", "required": [k],
                                 "properties": {k.clone(): {"not": {"const": x}}}}));
            }
            alts
        }
        _ => vec![json!({"not": {"const": v}})],
    }
}
