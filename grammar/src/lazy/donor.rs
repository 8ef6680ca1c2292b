//! Masks borrowed from other configurations: a configuration's *donor* (the one most plain
//! characters lead it to, walked together with it through the token trie, see
//! [`Lazy::fill_mask`]), donors shared between sibling objects whose states are
//! structurally identical, and the cached mask of a successor whose threads a configuration
//! contains (unanchored searches).

use std::sync::Arc;

use super::{
    set_ids, ConfigId, Lazy, DEAD, DONOR_MIN_BYTES, EQUIV_MAX_PAIRS, PEERS_PER_SIGNATURE, TOP,
};
use crate::nfa::{Nfa, StateId};
use crate::vocab::TokenVocab;

/// Where a one-thread configuration's mask peers are kept: `(stack, state signature)`.
pub(super) type PeerKey = (u32, u64);

impl Lazy {
    /// A successor `s` of `c` over a plain ASCII character whose threads are a strict subset
    /// of `c`'s and whose mask is cached (the one with most threads), and the configuration
    /// of `c`'s other threads. A configuration is alive after a text iff one of its threads
    /// is, so `c`'s mask is the union of theirs. This is the inside of an unanchored search
    /// (`.*X.*`): the configuration at the string's start (the loop before `X` and `X`'s
    /// first states) is part of every later one, beside the threads of partial matches of
    /// `X`; a character that breaks the partial matches leads back to it. Its mask (a wide
    /// walk) is computed once; the partial matches' mask is a narrow one.
    pub(super) fn cached_part(&mut self, nfa: &Nfa, c: ConfigId) -> Option<(ConfigId, ConfigId)> {
        if c == DEAD || self.configs[c as usize].threads.len() < 2 {
            return None;
        }
        let mut best: Option<(ConfigId, usize)> = None;
        for b in 0x20u8..0x7F {
            if b == b'"' || b == b'\\' {
                continue;
            }
            let s = self.step(nfa, c, b);
            if s == DEAD || s == c || s == TOP || best.is_some_and(|e| e.0 == s) {
                continue;
            }
            if self.masks[s as usize].is_none() {
                continue;
            }
            let (st, ct) = (
                &self.configs[s as usize].threads,
                &self.configs[c as usize].threads,
            );
            if !st.is_empty()
                && st.len() < ct.len()
                && best.is_none_or(|e| st.len() > e.1)
                && is_subset(st, ct)
            {
                best = Some((s, st.len()));
            }
        }
        let (base, _) = best?;
        let rest: Vec<(u32, StateId)> = {
            let st = &self.configs[base as usize].threads;
            self.configs[c as usize]
                .threads
                .iter()
                .filter(|t| st.binary_search(t).is_err())
                .copied()
                .collect()
        };
        let r = self.intern(nfa, &rest, false);
        (r != c).then_some((base, r))
    }

    /// The mask of `g` computed by one plain walk (cached).
    pub(super) fn donor_mask(&mut self, nfa: &Nfa, vocab: &TokenVocab, g: ConfigId) -> Arc<[u32]> {
        if let Some(m) = &self.masks[g as usize] {
            return m.clone();
        }
        let rep = self.mask_rep(nfa, g);
        if rep != g {
            let m = self.donor_mask(nfa, vocab, rep);
            let mut buf = m.to_vec();
            if self.fix_long_tokens(nfa, vocab, g, &mut buf) {
                self.store(g, &buf);
                return Arc::from(buf);
            }
            self.masks[g as usize] = self.masks[rep as usize].clone();
            return m;
        }
        let key = self.peer_key(nfa, g);
        if let Some(m) = self.equivalent_mask(nfa, g, key) {
            // The same futures: share the mask (no extra budget).
            self.masks[g as usize] = Some(m.clone());
            return m;
        }
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        buf.resize(vocab.mask_words(), 0);
        self.walk(nfa, vocab, g, &mut buf);
        let m = if self.store(g, &buf) {
            self.add_mask_peer(g, key);
            self.masks[g as usize].clone().unwrap_or_default()
        } else {
            Arc::from(&buf[..])
        };
        self.scratch = buf;
        m
    }

    /// The thread of `c` when it has exactly one, under a non-empty stack, and does not
    /// accept.
    pub(super) fn one_thread_below(&self, c: ConfigId) -> Option<(u32, StateId)> {
        let cfg = &self.configs[c as usize];
        match *cfg.threads {
            [(stk, q)] if stk != 0 && !cfg.accept && (q as usize) < self.seen_gen.len() => {
                Some((stk, q))
            }
            _ => None,
        }
    }

    /// The cached mask of an earlier configuration whose one thread has the same stack as
    /// `c`'s and a state with the same futures ([`equivalent_states`]): then both are alive
    /// after the same texts. Such configurations are the "any other key" states of
    /// different objects' key automata at one depth (every object has its own automaton,
    /// but past the declared names they are all alike), and the states right after a
    /// complete declared name whose translations a pattern allows (`"description`,
    /// `"legalName` … each followed by `_` and a language tag): each was walked afresh
    /// before. Candidates are found by a signature of the state's own moves and its
    /// successors', so a configuration with no peer costs one hash.
    pub(super) fn equivalent_mask(
        &mut self,
        nfa: &Nfa,
        c: ConfigId,
        key: Option<PeerKey>,
    ) -> Option<Arc<[u32]>> {
        let p = self.equivalent_peer(nfa, c, key)?;
        self.masks[p as usize].clone()
    }

    /// Where `c`'s peers are kept: its one thread's stack and the signature of its state
    /// (`None`: `c` has no such thread). Computed once per mask and passed on.
    pub(super) fn peer_key(&self, nfa: &Nfa, c: ConfigId) -> Option<PeerKey> {
        let (stk, q) = self.one_thread_below(c)?;
        Some((stk, state_signature(nfa, q)))
    }

    /// The earlier configuration [`Lazy::equivalent_mask`] takes `c`'s mask from (`key`:
    /// [`Lazy::peer_key`] of `c`).
    pub(super) fn equivalent_peer(
        &mut self,
        nfa: &Nfa,
        c: ConfigId,
        key: Option<PeerKey>,
    ) -> Option<ConfigId> {
        let (_, q) = self.one_thread_below(c)?;
        let peers = self.mask_peers.get(&key?)?;
        for &p in peers.iter().rev() {
            let Some((_, pq)) = self.one_thread_below(p) else {
                continue;
            };
            if equivalent_states(&mut self.equiv, nfa, q, pq) {
                return Some(p);
            }
        }
        None
    }

    /// Remembers `c`, whose mask was just computed, as a peer for [`Lazy::equivalent_mask`]
    /// (`key`: [`Lazy::peer_key`] of `c`).
    pub(super) fn add_mask_peer(&mut self, c: ConfigId, key: Option<PeerKey>) {
        let Some(key) = key else {
            return;
        };
        let peers = self.mask_peers.entry(key).or_default();
        if peers.len() == PEERS_PER_SIGNATURE {
            peers.remove(0);
        }
        peers.push(c);
    }

    /// A donor for `c` (see [`Lazy::fill_mask`]): the most common successor over plain
    /// ASCII characters, when `c` is not itself a plain loop, at least `DONOR_MIN_BYTES`
    /// characters lead there, and on most first bytes `c` and the donor move alike.
    pub(super) fn donor(&mut self, nfa: &Nfa, c: ConfigId) -> Option<ConfigId> {
        if self.is_plain_loop(nfa, c) {
            return None;
        }
        let mut counts: Vec<(ConfigId, u32)> = Vec::new();
        for b in 0x20u8..=0x7F {
            if b == b'"' || b == b'\\' {
                continue;
            }
            let s = self.step(nfa, c, b);
            if s == DEAD || self.same_rep(nfa, s, c) {
                continue;
            }
            match counts.iter_mut().find(|e| e.0 == s) {
                Some(e) => e.1 += 1,
                None => counts.push((s, 1)),
            }
        }
        let &(g, n) = counts.iter().max_by_key(|e| e.1)?;
        if n < DONOR_MIN_BYTES {
            return None;
        }
        let (mut alive, mut agree) = (0u32, 0u32);
        for b in 0..=255u8 {
            let x = self.step(nfa, c, b);
            if x != DEAD {
                alive += 1;
                agree += (x == self.step(nfa, g, b)) as u32;
            }
        }
        (2 * agree >= alive).then_some(g)
    }

    /// Corrects `out`, which holds the mask of `g`, into the mask of `c`: walks the trie
    /// from `c` and `g` together and skips every subtree where both reach the same
    /// configuration (the donor's bits are right there).
    pub(super) fn paired_walk(
        &mut self,
        nfa: &Nfa,
        vocab: &TokenVocab,
        c: ConfigId,
        g: ConfigId,
        out: &mut [u32],
    ) {
        let trie = vocab.trie();
        let nodes = &trie.nodes;
        let mut cfg_at = [(DEAD, DEAD); 1024];
        cfg_at[0] = (c, g);
        let mut i = 0usize;
        while i < nodes.len() {
            let n = &nodes[i];
            let d = n.depth as usize;
            let (x, y) = cfg_at[d - 1];
            let x2 = self.step(nfa, x, n.byte);
            let y2 = if y == DEAD {
                DEAD
            } else {
                self.step(nfa, y, n.byte)
            };
            if x2 == y2 {
                i = n.next as usize;
                continue;
            }
            if x2 == DEAD {
                for &id in trie.subtree_ids(i) {
                    out[(id >> 5) as usize] &= !(1u32 << (id & 31));
                }
                i = n.next as usize;
                continue;
            }
            if x2 == TOP {
                set_ids(out, trie.subtree_ids(i));
                i = n.next as usize;
                continue;
            }
            // Inside a multi-byte character the two usually differ only until it is
            // complete (a string's first character against its loop): when every
            // continuation leads both to the same configuration, the donor's bits are
            // right for the whole subtree (both are alive here, so also for the tokens
            // ending at this node).
            if n.byte >= 0xC0 && y2 != DEAD && self.agree_within_char(nfa, x2, y2, 2) {
                i = n.next as usize;
                continue;
            }
            cfg_at[d] = (x2, y2);
            set_ids(out, trie.own_ids(i));
            i += 1;
        }
    }

    /// `x` and `y` (both alive) lead to the same configuration after every byte, or —
    /// up to `depth` more bytes deep — to two alive configurations that agree in turn.
    /// Then every non-empty text leads both to one configuration or both alive within
    /// `depth + 1` bytes, so on a trie walk their subtrees get the same bits. Meant for
    /// configurations inside a multi-byte character, which move only on continuation
    /// bytes; cached per pair.
    fn agree_within_char(&mut self, nfa: &Nfa, x: ConfigId, y: ConfigId, depth: u32) -> bool {
        if let Some(&r) = self.char_equiv.get(&(x, y)) {
            return r;
        }
        if x == TOP || y == TOP {
            return false;
        }
        let mut agree = true;
        let mut prev_class = usize::MAX;
        for b in 0..=255u8 {
            let k = self.byte_class[b as usize] as usize;
            if k == prev_class {
                continue;
            }
            prev_class = k;
            let (x2, y2) = (self.step(nfa, x, b), self.step(nfa, y, b));
            if x2 == y2 {
                continue;
            }
            if depth == 0
                || x2 == DEAD
                || y2 == DEAD
                || !self.agree_within_char(nfa, x2, y2, depth - 1)
            {
                agree = false;
                break;
            }
        }
        self.char_equiv.insert((x, y), agree);
        agree
    }
}

/// Whether states `a` and `b` have the same futures under any non-empty stack: a
/// functional pairing from `a`'s side to `b`'s, grown from `(a, b)`, in which every pair
/// has the same byte ranges, epsilon moves, calls (to the very same rules) and rule-end
/// flag, in the same order, with paired targets — a bisimulation, so both states accept
/// the same texts and return the same ways. Conservative: `false` past
/// [`EQUIV_MAX_PAIRS`] pairs, or when equal futures are written in another order. (A
/// rule end is a return here, whichever rule it ends: only the empty stack tells the root
/// rule's end apart, and the callers' threads are under non-empty ones.)
fn equivalent_states(sc: &mut EquivScratch, nfa: &Nfa, a: StateId, b: StateId) -> bool {
    let n = nfa.states.len();
    if sc.gen.len() < n {
        sc.gen.resize(n, 0);
        sc.partner.resize(n, 0);
    }
    sc.cur = sc.cur.wrapping_add(1);
    if sc.cur == 0 {
        sc.gen.fill(0);
        sc.cur = 1;
    }
    let cur = sc.cur;
    sc.work.clear();
    sc.work.push((a, b));
    sc.gen[a as usize] = cur;
    sc.partner[a as usize] = b;
    let mut pairs = 1usize;
    // Pairs `x` with `y`: consistent with an earlier pairing of `x`, else a new pair.
    let mut pair = |sc: &mut EquivScratch, x: StateId, y: StateId| -> bool {
        if sc.gen[x as usize] == cur {
            return sc.partner[x as usize] == y;
        }
        if pairs >= EQUIV_MAX_PAIRS {
            return false;
        }
        pairs += 1;
        sc.gen[x as usize] = cur;
        sc.partner[x as usize] = y;
        sc.work.push((x, y));
        true
    };
    while let Some((x, y)) = sc.work.pop() {
        if x == y {
            continue;
        }
        let (sx, sy) = (&nfa.states[x as usize], &nfa.states[y as usize]);
        if sx.end_of.is_some() != sy.end_of.is_some()
            || sx.bytes.len() != sy.bytes.len()
            || sx.eps.len() != sy.eps.len()
            || sx.calls.len() != sy.calls.len()
        {
            return false;
        }
        for (&(lx, hx, tx), &(ly, hy, ty)) in sx.bytes.iter().zip(&sy.bytes) {
            if (lx, hx) != (ly, hy) || !pair(sc, tx, ty) {
                return false;
            }
        }
        for (&tx, &ty) in sx.eps.iter().zip(&sy.eps) {
            if !pair(sc, tx, ty) {
                return false;
            }
        }
        for (&(rx, tx), &(ry, ty)) in sx.calls.iter().zip(&sy.calls) {
            if rx != ry || !pair(sc, tx, ty) {
                return false;
            }
        }
    }
    true
}

/// Reused buffers of [`equivalent_states`]: per NFA state, the check (generation) that
/// last paired it and its partner there (no hashing, no allocation per check).
#[derive(Debug, Default)]
pub(super) struct EquivScratch {
    gen: Vec<u32>,
    partner: Vec<StateId>,
    cur: u32,
    work: Vec<(StateId, StateId)>,
}

impl EquivScratch {
    /// Bytes held (8 per NFA state once a check has run).
    pub(super) fn heap_bytes(&self) -> usize {
        (self.gen.capacity() + self.partner.capacity()) * 4 + self.work.capacity() * 8
    }
}

/// A hash of what [`equivalent_states`] compares at `q` and at its byte successors: equal
/// for equivalent states, and mostly different otherwise.
fn state_signature(nfa: &Nfa, q: StateId) -> u64 {
    fn local(h: &mut u64, nfa: &Nfa, q: StateId) {
        let st = &nfa.states[q as usize];
        let mut mix = |x: u64| *h = (*h ^ x).wrapping_mul(0x100_0000_01b3).rotate_left(17);
        mix(st.end_of.is_some() as u64);
        mix(st.eps.len() as u64);
        for &(r, _) in &st.calls {
            mix(0x1_0000_0000 | r as u64);
        }
        for &(lo, hi, _) in &st.bytes {
            mix(((lo as u64) << 8) | hi as u64);
        }
    }
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    local(&mut h, nfa, q);
    for &(_, _, t) in &nfa.states[q as usize].bytes {
        local(&mut h, nfa, t);
    }
    h
}

/// Every element of the sorted slice `a` is in the sorted slice `b`.
fn is_subset<T: Ord>(a: &[T], b: &[T]) -> bool {
    let mut j = 0;
    for x in a {
        while j < b.len() && b[j] < *x {
            j += 1;
        }
        if j == b.len() || b[j] != *x {
            return false;
        }
        j += 1;
    }
    true
}
