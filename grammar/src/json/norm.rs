//! Schema normalisation: `allOf` and sibling `$ref` are merged into one schema (exact
//! intersection where the keywords allow it, an error otherwise), `oneOf` is checked for
//! disjoint branches, and values are checked against simple schemas (for `enum`).

use std::borrow::Cow;

use serde_json::{Map, Value};

pub(super) use super::product::disjoint;
use super::{is_annotation, json_eq, JsonCompiler, ValueSet};
use crate::CompileError;

const MAX_MERGE_DEPTH: u32 = 24;

/// Keywords that only constrain objects (vacuous on other values).
const OBJECT_KEYWORDS: &[&str] = &[
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "__forbidden",
    "__has_other",
];

/// Most branches [`JsonCompiler::deep_disjoint`] looks at for one pair of `oneOf` branches.
const MAX_DISJOINT_VISITS: usize = 256;

impl JsonCompiler<'_> {
    /// Merges `allOf` and a sibling `$ref` into the schema.
    pub(super) fn normalize(
        &mut self,
        map: &Map<String, Value>,
        ptr: &str,
        depth: u32,
    ) -> Result<Map<String, Value>, CompileError> {
        self.normalize_cow(map, ptr, depth).map(Cow::into_owned)
    }

    /// [`Self::normalize`] without a copy of a schema that has nothing to merge (most of
    /// them): copying every subschema at every level made compiles quadratic in depth.
    pub(super) fn normalize_cow<'m>(
        &mut self,
        map: &'m Map<String, Value>,
        ptr: &str,
        depth: u32,
    ) -> Result<Cow<'m, Map<String, Value>>, CompileError> {
        if depth > MAX_MERGE_DEPTH {
            return Err(CompileError::Unsupported {
                keyword: "allOf".into(),
                pointer: ptr.into(),
                reason: "nesting too deep".into(),
            });
        }
        if !map.contains_key("allOf") && !map.contains_key("$ref") {
            return Ok(Cow::Borrowed(map));
        }
        let mut out = map.clone();
        let mut parts: Vec<(Value, String)> = Vec::new();
        if let Some(r) = out.remove("$ref") {
            let r = r
                .as_str()
                .ok_or_else(|| self.invalid(ptr, "$ref must be a string"))?
                .to_string();
            // A reference being expanded around this point is merged one level here; the
            // compiler turns a schema that merges it again below into a rule
            // (`JsonCompiler::recursive_merge`), and merging itself is depth-bounded.
            self.merged_refs.push(r.clone());
            parts.push((self.resolve(&r, ptr)?.clone(), r));
        }
        if let Some(all) = out.remove("allOf") {
            let all = all
                .as_array()
                .ok_or_else(|| self.invalid(ptr, "allOf must be an array"))?;
            for (i, s) in all.iter().enumerate() {
                parts.push((s.clone(), format!("{ptr}/allOf/{i}")));
            }
        }
        // `then`/`else` belong to the `if` of their own schema: without one they say nothing,
        // and merged they would pair with another part's `if`.
        let orphans = |m: &mut Map<String, Value>| {
            if !m.contains_key("if") {
                m.remove("then");
                m.remove("else");
            }
        };
        orphans(&mut out);
        for (p, _) in parts.iter_mut() {
            if let Value::Object(m) = p {
                orphans(m);
            }
        }
        super::switch::rewrite(&mut parts);
        let mut acc = Value::Object(out);
        for (p, pptr) in parts {
            acc = self.merge_schemas(&acc, &p, &pptr, depth + 1)?;
        }
        match acc {
            Value::Object(m) => Ok(Cow::Owned(m)),
            Value::Bool(true) => Ok(Cow::Owned(Map::new())),
            _ => {
                let mut m = Map::new();
                m.insert("__false".into(), Value::Bool(true));
                Ok(Cow::Owned(m))
            }
        }
    }

    /// The intersection of two schemas, as one schema.
    pub(super) fn merge_schemas(
        &mut self,
        a: &Value,
        b: &Value,
        ptr: &str,
        depth: u32,
    ) -> Result<Value, CompileError> {
        self.b.check_deadline()?;
        self.check_stack()?;
        let (a, b) = match (a, b) {
            (Value::Bool(true), x) | (x, Value::Bool(true)) => return Ok(x.clone()),
            (Value::Bool(false), _) | (_, Value::Bool(false)) => return Ok(Value::Bool(false)),
            (Value::Object(a), Value::Object(b)) => (a, b),
            _ => return Err(self.invalid(ptr, "a schema must be an object or a boolean")),
        };
        // An `unevaluated*` sees only its own schema's evaluations, so it is rewritten on its
        // side before the sides merge (the other side's keys would count as evaluated).
        let (ra, rb) = (self.own_unevaluated(a, ptr)?, self.own_unevaluated(b, ptr)?);
        if ra.is_some() || rb.is_some() {
            let a = ra.unwrap_or_else(|| Value::Object(a.clone()));
            let b = rb.unwrap_or_else(|| Value::Object(b.clone()));
            return self.merge_schemas(&a, &b, ptr, depth + 1);
        }
        // Borrowed where there is nothing to merge: only `out` below is a copy.
        let mut a = self.normalize_cow(a, ptr, depth + 1)?;
        let mut b = self.normalize_cow(b, ptr, depth + 1)?;
        // `minContains` / `maxContains` count only their own side's `contains`: without one
        // they say nothing, and kept they would count the other side's.
        for m in [&mut a, &mut b] {
            if !m.contains_key("contains")
                && !m.contains_key("__contains")
                && (m.contains_key("minContains") || m.contains_key("maxContains"))
            {
                let m = m.to_mut();
                m.remove("minContains");
                m.remove("maxContains");
            }
        }
        // Two different `if` or `oneOf`: b's one is rewritten as an `anyOf` (exact), which
        // merges with anything by distribution.
        for kw in ["if", "oneOf"] {
            if let (Some(x), Some(y)) = (a.get(kw), b.get(kw)) {
                if !json_eq(x, y) {
                    if let Some(d) = self.desugar(&b, kw, ptr)? {
                        b = Cow::Owned(d);
                    }
                }
            }
        }
        let mut out = a.clone().into_owned();
        let unsat = |out: &mut Map<String, Value>| {
            out.insert("__false".into(), Value::Bool(true));
        };
        // Tuples (`prefixItems`, or `items` as an array): merged position by position below,
        // each side's rest schema applying to the other side's extra positions.
        let tuple_mode = has_tuple(&a) || has_tuple(&b);
        for (k, bv) in b.iter() {
            if tuple_mode && matches!(k.as_str(), "items" | "prefixItems" | "additionalItems") {
                continue;
            }
            let Some(av) = a.get(k) else {
                out.insert(k.clone(), bv.clone());
                continue;
            };
            if json_eq(av, bv) {
                continue;
            }
            match k.as_str() {
                "type" => {
                    let ta = type_list(av);
                    let tb = type_list(bv);
                    let mut both: Vec<Value> = Vec::new();
                    for t in &ta {
                        for u in &tb {
                            let r = match (t.as_str(), u.as_str()) {
                                (x, y) if x == y => Some(x),
                                ("integer", "number") | ("number", "integer") => Some("integer"),
                                _ => None,
                            };
                            if let Some(r) = r {
                                if !both.iter().any(|v| v == r) {
                                    both.push(Value::String(r.into()));
                                }
                            }
                        }
                    }
                    if both.is_empty() {
                        unsat(&mut out);
                    }
                    out.insert(k.clone(), Value::Array(both));
                }
                // Two patterns: both must match (intersected when compiled).
                "pattern" => push_all(&mut out, "__patterns", std::slice::from_ref(bv)),
                // Two divisors: a multiple of both (the remainder automaton takes a list).
                "multipleOf" => push_all(&mut out, "__multiples", std::slice::from_ref(bv)),
                // Two different `contains` (uncounted): an item matching each.
                "contains"
                    if ![&a, &b].iter().any(|m| {
                        m.contains_key("minContains") || m.contains_key("maxContains")
                    }) =>
                {
                    push_all(&mut out, "__contains", std::slice::from_ref(bv))
                }
                "required" | "__forbidden" | "__not_enum" | "__not_pattern" | "__patterns"
                | "__has_other" | "__multiples" | "__not_multiple" | "__contains"
                | "__pattern_else" => {
                    let mut r = av.as_array().cloned().unwrap_or_default();
                    for x in bv.as_array().into_iter().flatten() {
                        if !r.contains(x) {
                            r.push(x.clone());
                        }
                    }
                    out.insert(k.clone(), Value::Array(r));
                }
                "properties" | "patternProperties" | "$defs" | "definitions" => {
                    let mut m = av.as_object().cloned().unwrap_or_default();
                    for (pk, pv) in bv.as_object().into_iter().flatten() {
                        let merged = match m.get(pk) {
                            Some(x) => {
                                self.merge_schemas(x, pv, &format!("{ptr}/{k}/{pk}"), depth + 1)?
                            }
                            None => pv.clone(),
                        };
                        m.insert(pk.clone(), merged);
                    }
                    out.insert(k.clone(), Value::Object(m));
                }
                "enum" => {
                    let ea = av.as_array().cloned().unwrap_or_default();
                    let eb = ValueSet::of(bv.as_array().into_iter().flatten());
                    let both: Vec<Value> = ea.into_iter().filter(|x| eb.contains(x)).collect();
                    out.insert(k.clone(), Value::Array(both));
                }
                "const" => unsat(&mut out),
                "minLength" | "minItems" | "minProperties" | "minimum" => {
                    if num(bv) > num(av) {
                        out.insert(k.clone(), bv.clone());
                    }
                }
                "maxLength" | "maxItems" | "maxProperties" | "maximum" => {
                    if num(bv) < num(av) {
                        out.insert(k.clone(), bv.clone());
                    }
                }
                "exclusiveMinimum" if av.is_number() && bv.is_number() => {
                    if num(bv) > num(av) {
                        out.insert(k.clone(), bv.clone());
                    }
                }
                "exclusiveMaximum" if av.is_number() && bv.is_number() => {
                    if num(bv) < num(av) {
                        out.insert(k.clone(), bv.clone());
                    }
                }
                // not A and not B = not (A or B).
                "not" => {
                    let both = serde_json::json!({"anyOf": [av.clone(), bv.clone()]});
                    out.insert(k.clone(), both);
                }
                "items" | "additionalProperties" | "additionalItems" | "propertyNames"
                    if !av.is_array() && !bv.is_array() =>
                {
                    let m = self.merge_schemas(av, bv, &format!("{ptr}/{k}"), depth + 1)?;
                    out.insert(k.clone(), m);
                }
                "anyOf" => {
                    let xa = av.as_array().cloned().unwrap_or_default();
                    let xb = bv.as_array().cloned().unwrap_or_default();
                    let alts = self.merge_any_of(&xa, &xb, &a, &b, ptr, depth)?;
                    out.insert(k.clone(), Value::Array(alts));
                }
                _ if is_annotation(k) => {}
                _ => {
                    return Err(CompileError::Unsupported {
                        keyword: "allOf".into(),
                        pointer: ptr.into(),
                        reason: format!("cannot intersect two different `{k}`"),
                    })
                }
            }
        }
        if tuple_mode {
            let (ta, ra) = tuple_parts(&a);
            let (tb, rb) = tuple_parts(&b);
            let mut tuple = Vec::new();
            for i in 0..ta.len().max(tb.len()) {
                let x = ta.get(i).unwrap_or(&ra);
                let y = tb.get(i).unwrap_or(&rb);
                tuple.push(self.merge_schemas(
                    x,
                    y,
                    &format!("{ptr}/prefixItems/{i}"),
                    depth + 1,
                )?);
            }
            let rest = self.merge_schemas(&ra, &rb, &format!("{ptr}/items"), depth + 1)?;
            out.remove("additionalItems");
            out.insert("prefixItems".into(), Value::Array(tuple));
            out.insert("items".into(), rest);
        }
        // Properties one side adds must satisfy the other side's additionalProperties.
        for (x, y) in [(&a, &b), (&b, &a)] {
            let Some(yp) = y.get("properties").and_then(|p| p.as_object()) else {
                continue;
            };
            let xp = x.get("properties").and_then(|p| p.as_object());
            let new_keys: Vec<&String> = yp
                .keys()
                .filter(|k| xp.is_none_or(|xp| !xp.contains_key(*k)))
                .collect();
            if new_keys.is_empty() {
                continue;
            }
            // A new key matching one of x's patterns gets that pattern's schema in the
            // merged object too (patterns apply to declared keys): nothing to add. The
            // others are additional to x.
            let new_keys: Vec<&String> = match x
                .get("patternProperties")
                .and_then(|p| p.as_object())
            {
                Some(xpp) => {
                    let mut res = Vec::new();
                    for p in xpp.keys() {
                        res.push(full_match_regex(p).map_err(|e| CompileError::Unsupported {
                            keyword: "patternProperties".into(),
                            pointer: ptr.into(),
                            reason: format!("{:?}: {e}", crate::excerpt(p)),
                        })?);
                    }
                    new_keys
                        .into_iter()
                        .filter(|k| !res.iter().any(|re| re.is_match(k.as_str())))
                        .collect()
                }
                None => new_keys,
            };
            if let Some(add) = x.get("additionalProperties") {
                let props = out
                    .get_mut("properties")
                    .and_then(|p| p.as_object_mut())
                    .map(std::mem::take)
                    .unwrap_or_default();
                let mut props = props;
                for k in new_keys {
                    let cur = props.get(k).cloned().unwrap_or(Value::Bool(true));
                    let m = self.merge_schemas(&cur, add, ptr, depth + 1)?;
                    props.insert(k.clone(), m);
                }
                out.insert("properties".into(), Value::Object(props));
            }
        }
        // Patterns one side adds: a key matching only them, undeclared, is additional to
        // the other side, so x's `additionalProperties` applies to it. Exact when x has no
        // patterns of its own (or the same pattern) — with patterns of its own, only keys
        // matching none of them (`__pattern_else`) — and declares no key the pattern
        // matches; otherwise refused (the merged object cannot tell those keys apart).
        for (x, y) in [(&a, &b), (&b, &a)] {
            let Some(ypp) = y.get("patternProperties").and_then(|p| p.as_object()) else {
                continue;
            };
            let add = match x.get("additionalProperties") {
                None | Some(Value::Bool(true)) => continue,
                Some(v) => v.clone(),
            };
            let xpp = x.get("patternProperties").and_then(|p| p.as_object());
            let xprops: Vec<&String> = x
                .get("properties")
                .and_then(|p| p.as_object())
                .map(|p| p.keys().collect())
                .unwrap_or_default();
            for p in ypp.keys() {
                if xpp.is_some_and(|m| m.contains_key(p)) {
                    continue;
                }
                let re = full_match_regex(p).map_err(|e| CompileError::Unsupported {
                    keyword: "patternProperties".into(),
                    pointer: ptr.into(),
                    reason: format!("{:?}: {e}", crate::excerpt(p)),
                })?;
                if xprops.iter().any(|k| re.is_match(k)) {
                    return Err(CompileError::Unsupported {
                        keyword: "allOf".into(),
                        pointer: ptr.into(),
                        reason: "patternProperties merged with another side's \
                                 additionalProperties"
                            .into(),
                    });
                }
                // x has patterns of its own: the schema applies to keys matching `p` and
                // none of them (`__pattern_else`, read by the object compiler).
                if let Some(xpp) = xpp.filter(|m| !m.is_empty()) {
                    let unless: Vec<Value> = xpp.keys().map(|k| Value::String(k.clone())).collect();
                    let entry = serde_json::json!({"pattern": p, "unless": unless, "schema": add});
                    push_all(&mut out, "__pattern_else", &[entry]);
                    continue;
                }
                let mut pp = out
                    .get("patternProperties")
                    .and_then(|v| v.as_object())
                    .cloned()
                    .unwrap_or_default();
                let cur = pp.get(p).cloned().unwrap_or(Value::Bool(true));
                let m = self.merge_schemas(&cur, &add, ptr, depth + 1)?;
                pp.insert(p.clone(), m);
                out.insert("patternProperties".into(), Value::Object(pp));
            }
        }
        Ok(Value::Object(out))
    }

    /// `oneOf` is exact as a union only when no value can match two branches: the pairs of
    /// branches not provably disjoint.
    pub(super) fn check_one_of(
        &mut self,
        branches: &[Value],
        rest: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Vec<(usize, usize)>, CompileError> {
        let mut sigs = Vec::new();
        for (i, br) in branches.iter().enumerate() {
            let bptr = format!("{ptr}/oneOf/{i}");
            let m = match self.merge_schemas(&Value::Object(rest.clone()), br, &bptr, 0) {
                Ok(Value::Object(m)) => m,
                Ok(Value::Bool(false)) => {
                    sigs.push(None);
                    continue;
                }
                Ok(_) => Map::new(),
                Err(e) => {
                    if self.opts.lenient {
                        return Ok(Vec::new());
                    }
                    return Err(e);
                }
            };
            sigs.push(Some(m));
        }
        let mut out = Vec::new();
        for i in 0..sigs.len() {
            // Quadratic in the branches (a `oneOf` of thousands of `const`s): the deadline
            // is looked at once per branch.
            self.b.check_deadline()?;
            for j in i + 1..sigs.len() {
                if let (Some(a), Some(b)) = (&sigs[i], &sigs[j]) {
                    let mut visits = MAX_DISJOINT_VISITS;
                    if self.deep_type_bits(a, 0) & self.deep_type_bits(b, 0) != 0
                        && !self.deep_disjoint(a, b, 0, &mut visits)
                    {
                        out.push((i, j));
                    }
                }
            }
        }
        Ok(out)
    }

    /// A `oneOf` whose overlapping branches are disjoint on objects (e.g. object schemas
    /// told apart by a required discriminator but without `type: object`, so any
    /// non-object matches them all), as an equivalent schema: on objects the union of the
    /// branches, on other values a `oneOf` of the branches without their object keywords
    /// (vacuous there). `None` when the overlaps are not of that kind.
    pub(super) fn one_of_object_split(
        &mut self,
        branches: &[Value],
        rest: &Map<String, Value>,
        overlaps: &[(usize, usize)],
        ptr: &str,
    ) -> Result<Option<Value>, CompileError> {
        use serde_json::json;
        let mut sigs = Vec::new();
        for (i, br) in branches.iter().enumerate() {
            let bptr = format!("{ptr}/oneOf/{i}");
            let mark = self.merged_refs.len();
            let m = self.merge_schemas(&Value::Object(rest.clone()), br, &bptr, 0);
            self.merged_refs.truncate(mark);
            match m {
                Ok(v) => sigs.push(v),
                // Only a keyword the merge cannot express means "not this way"; a deadline
                // or size limit stops the compile.
                Err(CompileError::Unsupported { .. } | CompileError::InvalidSchema { .. }) => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
        }
        for &(i, j) in overlaps {
            let (Value::Object(a), Value::Object(b)) = (&sigs[i], &sigs[j]) else {
                return Ok(None);
            };
            if type_bits(a) & 4 == 0 || type_bits(b) & 4 == 0 {
                return Ok(None);
            }
            let (mut a, mut b) = (a.clone(), b.clone());
            a.insert("type".into(), json!("object"));
            b.insert("type".into(), json!("object"));
            if !disjoint(&a, &b) {
                return Ok(None);
            }
        }
        let objects: Vec<Value> = branches
            .iter()
            .map(|b| json!({"allOf": [{"type": "object"}, b]}))
            .collect();
        let others: Vec<Value> = sigs
            .into_iter()
            .map(|s| match s {
                Value::Object(mut m) => {
                    for k in OBJECT_KEYWORDS {
                        m.remove(*k);
                    }
                    Value::Object(m)
                }
                other => other,
            })
            .collect();
        Ok(Some(json!({"anyOf": [
            {"anyOf": objects},
            {"allOf": [{"not": {"type": "object"}}, {"oneOf": others}]}
        ]})))
    }

    /// `s` with its `if`/`then`/`else` (kw = "if") or `oneOf` replaced by an equivalent
    /// `anyOf` (of disjoint branches but for an `if` without `then`; merged with `s`'s own
    /// `anyOf`); `None` when a needed
    /// complement cannot be expressed.
    fn desugar(
        &mut self,
        s: &Map<String, Value>,
        kw: &str,
        ptr: &str,
    ) -> Result<Option<Map<String, Value>>, CompileError> {
        use serde_json::json;
        let mut rest = s.clone();
        let alts: Vec<Value> = if kw == "if" {
            let Some(cond) = rest.remove("if") else {
                return Ok(None);
            };
            let then = rest.remove("then").unwrap_or(Value::Bool(true));
            let els = rest.remove("else").unwrap_or(Value::Bool(true));
            // Without `then`: `if or else` (overlapping, which an `anyOf` may be).
            if then == Value::Bool(true) {
                vec![cond, els]
            } else {
                let Some(neg) = self.negate(&cond, ptr, 0)? else {
                    return Ok(None);
                };
                vec![json!({"allOf": [cond, then]}), json!({"allOf": [neg, els]})]
            }
        } else {
            let Some(Value::Array(branches)) = rest.remove("oneOf") else {
                return Ok(None);
            };
            let mut out = Vec::new();
            for (i, bi) in branches.iter().enumerate() {
                let mut parts = vec![bi.clone()];
                for (j, bj) in branches.iter().enumerate() {
                    if i == j {
                        continue;
                    }
                    let (Value::Object(mi), Value::Object(mj)) = (bi, bj) else {
                        match self.negate(bj, ptr, 0)? {
                            Some(n) => parts.push(n),
                            None => return Ok(None),
                        }
                        continue;
                    };
                    if disjoint(mi, mj) {
                        continue;
                    }
                    match self.negate_within(bj, bi, ptr)? {
                        Some(n) => parts.push(n),
                        None => return Ok(None),
                    }
                }
                out.push(json!({ "allOf": parts }));
            }
            out
        };
        let all = json!({"allOf": [Value::Object(rest), {"anyOf": alts}]});
        let Value::Object(m) = all else {
            return Ok(None);
        };
        let mark = self.merged_refs.len();
        let r = self.normalize(&m, ptr, 1);
        self.merged_refs.truncate(mark);
        r.map(Some)
    }

    /// [`disjoint`], also through the `anyOf` / `oneOf` of either side: no value matches both
    /// when every branch there (with its side's other keywords, references resolved) is
    /// disjoint from the other side — e.g. a union of repository objects that each require
    /// two keys against an object of at most one property. Conservative: false when unsure,
    /// past 4 levels or when `visits` runs out.
    fn deep_disjoint(
        &mut self,
        a: &Map<String, Value>,
        b: &Map<String, Value>,
        depth: u32,
        visits: &mut usize,
    ) -> bool {
        if disjoint(a, b) {
            return true;
        }
        if depth >= 4 || *visits == 0 {
            return false;
        }
        for (x, y) in [(a, b), (b, a)] {
            for kw in ["anyOf", "oneOf"] {
                let Some(Value::Array(branches)) = x.get(kw) else {
                    continue;
                };
                let rest: Map<String, Value> = x
                    .iter()
                    .filter(|(k, _)| k.as_str() != kw)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let rest = Value::Object(rest);
                let mut all = true;
                for br in branches {
                    if *visits == 0 {
                        return false;
                    }
                    *visits -= 1;
                    let mark = self.merged_refs.len();
                    let ok = match self.merge_schemas(&rest, br, "#", depth + 1) {
                        Ok(Value::Bool(false)) => true,
                        Ok(Value::Object(m)) => match self.normalize_cow(&m, "#", depth + 1) {
                            Ok(n) => {
                                let n = n.into_owned();
                                self.deep_disjoint(&n, y, depth + 1, visits)
                            }
                            Err(_) => false,
                        },
                        _ => false,
                    };
                    self.merged_refs.truncate(mark);
                    if !ok {
                        all = false;
                        break;
                    }
                }
                if all {
                    return true;
                }
            }
        }
        false
    }

    /// The types a schema admits, looking through `$ref`, `allOf`, `anyOf` and `oneOf`
    /// (a superset: 127 when unsure).
    fn deep_type_bits(&mut self, m: &Map<String, Value>, depth: u32) -> u8 {
        let mut bits = type_bits(m);
        if depth > 6 {
            return bits;
        }
        for kw in ["anyOf", "oneOf"] {
            let Some(Value::Array(branches)) = m.get(kw) else {
                continue;
            };
            let mut u = 0u8;
            for br in branches {
                u |= match br {
                    Value::Bool(true) => 127,
                    Value::Bool(false) => 0,
                    Value::Object(bm) => {
                        let mark = self.merged_refs.len();
                        let n = self.normalize_cow(bm, "#", depth + 1);
                        self.merged_refs.truncate(mark);
                        match n {
                            Ok(n) => self.deep_type_bits(&n, depth + 1),
                            Err(_) => 127,
                        }
                    }
                    _ => 127,
                };
            }
            bits &= u;
        }
        bits
    }
}

/// Whether a schema has a tuple part (`prefixItems`, or `items` as an array).
fn has_tuple(m: &Map<String, Value>) -> bool {
    m.get("prefixItems").is_some_and(|p| p.is_array())
        || m.get("items").is_some_and(|i| i.is_array())
}

/// A schema's tuple schemas and the schema for the items after them.
fn tuple_parts(m: &Map<String, Value>) -> (Vec<Value>, Value) {
    let t = Value::Bool(true);
    if let Some(Value::Array(p)) = m.get("prefixItems") {
        (p.clone(), m.get("items").cloned().unwrap_or(t))
    } else if let Some(Value::Array(p)) = m.get("items") {
        (p.clone(), m.get("additionalItems").cloned().unwrap_or(t))
    } else {
        (Vec::new(), m.get("items").cloned().unwrap_or(t))
    }
}

pub(super) fn type_list(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

pub(super) fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Type bits: null 1, boolean 2, object 4, array 8, string 16, number 32 (integer 64).
pub(super) fn type_bits(s: &Map<String, Value>) -> u8 {
    let of_value = |v: &Value| -> u8 {
        match v {
            Value::Null => 1,
            Value::Bool(_) => 2,
            Value::Object(_) => 4,
            Value::Array(_) => 8,
            Value::String(_) => 16,
            Value::Number(n) => {
                if n.is_i64() || n.is_u64() {
                    64
                } else {
                    32
                }
            }
        }
    };
    if s.contains_key("__false") {
        return 0;
    }
    // `not: {type: t}` (nothing else in the `not`) removes t.
    if let Some(Value::Object(n)) = s.get("not") {
        if n.contains_key("type") && n.keys().all(|k| k == "type" || is_annotation(k)) {
            let mut rest = s.clone();
            rest.remove("not");
            return type_bits(&rest) & !type_bits(n);
        }
    }
    if let Some(c) = s.get("const") {
        return of_value(c);
    }
    if let Some(Value::Array(e)) = s.get("enum") {
        return e.iter().map(of_value).fold(0, |a, b| a | b);
    }
    match s.get("type") {
        None => 127,
        Some(t) => type_list(t)
            .iter()
            .map(|t| match t.as_str() {
                "null" => 1,
                "boolean" => 2,
                "object" => 4,
                "array" => 8,
                "string" => 16,
                "number" => 32 | 64,
                "integer" => 64,
                _ => 0,
            })
            .fold(0, |a, b| a | b),
    }
}

/// Appends `vals` to the list under `key` (created when absent), skipping duplicates.
fn push_all(m: &mut Map<String, Value>, key: &str, vals: &[Value]) {
    let mut list = m
        .get(key)
        .and_then(|x| x.as_array())
        .cloned()
        .unwrap_or_default();
    for v in vals {
        if !list.contains(v) {
            list.push(v.clone());
        }
    }
    m.insert(key.into(), Value::Array(list));
}

/// A full-match test for a JSON Schema pattern (search semantics included): one regex, or
/// for a pattern with leading look-aheads (`types::split_lookaheads`) its main part, every
/// positive part and none of the negative ones.
pub(super) struct FullMatch {
    main: regex_automata::meta::Regex,
    pos: Vec<regex_automata::meta::Regex>,
    neg: Vec<regex_automata::meta::Regex>,
}

impl FullMatch {
    /// Whether the whole of `t` matches.
    pub(super) fn is_match(&self, t: &str) -> bool {
        self.main.is_match(t)
            && self.pos.iter().all(|r| r.is_match(t))
            && !self.neg.iter().any(|r| r.is_match(t))
    }
}

/// A full-match test for a JSON Schema pattern.
pub(super) fn full_match_regex(p: &str) -> Result<FullMatch, String> {
    full_match_regex_as(p, crate::regex::Flavor::EcmaSearch)
}

/// [`full_match_regex`] for a pattern of any flavor.
pub(super) fn full_match_regex_as(
    p: &str,
    flavor: crate::regex::Flavor,
) -> Result<FullMatch, String> {
    let one = |p: &str| -> Result<regex_automata::meta::Regex, String> {
        let hir = std::sync::Arc::unwrap_or_clone(crate::regex::parse(p, flavor)?);
        let full = regex_syntax::hir::Hir::concat(vec![
            regex_syntax::hir::Hir::look(regex_syntax::hir::Look::Start),
            hir,
            regex_syntax::hir::Hir::look(regex_syntax::hir::Look::End),
        ]);
        regex_automata::meta::Regex::builder()
            .build_from_hir(&full)
            .map_err(|e| e.to_string())
    };
    let split = match flavor {
        crate::regex::Flavor::EcmaSearch => super::types::split_lookaheads(p),
        _ => None,
    };
    Ok(match split {
        Some((main, pos, neg)) => FullMatch {
            main: one(&main)?,
            pos: pos.iter().map(|x| one(x)).collect::<Result<_, _>>()?,
            neg: neg.iter().map(|x| one(x)).collect::<Result<_, _>>()?,
        },
        None => FullMatch {
            main: one(p)?,
            pos: Vec::new(),
            neg: Vec::new(),
        },
    })
}
