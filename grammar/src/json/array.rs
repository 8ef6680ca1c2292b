//! Arrays: items and tuples, `minItems`/`maxItems`, `contains` (layers of array states per
//! set of `contains` schemas matched, or per count of matching items), and `uniqueItems`
//! over small finite item sets (strings: `unique.rs`).

use serde_json::{Map, Value};

use super::types::{f, MAX_COUNT};
use super::JsonCompiler;
use crate::nfa::StateId;
use crate::CompileError;

/// Most different `contains` schemas on one array (layers: 2^n).
const MAX_CONTAINS: usize = 3;
/// Largest `minContains` / `maxContains` counted (one layer of array states per count).
const MAX_CONTAINS_COUNT: u64 = 16;

impl JsonCompiler<'_> {
    pub(super) fn array(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        ptr: &str,
    ) -> Result<StateId, CompileError> {
        let min = f(s.get("minItems")).unwrap_or(0.0).max(0.0) as u64;
        let max = f(s.get("maxItems")).map(|m| m.max(0.0) as u64);
        if max.is_some_and(|m| m < min) {
            return self.nothing();
        }
        if s.get("uniqueItems") == Some(&Value::Bool(true)) && max.is_none_or(|m| m > 1) {
            if !s.contains_key("contains") && !s.contains_key("__contains") {
                if let Some(e) = self.unique_finite(from, s, min, max, ptr)? {
                    return Ok(e);
                }
                if let Some(e) = self.unique_strings(from, s, min, max, ptr)? {
                    return Ok(e);
                }
                if let Some(e) = self.unique_searched(from, s, min, max, ptr)? {
                    return Ok(e);
                }
            }
            self.unsupported("uniqueItems", ptr, "uniqueness of items is not enforced")?;
        }
        // Tuple part and the schema for the rest.
        let (tuple, rest): (Vec<Value>, Value) = if let Some(Value::Array(p)) = s.get("prefixItems")
        {
            (
                p.clone(),
                s.get("items").cloned().unwrap_or(Value::Bool(true)),
            )
        } else if let Some(Value::Array(p)) = s.get("items") {
            (
                p.clone(),
                s.get("additionalItems")
                    .cloned()
                    .unwrap_or(Value::Bool(true)),
            )
        } else {
            (
                Vec::new(),
                s.get("items").cloned().unwrap_or(Value::Bool(true)),
            )
        };
        if min > MAX_COUNT || max.is_some_and(|m| m > MAX_COUNT) {
            self.unsupported(
                "maxItems",
                ptr,
                &format!("item counts above {MAX_COUNT} are not enforced"),
            )?;
        }
        let rest_ok = rest != Value::Bool(false);
        // `contains: X` (and more, merged from `allOf`): one layer of states per set of
        // `contains` schemas some item matched so far, moving up after an item that also
        // matches new ones; only the top layer may close the array (for one schema the
        // items are `I* (I and X) I*`; exact).
        let mut contains: Vec<Value> = s.get("contains").cloned().into_iter().collect();
        contains.extend(
            s.get("__contains")
                .and_then(|c| c.as_array())
                .into_iter()
                .flatten()
                .cloned(),
        );
        // `minContains` / `maxContains` on one `contains`: layers count the matching items
        // instead (`counted`); several `contains` with counts are refused.
        let counted = if s.contains_key("minContains") || s.contains_key("maxContains") {
            let lo = f(s.get("minContains")).unwrap_or(1.0).max(0.0) as u64;
            let hi = f(s.get("maxContains")).map(|m| m.max(0.0) as u64);
            if contains.len() != 1 {
                if !contains.is_empty() {
                    self.unsupported(
                        "minContains",
                        ptr,
                        "counted `contains` over several merged `contains` is not enforced",
                    )?;
                }
                None
            } else if hi.is_some_and(|h| h < lo) {
                return self.nothing();
            } else if lo == 0 && hi.is_none() {
                // At least none: `contains` asks for nothing.
                contains.clear();
                None
            } else if lo.max(hi.unwrap_or(0)) > MAX_CONTAINS_COUNT {
                self.unsupported(
                    "minContains",
                    ptr,
                    &format!("`contains` counts above {MAX_CONTAINS_COUNT} are not enforced"),
                )?;
                None
            } else {
                Some((lo, hi))
            }
        } else {
            None
        };
        if contains.len() > MAX_CONTAINS {
            self.unsupported(
                "contains",
                ptr,
                &format!("more than {MAX_CONTAINS} different `contains` on one array"),
            )?;
            contains.truncate(MAX_CONTAINS);
        }
        let cptr = format!("{ptr}/contains");
        // Layers: for `contains` schemas, the set of them matched so far (2^n, only the full
        // set closes the array); counted, the number of matching items so far, capped at
        // `minContains` without a maximum (then any item may stay, so a matching one need
        // not be counted: the count is a witness) and at `maxContains` with one (then an
        // item stays only if it does not match, and one that matches at the cap is refused).
        let (layers, closes): (usize, Vec<bool>) = match counted {
            Some((lo, hi)) => {
                let k = hi.unwrap_or(lo) as usize;
                (k + 1, (0..=k).map(|w| w as u64 >= lo).collect())
            }
            None => {
                let n = 1usize << contains.len();
                (n, (0..n).map(|w| w == n - 1).collect())
            }
        };
        let not_x = match counted {
            Some((_, Some(_))) => match self.negate(&contains[0], &cptr, 0)? {
                Some(n) => Some(n),
                None => {
                    let k = self.unnegatable.take().unwrap_or_default();
                    self.unsupported(
                        "maxContains",
                        ptr,
                        &format!("the `contains` schema has no complement (`{k}`)"),
                    )?;
                    None
                }
            },
            _ => None,
        };
        // Where an item from layer `w` leads: (next layer, the item's schema there).
        let transitions =
            |c: &mut Self, item: &Value| -> Result<Vec<Vec<(usize, Value)>>, CompileError> {
                let mut out = vec![Vec::new(); layers];
                if counted.is_some() {
                    let stay = match &not_x {
                        Some(n) => c.merge_schemas(item, n, &cptr, 0)?,
                        None => item.clone(),
                    };
                    let up = c.merge_schemas(item, &contains[0], &cptr, 0)?;
                    for (w, t) in out.iter_mut().enumerate() {
                        if stay != Value::Bool(false) {
                            t.push((w, stay.clone()));
                        }
                        // At the cap: without a maximum `stay` (any item) covers a match;
                        // with one, a match is refused.
                        if w + 1 < layers && up != Value::Bool(false) {
                            t.push((w + 1, up.clone()));
                        }
                    }
                    return Ok(out);
                }
                // The item schema merged with each nonempty set of `contains` schemas (the
                // ones that can match at all); only sets that add new schemas move up.
                let mut wit = Vec::new();
                for set in 1..layers {
                    let mut m = item.clone();
                    for (i, x) in contains.iter().enumerate() {
                        if set >> i & 1 == 1 {
                            m = c.merge_schemas(&m, x, &cptr, 0)?;
                        }
                    }
                    if m != Value::Bool(false) {
                        wit.push((set, m));
                    }
                }
                for (w, t) in out.iter_mut().enumerate() {
                    t.push((w, item.clone()));
                    for (set, wv) in &wit {
                        if set & w == 0 {
                            t.push((w | set, wv.clone()));
                        }
                    }
                }
                Ok(out)
            };
        // Whether layer `w` can lead to layer `v`.
        let reaches = |w: usize, v: usize| match counted {
            Some(_) => w <= v,
            None => w & !v == 0,
        };
        let open = self.b.lit(from, b"[")?;
        let open = self.ws(open)?;
        let close = self.b.state()?;
        // The states of the layers that may close the array lead to `]`.
        let close_from = |c: &mut Self, states: &[Option<StateId>]| {
            for (w, st) in states.iter().enumerate() {
                if let (true, Some(st)) = (closes[w], *st) {
                    c.b.eps(st, close);
                }
            }
        };
        // cur[w]: the state after the items so far, in layer w.
        let mut cur: Vec<Option<StateId>> = vec![None; layers];
        cur[0] = Some(open);
        if min == 0 && closes[0] {
            self.b.eps(open, close);
        }
        // One item after `cur` (a comma first unless it is the first item).
        let step = |c: &mut Self,
                    cur: &[Option<StateId>],
                    first: bool,
                    trans: &[Vec<(usize, Value)>],
                    iptr: &str,
                    call: bool|
         -> Result<Vec<Option<StateId>>, CompileError> {
            let mut next: Vec<Option<StateId>> = vec![None; cur.len()];
            let emit = |c: &mut Self, s: StateId, v: &Value| -> Result<StateId, CompileError> {
                if call {
                    c.schema_call(s, v, iptr)
                } else {
                    c.value(s, v, iptr)
                }
            };
            for w in 0..cur.len() {
                let Some(st) = cur[w] else { continue };
                let st = if first { st } else { c.punct(st, b',')? };
                for (to, v) in &trans[w] {
                    let e = emit(c, st, v)?;
                    let j = match next[*to] {
                        Some(j) => j,
                        None => *next[*to].insert(c.b.state()?),
                    };
                    c.b.eps(e, j);
                }
            }
            Ok(next)
        };
        let mut n = 0u64;
        for (i, t) in tuple.iter().enumerate() {
            if max.is_some_and(|m| n >= m) {
                break;
            }
            let trans = transitions(self, t)?;
            let tptr = format!("{ptr}/prefixItems/{i}");
            cur = step(self, &cur, i == 0, &trans, &tptr, false)?;
            n += 1;
            if n >= min {
                close_from(self, &cur);
            }
        }
        let rptr = format!("{ptr}/items");
        if rest_ok && max.is_none_or(|m| n < m) {
            let trans = transitions(self, &rest)?;
            // Required rest items, then optional ones (bounded) or a loop.
            let req = min.saturating_sub(n).min(MAX_COUNT);
            let opt = max.map(|m| m.min(MAX_COUNT).saturating_sub(n).saturating_sub(req));
            let copies = req + opt.unwrap_or(0);
            let use_call = copies > 2;
            for _ in 0..req {
                cur = step(self, &cur, n == 0, &trans, &rptr, use_call)?;
                n += 1;
            }
            if n >= min {
                close_from(self, &cur);
            }
            match opt {
                Some(k) => {
                    for _ in 0..k {
                        cur = step(self, &cur, n == 0, &trans, &rptr, use_call)?;
                        n += 1;
                        close_from(self, &cur);
                    }
                }
                None if n == 0 => {
                    // One copy of the item: start[w] -item-> end[w] -','-> start[w], with
                    // `[` entering layer 0 and the ends of closing layers leaving by `]`.
                    let mut starts: Vec<Option<StateId>> = vec![None; layers];
                    for st in starts.iter_mut() {
                        *st = Some(self.b.state()?);
                    }
                    if let (Some(o), Some(s0)) = (cur[0], starts[0]) {
                        self.b.eps(o, s0);
                    }
                    let e = step(self, &starts, true, &trans, &rptr, use_call)?;
                    for w in 0..layers {
                        if let (Some(e), Some(st)) = (e[w], starts[w]) {
                            let end = self.b.state()?;
                            self.b.eps(e, end);
                            let comma = self.punct(end, b',')?;
                            self.b.eps(comma, st);
                            if closes[w] {
                                self.b.eps(end, close);
                            }
                        }
                    }
                }
                None => {
                    // A loop per layer; an item matching more `contains` schemas (or one
                    // more, counted) moves up.
                    let mut lps: Vec<Option<StateId>> = vec![None; layers];
                    for w in 0..layers {
                        let reachable = cur[w].is_some()
                            || (w > 0 && (0..w).any(|v| cur[v].is_some() && reaches(v, w)));
                        if reachable {
                            let lp = self.b.state()?;
                            if let Some(st) = cur[w] {
                                self.b.eps(st, lp);
                            }
                            lps[w] = Some(lp);
                        }
                    }
                    let e = step(self, &lps, false, &trans, &rptr, use_call)?;
                    for w in 0..layers {
                        if let (Some(e), Some(lp)) = (e[w], lps[w]) {
                            self.b.eps(e, lp);
                        }
                    }
                    close_from(self, &lps);
                }
            }
        }
        let c = self.ws(close)?;
        self.b.lit(c, b"]")
    }

    /// `uniqueItems` over a small finite item set (`enum`/`const`/boolean/null items, ≤ 8
    /// values): one state per set of values used so far. `None` when not applicable.
    fn unique_finite(
        &mut self,
        from: StateId,
        s: &Map<String, Value>,
        min: u64,
        max: Option<u64>,
        ptr: &str,
    ) -> Result<Option<StateId>, CompileError> {
        let Some(item) = self.uniform_items(s, ptr)? else {
            return Ok(None);
        };
        let candidates: Vec<Value> = if let Some(Value::Array(e)) = item.get("enum") {
            e.clone()
        } else if let Some(c) = item.get("const") {
            vec![c.clone()]
        } else {
            match item.get("type").and_then(|t| t.as_str()) {
                Some("boolean") => vec![Value::Bool(true), Value::Bool(false)],
                Some("null") => vec![Value::Null],
                _ => return Ok(None),
            }
        };
        // The distinct candidates the item admits, up to 9 (more: not tracked here); the
        // lists beside them are checked through sets, linear however long.
        let vc = super::normalized::ValueCheck::of(&item);
        let mut seen = super::ValueSet::default();
        let mut vals: Vec<Value> = Vec::new();
        for v in candidates {
            match vc.check(&v) {
                Some(true) if seen.insert(&v) => vals.push(v),
                Some(_) => {}
                None => return Ok(None),
            }
            if vals.len() > 8 {
                return Ok(None);
            }
        }
        let n = vals.len();
        let max = max.unwrap_or(n as u64).min(n as u64);
        let open = self.b.lit(from, b"[")?;
        let open = self.ws(open)?;
        let close = self.b.state()?;
        let mut ids: Vec<Option<StateId>> = vec![None; 1 << n];
        ids[0] = Some(open);
        for mask in 0usize..(1 << n) {
            let Some(me) = ids[mask] else { continue };
            let used = mask.count_ones() as u64;
            if used >= min {
                self.b.eps(me, close);
            }
            if used >= max {
                continue;
            }
            for (i, v) in vals.iter().enumerate() {
                if mask >> i & 1 == 1 {
                    continue;
                }
                let st = if mask == 0 { me } else { self.punct(me, b',')? };
                let e = self.literal(st, v)?;
                let next = mask | 1 << i;
                let t = match ids[next] {
                    Some(t) => t,
                    None => {
                        let t = self.b.state()?;
                        ids[next] = Some(t);
                        t
                    }
                };
                self.b.eps(e, t);
            }
        }
        let c = self.ws(close)?;
        Ok(Some(self.b.lit(c, b"]")?))
    }
}
