//! `oneOf` branches that may overlap: each branch is compiled as `b_a and not b_j` for every
//! `b_j` it may share a value with.
//!
//! The exclusion `not b_j` is written for the values of `b_a` only (`negate_within`): what
//! both state identically is left out, a property whose schemas are disjoint keeps only its
//! absence, and a key witness inside a closed `b_a` becomes its declared keys. It is the
//! exact complement where `negate` can write it. Where it cannot (a keyword without a
//! complement, nesting past the depth, recursion), or where the exact one makes the branch
//! refused (too large a product), it is a subset of the complement: the alternatives that
//! can be written, the rest left out. A subset is stricter, never looser — `b_a` keeps the
//! values that fail `b_j` in a way written out (a key `b_j` requires absent, a type or a
//! value `b_j` excludes, …) and refuses the others — and it is marked (`negate::APPROX`)
//! so nothing negates it again. `not` and `if` take the same subset where their
//! complement has no exact form (`complement_or_subset`; empty: refused as before).

use serde_json::{json, Map, Value};

use super::negate::{APPROX, APPROX_DEPTH};
use super::product::disjoint;
use super::JsonCompiler;
use crate::CompileError;

/// The depths a branch refused with its exclusions is compiled again with, in turn: the
/// alternatives of each excluded branch's own keywords and of its properties' keywords
/// (types, values, keys), then its own keywords only.
pub(super) const COARSE_DEPTHS: [u32; 2] = [1, 0];

/// The compiler's state that an attempt at a branch leaves behind when it fails: what it
/// was in the middle of pushed, rules it declared. Restored before the branch is compiled
/// again (the states it made are unreachable and trimmed).
pub(super) struct Snapshot {
    /// Rules declared and bodies queued so far: the ones a failed attempt added are
    /// forgotten (their bodies are never built; nothing outside the attempt calls them).
    rules: usize,
    pending: usize,
    inlining: usize,
    merged_refs: usize,
    negating: usize,
    depth: u32,
    approx: Option<u32>,
    canonical_numbers: bool,
    inline_strings: bool,
}

impl Snapshot {
    /// How many rule bodies were queued.
    pub(super) fn pending(&self) -> usize {
        self.pending
    }
}

impl JsonCompiler<'_> {
    /// Branch `a` of `branches` excluding the values of each branch in `others`:
    /// `allOf: [b_a, not b_j, …]`. `coarse: Some(d)`: every exclusion approximated to depth
    /// `d` (what a branch refused with its exact exclusions is compiled with instead).
    pub(super) fn excluding(
        &mut self,
        branches: &[Value],
        a: usize,
        others: &[usize],
        ptr: &str,
        coarse: Option<u32>,
    ) -> Result<Value, CompileError> {
        let mut parts = vec![branches[a].clone()];
        for &b in others {
            match self.exclusion(&branches[b], &branches[a], ptr, coarse)? {
                Some(neg) => parts.push(neg),
                None => {
                    let k = self.unnegatable.take().unwrap_or_default();
                    let (i, j) = (a.min(b), a.max(b));
                    self.unsupported(
                        "oneOf",
                        ptr,
                        &format!(
                            "branches {i} and {j} may both match a value and `{k}` in \
                             branch {b} has no complement"
                        ),
                    )?;
                }
            }
        }
        Ok(json!({ "allOf": parts }))
    }

    /// `not other` for the values of `within`: exact (`negate_within`) unless `coarse`,
    /// else (or where there is no exact one) a subset of it to depth `coarse` (or
    /// [`APPROX_DEPTH`]), marked.
    fn exclusion(
        &mut self,
        other: &Value,
        within: &Value,
        ptr: &str,
        coarse: Option<u32>,
    ) -> Result<Option<Value>, CompileError> {
        if coarse.is_none() {
            if let Some(neg) = self.negate_within(other, within, ptr)? {
                return Ok(Some(neg));
            }
        }
        let depth = coarse.unwrap_or(APPROX_DEPTH);
        self.note_approximated("oneOf", ptr);
        Ok(match self.subset(other, Some(within), ptr, depth)? {
            // Empty (nothing written out): the branch keeps no value `other` may share.
            Some(Value::Bool(false)) => Some(json!({ "anyOf": [false], APPROX: true })),
            other => other,
        })
    }

    /// The complement of `other` where only values of `within` matter (`oneOf`'s `within and
    /// not other`): `other`'s constraints that `within` states identically are left out
    /// first, since no value of `within` violates them. Exact (`within and not other` is
    /// unchanged), and overlapping branches that share most of their properties no longer
    /// take one copy of `within` per shared property.
    pub(super) fn negate_within(
        &mut self,
        other: &Value,
        within: &Value,
        ptr: &str,
    ) -> Result<Option<Value>, CompileError> {
        match (self.bare_target(other), self.bare_target(within)) {
            (Some(o), Some(w)) if o != w => {
                let (o, w) = (o.clone(), w.clone());
                let (o, w) = (self.flat(o, ptr)?, self.flat(w, ptr)?);
                let pruned = Value::Object(without_implied(&o, &w));
                let keys = closed_keys(&w);
                let neg = self.negate(&pruned, ptr, 0)?;
                Ok(neg.map(|n| match keys {
                    Some(keys) => witnesses_within(n, &keys),
                    None => n,
                }))
            }
            _ => self.negate(other, ptr, 0),
        }
    }

    /// `m` with its `allOf` and `$ref` merged in (as `negate` reads it), so that
    /// [`without_implied`] compares the keywords both branches end up with: branches built as
    /// `allOf: [{$ref: base}, {their own}]` share the base's properties, which are left out
    /// then, and keep only what tells them apart. `m` as it is where the merge is refused.
    fn flat(
        &mut self,
        m: Map<String, Value>,
        ptr: &str,
    ) -> Result<Map<String, Value>, CompileError> {
        if !m.contains_key("allOf") && !m.contains_key("$ref") {
            return Ok(m);
        }
        match self.normalize_to_negate(&m, ptr, 1).map(|c| c.into_owned()) {
            Ok(flat) => Ok(flat),
            Err(CompileError::Unsupported { .. } | CompileError::InvalidSchema { .. }) => Ok(m),
            Err(e) => Err(e),
        }
    }

    /// The complement of `s` where it is only used positively (`not: s` beside the rest of
    /// its schema, `not if and else`): exact where `negate` writes it, else a subset of it
    /// (marked), so the keyword is enforced stricter instead of refused. `None` (the reason
    /// in `unnegatable`) when the subset is empty too.
    pub(super) fn complement_or_subset(
        &mut self,
        s: &Value,
        ptr: &str,
    ) -> Result<Option<Value>, CompileError> {
        if let Some(neg) = self.negate(s, ptr, 0)? {
            return Ok(Some(neg));
        }
        self.note_approximated("not", ptr);
        Ok(self
            .subset(s, None, ptr, APPROX_DEPTH)?
            .filter(|n| *n != Value::Bool(false)))
    }

    /// Records the first place a complement is written as a subset ([`Builder::approximated`](crate::nfa::Builder)).
    fn note_approximated(&mut self, keyword: &str, ptr: &str) {
        if self.b.approximated.is_none() {
            self.b.approximated = Some((keyword.into(), ptr.into()));
        }
    }

    /// A subset of `not other` (for the values of `within`, when given) written to `depth`:
    /// `negate` in approximation mode; the reason the exact attempt gave stays for messages.
    fn subset(
        &mut self,
        other: &Value,
        within: Option<&Value>,
        ptr: &str,
        depth: u32,
    ) -> Result<Option<Value>, CompileError> {
        let why = self.unnegatable.take();
        self.approx = Some(depth);
        let r = match within {
            Some(w) => self.negate_within(other, w, ptr),
            None => self.negate(other, ptr, 0),
        };
        self.approx = None;
        self.unnegatable = why;
        r
    }

    /// A snapshot of the compiler for [`restore`](Self::restore).
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            rules: self.b.rules.len(),
            pending: self.pending.len(),
            inlining: self.inlining.len(),
            merged_refs: self.merged_refs.len(),
            negating: self.negating.len(),
            depth: self.depth,
            approx: self.approx,
            canonical_numbers: self.canonical_numbers,
            inline_strings: self.inline_strings,
        }
    }

    /// The state of `s` again (see [`Snapshot`]).
    pub(super) fn restore(&mut self, s: &Snapshot) {
        let kept = |r: &crate::nfa::RuleId| (*r as usize) < s.rules;
        self.pending.truncate(s.pending);
        self.ref_rules.retain(|_, r| kept(r));
        self.schema_rules.retain(|_, r| kept(r));
        self.merge_rules.retain(|_, r| kept(r));
        self.not_ref_rules.retain(|_, r| kept(r));
        self.len_rules.retain(|_, r| kept(r));
        self.any_rule = self.any_rule.filter(kept);
        self.char_rule = self.char_rule.filter(kept);
        self.inlining.truncate(s.inlining);
        self.merged_refs.truncate(s.merged_refs);
        self.negating.truncate(s.negating);
        self.depth = s.depth;
        self.approx = s.approx;
        self.canonical_numbers = s.canonical_numbers;
        self.inline_strings = s.inline_strings;
    }
}

/// `other` without the constraints `within` states identically (so every value of `within`
/// satisfies them): keywords that constrain on their own, equal in both; `required` keys
/// both list; `properties`/`patternProperties` entries equal in both, kept declared as
/// `true` (what `additionalProperties` does not govern stays the same);
/// `additionalProperties` when the declared names and patterns are the same too. What is
/// left out is implied by `within`, so `within and not other` keeps its values. A property
/// whose schemas are disjoint becomes `false` in `other`: a value of `within` that has it
/// fails `other` there, so only its absence is left of `other`'s constraint on it.
fn without_implied(other: &Map<String, Value>, within: &Map<String, Value>) -> Map<String, Value> {
    const ALONE: &[&str] = &[
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "multipleOf",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "enum",
        "const",
        "propertyNames",
        "not",
        "anyOf",
        "oneOf",
    ];
    let same = |k: &str| other.get(k).is_some() && other.get(k) == within.get(k);
    let mut out = other.clone();
    for k in ALONE {
        if same(k) {
            out.remove(*k);
        }
    }
    // A bound with its draft-4 exclusive flag; a draft-6 exclusive bound on its own.
    for (b, x) in [
        ("minimum", "exclusiveMinimum"),
        ("maximum", "exclusiveMaximum"),
    ] {
        let numeric = |m: &Map<String, Value>| m.get(x).is_some_and(|v| v.is_number());
        if numeric(other) || numeric(within) {
            for k in [b, x] {
                if same(k) {
                    out.remove(k);
                }
            }
        } else if same(b) && other.get(x) == within.get(x) {
            out.remove(b);
            out.remove(x);
        }
    }
    // `items` as one schema for every item (no tuple part on either side).
    let tuple = |m: &Map<String, Value>| {
        m.contains_key("prefixItems") || m.get("items").is_some_and(|i| i.is_array())
    };
    if same("items") && !tuple(other) && !tuple(within) {
        out.remove("items");
    }
    if same("contains")
        && ["minContains", "maxContains"]
            .iter()
            .all(|k| !other.contains_key(*k) && !within.contains_key(*k))
    {
        out.remove("contains");
    }
    let names = |m: &Map<String, Value>, kw: &str| -> Vec<String> {
        let mut v: Vec<String> = m
            .get(kw)
            .and_then(|p| p.as_object())
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    if same("additionalProperties")
        && names(other, "properties") == names(within, "properties")
        && names(other, "patternProperties") == names(within, "patternProperties")
    {
        out.remove("additionalProperties");
    }
    for kw in ["properties", "patternProperties"] {
        if let (Some(Value::Object(op)), Some(Value::Object(wp))) =
            (out.get_mut(kw), within.get(kw))
        {
            for (k, v) in op.iter_mut() {
                match (wp.get(k), &*v) {
                    (Some(w), _) if w == v => *v = Value::Bool(true),
                    // A value of `within` with this key fails `other` there: of `other`'s
                    // constraint on the key only its absence is left (a discriminating
                    // property `other` does not require: `within and not other` is
                    // `within and (key present or not other')`, no longer one alternative
                    // per excluded value set).
                    (Some(Value::Object(w)), Value::Object(o)) if disjoint(w, o) => {
                        *v = Value::Bool(false)
                    }
                    _ => {}
                }
            }
        }
    }
    if let (Some(Value::Array(or)), Some(Value::Array(wr))) =
        (out.get_mut("required"), within.get("required"))
    {
        or.retain(|k| !wr.contains(k));
    }
    out
}

/// Most keys a key witness of a complement becomes one `required` alternative each for.
const MAX_WITNESS_KEYS: usize = 4;

/// The keys a closed object schema (`additionalProperties: false`, no patterns) allows.
fn closed_keys(m: &Map<String, Value>) -> Option<Vec<String>> {
    let closed = m.get("additionalProperties") == Some(&Value::Bool(false))
        && !m.contains_key("patternProperties");
    let props = m.get("properties").and_then(|p| p.as_object());
    closed.then(|| {
        props
            .into_iter()
            .flatten()
            .filter(|(_, v)| **v != Value::Bool(false))
            .map(|(k, _)| k.clone())
            .collect()
    })
}

/// In a complement used within a closed object schema whose keys are `declared`
/// ([`closed_keys`]), "some key outside `K`" (the complement of `other`'s
/// `additionalProperties: false`, without patterns) can only be one of the declared keys
/// outside `K`: one `required` alternative per such key (none left: no alternative).
/// Exact for the values of that schema, and a key condition less for the object emitter.
fn witnesses_within(neg: Value, declared: &[String]) -> Value {
    let Value::Object(mut n) = neg else {
        return neg;
    };
    let Some(Value::Array(alts)) = n.get_mut("anyOf") else {
        return Value::Object(n);
    };
    let mut out = Vec::with_capacity(alts.len());
    for alt in alts.drain(..) {
        let keys = alt.as_object().and_then(|m| {
            let conds = m.get("__has_other")?.as_array()?;
            let c = conds.first()?.as_object()?;
            let plain = m.len() == 2
                && m.get("type")? == "object"
                && conds.len() == 1
                && c.len() == 2
                && c.get("patterns")?.as_array()?.is_empty();
            plain.then(|| c.get("keys")?.as_array().cloned()).flatten()
        });
        let Some(keys) = keys else {
            out.push(alt);
            continue;
        };
        let left: Vec<&String> = declared
            .iter()
            .filter(|k| !keys.iter().any(|x| x == k.as_str()))
            .collect();
        if left.len() > MAX_WITNESS_KEYS {
            out.push(alt);
            continue;
        }
        for k in left {
            out.push(json!({"type": "object", "required": [k]}));
        }
    }
    *alts = out;
    if alts.is_empty() {
        return Value::Bool(false);
    }
    Value::Object(n)
}
