//! Objects whose declared properties may come in any order: one automaton state per (set of
//! declared keys written so far, property count), within a state budget.

use std::collections::HashMap;

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
        let keys = items
            .iter()
            .map(|i| serde_json::to_string(&i.0))
            .collect::<Result<Vec<String>, _>>()
            .map_err(|e| CompileError::Json(e.to_string()))?;
        // Plan the reachable (written set, count) states and the NFA states they need.
        let mut index: HashMap<(u32, usize, u8), usize> = HashMap::new();
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
                if let std::collections::hash_map::Entry::Vacant(v) = index.entry((m2, c2, w2)) {
                    v.insert(order.len());
                    order.push((m2, c2, w2));
                }
            }
            if order.len() > MAX_ANY_ORDER_STATES || cost > MAX_ANY_ORDER_COST {
                return Ok(None);
            }
        }
        if self.any_order_cost + cost > MAX_ANY_ORDER_TOTAL {
            return Ok(None);
        }
        self.any_order_cost += cost;
        let mut rules = Vec::with_capacity(n);
        for (k, v, _) in items {
            let vptr = format!(
                "{ptr}/properties/{}",
                k.replace('~', "~0").replace('/', "~1")
            );
            rules.push(self.schema_rule(v, &vptr)?);
        }
        let req: u32 = items
            .iter()
            .enumerate()
            .filter(|(_, it)| it.2)
            .fold(0, |acc, (k, _)| acc | 1 << k);
        let mut states = Vec::with_capacity(order.len());
        for _ in &order {
            states.push(self.b.state()?);
        }
        self.b.eps(open, states[0]);
        let close = self.b.state()?;
        let mut trie: HashMap<(StateId, u8), StateId> = HashMap::new();
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
                let mut at = s1;
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
                let col = self.punct(at, b':')?;
                let e = self.b.call(col, rules[k])?;
                self.b
                    .eps(e, states[index[&(m | 1 << k, c2, w | item_bits[k])]]);
            }
        }
        Ok(Some(close))
    }
}
