//! JSONSchemaBench coverage over whole subsets, fast (no masks): per subset compiled /
//! covered / valid rejected / invalid accepted, a histogram of refusal reasons and of
//! valid-rejection causes, and the slow compiles.
//!
//! ```text
//! cargo run --release -p sglrs-grammar --example jsb_coverage -- DIR [--only SUBSTR]
//!     [--list FILE] [--tokenizer tokenizer.json] [--timeout-ms 1000] [--schema-order]
//! ```
//!
//! Instances are fed byte by byte (acceptance does not depend on how the text is cut into
//! tokens: a token is accepted iff its bytes are); `--tokenizer` feeds real token ids instead.
//! Each instance is checked compact under the default policy and `json.dumps`-style under
//! the flexible one, with the engine's default options (declared properties in any order in
//! objects of up to 16 of them). A valid instance that is accepted once its object keys are
//! reordered into schema order is counted as a "property order" rejection; `--schema-order`
//! compiles with `any_property_order: false` (the server's generation policy).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};
use sglrs_grammar::{CompileError, CompileOptions, CompiledGrammar, Matcher, TokenVocab};

/// The allocator of the `sglrs` binary (`runtime/src/main.rs`): compiles allocate many
/// small schema maps and NFA states, and glibc's malloc made them up to ~40% slower, so
/// schemas near the deadline were refused here that the server compiles.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Default)]
struct Stats {
    schemas: usize,
    compiled: usize,
    covered: usize,
    valid_rejected: usize,
    invalid_accepted: usize,
    order_only: usize,
    slow: usize,
}

fn reason(e: &CompileError) -> String {
    match e {
        CompileError::Unsupported {
            keyword, reason, ..
        } => {
            let r: String = reason.chars().take(50).collect();
            let r = if r.starts_with('"') || r.contains("branches") {
                r.split(':').next_back().unwrap_or("").trim().to_string()
            } else {
                r
            };
            format!("{keyword}: {r}")
        }
        CompileError::InvalidSchema { reason, .. } => {
            format!("invalid: {}", reason.chars().take(40).collect::<String>())
        }
        other => format!("{other}").chars().take(50).collect(),
    }
}

/// Key rank: order of first appearance of a key under any `properties` in the schema.
fn key_ranks(s: &Value, ranks: &mut HashMap<String, usize>) {
    match s {
        Value::Object(m) => {
            if let Some(Value::Object(p)) = m.get("properties") {
                for k in p.keys() {
                    let n = ranks.len();
                    ranks.entry(k.clone()).or_insert(n);
                }
            }
            for v in m.values() {
                key_ranks(v, ranks);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| key_ranks(v, ranks)),
        _ => {}
    }
}

fn reorder(v: &Value, ranks: &HashMap<String, usize>) -> Value {
    match v {
        Value::Object(m) => {
            let mut items: Vec<(&String, &Value)> = m.iter().collect();
            items.sort_by_key(|(k, _)| ranks.get(*k).copied().unwrap_or(usize::MAX));
            let mut out = Map::new();
            for (k, x) in items {
                out.insert(k.clone(), reorder(x, ranks));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| reorder(x, ranks)).collect()),
        other => other.clone(),
    }
}

struct Feeder {
    tok: Option<tokenizers::Tokenizer>,
    eos: u32,
}

impl Feeder {
    fn accepts(&self, g: &Arc<CompiledGrammar>, text: &str) -> bool {
        let mut m = Matcher::new(g.clone());
        match &self.tok {
            None => m.try_advance_bytes(text.as_bytes()) && m.is_accepting(),
            Some(t) => {
                let Ok(enc) = t.encode(text, false) else {
                    return false;
                };
                for &id in enc.get_ids() {
                    if m.accept_token(id).is_err() {
                        return false;
                    }
                }
                m.accept_token(self.eos).is_ok()
            }
        }
    }
}

/// CPU time of this thread in ms (`/proc/thread-self/schedstat`), 0 when unavailable.
fn cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |ns| ns / 1e6)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .ok_or("usage: jsb_coverage DIR [--only S] [--list FILE]")?;
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let only = opt("--only");
    // Wall-clock compile deadline (the box may be loaded: CPU time is reported too).
    let timeout_ms: u64 = opt("--timeout-ms")
        .and_then(|t| t.parse().ok())
        .unwrap_or(1000);
    // `--schema-order`: declared properties in schema order (`any_property_order: false`).
    let copts = CompileOptions {
        timeout: Some(std::time::Duration::from_millis(timeout_ms)),
        any_property_order: !args.iter().any(|a| a == "--schema-order"),
        ..CompileOptions::default()
    };
    let fopts = CompileOptions {
        whitespace: sglrs_grammar::Whitespace::Flexible,
        ..copts.clone()
    };
    let mut list = match opt("--list") {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    let (vocab, feeder) = match opt("--tokenizer") {
        Some(p) => {
            let t = tokenizers::Tokenizer::from_file(&p)?;
            let eos = t
                .token_to_id("<|eot_id|>")
                .or_else(|| t.token_to_id("</s>"))
                .ok_or("no eos")?;
            let v = Arc::new(TokenVocab::from_tokenizer(&t, &[eos])?);
            (v, Feeder { tok: Some(t), eos })
        }
        None => {
            let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
            toks.extend((0u8..=255).map(|b| vec![b]));
            (
                Arc::new(TokenVocab::new(toks, &[], &[0])?),
                Feeder { tok: None, eos: 0 },
            )
        }
    };
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .collect();
    files.sort();
    let mut per: BTreeMap<String, Stats> = BTreeMap::new();
    let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
    let mut causes: BTreeMap<String, usize> = BTreeMap::new();
    let mut slow: Vec<(f64, String)> = Vec::new();
    for f in files {
        let subset = f
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".tar.gz").to_string())
            .unwrap_or_default();
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(&f)?));
        let st = per.entry(subset.clone()).or_default();
        for e in ar.entries()? {
            let mut e = e?;
            let name = e.path()?.to_string_lossy().into_owned();
            if !name.ends_with(".json") || only.as_ref().is_some_and(|o| !name.contains(o)) {
                continue;
            }
            let mut s = String::new();
            e.read_to_string(&mut s)?;
            let v: Value = serde_json::from_str(&s)?;
            st.schemas += 1;
            let (t0, c0) = (Instant::now(), cpu_ms());
            let gc = CompiledGrammar::json_schema_value(&v["schema"], vocab.clone(), &copts);
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let cpu = cpu_ms() - c0;
            let (t1, c1) = (Instant::now(), cpu_ms());
            let gf = CompiledGrammar::json_schema_value(&v["schema"], vocab.clone(), &fopts);
            let ms = ms.max(t1.elapsed().as_secs_f64() * 1e3);
            let cpu = cpu.max(cpu_ms() - c1);
            if cpu > 300.0 || ms > 1000.0 {
                slow.push((cpu, format!("{name} (wall {ms:.0} ms)")));
                if cpu > 1000.0 {
                    st.slow += 1;
                }
            }
            let (gc, gf) = match (gc, gf) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(err), _) | (_, Err(err)) => {
                    let r = reason(&err);
                    *refusals.entry(r.clone()).or_default() += 1;
                    if let Some(l) = list.as_mut() {
                        writeln!(l, "{name}\tREFUSED\t{cpu:.0}\t{err}")?;
                    }
                    continue;
                }
            };
            st.compiled += 1;
            let mut ranks = HashMap::new();
            key_ranks(&v["schema"], &mut ranks);
            let (mut vr, mut ia, mut order) = (0, 0, 0);
            for t in v["tests"].as_array().into_iter().flatten() {
                let valid = t["valid"].as_bool().unwrap_or(false);
                let data = &t["data"];
                let compact = serde_json::to_string(data)?;
                let flex = common::dumps(data);
                let ac = feeder.accepts(&gc, &compact);
                let af = feeder.accepts(&gf, &flex);
                if valid && !(ac && af) {
                    vr += 1;
                    let re = serde_json::to_string(&reorder(data, &ranks))?;
                    if re != compact && feeder.accepts(&gc, &re) {
                        order += 1;
                    } else if ac != af {
                        *causes.entry("compact/flexible differ".into()).or_default() += 1;
                    } else {
                        *causes.entry("other".into()).or_default() += 1;
                    }
                }
                if !valid && (ac || af) {
                    ia += 1;
                    println!(
                        "INVALID ACCEPTED {name}: {}",
                        &compact[..compact.len().min(200)]
                    );
                }
            }
            if order > 0 {
                *causes.entry("property order".into()).or_default() += order;
                st.order_only += (order == vr) as usize;
            }
            st.valid_rejected += vr;
            st.invalid_accepted += ia;
            let ok = vr == 0 && ia == 0;
            st.covered += ok as usize;
            if let Some(l) = list.as_mut() {
                let tag = if ok {
                    "COVERED".to_string()
                } else if ia > 0 {
                    format!("INVALID_ACCEPTED {ia}")
                } else if order == vr {
                    format!("ORDER {vr}")
                } else {
                    format!("VALID_REJECTED {vr}")
                };
                writeln!(l, "{name}\t{tag}\t{cpu:.0}")?;
            }
        }
    }
    println!(
        "{:24} {:>6} {:>8} {:>8} {:>7} {:>7} {:>6} {:>6} {:>5}",
        "subset", "schemas", "compiled", "covered", "cov%", "v_rej", "inv_acc", "order", "slow"
    );
    let mut tot = Stats::default();
    for (name, s) in &per {
        print_row(name, s);
        tot.schemas += s.schemas;
        tot.compiled += s.compiled;
        tot.covered += s.covered;
        tot.valid_rejected += s.valid_rejected;
        tot.invalid_accepted += s.invalid_accepted;
        tot.order_only += s.order_only;
        tot.slow += s.slow;
    }
    print_row("overall", &tot);
    println!("\nrefusal reasons:");
    let mut r: Vec<_> = refusals.into_iter().collect();
    r.sort_by_key(|x| std::cmp::Reverse(x.1));
    for (k, n) in r {
        println!("{n:6}  {k}");
    }
    println!("\nvalid-rejection causes (instances):");
    for (k, n) in causes {
        println!("{n:6}  {k}");
    }
    slow.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("\nslow compiles (CPU > 300 ms or wall > 1 s; `slow` column: CPU > 1 s):");
    for (ms, n) in slow.iter().take(30) {
        println!("{ms:8.0} ms CPU  {n}");
    }
    Ok(())
}

fn print_row(name: &str, s: &Stats) {
    let pct = |x: usize| 100.0 * x as f64 / s.schemas.max(1) as f64;
    println!(
        "{:24} {:>6} {:>8} {:>8} {:>6.1}% {:>7} {:>7} {:>6} {:>5}",
        name,
        s.schemas,
        s.compiled,
        s.covered,
        pct(s.covered),
        s.valid_rejected,
        s.invalid_accepted,
        s.order_only,
        s.slow
    );
}
