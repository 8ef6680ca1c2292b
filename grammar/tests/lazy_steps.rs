//! The lazy automaton's byte steps are exact on their own, checked against an independent
//! matcher (not against itself, as the mask tests' byte-by-byte reference is).
//!
//! Transition rows are indexed by *byte class* (bytes no byte range of the grammar tells
//! apart share one entry), and the epsilon closure stamps the first stack under which it
//! meets each NFA state instead of hashing every thread. A wrong class boundary would make
//! a byte just outside a range step like one inside it, and a wrong stamp would drop a
//! thread that reaches a state already met under another stack; either changes which texts
//! are accepted. So: regexes full of adjacent and nested ranges are fed random strings of
//! the bytes around every range end and compared with `regex-automata`'s own matcher, and
//! grammars whose rules are called from several places in one closure are fed every short
//! text over their alphabet and compared with a direct definition of their language.

mod common;

use rand::{Rng, SeedableRng};
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

/// Patterns with many range ends close together (ASCII only, so byte and character
/// semantics agree).
const PATTERNS: &[&str] = &[
    "[a-fx-z0-3]+q[^a-m]*",
    "(ab|a[c-e]|[\\x00-\\x1f]z)*",
    "[!-/][0-9]{2,3}([:-@]|[\\[-`])*",
    "([A-Z][a-z]*|[{-~]+)(_[0-9a-fA-F]+)?",
    "x[^x]y[^y]z[^z]",
    "([b-c][e-f][h-i]|[a-j]k)+",
];

/// Whether `text` fed byte by byte leaves the matcher accepting.
fn accepts(g: &std::sync::Arc<CompiledGrammar>, text: &[u8]) -> bool {
    let mut m = Matcher::new(g.clone());
    m.try_advance_bytes(text) && m.is_accepting()
}

#[test]
fn byte_classes_step_like_the_ranges() {
    let vocab = common::byte_vocab();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for p in PATTERNS {
        let g = CompiledGrammar::regex(p, vocab.clone(), &CompileOptions::default()).unwrap();
        let oracle = regex_automata::meta::Regex::new(&format!("^(?:{p})$")).unwrap();
        // Bytes at or next to the range ends of the patterns' classes, plus letters.
        let mut alphabet: Vec<u8> = b"abcdefghijklmnopqrstuvwxyzq_".to_vec();
        for b in [
            0x00u8, 0x1f, 0x20, b'!', b'/', b'0', b'3', b'4', b'9', b':', b'@', b'A', b'F', b'G',
            b'Z', b'[', b'`', b'{', b'~', 0x7f,
        ] {
            alphabet.push(b);
            alphabet.push(b.wrapping_add(1) & 0x7f);
            alphabet.push(b.wrapping_sub(1) & 0x7f);
        }
        let check = |text: &[u8]| {
            let want = oracle.is_match(text);
            assert_eq!(
                accepts(&g, text),
                want,
                "{p}: {:?}",
                String::from_utf8_lossy(text)
            );
            want
        };
        for _ in 0..2000 {
            let n = rng.random_range(0..10);
            let text: Vec<u8> = (0..n)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            check(&text);
        }
        // Texts the grammar accepts (random walks over the bytes its masks allow), each
        // also with every byte swapped for its neighbours (just across a range end).
        let mut mask = vec![0u32; vocab.mask_words()];
        let mut accepted = 0;
        for _ in 0..300 {
            let mut m = Matcher::new(g.clone());
            let mut text = Vec::new();
            while text.len() < 12 && !(m.is_accepting() && rng.random_range(0..4) == 0) {
                m.fill_mask(&mut mask).unwrap();
                let ok: Vec<u8> = (0u32..=255)
                    .filter(|&b| mask[((b + 1) / 32) as usize] >> ((b + 1) % 32) & 1 == 1)
                    .map(|b| b as u8)
                    .filter(|b| b.is_ascii())
                    .collect();
                let Some(&b) = ok.get(rng.random_range(0..ok.len().max(1))) else {
                    break;
                };
                assert!(m.try_advance_bytes(&[b]));
                text.push(b);
            }
            if !m.is_accepting() {
                continue;
            }
            accepted += check(&text) as usize;
            for i in 0..text.len() {
                for d in [1u8, 0x7f] {
                    let mut t = text.clone();
                    t[i] = t[i].wrapping_add(d) & 0x7f;
                    check(&t);
                }
            }
        }
        assert!(accepted >= 100, "{p}: only {accepted} accepted walks");
    }
}

/// Whether a text is in a grammar's language, written out directly.
type Language = fn(&[u8]) -> bool;

#[test]
fn rules_called_from_several_places_in_one_closure() {
    let vocab = common::byte_vocab();
    // `a` is called from two places reached by epsilon moves from the start: its start
    // state is met under two stacks in one closure, and both threads must live.
    let cases: &[(&str, Language)] = &[
        (
            "root ::= a \"x\" | a \"y\" | b a \"w\"\na ::= \"z\" | \"zz\" | b\nb ::= \"v\" | \"\"",
            |t| {
                let ends = |t: &[u8], e: u8| -> bool {
                    // a = z | zz | v | "" ; b = v | "".
                    let Some((&last, body)) = t.split_last() else {
                        return false;
                    };
                    if last != e {
                        return false;
                    }
                    let a = |s: &[u8]| matches!(s, b"z" | b"zz" | b"v" | b"");
                    match e {
                        b'w' => a(body) || body.first() == Some(&b'v') && a(&body[1..]),
                        _ => a(body),
                    }
                };
                ends(t, b'x') || ends(t, b'y') || ends(t, b'w')
            },
        ),
        (
            // Nested calls of one rule in one closure: `p` starts with `p` through `q`.
            "root ::= p\np ::= \"(\" q \")\" | \"k\"\nq ::= p | p p | \"\"",
            |t| {
                // p = "(" ("" | p | p p) ")" | "k": balanced, every "()" group holds at
                // most two p's. `lens` gives every length of a p at the start of `t`.
                fn lens(t: &[u8]) -> Vec<usize> {
                    let mut out = Vec::new();
                    if t.first() == Some(&b'k') {
                        out.push(1);
                    }
                    if t.first() == Some(&b'(') {
                        let mut inner = vec![0usize];
                        for l1 in lens(&t[1..]) {
                            inner.push(l1);
                            for l2 in lens(&t[1 + l1..]) {
                                inner.push(l1 + l2);
                            }
                        }
                        for l in inner {
                            if t.get(1 + l) == Some(&b')') {
                                out.push(l + 2);
                            }
                        }
                    }
                    out
                }
                lens(t).contains(&t.len())
            },
        ),
    ];
    for (grammar, lang) in cases {
        let g = CompiledGrammar::ebnf(grammar, vocab.clone(), &CompileOptions::default())
            .unwrap_or_else(|e| panic!("{grammar}: {e}"));
        let alphabet: Vec<u8> = b"xyzwv()k".to_vec();
        let mut texts: Vec<Vec<u8>> = vec![Vec::new()];
        let mut all = Vec::new();
        for _ in 0..6 {
            let mut next = Vec::new();
            for t in &texts {
                for &b in &alphabet {
                    let mut u = t.clone();
                    u.push(b);
                    next.push(u);
                }
            }
            all.extend(texts);
            texts = next;
        }
        all.extend(texts);
        let mut yes = 0;
        for t in &all {
            let want = lang(t);
            assert_eq!(
                accepts(&g, t),
                want,
                "{grammar}: {:?}",
                String::from_utf8_lossy(t)
            );
            yes += want as usize;
        }
        assert!(yes >= 5, "{grammar}: only {yes} texts accepted");
    }
}
