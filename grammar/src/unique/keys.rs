//! The keys of key-loop objects (`json/any_order.rs::key_loop`): which tokens may write a key
//! its object has already, or stop inside a key only earlier keys complete, and the mask
//! refinement that follows those ([`refine_keys`]). See the parent module's docs.

use super::{allows, closes_string, JsonTracker, LIVE_BUDGET};
use crate::lazy::{ConfigId, Lazy, DEAD};
use crate::nfa::{Nfa, StateId};
use crate::vocab::{KeyFrom, TokenVocab};

/// Masks of at most this many tokens are refined token by token ([`refine_keys`]).
const FEW_TOKENS: usize = 256;

/// What a token may do to the keys of key-loop objects ([`JsonTracker::may_touch_keys`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Touch {
    /// Nothing a key loop refuses.
    No,
    /// Something to follow the token through to tell.
    Follow,
    /// It ends inside a key of the object `depth` frames deep, opened at `from` in it (0:
    /// the key open before it), that an earlier key of that object starts like.
    EndsInKey { depth: usize, from: usize },
}

/// The keys of the open objects, sorted and deduplicated per object depth (without their
/// closing quotes), built on first use within one mask: [`JsonTracker::may_touch_keys`]
/// looks each token up in them instead of scanning every key.
#[derive(Default)]
struct KeyIndex<'a> {
    by_depth: crate::lazy::FastMap<usize, Vec<&'a [u8]>>,
    /// The key looked up (what the key has before the token, then the token's part).
    probe: Vec<u8>,
}

impl<'a> KeyIndex<'a> {
    fn keys(&mut self, t: &'a JsonTracker, depth: usize) -> &[&'a [u8]] {
        self.by_depth
            .entry(depth)
            .or_insert_with(|| t.keys_at(depth, false))
    }

    /// Some key of the object `depth` frames deep is `pre` then `tail`.
    fn has_key(&mut self, t: &'a JsonTracker, depth: usize, pre: &[u8], tail: &[u8]) -> bool {
        let mut probe = std::mem::take(&mut self.probe);
        probe.clear();
        probe.extend_from_slice(pre);
        probe.extend_from_slice(tail);
        let found = self.keys(t, depth).binary_search(&probe.as_slice()).is_ok();
        self.probe = probe;
        found
    }

    /// Some key of the object `depth` frames deep starts with `pre` then `tail`.
    fn has_key_starting(
        &mut self,
        t: &'a JsonTracker,
        depth: usize,
        pre: &[u8],
        tail: &[u8],
    ) -> bool {
        let mut probe = std::mem::take(&mut self.probe);
        probe.clear();
        probe.extend_from_slice(pre);
        probe.extend_from_slice(tail);
        let keys = self.keys(t, depth);
        // The keys that start with the probe follow it in order, the first right at it.
        let i = keys.partition_point(|k| *k < probe.as_slice());
        let found = keys.get(i).is_some_and(|k| k.starts_with(&probe));
        self.probe = probe;
        found
    }
}

impl JsonTracker {
    /// Some open object has keys (only they can be repeated).
    fn has_keys(&self) -> bool {
        self.frames.iter().any(|f| !f.array && !f.items.is_empty())
    }

    /// Outside strings, where a key of the innermost object goes.
    fn at_key(&self) -> bool {
        !self.in_str
            && self
                .frames
                .last()
                .is_some_and(|f| !f.array && f.expect_item)
    }

    /// Inside a key of the innermost object.
    fn in_key(&self) -> bool {
        self.in_str && self.str_item && self.frames.last().is_some_and(|f| !f.array)
    }

    /// Inside a key: the rests of the earlier keys of its object that start with what it
    /// has (bytes as written, a pending escape included), each with its closing quote.
    fn key_rests(&self) -> Vec<&[u8]> {
        let Some(f) = self.frames.last().filter(|_| self.in_key()) else {
            return Vec::new();
        };
        let cur = &self.bytes[self.str_start as usize..];
        // An item's range ends at its closing quote.
        let mut out: Vec<&[u8]> = f
            .items
            .iter()
            .map(|&(a, e, _)| &self.bytes[a as usize..=e as usize])
            .filter(|k| k.len() > cur.len() && k.starts_with(cur))
            .map(|k| &k[cur.len()..])
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Could `bytes`, written from here, close a key equal to an earlier key of its object
    /// (`Touch::Follow`) or stop inside a key that an earlier key of its object starts with
    /// (`Touch::EndsInKey`)? (What a key loop
    /// refuses; a token that opens an object and writes a `,` and a `"` after it counts, as
    /// a key may repeat in it, and so does one that writes two keys of one object.) A necessary condition, cheap to test: the tokens it holds for are
    /// then followed.
    fn may_touch_keys<'a>(&'a self, bytes: &[u8], index: &mut KeyIndex<'a>) -> Touch {
        // Open frames: `frames[..depth]`, and `opened` more the bytes opened.
        let mut depth = self.frames.len();
        let mut opened = 0usize;
        let (mut in_str, mut esc) = (self.in_str, self.esc);
        // The key being written: its bytes before `bytes`, and where it starts in `bytes`.
        let mut key: Option<(&[u8], usize)> = self
            .in_key()
            .then(|| (&self.bytes[self.str_start as usize..], 0));
        let mut expect = !self.in_str
            && self
                .frames
                .last()
                .is_some_and(|f| !f.array && f.expect_item);
        // The depth at which the bytes closed a key: a second key there may repeat it (left
        // to the caller to follow).
        let mut closed_at: Option<usize> = None;
        for (i, &b) in bytes.iter().enumerate() {
            if in_str {
                if closes_string(b, &mut esc) {
                    in_str = false;
                    if let Some((pre, from)) = key.take() {
                        closed_at = Some(depth);
                        if index.has_key(self, depth, pre, &bytes[from..i]) {
                            return Touch::Follow;
                        }
                    }
                }
                continue;
            }
            match b {
                b'"' => {
                    in_str = true;
                    if opened == 0 && expect {
                        if closed_at == Some(depth) {
                            return Touch::Follow;
                        }
                        key = Some((&[], i + 1));
                    }
                    expect = false;
                }
                // An object the bytes open has no keys before them, but may get two in
                // them: a key after a `,` after a `{` is left to the caller to follow.
                b'{' if opens_second_key(&bytes[i..]) => return Touch::Follow,
                b'{' => return Touch::No,
                b'[' => {
                    opened += 1;
                    expect = false;
                }
                b'}' | b']' => {
                    if opened > 0 {
                        opened -= 1;
                    } else if depth == 0 {
                        return Touch::No;
                    } else {
                        depth -= 1;
                    }
                    expect = false;
                }
                b',' => expect = opened == 0 && depth > 0 && !self.frames[depth - 1].array,
                b' ' | b'\t' | b'\n' | b'\r' => {}
                _ => expect = false,
            }
        }
        let Some((pre, from)) = key else {
            return Touch::No;
        };
        let tail = &bytes[from..];
        // Right after a key's opening quote some key is always left (a key loop counts its
        // keys: no `,` once all are written).
        if pre.is_empty() && tail.is_empty() {
            return Touch::No;
        }
        let first = pre.first().or(tail.first()).copied().unwrap_or(0);
        let firsts = depth
            .checked_sub(1)
            .map_or([0; 4], |d| self.frames[d].key_firsts);
        if firsts[(first >> 6) as usize] >> (first & 63) & 1 == 0 {
            return Touch::No;
        }
        if index.has_key_starting(self, depth, pre, tail) {
            Touch::EndsInKey { depth, from }
        } else {
            Touch::No
        }
    }

    /// The keys of the object `depth` frames deep, sorted, each once, with its closing
    /// quote or not.
    fn keys_at(&self, depth: usize, quoted: bool) -> Vec<&[u8]> {
        let Some(f) = depth
            .checked_sub(1)
            .map(|d| &self.frames[d])
            .filter(|f| !f.array)
        else {
            return Vec::new();
        };
        // An item's range ends at its closing quote.
        let mut out: Vec<&[u8]> = f
            .items
            .iter()
            .map(|&(a, e, _)| &self.bytes[a as usize..e as usize + quoted as usize])
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Clears from `mask` the tokens that would write a key of a key-loop object
/// (`Nfa::key_loops`) a second time, or stop inside a key that only earlier keys of its
/// object complete. Only the tokens that may do either are followed: inside a key, those
/// along the rests of the earlier keys it starts like; and the tokens with a `"` that may
/// close or stop inside a key where its object has earlier keys
/// ([`JsonTracker::may_touch_keys`]) — inside a string value only those with two or more
/// (one there closes the value, and a key needs another). A token without `"` cannot
/// reach a new key, and after a `,` a new key can always be written (the automaton counts
/// the keys of a closed object).
pub(super) fn refine_keys(
    nfa: &Nfa,
    lazy: &mut Lazy,
    vocab: &TokenVocab,
    c: ConfigId,
    tracker: &JsonTracker,
    mask: &mut [u32],
) {
    let is_set = |mask: &[u32], t: u32| mask[(t >> 5) as usize] >> (t & 31) & 1 == 1;
    let clear = |mask: &mut [u32], t: u32| mask[(t >> 5) as usize] &= !(1u32 << (t & 31));
    // The tracker to follow tokens with, cloned on the first token followed (few masks
    // follow any; `allows` leaves it as it found it).
    let mut scratch: Option<JsonTracker> = None;
    let mut check = |lazy: &mut Lazy, mask: &mut [u32], t: u32| {
        let scratch = scratch.get_or_insert_with(|| tracker.clone());
        if is_set(mask, t)
            && !vocab
                .token_bytes(t)
                .is_some_and(|b| allows(nfa, lazy, c, scratch, b))
        {
            clear(mask, t);
        }
    };
    if !tracker.has_keys() {
        return;
    }
    let in_key = tracker.in_key();
    let at_key = tracker.at_key();
    // A token that stops inside a key is decided once per prefix of the earlier keys'
    // rests ([`key_alive`]), as `can_end_new` decides it — which it does exactly when its
    // step budget cannot run out (the rests are shorter in all), when no counted string
    // takes part, and when the key has no escape (a pending one ends its check). The rests
    // of the key open here, and those of a key a token opens (per object depth).
    let rests = if in_key {
        tracker.key_rests()
    } else {
        Vec::new()
    };
    let mut opened_rests: crate::lazy::FastMap<usize, Vec<&[u8]>> = Default::default();
    let mut memo: crate::lazy::FastMap<(usize, ConfigId), bool> = Default::default();
    let mut index = KeyIndex::default();
    // Per object depth and list of rests (of the key open here, or of a new key).
    let mut rest_ends: crate::lazy::FastMap<(usize, bool), RestEnds> = Default::default();
    let mut decide = |lazy: &mut Lazy, mask: &mut [u32], t: u32| {
        let Some(bytes) = vocab.token_bytes(t) else {
            return;
        };
        let (depth, from) = match tracker.may_touch_keys(bytes, &mut index) {
            Touch::No => return,
            Touch::Follow => {
                check(lazy, mask, t);
                return;
            }
            Touch::EndsInKey { depth, from } => (depth, from),
        };
        let tail = &bytes[from..];
        let rests: &[&[u8]] = if in_key && from == 0 {
            &rests
        } else {
            opened_rests
                .entry(depth)
                .or_insert_with(|| tracker.keys_at(depth, true))
        };
        let total: usize = rests.iter().map(|r| r.len()).sum();
        if !nfa.long_strings.is_empty()
            || total >= LIVE_BUDGET as usize
            || (from == 0 && tracker.esc)
            || tail.contains(&b'\\')
        {
            check(lazy, mask, t);
            return;
        }
        let start = lazy.step_bytes(nfa, c, &bytes[..from]);
        let free = |lazy: &Lazy, c: ConfigId| {
            lazy.configs[c as usize]
                .threads
                .iter()
                .any(|&(_, s)| !nfa.in_unique(s))
        };
        if start != DEAD && free(lazy, start) {
            // A thread that no repeat check binds (e.g. an additional property's key) and
            // that lives through the token keeps it: it can end as a key none of the
            // earlier ones is.
            let n = lazy.step_bytes(nfa, start, tail);
            if n != DEAD && free(lazy, n) {
                return;
            }
        }
        match (start != DEAD)
            .then(|| {
                let ends = rest_ends.entry((depth, in_key && from == 0)).or_default();
                trie_alive_after(nfa, lazy, start, tail, rests, ends)
            })
            .flatten()
        {
            Some(true) => return,
            Some(false) => {
                clear(mask, t);
                return;
            }
            None => {}
        }
        let mut n = start;
        for &b in tail {
            n = lazy.step(nfa, n, b);
        }
        if n == DEAD || !key_alive(nfa, lazy, n, tail, rests, depth, &mut memo) {
            clear(mask, t);
        }
    };
    // Inside a key, a narrow mask (e.g. where few keys are left): each of its tokens is
    // decided, cheaper than finding the candidates along every earlier key.
    if in_key && at_most(mask, FEW_TOKENS) {
        let mut ids: Vec<u32> = Vec::new();
        for (i, &w) in mask.iter().enumerate() {
            let mut w = w;
            while w != 0 {
                ids.push(i as u32 * 32 + w.trailing_zeros());
                w &= w - 1;
            }
        }
        for t in ids {
            decide(lazy, mask, t);
        }
        return;
    }
    if in_key {
        // Tokens that end inside the rest of an earlier key (those through its quote have
        // a `"`), each once: the rests share their beginnings.
        let trie = vocab.trie();
        let mut along: Vec<u32> = Vec::new();
        for rest in &rests {
            trie.along(&rest[..rest.len() - 1], |n| {
                along.extend(trie.own_ids(n).iter().copied().filter(|&t| is_set(mask, t)));
            });
        }
        along.sort_unstable();
        along.dedup();
        for t in along {
            decide(lazy, mask, t);
        }
    }
    let quoted;
    let list: &[u32] = if in_key && !tracker.esc {
        // Of the tokens with a `"`, only those that close the key as an earlier one (they
        // start with its rest, quote included) or that close it and open another key
        // (`KeyFrom::String`) can touch keys: any other closes a new key and stays out of
        // keys. (A token in both is decided twice, the same way.)
        let trie = vocab.trie();
        for rest in &rests {
            if let Some(n) = trie.find(rest) {
                for &t in trie.subtree_ids(n) {
                    if is_set(mask, t) {
                        decide(lazy, mask, t);
                    }
                }
            }
        }
        vocab.key_opening_tokens(KeyFrom::String)
    } else if in_key {
        quoted = vocab.tokens_with_byte(b'"');
        &quoted
    } else if tracker.in_string() {
        vocab.key_opening_tokens(KeyFrom::String)
    } else if at_key {
        vocab.key_opening_tokens(KeyFrom::Gap)
    } else {
        vocab.key_opening_tokens(KeyFrom::Other)
    };
    for &t in list {
        if is_set(mask, t) {
            decide(lazy, mask, t);
        }
    }
}

/// Whether `mask` holds at most `n` tokens (stops counting past them).
fn at_most(mask: &[u32], n: usize) -> bool {
    let mut count = 0usize;
    for &w in mask {
        count += w.count_ones() as usize;
        if count > n {
            return false;
        }
    }
    true
}

/// Per key-trie state a thread starts from, per rest (by index): whether the rest ends at
/// one of the trie's keys from there (0: not known yet, 1: no, 2: yes).
type RestEnds = Vec<(StateId, Vec<u8>)>;

/// [`key_alive`] after `tail` from `c` (inside a key) on the NFA's states, without new
/// configurations, when every thread of `c` is inside a key-loop trie (threads go on
/// alone, and a configuration is alive when one of its threads is): `Some(true)` when one
/// thread follows `tail` and can end there as a key none of `rests` (sorted) is,
/// `Some(false)` when none can and all are trie threads, `None` when that cannot be told
/// here (then [`key_alive`] decides). In a trie of optional keys a thread can end as a new
/// key when more of the trie's writable keys continue from its state than earlier keys do
/// ([`Nfa::key_leaves`]; repeats drop the thread at their closing quote); in a trie of the
/// required keys not yet written, when its state is alive.
fn trie_alive_after(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tail: &[u8],
    rests: &[&[u8]],
    ends: &mut RestEnds,
) -> Option<bool> {
    // The rests that continue `tail`, next to one another in order. The trie is a tree:
    // from a thread's state they are the earlier keys below the state `tail` leads to.
    let lo = rests.partition_point(|r| *r < tail);
    let hi = lo
        + rests[lo..]
            .iter()
            .take_while(|r| r.starts_with(tail))
            .count();
    let mut known = true;
    for i in 0..lazy.configs[c as usize].threads.len() {
        let q0 = lazy.configs[c as usize].threads[i].1;
        if !nfa.in_key_loop(q0) {
            known = false;
            continue;
        }
        let mut st = Some(q0);
        for &b in tail {
            let Some(s) = st else { break };
            match byte_target(nfa, s, b) {
                Ok(Some(t)) if nfa.in_key_loop(t) => st = Some(t),
                Ok(None) => st = None,
                _ => return None,
            }
        }
        let Some(q) = st else { continue };
        let Some(&total) = nfa.key_leaves.get(&q) else {
            if nfa.in_key_loop(q) && nfa.dist.get(q as usize).is_some_and(|&d| d != u32::MAX) {
                return Some(true);
            }
            known = false;
            continue;
        };
        // Per rest: 0 not known yet, 1 not a key of this trie, 2 a key.
        let seen = match ends.iter().position(|e| e.0 == q0) {
            Some(j) => j,
            None => {
                ends.push((q0, vec![0; rests.len()]));
                ends.len() - 1
            }
        };
        let mut written = 0;
        for (r, e) in rests[lo..hi].iter().zip(&mut ends[seen].1[lo..hi]) {
            if *e == 0 {
                *e = 1 + lazy.key_end(q0, r, || ends_at_key(nfa, q0, r)) as u8;
            }
            written += (*e == 2) as usize;
        }
        if total as usize > written {
            return Some(true);
        }
    }
    known.then_some(false)
}

/// Whether `rest`, walked from the key-trie state `q`, ends at one of the trie's keys.
fn ends_at_key(nfa: &Nfa, mut q: StateId, rest: &[u8]) -> bool {
    for &b in rest {
        match byte_target(nfa, q, b) {
            Ok(Some(t)) => q = t,
            _ => return false,
        }
    }
    nfa.key_leaves.contains_key(&q)
}

/// Whether `bytes` hold a `"` after a `,` (from a `{` they open: a second key may follow).
pub(crate) fn opens_second_key(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .position(|&b| b == b',')
        .is_some_and(|i| bytes[i..].contains(&b'"'))
}

/// The bytes that continue `p` along one of `rests`, as a set.
fn along_bytes(rests: &[&[u8]], p: &[u8]) -> [u64; 4] {
    let mut along = [0u64; 4];
    for r in rests {
        if r.len() > p.len() && r.starts_with(p) {
            let b = r[p.len()];
            along[(b >> 6) as usize] |= 1 << (b & 63);
        }
    }
    along
}

/// The state `b` moves `q` to (`None`: no move), or `Err` when two moves take it.
fn byte_target(nfa: &Nfa, q: StateId, b: u8) -> Result<Option<StateId>, ()> {
    let mut found = None;
    for &(lo, hi, t) in &nfa.states[q as usize].bytes {
        if (lo..=hi).contains(&b) {
            if found.is_some() {
                return Err(());
            }
            found = Some(t);
        }
    }
    Ok(found)
}

/// Inside a key, after `p` more bytes (the configuration `c`): can it still end as a key
/// no earlier key of its object is? `rests`: the rests of the earlier keys it started like,
/// each with its closing quote. As [`can_end_new`]: true without a thread in a key loop; a
/// byte off every rest proves it (the key is then none of them, and the automaton's states
/// all reach an end); a byte along a rest needs the same question one byte further; the
/// quote that ends a rest closes a repeat, which only the threads outside key loops
/// survive. Memoised by configuration (and the object's depth, whose keys `rests` are):
/// one with a key-loop thread is inside a key trie, whose state spells `p`.
fn key_alive(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    p: &[u8],
    rests: &[&[u8]],
    depth: usize,
    memo: &mut crate::lazy::FastMap<(usize, ConfigId), bool>,
) -> bool {
    if let Some(&v) = memo.get(&(depth, c)) {
        return v;
    }
    // Alive without a thread that can run out of keys, or with one that no repeat check
    // binds (e.g. an additional property's key: it completes as a key none of `rests` is).
    let threads = &lazy.configs[c as usize].threads;
    let mut alive = threads.iter().all(|&(_, s)| !nfa.in_unique_array(s))
        || threads.iter().any(|&(_, s)| !nfa.in_unique(s));
    if !alive {
        let along = along_bytes(rests, p);
        let set = lazy.next_bytes(nfa, c);
        let off: [u64; 4] = std::array::from_fn(|i| set[i] & !along[i]);
        let on: [u64; 4] = std::array::from_fn(|i| set[i] & along[i]);
        alive = crate::lazy::set_bytes(off).any(|b| lazy.step(nfa, c, b) != DEAD);
        for b in crate::lazy::set_bytes(on) {
            if alive {
                break;
            }
            if b == b'"' {
                let kept = lazy.retain_threads(nfa, c, |s| !nfa.in_unique(s));
                alive = kept != DEAD && lazy.step(nfa, kept, b) != DEAD;
            } else {
                let n = lazy.step(nfa, c, b);
                if n != DEAD {
                    let mut q = p.to_vec();
                    q.push(b);
                    alive = key_alive(nfa, lazy, n, &q, rests, depth, memo);
                }
            }
        }
    }
    memo.insert((depth, c), alive);
    alive
}
