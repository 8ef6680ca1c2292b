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
//! stack. Both parts are ordinary configurations, so their masks take all the usual fast
//! paths (plain loops, donors, chain representatives).
//!
//! The upper mask is not walked when a byte `b` must be taken at the rule's
//! own level on every way from `q` to the rule's end ([`must_pass_byte`]; `:` inside a key):
//! every uncertain token then contains `b`, and the candidates are the tokens with `b`
//! outside the lower mask (about a hundred on Llama-3). Each candidate is stepped in a
//! third, *mark* world, whose sentinel frame turns a returning thread into the [`MARK`]
//! thread: the positions `j` after which the configuration holds `MARK` are exactly those
//! where a prefix of the token leaves the rule (for `":12,"`, after `":1` and after
//! `":12`). A token with no such position is decided by the lower mask alone; the others are
//! kept with their positions. Under real frames such a token is alive iff, for one of its
//! positions `j`, the rest after `j` is alive from where the frames return to (the closure
//! of the members' `(parent, return state)`), which is stepped once per group, instead of
//! stepping the whole token from the group's threads (the "other key" rule under ~80
//! stacks in a Snowplow gap, each going on into a value). Threads inside an "other key"
//! rule (marked by `json/object.rs` through [`Nfa::key_rules`]) are split this way from
//! the first key position of their object on, whatever the configuration's size.

use std::sync::Arc;

use super::{or_into, ConfigId, Lazy, DEAD, MARK, SENT_LOWER, SENT_MARK, SENT_UPPER, TOP};
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

/// Not a configuration id: "not computed yet".
const UNKNOWN_CFG: ConfigId = u32::MAX;
/// A thread: `(stack, state)`.
type Thread = (u32, StateId);
/// What a thread's parts depend on: `(stack depth, state)`.
type ThreadKey = (u32, StateId);

/// The frame-independent parts of one thread's mask (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct ThreadParts {
    /// Tokens alive whatever the frames below: the lower sentinel mask.
    lower: Arc<[u32]>,
    /// The tokens in the upper sentinel mask but not in the lower one, each with every
    /// position at which a prefix of it leaves the rule (one entry per position).
    uncertain: Arc<[(u32, u16)]>,
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
        // A thread whose uncertain tokens overflowed is walked with the narrow ones.
        let mut wide = threads
            .iter()
            .filter(|&&(_, q)| is_wide(nfa, q) && !self.overflowing.contains(&q));
        if threads.len() >= SPLIT_MIN_THREADS {
            return wide.next().is_some();
        }
        // A thread inside an "other key" rule recurs at every key position of its object
        // (and of every object of the same schema): its parts pay from the first one on
        // (measured: splitting from the second occurrence on was no better).
        if wide.clone().any(|&t| self.is_key_thread(t)) {
            return true;
        }
        let mut any = false;
        for &(stk, q) in wide {
            if !self.parts_known(stk, q) {
                return false;
            }
            any = true;
        }
        any
    }

    /// The thread runs at the top level of an "other key" rule (its top frame returns
    /// from a call to a key rule).
    fn is_key_thread(&self, (stk, _): Thread) -> bool {
        stk != 0 && self.key_ret.contains(&self.stacks[stk as usize].1)
    }

    /// The thread's parts are cached.
    fn parts_known(&self, stk: u32, q: StateId) -> bool {
        stk != 0
            && self
                .thread_parts
                .contains_key(&(self.stacks[stk as usize].2, q))
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
        let many = threads.len() >= SPLIT_MIN_THREADS;
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
            let parted = many || self.is_key_thread((stk, q)) || self.parts_known(stk, q);
            if !is_wide(nfa, q) || (stk != 0 && !parted) || self.overflowing.contains(&q) {
                // Narrow, or a wide thread whose parts would not pay (e.g. the trie of the
                // declared keys not yet written beside the "other key" rule).
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
            let p = if self.overflowing.contains(&q) {
                None
            } else {
                Some(self.thread_parts(nfa, vocab, depth, q))
            };
            let Some(p) = p.filter(|p| p.uncertain.len() <= MAX_UNCERTAIN) else {
                // Each thread alone under its real stack.
                for t in members {
                    let single = self.intern(nfa, &[t], false);
                    self.fill_mask(nfa, vocab, single, &mut buf);
                    or_into(out, &buf);
                }
                continue;
            };
            or_into(out, &p.lower);
            // An uncertain token is alive iff, after one of its return points, the rest of
            // it is alive from where the members return to (interned on first use).
            let mut back = UNKNOWN_CFG;
            for &(id, j) in p.uncertain.iter() {
                if out[(id >> 5) as usize] >> (id & 31) & 1 == 1 {
                    continue;
                }
                if back == UNKNOWN_CFG {
                    let seeds: Vec<Thread> = members
                        .iter()
                        .map(|&(stk, _)| {
                            let (parent, ret, _) = self.stacks[stk as usize];
                            (parent, ret)
                        })
                        .collect();
                    back = self.closure(nfa, &seeds);
                }
                let bytes = vocab.token_bytes(id).unwrap_or(&[]);
                if back != DEAD && self.step_bytes(nfa, back, &bytes[j as usize..]) != DEAD {
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
        let lo = self.sentinel_stack(SENT_LOWER, depth);
        let lo_cfg = self.intern(nfa, &[(lo, q)], false);
        // A state with the same futures as one whose parts are known at this depth (the
        // state after a complete declared name in another object's key automaton) has
        // the same parts: the same lower mask, and the same tokens leave the rule at the
        // same positions.
        if self.masks[lo_cfg as usize].is_none() {
            let key = self.peer_key(nfa, lo_cfg);
            if let Some(p) = self.equivalent_peer(nfa, lo_cfg, key) {
                // Its mask at least (so `fill_mask` below does not check again).
                self.masks[lo_cfg as usize] = self.masks[p as usize].clone();
                let known = self
                    .one_thread_below(p)
                    .and_then(|(_, pq)| self.thread_parts.get(&(depth, pq)).cloned());
                if let Some(parts) = known {
                    self.thread_parts.insert((depth, q), parts.clone());
                    return parts;
                }
            }
        }
        self.fill_mask(nfa, vocab, lo_cfg, &mut lower);
        // Candidates: a superset of `upper \ lower` (tokens that can leave the rule).
        let pass = must_pass_byte(nfa, q, &mut self.seen_gen, &mut self.closure_gen);
        let candidates: Vec<u32> = match pass {
            // Every token that leaves the rule contains `b`: no upper walk needed.
            Some(b) => vocab
                .tokens_with_byte(b)
                .iter()
                .copied()
                .filter(|&id| lower[(id >> 5) as usize] >> (id & 31) & 1 == 0)
                .collect(),
            None => {
                let mut upper = vec![0u32; words];
                let up = self.sentinel_stack(SENT_UPPER, depth);
                let z = self.intern(nfa, &[(up, q)], false);
                self.fill_mask(nfa, vocab, z, &mut upper);
                let mut ids = Vec::new();
                for (w, (&u, &l)) in upper.iter().zip(&lower).enumerate() {
                    let mut x = u & !l;
                    while x != 0 {
                        ids.push((w as u32) << 5 | x.trailing_zeros());
                        x &= x - 1;
                    }
                }
                ids
            }
        };
        // Their return points, found in the mark world: a token none of whose prefixes
        // leaves the rule is decided by the lower mask alone.
        let mk = self.sentinel_stack(SENT_MARK, depth);
        let m0 = self.intern(nfa, &[(mk, q)], false);
        let mut uncertain: Vec<(u32, u16)> = Vec::new();
        for id in candidates {
            if uncertain.len() > MAX_UNCERTAIN {
                // Too many to check one by one: the thread takes its own mask under its
                // real stack, here and at every other depth (stepping the rest of the
                // candidates would be wasted: ~0.7 ms inside a `format: uri` string).
                self.overflowing.insert(q);
                break;
            }
            let bytes = vocab.token_bytes(id).unwrap_or(&[]);
            let mut x = m0;
            for (j, &b) in bytes.iter().enumerate() {
                x = self.step(nfa, x, b);
                if x == DEAD {
                    break;
                }
                if self.configs[x as usize]
                    .threads
                    .binary_search(&(0, MARK))
                    .is_ok()
                {
                    uncertain.push((id, (j + 1) as u16));
                }
            }
        }
        // Share the lower configuration's cached mask when there is one (no extra memory);
        // the uncertain ids count against the mask budget like a mask.
        let lower = match &self.masks[lo_cfg as usize] {
            Some(m) => m.clone(),
            None => Arc::from(lower),
        };
        self.mask_bytes += uncertain.len() * 8;
        let p = ThreadParts {
            lower,
            uncertain: Arc::from(uncertain),
        };
        self.thread_parts.insert((depth, q), p.clone());
        p
    }

    /// The sentinel stack of this kind (its frame's return state: [`SENT_UPPER`],
    /// [`SENT_LOWER`] or [`SENT_MARK`]) at this depth (the same depth keeps the depth limit
    /// exact).
    fn sentinel_stack(&mut self, kind: StateId, depth: u32) -> u32 {
        if let Some(&s) = self.sentinels.get(&(kind, depth)) {
            return s;
        }
        let id = self.stacks.len() as u32;
        self.stacks.push((0, kind, depth));
        self.stack_cost.push(0);
        self.sentinels.insert((kind, depth), id);
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

/// [`must_pass_byte`] gives up past this many states (the search runs once per thread
/// parts, but a huge rule would make it cost more than the walk it saves).
const PASS_MAX_STATES: usize = 4096;
/// Bytes tried by [`must_pass_byte`], rare in tokens first.
const PASS_CANDIDATES: [u8; 4] = [b':', b'}', b']', b'"'];

/// A byte that every path from `q` to the end of its rule consumes at the rule's own level,
/// if one of [`PASS_CANDIDATES`] is: then a token can return from the rule (from any stack)
/// only if it contains that byte. Calls are assumed to match anything without it (the
/// search ignores what they consume), so the answer is conservative.
///
/// `seen` and `last_gen` are the closure's per-state stamps and its last generation
/// ([`Lazy::closure`]): a state is seen in this search iff its stamp equals the search's
/// generation (no hashing: the search visits hundreds of key-automaton states per new key
/// position).
fn must_pass_byte(nfa: &Nfa, q: StateId, seen: &mut [u32], last_gen: &mut u32) -> Option<u8> {
    let mut work: Vec<StateId> = Vec::new();
    'cand: for &b in &PASS_CANDIDATES {
        // A new generation per candidate byte (0 is never one: stamps start at 0).
        *last_gen = last_gen.wrapping_add(1);
        if *last_gen == 0 {
            seen.fill(0);
            *last_gen = 1;
        }
        let gen = *last_gen;
        let mut count = 1usize;
        work.clear();
        work.push(q);
        seen[q as usize] = gen;
        while let Some(s) = work.pop() {
            let st = &nfa.states[s as usize];
            if st.end_of.is_some() {
                continue 'cand;
            }
            let next = st
                .eps
                .iter()
                .copied()
                .chain(st.calls.iter().map(|&(_, ret)| ret))
                .chain(
                    st.bytes
                        .iter()
                        .filter(|&&(lo, hi, _)| !(lo == b && hi == b))
                        .map(|&(_, _, t)| t),
                );
            for t in next {
                if seen[t as usize] != gen {
                    seen[t as usize] = gen;
                    count += 1;
                    work.push(t);
                }
            }
            if count > PASS_MAX_STATES {
                // A large rule: the upper walk is the cheaper bound on its cost.
                return None;
            }
        }
        return Some(b);
    }
    None
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
