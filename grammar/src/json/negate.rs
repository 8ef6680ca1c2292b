//! Complements: a schema for the values a schema rejects, written with keywords the
//! compiler enforces (the union of each keyword's complement). `not`, `oneOf` and
//! `if`/`then`/`else` are compiled through it.

use serde_json::{Map, Value};

use super::norm::{disjoint, type_list};
use super::{is_annotation, JsonCompiler};
use crate::CompileError;

/// Deepest schema nesting `negate` writes a complement for.
const MAX_NEGATE_DEPTH: u32 = 8;

/// Longest chain of `$ref`s `negate` follows (each link is a recursion: following a
/// reference adds no schema nesting).
const MAX_NEGATE_REFS: usize = 32;

/// Most `oneOf` branches negated (the complement lists every overlapping pair).
const MAX_NEGATED_ONE_OF: usize = 6;

/// Deepest nesting an approximated complement writes alternatives for (what tells
/// overlapping branches apart in practice is near the top: a type, a key, a value).
pub(super) const APPROX_DEPTH: u32 = 3;

/// Marks an under-approximated complement (`JsonCompiler::approx`): never negated again.
pub(super) const APPROX: &str = "__approx";

impl JsonCompiler<'_> {
    /// A schema for the complement of `s` (the values `s` rejects), when it can be written
    /// with keywords the compiler enforces: the union of each keyword's complement.
    pub(super) fn negate(
        &mut self,
        s: &Value,
        ptr: &str,
        depth: u32,
    ) -> Result<Option<Value>, CompileError> {
        use serde_json::json;
        self.check_stack()?;
        let m = match s {
            Value::Bool(b) => return Ok(Some(Value::Bool(!b))),
            Value::Object(m) => m,
            _ => return Err(self.invalid(ptr, "a schema must be an object or a boolean")),
        };
        // The complement of an under-approximation would be looser than the schema's.
        if m.contains_key(APPROX) {
            return Ok(self.no_complement("an approximated complement"));
        }
        // A bare `$ref`: the complement of its target; a reference whose complement is
        // being written already (recursion) is a call to that complement's rule.
        if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
            if m.keys().all(|k| k == "$ref" || is_annotation(k)) {
                if self.negating.iter().any(|x| x == r) {
                    // Approximating: no recursive complement rule (left out).
                    if self.approx.is_some() {
                        return Ok(Some(Value::Bool(false)));
                    }
                    return Ok(Some(json!({ "__not_ref": r })));
                }
                // Following a reference adds no nesting (a chain of references is as deep
                // as its target; a cycle stops at `negating`), but a recursion all the same.
                if self.negating.len() >= MAX_NEGATE_REFS {
                    return Ok(self.no_complement("$ref chain"));
                }
                let target = self.resolve(r, ptr)?;
                self.negating.push(r.to_string());
                let neg = self.negate(target, ptr, depth);
                self.negating.pop();
                return neg;
            }
        }
        if depth > MAX_NEGATE_DEPTH || self.approx.is_some_and(|d| depth > d) {
            return Ok(self.no_complement("nesting"));
        }
        let m_cow = self.normalize_to_negate(m, ptr, depth + 1)?;
        let m: &Map<String, Value> = &m_cow;
        let mut alts: Vec<Value> = Vec::new();
        let excl_min = m.get("exclusiveMinimum") == Some(&Value::Bool(true));
        let excl_max = m.get("exclusiveMaximum") == Some(&Value::Bool(true));
        for (k, v) in m {
            if is_annotation(k) {
                continue;
            }
            let n = || v.as_f64().unwrap_or(f64::NAN);
            let mut discriminated = match k.as_str() {
                "anyOf" | "oneOf" => self.discriminator(v),
                _ => None,
            };
            match k.as_str() {
                "__false" => return Ok(Some(Value::Bool(true))),
                // `not type or not enum` is `not type or (type and not enum)`: the values
                // excluded within the schema's types (excluded numbers need a numeric type).
                "enum" | "const" if m.contains_key("type") => alts.push(json!({
                    "type": m["type"].clone(), "not": { k.clone(): v.clone() }
                })),
                "type" | "enum" | "const" | "__not_enum" if k != "__not_enum" => {
                    alts.push(json!({ "not": { k.clone(): v.clone() } }))
                }
                "__not_enum" => alts.push(json!({ "enum": v.clone() })),
                "pattern" => alts.push(json!({"type": "string", "__not_pattern": [v]})),
                // Unknown formats are annotations (nothing to negate); formats enforced
                // exactly as their RFC defines them are negated through their regex; those
                // enforced stricter through a superset of the RFC's texts; the rest
                // (`regex`, `idn-hostname`) refused: their complement would be looser.
                "format" => match v.as_str().map(|f| (f, super::formats::format_regex(f))) {
                    Some((_, Some(re))) if re.is_empty() => {}
                    // `hostname` is enforced stricter than RFC 1123, but its complement
                    // is the RFC's: not a host name, or longer than 253 characters (so
                    // `x and not hostname` is exact, never looser).
                    Some(("hostname", Some(_))) => {
                        let re = super::formats::hostname_rfc_regex();
                        alts.push(json!({
                            "type": "string", "__not_pattern": [format!("^(?:{re})$")]
                        }));
                        let long = super::formats::HOSTNAME_MAX_LEN + 1;
                        alts.push(json!({"type": "string", "minLength": long}));
                    }
                    Some((
                        "ipv4"
                        | "ipv6"
                        | "uuid"
                        | "date"
                        | "duration"
                        | "uri"
                        | "uri-reference"
                        | "iri"
                        | "iri-reference"
                        | "json-pointer"
                        | "relative-json-pointer"
                        | "uri-template",
                        Some(re),
                    )) => alts.push(json!({
                        "type": "string", "__not_pattern": [format!("^(?:{re})$")]
                    })),
                    // Enforced stricter than their RFC: the complement is what lies outside
                    // a superset of the RFC's texts (exact but for the texts between the
                    // two, which both refuse).
                    Some((f, _)) => match super::formats::format_superset_regex(f) {
                        Some(re) => alts.push(json!({
                            "type": "string", "__not_pattern": [format!("^(?:{re})$")]
                        })),
                        None if self.approx.is_some() => {}
                        None => {
                            self.unnegatable = Some(k.clone());
                            return Ok(None);
                        }
                    },
                    None if self.approx.is_some() => {}
                    None => {
                        self.unnegatable = Some(k.clone());
                        return Ok(None);
                    }
                },
                "__patterns" => {
                    for p in v.as_array().into_iter().flatten() {
                        alts.push(json!({"type": "string", "__not_pattern": [p]}));
                    }
                }
                "__not_pattern" => {
                    for p in v.as_array().into_iter().flatten() {
                        alts.push(json!({"type": "string", "pattern": p}));
                    }
                }
                "not" => alts.push(v.clone()),
                "__not_ref" => alts.push(json!({ "$ref": v })),
                // `if`/`then`/`else` is `(if and then) or (not if and else)`: its complement
                // is `(if and not then) or (not if and not else)`.
                "if" => {
                    if let Some(t) = m.get("then") {
                        match self.negate(t, ptr, depth + 1)? {
                            Some(Value::Bool(false)) => {}
                            Some(nt) => alts.push(json!({"allOf": [v, nt]})),
                            None => return Ok(None),
                        }
                    }
                    if let Some(e) = m.get("else") {
                        let ne = match self.negate(e, ptr, depth + 1)? {
                            Some(ne) => ne,
                            None => return Ok(None),
                        };
                        if ne != Value::Bool(false) {
                            match self.negate(v, ptr, depth + 1)? {
                                Some(Value::Bool(false)) => {}
                                Some(ni) => alts.push(json!({"allOf": [ni, ne]})),
                                None => return Ok(None),
                            }
                        }
                    }
                }
                // Without `if` they are ignored; with it, negated above.
                "then" | "else" => {}
                "required" => {
                    for key in v.as_array().into_iter().flatten() {
                        alts.push(json!({"type": "object", "__forbidden": [key]}));
                    }
                }
                "__forbidden" => {
                    for key in v.as_array().into_iter().flatten() {
                        alts.push(json!({"type": "object", "required": [key]}));
                    }
                }
                "properties" => {
                    for (pk, pv) in v.as_object().into_iter().flatten() {
                        match self.negate(pv, ptr, depth + 1)? {
                            Some(Value::Bool(false)) => {}
                            Some(neg) => alts.push(json!({
                                "type": "object", "required": [pk], "properties": { pk.clone(): neg }
                            })),
                            None => return Ok(None),
                        }
                    }
                }
                // Some item outside the item schema (no tuple part: `items` is every item).
                "items" if !v.is_array() && !m.contains_key("prefixItems") => {
                    match self.negate(v, ptr, depth + 1)? {
                        Some(Value::Bool(false)) => {}
                        Some(neg) => alts.push(json!({"type": "array", "contains": neg})),
                        None => return Ok(None),
                    }
                }
                // A tuple position present and outside its schema.
                "prefixItems" | "items" if v.is_array() => {
                    for (i, it) in v.as_array().into_iter().flatten().enumerate() {
                        match self.negate(it, ptr, depth + 1)? {
                            Some(Value::Bool(false)) => {}
                            Some(neg) => {
                                let mut tuple = vec![Value::Bool(true); i];
                                tuple.push(neg);
                                alts.push(json!({
                                    "type": "array", "prefixItems": tuple, "minItems": i + 1
                                }));
                            }
                            None => return Ok(None),
                        }
                    }
                }
                // `additionalProperties: false`: some key neither declared nor matching a
                // pattern.
                "additionalProperties" if v == &Value::Bool(false) => {
                    let (keys, pats) = (
                        member_keys(m, "properties"),
                        member_keys(m, "patternProperties"),
                    );
                    alts.push(json!({"type": "object",
                        "__has_other": [{"keys": keys, "patterns": pats}]}));
                }
                "additionalProperties" if v == &Value::Bool(true) || v == &json!({}) => {}
                // `additionalProperties: S`: some key neither declared nor matching a
                // pattern whose value is outside S (a key-and-value witness).
                "additionalProperties" if v.is_object() => {
                    let neg = match self.negate(v, ptr, depth + 1)? {
                        Some(Value::Bool(false)) => continue,
                        Some(neg) => neg,
                        None => return Ok(None),
                    };
                    let (keys, pats) = (
                        member_keys(m, "properties"),
                        member_keys(m, "patternProperties"),
                    );
                    alts.push(json!({"type": "object",
                        "__has_other": [{"keys": keys, "patterns": pats, "value": neg,
                                         "value_not": v}]}));
                }
                // None of the branches of a discriminated union (no two can both match).
                "anyOf" | "oneOf" if discriminated.is_some() => {
                    let (key, sets) = discriminated.take().unwrap_or_default();
                    match self.negate_discriminated(v, &key, sets, ptr, depth)? {
                        Some(mut more) => alts.append(&mut more),
                        None => return Ok(None),
                    }
                }
                // None of the branches, or two of them.
                "oneOf" if v.as_array().is_some_and(|b| b.len() <= MAX_NEGATED_ONE_OF) => {
                    let branches = v.as_array().cloned().unwrap_or_default();
                    let mut none = Vec::new();
                    for b in &branches {
                        match self.negate(b, ptr, depth + 1)? {
                            Some(neg) => none.push(neg),
                            None => return Ok(None),
                        }
                    }
                    alts.push(json!({ "allOf": none }));
                    for i in 0..branches.len() {
                        for j in i + 1..branches.len() {
                            if let (Value::Object(x), Value::Object(y)) =
                                (&branches[i], &branches[j])
                            {
                                if disjoint(x, y) {
                                    continue;
                                }
                            }
                            alts.push(json!({"allOf": [branches[i].clone(), branches[j].clone()]}));
                        }
                    }
                }
                // A trigger key present without what it needs: a listed key absent, or the
                // object outside the dependent schema.
                "dependencies" | "dependentRequired" | "dependentSchemas" if v.is_object() => {
                    for (dk, need) in v.as_object().into_iter().flatten() {
                        match need {
                            Value::Array(keys) => {
                                for key in keys.iter().filter(|x| x.as_str() != Some(dk)) {
                                    alts.push(json!({"type": "object", "required": [dk],
                                        "__forbidden": [key]}));
                                }
                            }
                            other => match self.negate(other, ptr, depth + 1)? {
                                Some(Value::Bool(false)) => {}
                                Some(neg) => alts.push(json!({"allOf": [
                                    {"type": "object", "required": [dk]}, neg
                                ]})),
                                None => return Ok(None),
                            },
                        }
                    }
                }
                // Some key outside the key schema.
                "propertyNames" => match self.negate_property_names(v, ptr, depth)? {
                    Some(mut more) => alts.append(&mut more),
                    None if self.approx.is_some() => {}
                    None => {
                        self.unnegatable = Some(k.clone());
                        return Ok(None);
                    }
                },
                "__fraction" => alts.push(json!({"type": "integer"})),
                "multipleOf" if v.is_number() => {
                    alts.push(json!({"type": "number", "__not_multiple": [v]}))
                }
                "__multiples" => {
                    for d in v.as_array().into_iter().flatten() {
                        alts.push(json!({"type": "number", "__not_multiple": [d]}));
                    }
                }
                "__not_multiple" => {
                    for d in v.as_array().into_iter().flatten() {
                        alts.push(json!({"type": "number", "multipleOf": d}));
                    }
                }
                // Pattern schemas that accept every value have no complement to add.
                "patternProperties" => {
                    for (pk, pv) in v.as_object().into_iter().flatten() {
                        match self.negate(pv, ptr, depth + 1)? {
                            Some(Value::Bool(false)) => {}
                            // `false`: some key matching the pattern.
                            Some(Value::Bool(true)) => alts.push(json!({"type": "object",
                                "__has_other": [{"keys": [], "patterns": [pk], "match": true}]})),
                            // Some key matching the pattern with its value outside (the
                            // schema itself kept as the complement of that value).
                            Some(neg) => alts.push(json!({"type": "object",
                                "__has_other": [{"keys": [], "patterns": [pk], "match": true,
                                                 "value": neg, "value_not": pv}]})),
                            None => {
                                self.unnegatable.get_or_insert_with(|| k.clone());
                                return Ok(None);
                            }
                        }
                    }
                }
                // Every key among the names or patterns of one condition (positive: no key
                // among them).
                "__has_other" => {
                    for c in v.as_array().into_iter().flatten() {
                        // A key-and-value witness: every witness key has its value outside
                        // the value schema.
                        if let Some(val) = c.get("value") {
                            let not_val = match c.get("value_not") {
                                Some(x) => x.clone(),
                                None => match self.negate(val, ptr, depth + 1)? {
                                    Some(x) => x,
                                    None => {
                                        self.unnegatable = Some("patternProperties".into());
                                        return Ok(None);
                                    }
                                },
                            };
                            let positive = c.get("match") == Some(&Value::Bool(true));
                            let listed = if positive {
                                not_val.clone()
                            } else {
                                json!(true)
                            };
                            let mut props = serde_json::Map::new();
                            for k in c["keys"].as_array().into_iter().flatten() {
                                if let Some(k) = k.as_str() {
                                    props.insert(k.to_string(), listed.clone());
                                }
                            }
                            let mut pp = serde_json::Map::new();
                            for p in c["patterns"].as_array().into_iter().flatten() {
                                if let Some(p) = p.as_str() {
                                    pp.insert(p.to_string(), listed.clone());
                                }
                            }
                            let mut alt = json!({"type": "object", "properties": props,
                                "patternProperties": pp});
                            if !positive {
                                alt["additionalProperties"] = not_val;
                            }
                            alts.push(alt);
                            continue;
                        }
                        if c.get("match") == Some(&Value::Bool(true)) {
                            let pp = names_to(c, "patterns", false);
                            let keys = c.get("keys").cloned().unwrap_or(json!([]));
                            alts.push(json!({"type": "object", "__forbidden": keys,
                                "patternProperties": pp}));
                            continue;
                        }
                        let props = names_to(c, "keys", true);
                        let pp = names_to(c, "patterns", true);
                        alts.push(json!({"type": "object", "properties": props,
                            "patternProperties": pp, "additionalProperties": false}));
                    }
                }
                // No item matches.
                "__contains" => {
                    for x in v.as_array().into_iter().flatten() {
                        match self.negate(x, ptr, depth + 1)? {
                            Some(neg) => alts.push(json!({"type": "array", "items": neg})),
                            None => return Ok(None),
                        }
                    }
                }
                "contains" if !m.contains_key("minContains") && !m.contains_key("maxContains") => {
                    match self.negate(v, ptr, depth + 1)? {
                        Some(neg) => alts.push(json!({"type": "array", "items": neg})),
                        None => return Ok(None),
                    }
                }
                "anyOf" => {
                    let mut all = Vec::new();
                    for b in v.as_array().into_iter().flatten() {
                        match self.negate(b, ptr, depth + 1)? {
                            Some(neg) => all.push(neg),
                            None => return Ok(None),
                        }
                    }
                    alts.push(json!({ "allOf": all }));
                }
                "minimum" if v.is_number() => alts.push(if excl_min {
                    json!({"type": "number", "maximum": v})
                } else {
                    json!({"type": "number", "exclusiveMaximum": v})
                }),
                "maximum" if v.is_number() => alts.push(if excl_max {
                    json!({"type": "number", "minimum": v})
                } else {
                    json!({"type": "number", "exclusiveMinimum": v})
                }),
                "exclusiveMinimum" | "exclusiveMaximum" if v.is_boolean() => {}
                "exclusiveMinimum" if v.is_number() => {
                    alts.push(json!({"type": "number", "maximum": v}))
                }
                "exclusiveMaximum" if v.is_number() => {
                    alts.push(json!({"type": "number", "minimum": v}))
                }
                "minLength" | "minItems" | "minProperties" if n() >= 0.0 => {
                    let (t, other) = match k.as_str() {
                        "minLength" => ("string", "maxLength"),
                        "minItems" => ("array", "maxItems"),
                        _ => ("object", "maxProperties"),
                    };
                    if n() >= 1.0 {
                        alts.push(json!({"type": t, other: n().ceil() - 1.0}));
                    }
                }
                // Strings or arrays longer than the counts the compiler enforces (4,096) are
                // left out of the complement: it refuses them too, stricter than the schema
                // where a value that long is valid, never looser (every complement is used
                // positively, never negated again).
                "maxLength" | "maxItems" if n() >= super::types::MAX_COUNT as f64 => {}
                "maxLength" | "maxItems" | "maxProperties" if n() >= 0.0 => {
                    let (t, other) = match k.as_str() {
                        "maxLength" => ("string", "minLength"),
                        "maxItems" => ("array", "minItems"),
                        _ => ("object", "minProperties"),
                    };
                    alts.push(json!({"type": t, other: n().floor() + 1.0}));
                }
                // Approximating: this keyword's alternatives are left out.
                _ if self.approx.is_some() => {}
                _ => {
                    self.unnegatable = Some(k.clone());
                    return Ok(None);
                }
            }
        }
        merge_absent_or_outside(&mut alts);
        Ok(Some(if alts.is_empty() {
            Value::Bool(false)
        } else if self.approx.is_some() {
            json!({ "anyOf": alts, APPROX: true })
        } else {
            json!({ "anyOf": alts })
        }))
    }
}

/// `k absent` (from `required`) and `k present with its value outside S` (from
/// `properties`) are one object schema, `properties: {k: not S}`: exact, and the complement
/// of a branch that requires one key and constrains only it stays a single object, so
/// intersecting many of them (every other branch of a `oneOf` whose branches each require
/// their own key) no longer multiplies alternatives.
fn merge_absent_or_outside(alts: &mut Vec<Value>) {
    use serde_json::json;
    let absent = |a: &Value| -> Option<String> {
        let m = a.as_object()?;
        let keys = m.get("__forbidden")?.as_array()?;
        (m.len() == 2 && m.get("type")? == "object" && keys.len() == 1)
            .then(|| keys[0].as_str().map(str::to_string))
            .flatten()
    };
    let outside = |a: &Value| -> Option<(String, Value)> {
        let m = a.as_object()?;
        let req = m.get("required")?.as_array()?;
        let props = m.get("properties")?.as_object()?;
        let key = req.first()?.as_str()?;
        (m.len() == 3 && m.get("type")? == "object" && req.len() == 1 && props.len() == 1)
            .then(|| props.get(key).map(|v| (key.to_string(), v.clone())))
            .flatten()
    };
    let mut i = 0;
    while i < alts.len() {
        let Some(key) = absent(&alts[i]) else {
            i += 1;
            continue;
        };
        let found = alts
            .iter()
            .enumerate()
            .find_map(|(j, a)| outside(a).filter(|(k, _)| *k == key).map(|(_, v)| (j, v)));
        match found {
            Some((j, neg)) => {
                alts[i] = json!({"type": "object", "properties": { key: neg }});
                alts.remove(j);
                if j < i {
                    i -= 1;
                }
                i += 1;
            }
            None => i += 1,
        }
    }
}

impl JsonCompiler<'_> {
    /// No complement for `why`: `None` (refused) when exact; when approximating, the empty
    /// set (a subset of every complement; the alternative it feeds is left out).
    fn no_complement(&mut self, why: &str) -> Option<Value> {
        if self.approx.is_some() {
            return Some(Value::Bool(false));
        }
        self.unnegatable.get_or_insert_with(|| why.into());
        None
    }

    /// `m` with its `allOf` and `$ref` merged in, as a complement reads it: complements the
    /// merge writes itself (a `oneOf` desugared) are exact, since they are negated again, and
    /// the references it expands are not the caller's.
    pub(super) fn normalize_to_negate<'m>(
        &mut self,
        m: &'m Map<String, Value>,
        ptr: &str,
        depth: u32,
    ) -> Result<std::borrow::Cow<'m, Map<String, Value>>, CompileError> {
        let mark = self.merged_refs.len();
        let approx = self.approx.take();
        let out = self.normalize_cow(m, ptr, depth);
        self.approx = approx;
        self.merged_refs.truncate(mark);
        out
    }

    /// The object a schema is, a bare `$ref` chain followed (`None` for booleans, a chain
    /// past [`MAX_NEGATE_REFS`] or a reference that does not resolve).
    pub(super) fn bare_target<'v>(&'v self, s: &'v Value) -> Option<&'v Map<String, Value>> {
        let mut m = s.as_object()?;
        for _ in 0..MAX_NEGATE_REFS {
            match m.get("$ref").and_then(|r| r.as_str()) {
                Some(r) if m.keys().all(|k| k == "$ref" || is_annotation(k)) => {
                    m = self.resolve(r, "#").ok()?.as_object()?;
                }
                _ => return Some(m),
            }
        }
        None
    }

    /// A discriminated union: every branch (a bare `$ref` followed) an object schema that
    /// requires the same key and gives it an `enum`/`const` (or a literal `pattern`,
    /// `product::named_values`) sharing no value with another branch's. Returns the key
    /// and each branch's values.
    fn discriminator(&self, branches: &Value) -> Option<(String, Vec<Vec<Value>>)> {
        let branches = branches.as_array()?;
        if branches.len() < 2 {
            return None;
        }
        let mut maps = Vec::with_capacity(branches.len());
        for b in branches {
            let m = self.bare_target(b)?;
            if super::norm::type_bits(m) != 4 {
                return None;
            }
            maps.push(m);
        }
        let required =
            |m: &Map<String, Value>| m.get("required").map(type_list).unwrap_or_default();
        'key: for k in required(maps[0]) {
            let mut sets: Vec<Vec<Value>> = Vec::with_capacity(maps.len());
            for m in &maps {
                if !required(m).contains(&k) {
                    continue 'key;
                }
                let Some(vals) = m
                    .get("properties")
                    .and_then(|p| p.get(&k))
                    .and_then(|p| p.as_object())
                    .and_then(super::product::named_values)
                else {
                    continue 'key;
                };
                if sets.iter().any(|s| super::product::share_a_value(s, &vals)) {
                    continue 'key;
                }
                sets.push(vals.into_owned());
            }
            return Some((k, sets));
        }
        None
    }

    /// "None of the branches" of a [`discriminator`](Self::discriminator) union, linear in
    /// the branches: a value is in at most one branch's discriminator set `D_i`, so
    /// `∧ not b_i` is `not (∨ D_i)` or some `D_i and not b_i`. (The general conjunction of
    /// the branches' complements grows with their product.)
    fn negate_discriminated(
        &mut self,
        branches: &Value,
        key: &str,
        sets: Vec<Vec<Value>>,
        ptr: &str,
        depth: u32,
    ) -> Result<Option<Vec<Value>>, CompileError> {
        use serde_json::json;
        let all: Vec<Value> = sets.iter().flatten().cloned().collect();
        let mut alts = vec![json!({"not": {"type": "object", "required": [key],
            "properties": {key: {"enum": all}}}})];
        for (b, vals) in branches.as_array().into_iter().flatten().zip(sets) {
            match self.negate(b, ptr, depth + 1)? {
                Some(Value::Bool(false)) => {}
                Some(neg) => alts.push(json!({"allOf": [
                    {"type": "object", "required": [key], "properties": {key: {"enum": vals}}},
                    neg
                ]})),
                None => return Ok(None),
            }
        }
        Ok(Some(alts))
    }

    /// The complement of `propertyNames: v` on objects, as alternatives: some key outside
    /// the key schema. `None` when a keyword of the key schema has no such complement.
    fn negate_property_names(
        &mut self,
        v: &Value,
        ptr: &str,
        depth: u32,
    ) -> Result<Option<Vec<Value>>, CompileError> {
        use serde_json::json;
        let some_key = || json!({"type": "object", "minProperties": 1});
        // A key that is none of `keys` and matches none of `patterns`.
        let other = |keys: Vec<Value>, patterns: Vec<Value>| json!({"type": "object", "__has_other": [{"keys": keys, "patterns": patterns}]});
        // A key matching a pattern.
        let matching = |p: Value| json!({"type": "object", "__has_other": [{"keys": [], "patterns": [p], "match": true}]});
        let m = match v {
            Value::Bool(true) => return Ok(Some(Vec::new())),
            Value::Bool(false) => return Ok(Some(vec![some_key()])),
            Value::Object(m) => {
                let mark = self.merged_refs.len();
                let approx = self.approx.take();
                let n = self.normalize(m, ptr, depth + 1);
                self.approx = approx;
                self.merged_refs.truncate(mark);
                n?
            }
            _ => return Err(self.invalid(ptr, "a schema must be an object or a boolean")),
        };
        let mut alts = Vec::new();
        let len = |x: &Value| x.as_u64();
        for (k, x) in &m {
            if is_annotation(k) {
                continue;
            }
            match k.as_str() {
                "__false" => return Ok(Some(vec![some_key()])),
                "type" => {
                    if !type_list(x).iter().any(|t| t == "string") {
                        return Ok(Some(vec![some_key()]));
                    }
                }
                "pattern" if x.is_string() => alts.push(other(vec![], vec![x.clone()])),
                "__patterns" => {
                    for p in x.as_array().into_iter().flatten() {
                        alts.push(other(vec![], vec![p.clone()]));
                    }
                }
                "minLength" if len(x).is_some() => {
                    let lo = len(x).unwrap_or(0);
                    if lo > 0 {
                        let p = format!("^[\\s\\S]{{{lo},}}$");
                        alts.push(other(vec![], vec![Value::String(p)]));
                    }
                }
                "maxLength" if len(x).is_some() => {
                    let hi = len(x).unwrap_or(0);
                    let p = format!("^[\\s\\S]{{0,{hi}}}$");
                    alts.push(other(vec![], vec![Value::String(p)]));
                }
                "enum" | "const" => {
                    let vals = match x {
                        Value::Array(a) if k == "enum" => a.clone(),
                        _ => vec![x.clone()],
                    };
                    let names: Vec<Value> = vals.into_iter().filter(|n| n.is_string()).collect();
                    if names.is_empty() {
                        return Ok(Some(vec![some_key()]));
                    }
                    alts.push(other(names, vec![]));
                }
                // Some key among the excluded names, or matching an excluded pattern.
                "__not_enum" => {
                    for n in x.as_array().into_iter().flatten() {
                        if n.is_string() {
                            alts.push(json!({"type": "object", "required": [n]}));
                        }
                    }
                }
                "__not_pattern" => {
                    for p in x.as_array().into_iter().flatten() {
                        alts.push(matching(p.clone()));
                    }
                }
                "not" => {
                    let mut forms = Vec::new();
                    self.not_forms(x, &mut forms);
                    for f in forms {
                        match f {
                            super::NotForm::NoOp => {}
                            super::NotForm::Unsat => return Ok(Some(vec![some_key()])),
                            super::NotForm::NotValues(vals) => {
                                for n in vals.into_iter().filter(|n| n.is_string()) {
                                    alts.push(json!({"type": "object", "required": [n]}));
                                }
                            }
                            super::NotForm::NotPattern(p) if p.is_string() => {
                                alts.push(matching(p))
                            }
                            _ => return Ok(None),
                        }
                    }
                }
                _ => return Ok(None),
            }
        }
        Ok(Some(alts))
    }
}

/// The strings of the array `c[field]` as schema keys, each mapped to the boolean schema
/// `allowed`.
fn names_to(c: &Value, field: &str, allowed: bool) -> serde_json::Map<String, Value> {
    c.get(field)
        .and_then(|k| k.as_array())
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str())
        .map(|n| (n.to_string(), Value::Bool(allowed)))
        .collect()
}

/// The member names of the object under `kw` in `m` (declared properties, patterns).
fn member_keys<'m>(m: &'m Map<String, Value>, kw: &str) -> Vec<&'m String> {
    m.get(kw)
        .and_then(|p| p.as_object())
        .map(|p| p.keys().collect())
        .unwrap_or_default()
}
