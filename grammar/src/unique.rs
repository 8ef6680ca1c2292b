//! Enforcing `uniqueItems` on arrays of strings, of numbers and of open objects, and the
//! keys of key-loop objects, while matching (see `json/unique.rs` and
//! `json/any_order.rs::key_loop` for what the compiler guarantees).
//!
//! The matcher of a grammar with unique-item arrays keeps the text it accepted and a
//! [`JsonTracker`] over it. Before the closing quote of a string that repeats an earlier
//! string item of the innermost array, every thread inside a unique-item body is dropped
//! (threads of other readings of the text, e.g. another `anyOf` branch, go on). Masks are
//! the automaton's mask minus the tokens that would close such a repeat, found by walking
//! the token trie along `rest of the earlier item + '"'`; tokens with two or more quotes
//! (which may close a later item inside the token) are checked by following them.
//!
//! Number items (whole arrays only, below) have no closing byte: one ends at the byte after
//! its last digit (`,`, `]` or whitespace), and a repeat is refused before that byte.
//!
//! Items of bounded kinds (`enum`, `maxLength`, patterns, numeric bounds) may run out of
//! new values: a prefix can be one whose every completion is an earlier item, or a new item
//! may have no value left. Inside such arrays ([`crate::nfa::Nfa::unique_arrays`]) every step is also
//! checked with [`can_end_new`] (a walk along the earlier items' rests, looking for a byte
//! off all of them that the automaton takes), so the text never enters a dead end: masks,
//! `accept_token` and `try_advance_bytes` agree, and the planned close avoids repeats.
//!
//! Key-loop objects ([`crate::nfa::Nfa::key_loops`]: declared properties in any order past
//! the subset automaton's budget) take their declared keys from a loop, so the tracker also
//! keeps each object's keys: at the closing quote of a key already written in the same
//! object the threads in key loops are dropped, and a key prefix only earlier keys complete
//! is refused like a used-up item (the declared keys are a finite set, each spelt one way).
//! Masks follow only the tokens that may do either ([`JsonTracker::may_touch_keys`]), and
//! decide one that stops inside a key from the key tries' states where they can
//! ([`Nfa::key_leaves`](crate::nfa::Nfa::key_leaves): how many keys continue from a state)
//! instead of stepping the automaton.
//!
//! Arrays of values (open objects, free strings beside them: [`crate::nfa::Nfa::unique_after`])
//! are compared by value: the tracker keeps each string, object and array item's canonical
//! form ([`crate::canon`]), and right after the byte that closes one equal to an earlier
//! item the threads in the states that follow an item are dropped. Masks follow every
//! allowed token that may close such an item; the planned close searches for a text that
//! ends the item as a new value ([`closing_detour`]).
//!
//! Arrays whose items may run out of new values (closed objects, unions with numbers,
//! literals or bounded strings, any value: [`crate::nfa::Nfa::searched_opens`]) are compared
//! by value the same way, their numbers and literals too (a repeated number is refused
//! before the byte after it). The tracker marks them at their `[`, and every step inside one
//! is also checked with [`searched_viable`]: where an earlier item is still a candidate
//! ([`JsonTracker::item_may_repeat`]) and no thread is in an open string loop, a bounded
//! search must find a text that ends the item as a new value. Masks follow the tokens that
//! could leave only repeats ([`refine_searched`]).

use std::sync::Arc;

use crate::lazy::{ConfigId, Lazy, DEAD};
use crate::nfa::Nfa;
use crate::vocab::TokenVocab;

mod close;
mod keys;
mod searched;
use close::new_value_text;
pub(crate) use close::{closing_detour, closing_step};
pub(crate) use keys::opens_second_key;
use searched::{opens_searched, refine_searched, searched_viable};

/// One open container of the text.
#[derive(Clone, Debug, Default)]
struct Frame {
    /// An array (else an object).
    array: bool,
    /// Where its `[` or `{` is.
    start: u32,
    /// The complete strings and numbers directly in this array, or the keys of this object:
    /// byte ranges (a string's content without its quotes, a number's text) and whether
    /// the item is a number.
    items: Vec<(u32, u32, bool)>,
    /// The complete strings, objects and arrays directly in this array, by value
    /// ([`crate::canon`]; `None`: nested past its depth limit). Only kept when the
    /// grammar compares items as values ([`JsonTracker::set_values`]).
    values: Vec<Option<Arc<[u8]>>>,
    /// Where the next value would be a new item of this array or the next string a key of
    /// this object (after `[`, `{` or `,`).
    expect_item: bool,
    /// An object's keys' first bytes, as a set (a quick "no key starts so").
    key_firsts: [u64; 4],
}

/// Follows JSON text byte by byte: open containers, strings, the string and number items of
/// each open array. JSON's structure is unambiguous, so this is the structure every reading
/// of the text agrees on.
#[derive(Clone, Debug, Default)]
pub(crate) struct JsonTracker {
    bytes: Vec<u8>,
    frames: Vec<Frame>,
    in_str: bool,
    esc: bool,
    str_start: u32,
    /// The open string is an item of the innermost array or a key of the innermost object.
    str_item: bool,
    /// Start of the number being written as an item of the innermost array.
    num_start: Option<u32>,
    /// Bytes before this were free text, not JSON ([`JsonTracker::forget_json`]).
    json_from: u32,
    /// Record object and array items by value ([`JsonTracker::set_values`]).
    values: bool,
    /// Where the `[` of each open or closed array whose items the matcher searches
    /// ([`crate::nfa::Nfa::searched_opens`]) is, in order.
    searched: Vec<u32>,
    /// The last byte closed a string, object or array item (recorded by value).
    closed_value: bool,
    /// Start of the `true`, `false` or `null` being written as an item of the innermost
    /// array, when that array's items are searched.
    lit_start: Option<u32>,
    /// The last byte ended an item of the array at this many frames (a string, object,
    /// array or literal at its last byte, a number at the byte after it).
    item_done: Option<usize>,
    /// The counted string being written (`crate::length`). Not rebuilt by
    /// [`JsonTracker::truncate`]: it depends on the automaton, so the matcher keeps it per
    /// history entry.
    pub(crate) count: crate::length::Count,
}

/// What [`JsonTracker::restore`] needs to undo bytes pushed after [`JsonTracker::checkpoint`].
pub(crate) struct Checkpoint {
    len: usize,
    frames: Vec<Frame>,
    in_str: bool,
    esc: bool,
    str_start: u32,
    str_item: bool,
    num_start: Option<u32>,
    json_from: u32,
    closed_value: bool,
    lit_start: Option<u32>,
    item_done: Option<usize>,
    searched: usize,
    count: crate::length::Count,
}

/// Stands in a number item's rest for "the byte that ends it" (`,`, `]`, whitespace): NUL
/// never appears outside a string, so no automaton takes it there.
const NUM_END: u8 = 0;

/// A byte that can continue a JSON number.
fn is_num_byte(b: u8) -> bool {
    b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')
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
        self.closed_value = false;
        self.item_done = None;
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if b == b'\\' {
                self.esc = true;
            } else if b == b'"' {
                self.in_str = false;
                let start = self.str_start;
                let depth = self.frames.len();
                if let Some(f) = self.frames.last_mut().filter(|f| f.array) {
                    f.items.push((start, pos, false));
                    self.item_done = Some(depth);
                    if self.values {
                        let text = &self.bytes[start as usize - 1..];
                        f.values.push(crate::canon::canonical(text).map(Arc::from));
                        self.closed_value = true;
                    }
                } else if self.str_item {
                    if let Some(f) = self.frames.last_mut() {
                        f.items.push((start, pos, false));
                        if let Some(&b) = self.bytes.get(start as usize).filter(|_| start < pos) {
                            f.key_firsts[(b >> 6) as usize] |= 1 << (b & 63);
                        }
                    }
                }
            }
            return;
        }
        if let Some(start) = self.num_start {
            if is_num_byte(b) {
                return;
            }
            self.num_start = None;
            let searched = self.top_searched();
            let depth = self.frames.len();
            if let Some(f) = self.frames.last_mut().filter(|f| f.array) {
                f.items.push((start, pos, true));
                self.item_done = Some(depth);
                if searched {
                    let text = &self.bytes[start as usize..pos as usize];
                    f.values.push(crate::canon::canonical(text).map(Arc::from));
                }
            }
        }
        if let Some(start) = self.lit_start {
            let word = &self.bytes[start as usize..];
            if matches!(word, b"true" | b"false" | b"null") {
                self.lit_start = None;
                let depth = self.frames.len();
                if let Some(f) = self.frames.last_mut() {
                    f.values.push(crate::canon::canonical(word).map(Arc::from));
                    self.closed_value = true;
                    self.item_done = Some(depth);
                }
            } else if ![&b"true"[..], b"false", b"null"]
                .iter()
                .any(|w| w.starts_with(word))
            {
                self.lit_start = None;
            }
        } else if matches!(b, b't' | b'f' | b'n')
            && self.frames.last().is_some_and(|f| f.expect_item)
            && self.top_searched()
        {
            self.lit_start = Some(pos);
        }
        if (b == b'-' || b.is_ascii_digit())
            && self.frames.last().is_some_and(|f| f.array && f.expect_item)
        {
            self.num_start = Some(pos);
        }
        let item_here = self.frames.last().is_some_and(|f| f.array || f.expect_item);
        if let Some(f) = self.frames.last_mut() {
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b',' => f.expect_item = true,
                _ => f.expect_item = false,
            }
        }
        match b {
            b'"' => {
                self.in_str = true;
                self.str_start = pos + 1;
                self.str_item = item_here;
            }
            b'[' | b'{' => self.frames.push(Frame {
                array: b == b'[',
                start: pos,
                items: Vec::new(),
                values: Vec::new(),
                expect_item: true,
                key_firsts: [0; 4],
            }),
            b']' | b'}' => {
                let closed = self.frames.pop();
                if self.frames.last().is_some_and(|f| f.array) {
                    self.item_done = Some(self.frames.len());
                }
                if self.values {
                    if let (Some(c), Some(f)) = (closed, self.frames.last_mut()) {
                        if f.array {
                            let text = &self.bytes[c.start as usize..];
                            f.values.push(crate::canon::canonical(text).map(Arc::from));
                            self.closed_value = true;
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Records the strings, objects and arrays that are array items by value, for the
    /// grammars that compare items as values (`Nfa::unique_after`).
    pub fn set_values(&mut self) {
        self.values = true;
    }

    /// The last byte closed a string, object or array item equal to an earlier item of
    /// the same array. Items too deep to compare count as equal to each other (stricter,
    /// never looser).
    fn closed_repeat(&self) -> bool {
        if !self.closed_value {
            return false;
        }
        let Some((last, earlier)) = self.frames.last().and_then(|f| f.values.split_last()) else {
            return false;
        };
        earlier.iter().any(|v| match (v, last) {
            (Some(a), Some(b)) => a == b,
            (None, None) => true,
            _ => false,
        })
    }

    /// For the open string, an item of the innermost array: the rests (in UTF-16 code
    /// units) of the earlier string items that start with the characters it has, i.e.
    /// what would make it a repeat before its closing quote. `None` when that cannot be
    /// told (not such a string, or an escape or character cut short at its end).
    fn open_string_rests(&self) -> Option<Vec<Vec<u16>>> {
        if !self.in_str || self.esc {
            return None;
        }
        let f = self.frames.last().filter(|f| f.array)?;
        let (units, whole) =
            crate::canon::open_string_units(&self.bytes[self.str_start as usize..])?;
        if !whole {
            return None;
        }
        let mut rests = Vec::new();
        for v in &f.values {
            let Some(mut it) = crate::canon::string_units(v.as_deref()?) else {
                continue;
            };
            if units.iter().all(|&u| it.next() == Some(u)) {
                rests.push(it.collect());
            }
        }
        Some(rests)
    }

    /// Would `bytes`, written from here, close a string, object or array that is an item
    /// of an array with such items before it? (What may close a repeated value.) `rests`:
    /// those of the string open here ([`JsonTracker::open_string_rests`]).
    fn may_close_value(&self, bytes: &[u8], rests: Option<&[Vec<u16>]>) -> bool {
        let mut first = self.in_str;
        let (mut in_str, mut esc) = (self.in_str, self.esc);
        // Frames the token opens: whether each is an array.
        let mut opened: Vec<bool> = Vec::new();
        let mut depth = self.frames.len();
        for (i, &b) in bytes.iter().enumerate() {
            if in_str {
                if closes_string(b, &mut esc) {
                    in_str = false;
                    if std::mem::take(&mut first) {
                        // The string open here: an item when the top frame is an array; a
                        // repeat only if what the token writes before the quote is the rest
                        // of an earlier item.
                        let item = self
                            .frames
                            .last()
                            .is_some_and(|f| f.array && !f.values.is_empty());
                        let pre = &bytes[..i];
                        let repeat_may = item
                            && match rests {
                                None => true,
                                Some([]) => false,
                                Some(rests) => match std::str::from_utf8(pre) {
                                    Ok(t) if !pre.contains(&b'\\') => {
                                        let u: Vec<u16> = t.encode_utf16().collect();
                                        rests.contains(&u)
                                    }
                                    _ => crate::canon::open_string_units(pre)
                                        .is_none_or(|(u, whole)| !whole || rests.contains(&u)),
                                },
                            };
                        if repeat_may {
                            return true;
                        }
                        continue;
                    }
                    // A string directly in an array is an item.
                    let repeat_may = match opened.last() {
                        Some(&a) => a,
                        None => {
                            depth > 0
                                && self.frames[depth - 1].array
                                && !self.frames[depth - 1].values.is_empty()
                        }
                    };
                    if repeat_may {
                        return true;
                    }
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'[' | b'{' => opened.push(b == b'['),
                b']' | b'}' => {
                    if opened.pop().is_some() {
                        // A container opened by the token closes: an item of the one
                        // below it (also opened by the token, or the top frame).
                        let parent_is_array = match opened.last() {
                            Some(&a) => a,
                            None => depth > 0 && self.frames[depth - 1].array,
                        };
                        let earlier = opened.is_empty()
                            && depth > 0
                            && !self.frames[depth - 1].values.is_empty();
                        if parent_is_array && (earlier || !opened.is_empty()) {
                            return true;
                        }
                    } else {
                        if depth == 0 {
                            return false;
                        }
                        depth -= 1;
                        if depth > 0
                            && self.frames[depth - 1].array
                            && !self.frames[depth - 1].values.is_empty()
                        {
                            return true;
                        }
                    }
                }
                _ => {}
            }
        }
        false
    }

    /// Forgets everything after the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.bytes.len() {
            return;
        }
        // Free text only comes first, so everything before `json_from` (or `len`) was text.
        let from = (self.json_from as usize).min(len);
        let bytes = std::mem::take(&mut self.bytes);
        let values = self.values;
        let mut searched = std::mem::take(&mut self.searched);
        searched.retain(|&p| (p as usize) < len);
        *self = JsonTracker::default();
        self.values = values;
        self.searched = searched;
        self.bytes.extend_from_slice(&bytes[..from]);
        self.json_from = from as u32;
        for &b in &bytes[from..len] {
            self.push(b);
        }
    }

    /// Every byte so far was free text ([`JsonTracker::forget_json`] after each).
    pub fn only_text(&self) -> bool {
        self.json_from as usize == self.bytes.len()
    }

    /// The text so far is free text, not JSON (the text before tool calls): forget the
    /// structure read from it (its quotes and brackets open nothing).
    pub fn forget_json(&mut self) {
        self.frames.clear();
        self.in_str = false;
        self.esc = false;
        self.str_item = false;
        self.num_start = None;
        self.lit_start = None;
        self.json_from = self.bytes.len() as u32;
    }

    /// State to come back to after following a token tentatively.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            len: self.bytes.len(),
            frames: self.frames.clone(),
            in_str: self.in_str,
            esc: self.esc,
            str_start: self.str_start,
            str_item: self.str_item,
            num_start: self.num_start,
            json_from: self.json_from,
            closed_value: self.closed_value,
            lit_start: self.lit_start,
            item_done: self.item_done,
            searched: self.searched.len(),
            count: self.count,
        }
    }

    /// Undoes everything since `cp`.
    pub fn restore(&mut self, cp: Checkpoint) {
        self.bytes.truncate(cp.len);
        self.frames = cp.frames;
        self.in_str = cp.in_str;
        self.esc = cp.esc;
        self.str_start = cp.str_start;
        self.str_item = cp.str_item;
        self.num_start = cp.num_start;
        self.json_from = cp.json_from;
        self.closed_value = cp.closed_value;
        self.lit_start = cp.lit_start;
        self.item_done = cp.item_done;
        self.searched.truncate(cp.searched);
        self.count = cp.count;
    }

    /// The content of the open string, when it is an item of the innermost array or a key
    /// of the innermost object and the next byte `"` would close it.
    fn open_item(&self) -> Option<&[u8]> {
        if !self.in_str || self.esc || !self.str_item {
            return None;
        }
        self.frames.last()?;
        Some(&self.bytes[self.str_start as usize..])
    }

    /// The text of the number item being written, if any.
    fn number_item(&self) -> Option<&[u8]> {
        self.num_start.map(|start| &self.bytes[start as usize..])
    }

    /// True when `b` now would end an item equal to an earlier item of its array: the `"`
    /// closing a string item, or the byte after a number item.
    fn ending_repeats(&self, b: u8) -> bool {
        let (cur, num) = match self.number_item() {
            Some(cur) if !is_num_byte(b) => (cur, true),
            Some(_) => return false,
            None if b == b'"' => match self.open_item() {
                Some(cur) => (cur, false),
                None => return false,
            },
            None => return false,
        };
        let Some(f) = self.frames.last() else {
            return false;
        };
        f.items
            .iter()
            .any(|&(a, e, n)| n == num && &self.bytes[a as usize..e as usize] == cur)
    }

    /// The texts that would make the value being written here repeat an earlier item of
    /// the innermost array, each up to and including what ends it (a string's closing
    /// quote, [`NUM_END`] after a number): inside an open item, the rests of the earlier
    /// items of its kind it starts; where a new item may start, the earlier items (strings
    /// quoted). Empty when nothing here can repeat.
    fn pending_rests(&self) -> Vec<Vec<u8>> {
        if self.in_str {
            let mut rests = self.repeat_rests();
            for r in &mut rests {
                r.push(b'"');
            }
            return rests;
        }
        if let Some(cur) = self.number_item() {
            let Some(f) = self.frames.last() else {
                return Vec::new();
            };
            let mut out: Vec<Vec<u8>> = f
                .items
                .iter()
                .filter(|&&(_, _, n)| n)
                .map(|&(a, e, _)| &self.bytes[a as usize..e as usize])
                .filter(|it| it.starts_with(cur))
                .map(|it| [&it[cur.len()..], &[NUM_END]].concat())
                .collect();
            out.sort();
            out.dedup();
            return out;
        }
        let Some(f) = self.frames.last().filter(|f| f.expect_item) else {
            return Vec::new();
        };
        let mut out: Vec<Vec<u8>> = f
            .items
            .iter()
            .map(|&(a, e, n)| {
                let it = &self.bytes[a as usize..e as usize];
                if n {
                    [it, &[NUM_END]].concat()
                } else {
                    [b"\"", it, b"\""].concat()
                }
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Inside a string.
    fn in_string(&self) -> bool {
        self.in_str
    }

    /// Inside a number item, or where a new item may start: where digits continue or
    /// start a number item of the innermost array.
    fn at_number(&self) -> bool {
        self.num_start.is_some()
            || (!self.in_str && self.frames.last().is_some_and(|f| f.array && f.expect_item))
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
            .filter(|&&(_, _, n)| !n)
            .map(|&(a, e, _)| &self.bytes[a as usize..e as usize])
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
    lazy.retain_threads(nfa, c, |s| !nfa.in_unique(s))
}

/// Follows `bytes` from `c`, dropping the unique-item threads before a repeating item's
/// closing quote and the threads of counted strings that can no longer close within their
/// `maxLength` (`crate::length`); the tracker follows too. `DEAD` (tracker then undefined
/// past the point) when the text cannot continue.
pub(crate) fn advance(
    nfa: &Nfa,
    lazy: &mut Lazy,
    mut c: ConfigId,
    tracker: &mut JsonTracker,
    bytes: &[u8],
) -> ConfigId {
    for &b in bytes {
        if tracker.ending_repeats(b) {
            c = without_unique(nfa, lazy, c);
            if c == DEAD {
                return DEAD;
            }
        }
        if tracker.number_repeats(b) {
            return DEAD;
        }
        let opens = b == b'[' && opens_searched(nfa, lazy, c);
        c = lazy.step(nfa, c, b);
        if c == DEAD {
            return DEAD;
        }
        if !nfa.long_strings.is_empty() {
            c = crate::length::after_byte(nfa, lazy, c, &mut tracker.count, b);
            if c == DEAD {
                return DEAD;
            }
        }
        // Free text only comes first: once a byte was not text, none after it is.
        let text_so_far = !nfa.text_ranges.is_empty() && tracker.only_text();
        tracker.push(b);
        if opens {
            tracker.mark_searched();
        }
        // An object or array item equal to an earlier one just closed: drop the threads
        // that read it as an item of an array of unique values.
        if tracker.closed_value
            && lazy.configs[c as usize]
                .threads
                .iter()
                .any(|&(_, s)| nfa.in_unique_after(s))
            && tracker.closed_repeat()
        {
            c = lazy.retain_threads(nfa, c, |s| !nfa.in_unique_after(s));
            if c == DEAD {
                return DEAD;
            }
        }
        if text_so_far
            && lazy.configs[c as usize]
                .threads
                .iter()
                .any(|&(_, s)| nfa.in_text(s))
        {
            tracker.forget_json();
        }
    }
    c
}

/// Most steps [`can_end_new`] takes along the earlier items before it gives up (and the
/// prefix counts as unable to end: stricter, never looser).
const LIVE_BUDGET: u32 = 4096;

/// Can the text at `c` still end as a new item where it could repeat one? Inside whole
/// unique arrays (`Nfa::unique_arrays`) an item may have finitely many completions, all of
/// them earlier items (an `enum` used up, a `maxLength` string written up to an earlier
/// one's end). Elsewhere every prefix can end as a new item (free strings have infinitely
/// many completions) and this is true. Walks the earlier items' rests: a byte off all of
/// them that the automaton takes proves it.
pub(crate) fn can_end_new(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
) -> bool {
    let mut budget = LIVE_BUDGET;
    can_end_new_within(nfa, lazy, c, tracker, &mut budget) && searched_viable(nfa, lazy, c, tracker)
}

fn can_end_new_within(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
    budget: &mut u32,
) -> bool {
    if c == DEAD {
        return false;
    }
    if !lazy.configs[c as usize]
        .threads
        .iter()
        .any(|&(_, s)| nfa.in_unique_array(s))
    {
        return true;
    }
    let rests = tracker.pending_rests();
    if rests.is_empty() {
        return true;
    }
    let mut firsts: Vec<u8> = rests.iter().filter_map(|r| r.first().copied()).collect();
    firsts.sort_unstable();
    firsts.dedup();
    let set = lazy.next_bytes(nfa, c);
    let in_str = tracker.in_string();
    for b in crate::lazy::set_bytes(set) {
        // Whitespace between values never tells items apart: skipping it is safe.
        if firsts.binary_search(&b).is_ok() || (!in_str && b.is_ascii_whitespace()) {
            continue;
        }
        let cp = tracker.checkpoint();
        let n = advance(nfa, lazy, c, tracker, &[b]);
        // A new number item ends at `,` or `]`; after a `,` another item must be able
        // to start.
        let ok =
            n != DEAD && (in_str || b != b',' || can_end_new_within(nfa, lazy, n, tracker, budget));
        tracker.restore(cp);
        if ok {
            return true;
        }
    }
    for b in firsts {
        if *budget == 0 {
            return false;
        }
        *budget -= 1;
        let cp = tracker.checkpoint();
        let n = advance(nfa, lazy, c, tracker, &[b]);
        let ok = n != DEAD && can_end_new_within(nfa, lazy, n, tracker, budget);
        tracker.restore(cp);
        if ok {
            return true;
        }
    }
    false
}

/// Follows `bytes` like [`advance`], and refuses (`DEAD`) a text that can no longer end as
/// a new item ([`can_end_new`]); the tracker follows when the result is not `DEAD`.
pub(crate) fn advance_live(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
    bytes: &[u8],
) -> ConfigId {
    let cp = tracker.checkpoint();
    let n = advance(nfa, lazy, c, tracker, bytes);
    if n == DEAD || !can_end_new(nfa, lazy, n, tracker) {
        tracker.restore(cp);
        return DEAD;
    }
    n
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
    let ok = advance_live(nfa, lazy, c, tracker, bytes) != DEAD;
    tracker.restore(cp);
    ok
}

/// Clears from `mask` (the automaton's mask of `c`) the tokens that would repeat an item or
/// a key-loop key, or leave an item or key that can only end as a repeat.
pub(crate) fn refine_mask(
    nfa: &Nfa,
    lazy: &mut Lazy,
    vocab: &TokenVocab,
    c: ConfigId,
    tracker: &JsonTracker,
    mask: &mut [u32],
) {
    if nfa.has_unique_items() {
        // One copy for both passes: each check restores it (`allows`).
        let mut t = tracker.clone();
        refine_items(nfa, lazy, vocab, c, &mut t, mask);
        if !nfa.searched_opens.is_empty() && !tracker.searched.is_empty() {
            refine_searched(nfa, lazy, vocab, c, &mut t, mask);
        }
    }
    // Outside key-loop objects no key is refused (one a token opens has no keys before it).
    if !nfa.key_loops.is_empty() && lazy.in_key_loop_object(nfa, c) {
        keys::refine_keys(nfa, lazy, vocab, c, tracker, mask);
    }
}

/// Token `t`'s bit in `mask`.
fn mask_bit(mask: &[u32], t: u32) -> bool {
    mask[(t >> 5) as usize] >> (t & 31) & 1 == 1
}

/// Clears token `t` from `mask` (if set) when following its bytes from `c` is refused
/// ([`allows`]).
fn keep_if_allowed(
    nfa: &Nfa,
    lazy: &mut Lazy,
    vocab: &TokenVocab,
    c: ConfigId,
    tracker: &mut JsonTracker,
    mask: &mut [u32],
    t: u32,
) {
    if mask_bit(mask, t)
        && !vocab
            .token_bytes(t)
            .is_some_and(|b| allows(nfa, lazy, c, tracker, b))
    {
        mask[(t >> 5) as usize] &= !(1u32 << (t & 31));
    }
}

/// Inside a string: follows byte `b` (a pending escape in `esc`); true when it closes it.
pub(crate) fn closes_string(b: u8, esc: &mut bool) -> bool {
    if std::mem::take(esc) {
        false
    } else if b == b'\\' {
        *esc = true;
        false
    } else {
        b == b'"'
    }
}

/// The `uniqueItems` part of [`refine_mask`].
fn refine_items(
    nfa: &Nfa,
    lazy: &mut Lazy,
    vocab: &TokenVocab,
    c: ConfigId,
    tracker: &mut JsonTracker,
    mask: &mut [u32],
) {
    let threads = &lazy.configs[c as usize].threads;
    let has_unique = threads.iter().any(|&(_, s)| nfa.in_unique_item(s));
    let in_array = threads.iter().any(|&(_, s)| nfa.in_bounded_items(s));
    let check = |lazy: &mut Lazy, mask: &mut [u32], tracker: &mut JsonTracker, t: u32| {
        keep_if_allowed(nfa, lazy, vocab, c, tracker, mask, t)
    };
    if !nfa.unique_after.is_empty() {
        // Tokens that close a string, object or array item of an array with such items
        // before: each is followed (few are allowed where one can close). A string item
        // that no earlier item starts like cannot close as a repeat.
        let rests = tracker.open_string_rests();
        for (i, byte) in [b'}', b']', b'"'].into_iter().enumerate() {
            for &t in vocab.tokens_with_byte(byte).iter() {
                if !mask_bit(mask, t) {
                    continue;
                }
                let bytes = vocab.token_bytes(t).unwrap_or(&[]);
                // Each token once.
                if [b'}', b']'][..i].iter().any(|x| bytes.contains(x)) {
                    continue;
                }
                if tracker.may_close_value(bytes, rests.as_deref()) {
                    check(lazy, mask, tracker, t);
                }
            }
        }
    }
    if in_array && !tracker.in_string() {
        // Between items the automaton allows few tokens: check each — but digits that leave
        // the number being written (or started) a prefix of no earlier item cannot make a
        // repeat, nor a dead end (the automaton's mask keeps the number completable), so
        // they need no check: about 1,000 of Llama-3's number tokens are digits only.
        // (The rests digits may begin, sorted: those a token begins follow its position; a
        // rest ends in its item's end marker, so only tokens shorter than it can begin it.)
        let rests = tracker.at_number().then(|| {
            let mut r = tracker.pending_rests();
            r.retain(|r| r.first().is_some_and(u8::is_ascii_digit));
            let longest = r.iter().map(Vec::len).max().unwrap_or(0);
            (r, longest)
        });
        let begins_no_rest = |(rests, longest): &(Vec<Vec<u8>>, usize), digits: &[u8]| {
            if digits.len() >= *longest {
                return true;
            }
            let i = rests.partition_point(|r| r.as_slice() < digits);
            rests.get(i).is_none_or(|r| !r.starts_with(digits))
        };
        let words = mask.len();
        for wi in 0..words {
            let mut w = mask[wi];
            while w != 0 {
                let t = wi as u32 * 32 + w.trailing_zeros();
                w &= w - 1;
                if let (Some(rests), Some(b)) = (&rests, vocab.token_bytes(t)) {
                    if !b.is_empty() && b.iter().all(u8::is_ascii_digit) && begins_no_rest(rests, b)
                    {
                        continue;
                    }
                }
                check(lazy, mask, tracker, t);
            }
        }
        return;
    }
    if has_unique {
        let trie = vocab.trie();
        for rest in tracker.pending_rests() {
            // Tokens that end inside an earlier item's rest (bounded items only), and
            // those that write it to its closing quote.
            let mut path = Vec::with_capacity(rest.len());
            let found = trie.along(&rest, |n| path.push(n));
            if in_array {
                for &n in &path[..found.min(rest.len().saturating_sub(1))] {
                    for &t in trie.own_ids(n) {
                        check(lazy, mask, tracker, t);
                    }
                }
            }
            if found > 0 && found == rest.len() {
                for &t in trie.subtree_ids(path[found - 1]) {
                    check(lazy, mask, tracker, t);
                }
            }
        }
        if in_array {
            // A token that closes the item and starts another may find none left.
            for &t in vocab.tokens_with_byte(b',').iter() {
                check(lazy, mask, tracker, t);
            }
        }
    }
    for &t in vocab.multi_quote_tokens() {
        check(lazy, mask, tracker, t);
    }
}
