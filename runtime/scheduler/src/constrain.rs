//! Grammar steps of the scheduler: the token mask (kept within what a valid close needs
//! before the token limit) and jump-forward over forced text.

use super::seq::Seq;
use super::Tokenizer;
use sglrs_grammar::Matcher;

/// Fills `mask` for the next token of a constrained sequence with `remaining` tokens left
/// before `max_new_tokens` (this one included).
///
/// The matcher's mask, less the tokens after which the grammar's planned close
/// ([`Matcher::closing_tokens`]) would no longer fit in the tokens left
/// ([`Matcher::restrict_mask_to_budget`]): the close plans through every open call, so a
/// recursive schema nested deep still closes by the limit. A request admitted with room for
/// the close from the start (the server checks) thus always ends with a complete output. A
/// complete output with one token left may only end. An error of the matcher (a grammar
/// too ambiguous to follow) leaves an empty mask and is returned: the request ends with it.
pub(crate) fn fill_mask(
    m: &Matcher,
    mask: &mut [u32],
    remaining: usize,
) -> Result<(), sglrs_grammar::MatchError> {
    if let Err(e) = m.fill_mask(mask) {
        mask.fill(0);
        return Err(e);
    }
    if remaining <= 1 && m.is_accepting() {
        only(mask, m.grammar().vocab().eos());
        return Ok(());
    }
    m.restrict_mask_to_budget(mask, remaining);
    Ok(())
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
    // The model's segmentation may take more tokens than the planned close: jump only when
    // the close still fits in what is left after the jump (`limit` keeps one token spare).
    let mut probe = m.clone();
    for &t in &toks {
        probe.accept_token(t).ok()?;
    }
    if !probe.close_fits(limit + 1 - toks.len()) {
        return None;
    }
    (!toks.is_empty()).then_some(toks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sglrs_grammar::{CompileOptions, CompiledGrammar, TokenVocab};
    use std::sync::Arc;

    /// A toy vocabulary: EOS (0), the printable bytes, and one token that closes a label and
    /// opens the next level, whose close takes two tokens (`]` and `}` are separate).
    fn vocab() -> Arc<TokenVocab> {
        let mut tokens: Vec<Vec<u8>> = vec![Vec::new()];
        tokens.extend((0x20u8..0x7f).map(|b| vec![b]));
        tokens.push(br#"{"label":""#.to_vec());
        tokens.push(br#"","children":[{"label":""#.to_vec());
        tokens.push(br#"","children":["#.to_vec());
        Arc::new(TokenVocab::new(tokens, &[], &[0]).unwrap())
    }

    /// The tree node of issue #22: the generator that always opens the next level, under
    /// the scheduler's mask, still ends with a complete tree at every budget that fits one.
    #[test]
    fn deepest_generator_closes_a_recursive_schema_by_the_limit() {
        let schema = r##"{"type":"object","properties":{"label":{"type":"string","maxLength":20},
            "children":{"type":"array","maxItems":2,"items":{"$ref":"#"}}},
            "required":["label","children"],"additionalProperties":false}"##;
        let v = vocab();
        let g =
            CompiledGrammar::json_schema(schema, v.clone(), &CompileOptions::default()).unwrap();
        let mut mask = vec![0u32; v.mask_words()];
        for budget in [g.min_output_tokens(), 10, 40, 200] {
            let mut m = Matcher::new(g.clone());
            for used in 0..budget {
                fill_mask(&m, &mut mask, budget - used).unwrap();
                // Highest id first: the level-opening token, then EOS last of all.
                let pick = (1..v.len() as u32)
                    .rev()
                    .chain([0])
                    .find(|&t| mask[(t / 32) as usize] >> (t % 32) & 1 == 1)
                    .expect("a token is allowed");
                m.accept_token(pick).unwrap();
                if pick == 0 || m.is_finished() {
                    break;
                }
            }
            assert!(m.is_accepting(), "budget {budget}: cut off");
        }
    }
}
