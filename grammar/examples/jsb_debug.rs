//! Shows where JSONSchemaBench instances stop matching:
//! `cargo run --release -p sglrs-grammar --example jsb_debug -- PATH NAME_SUBSTRING...
//! [--schema-order]` (`--schema-order`: `any_property_order: false`, as `jsb_coverage`'s).
//!
//! `PATH` is one `SUBSET.tar.gz` or the folder holding them; every schema whose name contains
//! one of the substrings is compiled (default options, then `Whitespace::Flexible`) and each
//! instance whose verdict is wrong is printed with the place it stops: compact under the
//! default options, `json.dumps` style under the flexible ones (as `jsb_coverage` checks).
//! With `JSB_STATES` set in the environment, each compiled schema's NFA state count and
//! compile time are printed too.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Read;
use std::sync::Arc;

use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher, TokenVocab, Whitespace};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Where `text` stops matching (`None` when it is accepted).
fn stop(g: &Arc<CompiledGrammar>, text: &str) -> Option<usize> {
    let mut m = Matcher::new(g.clone());
    for (i, &b) in text.as_bytes().iter().enumerate() {
        if !m.try_advance_bytes(&[b]) {
            return Some(i);
        }
    }
    (!m.is_accepting()).then_some(text.len())
}

fn show(name: &str, form: &str, valid: bool, text: &str, at: usize) {
    // The nearest character boundary at or before `i`.
    let floor = |mut i: usize| {
        i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let lo = floor(at.saturating_sub(80));
    let at = floor(at);
    let hi = floor(at + 40);
    println!(
        "{name} [{form}] valid={valid} stops at {at}: …{}⟂{}",
        &text[lo..at],
        &text[at..hi]
    );
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = std::path::PathBuf::from(args.get(1).ok_or("usage: jsb_debug PATH NAME...")?);
    let any_order = !args.iter().any(|a| a == "--schema-order");
    let needles: Vec<&String> = args[2..]
        .iter()
        .filter(|a| *a != "--schema-order")
        .collect();
    let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
    toks.extend((0u8..=255).map(|b| vec![b]));
    let vocab = Arc::new(TokenVocab::new(toks, &[], &[0])?);
    let files: Vec<std::path::PathBuf> = if path.is_dir() {
        let mut f: Vec<_> = std::fs::read_dir(&path)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(".tar.gz"))
            .collect();
        f.sort();
        f
    } else {
        vec![path]
    };
    let copts = CompileOptions {
        any_property_order: any_order,
        ..CompileOptions::default()
    };
    let fopts = CompileOptions {
        whitespace: Whitespace::Flexible,
        ..copts.clone()
    };
    for f in files {
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(&f)?));
        for e in ar.entries()? {
            let mut e = e?;
            let name = e.path()?.to_string_lossy().into_owned();
            if !needles.iter().any(|n| name.contains(n.as_str())) {
                continue;
            }
            let mut s = String::new();
            e.read_to_string(&mut s)?;
            let v: serde_json::Value = serde_json::from_str(&s)?;
            let t0 = std::time::Instant::now();
            let res = CompiledGrammar::json_schema_value(&v["schema"], vocab.clone(), &copts);
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            if ms > 200.0 {
                println!("{name}: compile {ms:.0} ms");
            }
            let (g, gf) = match (
                res,
                CompiledGrammar::json_schema_value(&v["schema"], vocab.clone(), &fopts),
            ) {
                (Ok(g), Ok(gf)) => {
                    if std::env::var_os("JSB_STATES").is_some() {
                        println!("{name}: {} states, compile {ms:.0} ms", g.num_states());
                    }
                    (g, gf)
                }
                (Err(err), _) | (_, Err(err)) => {
                    println!("{name}: {err}");
                    continue;
                }
            };
            for t in v["tests"].as_array().into_iter().flatten() {
                let valid = t["valid"].as_bool().unwrap_or(false);
                let compact = serde_json::to_string(&t["data"])?;
                let flex = common::dumps(&t["data"]);
                for (form, g, text) in [("compact", &g, &compact), ("flexible", &gf, &flex)] {
                    let at = stop(g, text);
                    if at.is_none() != valid {
                        show(&name, form, valid, text, at.unwrap_or(text.len()));
                        // The flexible form usually fails at the same place: show one.
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}
