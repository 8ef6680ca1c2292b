//! Mask representatives: configurations that agree with another on every text of up to
//! the representatives' horizon take its mask — positions of long counted chains (their
//! return states, [`Nfa::chain_representatives`]) and of regex × character-count products
//! ([`Nfa::count_representatives`]) — with the few tokens longer than the horizon stepped
//! through the real configuration ([`Lazy::fix_long_tokens`]).

use super::{ConfigId, FastSet, Lazy, DEAD, UNKNOWN};
use crate::nfa::{Nfa, StateId};
use crate::vocab::TokenVocab;

/// Horizon of the mask representatives, in bytes: configurations are shared when they agree
/// on every text of at most this many bytes, and the few longer tokens are checked one by
/// one against the real configuration (see [`Lazy::fix_long_tokens`]). Llama-3 has 231
/// usable tokens over 32 bytes (its longest has 128); with the full length as the horizon a
/// `maxLength: 100` string shared nothing.
const SHARE_HORIZON: usize = 32;

impl Lazy {
    /// Enables mask sharing between the positions of long counted chains, for a
    /// vocabulary whose longest token has `max_token_len` bytes.
    pub fn share_chain_masks(&mut self, nfa: &Nfa, max_token_len: usize) {
        let horizon = max_token_len.min(SHARE_HORIZON);
        self.horizon = horizon;
        self.chain_rep = nfa.chain_representatives(horizon).into_iter().collect();
        self.state_rep = nfa
            .count_representatives(horizon)
            .into_iter()
            .map(|(first, t)| (first, t.into_boxed_slice()))
            .collect();
        self.short_horizon =
            horizon < max_token_len && (!self.chain_rep.is_empty() || !self.state_rep.is_empty());
        if self.short_horizon {
            // States the short horizon shares but the full one would not.
            let full: FastSet<StateId> = shared_states(
                nfa.chain_representatives(max_token_len),
                &nfa.count_representatives(max_token_len),
            )
            .collect();
            let short: Vec<StateId> = shared_states(
                self.chain_rep.iter().map(|(&q, &r)| (q, r)),
                &self.state_rep,
            )
            .collect();
            self.short_only = short.into_iter().filter(|q| !full.contains(q)).collect();
        }
    }

    /// Whether a thread state or a stack frame of `c` is in `short_only`: then masks taken
    /// through representatives need [`Lazy::fix_long_tokens`].
    fn needs_fix(&mut self, c: ConfigId) -> bool {
        if !self.short_horizon || self.short_only.is_empty() {
            return false;
        }
        // By index: `stack_has_short` memoizes into `self` (no copy of the threads).
        (0..self.configs[c as usize].threads.len()).any(|i| {
            let (stk, q) = self.configs[c as usize].threads[i];
            self.short_only.contains(&q) || self.stack_has_short(stk)
        })
    }

    /// Whether a frame of `stk` returns to a state of `short_only` (cached).
    fn stack_has_short(&mut self, stk: u32) -> bool {
        if stk == 0 || stk as usize >= self.stacks.len() {
            return false;
        }
        if self.stack_short.len() < self.stacks.len() {
            self.stack_short.resize(self.stacks.len(), 2);
        }
        match self.stack_short[stk as usize] {
            2 => {}
            v => return v == 1,
        }
        let (parent, ret, _) = self.stacks[stk as usize];
        let v = self.short_only.contains(&ret) || self.stack_has_short(parent);
        self.stack_short[stk as usize] = v as u8;
        v
    }

    /// Corrects the bits of the tokens longer than the representatives' horizon in `out`
    /// (right for every shorter token) by stepping each through `c`; returns whether any
    /// bit changed. A no-op unless the representatives have a short horizon.
    pub(super) fn fix_long_tokens(
        &mut self,
        nfa: &Nfa,
        vocab: &TokenVocab,
        c: ConfigId,
        out: &mut [u32],
    ) -> bool {
        if !self.needs_fix(c) {
            return false;
        }
        let long = vocab.long_tokens(self.horizon);
        let before: Vec<u32> = long
            .ids
            .iter()
            .map(|&id| out[(id >> 5) as usize] & (1u32 << (id & 31)))
            .collect();
        for &id in &long.ids {
            out[(id >> 5) as usize] &= !(1u32 << (id & 31));
        }
        self.walk_trie(nfa, &long.trie, c, out, None);
        long.ids
            .iter()
            .zip(&before)
            .any(|(&id, &b)| out[(id >> 5) as usize] & (1u32 << (id & 31)) != b)
    }

    /// The representative of a thread's state: itself, or the state of the same regex
    /// state at the canonical count of a counted product (see [`Lazy::mask_rep`]).
    fn rep_state(&self, s: StateId) -> StateId {
        let i = self.state_rep.partition_point(|e| e.0 <= s);
        if i == 0 {
            return s;
        }
        let (first, table) = &self.state_rep[i - 1];
        table.get((s - first) as usize).copied().unwrap_or(s)
    }

    /// The stack `stk` with chain return states replaced by their representatives.
    fn rep_stack(&mut self, nfa: &Nfa, stk: u32) -> u32 {
        if stk == 0 || self.chain_rep.is_empty() {
            return stk;
        }
        if let Some(&r) = self.stack_rep.get(stk as usize) {
            if r != UNKNOWN {
                return r;
            }
        }
        let (parent, ret, _) = self.stacks[stk as usize];
        let p = self.rep_stack(nfa, parent);
        let r = self.chain_rep.get(&ret).copied().unwrap_or(ret);
        let out = if p == parent && r == ret {
            stk
        } else {
            // Same depth as `stk`, so the depth limit cannot refuse it.
            self.push_stack(nfa, p, r).unwrap_or(stk)
        };
        if self.stack_rep.len() < self.stacks.len() {
            self.stack_rep.resize(self.stacks.len(), UNKNOWN);
        }
        self.stack_rep[stk as usize] = out;
        out
    }

    /// The mask representative of `c`: `c` with every stack rewritten by
    /// [`Lazy::rep_stack`] and every state by [`Lazy::rep_state`]. Each thread of it accepts
    /// the same texts of up to `max_token_len` bytes as the thread it replaces, and a
    /// configuration is alive after a text iff one of its threads is, so both have the same
    /// token mask.
    pub(super) fn mask_rep(&mut self, nfa: &Nfa, c: ConfigId) -> ConfigId {
        if (self.chain_rep.is_empty() && self.state_rep.is_empty()) || c == DEAD {
            return c;
        }
        match self.config_rep[c as usize] {
            UNKNOWN => {}
            r => return r,
        }
        let threads = self.configs[c as usize].threads.clone();
        let mut out: Vec<(u32, StateId)> = Vec::with_capacity(threads.len());
        let mut changed = false;
        for &(stk, s) in threads.iter() {
            let r = self.rep_stack(nfa, stk);
            let q = self.rep_state(s);
            changed |= r != stk || q != s;
            out.push((r, q));
        }
        let rep = if changed {
            out.sort_unstable();
            out.dedup();
            let accept = self.configs[c as usize].accept;
            self.intern(nfa, &out, accept)
        } else {
            c
        };
        self.config_rep[c as usize] = rep;
        if rep != c {
            self.config_rep[rep as usize] = rep;
        }
        rep
    }

    /// `s` is `c`, or a configuration whose mask representative is `c` (then `s` and `c`
    /// agree on every text of up to `max_token_len` bytes: a loop for any token).
    pub(super) fn same_rep(&mut self, nfa: &Nfa, s: ConfigId, c: ConfigId) -> bool {
        s == c || (s != DEAD && self.mask_rep(nfa, s) == c)
    }
}

/// Every state that a chain or a counted product maps to another one, and that other one:
/// the states taking part in the representatives `chain` and `counted` (see
/// [`Lazy::share_chain_masks`]).
fn shared_states<'a, C, T>(
    chain: C,
    counted: &'a [(StateId, T)],
) -> impl Iterator<Item = StateId> + 'a
where
    C: IntoIterator<Item = (StateId, StateId)>,
    C::IntoIter: 'a,
    T: AsRef<[StateId]>,
{
    let chain = chain.into_iter().flat_map(|(q, r)| [q, r]);
    let counted = counted.iter().flat_map(|(first, t)| {
        t.as_ref()
            .iter()
            .enumerate()
            .map(move |(i, &r)| (first + i as StateId, r))
            .filter(|&(q, r)| r != q)
            .flat_map(|(q, r)| [q, r])
    });
    chain.chain(counted)
}
