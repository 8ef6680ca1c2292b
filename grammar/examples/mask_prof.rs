//! Profiles cold token masks without the compile: `mask_prof TOKENIZER.json REPS SCHEMA.json
//! PREFIX`. Compiles the schema `REPS` times first, follows `PREFIX` token by token in each
//! copy (a mask at every token boundary, as the bench does), and only then computes the
//! mask after the prefix in every copy, inside `target_masks` (a separate function, so a
//! profile can be filtered on it). Prints the mean and minimum of those last masks.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher};

#[inline(never)]
fn target_masks(
    ms: &[Matcher],
    buf: &mut [u32],
) -> Result<Vec<Duration>, Box<dyn std::error::Error + Send + Sync>> {
    let mut out = Vec::with_capacity(ms.len());
    for m in ms {
        let t0 = Instant::now();
        m.fill_mask(buf)?;
        out.push(t0.elapsed());
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return Err("usage: mask_prof TOKENIZER.json REPS SCHEMA.json PREFIX".into());
    }
    let vocab = common::vocab_from_file(&args[0])?;
    let reps: usize = args[1].parse()?;
    let schema = std::fs::read_to_string(&args[2])?;
    let prefix = &args[3];
    let mut buf = vec![0u32; vocab.mask_words()];
    let ids = vocab
        .greedy_tokenize(prefix.as_bytes())
        .ok_or("prefix not tokenizable")?;
    // `HOLD=1`: keep every grammar alive until the end (the default drops each one after
    // its mask, as the bench does, so freed memory is reused as there).
    let hold = std::env::var("HOLD").is_ok_and(|v| v == "1");
    let mut ms = Vec::with_capacity(reps);
    let mut t = Vec::with_capacity(reps);
    let mut configs = 0;
    for _ in 0..reps {
        let g = CompiledGrammar::json_schema(&schema, vocab.clone(), &CompileOptions::default())?;
        let mut m = Matcher::new(g);
        for &id in &ids {
            m.fill_mask(&mut buf)?;
            m.accept_token(id)?;
        }
        ms.push(m);
        if !hold {
            t.extend(target_masks(&ms, &mut buf)?);
            configs = ms[0].grammar().num_configs();
            ms.clear();
        }
    }
    if hold {
        t = target_masks(&ms, &mut buf)?;
        configs = ms[0].grammar().num_configs();
    }
    t.sort();
    let mean = t.iter().sum::<Duration>() / t.len() as u32;
    println!(
        "{prefix:?}: mean {mean:.1?} min {:.1?} median {:.1?} configs {configs}",
        t[0],
        t[t.len() / 2]
    );
    Ok(())
}
