//! Times cold (first at a configuration) and cached token masks at a few states of JSON
//! Schemas: `cargo run --release -p sglrs-grammar --example mask_timing -- TOKENIZER.json [REPS]`.
//! With `TOKENIZER.json REPS SCHEMA.json PREFIX...` it times the masks after each given
//! prefix of a text valid for the schema in that file instead (e.g. a slow mask printed by
//! `SGLRS_BENCH_SLOW_US`).
//!
//! Every cold figure compiles the grammar afresh; with `REPS` runs (default 9) it prints the
//! minimum and the median, which stay comparable on a loaded machine (the minimum is the
//! least disturbed run). The cached figure is the median of 201 masks at the same place
//! (of the last run; `WARM=N` takes N, e.g. to profile what a cached mask still computes,
//! such as the key-loop refinement).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

/// `(schema, prefixes)`: masks are timed after each prefix.
const CASES: &[(&str, &[&str])] = &[
    (
        r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"bio":{"type":"string","maxLength":200}},"required":["name","age"]}"#,
        &[
            "",
            r#"{"name":"Jo"#,
            r#"{"name":"Jo","age":4"#,
            r#"{"name":"Jo","age":4,""#,
            r#"{"name":"Jo","age":4,"bio":"x"#,
            r#"{"name":"Jo","age":4,"bio":"xy"#,
            r#"{"name":"Jo","age":4,"extra":{"k":["#,
            r#"{"name":"Jo","age":4,"extra":{"k":["a"#,
        ],
    ),
    (
        r#"{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z0-9_]+$"},"when":{"type":"string","format":"date-time"},"mail":{"type":"string","format":"email"}},"additionalProperties":false}"#,
        &[r#"{"id":"ab"#, r#"{"when":"2020-"#, r#"{"mail":"a"#],
    ),
];

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: mask_timing TOKENIZER.json [REPS]")?;
    let reps: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(9);
    let custom: Option<(String, Vec<String>)> = match args.next() {
        Some(file) => Some((std::fs::read_to_string(file)?, args.collect())),
        None => None,
    };
    let vocab = common::vocab_from_file(&path)?;
    let mut buf = vec![0u32; vocab.mask_words()];
    let cases: Vec<(&str, Vec<&str>)> = match &custom {
        Some((schema, prefixes)) => vec![(schema, prefixes.iter().map(|p| p.as_str()).collect())],
        None => CASES.iter().map(|(s, p)| (*s, p.to_vec())).collect(),
    };
    for (schema, prefixes) in cases {
        for prefix in prefixes {
            let mut cold: Vec<Duration> = Vec::new();
            let mut warm = Duration::ZERO;
            let mut allowed = 0;
            let mut configs = 0;
            for _ in 0..reps.max(1) {
                let g = CompiledGrammar::json_schema(
                    schema,
                    vocab.clone(),
                    &CompileOptions::default(),
                )?;
                let mut m = Matcher::new(g.clone());
                if custom.is_some() {
                    // As the bench does: a mask at every (greedy) token boundary before.
                    let ids = vocab
                        .greedy_tokenize(prefix.as_bytes())
                        .ok_or("prefix not tokenizable")?;
                    for id in ids {
                        m.fill_mask(&mut buf)?;
                        m.accept_token(id)?;
                    }
                } else if !m.try_advance_bytes(prefix.as_bytes()) {
                    return Err(format!("prefix {prefix:?} does not match").into());
                }
                let t0 = Instant::now();
                m.fill_mask(&mut buf)?;
                cold.push(t0.elapsed());
                // Cached: the median of 201 masks at the same place (`WARM=N`: N of them,
                // to profile the work a cached mask still does).
                let n_warm = std::env::var("WARM")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(201usize);
                let mut w: Vec<Duration> = (0..n_warm.max(1))
                    .map(|_| {
                        let t1 = Instant::now();
                        let r = m.fill_mask(&mut buf);
                        (t1.elapsed(), r)
                    })
                    .map(|(d, r)| r.map(|_| d))
                    .collect::<Result<_, _>>()?;
                w.sort();
                warm = w[w.len() / 2];
                allowed = buf.iter().map(|w| w.count_ones()).sum::<u32>();
                configs = g.num_configs();
            }
            cold.sort();
            println!(
                "{:44} cold min {:>9.1?} median {:>9.1?}  cached {:>7.1?}  allowed {allowed:6}  configs {configs}",
                prefix.chars().take(44).collect::<String>(),
                cold[0],
                cold[cold.len() / 2],
                warm,
            );
        }
    }
    Ok(())
}
