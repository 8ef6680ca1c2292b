//! Arrays whose items may run out of new values (`json/unique.rs::unique_searched`: closed
//! objects, unions with numbers, literals or bounded strings, any value): the tracker marks
//! them at their `[` ([`crate::nfa::Nfa::searched_opens`]), compares their numbers and
//! literals by value too, and every step inside one is checked with [`searched_viable`];
//! masks follow the tokens that could leave only repeats ([`refine_searched`]). See the
//! parent module's docs.

use super::{closes_string, is_num_byte, keep_if_allowed, mask_bit, new_value_text, JsonTracker};
use crate::lazy::{ConfigId, Lazy, DEAD};
use crate::nfa::Nfa;
use crate::vocab::TokenVocab;

impl JsonTracker {
    /// The innermost open container is an array whose items are searched (and recorded by
    /// value whatever their kind).
    pub(super) fn top_searched(&self) -> bool {
        !self.searched.is_empty()
            && self
                .frames
                .last()
                .is_some_and(|f| f.array && self.searched.binary_search(&f.start).is_ok())
    }

    /// True when `b` now would end a number item equal to an earlier item of a searched
    /// array (numbers have no closing byte of their own: the byte after one is refused).
    pub(super) fn number_repeats(&self, b: u8) -> bool {
        let Some(start) = self
            .num_start
            .filter(|_| !is_num_byte(b) && self.top_searched())
        else {
            return false;
        };
        let Some(form) = crate::canon::canonical(&self.bytes[start as usize..]) else {
            return true;
        };
        self.frames.last().is_some_and(|f| {
            f.values
                .iter()
                .any(|v| v.as_deref() == Some(form.as_slice()))
        })
    }

    /// The `[` just followed opens an array whose items are searched
    /// ([`crate::nfa::Nfa::searched_opens`]).
    pub(super) fn mark_searched(&mut self) {
        if let Some(f) = self.frames.last().filter(|f| f.array) {
            self.searched.push(f.start);
        }
    }

    /// The open arrays whose items are searched, as frame indexes, outermost first.
    pub(super) fn searched_frames(&self) -> Vec<usize> {
        if self.searched.is_empty() {
            return Vec::new();
        }
        (0..self.frames.len())
            .filter(|&i| {
                let f = &self.frames[i];
                f.array && self.searched.binary_search(&f.start).is_ok()
            })
            .collect()
    }

    /// Could the item being written in the array at frame `fi` (or the one about to start
    /// there) still end equal to an earlier item? Tells too, when the text is in a string
    /// that is the item or the value of one of the item's members, the rests (UTF-16) of
    /// the earlier items' strings there that the open string starts (what keeps one a
    /// candidate); `None` when not such a string or when that cannot be told. Earlier
    /// items rule themselves out by a complete member they lack or have otherwise, or by
    /// an open string they do not start with: members are never taken back, so once no
    /// earlier item is left, none comes back.
    pub(super) fn item_may_repeat(&self, fi: usize) -> (bool, Option<Vec<Vec<u16>>>) {
        let f = &self.frames[fi];
        if f.values.is_empty() {
            return (false, None);
        }
        if f.values.iter().any(Option::is_none) {
            // Too deep to compare: equal to each other (stricter).
            return (true, None);
        }
        let earlier = f.values.iter().flatten();
        if self.frames.len() == fi + 1 {
            if !(self.in_str && self.str_item) {
                // Between items: any of them may come again.
                return (true, None);
            }
            let open = crate::canon::open_string_units(&self.bytes[self.str_start as usize..]);
            let Some((units, true)) = open else {
                return (true, None);
            };
            let rests: Vec<Vec<u16>> = earlier
                .filter_map(|v| {
                    let mut it = crate::canon::string_units(v)?;
                    units
                        .iter()
                        .all(|&u| it.next() == Some(u))
                        .then(|| it.collect())
                })
                .collect();
            return (!rests.is_empty(), Some(rests));
        }
        let item = &self.frames[fi + 1];
        if item.array {
            return (true, None);
        }
        let Some(o) = crate::canon::open_object(&self.bytes[item.start as usize..]) else {
            return (true, None);
        };
        let mut keys: Vec<&[u8]> = o.members.iter().map(|(k, _)| k.as_slice()).collect();
        keys.extend(o.open_key.as_deref());
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            // A repeated key: the last value counts (stricter to keep every candidate).
            return (true, None);
        }
        let in_member_string = self.in_str && self.frames.len() == fi + 2;
        let mut rests = Vec::new();
        let mut any = false;
        for v in earlier {
            if v.first() != Some(&b'o') {
                continue;
            }
            let find = |k: &[u8]| crate::canon::member_value(v, k);
            if !o
                .members
                .iter()
                .all(|(k, val)| find(k) == Some(val.as_slice()))
            {
                continue;
            }
            let Some(k) = &o.open_key else {
                any = true;
                continue;
            };
            let Some(val) = find(k) else {
                continue;
            };
            match (&o.open_string, in_member_string) {
                (Some(units), true) => {
                    let Some(mut it) = crate::canon::string_units(val) else {
                        continue;
                    };
                    if units.iter().all(|&u| it.next() == Some(u)) {
                        rests.push(it.collect());
                        any = true;
                    }
                }
                _ => any = true,
            }
        }
        let rests = (in_member_string && o.open_string.is_some()).then_some(rests);
        (any, rests)
    }

    /// Would `bytes`, written from here, close nothing: no string closed or escape written,
    /// no `}`, `]` or `,` outside strings (so no item ends and no repeat can be refused on
    /// the way)?
    pub(super) fn closes_nothing(&self, bytes: &[u8]) -> bool {
        if self.esc {
            return false;
        }
        let mut in_str = self.in_str;
        for &b in bytes {
            match (in_str, b) {
                (_, b'\\') | (true, b'"') | (false, b'}' | b']' | b',') => return false,
                (false, b'"') => in_str = true,
                _ => {}
            }
        }
        true
    }

    /// Would `bytes`, written from here, put a `,` directly in the array at frame `fi`
    /// (and so start another of its items)?
    pub(super) fn writes_item_comma(&self, bytes: &[u8], fi: usize) -> bool {
        let (mut in_str, mut esc) = (self.in_str, self.esc);
        let mut depth = self.frames.len();
        for &b in bytes {
            if in_str {
                in_str = !closes_string(b, &mut esc);
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'[' | b'{' => depth += 1,
                b']' | b'}' => {
                    if depth <= fi + 1 {
                        return false;
                    }
                    depth -= 1;
                }
                b',' if depth == fi + 1 => return true,
                _ => {}
            }
        }
        false
    }
}

/// Does a thread of `c` take a `[` into an array whose items are searched
/// (`Nfa::searched_opens`)?
pub(super) fn opens_searched(nfa: &Nfa, lazy: &Lazy, c: ConfigId) -> bool {
    !nfa.searched_opens.is_empty()
        && lazy.configs[c as usize].threads.iter().any(|&(_, s)| {
            nfa.states[s as usize].bytes.iter().any(|&(a, b, t)| {
                (a..=b).contains(&b'[') && nfa.searched_opens.binary_search(&t).is_ok()
            })
        })
}

/// A thread of `c` is in a string or key body that takes any number more characters
/// ([`Nfa::in_open_loop`]): infinitely many different values can be written from here,
/// so no item being written can run out of new ones.
fn in_open_loop(nfa: &Nfa, lazy: &Lazy, c: ConfigId) -> bool {
    lazy.configs[c as usize]
        .threads
        .iter()
        .any(|&(_, s)| nfa.in_open_loop(s))
}

/// The number item being written (after `more`, digits) is an integer with a nonzero first
/// digit and no fraction or exponent, and some digit leads `c` (the configuration after
/// `more`) back to itself: appending digits writes infinitely many different values.
fn open_integer(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &JsonTracker,
    more: &[u8],
) -> bool {
    let cur = tracker.number_item().unwrap_or(b"");
    let text = cur.strip_prefix(b"-").unwrap_or(cur);
    let first = text.first().or(more.first());
    first.is_some_and(|&d| (b'1'..=b'9').contains(&d))
        && text.iter().chain(more).all(u8::is_ascii_digit)
        && (b'0'..=b'9').any(|d| lazy.step(nfa, c, d) == c)
}

/// Most steps one [`searched_viable`] search takes before it gives up (and the prefix
/// counts as unable to end as a new item: stricter, never looser).
const SEARCH_BUDGET: u32 = 4096;

/// Inside arrays whose items are searched (`Nfa::searched_opens`: closed objects and
/// other items that may run out of new values): can each item being written (or about to
/// start) still end as a value no earlier item of its array has? Only asked where an
/// earlier item is still a candidate ([`JsonTracker::item_may_repeat`]) and no thread is
/// in an open string; then a search for a text that closes the item as a new value
/// ([`new_value_text`], within [`SEARCH_BUDGET`] steps) decides.
pub(super) fn searched_viable(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    tracker: &mut JsonTracker,
) -> bool {
    if c == DEAD || nfa.searched_opens.is_empty() || tracker.searched.is_empty() {
        return true;
    }
    let frames = tracker.searched_frames();
    if frames.is_empty() || in_open_loop(nfa, lazy, c) {
        return true;
    }
    for &fi in frames.iter().rev() {
        // Right after an item (which just closed as a new value): `]` or `,` next.
        let after_item = tracker.frames.len() == fi + 1
            && !tracker.in_str
            && !tracker.frames[fi].expect_item
            && tracker.num_start.is_none()
            && tracker.lit_start.is_none();
        if after_item
            || (tracker.frames.len() == fi + 1 && open_integer(nfa, lazy, c, tracker, b""))
            || !tracker.item_may_repeat(fi).0
        {
            continue;
        }
        if new_value_text(nfa, lazy, c, tracker, fi + 1, SEARCH_BUDGET).is_none() {
            return false;
        }
    }
    true
}

/// The searched-items part of [`refine_mask`] (`Nfa::searched_opens`): clears the tokens
/// after which an item could only end as a repeat. Only tokens that keep an earlier item a
/// candidate ([`JsonTracker::item_may_repeat`]) or start another item can do that: where
/// no earlier item is left, only those writing a `,` into the array are followed; inside
/// a string, those along the candidates' rests (and escapes); elsewhere, every allowed
/// token, those that end in an open string loop without closing anything by one automaton
/// walk.
pub(super) fn refine_searched(
    nfa: &Nfa,
    lazy: &mut Lazy,
    vocab: &TokenVocab,
    c: ConfigId,
    tracker: &mut JsonTracker,
    mask: &mut [u32],
) {
    let frames = tracker.searched_frames();
    let Some(&fi) = frames.last() else {
        return;
    };
    let check = |lazy: &mut Lazy, mask: &mut [u32], tracker: &mut JsonTracker, t: u32| {
        keep_if_allowed(nfa, lazy, vocab, c, tracker, mask, t)
    };
    let (may, rests) = tracker.item_may_repeat(fi);
    // An enclosing searched item that may still repeat: its candidates are not followed
    // here, so every token is checked.
    let outer = frames[..frames.len() - 1]
        .iter()
        .any(|&f| tracker.item_may_repeat(f).0);
    if outer || (may && (!tracker.in_str || rests.is_none())) {
        let words = mask.len();
        for wi in 0..words {
            let mut w = mask[wi];
            while w != 0 {
                let t = wi as u32 * 32 + w.trailing_zeros();
                w &= w - 1;
                let Some(bytes) = vocab.token_bytes(t) else {
                    continue;
                };
                // Ending in an open string loop, or in an integer item that takes more
                // digits, closing nothing on the way: the walk alone decides.
                if tracker.closes_nothing(bytes) {
                    let n = lazy.step_bytes(nfa, c, bytes);
                    let integer_item = tracker.frames.len() == fi + 1
                        && !tracker.in_str
                        && bytes.iter().all(u8::is_ascii_digit);
                    if n != DEAD
                        && (in_open_loop(nfa, lazy, n)
                            || (integer_item && open_integer(nfa, lazy, n, tracker, bytes)))
                    {
                        continue;
                    }
                }
                check(lazy, mask, tracker, t);
            }
        }
        return;
    }
    if let (true, Some(rests)) = (may, &rests) {
        // Tokens that write on along a candidate's rest (to its closing quote and past
        // it); a rest is followed as plain UTF-8 up to its first character that needs an
        // escape (tokens with escapes are all checked).
        let trie = vocab.trie();
        for rest in rests {
            let text = String::from_utf16_lossy(rest);
            let plain: String = text
                .chars()
                .take_while(|&ch| ch != '"' && ch != '\\' && ch >= ' ')
                .collect();
            let whole = plain.len() == text.len();
            let mut path_text = plain.into_bytes();
            if whole {
                path_text.push(b'"');
            }
            let mut path = Vec::with_capacity(path_text.len());
            let found = trie.along(&path_text, |n| path.push(n));
            for &n in &path[..found] {
                for &t in trie.own_ids(n) {
                    check(lazy, mask, tracker, t);
                }
            }
            if whole && found == path_text.len() && found > 0 {
                for &t in trie.subtree_ids(path[found - 1]) {
                    check(lazy, mask, tracker, t);
                }
            }
        }
        // Tokens with escapes: followed when what they write in the string, decoded, keeps a
        // candidate (or cannot be decoded on its own).
        for &t in vocab.tokens_with_byte(b'\\').iter() {
            if !mask_bit(mask, t) {
                continue;
            }
            let bytes = vocab.token_bytes(t).unwrap_or(&[]);
            let mut esc = false;
            let cut = bytes.iter().position(|&b| closes_string(b, &mut esc));
            let body = &bytes[..cut.unwrap_or(bytes.len())];
            let keeps = tracker.esc
                || match crate::canon::open_string_units(body) {
                    Some((u, true)) => rests
                        .iter()
                        .any(|r| r.starts_with(&u) && (cut.is_none() || r.len() == u.len())),
                    // Cut short inside an escape: what it starts with must start a rest.
                    Some((u, false)) => cut.is_none() && rests.iter().any(|r| r.starts_with(&u)),
                    None => true,
                };
            if keeps {
                check(lazy, mask, tracker, t);
            }
        }
    }
    // Tokens that start another item.
    for &t in vocab.tokens_with_byte(b',').iter() {
        if mask_bit(mask, t)
            && vocab
                .token_bytes(t)
                .is_some_and(|b| tracker.writes_item_comma(b, fi))
        {
            check(lazy, mask, tracker, t);
        }
    }
}
