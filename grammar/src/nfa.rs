//! The one representation every input compiles to: a byte-level NFA whose states may also
//! *call* a rule (a sub-NFA with its own start and end state) and resume at a return state.
//! This is a recursive transition network: regular parts stay flat, recursion (JSON Schema
//! `$ref` cycles, GBNF rules) uses the call stack.

use crate::CompileError;
use std::collections::HashMap;

mod passes;

/// Index of an NFA state.
pub(crate) type StateId = u32;
/// Index of a rule.
pub(crate) type RuleId = u32;

/// One NFA state: byte-range moves, epsilon moves and calls.
#[derive(Clone, Debug, Default)]
pub(crate) struct State {
    /// `(lo, hi, target)`: on any byte in `lo..=hi`, go to `target`.
    pub bytes: Vec<(u8, u8, StateId)>,
    /// Epsilon moves.
    pub eps: Vec<StateId>,
    /// `(rule, ret)`: run `rule` from its start; when it reaches its end, continue at `ret`.
    pub calls: Vec<(RuleId, StateId)>,
    /// `Some(rule)` when this state is the end state of `rule`.
    pub end_of: Option<RuleId>,
}

/// A rule: start and end state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule {
    pub start: StateId,
    pub end: StateId,
}

/// Not a product cell (a helper state of a [`CountedProduct`]: escapes, the exit).
pub(crate) const NO_CELL: (u32, u32) = (u32::MAX, u32::MAX);

/// A regex automaton × character counter product whose counts run from 0 to `cap`
/// (`regex::emit_hir_len` with a maximum): its states are `first..first + cells.len()`.
#[derive(Clone, Debug)]
pub(crate) struct CountedProduct {
    /// The text must have at least this many characters.
    pub min: u32,
    /// And at most this many.
    pub cap: u32,
    /// The longest shortest completion: from every regex state that can reach a match,
    /// some text of at most `slack` characters reaches one.
    pub slack: u32,
    /// The first NFA state of the product.
    pub first: StateId,
    /// Per state from `first` on: `(regex state, count)`, or [`NO_CELL`].
    pub cells: Vec<(u32, u32)>,
}

/// A JSON string whose `maxLength` the matcher enforces by counting characters, where a
/// regex × count product would be too large (`json/types.rs`, `crate::length`): states
/// `lo..hi` are its body rule's — the string's characters, inline (no calls), then the
/// closing quote — and no text through them may have more than `max` characters.
#[derive(Clone, Debug)]
pub(crate) struct LongString {
    /// First state (the rule's start).
    pub lo: StateId,
    /// One past the last state.
    pub hi: StateId,
    /// The rule's end state.
    pub end: StateId,
    /// The state after the closing quote: the move into it counts no character.
    pub close: StateId,
    /// Most characters.
    pub max: u32,
    /// Per state from `lo`: fewest characters from it to the closing quote (continuation
    /// bytes and the quote count none; `u32::MAX`: none), computed by [`Builder::finish`].
    pub chars_left: Vec<u32>,
    /// Per state from `lo`: the largest finite `chars_left` of the states it reaches
    /// (itself included): after any text from it, at most this many characters are needed.
    pub reach: Vec<u32>,
}

impl LongString {
    /// Fewest characters from `s` (in `lo..hi`) to the closing quote.
    pub fn chars_left(&self, s: StateId) -> u32 {
        self.chars_left[(s - self.lo) as usize]
    }

    /// See [`LongString::reach`].
    pub fn reach(&self, s: StateId) -> u32 {
        self.reach[(s - self.lo) as usize]
    }

    /// A thread at `s` can still close with `used` characters written.
    pub fn fits(&self, s: StateId, used: u32) -> bool {
        let left = self.chars_left(s);
        left != u32::MAX && used.saturating_add(left) <= self.max
    }

    /// 0-1 breadth-first search backwards from the end, within the range. A move weighs
    /// one character unless it takes a UTF-8 continuation byte, the closing quote, or a byte
    /// inside an escape (after the backslash, which is the character): which states are
    /// inside an escape is found forwards from the start.
    fn compute(&mut self, states: &[State]) {
        let n = (self.hi - self.lo) as usize;
        let inside = |t: StateId| (self.lo..self.hi).contains(&t);
        // Escape bytes still to come at each state: 0 (between characters), 5 (after the
        // backslash) or the hex digits left of `\u`. A state reached both ways counts as
        // between characters (its moves then weigh more: stricter, never looser).
        const UNSEEN: u8 = u8::MAX;
        let mut esc = vec![UNSEEN; n];
        let mut work = vec![self.lo];
        esc[0] = 0;
        while let Some(s) = work.pop() {
            let e = esc[(s - self.lo) as usize];
            let st = &states[s as usize];
            let mut visit = |t: StateId, te: u8, work: &mut Vec<StateId>| {
                if !inside(t) {
                    return;
                }
                let slot = &mut esc[(t - self.lo) as usize];
                if *slot == UNSEEN {
                    *slot = te;
                    work.push(t);
                } else if *slot != te && *slot != 0 {
                    *slot = 0;
                    work.push(t);
                }
            };
            for &(lo, hi, t) in &st.bytes {
                let te = match e {
                    5 if lo == b'u' && hi == b'u' => 4,
                    5 | 1 => 0,
                    2..=4 => e - 1,
                    _ if lo == b'\\' && hi == b'\\' => 5,
                    _ => 0,
                };
                visit(t, te, &mut work);
            }
            for &t in &st.eps {
                visit(t, e, &mut work);
            }
        }
        let mut rev: Vec<Vec<(StateId, u32)>> = vec![Vec::new(); n];
        for s in self.lo..self.hi {
            let st = &states[s as usize];
            let between = matches!(esc[(s - self.lo) as usize], 0 | UNSEEN);
            for &(lo, _, t) in &st.bytes {
                if inside(t) {
                    let w = between && !(0x80..0xC0).contains(&lo) && t != self.close;
                    rev[(t - self.lo) as usize].push((s, u32::from(w)));
                }
            }
            for &t in &st.eps {
                if inside(t) {
                    rev[(t - self.lo) as usize].push((s, 0));
                }
            }
        }
        let mut d = vec![u32::MAX; n];
        let mut dq = std::collections::VecDeque::new();
        d[(self.end - self.lo) as usize] = 0;
        dq.push_back(self.end);
        while let Some(t) = dq.pop_front() {
            let dt = d[(t - self.lo) as usize];
            for &(s, w) in &rev[(t - self.lo) as usize] {
                let i = (s - self.lo) as usize;
                if dt + w < d[i] {
                    d[i] = dt + w;
                    if w == 0 {
                        dq.push_front(s);
                    } else {
                        dq.push_back(s);
                    }
                }
            }
        }
        // Backwards again: a state reaches what its successors reach (values only grow, up
        // to the largest finite distance, so each state is pushed that often at most).
        let mut reach: Vec<u32> = d
            .iter()
            .map(|&x| if x == u32::MAX { 0 } else { x })
            .collect();
        let mut work: Vec<StateId> = (self.lo..self.hi).collect();
        while let Some(t) = work.pop() {
            let rt = reach[(t - self.lo) as usize];
            for &(s, _) in &rev[(t - self.lo) as usize] {
                let i = (s - self.lo) as usize;
                if reach[i] < rt {
                    reach[i] = rt;
                    work.push(s);
                }
            }
        }
        self.reach = reach;
        self.chars_left = d;
    }
}

/// Limits applied while building.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    pub max_states: usize,
    pub deadline: Option<std::time::Instant>,
}

/// Builds an NFA. Fragment helpers take an entry state and return the exit state.
pub(crate) struct Builder {
    pub states: Vec<State>,
    pub rules: Vec<Rule>,
    /// Rules that match one undeclared object property (`"other key": value`), called
    /// from every key position; the mask code shares their masks between positions.
    pub key_rules: Vec<RuleId>,
    /// `[lo, hi)` state ranges that are the string bodies of `uniqueItems` array items
    /// (`json/unique.rs`); the matcher enforces the uniqueness there.
    pub unique_ranges: Vec<(StateId, StateId)>,
    /// `[lo, hi)` state ranges that are whole `uniqueItems` arrays of strings whose items
    /// may run out of completions (`json/unique.rs`): the matcher also checks, inside them,
    /// that a prefix can still end as a new item.
    pub unique_arrays: Vec<(StateId, StateId)>,
    /// `[lo, hi)` state ranges that follow an item of a `uniqueItems` array whose items are
    /// compared as values (objects, `json/unique.rs`): the whitespace, `,` and `]` after
    /// an item. Right after the byte that closes an item equal to an earlier one, the
    /// matcher drops the threads there.
    pub unique_after: Vec<(StateId, StateId)>,
    /// The states right after the `[` of `uniqueItems` arrays whose items may run out of
    /// new values part-way (closed objects…, `json/unique.rs::unique_searched`): the
    /// matcher marks the arrays they open and refuses, inside them, a prefix whose every
    /// completion repeats an earlier item.
    pub searched_opens: Vec<StateId>,
    /// `[lo, hi)` state ranges of key-loop objects (`json/any_order.rs::key_loop`): their
    /// key positions and key bodies. The matcher drops the threads there at the closing
    /// quote of a key already written in the same object, and refuses, as inside
    /// `unique_arrays`, a key prefix that only earlier keys complete.
    pub key_loops: Vec<(StateId, StateId)>,
    /// The key tries of key-loop objects' optional keys: each trie's root (its rule's
    /// start) and the states its keys end at (after the closing quote).
    pub key_tries: Vec<(StateId, Vec<StateId>)>,
    /// The first complement written as a subset of itself (stricter: `json/one_of.rs`), as
    /// (keyword, pointer): a grammar that then accepts no text says so rather than that the
    /// schema is unsatisfiable.
    pub approximated: Option<(String, String)>,
    /// Regex × character-count products with a maximum (`regex::emit_hir_len`); the mask
    /// code shares masks between their counts (see [`Nfa::count_representatives`]).
    pub counted: Vec<CountedProduct>,
    /// Strings whose length the matcher counts (see [`LongString`]).
    pub long_strings: Vec<LongString>,
    /// `[lo, hi)` state ranges of free text that is no JSON (the text before tool calls,
    /// `crate::tagged`): the matcher's JSON tracking forgets it.
    pub text_ranges: Vec<(StateId, StateId)>,
    pub(crate) budget: Budget,
    checks: u32,
}

impl Builder {
    /// A builder with the root rule (rule 0) not yet defined.
    pub fn new(budget: Budget) -> Self {
        Builder {
            states: Vec::new(),
            rules: Vec::new(),
            key_rules: Vec::new(),
            unique_ranges: Vec::new(),
            unique_arrays: Vec::new(),
            unique_after: Vec::new(),
            searched_opens: Vec::new(),
            key_loops: Vec::new(),
            key_tries: Vec::new(),
            approximated: None,
            counted: Vec::new(),
            long_strings: Vec::new(),
            text_ranges: Vec::new(),
            budget,
            checks: 0,
        }
    }

    /// A fresh state.
    pub fn state(&mut self) -> Result<StateId, CompileError> {
        if self.states.len() >= self.budget.max_states {
            return Err(CompileError::TooLarge {
                states: self.states.len(),
            });
        }
        self.tick()?;
        self.states.push(State::default());
        Ok((self.states.len() - 1) as StateId)
    }

    /// Counts one step of work; every 4096th checks the deadline.
    fn tick(&mut self) -> Result<(), CompileError> {
        self.checks = self.checks.wrapping_add(1);
        if self.checks.is_multiple_of(4096) {
            self.check_deadline()?;
        }
        Ok(())
    }

    /// Fails with [`CompileError::Timeout`] once the deadline has passed.
    pub fn check_deadline(&self) -> Result<(), CompileError> {
        match self.budget.deadline {
            Some(d) if std::time::Instant::now() > d => Err(CompileError::Timeout),
            _ => Ok(()),
        }
    }

    /// The budget error, when the deadline has passed ([`CompileError::Timeout`]) or the
    /// states are used up ([`CompileError::TooLarge`]); for callers whose fragment code
    /// reports errors as text.
    pub fn budget_error(&self) -> Option<CompileError> {
        if let Err(e) = self.check_deadline() {
            return Some(e);
        }
        (self.states.len() >= self.budget.max_states).then_some(CompileError::TooLarge {
            states: self.states.len(),
        })
    }

    /// Declares a rule with fresh start and end states; its body is built later.
    pub fn new_rule(&mut self) -> Result<RuleId, CompileError> {
        let start = self.state()?;
        let end = self.state()?;
        let id = self.rules.len() as RuleId;
        self.states[end as usize].end_of = Some(id);
        self.rules.push(Rule { start, end });
        Ok(id)
    }

    /// Epsilon move.
    pub fn eps(&mut self, a: StateId, b: StateId) {
        self.states[a as usize].eps.push(b);
    }

    /// Byte-range move.
    pub fn range(&mut self, a: StateId, lo: u8, hi: u8, b: StateId) {
        self.states[a as usize].bytes.push((lo, hi, b));
    }

    /// Call `rule` from `a`; returns the state where the caller resumes.
    pub fn call(&mut self, a: StateId, rule: RuleId) -> Result<StateId, CompileError> {
        let ret = self.state()?;
        self.states[a as usize].calls.push((rule, ret));
        Ok(ret)
    }

    /// A literal byte string from `a`; returns the exit.
    pub fn lit(&mut self, mut a: StateId, bytes: &[u8]) -> Result<StateId, CompileError> {
        for &b in bytes {
            let n = self.state()?;
            self.range(a, b, b, n);
            a = n;
        }
        Ok(a)
    }

    /// Counted repetition `body{min,max}` (`max == None`: unbounded).
    pub fn repeat(
        &mut self,
        a: StateId,
        min: u64,
        max: Option<u64>,
        body: &mut dyn FnMut(&mut Builder, StateId) -> Result<StateId, CompileError>,
    ) -> Result<StateId, CompileError> {
        let mut cur = a;
        for _ in 0..min {
            self.tick()?;
            cur = body(self, cur)?;
        }
        match max {
            None => {
                let lp = self.state()?;
                self.eps(cur, lp);
                let e = body(self, lp)?;
                self.eps(e, lp);
                Ok(lp)
            }
            Some(max) => {
                let exit = self.state()?;
                self.eps(cur, exit);
                for _ in min..max {
                    self.tick()?;
                    cur = body(self, cur)?;
                    self.eps(cur, exit);
                }
                Ok(exit)
            }
        }
    }

    /// Finishes: rule 0 is the root. Trims states that cannot reach their rule's end.
    pub fn finish(self) -> Result<Nfa, CompileError> {
        self.check_deadline()?;
        let mut nfa = Nfa {
            states: self.states,
            rules: self.rules,
            key_rules: self.key_rules,
            unique_ranges: self.unique_ranges,
            unique_arrays: self.unique_arrays,
            unique_after: self.unique_after,
            searched_opens: self.searched_opens,
            open_loops: Vec::new(),
            key_loops: self.key_loops,
            key_leaves: Default::default(),
            counted: self.counted,
            long_strings: self.long_strings,
            long_room: u32::MAX,
            text_ranges: self.text_ranges,
            dist: Vec::new(),
            rule_min: Vec::new(),
        };
        nfa.unique_ranges.sort_unstable();
        nfa.unique_arrays.sort_unstable();
        nfa.unique_after.sort_unstable();
        nfa.searched_opens.sort_unstable();
        nfa.key_loops.sort_unstable();
        nfa.text_ranges.sort_unstable();
        nfa.trim(self.budget.deadline)?;
        nfa.compute_distances(self.budget.deadline)?;
        nfa.count_key_leaves(&self.key_tries);
        nfa.long_strings.sort_unstable_by_key(|l| l.lo);
        for l in &mut nfa.long_strings {
            l.compute(&nfa.states);
        }
        if !nfa.searched_opens.is_empty() {
            nfa.mark_open_loops();
        }
        nfa.long_room = nfa
            .long_strings
            .iter()
            .map(|l| l.max.saturating_sub(l.reach(l.lo)))
            .min()
            .unwrap_or(u32::MAX);
        Ok(nfa)
    }
}

/// The finished NFA. Every state with moves left after trimming can reach its rule's end.
#[derive(Debug)]
pub(crate) struct Nfa {
    pub states: Vec<State>,
    pub rules: Vec<Rule>,
    /// See [`Builder::key_rules`].
    pub key_rules: Vec<RuleId>,
    /// See [`Builder::unique_ranges`] (sorted, disjoint).
    pub unique_ranges: Vec<(StateId, StateId)>,
    /// See [`Builder::unique_arrays`] (sorted, disjoint, apart from `unique_ranges`).
    pub unique_arrays: Vec<(StateId, StateId)>,
    /// See [`Builder::unique_after`] (sorted, disjoint).
    pub unique_after: Vec<(StateId, StateId)>,
    /// See [`Builder::searched_opens`] (sorted).
    pub searched_opens: Vec<StateId>,
    /// One bit per state, only where `searched_opens` is not empty: the state loops to
    /// itself on a byte no number or whitespace has, outside counted strings and key
    /// loops — a string or key body that takes any number more characters, so from it
    /// infinitely many different values can be written ([`Nfa::in_open_loop`]).
    pub open_loops: Vec<u64>,
    /// See [`Builder::key_loops`] (sorted, disjoint, apart from the unique-item ranges).
    pub key_loops: Vec<(StateId, StateId)>,
    /// Per state inside a key-loop trie of optional keys ([`Builder::key_tries`]): how many
    /// of the trie's keys, still writable after trimming, continue from it.
    pub key_leaves: std::collections::HashMap<StateId, u32>,
    /// See [`Builder::counted`].
    pub counted: Vec<CountedProduct>,
    /// See [`Builder::long_strings`] (sorted, disjoint).
    pub long_strings: Vec<LongString>,
    /// The least `max - reach(start)` over `long_strings`: a token of at most this many bytes,
    /// minus the characters the open string already has, cannot break a length bound.
    pub long_room: u32,
    /// See [`Builder::text_ranges`] (sorted, disjoint).
    pub text_ranges: Vec<(StateId, StateId)>,
    /// Fewest bytes from a state to its rule's end (`u32::MAX`: unreachable).
    pub dist: Vec<u32>,
    /// Fewest bytes a rule can match.
    pub rule_min: Vec<u32>,
}

impl Nfa {
    /// True when matching must enforce `uniqueItems` or key-loop keys (`crate::unique`).
    pub fn has_unique(&self) -> bool {
        self.has_unique_items() || !self.key_loops.is_empty()
    }

    /// True when matching must enforce `uniqueItems`.
    pub fn has_unique_items(&self) -> bool {
        !self.unique_ranges.is_empty()
            || !self.unique_arrays.is_empty()
            || !self.unique_after.is_empty()
    }

    /// True when `s` follows an item of a `uniqueItems` array of values (see
    /// [`Builder::unique_after`]).
    pub fn in_unique_after(&self, s: StateId) -> bool {
        in_ranges(&self.unique_after, s)
    }

    /// True when `s` is a state of [`Nfa::open_loops`].
    pub fn in_open_loop(&self, s: StateId) -> bool {
        self.open_loops
            .get(s as usize >> 6)
            .is_some_and(|w| w >> (s & 63) & 1 == 1)
    }

    /// Fills [`Nfa::open_loops`]. Digits, `.`, `e`, `E`, `+`, `-` and whitespace are left
    /// out: a number's digits can spell one value many ways (`0e1`, `0e11`) and whitespace
    /// between values is no value at all. Any other byte a state takes back to itself is a
    /// character of a string or key: appending different numbers of it writes different
    /// strings.
    fn mark_open_loops(&mut self) {
        let insignificant = |b: u8| {
            b.is_ascii_digit()
                || matches!(
                    b,
                    b'.' | b'e' | b'E' | b'+' | b'-' | b' ' | b'\t' | b'\n' | b'\r'
                )
        };
        let mut bits = vec![0u64; self.states.len().div_ceil(64)];
        for (i, st) in self.states.iter().enumerate() {
            let s = i as StateId;
            let loops = st
                .bytes
                .iter()
                .any(|&(a, b, t)| t == s && (a..=b).any(|x| !insignificant(x)));
            if loops && self.long_string(s).is_none() && !self.in_key_loop(s) {
                bits[i >> 6] |= 1 << (i & 63);
            }
        }
        self.open_loops = bits;
    }

    /// True when `s` is inside the string body of a `uniqueItems` item, inside a whole
    /// `uniqueItems` array of bounded strings, or in a key-loop object's keys.
    pub fn in_unique(&self, s: StateId) -> bool {
        self.in_unique_item(s) || in_ranges(&self.key_loops, s)
    }

    /// [`Nfa::in_unique`] but for key loops.
    pub fn in_unique_item(&self, s: StateId) -> bool {
        in_ranges(&self.unique_ranges, s) || in_ranges(&self.unique_arrays, s)
    }

    /// True when `s` is a state of free text (see [`Builder::text_ranges`]).
    pub fn in_text(&self, s: StateId) -> bool {
        in_ranges(&self.text_ranges, s)
    }

    /// The counted string whose states include `s`, if any.
    pub fn long_string(&self, s: StateId) -> Option<&LongString> {
        let i = self.long_strings.partition_point(|l| l.lo <= s);
        (i > 0)
            .then(|| &self.long_strings[i - 1])
            .filter(|l| s < l.hi)
    }

    /// True when `s` is inside a whole `uniqueItems` array of bounded strings, or in a
    /// key-loop object's keys (a finite set): where an item may run out of new values.
    pub fn in_unique_array(&self, s: StateId) -> bool {
        in_ranges(&self.unique_arrays, s) || in_ranges(&self.key_loops, s)
    }

    /// Fills [`Nfa::key_leaves`] for the tries in `tries`: a key counts at its end state
    /// when that state can still reach its rule's end, and at every state before it.
    fn count_key_leaves(&mut self, tries: &[(StateId, Vec<StateId>)]) {
        for (root, ends) in tries {
            let ends: std::collections::HashSet<StateId> = ends
                .iter()
                .copied()
                .filter(|&e| self.dist.get(e as usize).is_some_and(|&d| d != u32::MAX))
                .collect();
            // Post-order over the trie's byte moves (a tree), stopping at key ends.
            let mut stack: Vec<(StateId, bool)> = vec![(*root, false)];
            while let Some((q, done)) = stack.pop() {
                if ends.contains(&q) {
                    self.key_leaves.insert(q, 1);
                    continue;
                }
                let kids: Vec<StateId> = self.states[q as usize]
                    .bytes
                    .iter()
                    .map(|&(_, _, t)| t)
                    .filter(|&t| t != q && (ends.contains(&t) || self.in_key_loop(t)))
                    .collect();
                if done {
                    let n = kids
                        .iter()
                        .map(|t| self.key_leaves.get(t).copied().unwrap_or(0))
                        .sum();
                    self.key_leaves.insert(q, n);
                } else {
                    stack.push((q, true));
                    stack.extend(kids.into_iter().map(|t| (t, false)));
                }
            }
        }
    }

    /// True when `s` is in a key-loop object's keys (see [`Builder::key_loops`]).
    pub fn in_key_loop(&self, s: StateId) -> bool {
        in_ranges(&self.key_loops, s)
    }

    /// [`Nfa::in_unique_array`] but for key loops.
    pub fn in_bounded_items(&self, s: StateId) -> bool {
        in_ranges(&self.unique_arrays, s)
    }

    /// Return states of long counted call chains that are interchangeable for any text of
    /// at most `horizon` bytes, mapped to one representative (see [`crate::lazy`]).
    ///
    /// A chain is `q_0 → q_1 → … → q_max` where every `q_k` (k < max) has no byte moves and
    /// exactly one call, always to the same rule `B` that matches at least one byte, and
    /// returns to `q_{k+1}`; `q_k` has no epsilon move for `k < min` and one epsilon move to
    /// the same exit `E` for `k ≥ min` (this is how `Builder::repeat` emits a counted
    /// string: `maxLength` strings call one shared character rule). From `q_r` the text
    /// can leave through `E` at once (`r ≥ min`) or after up to `max - r` more calls, each
    /// taking at least one byte. So for `r, r'` in `[min, max - horizon]` the futures of
    /// `(S, q_r)` and `(S, q_r')` agree on every text of at most `horizon` bytes, under any
    /// stack `S`: a token mask cannot tell them apart. Each such `q_r` maps to `q_min`.
    pub fn chain_representatives(&self, horizon: usize) -> HashMap<StateId, StateId> {
        let n = self.states.len();
        let link = |s: usize| -> Option<(RuleId, StateId)> {
            let st = &self.states[s];
            (st.bytes.is_empty()
                && st.calls.len() == 1
                && st.eps.len() <= 1
                && st.end_of.is_none()
                && self
                    .rule_min
                    .get(st.calls[0].0 as usize)
                    .copied()
                    .unwrap_or(0)
                    >= 1)
                .then(|| st.calls[0])
        };
        let mut has_pred = vec![false; n];
        for s in 0..n {
            if let Some((_, ret)) = link(s) {
                if let Some(p) = has_pred.get_mut(ret as usize) {
                    *p = true;
                }
            }
        }
        let mut out = HashMap::new();
        let mut seen = vec![false; n];
        for start in 0..n {
            if has_pred[start] || link(start).is_none() {
                continue;
            }
            // Collect the chain and the rule it calls.
            let mut chain = vec![start as StateId];
            let rule = link(start).map(|l| l.0);
            let mut cur = start;
            let mut uniform = true;
            seen[start] = true;
            while let Some((r, ret)) = link(cur) {
                if Some(r) != rule {
                    uniform = false;
                    break;
                }
                let ret_u = ret as usize;
                if ret_u >= n || seen[ret_u] {
                    uniform = false;
                    break;
                }
                seen[ret_u] = true;
                chain.push(ret);
                cur = ret_u;
            }
            if !uniform {
                continue;
            }
            // The last state: no moves but the epsilon move to the exit.
            let last = &self.states[cur];
            if !(last.bytes.is_empty()
                && last.calls.is_empty()
                && last.end_of.is_none()
                && last.eps.len() == 1)
            {
                continue;
            }
            let exit = last.eps[0];
            // `min`: the first position with the exit; every later one must have it too.
            let Some(min) = chain
                .iter()
                .position(|&q| self.states[q as usize].eps.first() == Some(&exit))
            else {
                continue;
            };
            let exits_ok = chain.iter().enumerate().all(|(k, &q)| {
                let eps = &self.states[q as usize].eps;
                if k < min {
                    eps.is_empty()
                } else {
                    eps.len() == 1 && eps[0] == exit
                }
            });
            let max = chain.len() - 1;
            if !exits_ok || max < min + horizon + 1 {
                continue;
            }
            for &q in &chain[min + 1..=max - horizon] {
                out.insert(q, chain[min]);
            }
        }
        out
    }

    /// Mask representatives of counted regex products ([`CountedProduct`]), for texts of at
    /// most `horizon` bytes: per product, its first state and, per product state, the state
    /// to use instead (itself when it has none).
    ///
    /// A product state `(q, c)` (regex state `q` after `c` characters) with
    /// `min ≤ c ≤ cap − horizon − slack` has the same future as `(q, c')` for any such `c'`
    /// on every text of at most `horizon` bytes (so at most `horizon` characters): a text
    /// that leaves the product does so with a count in `[min, cap]` either way, and one that
    /// stays in it ends at `(q', c + k)` with `k ≤ horizon`, from which a match is at most
    /// `slack` characters away, within the cap either way. Each such `(q, c)` maps to the
    /// `(q, c')` with the smallest such `c'`. Like the chain representatives, this holds
    /// under any stack.
    pub fn count_representatives(&self, horizon: usize) -> Vec<(StateId, Vec<StateId>)> {
        let mut out = Vec::new();
        for p in &self.counted {
            let hi = (p.cap as u64).saturating_sub(horizon as u64 + p.slack as u64);
            if hi <= p.min as u64 {
                continue;
            }
            let hi = hi as u32;
            let in_range = |c: u32| c >= p.min && c <= hi;
            // Per regex state: the smallest count in range (as an NFA state).
            let mut canon: HashMap<u32, (u32, StateId)> = HashMap::new();
            for (i, &(q, c)) in p.cells.iter().enumerate() {
                if (q, c) == NO_CELL || !in_range(c) {
                    continue;
                }
                let s = p.first + i as StateId;
                let e = canon.entry(q).or_insert((c, s));
                if c < e.0 {
                    *e = (c, s);
                }
            }
            let mut any = false;
            let table: Vec<StateId> = p
                .cells
                .iter()
                .enumerate()
                .map(|(i, &(q, c))| {
                    let s = p.first + i as StateId;
                    if (q, c) == NO_CELL || !in_range(c) {
                        return s;
                    }
                    let r = canon.get(&q).map_or(s, |e| e.1);
                    any |= r != s;
                    r
                })
                .collect();
            if any {
                out.push((p.first, table));
            }
        }
        out.sort_by_key(|e| e.0);
        out
    }
}

/// `s` lies in one of the sorted, disjoint `[lo, hi)` ranges.
fn in_ranges(ranges: &[(StateId, StateId)], s: StateId) -> bool {
    let i = ranges.partition_point(|&(lo, _)| lo <= s);
    i > 0 && s < ranges[i - 1].1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> Budget {
        Budget {
            max_states: 1000,
            deadline: None,
        }
    }

    #[test]
    fn trim_removes_dead_branch() {
        let mut b = Builder::new(budget());
        let r = b.new_rule().unwrap();
        let Rule { start, end } = b.rules[r as usize];
        let x = b.lit(start, b"ab").unwrap();
        b.eps(x, end);
        let _dead = b.lit(start, b"zz").unwrap(); // never reaches the end
        let nfa = b.finish().unwrap();
        assert_eq!(nfa.states[start as usize].bytes.len(), 1);
        assert_eq!(nfa.dist[start as usize], 2);
    }

    #[test]
    fn counted_call_chain_representatives() {
        let mut b = Builder::new(budget());
        let root = b.new_rule().unwrap();
        let ch = b.new_rule().unwrap();
        let Rule { start, end } = b.rules[ch as usize];
        b.range(start, b'a', b'z', end);
        let Rule { start, end } = b.rules[root as usize];
        let a = b.lit(start, b"<").unwrap();
        let q0 = b.states.len() as StateId;
        let e = b
            .repeat(a, 2, Some(200), &mut |b, s| b.call(s, ch))
            .unwrap();
        let x = b.lit(e, b">").unwrap();
        b.eps(x, end);
        let nfa = b.finish().unwrap();
        // Positions are `a` (0) and the return states created in order after it.
        let q = |k: u32| {
            if k == 0 {
                a
            } else {
                q0 + k - 1 + u32::from(k > 2)
            }
        };
        let reps = nfa.chain_representatives(10);
        assert_eq!(reps.len(), 190 - 2, "positions 3..=190 map to position 2");
        assert_eq!(reps.get(&q(3)), Some(&q(2)));
        assert_eq!(reps.get(&q(190)), Some(&q(2)));
        assert_eq!(reps.get(&q(191)), None, "too close to the end");
        assert_eq!(reps.get(&q(1)), None, "before minLength");
        assert!(
            nfa.chain_representatives(300).is_empty(),
            "horizon past the chain"
        );
    }

    #[test]
    fn empty_root_is_an_error() {
        let mut b = Builder::new(budget());
        let r = b.new_rule().unwrap();
        let s = b.rules[r as usize].start;
        b.lit(s, b"a").unwrap();
        assert!(matches!(b.finish(), Err(CompileError::Empty)));
    }
}
