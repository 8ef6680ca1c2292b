//! Grammar compilation (regex, JSON Schema, GBNF, choices) and the matcher
//! (`sglrs_grammar`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher, TokenVocab, Whitespace};

use crate::input::Input;

/// Longest grammar text tried.
const MAX_GRAMMAR: usize = 2048;
/// Tokens one input may feed.
const MAX_STEPS: usize = 32;

const EOS: u32 = 0;
const SPECIAL: u32 = 1;

/// EOS, a special token, every single byte, and multi-byte tokens that cross JSON and UTF-8
/// boundaries (what makes a mask differ from a byte set).
fn vocab() -> Arc<TokenVocab> {
    static VOCAB: OnceLock<Arc<TokenVocab>> = OnceLock::new();
    VOCAB
        .get_or_init(|| {
            let mut tokens: Vec<Vec<u8>> = vec![Vec::new(), b"<|special|>".to_vec()];
            tokens.extend((0..=255u8).map(|b| vec![b]));
            for t in [
                &b"\"name\":"[..],
                b"{\"",
                b"\":",
                b"\",\"",
                b"true",
                b"false",
                b"null",
                b"  ",
                b"\n  ",
                b"ab",
                b"abc",
                b"123",
                b"0.5",
                b"-1",
                b"\\u00",
                b"\\\"",
                "é".as_bytes(),
                b"\xe2\x82",
                b"\xac",
                b"},",
                b"[]",
                b"\"}",
                b"]}",
                b"yes",
                b"no",
            ] {
                tokens.push(t.to_vec());
            }
            Arc::new(TokenVocab::new(tokens, &[SPECIAL], &[EOS]).expect("a valid vocabulary"))
        })
        .clone()
}

fn bit(mask: &[u32], t: u32) -> bool {
    mask[(t / 32) as usize] & (1 << (t % 32)) != 0
}

/// The first byte picks the grammar kind (regex, JSON Schema, GBNF, choices) and compile
/// options; a length-prefixed text is compiled; the rest of the input picks tokens, each
/// either one the mask allows or any id. Asserts at every step: the mask and
/// [`Matcher::is_allowed`] agree on every token; a live matcher allows at least one token
/// (states that cannot complete are trimmed, so alive means completable); the forced bytes
/// advance the matcher; the closing bytes advance it to an accepting state;
/// [`Matcher::accept_token`] accepts exactly the tokens the mask allows (a refused one puts
/// it in its sticky error state, with an all-zero mask); a rollback restores the mask.
pub fn grammar(data: &[u8]) {
    let mut inp = Input::new(data);
    let head = inp.u8();
    let len = usize::from(inp.u16()).min(MAX_GRAMMAR);
    let text = String::from_utf8_lossy(inp.bytes(len)).into_owned();
    let opts = CompileOptions {
        whitespace: if head & 4 != 0 {
            Whitespace::Flexible
        } else {
            Whitespace::Compact
        },
        lenient: head & 8 != 0,
        allow_undeclared_properties: head & 16 != 0,
        any_property_order: head & 32 != 0,
        max_states: 50_000,
        timeout: Some(Duration::from_millis(500)),
        mask_cache_bytes: 1 << 20,
        max_configs: if head & 64 != 0 { 64 } else { 20_000 },
    };
    let vocab = vocab();
    let compiled = match head % 4 {
        0 => CompiledGrammar::regex(&text, vocab.clone(), &opts),
        1 => CompiledGrammar::json_schema(&text, vocab.clone(), &opts),
        2 => CompiledGrammar::ebnf(&text, vocab.clone(), &opts),
        _ => {
            let choices: Vec<String> = text.split('\n').map(str::to_string).collect();
            CompiledGrammar::choices(&choices, vocab.clone(), &opts)
        }
    };
    let Ok(g) = compiled else { return };
    let _ = (g.num_states(), g.heap_bytes());
    let n = vocab.len() as u32;
    let mut m = Matcher::new(g);
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut prev: Option<Vec<u32>> = None;
    for _ in 0..MAX_STEPS {
        m.fill_mask(&mut mask).expect("the mask is long enough");
        let allowed: Vec<u32> = (0..n).filter(|&t| bit(&mask, t)).collect();
        for t in 0..n {
            assert_eq!(
                m.is_allowed(t),
                bit(&mask, t),
                "mask and is_allowed disagree on {t}"
            );
        }
        assert!(!bit(&mask, SPECIAL), "a special token is allowed");
        assert!(!allowed.is_empty(), "a live matcher allows no token");
        let forced = m.forced_bytes();
        if !forced.is_empty() {
            let mut f = m.clone();
            assert!(
                f.try_advance_bytes(&forced),
                "forced bytes {forced:?} do not advance"
            );
        }
        let closing = m.closing_bytes();
        if closing.len() < 1 << 16 {
            let mut c = m.clone();
            assert!(
                closing.is_empty() || c.try_advance_bytes(&closing),
                "closing bytes {closing:?} do not advance"
            );
            assert!(
                c.is_accepting(),
                "closing bytes {closing:?} do not complete the text"
            );
            assert_eq!(c.min_bytes_to_accept(), 0);
        }
        assert_eq!(
            m.is_accepting(),
            bit(&mask, EOS),
            "EOS bit and is_accepting disagree"
        );
        if inp.is_empty() {
            break;
        }
        let pick = inp.u8();
        if pick & 0xc0 == 0xc0 && m.num_tokens() > 0 {
            if let Some(p) = &prev {
                m.rollback(1).expect("one token to roll back");
                m.fill_mask(&mut mask).expect("the mask is long enough");
                assert_eq!(&mask, p, "a rollback does not restore the mask");
                prev = None;
                continue;
            }
        }
        let t = if pick & 1 == 0 {
            allowed[usize::from(inp.u8()) % allowed.len()]
        } else {
            u32::from(inp.u16()) % (n + 2)
        };
        let ok = t < n && bit(&mask, t);
        prev = Some(mask.clone());
        match m.accept_token(t) {
            Ok(()) => assert!(ok, "token {t} accepted against the mask"),
            Err(e) => {
                assert!(!ok, "token {t} allowed by the mask was refused: {e}");
                assert!(m.error().is_some());
                m.fill_mask(&mut mask).expect("the mask is long enough");
                assert!(
                    mask.iter().all(|&w| w == 0),
                    "a failed matcher allows tokens"
                );
                assert!(m.accept_token(t).is_err(), "the error is not sticky");
                return;
            }
        }
        if t == EOS {
            assert!(m.is_finished(), "not finished after EOS");
            m.fill_mask(&mut mask).expect("the mask is long enough");
            assert!(mask.iter().all(|&w| w == 0), "tokens allowed after EOS");
            return;
        }
    }
}
