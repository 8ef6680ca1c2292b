//! Enforcing `uniqueItems` on arrays of free strings while matching (see `json/unique.rs`
//! for what the compiler guarantees).
//!
//! The matcher of a grammar with unique-item bodies keeps the text it accepted and a
//! [`JsonTracker`] over it. Before the closing quote of a string that repeats an earlier
//! string item of the innermost array, every thread inside a unique-item body is dropped
//! (threads of other readings of the text, e.g. another `anyOf` branch, go on). Masks are
//! the automaton's mask minus the tokens that would close such a repeat, found by walking
//! the token trie along `rest of the earlier item + '"'`; tokens with two or more quotes
//! (which may close a later item inside the token) are checked by following them.

use crate::lazy::{ConfigId, Lazy, DEAD};
use crate::nfa::Nfa;
use crate::vocab::TokenVocab;

/// One open container of the text.
#[derive(Clone, Debug, Default)]
struct Frame {
    /// An array (else an object).
    array: bool,
    /// Byte ranges (content, no quotes) of the complete strings directly in this array.
    items: Vec<(u32, u32)>,
}

/// Follows JSON text byte by byte: open containers, strings, the string items of each open
/// array. JSON's structure is unambiguous, so this is the structure every reading of the
/// text agrees on.
#[derive(Clone, Debug, Default)]
pub(crate) struct JsonTracker {
    bytes: Vec<u8>,
    frames: Vec<Frame>,
    in_str: bool,
    esc: bool,
    str_start: u32,
}

/// What [`JsonTracker::restore`] needs to undo bytes pushed after [`JsonTracker::checkpoint`].
pub(crate) struct Checkpoint {
    len: usize,
    frames: Vec<Frame>,
    in_str: bool,
    esc: bool,
    str_start: u32,
}

impl JsonTracker {
    /// Bytes followed so far.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Follows one byte.
    pub fn push(&mut self, b: u8) {
        let pos = self.bytes.len() as u32;
        self.bytes.push(b);
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if b == b'\\' {
                self.esc = true;
            } else if b == b'"' {
                self.in_str = false;
                let start = self.str_start;
                if let Some(f) = self.frames.last_mut().filter(|f| f.array) {
                    f.items.push((start, pos));
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_str = true;
                self.str_start = pos + 1;
            }
            b'[' | b'{' => self.frames.push(Frame {
                array: b == b'[',
                items: Vec::new(),
            }),
            b']' | b'}' => {
                self.frames.pop();
            }
            _ => {}
        }
    }

    /// Forgets everything after the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.bytes.len() {
            return;
        }
        let bytes = std::mem::take(&mut self.bytes);
        *self = JsonTracker::default();
        for &b in &bytes[..len] {
            self.push(b);
        }
    }

    /// State to come back to after following a token tentatively.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            len: self.bytes.len(),
            frames: self.frames.clone(),
            in_str: self.in_str,
            esc: self.esc,
            str_start: self.str_start,
        }
    }

    /// Undoes everything since `cp`.
    pub fn restore(&mut self, cp: Checkpoint) {
        self.bytes.truncate(cp.len);
        self.frames = cp.frames;
        self.in_str = cp.in_str;
        self.esc = cp.esc;
        self.str_start = cp.str_start;
    }

    /// The content of the open string, when it is directly inside an array and the next
    /// byte `"` would close it.
    fn open_item(&self) -> Option<&[u8]> {
        if !self.in_str || self.esc {
            return None;
        }
        self.frames.last().filter(|f| f.array)?;
        Some(&self.bytes[self.str_start as usize..])
    }

    /// True when a `"` now would close a string item equal to an earlier item of its array.
    fn closing_repeats(&self) -> bool {
        let Some(cur) = self.open_item() else {
            return false;
        };
        let Some(f) = self.frames.last() else {
            return false;
        };
        f.items
            .iter()
            .any(|&(a, b)| &self.bytes[a as usize..b as usize] == cur)
    }

    /// For each earlier item of the innermost array that starts with the open string: the
    /// rest of it (what would complete the repeat before its closing quote).
    fn repeat_rests(&self) -> Vec<Vec<u8>> {
        let Some(cur) = self.open_item() else {
            return Vec::new();
        };
        let Some(f) = self.frames.last() else {
            return Vec::new();
        };
        let mut out: Vec<Vec<u8>> = f
            .items
            .iter()
            .map(|&(a, b)| &self.bytes[a as usize..b as usize])
            .filter(|it| it.starts_with(cur))
            .map(|it| it[cur.len()..].to_vec())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// `c` without its threads inside unique-item bodies (`DEAD` when none is left).
pub(crate) fn without_unique(nfa: &Nfa, lazy: &mut Lazy, c: ConfigId) -> ConfigId {
    let cfg = &lazy.configs[c as usize];
    if !cfg.threads.iter().any(|&(_, s)| nfa.in_unique(s)) {
        return c;
    }
    let seeds: Vec<(u32, u32)> = cfg
        .threads
        .iter()
        .copied()
        .filter(|&(_, s)| !nfa.in_unique(s))
        .collect();
    if seeds.is_empty() {
        DEAD
    } else {
        lazy.closure(nfa, &seeds)
    }
}

/// Follows `bytes` from `c`, dropping the unique-item threads before a repeating item's
/// closing quote; the tracker follows too. `DEAD` (tracker then undefined past the point)
/// when the text cannot continue.
pub(crate) fn advance(
    nfa: &Nfa,
    lazy: &mut Lazy,
    mut c: ConfigId,
    tracker: &mut JsonTracker,
    bytes: &[u8],
) -> ConfigId {
    for &b in bytes {
        if b == b'"' && tracker.closing_repeats() {
            c = without_unique(nfa, lazy, c);
            if c == DEAD {
                return DEAD;
            }
        }
        c = lazy.step(nfa, c, b);
        if c == DEAD {
            return DEAD;
        }
        tracker.push(b);
    }
    c
}

/// Would `bytes` keep the text alive from `c`? (Tracker unchanged.)
pub(crate) fn allows(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
    bytes: &[u8],
) -> bool {
    let cp = tracker.checkpoint();
    let ok = advance(nfa, lazy, c, tracker, bytes) != DEAD;
    tracker.restore(cp);
    ok
}

/// When the shortest way on from `c` may be a `"` that would close a repeated item: an
/// ASCII letter or digit that the automaton allows and that no earlier item has at this
/// position (so the item cannot end as a repeat). `None` when no repeat is pending.
pub(crate) fn distinguishing_byte(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &JsonTracker,
) -> Option<u8> {
    if !tracker.closing_repeats()
        || !lazy.configs[c as usize]
            .threads
            .iter()
            .any(|&(_, s)| nfa.in_unique(s))
    {
        return None;
    }
    let taken: Vec<u8> = tracker
        .repeat_rests()
        .iter()
        .filter_map(|r| r.first().copied())
        .collect();
    (b'a'..=b'z')
        .chain(b'0'..=b'9')
        .filter(|b| !taken.contains(b))
        .find(|&b| lazy.step(nfa, c, b) != DEAD)
}

/// Clears from `mask` (the automaton's mask of `c`) the tokens that would repeat an item.
pub(crate) fn refine_mask(
    nfa: &Nfa,
    lazy: &mut Lazy,
    vocab: &TokenVocab,
    c: ConfigId,
    tracker: &mut JsonTracker,
    mask: &mut [u32],
) {
    let is_set = |mask: &[u32], t: u32| mask[(t >> 5) as usize] >> (t & 31) & 1 == 1;
    let clear = |mask: &mut [u32], t: u32| mask[(t >> 5) as usize] &= !(1u32 << (t & 31));
    let threads = &lazy.configs[c as usize].threads;
    let has_unique = threads.iter().any(|&(_, s)| nfa.in_unique(s));
    let mixed = has_unique && threads.iter().any(|&(_, s)| !nfa.in_unique(s));
    if has_unique {
        let trie = vocab.trie();
        for rest in tracker.repeat_rests() {
            let mut path = rest;
            path.push(b'"');
            let Some(node) = trie_find(trie, &path) else {
                continue;
            };
            for &t in trie.subtree_ids(node) {
                if !is_set(mask, t) {
                    continue;
                }
                // Other readings of the text may still take the token.
                let keep = mixed
                    && vocab
                        .token_bytes(t)
                        .is_some_and(|b| allows(nfa, lazy, c, tracker, b));
                if !keep {
                    clear(mask, t);
                }
            }
        }
    }
    for &t in vocab.multi_quote_tokens() {
        if is_set(mask, t) {
            let ok = vocab
                .token_bytes(t)
                .is_some_and(|b| allows(nfa, lazy, c, tracker, b));
            if !ok {
                clear(mask, t);
            }
        }
    }
}

/// The trie node reached by `path` from the root, if any.
fn trie_find(trie: &crate::vocab::TokenTrie, path: &[u8]) -> Option<usize> {
    let nodes = &trie.nodes;
    // Children of the root are the depth-1 nodes; a node's children follow it in preorder.
    let (mut i, mut end) = (0usize, nodes.len());
    let mut found = None;
    for (d, &b) in path.iter().enumerate() {
        let mut j = i;
        found = None;
        while j < end {
            let n = &nodes[j];
            if n.depth as usize == d + 1 && n.byte == b {
                found = Some(j);
                break;
            }
            j = n.next as usize;
        }
        let f = found?;
        i = f + 1;
        end = nodes[f].next as usize;
    }
    found
}
