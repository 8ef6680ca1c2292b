//! Times the budget restriction of token masks ([`Matcher::restrict_mask_to_budget`])
//! beside the masks themselves, along generations that nest as deep as they can:
//! `cargo run --release -p sglrs-grammar --example budget_timing -- TOKENIZER.json`.
//!
//! Each schema is compiled afresh (cold: every configuration's first visit) and then run
//! again on the same grammar (warm), at each budget. `SGLRS_BUDGET_SLOW_US=N` prints the
//! steps whose restriction took over N µs, with the text before them.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

const SCHEMAS: &[(&str, &str)] = &[
    (
        "tree (closed)",
        r##"{"type":"object","properties":{"label":{"type":"string","maxLength":20},"children":{"type":"array","maxItems":2,"items":{"$ref":"#"}}},"required":["label","children"],"additionalProperties":false}"##,
    ),
    (
        "tree",
        r##"{"type":"object","properties":{"label":{"type":"string","maxLength":20},"children":{"type":"array","maxItems":2,"items":{"$ref":"#"}}},"required":["label","children"]}"##,
    ),
    (
        "person (flat)",
        r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age"]}"#,
    ),
];

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: budget_timing TOKENIZER.json")?;
    let vocab = common::vocab_from_file(&path)?;
    let score: Vec<(i32, usize)> = (0..vocab.len() as u32)
        .map(|id| {
            let b = vocab.token_bytes(id).unwrap_or(&[]);
            let o = b.iter().filter(|&&c| c == b'{' || c == b'[').count() as i32;
            let c = b.iter().filter(|&&c| c == b'}' || c == b']').count() as i32;
            (o - c, b.len())
        })
        .collect();
    let eos = vocab.eos()[0];
    let slow: Option<u64> = std::env::var("SGLRS_BUDGET_SLOW_US")
        .ok()
        .and_then(|v| v.parse().ok());
    let g0 = CompiledGrammar::json_schema(SCHEMAS[0].1, vocab.clone(), &CompileOptions::default())?;
    println!(
        "{}: shortest output {} tokens",
        SCHEMAS[0].0,
        g0.min_output_tokens()
    );
    println!(
        "schema | budget | run | steps | mask total | restrict total | restrict p50 / p99 / max"
    );
    for &(name, schema) in SCHEMAS {
        for budget in [200usize, 1000] {
            let g =
                CompiledGrammar::json_schema(schema, vocab.clone(), &CompileOptions::default())?;
            for run in ["cold", "warm"] {
                let mut m = Matcher::new(g.clone());
                let mut mask = vec![0u32; vocab.mask_words()];
                let (mut tm, mut tr) = (Duration::ZERO, Vec::new());
                let mut text: Vec<u8> = Vec::new();
                for used in 0..budget {
                    if m.is_finished() {
                        break;
                    }
                    let t0 = Instant::now();
                    m.fill_mask(&mut mask)?;
                    let t1 = Instant::now();
                    m.restrict_mask_to_budget(&mut mask, budget - used);
                    tr.push(t1.elapsed());
                    if slow.is_some_and(|us| t1.elapsed() > Duration::from_micros(us)) {
                        let tail = &text[text.len().saturating_sub(60)..];
                        let took = t1.elapsed();
                        eprintln!(
                            "{name} {budget} {run}: {took:?} with {} left after {:?}",
                            budget - used,
                            String::from_utf8_lossy(tail)
                        );
                    }
                    tm += t1 - t0;
                    let mut best: Option<u32> = None;
                    for (w, &bits) in mask.iter().enumerate() {
                        let mut bits = bits;
                        while bits != 0 {
                            let t = w as u32 * 32 + bits.trailing_zeros();
                            bits &= bits - 1;
                            if t != eos
                                && best.is_none_or(|b| score[t as usize] > score[b as usize])
                            {
                                best = Some(t);
                            }
                        }
                    }
                    let Some(t) = best else { break };
                    m.accept_token(t)?;
                    text.extend_from_slice(vocab.token_bytes(t).unwrap_or(&[]));
                }
                assert!(m.is_accepting(), "{name}: cut off");
                let steps = tr.len();
                let total: Duration = tr.iter().sum();
                let max = *tr.iter().max().unwrap_or(&Duration::ZERO);
                println!(
                    "{name} | {budget} | {run} | {steps} | {:.2} ms | {:.2} ms | {:.1} / {:.1} / {:.1} µs",
                    tm.as_secs_f64() * 1e3,
                    total.as_secs_f64() * 1e3,
                    pct(&mut tr, 0.5).as_secs_f64() * 1e6,
                    pct(&mut tr, 0.99).as_secs_f64() * 1e6,
                    max.as_secs_f64() * 1e6,
                );
            }
        }
    }
    Ok(())
}
