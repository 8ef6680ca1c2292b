//! Objects whose declared properties may come in any order: one automaton state per (set of
//! declared keys written so far, property count), within a state budget; past it, a loop over
//! the declared keys whose repeats the matcher refuses (`crate::unique`).

use crate::lazy::FastMap as HashMap;

use serde_json::Value;

use super::object::bump_count;
use super::JsonCompiler;
use crate::nfa::{RuleId, StateId};
use crate::CompileError;

/// Most declared properties an object may have for the any-order automaton.
const MAX_ANY_ORDER_KEYS: usize = 16;
/// Most (written set, count) states of one any-order object.
const MAX_ANY_ORDER_STATES: usize = 16384;
/// Most NFA states (estimated) one any-order object may add.
const MAX_ANY_ORDER_COST: usize = 150_000;
/// Most NFA states (estimated) all any-order objects of one schema may add.
const MAX_ANY_ORDER_TOTAL: usize = 300_000;
/// Most NFA states (estimated) all key-loop objects of one schema may add: a budget of its
/// own, as a key loop costs a few states per key where the any-order automaton may cost
/// thousands, so a schema whose first large objects spend the any-order budget still has its
/// later objects in any order rather than schema order.
const MAX_KEY_LOOP_TOTAL: usize = 150_000;
/// Most required keys a key-loop object takes in any order (its states are sets of them);
/// the ones past them come in their declaration order among themselves.
const MAX_LOOP_REQUIRED: usize = 12;
/// Most required keys of a key-loop object (a bit each in its states).
const MAX_LOOP_REQUIRED_ALL: usize = 31;

impl JsonCompiler<'_> {
    /// Declared properties in any order: one state per (set of declared keys written so
    /// far, property count), a key trie from each to the keys not yet written, each value a
    /// call to its schema's rule, undeclared properties (`extra`) in every gap. Exact JSON
    /// Schema semantics (no key twice, every required key before `}`), so an instance that
    /// orders its keys differently from the schema is accepted. `None` (nothing built) when
    /// the object is too large for the state budget: the caller then falls back to schema
    /// order. `counts` = (cap, exact, min, all witness bits) as in [`Counts`].
    pub(super) fn any_order(
        &mut self,
        open: StateId,
        items: &[(String, Value, bool)],
        item_bits: &[u8],
        extras: &[(u8, RuleId)],
        counts: (usize, bool, usize, u8),
        ptr: &str,
    ) -> Result<Option<StateId>, CompileError> {
        let (cap, exact, min_count, full_w) = counts;
        let n = items.len();
        if !self.opts.any_property_order || !(2..=MAX_ANY_ORDER_KEYS).contains(&n) {
            return Ok(None);
        }
        let bump = |c: usize| bump_count(c, cap, exact);
        let keys = quoted_keys(items)?;
        // Plan the reachable (written set, count) states and the NFA states they need.
        let mut index: HashMap<(u32, usize, u8), usize> = HashMap::default();
        let mut order: Vec<(u32, usize, u8)> = vec![(0, 0, 0)];
        index.insert((0, 0, 0), 0);
        let mut cost = 0usize;
        let mut i = 0;
        while i < order.len() {
            let (m, c, w) = order[i];
            i += 1;
            let Some(c2) = bump(c) else { continue };
            cost += 4;
            let mut next = Vec::new();
            for (k, key) in keys.iter().enumerate() {
                if m >> k & 1 == 0 {
                    cost += key.len() + 3;
                    next.push((m | 1 << k, w | item_bits[k]));
                }
            }
            for &(b, _) in extras {
                cost += 2;
                next.push((m, w | b));
            }
            for (m2, w2) in next {
                intern(&mut index, &mut order, (m2, c2, w2));
            }
            if order.len() > MAX_ANY_ORDER_STATES || cost > MAX_ANY_ORDER_COST {
                return Ok(None);
            }
        }
        if self.any_order_cost + cost > MAX_ANY_ORDER_TOTAL {
            return Ok(None);
        }
        self.any_order_cost += cost;
        let rules = self.value_rules(items, ptr)?;
        let req: u32 = items
            .iter()
            .enumerate()
            .filter(|(_, it)| it.2)
            .fold(0, |acc, (k, _)| acc | 1 << k);
        let (states, close) = self.planned_states(open, order.len())?;
        let mut trie: HashMap<(StateId, u8), StateId> = HashMap::default();
        for (idx, &(m, c, w)) in order.iter().enumerate() {
            if idx % 64 == 63 {
                self.b.check_deadline()?;
            }
            let s = states[idx];
            if m & req == req && c >= min_count && w == full_w {
                self.b.eps(s, close);
            }
            let Some(c2) = bump(c) else { continue };
            let s1 = if c > 0 { self.punct(s, b',')? } else { s };
            for &(b, r) in extras {
                let e = self.b.call(s1, r)?;
                self.b.eps(e, states[index[&(m, c2, w | b)]]);
            }
            // A trie of the keys not yet written, so the configuration stays one thread.
            trie.clear();
            for (k, key) in keys.iter().enumerate() {
                if m >> k & 1 == 1 {
                    continue;
                }
                let at = self.key_trie(&mut trie, s1, key)?;
                let col = self.punct(at, b':')?;
                let e = self.b.call(col, rules[k])?;
                self.b
                    .eps(e, states[index[&(m | 1 << k, c2, w | item_bits[k])]]);
            }
        }
        Ok(Some(close))
    }

    /// Declared properties in any order where [`JsonCompiler::any_order`] is over its budget
    /// (more than 16 keys, long names): one state per (set of *required* keys written,
    /// property count), from each a key trie over the required keys not yet written, and a
    /// call to one shared rule over the optional keys (per witness-bit set). The automaton
    /// alone would let an optional key come twice; its states are recorded as bounded
    /// key-loop ranges (`Builder::key_loops`), so the matcher refuses the closing
    /// quote of a key already written in the same object and every key prefix that only
    /// earlier keys complete (`crate::unique`: the declared keys are written in one spelling
    /// each, so equal texts are equal keys). A closed object counts its properties up to the
    /// number of declared keys, so no `,` is offered once every key is written. Up to
    /// [`MAX_LOOP_REQUIRED`] required keys (fewer where the states need it) come in any
    /// order; the ones declared after them come in their declaration order among
    /// themselves, anywhere among the others (stricter than any order, never looser, and
    /// still a set of keys written, so the planned close knows which are missing). `None`
    /// when the states are over the budget even then (schema order).
    pub(super) fn key_loop(
        &mut self,
        open: StateId,
        items: &[(String, Value, bool)],
        item_bits: &[u8],
        extras: &[(u8, RuleId)],
        counts: (usize, bool, usize, u8),
        ptr: &str,
    ) -> Result<Option<StateId>, CompileError> {
        let (cap, exact, min_count, full_w) = counts;
        let n = items.len();
        if !self.opts.any_property_order || n < 2 {
            return Ok(None);
        }
        let keys = quoted_keys(items)?;
        let required: Vec<usize> = (0..n).filter(|&k| items[k].2).collect();
        if required.len() > MAX_LOOP_REQUIRED_ALL {
            return Ok(None);
        }
        // Optional keys grouped by the witness bits they meet: one shared rule per group.
        let mut groups: Vec<(u8, Vec<usize>)> = Vec::new();
        let mut opt_cost = 0usize;
        for k in (0..n).filter(|&k| !items[k].2) {
            opt_cost += keys[k].len() + 3;
            match groups.iter_mut().find(|g| g.0 == item_bits[k]) {
                Some(g) => g.1.push(k),
                None => groups.push((item_bits[k], vec![k])),
            }
        }
        let full_r: u32 = (1u32 << required.len()) - 1;
        // The count `c` of a state: in an open object, of every property (`Counts`); in a
        // closed one, of the optional keys written, exactly, so that the whole count
        // (`|m| + c`) is exact and no `,` is offered once every key is written.
        let closed = extras.is_empty();
        let n_opt = n - required.len();
        let cap_closed = if exact { cap.min(n) } else { n };
        let total = |m: u32, c: usize| m.count_ones() as usize + c;
        let next_c = |m: u32, c: usize, optional: bool| -> Option<usize> {
            if !closed {
                bump_count(c, cap, exact)
            } else if total(m, c) >= cap_closed || (optional && c >= n_opt) {
                None
            } else {
                Some(c + optional as usize)
            }
        };
        let written = |m: u32, c: usize| if closed { total(m, c) } else { c };
        // Required key `j` may come next: one of the first `any` or the one after them in
        // any order, a later one once the required key declared before it is written.
        let may_write = |m: u32, j: usize, any: usize| j <= any || m >> (j - 1) & 1 == 1;
        // Plan the reachable (required written, count, witness bits) states, with as many
        // required keys in any order as the budget takes.
        type Planned = (
            HashMap<(u32, usize, u8), usize>,
            Vec<(u32, usize, u8)>,
            usize,
        );
        let plan = |any: usize| -> Option<Planned> {
            let mut cost = opt_cost;
            let mut index: HashMap<(u32, usize, u8), usize> = HashMap::default();
            let mut order: Vec<(u32, usize, u8)> = vec![(0, 0, 0)];
            index.insert((0, 0, 0), 0);
            let mut i = 0;
            while i < order.len() {
                let (m, c, w) = order[i];
                i += 1;
                cost += 4;
                let mut next = Vec::new();
                if let Some(c2) = next_c(m, c, false) {
                    for (j, &k) in required.iter().enumerate() {
                        if m >> j & 1 == 0 && may_write(m, j, any) {
                            cost += keys[k].len() + 3;
                            next.push((m | 1 << j, c2, w | item_bits[k]));
                        }
                    }
                }
                if let Some(c2) = next_c(m, c, true) {
                    for b in groups.iter().map(|g| g.0).chain(extras.iter().map(|e| e.0)) {
                        cost += 2;
                        next.push((m, c2, w | b));
                    }
                }
                for key in next {
                    intern(&mut index, &mut order, key);
                }
                if order.len() > MAX_ANY_ORDER_STATES
                    || cost > MAX_ANY_ORDER_COST
                    || self.key_loop_cost + cost > MAX_KEY_LOOP_TOTAL
                {
                    return None;
                }
            }
            Some((index, order, cost))
        };
        // Start where a lower bound of the plan fits: each of the 2^any sets of the first
        // `any` required keys is a state of its own, with a trie over the keys it lacks
        // (each key lacking from half the sets). Then one key fewer per try: each halves
        // the sets (a plan over the budget stops as soon as it is).
        let budget = MAX_ANY_ORDER_COST.min(MAX_KEY_LOOP_TOTAL.saturating_sub(self.key_loop_cost));
        let bound = |any: usize| -> usize {
            let lacking: usize = required[..any].iter().map(|&k| keys[k].len() + 3).sum();
            (1usize << any) * 4 + (1usize << any.saturating_sub(1)) * lacking
        };
        // `any`: the first `any` required keys and the chain's head (the next one) come in
        // any order, so at most `MAX_LOOP_REQUIRED` in all, and `any` one less than every
        // required key is the same automaton as every one.
        let r = required.len();
        let mut any = if r <= MAX_LOOP_REQUIRED {
            r
        } else {
            MAX_LOOP_REQUIRED - 1
        };
        // Every required key in any order is tried first whatever the bound says (some
        // sets may be unreachable under a property count).
        let mut found = None;
        if any == r {
            found = plan(any);
            if found.is_none() {
                if r < 2 {
                    return Ok(None);
                }
                any = r - 2;
            }
        }
        if found.is_none() {
            while any > 0 && ((1usize << any) > MAX_ANY_ORDER_STATES || bound(any) > budget) {
                any -= 1;
            }
        }
        let (index, order, cost) = loop {
            if let Some(p) = found.take().or_else(|| plan(any)) {
                break p;
            }
            if any == 0 {
                return Ok(None);
            }
            any -= 1;
        };
        self.key_loop_cost += cost;
        let rules = self.value_rules(items, ptr)?;
        let mut trie: HashMap<(StateId, u8), StateId> = HashMap::default();
        // The optional keys' rules: `"key": value`, every state but the start recorded.
        let mut group_rules = Vec::with_capacity(groups.len());
        for (bits, ks) in &groups {
            // Like the "other key" rules: its masks are shared between the gaps it is
            // called from (`crate::lazy::threads`).
            let rule = self.b.new_rule()?;
            self.b.key_rules.push(rule);
            let (start, end) = (
                self.b.rules[rule as usize].start,
                self.b.rules[rule as usize].end,
            );
            let lo = self.b.states.len() as StateId;
            trie.clear();
            let mut ends = Vec::with_capacity(ks.len());
            for &k in ks {
                let at = self.key_trie(&mut trie, start, &keys[k])?;
                ends.push(at);
                let col = self.punct(at, b':')?;
                let e = self.b.call(col, rules[k])?;
                self.b.eps(e, end);
            }
            let hi = self.b.states.len() as StateId;
            self.b.key_loops.push((lo, hi));
            self.b.key_tries.push((start, ends));
            group_rules.push((*bits, rule));
        }
        let lo = self.b.states.len() as StateId;
        let (states, close) = self.planned_states(open, order.len())?;
        for (idx, &(m, c, w)) in order.iter().enumerate() {
            if idx % 64 == 63 {
                self.b.check_deadline()?;
            }
            let s = states[idx];
            if m == full_r && written(m, c) >= min_count && w == full_w {
                self.b.eps(s, close);
            }
            let (req_c, opt_c) = (next_c(m, c, false), next_c(m, c, true));
            let more_required = m != full_r && req_c.is_some();
            let more_optional = !(groups.is_empty() && extras.is_empty()) && opt_c.is_some();
            if !more_required && !more_optional {
                continue;
            }
            let s1 = if written(m, c) > 0 {
                self.punct(s, b',')?
            } else {
                s
            };
            if let Some(c2) = opt_c {
                for &(b, r) in extras.iter().chain(&group_rules) {
                    let e = self.b.call(s1, r)?;
                    self.b.eps(e, states[index[&(m, c2, w | b)]]);
                }
            }
            let Some(c2) = req_c else { continue };
            trie.clear();
            for (j, &k) in required.iter().enumerate() {
                if m >> j & 1 == 1 || !may_write(m, j, any) {
                    continue;
                }
                let at = self.key_trie(&mut trie, s1, &keys[k])?;
                let col = self.punct(at, b':')?;
                let e = self.b.call(col, rules[k])?;
                self.b
                    .eps(e, states[index[&(m | 1 << j, c2, w | item_bits[k])]]);
            }
        }
        let hi = self.b.states.len() as StateId;
        self.b.key_loops.push((lo, hi));
        Ok(Some(close))
    }

    /// One state per planned state (`open` leads to the first) and the state after `}`.
    fn planned_states(
        &mut self,
        open: StateId,
        n: usize,
    ) -> Result<(Vec<StateId>, StateId), CompileError> {
        let states = (0..n)
            .map(|_| self.b.state())
            .collect::<Result<Vec<_>, _>>()?;
        self.b.eps(open, states[0]);
        Ok((states, self.b.state()?))
    }

    /// One rule per declared property's value schema.
    fn value_rules(
        &mut self,
        items: &[(String, Value, bool)],
        ptr: &str,
    ) -> Result<Vec<RuleId>, CompileError> {
        items
            .iter()
            .map(|(k, v, _)| {
                let vptr = format!(
                    "{ptr}/properties/{}",
                    k.replace('~', "~0").replace('/', "~1")
                );
                self.schema_rule(v, &vptr)
            })
            .collect()
    }

    /// The state after `key` (quoted) from `from`, sharing the states of earlier keys with
    /// the same start in `trie` (so the configuration stays one thread).
    fn key_trie(
        &mut self,
        trie: &mut HashMap<(StateId, u8), StateId>,
        from: StateId,
        key: &str,
    ) -> Result<StateId, CompileError> {
        let mut at = from;
        for &byte in key.as_bytes() {
            at = match trie.get(&(at, byte)) {
                Some(&x) => x,
                None => {
                    let x = self.b.state()?;
                    self.b.range(at, byte, byte, x);
                    trie.insert((at, byte), x);
                    x
                }
            };
        }
        Ok(at)
    }
}

/// The declared keys as written in JSON, quotes included.
fn quoted_keys(items: &[(String, Value, bool)]) -> Result<Vec<String>, CompileError> {
    items
        .iter()
        .map(|i| serde_json::to_string(&i.0))
        .collect::<Result<Vec<String>, _>>()
        .map_err(|e| CompileError::Json(e.to_string()))
}

/// Adds `key` to the planned states (`order`, indexed by `index`) unless it is there.
fn intern<K: Copy + Eq + std::hash::Hash>(
    index: &mut HashMap<K, usize>,
    order: &mut Vec<K>,
    key: K,
) {
    if let std::collections::hash_map::Entry::Vacant(v) = index.entry(key) {
        v.insert(order.len());
        order.push(key);
    }
}
