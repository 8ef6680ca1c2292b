//! The regex matcher accepts exactly what regex-automata fully matches, on random strings.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use regex_automata::meta::Regex;
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher, TokenVocab};

fn byte_vocab() -> Arc<TokenVocab> {
    let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
    toks.extend((0u8..=255).map(|b| vec![b]));
    Arc::new(TokenVocab::new(toks, &[], &[0]).unwrap())
}

#[test]
fn regex_matches_regex_automata_on_random_strings() {
    let vocab = byte_vocab();
    let patterns = [
        r"[a-c]*d",
        r"(ab|a)(bc|c)?",
        r"a{2,4}b{0,2}",
        r"[0-9]{1,3}(\.[0-9]{1,3}){3}",
        r"(x|y|z)+q?",
        r"h(é|e)llo|wörld",
        r"(a|b)*abb",
        r"[^ab]{2}",
        r"^ab*c$",
        r"",
    ];
    let alphabet: Vec<&str> = vec![
        "a", "b", "c", "d", "x", "y", "z", "q", "h", "é", "e", "l", "o", "w", "ö", "r", ".", "1",
        "9", "2",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for p in patterns {
        let g = CompiledGrammar::regex(p, vocab.clone(), &CompileOptions::default()).unwrap();
        let re = Regex::new(&format!("^(?:{p})$")).unwrap();
        for _ in 0..3000 {
            let len = rng.random_range(0..8);
            let s: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let mut m = Matcher::new(g.clone());
            let ours = s.bytes().all(|b| m.accept_token(b as u32 + 1).is_ok()) && m.is_accepting();
            assert_eq!(ours, re.is_match(&s), "pattern {p:?} on {s:?}");
        }
    }
    // Known members and non-members, so both outcomes are exercised.
    for (p, yes, no) in [
        (r"h(é|e)llo|wörld", "héllo", "hëllo"),
        (r"[0-9]{1,3}(\.[0-9]{1,3}){3}", "10.0.255.1", "10.0.255"),
        (r"(a|b)*abb", "babb", "abba"),
        (r"^ab*c$", "abbbc", "ac "),
    ] {
        let g = CompiledGrammar::regex(p, vocab.clone(), &CompileOptions::default()).unwrap();
        for (s, want) in [(yes, true), (no, false)] {
            let mut m = Matcher::new(g.clone());
            let ours = s.bytes().all(|b| m.accept_token(b as u32 + 1).is_ok()) && m.is_accepting();
            assert_eq!(ours, want, "{p:?} on {s:?}");
        }
    }
}

#[test]
fn regex_prefix_liveness_is_exact() {
    // A prefix is alive iff some extension matches: check with brute-force extensions.
    let vocab = byte_vocab();
    let g = CompiledGrammar::regex(r"(ab|cd)e{2}", vocab, &CompileOptions::default()).unwrap();
    let re = Regex::new(r"^(?:(ab|cd)e{2})$").unwrap();
    let alpha = [b'a', b'b', b'c', b'd', b'e'];
    let mut all = vec![Vec::new()];
    for _ in 0..5 {
        let mut next = Vec::new();
        for s in &all {
            for &c in &alpha {
                let mut t: Vec<u8> = s.clone();
                t.push(c);
                next.push(t);
            }
        }
        all.extend(next.clone());
        all.dedup();
        if all.len() > 5000 {
            break;
        }
    }
    for s in &all {
        let mut m = Matcher::new(g.clone());
        let alive = s.iter().all(|&b| m.accept_token(b as u32 + 1).is_ok());
        let completable = all
            .iter()
            .any(|t| t.starts_with(s) && re.is_match(std::str::from_utf8(t).unwrap()));
        assert_eq!(alive, completable, "{:?}", String::from_utf8_lossy(s));
    }
}
