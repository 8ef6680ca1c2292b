//! `maxLength` enforced by counting characters while matching, for strings whose regex ×
//! count product would be too large to build (pydantic's `HttpUrl`: `format: uri` with
//! `maxLength: 2083` is ~2 million product states; word-count patterns with `maxLength:
//! 500`).
//!
//! The compiler emits such a string's body once, without the maximum, as a rule whose states
//! are recorded with it ([`crate::nfa::LongString`]: the characters inline, then the closing
//! quote). The matcher counts the characters written since the configuration entered those
//! states (the opening quote, outside them, is where counting starts) and, after every byte,
//! drops the threads in them that can no longer close within the maximum: a thread at `s`
//! survives when `count + chars_left(s) <= max` (fewest characters from `s` to the closing
//! quote; the bytes of an escape after its backslash, UTF-8 continuation bytes and the
//! quote count none). So the text never enters a state it cannot close from, and a string never
//! closes past its maximum. Characters are code points as JSON Schema counts them: a UTF-8
//! character or an escape (`\n`, `\u00e9`) is one; a surrogate pair written as two `\u`
//! escapes counts two (stricter by one, never looser).
//!
//! Masks: a token of `k` bytes adds at most `k` characters, so while `count + k + slack <=
//! max` for every counted string (`slack`: the most characters any of its states needs to
//! close, `LongString::reach`; `Nfa::long_room`) no thread can be dropped and the
//! automaton's mask is exact; only tokens longer than that, within a token's length of a
//! maximum, are looked at ([`refine_mask`]).

use crate::lazy::{ConfigId, Lazy, DEAD};
use crate::nfa::Nfa;
use crate::vocab::TokenVocab;

/// Escape state: after a backslash.
const AFTER_BACKSLASH: u8 = 5;

/// The characters of the counted string being written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Count {
    /// The configuration is inside a counted string.
    pub counting: bool,
    /// Characters written in it.
    chars: u32,
    /// Escape bytes still to come: [`AFTER_BACKSLASH`], or the hex digits left of `\u`.
    pub esc: u8,
}

impl Count {
    /// Characters of the open counted string (0 outside one).
    pub fn used(&self) -> u32 {
        if self.counting {
            self.chars
        } else {
            0
        }
    }

    /// Follows byte `b` of a counted string's body.
    fn push(&mut self, b: u8) {
        match self.esc {
            AFTER_BACKSLASH => self.esc = if b == b'u' { 4 } else { 0 },
            1..=4 => self.esc -= 1,
            _ if b == b'\\' => {
                self.chars += 1;
                self.esc = AFTER_BACKSLASH;
            }
            // The closing quote (a quote inside the string is escaped).
            _ if b == b'"' => {}
            _ if !(0x80..0xC0).contains(&b) => self.chars += 1,
            _ => {}
        }
    }
}

/// After the automaton took byte `b` into `c`: counts it and drops the threads of counted
/// strings that can no longer close within their maximum (`DEAD` when none is left).
pub(crate) fn after_byte(
    nfa: &Nfa,
    lazy: &mut Lazy,
    c: ConfigId,
    count: &mut Count,
    b: u8,
) -> ConfigId {
    let threads = &lazy.configs[c as usize].threads;
    if !threads.iter().any(|&(_, s)| nfa.long_string(s).is_some()) {
        *count = Count::default();
        return c;
    }
    if count.counting {
        count.push(b);
    } else {
        // `b` opened the string.
        *count = Count {
            counting: true,
            chars: 0,
            esc: 0,
        };
    }
    let used = count.chars;
    lazy.retain_threads(nfa, c, |s| {
        nfa.long_string(s).is_none_or(|l| l.fits(s, used))
    })
}

/// Clears from `mask` (the automaton's mask of `c`, already refined for unique items) the
/// tokens after which a counted string would pass its maximum or could no longer close.
///
/// Only tokens longer than the room left are looked at, longest first. Inside a counted
/// string (not within an escape), a token of plain string text stays in it and adds exactly
/// its characters: it is kept without a check when every counted thread here still has room
/// after it for the most characters any state it reaches needs to close, and refused without one when it passes every maximum and only
/// counted strings are open; the others are followed byte by byte.
///
/// `allows` follows a token's bytes with every rule of the matcher (`crate::unique::allows`).
pub(crate) fn refine_mask(
    nfa: &Nfa,
    lazy: &mut Lazy,
    vocab: &TokenVocab,
    c: ConfigId,
    count: Count,
    mask: &mut [u32],
    allows: &mut dyn FnMut(&mut Lazy, &[u8]) -> bool,
) {
    let used = count.used();
    let safe = nfa.long_room.saturating_sub(used) as usize;
    if safe >= vocab.max_token_len() {
        return;
    }
    let threads = &lazy.configs[c as usize].threads;
    let inside = count.counting && count.esc == 0;
    // Over the counted strings' threads here: the least `max - reach` and the largest `max`.
    let (mut keep_upto, mut most) = (u32::MAX, 0u32);
    let mut only_counted = true;
    for &(_, s) in threads.iter() {
        match nfa.long_string(s) {
            Some(l) => {
                keep_upto = keep_upto.min(l.max.saturating_sub(l.reach(s)));
                most = most.max(l.max);
            }
            None => only_counted = false,
        }
    }
    // Without unique items the counter is the only rule besides the automaton.
    let plain_only = !nfa.has_unique();
    let by_len = vocab.tokens_by_length();
    let n = by_len.lens.partition_point(|&l| l as usize > safe);
    let is_set = |mask: &[u32], t: u32| mask[(t >> 5) as usize] >> (t & 31) & 1 == 1;
    for i in 0..n {
        let t = by_len.ids[i];
        if !is_set(mask, t) {
            continue;
        }
        let chars = by_len.chars[i];
        if inside && chars != u32::MAX {
            let after = used.saturating_add(chars);
            if after <= keep_upto {
                continue;
            }
            if only_counted && after > most {
                mask[(t >> 5) as usize] &= !(1u32 << (t & 31));
                continue;
            }
        }
        let bytes = vocab.token_bytes(t).unwrap_or(&[]);
        if inside && chars != u32::MAX && plain_only {
            // A thread alive at the end of the token had live ancestors all along (a thread
            // that cannot close in time has no descendant that can), so the automaton's
            // own step and one look at its threads decide.
            let after = used.saturating_add(chars);
            let n = lazy.step_bytes(nfa, c, bytes);
            let alive = n != DEAD
                && lazy.configs[n as usize]
                    .threads
                    .iter()
                    .any(|&(_, s)| nfa.long_string(s).is_none_or(|l| l.fits(s, after)));
            if !alive {
                mask[(t >> 5) as usize] &= !(1u32 << (t & 31));
            }
            continue;
        }
        if !allows(lazy, bytes) {
            mask[(t >> 5) as usize] &= !(1u32 << (t & 31));
        }
    }
}
