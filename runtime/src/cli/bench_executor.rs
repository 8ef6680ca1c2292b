//! `sglrs bench executor`: prefill and decode throughput of the CPU executor.
//!
//! Prefill: one forward pass over a 1,500-token prompt. Decode: sequences of a 64-token prompt
//! each, then greedy steps for all of them in one batch per step, at batch 1, 8 and 32.
//! `--shared-prefix N` makes the decode prompts share their first N tokens' pages (computed
//! once), as requests with a common system prompt or document do under the radix cache; the
//! decode then runs a second time with the executor's shared-pages attention pass off, and
//! the JSON object gains `"shared_prefix": {"tokens", "decode_tok_s_shared_attention_off"}`.
//! `--scatter-pages` hands out the pool's pages in a fixed pseudo-random order, as a
//! long-running server's free list does (the default is ascending, which a fresh pool gives).
//! `--step-tokens N` runs N tokens per sequence in each decode step, with logits for all of
//! them (the cost of a short chunk: forced tokens, a verification of N − 1 drafted tokens);
//! the figures still count one token per sequence per step. `--unsplit` runs the decode a
//! second time with long attention rows never split into one task per softmax chunk, and
//! the JSON object gains `"decode_tok_s_split_off": {"1": …}`.
//! With `--json` the last line is
//! `{"prefill_tok_s": …, "decode_tok_s": {"1": …, "8": …, "32": …}, "kernels", "amx":
//! {"matmul", "attention"}, "cpu", "threads", "scatter_pages", "step_tokens"}` (what ran, for comparing
//! figures).
//!
//! `--llama-python PATH` also measures llama.cpp in the same run: a small Python script
//! (embedded here) runs through that interpreter with `llama_cpp` (llama-cpp-python) on the
//! same GGUF, the same prefill prompt ids and the same batch-1 decode prompt, with the same
//! thread count; the JSON object then gains `"llama_cpp": {"prefill_tok_s", "decode_tok_s_1"}`
//! and `"vs_llama_cpp": {"prefill", "decode_1"}` (our figure / llama.cpp's).

use anyhow::Context;
use sglrs_executor::{
    Batch, CpuExecutor, ExecConfig, Executor, KvCapacity, LogitsWanted, SeqChunk,
};
use sglrs_model::LoadOptions;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// Options of `sglrs bench executor`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchExecutorArgs {
    /// Model: a `.gguf` file or an HF folder (default: `$SGLRS_MODEL` or the bundled model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Kernel threads (default: available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Prompt length of the prefill measurement.
    #[arg(long, default_value_t = 1500)]
    pub prefill_tokens: usize,
    /// Decode steps per batch size.
    #[arg(long, default_value_t = 32)]
    pub decode_steps: usize,
    /// Prompt length of every decode sequence (the context the steps attend over).
    #[arg(long, default_value_t = DECODE_PROMPT)]
    pub decode_prompt: usize,
    /// Tokens at the start of every decode prompt that all sequences share, rounded down to
    /// whole pages: those pages are computed once and every sequence's page table starts
    /// with them, as the radix cache arranges for requests with a common system prompt or
    /// document (0: every sequence has its own prompt).
    #[arg(long, default_value_t = 0)]
    pub shared_prefix: usize,
    /// Hand out the KV pool's pages in a fixed pseudo-random order instead of ascending, as
    /// the free list of a long-running server does after evictions (a sequence's pages then
    /// lie anywhere in the pool).
    #[arg(long)]
    pub scatter_pages: bool,
    /// Tokens each sequence runs per decode step (with logits for all of them), as a step
    /// that verifies `N - 1` speculated tokens does; 1 is plain decode. Throughput still
    /// counts one token per sequence per step, so the figure is the cost of verification.
    #[arg(long, default_value_t = 1)]
    pub step_tokens: usize,
    /// Also run the decode steps with the split of long attention rows into one task per
    /// softmax chunk off (the same bits; the ratio is what the split gains when a batch has
    /// too few rows to keep every thread busy).
    #[arg(long)]
    pub unsplit: bool,
    /// Batch sizes of the decode measurement.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 8, 32])]
    pub batch: Vec<usize>,
    /// Repetitions (the best one is reported).
    #[arg(long, default_value_t = 2)]
    pub repeat: usize,
    /// Print a JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// A Python interpreter with llama-cpp-python installed: measure llama.cpp on the same
    /// prompts in the same run (skipped with a message if it cannot import `llama_cpp`).
    #[arg(long)]
    pub llama_python: Option<PathBuf>,
    /// Re-encode float weights at load (`q8_0`, `q4_1`), as `sglrs serve --quantize` does.
    #[arg(long)]
    pub quantize: Option<sglrs_model::Quantize>,
}

/// The llama.cpp side of the benchmark (see the module docs).
const LLAMA_SCRIPT: &str = include_str!("assets/llama_cpp_bench.py");

/// Prompt length of the decode measurement.
const DECODE_PROMPT: usize = 64;

/// llama.cpp's figures on the same workload.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaCppBench {
    /// Prefill tokens per second.
    pub prefill_tok_s: f64,
    /// Decode tokens per second at batch 1.
    pub decode_tok_s_1: f64,
}

/// Runs the embedded script through `python` on `model` (a GGUF file). `Ok(None)`, with the
/// reason printed, when the interpreter has no `llama_cpp` or the model is not a GGUF file.
pub fn bench_llama_cpp(
    python: &std::path::Path,
    model: &std::path::Path,
    args: &BenchExecutorArgs,
    threads: usize,
    vocab: usize,
) -> anyhow::Result<Option<LlamaCppBench>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    if model.is_dir() {
        eprintln!(
            "llama.cpp: skipped, it needs a GGUF file ({} is a folder)",
            model.display()
        );
        return Ok(None);
    }
    let probe = Command::new(python)
        .args(["-c", "import llama_cpp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !matches!(probe, Ok(s) if s.success()) {
        eprintln!(
            "llama.cpp: skipped, {} cannot import llama_cpp (install llama-cpp-python==0.3.36, \
             see shared/peers/README.md)",
            python.display()
        );
        return Ok(None);
    }
    let script = std::env::temp_dir().join(format!("sglrs-llama-bench-{}.py", std::process::id()));
    std::fs::write(&script, LLAMA_SCRIPT)
        .with_context(|| format!("writing {}", script.display()))?;
    let ids = serde_json::json!({
        "prefill": synthetic_tokens(args.prefill_tokens, 1, vocab),
        "decode_prompt": synthetic_tokens(args.decode_prompt.max(1), 100, vocab),
    });
    let run = || -> anyhow::Result<std::process::Output> {
        let mut child = Command::new(python)
            .arg(&script)
            .arg(model)
            .arg(threads.to_string())
            .arg(args.decode_steps.to_string())
            .arg(args.repeat.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(ids.to_string().as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    };
    let out = run();
    let _ = std::fs::remove_file(&script);
    let out = out?;
    anyhow::ensure!(
        out.status.success(),
        "llama.cpp benchmark failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last)
        .with_context(|| format!("llama.cpp benchmark printed {last:?}"))?;
    let field = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("llama.cpp benchmark output lacks {k}: {last}"))
    };
    let r = LlamaCppBench {
        prefill_tok_s: field("prefill_tok_s")?,
        decode_tok_s_1: field("decode_tok_s_1")?,
    };
    eprintln!(
        "llama.cpp: prefill {:.1} tok/s, decode batch 1 {:.1} tok/s",
        r.prefill_tok_s, r.decode_tok_s_1
    );
    Ok(Some(r))
}

/// Measured throughput.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutorBench {
    /// Prefill tokens per second.
    pub prefill_tok_s: f64,
    /// (batch size, aggregate decode tokens per second).
    pub decode_tok_s: Vec<(usize, f64)>,
    /// With `--shared-prefix`: the same with the shared-pages attention pass off.
    pub decode_tok_s_unbundled: Vec<(usize, f64)>,
    /// With `--unsplit`: the same with long attention rows never split into chunk tasks.
    pub decode_tok_s_unsplit: Vec<(usize, f64)>,
}

/// Deterministic pseudo-random token ids below `vocab` (avoiding the first 100 ids, which
/// hold special tokens in most vocabularies).
fn synthetic_tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (100 + s % (vocab.saturating_sub(100).max(1)) as u64) as u32
        })
        .collect()
}

/// CPU time of this process (all threads, user + system) in seconds, where `/proc` has it:
/// on a shared machine it moves far less with other load than wall time does.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Index of the first largest value (NaNs never win): the maximum over 16 independent lanes
/// (vectorized), then its first position.
fn argmax(row: &[f32]) -> u32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = row.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = if v > *l { v } else { *l };
        }
    }
    let m = lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    row.iter().position(|&v| v == m).unwrap_or(0) as u32
}

/// Runs the benchmark on an executor.
pub fn bench(exec: &mut CpuExecutor, args: &BenchExecutorArgs) -> anyhow::Result<ExecutorBench> {
    let ps = exec.kv_layout().page_size;
    let vocab = exec.vocab_size();
    let mut pages: Vec<u32> = (0..exec.num_pages() as u32).collect();
    if args.scatter_pages {
        // Fisher-Yates with a fixed xorshift stream: the same order in every run.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in (1..pages.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            pages.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    // Prefill.
    let prompt = synthetic_tokens(args.prefill_tokens, 1, vocab);
    let need = args.prefill_tokens.div_ceil(ps);
    anyhow::ensure!(
        need <= pages.len(),
        "KV pool too small for the prefill prompt"
    );
    let mut best_prefill = f64::INFINITY;
    for _ in 0..args.repeat.max(1) {
        let t = Instant::now();
        let batch = Batch {
            seqs: vec![SeqChunk {
                tokens: &prompt,
                start_pos: 0,
                pages: &pages[..need],
                logits: LogitsWanted::Last,
            }],
        };
        exec.forward(&batch)?;
        best_prefill = best_prefill.min(t.elapsed().as_secs_f64());
    }
    let prefill_tok_s = args.prefill_tokens as f64 / best_prefill;
    eprintln!(
        "prefill {} tokens: {:.3} s, {prefill_tok_s:.1} tok/s",
        args.prefill_tokens, best_prefill
    );

    let decode = decode_runs(exec, args, &pages, "")?;
    // Over a shared prefix, the same decode with the shared-pages attention pass off
    // (bit-identical results; the ratio is what it saves).
    let mut unbundled = Vec::new();
    if args.shared_prefix >= ps {
        exec.set_shared_attention(false);
        let r = decode_runs(exec, args, &pages, " (shared-pages attention off)");
        exec.set_shared_attention(true);
        unbundled = r?;
    }
    let mut unsplit = Vec::new();
    if args.unsplit {
        exec.set_split_attention(false);
        let r = decode_runs(exec, args, &pages, " (chunk split off)");
        exec.set_split_attention(true);
        unsplit = r?;
    }
    Ok(ExecutorBench {
        prefill_tok_s,
        decode_tok_s: decode,
        decode_tok_s_unbundled: unbundled,
        decode_tok_s_unsplit: unsplit,
    })
}

/// Decode throughput per batch size (see the module docs); `label` tags the log lines.
fn decode_runs(
    exec: &mut CpuExecutor,
    args: &BenchExecutorArgs,
    pages: &[u32],
    label: &str,
) -> anyhow::Result<Vec<(usize, f64)>> {
    let ps = exec.kv_layout().page_size;
    let vocab = exec.vocab_size();
    let mut decode = Vec::new();
    let prompt_len = args.decode_prompt.max(1);
    // Shared pages: whole pages of the prompt, and never the prompt's last token (each
    // sequence prefills at least one token of its own).
    let shared_pages = (args.shared_prefix.min(prompt_len - 1)) / ps;
    let shared = shared_pages * ps;
    for &b in &args.batch {
        let step_tokens = args.step_tokens;
        let per = (prompt_len + args.decode_steps * step_tokens).div_ceil(ps) - shared_pages;
        anyhow::ensure!(
            shared_pages + b * per <= pages.len(),
            "KV pool too small for decode batch {b}"
        );
        let tables: Vec<Vec<u32>> = (0..b)
            .map(|i| {
                let own = &pages[shared_pages + i * per..shared_pages + (i + 1) * per];
                pages[..shared_pages].iter().chain(own).copied().collect()
            })
            .collect();
        let mut best = f64::INFINITY;
        let mut best_cpu = f64::INFINITY;
        // The batch's prefill of its own tokens (over the shared pages, if any), timed too:
        // the chunked prefill of a serving round.
        let (mut best_pre, mut best_pre_cpu) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..args.repeat.max(1) {
            let prompts: Vec<Vec<u32>> = (0..b)
                .map(|i| {
                    let mut p = synthetic_tokens(shared, 99, vocab);
                    p.extend(synthetic_tokens(prompt_len - shared, 100 + i as u64, vocab));
                    p
                })
                .collect();
            // The shared pages once (with the first sequence), then every sequence's own part.
            if shared > 0 {
                exec.forward(&Batch {
                    seqs: vec![SeqChunk {
                        tokens: &prompts[0][..shared],
                        start_pos: 0,
                        pages: &tables[0],
                        logits: LogitsWanted::None,
                    }],
                })?;
            }
            let batch = Batch {
                seqs: (0..b)
                    .map(|i| SeqChunk {
                        tokens: &prompts[i][shared..],
                        start_pos: shared,
                        pages: &tables[i],
                        logits: LogitsWanted::Last,
                    })
                    .collect(),
            };
            let (t, cpu0) = (Instant::now(), process_cpu_seconds());
            let l = exec.forward(&batch)?;
            best_pre = best_pre.min(t.elapsed().as_secs_f64());
            if let (Some(a), Some(z)) = (cpu0, process_cpu_seconds()) {
                best_pre_cpu = best_pre_cpu.min(z - a);
            }
            let mut last: Vec<Vec<u32>> = (0..b)
                .map(|r| vec![argmax(l.row(r)); step_tokens])
                .collect();
            let wanted = if step_tokens == 1 {
                LogitsWanted::Last
            } else {
                LogitsWanted::All
            };
            let t = Instant::now();
            let cpu0 = process_cpu_seconds();
            for step in 0..args.decode_steps {
                let batch = Batch {
                    seqs: (0..b)
                        .map(|i| SeqChunk {
                            tokens: &last[i],
                            start_pos: prompt_len + step * step_tokens,
                            pages: &tables[i],
                            logits: wanted.clone(),
                        })
                        .collect(),
                };
                let l = exec.forward(&batch)?;
                // Each sequence's greedy token, rows spread over the executor's threads (a
                // server samples its sequences in parallel too; 32 x 49,152 logits serially
                // were ~2.5% of a batch-32 step).
                let next: Vec<AtomicU32> = (0..b).map(|_| AtomicU32::new(0)).collect();
                exec.par_for(b, &|r| {
                    next[r].store(argmax(l.row((r + 1) * step_tokens - 1)), Ordering::Relaxed)
                });
                for (tok, n) in last.iter_mut().zip(&next) {
                    tok.fill(n.load(Ordering::Relaxed));
                }
            }
            best = best.min(t.elapsed().as_secs_f64());
            if let (Some(a), Some(z)) = (cpu0, process_cpu_seconds()) {
                best_cpu = best_cpu.min(z - a);
            }
        }
        eprintln!(
            "prefill batch {b}{label}: {} tokens each from position {shared} in {best_pre:.4} s \
             (CPU time {best_pre_cpu:.2} s)",
            prompt_len - shared
        );
        let tok_s = (b * args.decode_steps) as f64 / best;
        eprintln!(
            "decode batch {b}{label}: {} steps in {best:.3} s (CPU time {best_cpu:.2} s), {tok_s:.1} tok/s",
            args.decode_steps
        );
        decode.push((b, tok_s));
    }
    Ok(decode)
}

/// Entry point of `sglrs bench executor`.
pub fn run(args: &BenchExecutorArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.step_tokens >= 1, "--step-tokens must be at least 1");
    let path = args
        .model
        .clone()
        .unwrap_or_else(sglrs_model::default_model_path);
    // The benchmark needs no tokenizer: a GGUF file loads without one.
    let (config, mut weights) = if path.is_dir() {
        let m = sglrs_model::load(&path, &LoadOptions::default())
            .with_context(|| format!("loading {}", path.display()))?;
        (m.config, m.weights)
    } else {
        let (c, w, _) = sglrs_model::gguf::load_gguf(&path)
            .with_context(|| format!("loading {}", path.display()))?;
        (c, w)
    };
    if let Some(q) = args.quantize {
        sglrs_model::quantize::quantize_model(&mut weights, q)?;
    }
    let mut cfg = ExecConfig::default();
    if let Some(t) = args.threads {
        cfg.threads = t;
    }
    let ps = cfg.page_size;
    let per_seq = (args.decode_prompt.max(1) + args.decode_steps * args.step_tokens).div_ceil(ps);
    let max_b = args.batch.iter().copied().max().unwrap_or(1);
    cfg.kv = KvCapacity::Pages((max_b * per_seq).max(args.prefill_tokens.div_ceil(ps)));
    let mut exec = CpuExecutor::new(&config, &weights, &cfg)?;
    let amx = exec.amx();
    let cpu = sglrs_benches::cpu_model();
    eprintln!(
        "model {}: {} threads, kernels {:?}, AMX tiles: matmul {}, attention {} ({cpu})",
        path.display(),
        exec.threads(),
        exec.isa(),
        amx.matmul,
        amx.attention,
    );
    let r = bench(&mut exec, args)?;
    let llama = match &args.llama_python {
        Some(py) => bench_llama_cpp(py, &path, args, exec.threads(), exec.vocab_size())?,
        None => None,
    };
    println!("| measurement | tokens/s |");
    println!("|---|---|");
    println!(
        "| prefill ({} tokens) | {:.1} |",
        args.prefill_tokens, r.prefill_tok_s
    );
    for (b, t) in &r.decode_tok_s {
        println!("| decode, batch {b} (aggregate) | {t:.1} |");
    }
    for ((b, off), (_, on)) in r.decode_tok_s_unbundled.iter().zip(&r.decode_tok_s) {
        println!(
            "| decode, batch {b}, shared-pages attention off | {off:.1} (on/off {:.2}x) |",
            on / off
        );
    }
    for ((b, off), (_, on)) in r.decode_tok_s_unsplit.iter().zip(&r.decode_tok_s) {
        println!(
            "| decode, batch {b}, chunk split off | {off:.1} (on/off {:.2}x) |",
            on / off
        );
    }
    let ours_1 = r
        .decode_tok_s
        .iter()
        .find(|(b, _)| *b == 1)
        .map(|(_, t)| *t);
    if let Some(l) = &llama {
        println!(
            "| llama.cpp prefill ({} tokens) | {:.1} (sglrs/llama.cpp {:.2}x) |",
            args.prefill_tokens,
            l.prefill_tok_s,
            r.prefill_tok_s / l.prefill_tok_s
        );
        println!(
            "| llama.cpp decode, batch 1 | {:.1}{} |",
            l.decode_tok_s_1,
            ours_1.map_or(String::new(), |o| format!(
                " (sglrs/llama.cpp {:.2}x)",
                o / l.decode_tok_s_1
            ))
        );
    }
    if args.json {
        let decode: serde_json::Map<String, serde_json::Value> = r
            .decode_tok_s
            .iter()
            .map(|(b, t)| (b.to_string(), serde_json::json!(round1(*t))))
            .collect();
        let mut obj = serde_json::json!({
            "prefill_tok_s": round1(r.prefill_tok_s),
            "decode_tok_s": decode,
            "kernels": format!("{:?}", exec.isa()),
            "amx": {"matmul": amx.matmul, "attention": amx.attention},
            "cpu": cpu,
            "threads": exec.threads(),
            "scatter_pages": args.scatter_pages,
            "step_tokens": args.step_tokens,
        });
        if !r.decode_tok_s_unbundled.is_empty() {
            let off: serde_json::Map<String, serde_json::Value> = r
                .decode_tok_s_unbundled
                .iter()
                .map(|(b, t)| (b.to_string(), serde_json::json!(round1(*t))))
                .collect();
            obj["shared_prefix"] = serde_json::json!({
                "tokens": args.shared_prefix,
                "decode_tok_s_shared_attention_off": off,
            });
        }
        if !r.decode_tok_s_unsplit.is_empty() {
            let off: serde_json::Map<String, serde_json::Value> = r
                .decode_tok_s_unsplit
                .iter()
                .map(|(b, t)| (b.to_string(), serde_json::json!(round1(*t))))
                .collect();
            obj["decode_tok_s_split_off"] = serde_json::json!(off);
        }
        if let Some(l) = &llama {
            obj["llama_cpp"] = serde_json::json!({
                "prefill_tok_s": round1(l.prefill_tok_s),
                "decode_tok_s_1": round1(l.decode_tok_s_1),
            });
            obj["vs_llama_cpp"] = serde_json::json!({
                "prefill": round2(r.prefill_tok_s / l.prefill_tok_s),
                "decode_1": ours_1.map(|o| round2(o / l.decode_tok_s_1)),
            });
        }
        println!("{obj}");
    }
    Ok(())
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
