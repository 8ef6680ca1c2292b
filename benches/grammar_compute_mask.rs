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
    let src = vec![0xAAAA_AAAAu32; tok.vocab.mask_words()];
    c.bench_function("grammar_mask_copy_floor", |b| {
        b.iter(|| buf.copy_from_slice(std::hint::black_box(&src)))
    });
    let _ = Arc::strong_count(&tok.vocab);
}

criterion_group!(benches, bench);
criterion_main!(benches);
