//! The passes over a finished NFA, both walking its moves backwards: trimming what cannot
//! complete ([`Nfa::trim`]) and the fewest bytes from each state to an end
//! ([`Nfa::compute_distances`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::{Nfa, RuleId, State, StateId};
use crate::CompileError;

impl Nfa {
    /// Removes moves into states that cannot complete, and calls to empty rules.
    pub(super) fn trim(&mut self, deadline: Option<Instant>) -> Result<(), CompileError> {
        let n = self.states.len();
        let nr = self.rules.len();
        if nr == 0 {
            return Err(CompileError::Empty);
        }
        let Backward {
            moves: rev,
            rets: rev_call,
            callers: callers_by_rule,
        } = Backward::of(&self.states, nr);
        // live[s]: s can reach its rule's end. A call edge counts once its rule is productive
        // (its start is live).
        let mut live = vec![false; n];
        let mut productive = vec![false; nr];
        let mut stack: Vec<StateId> = Vec::new();
        for r in &self.rules {
            live[r.end as usize] = true;
            stack.push(r.end);
        }
        let mut popped = 0usize;
        loop {
            while let Some(t) = stack.pop() {
                popped += 1;
                if popped.is_multiple_of(65_536) && deadline.is_some_and(|dl| Instant::now() > dl) {
                    return Err(CompileError::Timeout);
                }
                for &(s, _) in rev.of(t as usize) {
                    if !live[s as usize] {
                        live[s as usize] = true;
                        stack.push(s);
                    }
                }
                for &(s, r) in rev_call.of(t as usize) {
                    if productive[r as usize] && !live[s as usize] {
                        live[s as usize] = true;
                        stack.push(s);
                    }
                }
            }
            let mut changed = false;
            for (ri, r) in self.rules.iter().enumerate() {
                if !productive[ri] && live[r.start as usize] {
                    productive[ri] = true;
                    changed = true;
                    for &(caller, ret) in callers_by_rule.of(ri) {
                        if live[ret as usize] && !live[caller as usize] {
                            live[caller as usize] = true;
                            stack.push(caller);
                        }
                    }
                }
            }
            if !changed && stack.is_empty() {
                break;
            }
        }
        if !productive[0] {
            return Err(CompileError::Empty);
        }
        for st in &mut self.states {
            st.bytes.retain(|&(_, _, t)| live[t as usize]);
            st.eps.retain(|&t| live[t as usize]);
            st.calls
                .retain(|&(r, ret)| productive[r as usize] && live[ret as usize]);
        }
        Ok(())
    }

    /// Fewest bytes from each state to its rule's end.
    ///
    /// Dijkstra over the reversed moves, generalised to call moves (Knuth 1977): a call
    /// `s -(r)-> ret` costs `rule_min[r] + dist[ret]`, a function that never decreases and is
    /// at least each argument, so settling states in order of distance stays exact. Each state
    /// and move is handled once (`O(E log V)`); the previous round-robin fixpoint took
    /// quadratic time on long chains of large schemas.
    pub(super) fn compute_distances(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<(), CompileError> {
        let n = self.states.len();
        let nr = self.rules.len();
        // Built again after trimming (the moves changed); start state -> rules.
        let Backward {
            moves: rev,
            rets: rev_ret,
            callers,
        } = Backward::of(&self.states, nr);
        let rules = &self.rules;
        let starts: Csr<RuleId> = Csr::build(n, |add| {
            for (ri, r) in rules.iter().enumerate() {
                add(r.start as usize, ri as RuleId);
            }
        });
        let mut dist = vec![u32::MAX; n];
        let mut rule_min = vec![u32::MAX; nr];
        let mut done = vec![false; n];
        let mut heap: BinaryHeap<Reverse<(u32, StateId)>> = BinaryHeap::new();
        for r in &self.rules {
            dist[r.end as usize] = 0;
            heap.push(Reverse((0, r.end)));
        }
        let relax = |heap: &mut BinaryHeap<Reverse<(u32, StateId)>>,
                     dist: &mut [u32],
                     s: StateId,
                     d: u32| {
            if d < dist[s as usize] {
                dist[s as usize] = d;
                heap.push(Reverse((d, s)));
            }
        };
        let mut settled = 0usize;
        while let Some(Reverse((d, t))) = heap.pop() {
            if done[t as usize] || d > dist[t as usize] {
                continue;
            }
            done[t as usize] = true;
            settled += 1;
            if settled.is_multiple_of(65_536) && deadline.is_some_and(|dl| Instant::now() > dl) {
                return Err(CompileError::Timeout);
            }
            for &(s, w) in rev.of(t as usize) {
                relax(&mut heap, &mut dist, s, d.saturating_add(w));
            }
            // t is the return state of calls whose rule is already settled.
            for &(s, r) in rev_ret.of(t as usize) {
                if rule_min[r as usize] != u32::MAX {
                    relax(
                        &mut heap,
                        &mut dist,
                        s,
                        rule_min[r as usize].saturating_add(d),
                    );
                }
            }
            // t is a rule's start: the rule's minimum is now final.
            for &r in starts.of(t as usize) {
                rule_min[r as usize] = d;
                for &(s, ret) in callers.of(r as usize) {
                    if done[ret as usize] {
                        let cand = d.saturating_add(dist[ret as usize]);
                        relax(&mut heap, &mut dist, s, cand);
                    }
                }
            }
        }
        self.dist = dist;
        self.rule_min = rule_min;
        Ok(())
    }
}

/// An NFA's moves walked backwards: target -> (source, weight) for byte (1) and epsilon (0)
/// moves; return state -> (caller, rule); rule -> (caller, return state).
struct Backward {
    moves: Csr<(StateId, u32)>,
    rets: Csr<(StateId, RuleId)>,
    callers: Csr<(StateId, StateId)>,
}

impl Backward {
    fn of(states: &[State], rules: usize) -> Self {
        let moves = Csr::build(states.len(), |add| {
            for (s, st) in states.iter().enumerate() {
                for &(_, _, t) in &st.bytes {
                    add(t as usize, (s as StateId, 1));
                }
                for &t in &st.eps {
                    add(t as usize, (s as StateId, 0));
                }
            }
        });
        let rets = Csr::build(states.len(), |add| {
            for (s, st) in states.iter().enumerate() {
                for &(r, ret) in &st.calls {
                    add(ret as usize, (s as StateId, r));
                }
            }
        });
        let callers = Csr::build(rules, |add| {
            for (s, st) in states.iter().enumerate() {
                for &(r, ret) in &st.calls {
                    add(r as usize, (s as StateId, ret));
                }
            }
        });
        Backward {
            moves,
            rets,
            callers,
        }
    }
}

/// Adjacency lists of `n` nodes in one buffer (compressed sparse rows). The passes over a
/// finished NFA walk its moves backwards; a `Vec` per state made building those reverse
/// lists the larger part of their time (hundreds of thousands of small allocations).
struct Csr<T> {
    /// `items[start[v]..start[v + 1]]` is node `v`'s list.
    start: Vec<u32>,
    items: Vec<T>,
}

impl<T: Copy + Default> Csr<T> {
    /// The lists `edges` yields, each in the order it yields them: `edges` is called twice
    /// (once to count, once to fill) and must yield the same pairs both times.
    fn build(n: usize, edges: impl Fn(&mut dyn FnMut(usize, T))) -> Self {
        let mut start = vec![0u32; n + 1];
        edges(&mut |v, _| start[v + 1] += 1);
        for v in 0..n {
            start[v + 1] += start[v];
        }
        let mut next: Vec<u32> = start[..n].to_vec();
        let mut items = vec![T::default(); start[n] as usize];
        edges(&mut |v, x| {
            items[next[v] as usize] = x;
            next[v] += 1;
        });
        Csr { start, items }
    }

    /// Node `v`'s list.
    fn of(&self, v: usize) -> &[T] {
        &self.items[self.start[v] as usize..self.start[v + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_lists_keep_the_order_they_were_yielded_in() {
        let edges = [(2usize, 7u32), (0, 1), (2, 5), (3, 9), (2, 6)];
        let csr: Csr<u32> = Csr::build(5, |add| {
            for &(v, x) in &edges {
                add(v, x);
            }
        });
        assert_eq!(csr.of(0), &[1]);
        assert!(csr.of(1).is_empty());
        assert_eq!(csr.of(2), &[7, 5, 6]);
        assert_eq!(csr.of(3), &[9]);
        assert!(csr.of(4).is_empty());
    }
}
