//! The object emitter: declared properties in schema order, `required`, `additionalProperties`,
//! `patternProperties`, `propertyNames`, `minProperties` / `maxProperties`, and the automaton
//! for keys no declared name or pattern takes ("any other key"). Objects whose keys may come
//! in any order are built by `any_order.rs`.
use serde_json::{Map, Value};

use super::key_conds::{has_other_conditions, KeyCond};
use super::key_names::KeyFormula;
use super::types::f;
use super::JsonCompiler;
use crate::nfa::{RuleId, StateId};
use crate::CompileError;

/// Most `patternProperties` on one object (the key automaton tracks which ones a key
/// matches: at most 31 key patterns in all, `propertyNames` and conditions included).
const MAX_PATTERNS: usize = 24;

/// Largest `minProperties`/`maxProperties` enforced (the object automaton carries a count
/// up to it).
const MAX_PROPERTY_COUNT: usize = 128;

/// Most `__has_other` conditions (complements of `additionalProperties`/`propertyNames`)
/// on one object.
const MAX_CONDS: usize = 4;

/// A declared property: key, value schema, required.
pub(super) type Item = (String, Value, bool);

/// `patternProperties` entries (pattern, schema) and their full-match regexes.
type Patterns = (Vec<(String, Value)>, Vec<super::norm::FullMatch>);

/// The property counts the object automaton tracks: `0..=cap`, exactly up to
/// `maxProperties` (`exact`), else saturating at `max(minProperties, 1)`.
#[derive(Clone, Copy, Debug)]
struct Counts {
    cap: usize,
    exact: bool,
    /// `minProperties`.
    min: usize,
}

/// What an object schema asks for, gathered (and checked) before any NFA state is built.
pub(super) struct ObjectPlan {
    /// Declared properties in schema order, then required keys not declared, then the
    /// names of key conditions (optional).
    pub(super) items: Vec<Item>,
    /// The schema of undeclared properties (`None`: none allowed).
    pub(super) additional: Option<Value>,
    /// `patternProperties`, and their full-match regexes.
    pub(super) patterns: Vec<(String, Value)>,
    pub(super) matchers: Vec<super::norm::FullMatch>,
    /// Keys never produced (`__forbidden`: `not: {required: [k]}`).
    forbidden: Vec<String>,
    /// `__has_other` conditions, and the regexes of their patterns.
    conds: Vec<KeyCond>,
    cond_res: Vec<Vec<super::norm::FullMatch>>,
    /// `propertyNames` on undeclared keys: patterns every key matches, patterns none
    /// matches, names excluded.
    pub(super) name_pos: Vec<String>,
    pub(super) name_neg: Vec<String>,
    pub(super) name_excl: Vec<String>,
    /// `propertyNames` combinators on undeclared keys: formulas every key satisfies, over
    /// the patterns in `name_alt`.
    pub(super) name_formulas: Vec<KeyFormula>,
    pub(super) name_alt: Vec<String>,
}

impl ObjectPlan {
    /// Whether `k` is one of condition `i`'s names or matches one of its patterns.
    fn listed(&self, i: usize, k: &str) -> bool {
        self.conds[i].0.iter().any(|x| x == k) || self.cond_res[i].iter().any(|re| re.is_match(k))
    }

    /// The key-only conditions writing key `k` satisfies.
    fn witness_bits(&self, k: &str) -> u8 {
        let mut bits = 0u8;
        for (i, c) in self.conds.iter().enumerate() {
            if c.3.is_none() && self.listed(i, k) == c.2 {
                bits |= 1 << i;
            }
        }
        bits
    }

    /// The value conditions (a listed key whose value is in a schema) key `k` may satisfy.
    fn value_bits(&self, k: &str) -> u8 {
        let mut bits = 0u8;
        for (i, c) in self.conds.iter().enumerate() {
            if c.3.is_some() && self.listed(i, k) == c.2 {
                bits |= 1 << i;
            }
        }
        bits
    }

    /// All value conditions.
    fn all_value_bits(&self) -> u8 {
        self.conds
            .iter()
            .enumerate()
            .filter(|(_, c)| c.3.is_some())
            .fold(0, |a, (i, _)| a | 1 << i)
    }

    /// Sets of conditions met (witness-bit sets).
    fn witness_sets(&self) -> usize {
        1usize << self.conds.len()
    }

    /// Whether undeclared keys can be written at all.
    pub(super) fn has_undeclared(&self) -> bool {
        self.additional.is_some() || !self.patterns.is_empty()
    }
}

impl JsonCompiler<'_> {
    /// An object schema: `{`, the declared properties (schema order, or any order when
    /// asked and small enough) with undeclared ones in the gaps, `}`.
    pub(super) fn object(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let Some(plan) = self.object_plan(s, ptr)? else {
            return self.nothing();
        };
        let Some(counts) = self.property_counts(&plan, s, ptr)? else {
            return self.nothing();
        };
        let open = self.b.lit(from, b"{")?;
        let open = self.ws(open)?;
        let extras = self.undeclared_rules(&plan, s, ptr)?;
        let item_bits: Vec<u8> = plan.items.iter().map(|i| plan.witness_bits(&i.0)).collect();
        let full_w = (plan.witness_sets() - 1) as u8;
        // Value conditions make a key's witness bits depend on its value: schema order only.
        let any_order = if plan.all_value_bits() == 0 {
            let counts = (counts.cap, counts.exact, counts.min, full_w);
            match self.any_order(open, &plan.items, &item_bits, &extras, counts, ptr)? {
                Some(close) => Some(close),
                None => self.key_loop(open, &plan.items, &item_bits, &extras, counts, ptr)?,
            }
        } else {
            None
        };
        let close = match any_order {
            Some(close) => close,
            None => self.schema_order(open, &plan, &item_bits, &extras, counts, ptr)?,
        };
        let c = self.ws(close)?;
        self.b.lit(c, b"}")
    }

    /// The object's [`ObjectPlan`]; `None` when no object is valid.
    fn object_plan(
        &mut self,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Option<ObjectPlan>, CompileError> {
        let Some(mut plan) = self.declared_properties(s, ptr)? else {
            return Ok(None);
        };
        self.key_conditions(&mut plan, s, ptr)?;
        self.merge_pattern_schemas(&mut plan, ptr)?;
        if !self.property_names(&mut plan, s, ptr)? {
            return Ok(None);
        }
        Ok(Some(plan))
    }

    /// `properties`, `required`, `additionalProperties`, `patternProperties` and
    /// `__forbidden`: the items in order and what undeclared keys may be. `None` when a
    /// required key cannot be written.
    fn declared_properties(
        &mut self,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Option<ObjectPlan>, CompileError> {
        let empty = Map::new();
        let props = s
            .get("properties")
            .and_then(|p| p.as_object())
            .unwrap_or(&empty);
        let required: Vec<String> = s
            .get("required")
            .and_then(|r| r.as_array())
            .map(|r| {
                r.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let additional = match s.get("additionalProperties") {
            Some(Value::Bool(false)) => None,
            Some(v) => Some(v.clone()),
            None if self.opts.allow_undeclared_properties => Some(Value::Bool(true)),
            None => None,
        };
        let (patterns, matchers) = self.pattern_properties(s, ptr)?;
        // Items in order: declared properties, then required keys not declared.
        let mut items: Vec<Item> = Vec::new();
        for (k, v) in props {
            items.push((k.clone(), v.clone(), required.contains(k)));
        }
        for r in &required {
            if !props.contains_key(r) {
                // A key a pattern takes gets the pattern's schema (merged below), never
                // `additionalProperties`.
                if matchers.iter().any(|re| re.is_match(r.as_str())) {
                    items.push((r.clone(), Value::Bool(true), true));
                    continue;
                }
                match &additional {
                    Some(a) => items.push((r.clone(), a.clone(), true)),
                    None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                        return Ok(None)
                    }
                    None => items.push((r.clone(), Value::Bool(true), true)),
                }
            }
        }
        // Keys a `not: {required: [k]}` forbids: never produced.
        let forbidden: Vec<String> = s
            .get("__forbidden")
            .and_then(|f| f.as_array())
            .map(|f| {
                f.iter()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if items.iter().any(|i| i.2 && forbidden.contains(&i.0)) {
            return Ok(None);
        }
        items.retain(|i| !forbidden.contains(&i.0));
        Ok(Some(ObjectPlan {
            items,
            additional,
            patterns,
            matchers,
            forbidden,
            conds: Vec::new(),
            cond_res: Vec::new(),
            name_pos: Vec::new(),
            name_neg: Vec::new(),
            name_excl: Vec::new(),
            name_formulas: Vec::new(),
            name_alt: Vec::new(),
        }))
    }

    /// `patternProperties` (at most [`MAX_PATTERNS`]) and their full-match regexes.
    fn pattern_properties(
        &mut self,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Patterns, CompileError> {
        let mut patterns: Vec<(String, Value)> = Vec::new();
        if let Some(pp) = s.get("patternProperties").and_then(|p| p.as_object()) {
            for (p, v) in pp {
                patterns.push((p.clone(), v.clone()));
            }
        }
        if patterns.len() > MAX_PATTERNS {
            self.unsupported(
                "patternProperties",
                ptr,
                &format!("more than {MAX_PATTERNS} patterns"),
            )?;
            patterns.truncate(MAX_PATTERNS);
        }
        let mut matchers = Vec::new();
        for (p, _) in &patterns {
            match super::norm::full_match_regex(p) {
                Ok(re) => matchers.push(re),
                Err(e) => {
                    return Err(CompileError::Unsupported {
                        keyword: "patternProperties".into(),
                        pointer: ptr.into(),
                        reason: format!("{:?}: {e}", crate::excerpt(p)),
                    })
                }
            }
        }
        Ok((patterns, matchers))
    }

    /// `__has_other` (the complement of `additionalProperties: false` or `propertyNames`):
    /// the object must have a key outside a list of names and patterns (or, `positive`,
    /// among them). Such names this object does not declare become optional items, so
    /// that undeclared keys are never one of them.
    fn key_conditions(
        &mut self,
        plan: &mut ObjectPlan,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<(), CompileError> {
        let conds = has_other_conditions(s);
        if conds.len() > MAX_CONDS {
            self.unsupported(
                "additionalProperties",
                ptr,
                "more than four key conditions (complements of `additionalProperties` or \
                 `propertyNames`) on one object",
            )?;
        }
        let conds: Vec<KeyCond> = conds.into_iter().take(MAX_CONDS).collect();
        let mut cond_res: Vec<Vec<super::norm::FullMatch>> = Vec::new();
        for (keys, pats, _, _) in &conds {
            let mut res = Vec::new();
            for p in pats {
                res.push(super::norm::full_match_regex(p).map_err(|e| {
                    CompileError::Unsupported {
                        keyword: "additionalProperties".into(),
                        pointer: ptr.into(),
                        reason: format!("{:?}: {e}", crate::excerpt(p)),
                    }
                })?);
            }
            cond_res.push(res);
            for k in keys {
                if plan.items.iter().any(|i| &i.0 == k) || plan.forbidden.contains(k) {
                    continue;
                }
                if plan.matchers.iter().any(|re| re.is_match(k.as_str())) {
                    plan.items.push((k.clone(), Value::Bool(true), false));
                } else if let Some(a) = &plan.additional {
                    plan.items.push((k.clone(), a.clone(), false));
                }
            }
        }
        plan.conds = conds;
        plan.cond_res = cond_res;
        Ok(())
    }

    /// A declared key that matches a pattern must satisfy both schemas.
    fn merge_pattern_schemas(
        &mut self,
        plan: &mut ObjectPlan,
        ptr: &str,
    ) -> Result<(), CompileError> {
        for item in plan.items.iter_mut() {
            for (i, re) in plan.matchers.iter().enumerate() {
                if re.is_match(item.0.as_str()) {
                    let iptr = format!("{ptr}/patternProperties");
                    item.1 = self.merge_schemas(&item.1, &plan.patterns[i].1, &iptr, 0)?;
                }
            }
        }
        Ok(())
    }

    /// `minProperties` / `maxProperties` as [`Counts`]; `None` when no count is valid.
    fn property_counts(
        &mut self,
        plan: &ObjectPlan,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Option<Counts>, CompileError> {
        let min_p = f(s.get("minProperties")).map(|x| x as usize);
        let max_p = f(s.get("maxProperties")).map(|x| x as usize);
        let n_req = plan.items.iter().filter(|i| i.2).count();
        let cap = match (min_p, max_p) {
            (_, Some(mx)) => mx,
            (Some(mn), None) => mn.max(1),
            (None, None) => 1,
        };
        let exact = max_p.is_some();
        let min = min_p.unwrap_or(0);
        if max_p.is_some_and(|m| m < n_req || m < min) {
            return Ok(None);
        }
        if cap > MAX_PROPERTY_COUNT {
            let kw = if exact {
                "maxProperties"
            } else {
                "minProperties"
            };
            self.unsupported(
                kw,
                ptr,
                &format!("property counts above {MAX_PROPERTY_COUNT} are not enforced"),
            )?;
        }
        Ok(Some(Counts {
            cap: cap.min(MAX_PROPERTY_COUNT),
            exact,
            min,
        }))
    }

    /// Undeclared properties: one rule (`"other key": value`) per witness-bit set, called
    /// from every gap between declared properties; `(witness bits, rule)` for the sets some
    /// key can give.
    fn undeclared_rules(
        &mut self,
        plan: &ObjectPlan,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<Vec<(u8, RuleId)>, CompileError> {
        let mut extras: Vec<(u8, RuleId)> = Vec::new();
        if !plan.has_undeclared() {
            return Ok(extras);
        }
        let (patterns, conds) = (&plan.patterns, &plan.conds);
        let mut declared: Vec<String> = plan.items.iter().map(|i| i.0.clone()).collect();
        declared.extend(plan.forbidden.iter().cloned());
        declared.extend(plan.name_excl.iter().cloned());
        let mut pats: Vec<&str> = patterns.iter().map(|p| p.0.as_str()).collect();
        let n_pp = pats.len();
        pats.extend(plan.name_pos.iter().map(|p| p.as_str()));
        pats.extend(plan.name_neg.iter().map(|p| p.as_str()));
        let alt_base = pats.len();
        pats.extend(plan.name_alt.iter().map(|p| p.as_str()));
        let any = plan.additional.is_some() || pats.len() > n_pp;
        let mut cond_masks = Vec::new();
        for (_, cp, _, _) in conds {
            let lo = pats.len();
            pats.extend(cp.iter().map(|p| p.as_str()));
            cond_masks.push(((1u64 << pats.len()) - (1u64 << lo)) as u32);
        }
        if pats.len() > 31 {
            return Err(CompileError::Unsupported {
                keyword: "patternProperties".into(),
                pointer: ptr.into(),
                reason: "more than 31 key patterns on one object".into(),
            });
        }
        let pos_mask: u32 = ((1u32 << plan.name_pos.len()) - 1) << n_pp;
        let neg_mask: u32 = ((1u32 << plan.name_neg.len()) - 1) << (n_pp + plan.name_pos.len());
        let all_value_bits = plan.all_value_bits();
        // One rule (and key automaton) per witness-bit set: a state shared by two rules
        // could return from the wrong one.
        for want in 0..plan.witness_sets() as u8 {
            let r = self.b.new_rule()?;
            self.b.key_rules.push(r);
            let rr = self.b.rules[r as usize];
            let exits = self.other_key(rr.start, &declared, &pats, any, neg_mask, ptr)?;
            let mut used = false;
            for (set, exit) in exits {
                // propertyNames: every positive pattern matches, no negative one does.
                if set & pos_mask != pos_mask
                    || set & neg_mask != 0
                    || !plan
                        .name_formulas
                        .iter()
                        .all(|f| f.holds(&|i| set >> (alt_base + i) & 1 == 1))
                {
                    continue;
                }
                // Key-only conditions follow from the key; value conditions whose
                // pattern the key matches are met when the value is in their schema.
                let mut wb = 0u8;
                let mut applicable = 0u8;
                for (i, m) in cond_masks.iter().enumerate() {
                    if conds[i].3.is_some() {
                        if (set & m != 0) == conds[i].2 {
                            applicable |= 1 << i;
                        }
                    } else if (set & m != 0) == conds[i].2 {
                        wb |= 1 << i;
                    }
                }
                let sub = want & all_value_bits;
                if want & !all_value_bits != wb || sub & !applicable != 0 {
                    continue;
                }
                let set = set & ((1u32 << n_pp) - 1);
                let Some((mut schema, vptr)) = self.undeclared_schema(plan, s, set, ptr)? else {
                    continue;
                };
                for (i, c) in conds.iter().enumerate() {
                    if let (true, Some(vs)) = (sub >> i & 1 == 1, &c.3) {
                        schema = self.merge_schemas(&schema, vs, &vptr, 0)?;
                    }
                }
                let k = self.punct(exit, b':')?;
                let e = self.value(k, &schema, &vptr)?;
                self.b.eps(e, rr.end);
                used = true;
            }
            if used {
                extras.push((want, r));
            }
        }
        Ok(extras)
    }

    /// The schema (and its pointer) of an undeclared key matching the patterns in `set`
    /// (bit `i`: `patternProperties` entry `i`): `additionalProperties` when none, else
    /// the patterns' schemas merged. `None` when such a key is not allowed.
    fn undeclared_schema(
        &mut self,
        plan: &ObjectPlan,
        s: &Map<String, Value>,
        set: u32,
        ptr: &str,
    ) -> Result<Option<(Value, String)>, CompileError> {
        if set == 0 {
            return Ok(plan
                .additional
                .as_ref()
                .map(|add| (add.clone(), format!("{ptr}/additionalProperties"))));
        }
        let patterns = &plan.patterns;
        let mut schema = Value::Bool(true);
        let pptr = format!("{ptr}/patternProperties");
        for (i, (_, v)) in patterns.iter().enumerate() {
            if set >> i & 1 == 1 {
                schema = self.merge_schemas(&schema, v, &pptr, 0)?;
            }
        }
        // `__pattern_else` (from `allOf` merges): a schema for keys matching one pattern
        // and none of a list.
        let bit = |p: &Value| {
            patterns
                .iter()
                .position(|(q, _)| Some(q.as_str()) == p.as_str())
                .is_some_and(|i| set >> i & 1 == 1)
        };
        for e in s
            .get("__pattern_else")
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
        {
            let unless = e["unless"].as_array().map(|u| u.as_slice()).unwrap_or(&[]);
            if bit(&e["pattern"]) && !unless.iter().any(bit) {
                schema = self.merge_schemas(&schema, &e["schema"], &pptr, 0)?;
            }
        }
        Ok(Some((schema, pptr)))
    }

    /// Declared properties in schema order from `open`, undeclared ones (`extras`) in
    /// every gap; returns the state before `}`.
    ///
    /// The automaton keeps one track per (property count, witness bits met): after each
    /// declared property the tracks move on (an optional one may also be skipped), and the
    /// close is reached from the tracks with an allowed count and every condition met.
    fn schema_order(
        &mut self,
        open: StateId,
        plan: &ObjectPlan,
        item_bits: &[u8],
        extras: &[(u8, RuleId)],
        counts: Counts,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let nw = plan.witness_sets();
        let full_w = (nw - 1) as u8;
        let tracks_n = counts.cap + 1;
        // tracks[c * nw + w]: the state after writing c properties (saturating at `cap`
        // unless exact) with the witness conditions `w` met.
        let mut tracks: Vec<Option<StateId>> = vec![None; tracks_n * nw];
        tracks[0] = Some(open);
        for (item, &bits) in plan.items.iter().zip(item_bits) {
            self.undeclared_gap(&mut tracks, extras, counts, nw)?;
            tracks = self.declared_property(&tracks, plan, item, bits, counts, ptr)?;
        }
        self.undeclared_gap(&mut tracks, extras, counts, nw)?;
        let close = self.b.state()?;
        for c in counts.min..tracks_n {
            if let Some(st) = tracks[c * nw + full_w as usize] {
                self.b.eps(st, close);
            }
        }
        Ok(close)
    }

    /// Any number of undeclared properties (`extras`) at every track: the tracks after
    /// them.
    fn undeclared_gap(
        &mut self,
        tracks: &mut Vec<Option<StateId>>,
        extras: &[(u8, RuleId)],
        counts: Counts,
        nw: usize,
    ) -> Result<(), CompileError> {
        if extras.is_empty() {
            return Ok(());
        }
        let Counts { cap, exact, .. } = counts;
        let tracks_n = cap + 1;
        let idx = |c: usize, w: u8| c * nw + w as usize;
        let mut new: Vec<Option<StateId>> = vec![None; tracks_n * nw];
        for c in 0..tracks_n {
            for w in 0..nw as u8 {
                // Sources: one more undeclared property from c - 1 (any w2 | b == w), or
                // when saturated from (cap, w2 < w).
                let mut srcs: Vec<(StateId, RuleId, bool)> = Vec::new();
                for &(b, r) in extras {
                    for w2 in 0..nw as u8 {
                        if w2 | b != w {
                            continue;
                        }
                        if c > 0 {
                            if let Some(p) = new[idx(c - 1, w2)] {
                                srcs.push((p, r, c > 1));
                            }
                        }
                        if c == cap && !exact && w2 < w {
                            if let Some(p) = new[idx(cap, w2)] {
                                srcs.push((p, r, true));
                            }
                        }
                    }
                }
                if tracks[idx(c, w)].is_none() && srcs.is_empty() {
                    continue;
                }
                let lp = self.b.state()?;
                if let Some(t) = tracks[idx(c, w)] {
                    self.b.eps(t, lp);
                }
                for (p, r, comma) in srcs {
                    let st = if comma { self.punct(p, b',')? } else { p };
                    let e = self.b.call(st, r)?;
                    self.b.eps(e, lp);
                }
                // Saturated: more undeclared properties keep the count.
                if c == cap && !exact {
                    for &(b, r) in extras {
                        if w | b == w {
                            let cm = self.punct(lp, b',')?;
                            let e = self.b.call(cm, r)?;
                            self.b.eps(e, lp);
                        }
                    }
                }
                new[idx(c, w)] = Some(lp);
            }
        }
        *tracks = new;
        Ok(())
    }

    /// Declared property `item` (`"key": value`, skipped when optional) after every track;
    /// `bits` are the witness conditions writing its key meets. Returns the tracks after
    /// it.
    fn declared_property(
        &mut self,
        tracks: &[Option<StateId>],
        plan: &ObjectPlan,
        item: &Item,
        bits: u8,
        counts: Counts,
        ptr: &str,
    ) -> Result<Vec<Option<StateId>>, CompileError> {
        let (k, v, req) = item;
        let nw = plan.witness_sets();
        let tracks_n = counts.cap + 1;
        let idx = |c: usize, w: u8| c * nw + w as usize;
        let bump = |c: usize| bump_count(c, counts.cap, counts.exact);
        let vbits = plan.value_bits(k);
        let key = serde_json::to_string(k).map_err(|e| CompileError::Json(e.to_string()))?;
        let vptr = format!(
            "{ptr}/properties/{}",
            k.replace('~', "~0").replace('/', "~1")
        );
        let rule = if tracks_n > 2 {
            Some(self.schema_rule(v, &vptr)?)
        } else {
            None
        };
        let kv = |c: &mut Self, s: StateId, comma: bool| -> Result<StateId, CompileError> {
            let s = if comma { c.punct(s, b',')? } else { s };
            let s = c.b.lit(s, key.as_bytes())?;
            let s = c.punct(s, b':')?;
            match rule {
                Some(r) => c.b.call(s, r),
                None => c.value(s, v, &vptr),
            }
        };
        let mut new: Vec<Option<StateId>> = vec![None; tracks_n * nw];
        // Tracks whose next property lands in the same slot share one copy of the key
        // and value (a saturated count sends "first property" and "after a comma" to
        // the same slot; copying the value per track doubled every nesting level).
        let mut groups: Vec<(usize, Vec<(StateId, bool)>)> = Vec::new();
        for c in 0..tracks_n {
            for w in 0..nw as u8 {
                let Some(t) = tracks[idx(c, w)] else { continue };
                if !*req {
                    let a = slot_state(self.b, &mut new, idx(c, w))?;
                    self.b.eps(t, a);
                }
                if let Some(c2) = bump(c) {
                    let j = idx(c2, w | bits);
                    match groups.iter_mut().find(|g| g.0 == j) {
                        Some(g) => g.1.push((t, c > 0)),
                        None => groups.push((j, vec![(t, c > 0)])),
                    }
                    // The same key with its value in value conditions' schemas.
                    let mut sub = vbits;
                    while sub != 0 {
                        let mut schema = v.clone();
                        for (i, cnd) in plan.conds.iter().enumerate() {
                            if let (true, Some(vs)) = (sub >> i & 1 == 1, &cnd.3) {
                                schema = self.merge_schemas(&schema, vs, &vptr, 0)?;
                            }
                        }
                        let s = if c > 0 { self.punct(t, b',')? } else { t };
                        let s = self.b.lit(s, key.as_bytes())?;
                        let s = self.punct(s, b':')?;
                        let e = self.value(s, &schema, &vptr)?;
                        let j = idx(c2, w | bits | sub);
                        let a = slot_state(self.b, &mut new, j)?;
                        self.b.eps(e, a);
                        sub = (sub - 1) & vbits;
                    }
                }
            }
        }
        for (j, srcs) in groups {
            let e = match srcs.as_slice() {
                [(t, comma)] => kv(self, *t, *comma)?,
                _ => {
                    let p = self.b.state()?;
                    for (t, comma) in srcs {
                        let s = if comma { self.punct(t, b',')? } else { t };
                        self.b.eps(s, p);
                    }
                    kv(self, p, false)?
                }
            };
            let a = slot_state(self.b, &mut new, j)?;
            self.b.eps(e, a);
        }
        Ok(new)
    }
}

/// The property count after one more property: `c + 1` up to `cap`, then `cap` again when
/// counts past `cap` are all alike, or `None` when `exact` counting cannot go past `cap`.
pub(super) fn bump_count(c: usize, cap: usize, exact: bool) -> Option<usize> {
    if c < cap {
        Some(c + 1)
    } else if exact {
        None
    } else {
        Some(cap)
    }
}

/// The state in `slots[j]`, created on first use.
fn slot_state(
    b: &mut crate::nfa::Builder,
    slots: &mut [Option<StateId>],
    j: usize,
) -> Result<StateId, CompileError> {
    if let Some(a) = slots[j] {
        return Ok(a);
    }
    let a = b.state()?;
    slots[j] = Some(a);
    Ok(a)
}
