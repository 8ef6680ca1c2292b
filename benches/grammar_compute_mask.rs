//! Token mask computation on the Llama-3 128k vocabulary: a cached mask (configuration seen
//! before) against a cold one (trie walk), beside a plain copy of a mask as the floor.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use sglrs_benches::grammar::BenchTokenizer;
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"email":{"type":"string","format":"email"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age"]}"#;

fn tokenizer() -> Option<BenchTokenizer> {
    let shared = std::env::var("SGLRS_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    let p = shared.join("tokenizers/llama3-128k/tokenizer.json");
    if !p.exists() {
        eprintln!("SKIP: {} not found", p.display());
        return None;
    }
    BenchTokenizer::load(&p).ok()
}

fn bench(c: &mut Criterion) {
    let Some(tok) = tokenizer() else { return };
    let prefixes: [(&str, &str); 3] = [
        ("object_start", ""),
        ("in_string", r#"{"name":"Jo"#),
        ("after_value", r#"{"name":"Jo","age":4"#),
    ];
    let mut buf = vec![0u32; tok.vocab.mask_words()];
    for (label, prefix) in prefixes {
        let g = CompiledGrammar::json_schema(SCHEMA, tok.vocab.clone(), &CompileOptions::default())
            .unwrap();
        let mut m = Matcher::new(g.clone());
        assert!(m.try_advance_bytes(prefix.as_bytes()));
        c.bench_function(&format!("grammar_mask_cached/{label}"), |b| {
            b.iter(|| m.fill_mask(&mut buf).unwrap())
        });
        c.bench_function(&format!("grammar_mask_cold/{label}"), |b| {
            b.iter_batched(
                || {
                    let g = CompiledGrammar::json_schema(
                        SCHEMA,
                        tok.vocab.clone(),
                        &CompileOptions::default(),
                    )
                    .unwrap();
                    let mut m = Matcher::new(g);
                    m.try_advance_bytes(prefix.as_bytes());
                    m
                },
                |m: Matcher| m.fill_mask(&mut buf).unwrap(),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    // `uniqueItems`: the cached automaton mask plus the repeat checks, beside the same
    // array without `uniqueItems` (the automaton mask alone) as the baseline.
    let methods =
        r#"{"enum":["GET","POST","HEAD","PUT","PATCH","TRACE","DELETE","OPTIONS","CONNECT"]}"#;
    let pattern = r#"{"type":"string","pattern":"^[A-Za-z_][A-Za-z0-9_]*$"}"#;
    let free = r#"{"type":"string"}"#;
    let int = r#"{"type":"integer"}"#;
    let unique_cases: [(&str, &str, &str); 8] = [
        ("free_in_item", free, r#"["ab","cd","a"#),
        ("enum_between", methods, r#"["GET","POST""#),
        ("enum_item_start", methods, r#"["GET","POST",""#),
        ("enum_in_item", methods, r#"["GET","POST","P"#),
        ("pattern_in_item", pattern, r#"["ab","cd","a"#),
        // Integers: a new item, an item that prefixes earlier ones, one that prefixes none.
        ("int_item_start", int, "[1,10,11,"),
        ("int_in_prefix_item", int, "[1,10,11,1"),
        ("int_in_new_item", int, "[1,10,11,2"),
    ];
    for (label, item, prefix) in unique_cases {
        for unique in [true, false] {
            let schema = format!(r#"{{"type":"array","items":{item},"uniqueItems":{unique}}}"#);
            let g = CompiledGrammar::json_schema(
                &schema,
                tok.vocab.clone(),
                &CompileOptions::default(),
            )
            .unwrap();
            let mut m = Matcher::new(g);
            assert!(m.try_advance_bytes(prefix.as_bytes()));
            let kind = if unique { "unique" } else { "plain" };
            c.bench_function(&format!("grammar_mask_{kind}/{label}"), |b| {
                b.iter(|| m.fill_mask(&mut buf).unwrap())
            });
        }
    }
    // Counted strings (`grammar/src/length.rs`): a URL of at most 2,083 characters (the
    // matcher counts) against the same URL without a maximum, far from the limit and with
    // 10 characters left (tokens longer than that are followed one by one); and following a
    // 4-byte chunk (then rolling it back).
    let far = r#""https://example.com/docs/"#.to_string();
    let near = format!(r#""https://example.com/{}"#, "a".repeat(2083 - 20 - 10));
    for (kind, max) in [("counted", ",\"maxLength\":2083"), ("plain", "")] {
        let schema = format!(r#"{{"type":"string","format":"uri"{max}}}"#);
        let g =
            CompiledGrammar::json_schema(&schema, tok.vocab.clone(), &CompileOptions::default())
                .unwrap();
        for (label, prefix) in [("url_far", &far), ("url_near", &near)] {
            let mut m = Matcher::new(g.clone());
            assert!(m.try_advance_bytes(prefix.as_bytes()));
            c.bench_function(&format!("grammar_mask_{kind}/{label}"), |b| {
                b.iter(|| m.fill_mask(&mut buf).unwrap())
            });
            c.bench_function(&format!("grammar_advance_{kind}/{label}"), |b| {
                b.iter(|| {
                    assert!(m.try_advance_bytes(b"abcd"));
                    m.rollback(1).unwrap();
                })
            });
        }
    }
    let src = vec![0xAAAA_AAAAu32; tok.vocab.mask_words()];
    c.bench_function("grammar_mask_copy_floor", |b| {
        b.iter(|| buf.copy_from_slice(std::hint::black_box(&src)))
    });
    let _ = Arc::strong_count(&tok.vocab);
}

criterion_group!(benches, bench);
criterion_main!(benches);
