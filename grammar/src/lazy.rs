//! A lazily built deterministic automaton over the NFA's *configurations*.
//!
//! A configuration is the set of live threads `(call stack, NFA state)` after an epsilon
//! closure (only states with byte moves are kept) plus an "accepting" flag. Configurations
//! are interned once per compiled grammar, so a byte step is a table lookup after warm-up and
//! a token mask is a function of the configuration alone: it is cached per configuration.
//! Stacks are hash-consed: a stack id names `(parent stack, return state)`.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::nfa::{Nfa, StateId};
use crate::vocab::{CharClass, TokenVocab};

mod budget;
mod donor;
mod reps;
mod threads;

/// Configuration id. `DEAD` is the empty configuration.
pub(crate) type ConfigId = u32;
/// The empty, rejecting configuration.
pub(crate) const DEAD: ConfigId = 0;
/// The configuration that is alive after any text: what a thread becomes when it returns
/// into an "upper" sentinel frame (see [`threads`]). Only mask computations reach it.
pub(crate) const TOP: ConfigId = 1;
/// Return state of an "upper" sentinel frame: returning into it yields [`TOP`].
const SENT_UPPER: StateId = u32::MAX;
/// Return state of a "lower" sentinel frame: a thread returning into it ends.
const SENT_LOWER: StateId = u32::MAX - 1;
/// Return state of a "mark" sentinel frame: a thread returning into it becomes the
/// [`MARK`] thread, which records that the rule has just been left (see [`threads`]).
const SENT_MARK: StateId = u32::MAX - 2;
/// State of the thread `(0, MARK)`: it has no moves (it is never stepped) and only marks a
/// configuration reached in a "mark" world right after a return into its sentinel.
const MARK: StateId = u32::MAX - 3;
const UNKNOWN: u32 = u32::MAX;
const NO_SUCC: u32 = u32::MAX - 1;

/// How many earlier one-thread configurations with the same stack and state signature a
/// new one is compared with (see [`Lazy::equivalent_mask`]).
const PEERS_PER_SIGNATURE: usize = 4;
/// [`equivalent_states`] gives up past this many state pairs.
const EQUIV_MAX_PAIRS: usize = 512;

/// Configurations room is made for when a grammar's automaton is created.
const INITIAL_CONFIGS: usize = 512;

/// Deepest call stack the matcher follows; deeper nesting is rejected.
pub(crate) const MAX_STACK_DEPTH: u32 = 256;

/// Most `(stack, state)` threads one closure may visit beyond the automaton's own states
/// (a flat automaton visits each state at most once). An ambiguous recursion (`x ::= "a" x
/// | "a" x "b" | ""`, or left recursion beside right recursion) has one stack per parse
/// of the text so far, exponentially many in its length; following them all exhausted the
/// host's memory within a few dozen tokens. Past the limit the automaton is poisoned
/// ([`Lazy::poisoned`]) and every matcher of the grammar reports
/// [`crate::MatchError::TooAmbiguous`].
pub(crate) const MAX_CLOSURE_VISITS: usize = 1 << 20;

/// Most threads all the closures of one call into the automaton may visit together (a
/// mask, a token, a budget plan): one call stays within about half a second of CPU and
/// 128 MiB of threads however the grammar is written (the grammar tests, real vocabularies
/// and JSONSchemaBench masks included, stay under 200,000 per call). Past it the automaton
/// is poisoned, as above.
pub(crate) const MAX_CALL_VISITS: u64 = 1 << 24;
// `MatchError::TooAmbiguous`'s message says "16 times that per step".
const _: () = assert!(MAX_CALL_VISITS == 16 * MAX_CLOSURE_VISITS as u64);

/// Most texts [`Lazy::key_end`] remembers (a few MiB of key texts at most).
const MAX_KEY_ENDS: usize = 1 << 16;

/// A donor must be the successor of at least this many plain ASCII characters (see
/// [`Lazy::fill_mask`]).
const DONOR_MIN_BYTES: u32 = 16;

/// A class loop (see [`Lazy::loop_class`]) must loop on at least this many printable ASCII
/// characters: narrower loops (digits) have small trie walks already.
const CLASS_MIN_ASCII: u32 = 16;

/// A fast multiplicative hasher for the small integer keys of the lazy automaton (stacks,
/// threads, configurations): SipHash cost a tenth of a cold mask. Keys are not
/// attacker-chosen beyond the grammar itself, and a poor spread only costs speed.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;

#[derive(Debug)]
pub(crate) struct Config {
    /// Sorted `(stack, state)` threads whose state has byte moves.
    pub threads: Box<[(u32, StateId)]>,
    /// An empty stack reached the root rule's end.
    pub accept: bool,
    /// Fewest bytes to reach an accepting configuration.
    pub min_bytes: u32,
}

/// Lazily grown configuration automaton plus the per-configuration mask cache.
#[derive(Debug)]
pub(crate) struct Lazy {
    /// `(parent, ret, depth)`; stack 0 is the empty stack.
    stacks: Vec<(u32, StateId, u32)>,
    stack_cost: Vec<u32>,
    stack_map: FastMap<(u32, StateId), u32>,
    pub configs: Vec<Config>,
    /// Interning: hash of `(threads, accept)` → the last configuration with that hash;
    /// `config_next` chains earlier ones (`UNKNOWN` ends a chain). Lookups compare slices,
    /// so a known configuration costs no allocation.
    config_map: FastMap<u64, ConfigId>,
    config_next: Vec<ConfigId>,
    /// Reused buffers of [`Lazy::closure`] and [`Lazy::step_slow`]. `visited` holds only
    /// the threads at a state already visited under another stack in the same closure;
    /// the first stack per state is stamped in `seen_gen`/`seen_stk` (no hashing).
    visited: FastSet<(u32, StateId)>,
    /// Per NFA state: the closure (`closure_gen`) that last visited it, and under which
    /// stack first (`threads::must_pass_byte` takes generations of its own from them).
    seen_gen: Vec<u32>,
    seen_stk: Vec<u32>,
    closure_gen: u32,
    work: Vec<(u32, StateId)>,
    out_buf: Vec<(u32, StateId)>,
    seeds_buf: Vec<(u32, StateId)>,
    /// Transition rows, [`Lazy::stride`] entries per configuration, indexed by byte class.
    trans: Vec<u32>,
    /// Byte → byte class: bytes no byte range of the NFA tells apart share a class (and a
    /// transition entry). Classes are intervals, numbered in byte order.
    byte_class: [u8; 256],
    /// Number of byte classes: the length of a transition row.
    stride: usize,
    masks: Vec<Option<Arc<[u32]>>>,
    /// Reused buffer for donor masks.
    scratch: Vec<u32>,

    /// Per configuration: the one configuration every plain string character leads to
    /// (`NO_SUCC`: they diverge; `UNKNOWN`: not computed).
    plain_succ: Vec<u32>,
    /// Return states of long counted chains mapped to their representative
    /// ([`Nfa::chain_representatives`]); empty when the grammar has none.
    chain_rep: FastMap<StateId, StateId>,
    /// Per counted regex product (by first state): the representative of each of its
    /// states ([`Nfa::count_representatives`]); empty when the grammar has none.
    state_rep: Vec<(StateId, Box<[StateId]>)>,
    /// Whether the representatives only agree on texts shorter than some tokens: then a
    /// mask taken through a representative gets [`Lazy::fix_long_tokens`].
    short_horizon: bool,
    /// States that take part in the representatives of the short horizon but not in those
    /// of the full one (the longest token): a configuration without them in its threads
    /// and stacks agrees with its representative on every token (no fix-up needed).
    short_only: FastSet<StateId>,
    /// Per stack: whether a frame returns to a state of `short_only` (0: no, 1: yes,
    /// 2: not computed).
    stack_short: Vec<u8>,
    /// The horizon of the representatives in bytes.
    horizon: usize,
    /// Per stack: the stack with every chain return state replaced by its representative
    /// (`UNKNOWN`: not computed).
    stack_rep: Vec<u32>,
    /// Per configuration: its mask representative (`UNKNOWN`: not computed).
    config_rep: Vec<u32>,
    mask_bytes: usize,
    mask_budget: usize,
    max_configs: usize,
    /// Sentinel stacks by (kind, depth) (see [`threads`]).
    sentinels: FastMap<(StateId, u32), u32>,
    /// Per thread state and stack depth: its frame-independent mask parts (see [`threads`]).
    thread_parts: FastMap<(u32, StateId), threads::ThreadParts>,
    /// Thread states whose uncertain tokens overflowed at some depth (see [`threads`]):
    /// at any depth they take their own mask under their real stack, without parts.
    overflowing: FastSet<StateId>,
    /// Mask of every usable token (the mask of [`TOP`]); empty until first needed.
    all_usable: Option<Arc<[u32]>>,
    /// Per configuration: the characters that lead it back to itself, when they are
    /// enough for the class-loop walk (see [`Lazy::loop_class`]).
    loop_classes: FastMap<ConfigId, Option<CharClass>>,
    /// Return states of calls to the NFA's key rules ([`Nfa::key_rules`]): a thread whose
    /// top frame returns to one is inside an "other key" rule (see [`threads`]).
    key_ret: FastSet<StateId>,
    /// Per key-trie state, per text written from it: whether the text ends at one of the
    /// trie's keys (a fact of the automaton, for the key-loop checks of `crate::unique`);
    /// at most [`MAX_KEY_ENDS`] texts, then cleared.
    key_ends: FastMap<StateId, FastMap<Box<[u8]>, bool>>,
    /// Texts held in `key_ends`, and their bytes.
    key_ends_len: (usize, usize),
    /// Pairs of configurations known to agree on every continuation that completes a
    /// UTF-8 character (see [`Lazy::agree_within_char`]).
    char_equiv: FastMap<(ConfigId, ConfigId), bool>,
    /// Configurations whose masks were computed, one thread under a non-empty stack each,
    /// by `(stack, state signature)` (see [`Lazy::equivalent_mask`]); the latest
    /// [`PEERS_PER_SIGNATURE`] per key.
    mask_peers: FastMap<donor::PeerKey, Vec<ConfigId>>,
    /// Reused buffers of the state bisimulation (see [`Lazy::equivalent_mask`]).
    equiv: donor::EquivScratch,
    /// Token-budget planning (see [`budget`]).
    budget: budget::BudgetMemo,
    /// Threads held by all configurations (for [`Lazy::heap_bytes`]).
    config_threads: usize,
    /// Closure visits left to the current call ([`MAX_CALL_VISITS`], refilled by
    /// [`Lazy::begin_call`]).
    visits_left: u64,
    /// A closure ran past [`MAX_CLOSURE_VISITS`] or a call past [`MAX_CALL_VISITS`]: the
    /// transitions computed since may be cut short, so none is trusted again.
    pub(crate) poisoned: bool,
    /// A call was not followed because it would nest past [`MAX_STACK_DEPTH`].
    pub(crate) depth_capped: bool,
}

impl Lazy {
    pub fn new(nfa: &Nfa, mask_budget: usize, max_configs: usize) -> Self {
        let (byte_class, stride) = byte_classes(nfa);
        let mut l = Lazy {
            stacks: vec![(0, 0, 0)],
            stack_cost: vec![0],
            stack_map: FastMap::default(),
            configs: Vec::new(),
            config_map: FastMap::default(),
            config_next: Vec::new(),
            visited: FastSet::default(),
            seen_gen: vec![0; nfa.states.len()],
            seen_stk: vec![0; nfa.states.len()],
            closure_gen: 0,
            work: Vec::new(),
            out_buf: Vec::new(),
            seeds_buf: Vec::new(),
            trans: Vec::new(),
            byte_class,
            stride,
            masks: Vec::new(),
            scratch: Vec::new(),
            plain_succ: Vec::new(),
            chain_rep: FastMap::default(),
            state_rep: Vec::new(),
            short_horizon: false,
            short_only: FastSet::default(),
            stack_short: Vec::new(),
            horizon: usize::MAX,
            stack_rep: vec![0],
            config_rep: Vec::new(),
            mask_bytes: 0,
            mask_budget,
            max_configs,
            config_threads: 0,
            visits_left: MAX_CALL_VISITS,
            poisoned: false,
            depth_capped: false,
            sentinels: FastMap::default(),
            thread_parts: FastMap::default(),
            overflowing: FastSet::default(),
            all_usable: None,
            loop_classes: FastMap::default(),
            key_ends: FastMap::default(),
            key_ends_len: (0, 0),
            key_ret: FastSet::default(),
            char_equiv: FastMap::default(),
            mask_peers: FastMap::default(),
            equiv: donor::EquivScratch::default(),
            budget: budget::BudgetMemo::default(),
        };
        // Room for the configurations of a typical grammar's first masks: growing these
        // vectors one doubling at a time copied them over and over (untouched capacity
        // costs no memory until used).
        l.trans.reserve(INITIAL_CONFIGS * stride);
        l.configs.reserve(INITIAL_CONFIGS);
        l.config_next.reserve(INITIAL_CONFIGS);
        l.masks.reserve(INITIAL_CONFIGS);
        l.plain_succ.reserve(INITIAL_CONFIGS);
        l.config_rep.reserve(INITIAL_CONFIGS);
        l.config_map.reserve(INITIAL_CONFIGS);
        l.push_config(Box::new([]), false, u32::MAX);
        // TOP: a placeholder thread no real configuration has; it is never stepped (its
        // row leads back to itself) nor given to a matcher.
        let top = l.push_config(Box::new([(u32::MAX, u32::MAX)]), false, 0);
        l.trans[top as usize * stride..(top as usize + 1) * stride].fill(top);
        l.plain_succ[top as usize] = top;
        l.config_rep[top as usize] = top;
        l
    }

    fn config_hash(threads: &[(u32, StateId)], accept: bool) -> u64 {
        let mut h = FastHasher::default();
        h.write_u64(accept as u64);
        for &(a, b) in threads {
            h.write_u64((a as u64) << 32 | b as u64);
        }
        h.finish()
    }

    /// The configuration with these sorted, deduplicated threads, interned.
    fn intern(&mut self, nfa: &Nfa, threads: &[(u32, StateId)], accept: bool) -> ConfigId {
        let h = Self::config_hash(threads, accept);
        let mut id = self.config_map.get(&h).copied().unwrap_or(UNKNOWN);
        while id != UNKNOWN {
            let cfg = &self.configs[id as usize];
            if cfg.accept == accept && *cfg.threads == *threads {
                return id;
            }
            id = self.config_next[id as usize];
        }
        let mut min_bytes = if accept { 0 } else { u32::MAX };
        for &(stk, s) in threads {
            if s == MARK {
                continue;
            }
            min_bytes =
                min_bytes.min(nfa.dist[s as usize].saturating_add(self.stack_cost[stk as usize]));
        }
        self.push_config(threads.into(), accept, min_bytes)
    }

    fn push_config(
        &mut self,
        threads: Box<[(u32, StateId)]>,
        accept: bool,
        min_bytes: u32,
    ) -> ConfigId {
        let id = self.configs.len() as ConfigId;
        let h = Self::config_hash(&threads, accept);
        let prev = self.config_map.insert(h, id).unwrap_or(UNKNOWN);
        self.config_next.push(prev);
        self.config_threads += threads.len();
        self.configs.push(Config {
            threads,
            accept,
            min_bytes,
        });
        self.trans.extend(std::iter::repeat_n(UNKNOWN, self.stride));
        self.masks.push(None);
        self.plain_succ.push(UNKNOWN);
        self.config_rep.push(UNKNOWN);
        id
    }

    /// Whether `text`, written from the key-trie state `q`, ends at one of the trie's keys:
    /// `walk` tells the first time, remembered after (the automaton does not change).
    pub fn key_end(&mut self, q: StateId, text: &[u8], walk: impl FnOnce() -> bool) -> bool {
        if let Some(&v) = self.key_ends.get(&q).and_then(|m| m.get(text)) {
            return v;
        }
        let v = walk();
        if self.key_ends_len.0 >= MAX_KEY_ENDS {
            self.key_ends.clear();
            self.key_ends_len = (0, 0);
        }
        self.key_ends_len.0 += 1;
        self.key_ends_len.1 += text.len();
        self.key_ends.entry(q).or_default().insert(text.into(), v);
        v
    }

    /// Whether a thread of `c` is inside a key-loop object (`Nfa::key_loops`): at one of its
    /// states, or below a call that returns into one.
    pub fn in_key_loop_object(&self, nfa: &Nfa, c: ConfigId) -> bool {
        self.configs[c as usize]
            .threads
            .iter()
            .any(|&(mut stk, s)| {
                if nfa.in_key_loop(s) {
                    return true;
                }
                while stk != 0 {
                    let (parent, ret, _) = self.stacks[stk as usize];
                    if nfa.in_key_loop(ret) {
                        return true;
                    }
                    stk = parent;
                }
                false
            })
    }

    /// Remembers the return states of calls to the NFA's key rules, whose threads take
    /// their masks in shared parts from their first key position on (see [`threads`]).
    pub fn mark_key_calls(&mut self, nfa: &Nfa) {
        if nfa.key_rules.is_empty() {
            return;
        }
        let rules: FastSet<u32> = nfa.key_rules.iter().copied().collect();
        for st in &nfa.states {
            for &(r, ret) in &st.calls {
                if rules.contains(&r) {
                    self.key_ret.insert(ret);
                }
            }
        }
    }

    /// Every plain character leads `c` back to `c`, or to a configuration whose mask
    /// representative is `c` (then `c` behaves like a loop for any token).
    fn is_plain_loop(&mut self, nfa: &Nfa, c: ConfigId) -> bool {
        match self.plain_successor(nfa, c) {
            s if s == c => true,
            NO_SUCC | DEAD => false,
            s => self.mask_rep(nfa, s) == c,
        }
    }

    fn push_stack(&mut self, nfa: &Nfa, parent: u32, ret: StateId) -> Option<u32> {
        if let Some(&id) = self.stack_map.get(&(parent, ret)) {
            return Some(id);
        }
        let depth = self.stacks[parent as usize].2 + 1;
        if depth > MAX_STACK_DEPTH {
            self.depth_capped = true;
            return None;
        }
        let id = self.stacks.len() as u32;
        self.stacks.push((parent, ret, depth));
        let cost = self.stack_cost[parent as usize].saturating_add(nfa.dist[ret as usize]);
        self.stack_cost.push(cost);
        self.stack_map.insert((parent, ret), id);
        Some(id)
    }

    /// `c` with only the threads whose state `keep` accepts (`c` itself when it keeps them
    /// all, `DEAD` when none).
    pub fn retain_threads(
        &mut self,
        nfa: &Nfa,
        c: ConfigId,
        keep: impl Fn(StateId) -> bool,
    ) -> ConfigId {
        let threads = &self.configs[c as usize].threads;
        if threads.iter().all(|&(_, s)| keep(s)) {
            return c;
        }
        let seeds: Vec<(u32, StateId)> =
            threads.iter().copied().filter(|&(_, s)| keep(s)).collect();
        if seeds.is_empty() {
            DEAD
        } else {
            self.closure(nfa, &seeds)
        }
    }

    /// Epsilon closure of `seeds`, interned.
    pub fn closure(&mut self, nfa: &Nfa, seeds: &[(u32, StateId)]) -> ConfigId {
        if self.poisoned {
            return DEAD;
        }
        let mut visited = std::mem::take(&mut self.visited);
        visited.clear();
        self.closure_gen = self.closure_gen.wrapping_add(1);
        if self.closure_gen == 0 {
            // Wrapped: forget every stamp (0 is never a live generation).
            self.seen_gen.fill(0);
            self.closure_gen = 1;
        }
        let gen = self.closure_gen;
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        work.extend_from_slice(seeds);
        let mut out = std::mem::take(&mut self.out_buf);
        out.clear();
        let mut accept = false;
        let mut top = false;
        let cap = (MAX_CLOSURE_VISITS + nfa.states.len()) as u64;
        let mut visits = 0u64;
        while let Some((stk, s)) = work.pop() {
            visits += 1;
            if visits > cap || visits > self.visits_left {
                self.poisoned = true;
                break;
            }
            let si = s as usize;
            if self.seen_gen[si] != gen {
                self.seen_gen[si] = gen;
                self.seen_stk[si] = stk;
            } else if self.seen_stk[si] == stk || !visited.insert((stk, s)) {
                continue;
            }
            let st = &nfa.states[s as usize];
            if !st.bytes.is_empty() {
                out.push((stk, s));
            }
            for &e in &st.eps {
                work.push((stk, e));
            }
            for &(r, ret) in &st.calls {
                if let Some(ns) = self.push_stack(nfa, stk, ret) {
                    work.push((ns, nfa.rules[r as usize].start));
                }
            }
            if st.end_of.is_some() {
                if stk == 0 {
                    if st.end_of == Some(0) {
                        accept = true;
                    }
                } else {
                    let (parent, ret, _) = self.stacks[stk as usize];
                    match ret {
                        // Returning into a sentinel frame (mask computations only).
                        SENT_UPPER => top = true,
                        SENT_LOWER => {}
                        SENT_MARK => out.push((0, MARK)),
                        _ => work.push((parent, ret)),
                    }
                }
            }
        }
        self.visited = visited;
        self.work = work;
        self.visits_left = self.visits_left.saturating_sub(visits);
        if self.poisoned {
            self.out_buf = out;
            return DEAD;
        }
        out.sort_unstable();
        out.dedup();
        let id = if top {
            TOP
        } else if out.is_empty() && !accept {
            DEAD
        } else {
            self.intern(nfa, &out, accept)
        };
        self.out_buf = out;
        id
    }

    /// Starts one call into the automaton: its closures may visit [`MAX_CALL_VISITS`]
    /// threads together.
    pub fn begin_call(&mut self) {
        self.visits_left = MAX_CALL_VISITS;
    }

    /// The configuration at the start of the root rule.
    pub fn start(&mut self, nfa: &Nfa) -> ConfigId {
        self.closure(nfa, &[(0, nfa.rules[0].start)])
    }

    /// One byte step.
    #[inline]
    pub fn step(&mut self, nfa: &Nfa, c: ConfigId, b: u8) -> ConfigId {
        let t = self.trans[c as usize * self.stride + self.byte_class[b as usize] as usize];
        if t != UNKNOWN {
            return t;
        }
        self.step_slow(nfa, c, b)
    }

    /// Computes the move of `c` on `b` and stores it for every byte of the interval around
    /// `b` on which `c`'s set of moves is the same (one closure serves the whole interval,
    /// which is a run of whole byte classes: its ends are ends of byte ranges).
    #[cold]
    fn step_slow(&mut self, nfa: &Nfa, c: ConfigId, b: u8) -> ConfigId {
        let mut lo_cut = 0u8;
        let mut hi_cut = 255u8;
        let mut seeds = std::mem::take(&mut self.seeds_buf);
        seeds.clear();
        for &(stk, s) in self.configs[c as usize].threads.iter() {
            if s == MARK {
                continue;
            }
            for &(lo, hi, t) in &nfa.states[s as usize].bytes {
                if lo <= b && b <= hi {
                    seeds.push((stk, t));
                    lo_cut = lo_cut.max(lo);
                    hi_cut = hi_cut.min(hi);
                } else if hi < b {
                    lo_cut = lo_cut.max(hi + 1);
                } else {
                    hi_cut = hi_cut.min(lo - 1);
                }
            }
        }
        let n = if seeds.is_empty() {
            DEAD
        } else {
            self.closure(nfa, &seeds)
        };
        self.seeds_buf = seeds;
        // Past the limit, configurations are still interned (matchers need ids) but rows
        // of new ones are not remembered.
        if (c as usize) < self.max_configs {
            let base = c as usize * self.stride;
            let (lo, hi) = (
                self.byte_class[lo_cut as usize] as usize,
                self.byte_class[hi_cut as usize] as usize,
            );
            self.trans[base + lo..=base + hi].fill(n);
        }
        n
    }

    /// Steps through `bytes`; stops early at `DEAD`.
    pub fn step_bytes(&mut self, nfa: &Nfa, mut c: ConfigId, bytes: &[u8]) -> ConfigId {
        for &b in bytes {
            c = self.step(nfa, c, b);
            if c == DEAD {
                break;
            }
        }
        c
    }

    /// Bytes with a move out of `c`, as a 256-bit set.
    pub fn next_bytes(&self, nfa: &Nfa, c: ConfigId) -> [u64; 4] {
        let mut set = [0u64; 4];
        for &(_, s) in self.configs[c as usize].threads.iter() {
            // Skips the MARK thread (and TOP's placeholder): no moves of their own.
            let Some(st) = nfa.states.get(s as usize) else {
                continue;
            };
            for &(lo, hi, _) in &st.bytes {
                for b in lo..=hi {
                    set[(b >> 6) as usize] |= 1u64 << (b & 63);
                }
            }
        }
        set
    }

    /// Writes the token mask of `c` (special tokens and EOS excluded) into `out`.
    ///
    /// A wide configuration that is not a plain-string loop borrows the mask of a *donor*:
    /// the configuration most plain characters lead to (e.g. "any key" beside declared key
    /// prefixes, or "any string" beside a pattern's first characters). One walk follows the
    /// trie from both at once and stops in every subtree where they reach the same
    /// configuration, since there the donor's bits are already right.
    pub fn fill_mask(&mut self, nfa: &Nfa, vocab: &TokenVocab, c: ConfigId, out: &mut [u32]) {
        let words = vocab.mask_words();
        let out = &mut out[..words];
        if let Some(m) = &self.masks[c as usize] {
            out.copy_from_slice(m);
            return;
        }
        let rep = self.mask_rep(nfa, c);
        if rep != c {
            self.fill_mask(nfa, vocab, rep, out);
            if self.fix_long_tokens(nfa, vocab, c, out) {
                self.store(c, out);
            } else {
                // Share the representative's mask (no extra budget).
                self.masks[c as usize] = self.masks[rep as usize].clone();
            }
            return;
        }
        out.fill(0);
        if c == TOP {
            out.copy_from_slice(&self.all_usable(vocab));
            return;
        }
        let key = self.peer_key(nfa, c);
        if let Some(m) = self.equivalent_mask(nfa, c, key) {
            // The same futures as an earlier configuration: share its mask.
            out.copy_from_slice(&m);
            self.masks[c as usize] = Some(m);
            return;
        }
        if self.split_by_threads(nfa, c) {
            self.fill_by_threads(nfa, vocab, c, out);
        } else if let Some((base, rest)) = self.cached_part(nfa, c) {
            // `c` = `base` ∪ `rest` as thread sets, and `base`'s mask is known.
            let m = self.masks[base as usize].clone().unwrap_or_default();
            self.fill_mask(nfa, vocab, rest, out);
            or_into(out, &m);
        } else if c != DEAD {
            match self.donor(nfa, c) {
                Some(g) => {
                    out.copy_from_slice(&self.donor_mask(nfa, vocab, g));
                    self.paired_walk(nfa, vocab, c, g, out);
                }
                None => self.walk(nfa, vocab, c, out),
            }
        }
        if self.store(c, out) {
            self.add_mask_peer(c, key);
        }
    }

    /// Caches `bits` as the mask of `c` while the budget allows (`false`: over it).
    fn store(&mut self, c: ConfigId, bits: &[u32]) -> bool {
        let size = bits.len() * 4;
        if self.mask_bytes + size <= self.mask_budget {
            self.mask_bytes += size;
            self.masks[c as usize] = Some(Arc::from(bits));
            return true;
        }
        false
    }

    /// Walks the token trie from `c`, setting allowed tokens in `out` (zeroed by the
    /// caller). Plain-string configurations take precomputed token sets and walk only the
    /// tokens that leave plain characters; so do configurations that a class of characters
    /// leads back to (see [`Lazy::loop_class`]).
    fn walk(&mut self, nfa: &Nfa, vocab: &TokenVocab, c: ConfigId, out: &mut [u32]) {
        let plain_loop = self.is_plain_loop(nfa, c);
        let trie = if plain_loop {
            // Every plain character leads back to `c` (or to a configuration with the same
            // futures for any token): plain tokens are allowed, any other token iff its
            // suffix after the plain prefix is.
            let (plain, long, suffix) = vocab.plain_loop_parts();
            out.copy_from_slice(plain);
            for &id in long {
                out[(id >> 5) as usize] |= 1u32 << (id & 31);
            }
            suffix
        } else if let Some(parts) = self
            .loop_class(nfa, c)
            .and_then(|cls| vocab.class_loop_parts(cls))
        {
            // Every class character leads back to `c`: tokens made of class characters
            // are allowed, tokens that may start with one are decided by their tail after
            // the class prefix, and the others by the full trie.
            out.copy_from_slice(&parts.all_in);
            self.walk_trie(nfa, vocab.trie(), c, out, Some(&parts.skip_root));
            self.walk_trie(nfa, &parts.tails, c, out, None);
            // The class may loop through representatives: long tokens are stepped.
            self.fix_long_tokens(nfa, vocab, c, out);
            return;
        } else {
            match self.plain_run(nfa, c) {
                // Plain tokens of up to `k` characters are allowed without a walk; longer
                // ones are not (the run ends in DEAD), and the rest trie holds the others.
                Some(k) if k > 0 => {
                    let (plain, rest) = vocab.plain_split(k);
                    out.copy_from_slice(plain);
                    rest
                }
                _ => vocab.trie(),
            }
        };
        self.walk_trie(nfa, trie, c, out, None);
        if plain_loop && self.plain_successor(nfa, c) != c {
            // A loop through a representative: long tokens are stepped.
            self.fix_long_tokens(nfa, vocab, c, out);
        }
    }

    /// Walks `trie` from `c`, setting the ids of every node reached alive in `out`;
    /// subtrees whose first byte is in `skip_root` are left out.
    fn walk_trie(
        &mut self,
        nfa: &Nfa,
        trie: &crate::vocab::TokenTrie,
        c: ConfigId,
        out: &mut [u32],
        skip_root: Option<&[u64; 4]>,
    ) {
        let nodes = &trie.nodes;
        let mut cfg_at = [DEAD; 1024];
        cfg_at[0] = c;
        let mut i = 0usize;
        while i < nodes.len() {
            let n = &nodes[i];
            let d = n.depth as usize;
            if d == 1 {
                if let Some(skip) = skip_root {
                    if (skip[(n.byte >> 6) as usize] >> (n.byte & 63)) & 1 == 1 {
                        i = n.next as usize;
                        continue;
                    }
                }
            }
            let nc = self.step(nfa, cfg_at[d - 1], n.byte);
            if nc == DEAD {
                i = n.next as usize;
                continue;
            }
            if nc == TOP {
                set_ids(out, trie.subtree_ids(i));
                i = n.next as usize;
                continue;
            }
            cfg_at[d] = nc;
            set_ids(out, trie.own_ids(i));
            i += 1;
        }
    }

    /// The characters that lead `c` back to itself (or to a configuration whose mask
    /// representative is `c`), when at least `CLASS_MIN_ASCII` printable ASCII ones do
    /// (cached): ASCII bytes one by one, and non-ASCII characters only all together (each
    /// valid multi-byte character must lead back to `c`).
    fn loop_class(&mut self, nfa: &Nfa, c: ConfigId) -> Option<CharClass> {
        if let Some(&k) = self.loop_classes.get(&c) {
            return k;
        }
        let mut ascii = 0u128;
        let mut printable = 0u32;
        for b in 0u8..0x80 {
            let s = self.step(nfa, c, b);
            if self.same_rep(nfa, s, c) {
                ascii |= 1u128 << b;
                printable += (0x20..0x7F).contains(&b) as u32;
            }
        }
        let k = (printable >= CLASS_MIN_ASCII).then(|| CharClass {
            ascii,
            non_ascii: self.utf8_chars_lead_to(nfa, c, c, true),
        });
        self.loop_classes.insert(c, k);
        k
    }

    /// The configuration every plain character leads to from `c` (`NO_SUCC` when they
    /// diverge), cached.
    fn plain_successor(&mut self, nfa: &Nfa, c: ConfigId) -> u32 {
        match self.plain_succ[c as usize] {
            UNKNOWN => {
                let s = self.unique_plain_successor(nfa, c).unwrap_or(NO_SUCC);
                self.plain_succ[c as usize] = s;
                s
            }
            s => s,
        }
    }

    /// How many plain characters in a row `c` can take when every plain character leads
    /// to one and the same configuration at each step: `Some(k)` when the run is exact (it
    /// ends in DEAD after `k`, loops, or passes `MAX_PLAIN_CHARS`), `None` otherwise.
    fn plain_run(&mut self, nfa: &Nfa, c: ConfigId) -> Option<usize> {
        let mut x = c;
        let mut seen: Vec<ConfigId> = Vec::new();
        for k in 0..=crate::vocab::MAX_PLAIN_CHARS {
            if seen.contains(&x) {
                return Some(crate::vocab::MAX_PLAIN_CHARS);
            }
            seen.push(x);
            match self.plain_successor(nfa, x) {
                NO_SUCC => return None,
                DEAD => return Some(k),
                y => x = y,
            }
        }
        Some(crate::vocab::MAX_PLAIN_CHARS)
    }

    /// The configuration every plain character (any valid UTF-8 character except `"`,
    /// `\\` and controls) leads to from `c`, when it is the same for all of them.
    fn unique_plain_successor(&mut self, nfa: &Nfa, c: ConfigId) -> Option<ConfigId> {
        let target = self.step(nfa, c, b'a');
        for b in 0x20u8..=0x7F {
            if b != b'"' && b != b'\\' && self.step(nfa, c, b) != target {
                return None;
            }
        }
        self.utf8_chars_lead_to(nfa, c, target, false)
            .then_some(target)
    }

    /// Every valid multi-byte UTF-8 character leads `c` to `target` (with `up_to_rep`: or
    /// to a configuration whose mask representative is `target`).
    fn utf8_chars_lead_to(
        &mut self,
        nfa: &Nfa,
        c: ConfigId,
        target: ConfigId,
        up_to_rep: bool,
    ) -> bool {
        // (configuration, bytes still needed as a class).
        let mut seen: FastSet<(ConfigId, u8)> = FastSet::default();
        let mut work: Vec<(ConfigId, u8)> = Vec::new();
        for lead in 0xC2u8..=0xF4 {
            work.push((self.step(nfa, c, lead), utf8_class(lead)));
        }
        while let Some((x, u)) = work.pop() {
            if x == DEAD {
                if target == DEAD {
                    continue;
                }
                return false;
            }
            if !seen.insert((x, u)) {
                continue;
            }
            let (lo, hi, next) = utf8_cont(u);
            for b in lo..=hi {
                let y = self.step(nfa, x, b);
                if next == 0 {
                    if y != target && !(up_to_rep && self.same_rep(nfa, y, target)) {
                        return false;
                    }
                } else {
                    work.push((y, next));
                }
            }
        }
        true
    }

    /// Rough heap size in bytes (for cache limits and reports).
    pub fn heap_bytes(&self) -> usize {
        self.trans.len() * 4
            + self.mask_bytes
            + self.configs.len() * 64
            + self.config_threads * 8
            + (self.visited.capacity() + self.work.capacity() + self.out_buf.capacity()) * 8
            + self.stacks.len() * 24
            + self.seen_gen.len() * 8
            + self.equiv.heap_bytes()
            + self.budget.heap_bytes()
            + self.key_ends_len.0 * 48
            + self.key_ends_len.1
    }
}

/// The byte classes of `nfa` (see [`Lazy::byte_class`]) and their number: a class starts at
/// byte 0 and at every byte where a byte range of some state starts or ends.
fn byte_classes(nfa: &Nfa) -> ([u8; 256], usize) {
    let mut starts = [false; 256];
    starts[0] = true;
    for st in &nfa.states {
        for &(lo, hi, _) in &st.bytes {
            starts[lo as usize] = true;
            if hi < 255 {
                starts[hi as usize + 1] = true;
            }
        }
    }
    let mut class = [0u8; 256];
    let mut k = 0u8;
    for b in 1..256 {
        k += starts[b] as u8;
        class[b] = k;
    }
    (class, k as usize + 1)
}

/// `out |= m`, word by word.
fn or_into(out: &mut [u32], m: &[u32]) {
    for (o, &x) in out.iter_mut().zip(m) {
        *o |= x;
    }
}

/// Sets the bits of `ids` in `out`.
fn set_ids(out: &mut [u32], ids: &[u32]) {
    for &id in ids {
        out[(id >> 5) as usize] |= 1u32 << (id & 31);
    }
}

/// Continuation class of a UTF-8 lead byte (see [`utf8_cont`]).
fn utf8_class(lead: u8) -> u8 {
    match lead {
        0xC2..=0xDF => 2,
        0xE0 => 5,
        0xED => 6,
        0xE1..=0xEF => 3,
        0xF0 => 7,
        0xF4 => 8,
        _ => 4,
    }
}

/// For a continuation class: the allowed byte range of the next byte and the class after
/// it (0: the character is complete).
fn utf8_cont(u: u8) -> (u8, u8, u8) {
    match u {
        2 => (0x80, 0xBF, 0),
        3 => (0x80, 0xBF, 2),
        4 => (0x80, 0xBF, 3),
        5 => (0xA0, 0xBF, 2),
        6 => (0x80, 0x9F, 2),
        7 => (0x90, 0xBF, 3),
        _ => (0x80, 0x8F, 3),
    }
}

/// The bytes of a set from [`Lazy::next_bytes`], in increasing order.
pub(crate) fn set_bytes(set: [u64; 4]) -> impl Iterator<Item = u8> {
    set.into_iter().enumerate().flat_map(|(wi, w)| {
        let mut w = w;
        std::iter::from_fn(move || {
            (w != 0).then(|| {
                let b = (wi as u32 * 64 + w.trailing_zeros()) as u8;
                w &= w - 1;
                b
            })
        })
    })
}
