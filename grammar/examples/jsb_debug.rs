//! Shows where a JSONSchemaBench instance stops matching:
//! `cargo run --release -p sglrs-grammar --example jsb_debug -- SUBSET.tar.gz NAME_SUBSTRING`.

use std::io::Read;
use std::sync::Arc;

use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher, TokenVocab};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let (path, needle) = (args.get(1).ok_or("tar path")?, args.get(2).ok_or("name")?);
    let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
    toks.extend((0u8..=255).map(|b| vec![b]));
    let vocab = Arc::new(TokenVocab::new(toks, &[], &[0])?);
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(path)?));
    for e in ar.entries()? {
        let mut e = e?;
        let name = e.path()?.to_string_lossy().into_owned();
        if !name.contains(needle.as_str()) {
            continue;
        }
        let mut s = String::new();
        e.read_to_string(&mut s)?;
        let v: serde_json::Value = serde_json::from_str(&s)?;
        let t0 = std::time::Instant::now();
        let res = CompiledGrammar::json_schema_value(
            &v["schema"],
            vocab.clone(),
            &CompileOptions::default(),
        );
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if ms > 200.0 {
            println!("{name}: compile {ms:.0} ms");
        }
        let g = match res {
            Ok(g) => g,
            Err(err) => {
                println!("{name}: {err}");
                continue;
            }
        };
        for t in v["tests"].as_array().into_iter().flatten() {
            let text = serde_json::to_string(&t["data"])?;
            let mut m = Matcher::new(g.clone());
            let mut dead = None;
            for (i, &b) in text.as_bytes().iter().enumerate() {
                if !m.try_advance_bytes(&[b]) {
                    dead = Some(i);
                    break;
                }
            }
            let ok = dead.is_none() && m.is_accepting();
            if ok != t["valid"].as_bool().unwrap_or(false) {
                let at = dead.unwrap_or(text.len());
                println!(
                    "{name} valid={} stops at {at}: …{}⟂{}",
                    t["valid"],
                    &text[at.saturating_sub(80)..at],
                    &text[at..(at + 40).min(text.len())]
                );
            }
        }
    }
    Ok(())
}
