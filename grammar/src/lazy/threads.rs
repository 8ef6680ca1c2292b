//! Masks as unions of per-thread masks, with frame-independent thread masks.
//!
//! A configuration is alive after a text iff one of its threads is (stepping and closing
//! act on each thread alone), so its token mask is the union of its threads' masks. A
//! wide configuration whose threads sit under different call stacks is split this way.
//! This pays off at key positions: properties are produced in schema order, so every gap
//! between two properties is a configuration of its own — the remaining declared keys'
//! literal threads (the same threads in every gap) plus the "other key" rule called with a
//! gap-specific return state. Computed whole, every gap walks the trie afresh and creates
//! some hundred new configurations; split, each thread's mask is shared between gaps.
//!
//! A thread `(S, q)` under a non-empty stack `S` of depth `d` is decided in two parts that
//! do not depend on `S`, cached per `(d, q)`: its *lower* mask, computed with `S` replaced
//! by a sentinel frame that ends a thread returning into it, and its *upper* mask, with a
//! sentinel frame into which a return yields [`TOP`] (alive after any text). Every token
//! alive in the lower world is alive from `(S, q)` (the same thread path exists there, at
//! the same depth), and every token alive from `(S, q)` is alive in the upper world (a path
//! that never returns below `S`'s top frame exists there; one that does reaches `TOP`). So
//! `lower ⊆ mask(S, q) ⊆ upper`, and only the *uncertain* tokens `upper \ lower` — those
//! that leave the thread's rule through its return and go on — are checked against the real
//! stack, by stepping their bytes. Both parts are ordinary configurations, so their masks
//! take all the usual fast paths (plain loops, donors, chain representatives).

use std::sync::Arc;

use super::{ConfigId, Lazy, DEAD, SENT_LOWER, SENT_UPPER, TOP};
use crate::nfa::{Nfa, StateId};
use crate::vocab::TokenVocab;

/// Split configurations with at least this many threads (and two stacks or more, and a
/// wide thread) at once; smaller ones only when the masks of their wide threads are known
/// already (a split costs two walks per new thread, repaid only when the thread recurs).
const SPLIT_MIN_THREADS: usize = 8;
/// A thread is *wide* when at least this many printable ASCII bytes move it: its mask is
/// wide and costly to walk, and worth sharing (e.g. the "other key" rule in every gap).
const WIDE_BYTES: u32 = 16;
/// A thread with more uncertain tokens than this takes its own mask under its real stack
/// instead of checking them one by one.
const MAX_UNCERTAIN: usize = 4096;

/// A thread: `(stack, state)`.
type Thread = (u32, StateId);
/// What a thread's parts depend on: `(stack depth, state)`.
type ThreadKey = (u32, StateId);

/// The frame-independent parts of one thread's mask (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct ThreadParts {
    /// Tokens alive whatever the frames below: the lower sentinel mask.
    lower: Arc<[u32]>,
    /// Token ids in the upper sentinel mask but not in the lower one.
    uncertain: Arc<[u32]>,
}

impl Lazy {
    /// Whether `c`'s mask is computed as the union of its threads' masks.
    pub(super) fn split_by_threads(&self, nfa: &Nfa, c: ConfigId) -> bool {
        if c == DEAD || c == TOP {
            return false;
        }
        let threads = &self.configs[c as usize].threads;
        if threads.len() < 2 || threads.iter().all(|t| t.0 == threads[0].0) {
            return false;
        }
        let mut wide = threads.iter().filter(|&&(_, q)| is_wide(nfa, q));
        if threads.len() >= SPLIT_MIN_THREADS {
            return wide.next().is_some();
        }
        let mut any = false;
        for &(stk, q) in wide {
            let known = stk != 0
                && self
                    .thread_parts
                    .contains_key(&(self.stacks[stk as usize].2, q));
            if !known {
                return false;
            }
            any = true;
        }
        any
    }

    /// Writes the mask of `c` (`out` zeroed) as the union of its threads' masks.
    pub(super) fn fill_by_threads(
        &mut self,
        nfa: &Nfa,
        vocab: &TokenVocab,
        c: ConfigId,
        out: &mut [u32],
    ) {
        let threads = self.configs[c as usize].threads.clone();
        let mut buf = vec![0u32; out.len()];
        // Threads at one state under stacks of one depth share their parts (e.g. the
        // "other key" rule called from every property-count track): one group each.
        let mut groups: Vec<(ThreadKey, Vec<Thread>)> = Vec::new();
        // Narrow threads together, under their real stacks: one cheap walk (that
        // configuration has no wide thread, so it is never split again), and its narrow
        // successors are shared between gaps.
        let mut rest: Vec<Thread> = Vec::new();
        for &(stk, q) in threads.iter() {
            let key = (self.stacks[stk as usize].2, q);
            if !is_wide(nfa, q) {
                rest.push((stk, q));
            } else if stk == 0 {
                // The thread alone (one thread: never split again).
                let single = self.intern(nfa, &[(stk, q)], false);
                self.fill_mask(nfa, vocab, single, &mut buf);
                or_into(out, &buf);
            } else if let Some(g) = groups.iter_mut().find(|g| g.0 == key) {
                g.1.push((stk, q));
            } else {
                groups.push((key, vec![(stk, q)]));
            }
        }
        if !rest.is_empty() {
            let r = self.intern(nfa, &rest, false);
            self.fill_mask(nfa, vocab, r, &mut buf);
            or_into(out, &buf);
        }
        for ((depth, q), members) in groups {
            let p = self.thread_parts(nfa, vocab, depth, q);
            if p.uncertain.len() > MAX_UNCERTAIN {
                // Each thread alone under its real stack.
                for t in members {
                    let single = self.intern(nfa, &[t], false);
                    self.fill_mask(nfa, vocab, single, &mut buf);
                    or_into(out, &buf);
                }
                continue;
            }
            or_into(out, &p.lower);
            // The group under its real stacks (sorted: `threads` is), interned on first use.
            let mut real = DEAD;
            for &id in p.uncertain.iter() {
                if out[(id >> 5) as usize] >> (id & 31) & 1 == 1 {
                    continue;
                }
                if real == DEAD {
                    real = self.intern(nfa, &members, false);
                }
                let bytes = vocab.token_bytes(id).unwrap_or(&[]);
                if self.step_bytes(nfa, real, bytes) != DEAD {
                    out[(id >> 5) as usize] |= 1u32 << (id & 31);
                }
            }
        }
    }

    /// The lower mask and the uncertain tokens of a thread at state `q` under a stack of
    /// depth `depth` (cached).
    fn thread_parts(
        &mut self,
        nfa: &Nfa,
        vocab: &TokenVocab,
        depth: u32,
        q: StateId,
    ) -> ThreadParts {
        if let Some(p) = self.thread_parts.get(&(depth, q)) {
            return p.clone();
        }
        let words = vocab.mask_words();
        let mut lower = vec![0u32; words];
        let mut upper = vec![0u32; words];
        let lo = self.sentinel_stack(false, depth);
        let lo_cfg = self.intern(nfa, &[(lo, q)], false);
        self.fill_mask(nfa, vocab, lo_cfg, &mut lower);
        let up = self.sentinel_stack(true, depth);
        let z = self.intern(nfa, &[(up, q)], false);
        self.fill_mask(nfa, vocab, z, &mut upper);
        let mut uncertain = Vec::new();
        for (w, (&u, &l)) in upper.iter().zip(&lower).enumerate() {
            let mut x = u & !l;
            while x != 0 {
                uncertain.push((w as u32) << 5 | x.trailing_zeros());
                x &= x - 1;
            }
        }
        // Share the lower configuration's cached mask when there is one (no extra memory);
        // the uncertain ids count against the mask budget like a mask.
        let lower = match &self.masks[lo_cfg as usize] {
            Some(m) => m.clone(),
            None => Arc::from(lower),
        };
        self.mask_bytes += uncertain.len() * 4;
        let p = ThreadParts {
            lower,
            uncertain: Arc::from(uncertain),
        };
        self.thread_parts.insert((depth, q), p.clone());
        p
    }

    /// The sentinel stack of this kind at this depth (its frame's return state is
    /// [`SENT_UPPER`] or [`SENT_LOWER`]; the same depth keeps the depth limit exact).
    fn sentinel_stack(&mut self, upper: bool, depth: u32) -> u32 {
        if let Some(&s) = self.sentinels.get(&(upper, depth)) {
            return s;
        }
        let id = self.stacks.len() as u32;
        let ret = if upper { SENT_UPPER } else { SENT_LOWER };
        self.stacks.push((0, ret, depth));
        self.stack_cost.push(0);
        self.sentinels.insert((upper, depth), id);
        id
    }

    /// The mask of every usable token (cached).
    pub(super) fn all_usable(&mut self, vocab: &TokenVocab) -> Arc<[u32]> {
        if let Some(m) = &self.all_usable {
            return m.clone();
        }
        let mut m = vec![0u32; vocab.mask_words()];
        super::set_ids(&mut m, &vocab.trie().ids);
        let m: Arc<[u32]> = Arc::from(m);
        self.all_usable = Some(m.clone());
        m
    }
}

/// Whether at least [`WIDE_BYTES`] printable ASCII bytes move state `q`.
fn is_wide(nfa: &Nfa, q: StateId) -> bool {
    let printable: u32 = nfa.states[q as usize]
        .bytes
        .iter()
        .map(|&(lo, hi, _)| (hi.min(0x7E) as u32 + 1).saturating_sub(lo.max(0x20) as u32))
        .sum();
    printable >= WIDE_BYTES
}

/// `out |= m`, word by word.
fn or_into(out: &mut [u32], m: &[u32]) {
    for (o, &x) in out.iter_mut().zip(m) {
        *o |= x;
    }
}
