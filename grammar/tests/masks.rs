//! Masks are exact: on random walks, `fill_mask` allows a token iff feeding its bytes one by
//! one keeps the matcher alive, for both real tokenizers. Also jump-forward, rollback,
//! closing bytes, GBNF, choices and the background cache.

mod common;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use sglrs_grammar::{
    CacheConfig, CompileOptions, CompiledGrammar, GrammarCache, GrammarSpec, Matcher,
};

const SCHEMAS: &[&str] = &[
    r#"{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","items":{"enum":["a","b","ccc"]},"maxItems":3},"email":{"type":"string","format":"email"}},"required":["name","age"]}"#,
    r##"{"$defs":{"node":{"type":"object","properties":{"v":{"type":"number"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"}"##,
    r#"{"anyOf":[{"type":"string","pattern":"^[a-z]+-[0-9]{2}$"},{"type":"boolean"},{"type":"null"}]}"#,
    r#"{"type":"array","items":{"type":"string"},"maxItems":2}"#,
];

fn check_walks(tok: &common::Tok, g: &Arc<CompiledGrammar>, seed: u64, walks: usize, steps: usize) {
    let vocab = &tok.vocab;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut mask = vec![0u32; vocab.mask_words()];
    for _ in 0..walks {
        let mut m = Matcher::new(g.clone());
        for _ in 0..steps {
            // Slow reference: feed each token's bytes one at a time.
            let allowed = check_here(tok, &m, &mut mask);
            assert!(
                !allowed.is_empty(),
                "a live matcher always allows something"
            );
            let id = allowed[rng.random_range(0..allowed.len())];
            m.accept_token(id).unwrap();
            if m.is_finished() {
                break;
            }
        }
    }
}

/// Checks every token's mask bit against the byte-by-byte reference at one position.
fn check_here(tok: &common::Tok, m: &Matcher, mask: &mut [u32]) -> Vec<u32> {
    common::check_mask(&tok.vocab, m, mask, b"")
}

/// Follows `text` token by token from a fresh matcher of `g`, checking the whole mask
/// against the byte-by-byte reference at every position (each valid token allowed), and
/// that the text ends accepting.
fn check_along(tok: &common::Tok, g: &Arc<CompiledGrammar>, text: &str) {
    let mut m = Matcher::new(g.clone());
    let mut mask = vec![0u32; tok.vocab.mask_words()];
    for id in tok.tokenize(text) {
        let allowed = check_here(tok, &m, &mut mask);
        assert!(allowed.contains(&id), "valid token {id} allowed in {text}");
        m.accept_token(id).unwrap();
    }
    check_here(tok, &m, &mut mask);
    assert!(m.is_accepting());
}

/// Follows a valid text token by token and checks the whole mask at every position:
/// declared keys beside undeclared ones, nested "any value" rules, escapes, counted,
/// pattern and format strings — the configurations whose masks are split per thread.
#[test]
fn masks_exact_along_valid_text() {
    let schema = r#"{"type":"object","properties":{"name":{"type":"string"},"nickname":{"type":"string","maxLength":5},"nested":{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z0-9_]+$"},"note":{"anyOf":[{"type":"string"},{"type":"integer"}]}}},"when":{"type":"string","format":"date-time"}},"required":["name"]}"#;
    let text = r#"{"name":"Al \"x\" é","nickname":"abc","extra":{"k":[1,"s",{"n":null}],"name2":"v"},"nested":{"id":"a_1","note":"hi","more":"yes"},"when":"2020-01-01T00:00:00Z"}"#;
    for tok in [common::llama3(), common::mistral()].into_iter().flatten() {
        let g = CompiledGrammar::json_schema(schema, tok.vocab.clone(), &CompileOptions::default())
            .unwrap();
        check_along(tok, &g, text);
    }
}

/// Objects with many declared keys and undeclared ones allowed: every key position is a
/// configuration of many threads under two stacks (the remaining declared keys' literals
/// and the "other key" rule's call), whose mask is the union of per-thread masks with
/// frame-independent parts (`lazy/threads.rs`). The text and the random walks go through
/// tokens that finish an undeclared key's value and go on past its rule's return (`":1,"`,
/// `":true}`), the only tokens checked against the real stack, at two nesting depths.
#[test]
fn masks_exact_at_many_key_positions() {
    let schema = r#"{"type":"object","properties":{"alpha":{"type":"string"},"beta":{"type":"integer"},"gamma":{"type":"boolean"},"delta":{"type":"string","maxLength":8},"epsilon":{"type":"number"},"zeta":{"type":"object","properties":{"k1":{"type":"integer"},"k2":{"type":"string"},"k3":{"type":"boolean"},"k4":{"type":"integer"},"k5":{"type":"null"},"k6":{"type":"string"},"k7":{"type":"integer"},"k8":{"type":"string"}},"additionalProperties":{"type":"integer"}},"eta":{"type":"string"},"theta":{"type":"array","items":{"type":"integer"}},"iota":{"type":"string"},"kappa":{"type":"boolean"},"lambda":{"type":"string"},"mu":{"type":"integer"}}}"#;
    let text = r#"{"alpha":"a","x":1,"beta":2,"y":true,"gamma":false,"zz":"q","zeta":{"k1":1,"o":7,"k2":"s","k4":4,"p":5,"k8":"t"},"w":{"u":[1,{}]},"eta":"e","kappa":true,"v":null,"mu":3}"#;
    for tok in [common::llama3(), common::mistral()].into_iter().flatten() {
        for opts in [
            CompileOptions::default(),
            CompileOptions::flexible(),
            common::schema_order(),
        ] {
            let g = CompiledGrammar::json_schema(schema, tok.vocab.clone(), &opts).unwrap();
            check_along(tok, &g, text);
            check_walks(tok, &g, 31, 3, 30);
        }
    }
}

/// Strings that loop on a class of characters other than all plain ones (patterns,
/// unanchored searches, negated classes with and without non-ASCII characters): their masks
/// take the class-loop parts (tokens made of class characters, tails after the class
/// prefix, the full trie for the other first bytes), also at the shared positions of a
/// long counted pattern string (a class character leads to the representative's
/// equivalent). Checked at every position of a text
/// with multi-byte characters, escapes and tokens that leave the loop, plus random walks.
#[test]
fn masks_exact_in_character_class_loops() {
    let schema = r#"{"type":"object","properties":{"kind":{"type":"string","pattern":"wifi"},"name":{"type":"string","pattern":"^[A-Za-z0-9_][^<>*#.%&:\\+?/]*$"},"path":{"type":"string","pattern":"^\\w+[\\\\](\\w+\\.)*\\w+\\.dll$"},"slug":{"type":"string","pattern":"^[a-z0-9 _-]+$"},"hex":{"type":"string","pattern":"^[0-9a-fA-F]+$"},"long":{"type":"string","pattern":"^[A-Za-z0-9_][^<>*#.%&:\\+?/]*$","maxLength":300}},"additionalProperties":false}"#;
    let long = format!(
        r#"{{"hex":"a","long":"{}"}}"#,
        r#"Lorem ipsum dolor sit amet, é ü 表 consectetur adipiscing elit; sed do \\ eiusmod \"tempor\" "#
            .repeat(3)
    );
    let texts = [
        r#"{"kind":"my wifi né","name":"Azure Blob é ü 表 x","path":"bins\\bts1.dll","slug":"a b_c-d","hex":"00ffAB"}"#,
        r#"{"kind":"x\"y wif wifi","name":"_a\" 😀 Z","path":"a\\b.c.dll","slug":"zz","hex":"9"}"#,
        long.as_str(),
    ];
    for tok in [common::llama3(), common::mistral()].into_iter().flatten() {
        let g = CompiledGrammar::json_schema(schema, tok.vocab.clone(), &CompileOptions::default())
            .unwrap();
        for text in texts {
            check_along(tok, &g, text);
        }
        check_walks(tok, &g, 77, 4, 25);
    }
}

/// Long counted strings (`maxLength` > 64 calls one character rule per position): the
/// positions far from both ends share one mask representative. Checked along texts that run
/// from the start to the very end of the count (where the masks differ again), with
/// `minLength` before and inside the shared range, escapes and multi-byte characters, and
/// two counted strings alive in one configuration.
#[test]
fn masks_exact_along_long_counted_strings() {
    let schema = r#"{"type":"object","properties":{"a":{"type":"string","maxLength":150},"b":{"type":"string","minLength":3,"maxLength":300},"c":{"anyOf":[{"type":"string","maxLength":140},{"type":"string","minLength":140,"maxLength":400}]},"d":{"type":"array","items":{"type":"string","minLength":130,"maxLength":270}}},"additionalProperties":false}"#;
    // `n` characters (a quote among them, written escaped), as a JSON string literal.
    let long = |n: usize| -> String {
        let s: String = "ab é\"z\t12 ".chars().cycle().take(n).collect();
        serde_json::to_string(&s).unwrap()
    };
    let text = format!(
        r#"{{"a":{},"b":{},"c":{},"d":[{},{}]}}"#,
        long(150),
        long(40),
        long(141),
        long(130),
        long(270)
    );
    for tok in [common::llama3(), common::mistral()].into_iter().flatten() {
        let g = CompiledGrammar::json_schema(schema, tok.vocab.clone(), &CompileOptions::default())
            .unwrap();
        check_along(tok, &g, &text);
        check_walks(tok, &g, 77, 2, 40);
    }
}

#[test]
fn masks_exact_llama3() {
    let Some(tok) = common::llama3() else { return };
    for (i, s) in SCHEMAS.iter().enumerate() {
        for (j, opts) in [CompileOptions::default(), common::schema_order()]
            .iter()
            .enumerate()
        {
            let g = CompiledGrammar::json_schema(s, tok.vocab.clone(), opts).unwrap();
            check_walks(tok, &g, (i + 50 * j) as u64, 2, 12);
        }
    }
    let g = CompiledGrammar::regex(
        r"[0-9]{3}-(ab|cd)+x?",
        tok.vocab.clone(),
        &CompileOptions::default(),
    )
    .unwrap();
    check_walks(tok, &g, 9, 2, 8);
}

#[test]
fn masks_exact_mistral() {
    let Some(tok) = common::mistral() else { return };
    for (i, s) in SCHEMAS.iter().enumerate() {
        let g = CompiledGrammar::json_schema(s, tok.vocab.clone(), &CompileOptions::flexible())
            .unwrap();
        check_walks(tok, &g, 100 + i as u64, 2, 12);
    }
}

#[test]
fn jump_forward_returns_required_keys() {
    let Some(tok) = common::llama3() else { return };
    let s = r#"{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"integer"}},"required":["city","zip"],"additionalProperties":false}"#;
    // Schema order (the server's policy): every key is forced.
    let g = CompiledGrammar::json_schema(s, tok.vocab.clone(), &common::schema_order()).unwrap();
    let mut m = Matcher::new(g);
    assert_eq!(m.forced_bytes(), br#"{"city":""#.to_vec());
    assert!(m.try_advance_bytes(br#"{"city":"Paris""#));
    assert_eq!(m.forced_bytes(), br#","zip":"#.to_vec());
    assert!(m.min_tokens_to_accept() >= 1);
    let close = m.closing_bytes();
    assert!(m.try_advance_bytes(&close));
    assert!(
        m.is_accepting(),
        "closing bytes {:?} complete the text",
        String::from_utf8_lossy(&close)
    );
    // Any order (the default): the key is the model's choice, its rest is forced.
    let g = CompiledGrammar::json_schema(s, tok.vocab.clone(), &CompileOptions::default()).unwrap();
    let mut m = Matcher::new(g);
    assert_eq!(m.forced_bytes(), br#"{""#.to_vec());
    assert!(m.try_advance_bytes(br#"{"z"#));
    assert_eq!(m.forced_bytes(), br#"ip":"#.to_vec());
    assert!(m.try_advance_bytes(br#"ip":7,"#));
    assert_eq!(m.forced_bytes(), br#""city":""#.to_vec());
}

#[test]
fn rollback_and_sticky_errors() {
    let Some(tok) = common::llama3() else { return };
    let g = CompiledGrammar::regex(r"(yes|no)!", tok.vocab.clone(), &CompileOptions::default())
        .unwrap();
    let mut m = Matcher::new(g);
    let ids = tok.tokenize("yes!");
    for &id in &ids {
        m.accept_token(id).unwrap();
    }
    assert!(m.is_accepting());
    m.rollback(ids.len()).unwrap();
    assert!(!m.is_accepting());
    let bad = tok.tokenize("maybe")[0];
    assert!(m.accept_token(bad).is_err());
    assert!(m.accept_token(ids[0]).is_err(), "errors are sticky");
    assert!(m.rollback(100).is_err());
}

#[test]
fn gbnf_and_choices() {
    let Some(tok) = common::llama3() else { return };
    let gbnf = r#"
root ::= "[" ws item ("," ws item)* "]"   # a list
item ::= [a-z]+ | num
num  ::= "-"? [0-9]{1,3}
ws   ::= " "?
"#;
    let g = CompiledGrammar::ebnf(gbnf, tok.vocab.clone(), &CompileOptions::default()).unwrap();
    for (text, ok) in [
        ("[abc, 12,-7]", true),
        ("[]", false),
        ("[1234]", false),
        ("[x,y]", true),
    ] {
        let mut m = Matcher::new(g.clone());
        let acc = m.try_advance_bytes(text.as_bytes()) && m.is_accepting();
        assert_eq!(acc, ok, "{text}");
    }
    assert!(CompiledGrammar::ebnf(
        "root ::= foo",
        tok.vocab.clone(),
        &CompileOptions::default()
    )
    .is_err());
    let c = CompiledGrammar::choices(
        &["red".into(), "green".into()],
        tok.vocab.clone(),
        &CompileOptions::default(),
    )
    .unwrap();
    let mut m = Matcher::new(c);
    assert!(m.try_advance_bytes(b"gr"));
    assert_eq!(m.forced_bytes(), b"een");
}

#[test]
fn cache_compiles_in_background() {
    let Some(tok) = common::llama3() else { return };
    let cache = GrammarCache::new(tok.vocab.clone(), CacheConfig::default());
    let spec = GrammarSpec::JsonSchema(SCHEMAS[0].into());
    let h = cache.get_or_compile(spec.clone(), CompileOptions::default());
    let g = h.wait().unwrap();
    let h2 = cache.get_or_compile(spec, CompileOptions::default());
    assert!(
        Arc::ptr_eq(&g, &h2.try_get().unwrap().unwrap()),
        "second lookup hits the cache"
    );
    let bad = cache.get_or_compile(
        GrammarSpec::JsonSchema(r#"{"not":{"enum":[1]}}"#.into()),
        CompileOptions::default(),
    );
    assert!(matches!(
        bad.wait(),
        Err(sglrs_grammar::CompileError::Unsupported { .. })
    ));
    assert_eq!(cache.len(), 2);
}

#[test]
fn huge_integer_bounds_never_loosen() {
    let Some(tok) = common::llama3() else { return };
    let s = r#"{"type":"integer","minimum":0,"maximum":9223372036854776000}"#;
    let g = CompiledGrammar::json_schema(s, tok.vocab.clone(), &CompileOptions::default()).unwrap();
    for (text, ok) in [("12", true), ("-1", false), ("9223372036854776001", false)] {
        let mut m = Matcher::new(g.clone());
        let acc = m.try_advance_bytes(text.as_bytes()) && m.is_accepting();
        assert_eq!(acc, ok, "{text}");
    }
}
