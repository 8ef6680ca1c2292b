//! Compile time of representative JSON Schemas, regexes and a GBNF grammar (Llama-3 vocab),
//! beside parsing the schema text alone as the floor.

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use sglrs_benches::grammar::BenchTokenizer;
use sglrs_grammar::{CompileOptions, CompiledGrammar};

const SCHEMAS: [(&str, &str); 3] = [
    (
        "flat",
        r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"}},"required":["name"]}"#,
    ),
    (
        "nested",
        r#"{"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"roles":{"type":"array","items":{"enum":["admin","dev","ops"]},"maxItems":3}},"required":["id"]},"created":{"type":"string","format":"date-time"}},"required":["user","created"]}"#,
    ),
    (
        "recursive",
        r##"{"$defs":{"n":{"type":"object","properties":{"v":{"type":"number"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["v"]}},"$ref":"#/$defs/n"}"##,
    ),
];

fn bench(c: &mut Criterion) {
    let shared = std::env::var("SGLRS_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    let p = shared.join("tokenizers/llama3-128k/tokenizer.json");
    let Ok(tok) = BenchTokenizer::load(&p) else {
        eprintln!("SKIP: {} not loadable", p.display());
        return;
    };
    let opts = CompileOptions::default();
    // The server's policy: declared properties in schema order (the default takes any order).
    let schema_order = CompileOptions {
        any_property_order: false,
        ..CompileOptions::default()
    };
    for (name, s) in SCHEMAS {
        c.bench_function(&format!("grammar_compile_json/{name}"), |b| {
            b.iter(|| CompiledGrammar::json_schema(s, tok.vocab.clone(), &opts).unwrap())
        });
        c.bench_function(&format!("grammar_compile_json_schema_order/{name}"), |b| {
            b.iter(|| CompiledGrammar::json_schema(s, tok.vocab.clone(), &schema_order).unwrap())
        });
        c.bench_function(&format!("grammar_parse_json_floor/{name}"), |b| {
            b.iter(|| serde_json::from_str::<serde_json::Value>(s).unwrap())
        });
    }
    c.bench_function("grammar_compile_regex/ipv4ish", |b| {
        b.iter(|| {
            CompiledGrammar::regex(r"[0-9]{1,3}(\.[0-9]{1,3}){3}", tok.vocab.clone(), &opts)
                .unwrap()
        })
    });
    let gbnf = "root ::= \"[\" item (\",\" item)* \"]\"\nitem ::= [a-z]+ | [0-9]+\n";
    c.bench_function("grammar_compile_gbnf/list", |b| {
        b.iter(|| CompiledGrammar::ebnf(gbnf, tok.vocab.clone(), &opts).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
