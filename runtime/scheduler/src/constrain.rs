//! Grammar steps of the scheduler: the token mask (with steering to a valid close near the
//! token limit) and jump-forward over forced text.

use super::seq::Seq;
use super::Tokenizer;
use sglrs_grammar::Matcher;

/// Tokens before the limit at which the closing text is planned each step.
const STEER_WINDOW: usize = 64;

/// Fills `mask` for the next token of a constrained sequence with `remaining` tokens left
/// before `max_new_tokens`.
///
/// Far from the limit this is the matcher's mask. Within [`STEER_WINDOW`] tokens the
/// shortest completion (`closing_bytes`, tokenized greedily) is planned every step; once it
/// needs all remaining tokens, only its first token is allowed, so the output closes validly
/// instead of being cut off. A complete output with one token left may only end.
pub(crate) fn fill_mask(m: &Matcher, mask: &mut [u32], remaining: usize) {
    if m.fill_mask(mask).is_err() {
        mask.fill(0);
        return;
    }
    if remaining > STEER_WINDOW {
        return;
    }
    let vocab = m.grammar().vocab();
    let closing = m.closing_bytes();
    if closing.is_empty() {
        if remaining <= 1 && m.is_accepting() {
            only(mask, vocab.eos());
        }
        return;
    }
    let Some(plan) = vocab.greedy_tokenize(&closing) else {
        return;
    };
    if plan.len() + 1 >= remaining {
        if let Some(&first) = plan.first() {
            if m.is_allowed(first) {
                only(mask, &[first]);
            }
        }
    }
}

fn only(mask: &mut [u32], tokens: &[u32]) {
    mask.fill(0);
    for &t in tokens {
        if let Some(w) = mask.get_mut((t / 32) as usize) {
            *w |= 1 << (t % 32);
        }
    }
}

/// The tokens of the text the grammar forces next (jump-forward), at most `limit` of them.
///
/// The forced bytes are tokenized by the model's tokenizer (the segmentation the model would
/// most likely have produced) and checked against a copy of the matcher; if that
/// segmentation does not fit the grammar token by token, the vocabulary's greedy
/// tokenization of the bytes is used instead. Returns `None` when nothing is forced.
pub(crate) fn forced_tokens(s: &Seq, tok: &dyn Tokenizer, limit: usize) -> Option<Vec<u32>> {
    let m = s.matcher.as_ref()?;
    if limit == 0 {
        return None;
    }
    let forced = m.forced_bytes();
    if forced.is_empty() {
        return None;
    }
    let fits = |toks: &[u32]| {
        let mut probe = m.clone();
        toks.iter()
            .all(|&t| probe.is_allowed(t) && probe.accept_token(t).is_ok())
    };
    let by_tokenizer = std::str::from_utf8(&forced)
        .ok()
        .and_then(|text| tok.encode_text(text).ok())
        .filter(|t| !t.is_empty() && fits(t));
    let mut toks = match by_tokenizer {
        Some(t) => t,
        None => m
            .grammar()
            .vocab()
            .greedy_tokenize(&forced)
            .filter(|t| fits(t))?,
    };
    toks.truncate(limit);
    (!toks.is_empty()).then_some(toks)
}
