//! Times cold and cached token masks at a few states of a JSON Schema:
//! `cargo run --release -p sglrs-grammar --example mask_timing -- TOKENIZER.json`.

use std::sync::Arc;
use std::time::Instant;

use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher, TokenVocab};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: mask_timing TOKENIZER.json")?;
    let tok = tokenizers::Tokenizer::from_file(&path)?;
    let eos = ["<|end_of_text|>", "</s>", "<|endoftext|>"]
        .iter()
        .find_map(|n| tok.token_to_id(n))
        .ok_or("no eos")?;
    let vocab = Arc::new(TokenVocab::from_tokenizer(&tok, &[eos])?);
    let schema = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"bio":{"type":"string","maxLength":200}},"required":["name","age"]}"#;
    let mut buf = vec![0u32; vocab.mask_words()];
    for prefix in [
        "",
        r#"{"name":"Jo"#,
        r#"{"name":"Jo","age":4"#,
        r#"{"name":"Jo","age":4,"bio":"x"#,
        r#"{"name":"Jo","age":4,"bio":"xy"#,
    ] {
        let g = CompiledGrammar::json_schema(schema, vocab.clone(), &CompileOptions::default())?;
        let mut m = Matcher::new(g.clone());
        m.try_advance_bytes(prefix.as_bytes());
        let t0 = Instant::now();
        m.fill_mask(&mut buf)?;
        let cold = t0.elapsed();
        let t1 = Instant::now();
        m.fill_mask(&mut buf)?;
        let warm = t1.elapsed();
        let allowed: u32 = buf.iter().map(|w| w.count_ones()).sum();
        println!(
            "{prefix:40} cold {:>9.1?} cached {:>7.1?} allowed {allowed} configs {}",
            cold,
            warm,
            g.num_configs()
        );
    }
    Ok(())
}
