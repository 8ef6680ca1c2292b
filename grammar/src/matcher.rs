//! The per-request matcher: follows accepted tokens and fills token masks.

use std::sync::Arc;

use crate::lazy::{ConfigId, DEAD};
use crate::unique::{self, JsonTracker};
use crate::{CompiledGrammar, MatchError};

/// The text so far, for grammars that enforce `uniqueItems` (`crate::unique`) or count the
/// characters of long strings (`crate::length`).
#[derive(Debug, Clone, Default)]
struct UniqueText {
    tracker: JsonTracker,
    /// Tracker length at each history entry.
    marks: Vec<usize>,
    /// The tracker's count of the open counted string at each history entry.
    counts: Vec<crate::length::Count>,
}

/// Per-request state over a shared [`CompiledGrammar`]: cheap to create, owns its history.
///
/// Errors are sticky: after a rejected token every call reports the same error.
#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<CompiledGrammar>,
    /// Configuration after each accepted token (index 0: the start).
    history: Vec<ConfigId>,
    /// EOS was accepted (it is the last history entry).
    ended: bool,
    error: Option<MatchError>,
    uniq: Option<Box<UniqueText>>,
}

impl Matcher {
    /// A matcher at the start of the grammar.
    pub fn new(grammar: Arc<CompiledGrammar>) -> Self {
        let start = grammar.start_config();
        let uniq = (grammar.has_unique() || grammar.has_long_strings()).then(|| {
            let mut tracker = JsonTracker::default();
            if grammar.has_unique_values() {
                tracker.set_values();
            }
            Box::new(UniqueText {
                tracker,
                marks: vec![0],
                counts: vec![Default::default()],
            })
        });
        Matcher {
            grammar,
            history: vec![start],
            ended: false,
            error: None,
            uniq,
        }
    }

    /// The grammar this matcher follows.
    pub fn grammar(&self) -> &Arc<CompiledGrammar> {
        &self.grammar
    }

    fn current(&self) -> ConfigId {
        *self.history.last().unwrap_or(&DEAD)
    }

    /// The sticky error, if any.
    pub fn error(&self) -> Option<&MatchError> {
        self.error.as_ref()
    }

    /// Fills `mask` (one bit per token id, `u32` words, at least
    /// [`crate::TokenVocab::mask_words`] long): bit set = token allowed next. EOS is allowed
    /// only where the text so far is complete; special tokens never. After an error or EOS
    /// the mask is all zero.
    pub fn fill_mask(&self, mask: &mut [u32]) -> Result<(), MatchError> {
        let vocab = self.grammar.vocab();
        let words = vocab.mask_words();
        if mask.len() < words {
            return Err(MatchError::MaskTooShort {
                got: mask.len(),
                need: words,
            });
        }
        if self.error.is_some() || self.ended {
            mask[..words].fill(0);
            return Ok(());
        }
        let c = self.current();
        let accept = self.grammar.with_lazy(|nfa, lazy| {
            lazy.fill_mask(nfa, vocab, c, mask);
            if let Some(u) = &self.uniq {
                if nfa.has_unique() {
                    unique::refine_mask(nfa, lazy, vocab, c, &u.tracker, &mut mask[..words]);
                }
                if !nfa.long_strings.is_empty() {
                    let mut t = u.tracker.clone();
                    let count = t.count;
                    let mut allows = |lazy: &mut crate::lazy::Lazy, bytes: &[u8]| {
                        unique::allows(nfa, lazy, c, &mut t, bytes)
                    };
                    crate::length::refine_mask(
                        nfa,
                        lazy,
                        vocab,
                        c,
                        count,
                        &mut mask[..words],
                        &mut allows,
                    );
                }
            }
            lazy.configs[c as usize].accept
        });
        if let Some(e) = self.grammar.poison_error() {
            mask[..words].fill(0);
            return Err(e);
        }
        if accept {
            for &e in vocab.eos() {
                mask[(e >> 5) as usize] |= 1u32 << (e & 31);
            }
        }
        Ok(())
    }

    /// Would `token` be accepted now (same answer as the mask bit)?
    pub fn is_allowed(&self, token: u32) -> bool {
        if self.error.is_some() || self.ended {
            return false;
        }
        let vocab = self.grammar.vocab();
        let c = self.current();
        if vocab.eos().contains(&token) {
            return self
                .grammar
                .with_lazy(|_, lazy| lazy.configs[c as usize].accept);
        }
        if !vocab.is_usable(token) {
            return false;
        }
        let bytes = vocab.token_bytes(token).unwrap_or(&[]);
        let ok = self.grammar.with_lazy(|nfa, lazy| match &self.uniq {
            Some(u) => unique::allows(nfa, lazy, c, &mut u.tracker.clone(), bytes),
            None => lazy.step_bytes(nfa, c, bytes) != DEAD,
        });
        ok && self.grammar.poison_error().is_none()
    }

    /// Follows `bytes` from `c` (tracking the text when the grammar needs it); `DEAD` leaves
    /// the tracker as it was. (Fields, not `&mut self`, so `bytes` may borrow the grammar.)
    fn advance(
        grammar: &CompiledGrammar,
        uniq: &mut Option<Box<UniqueText>>,
        c: ConfigId,
        bytes: &[u8],
    ) -> ConfigId {
        grammar.with_lazy(|nfa, lazy| match uniq {
            Some(u) => {
                let cp = u.tracker.checkpoint();
                let n = unique::advance_live(nfa, lazy, c, &mut u.tracker, bytes);
                if n == DEAD {
                    u.tracker.restore(cp);
                }
                n
            }
            None => lazy.step_bytes(nfa, c, bytes),
        })
    }

    fn push_history(&mut self, c: ConfigId) {
        self.history.push(c);
        if let Some(u) = &mut self.uniq {
            u.marks.push(u.tracker.len());
            u.counts.push(u.tracker.count);
        }
    }

    /// Accepts one token. A token the grammar does not allow puts the matcher in its
    /// (sticky) error state.
    pub fn accept_token(&mut self, token: u32) -> Result<(), MatchError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.ended {
            let e = MatchError::AfterEnd { token };
            self.error = Some(e.clone());
            return Err(e);
        }
        let vocab = self.grammar.vocab();
        let c = self.current();
        if vocab.eos().contains(&token) {
            let accept = self
                .grammar
                .with_lazy(|_, lazy| lazy.configs[c as usize].accept);
            if accept {
                self.push_history(c);
                self.ended = true;
                return Ok(());
            }
            let e = MatchError::Rejected {
                token,
                position: self.history.len() - 1,
            };
            self.error = Some(e.clone());
            return Err(e);
        }
        let next = if vocab.is_usable(token) {
            let bytes = vocab.token_bytes(token).unwrap_or(&[]);
            Self::advance(&self.grammar, &mut self.uniq, c, bytes)
        } else {
            DEAD
        };
        if let Some(e) = self.grammar.poison_error() {
            self.error = Some(e.clone());
            return Err(e);
        }
        if next == DEAD {
            let e = MatchError::Rejected {
                token,
                position: self.history.len() - 1,
            };
            self.error = Some(e.clone());
            return Err(e);
        }
        self.push_history(next);
        Ok(())
    }

    /// Feeds raw bytes (e.g. forced bytes a runtime tokenizes itself, or text checks).
    /// Returns false (and changes nothing) when the bytes cannot continue the text.
    pub fn try_advance_bytes(&mut self, bytes: &[u8]) -> bool {
        if self.error.is_some() || self.ended {
            return false;
        }
        let c = self.current();
        let n = Self::advance(&self.grammar, &mut self.uniq, c, bytes);
        if let Some(e) = self.grammar.poison_error() {
            self.error = Some(e);
            return false;
        }
        if n == DEAD {
            return false;
        }
        self.push_history(n);
        true
    }

    /// Undoes the last `n` accepted tokens (or byte advances, EOS included). Errors are
    /// sticky and survive a rollback.
    pub fn rollback(&mut self, n: usize) -> Result<(), MatchError> {
        if n + 1 > self.history.len() {
            return Err(MatchError::RollbackTooFar {
                requested: n,
                available: self.history.len() - 1,
            });
        }
        for _ in 0..n {
            self.history.pop();
            self.ended = false;
        }
        if let Some(u) = &mut self.uniq {
            u.marks.truncate(self.history.len());
            u.counts.truncate(self.history.len());
            let len = u.marks.last().copied().unwrap_or(0);
            u.tracker.truncate(len);
            u.tracker.count = u.counts.last().copied().unwrap_or_default();
        }
        Ok(())
    }

    /// Tokens accepted so far (including EOS).
    pub fn num_tokens(&self) -> usize {
        self.history.len() - 1
    }

    /// True when the text so far is complete (EOS would be allowed).
    pub fn is_accepting(&self) -> bool {
        if self.error.is_some() {
            return false;
        }
        let c = self.current();
        self.grammar
            .with_lazy(|_, lazy| lazy.configs[c as usize].accept)
    }

    /// True when EOS was accepted, or the text is complete and nothing can follow.
    pub fn is_finished(&self) -> bool {
        if self.error.is_some() {
            return false;
        }
        if self.ended {
            return true;
        }
        let c = self.current();
        self.grammar.with_lazy(|_, lazy| {
            let cfg = &lazy.configs[c as usize];
            cfg.accept && cfg.threads.is_empty()
        })
    }

    /// Bytes fully determined from here (jump-forward): the longest string every valid
    /// continuation starts with, stopping where the text could also end.
    pub fn forced_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.error.is_some() || self.ended {
            return out;
        }
        let mut c = self.current();
        self.grammar.with_lazy(|nfa, lazy| {
            while out.len() < 4096 {
                if lazy.configs[c as usize].accept {
                    break;
                }
                let set = lazy.next_bytes(nfa, c);
                let count: u32 = set.iter().map(|w| w.count_ones()).sum();
                if count != 1 {
                    break;
                }
                let b = set
                    .iter()
                    .enumerate()
                    .find(|(_, w)| **w != 0)
                    .map(|(i, w)| (i as u32 * 64 + w.trailing_zeros()) as u8)
                    .unwrap_or(0);
                out.push(b);
                c = lazy.step(nfa, c, b);
                if c == DEAD {
                    break;
                }
            }
            // Forced text never closes a repeated item (item bodies always have other
            // completions), but check: keep only what the full rules allow.
            if let Some(u) = &self.uniq {
                let mut t = u.tracker.clone();
                let mut cfg = self.current();
                let mut keep = 0;
                for &b in &out {
                    cfg = unique::advance(nfa, lazy, cfg, &mut t, &[b]);
                    if cfg == DEAD {
                        break;
                    }
                    keep += 1;
                }
                out.truncate(keep);
            }
        });
        out
    }

    /// Lower bound on the bytes still needed before the text is complete (0 when accepting).
    pub fn min_bytes_to_accept(&self) -> usize {
        if self.ended {
            return 0;
        }
        if self.error.is_some() {
            return usize::MAX;
        }
        let c = self.current();
        self.grammar
            .with_lazy(|_, lazy| lazy.configs[c as usize].min_bytes as usize)
    }

    /// Lower bound on the tokens still needed before EOS is allowed (0 when accepting):
    /// `ceil(min_bytes / longest token)`. Cheap; [`Matcher::closing_tokens`] is the planned
    /// close in tokens (an upper bound that can always be followed).
    pub fn min_tokens_to_accept(&self) -> usize {
        let b = self.min_bytes_to_accept();
        if b == usize::MAX {
            return usize::MAX;
        }
        b.div_ceil(self.grammar.vocab().max_token_len().max(1))
    }

    /// Tokens of the planned close from here: the shortest completing text
    /// ([`Matcher::closing_bytes`], without the `uniqueItems` detours) spelt in the fewest
    /// vocabulary tokens. 0 when accepting; `usize::MAX` when no close is planned (past the
    /// error or a close longer than 64 KiB). After the plan's first token it is one less, so
    /// a generator that keeps it within the tokens left always ends validly.
    pub fn closing_tokens(&self) -> usize {
        if self.ended {
            return 0;
        }
        if self.error.is_some() {
            return usize::MAX;
        }
        let c = self.current();
        let vocab = self.grammar.vocab();
        let k = self
            .grammar
            .with_lazy(|nfa, lazy| lazy.close_cost(nfa, vocab, c));
        if k == u32::MAX {
            usize::MAX
        } else {
            k as usize
        }
    }

    /// True when the planned close fits in `tokens_left` tokens
    /// ([`Matcher::closing_tokens`] `<= tokens_left`); cheap far from the limit.
    pub fn close_fits(&self, tokens_left: usize) -> bool {
        if self.ended {
            return true;
        }
        if self.error.is_some() {
            return false;
        }
        let c = self.current();
        let vocab = self.grammar.vocab();
        let left = tokens_left.min(u32::MAX as usize - 1) as u32;
        self.grammar
            .with_lazy(|nfa, lazy| lazy.close_fits(nfa, vocab, c, left))
    }

    /// Clears in a mask [`Matcher::fill_mask`] filled the tokens after which the planned
    /// close ([`Matcher::closing_tokens`]) would no longer fit: `tokens_left` counts the
    /// tokens the output may still take, this one included. Tokens that shorten the plan are
    /// always kept, so the mask is never emptied by the budget: from a text whose plan
    /// already exceeds the budget it still closes as fast as it can. EOS bits are left as
    /// they are.
    ///
    /// Cheap far from the limit (one comparison with a bound on any close of the grammar);
    /// near it, the first visit of a configuration walks the token trie once and remembers
    /// the costliest token, so later visits with as many tokens left are one lookup.
    pub fn restrict_mask_to_budget(&self, mask: &mut [u32], tokens_left: usize) {
        if self.error.is_some() || self.ended {
            return;
        }
        let after = tokens_left.saturating_sub(1).min(u32::MAX as usize - 1) as u32;
        let c = self.current();
        let vocab = self.grammar.vocab();
        let words = vocab.mask_words().min(mask.len());
        self.grammar.with_lazy(|nfa, lazy| {
            lazy.restrict_to_budget(nfa, vocab, c, &mut mask[..words], after)
        });
    }

    /// The shortest byte string that completes the text from here (empty when accepting);
    /// a runtime near `max_tokens` can force it to close the output validly.
    pub fn closing_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.error.is_some() || self.ended {
            return out;
        }
        let mut c = self.current();
        let mut tracker = self.uniq.as_ref().map(|u| u.tracker.clone());
        self.grammar.with_lazy(|nfa, lazy| {
            while out.len() < 1 << 16 {
                let m = lazy.configs[c as usize].min_bytes;
                if m == 0 || m == u32::MAX {
                    break;
                }
                // With unique items, where the shortest close could repeat an item, the
                // shortest step that keeps a new item possible.
                if let Some(t) = &mut tracker {
                    if let Some(b) = unique::closing_step(nfa, lazy, c, t) {
                        c = unique::advance(nfa, lazy, c, t, &[b]);
                        if c == DEAD {
                            break;
                        }
                        out.push(b);
                        continue;
                    }
                }
                let set = lazy.next_bytes(nfa, c);
                let mut found = None;
                for b in crate::lazy::set_bytes(set) {
                    let n = lazy.step(nfa, c, b);
                    if n != DEAD && lazy.configs[n as usize].min_bytes == m - 1 {
                        found = Some((b, n));
                        break;
                    }
                }
                // With object items compared as values, where the shortest close would
                // end a repeated item, the shortest text that ends it as a new one.
                if let (Some(t), Some((b, _))) = (&mut tracker, found) {
                    if !nfa.unique_after.is_empty() && !unique::allows(nfa, lazy, c, t, &[b]) {
                        if let Some(path) = unique::closing_detour(nfa, lazy, c, t) {
                            c = unique::advance(nfa, lazy, c, t, &path);
                            if c == DEAD {
                                break;
                            }
                            out.extend_from_slice(&path);
                            continue;
                        }
                    }
                }
                match found {
                    Some((b, n)) => {
                        out.push(b);
                        c = match &mut tracker {
                            // The same step, counted strings' threads filtered too.
                            Some(t) => unique::advance(nfa, lazy, c, t, &[b]),
                            None => n,
                        };
                        if c == DEAD {
                            break;
                        }
                    }
                    None => break,
                }
            }
        });
        out
    }
}
