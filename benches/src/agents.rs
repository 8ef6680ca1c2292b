//! `sglrs bench agents`: the Berkeley Function Calling Leaderboard (BFCL) on live servers,
//! sglrs with and without tool-call enforcement next to vLLM-CPU and llama.cpp, one server
//! at a time, same model, same threads.
//!
//! BFCL's data and checkers are Python (`bfcl-eval` on PyPI), so the workload lives in
//! `benches/agents/bfcl_bench.py`: this command fetches the wheel once (`pip download
//! --no-deps bfcl-eval==VERSION` into `--cache-dir`, unpacked there), writes the HF folder
//! vLLM needs from the GGUF (`sglrs export-hf`) when `vllm` is among the engines, runs the
//! script, and adds the machine, the kernel switches set (`env`: `SGLRS_AMX`,
//! `SGLRS_AMX_ATTENTION`, `SGLRS_ISA`, which the servers inherit) and the command line to
//! its result.
//!
//! Per engine: `accuracy` by category (`simple_python`, `multiple`, `parallel`,
//! `parallel_multiple` with BFCL's AST checker; `irrelevance` asked with `tool_choice:
//! "auto"`, right when the answer calls nothing; `multi_turn_base` as agent loops against
//! BFCL's executable environments with its multi-turn checker), `valid_call_rate` (calls
//! whose arguments parse as a JSON object valid against the function's schema, over all
//! calls plus answers that had to call and did not), `turns_per_s` and `turn_latency_ms`
//! (`p50`, `p99`) of the multi-turn sessions with `--concurrency` in flight, `steps_per_s`
//! (model answers per second in those loops: a turn takes one answer per executed call
//! plus the last, so an engine whose calls do not parse finishes turns in one answer), and
//! `cache_hit_rate` (cached over prompt tokens, from each answer's usage; `null` where the
//! engine does not report it), and `replay`: the same sessions along BFCL's ground truth
//! (each step asks for the next call, then the ground truth's call and result are appended),
//! the same prompts for every engine, so its `turns_per_s` compares engines on the same work.
//! Only BFCL's non-live categories are used; `live_*` is kept for independent checks.

use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Arguments of `sglrs bench agents`.
#[derive(clap::Args, Debug, Clone)]
pub struct AgentsArgs {
    /// Engines, comma-separated: `sglrs` (enforced), `sglrs-free` (`--disable-tool-grammar`),
    /// `vllm`, `llamacpp`.
    #[arg(long, default_value = "sglrs,sglrs-free,vllm,llamacpp")]
    pub engines: String,
    /// The `sglrs` binary that serves (default: this one).
    #[arg(long)]
    pub sglrs_bin: Option<PathBuf>,
    /// Model (GGUF) every engine serves.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// Python that runs the workload (needs `jsonschema`).
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Python of a llama-cpp-python install (see ../shared/peers/README.md).
    #[arg(long, default_value = "/tmp/llamapeer/bin/python")]
    pub llamacpp_python: String,
    /// Python of a vLLM-CPU install.
    #[arg(long, default_value = "/tmp/vllmpeer/bin/python")]
    pub vllm_python: String,
    /// `bfcl-eval` version to fetch.
    #[arg(long, default_value = "2026.3.23")]
    pub bfcl_version: String,
    /// Where the wheel and the HF folder are kept (default `~/.cache/sglrs/bench-agents`).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Kernel threads of every engine.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Questions per single-turn category (the first ones of each file).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Multi-turn sessions (the first ones of `multi_turn_base`).
    #[arg(long, default_value_t = 4)]
    pub sessions: usize,
    /// Multi-turn sessions in flight.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// `max_tokens` of every answer.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// What runs, comma-separated: `single` (the single-turn categories and `irrelevance`),
    /// `loop` (the multi-turn sessions as live agent loops), `replay` (the same sessions
    /// along BFCL's ground truth: the same prompts for every engine).
    #[arg(long, default_value = "single,loop,replay")]
    pub parts: String,
}

fn run_ok(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let st = cmd
        .status()
        .with_context(|| format!("{what}: could not start"))?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

/// The unpacked `bfcl-eval` wheel (fetched on first use).
fn bfcl_root(a: &AgentsArgs, cache: &Path) -> anyhow::Result<PathBuf> {
    let root = cache.join(format!("bfcl-eval-{}", a.bfcl_version));
    if root.join("bfcl_eval/data").is_dir() {
        return Ok(root);
    }
    std::fs::create_dir_all(&root)?;
    eprintln!(
        "bench agents: fetching bfcl-eval=={} (pip download --no-deps)",
        a.bfcl_version
    );
    run_ok(
        Command::new(&a.python)
            .args(["-m", "pip", "download", "--quiet", "--no-deps"])
            .arg(format!("bfcl-eval=={}", a.bfcl_version))
            .arg("-d")
            .arg(&root),
        "pip download bfcl-eval",
    )?;
    let unzip = "import glob, sys, zipfile\n\
                 w = glob.glob(sys.argv[1] + '/bfcl_eval-*.whl')[0]\n\
                 zipfile.ZipFile(w).extractall(sys.argv[1])";
    run_ok(
        Command::new(&a.python).args(["-c", unzip]).arg(&root),
        "unpacking the bfcl-eval wheel",
    )?;
    Ok(root)
}

/// Runs the workload and returns its result with the machine and command line added.
pub fn run(a: &AgentsArgs) -> anyhow::Result<Value> {
    let sglrs = match &a.sglrs_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let cache = match &a.cache_dir {
        Some(d) => d.clone(),
        None => PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/tmp".into()))
            .join(".cache/sglrs/bench-agents"),
    };
    std::fs::create_dir_all(&cache)?;
    let root = bfcl_root(a, &cache)?;
    let model =
        std::fs::canonicalize(&a.model).with_context(|| format!("model {}", a.model.display()))?;
    let hf = cache.join("hf");
    if a.engines.split(',').any(|e| e == "vllm") && !hf.join("config.json").is_file() {
        run_ok(
            Command::new(&sglrs)
                .arg("export-hf")
                .arg("--model")
                .arg(&model)
                .arg("--out")
                .arg(&hf),
            "sglrs export-hf",
        )?;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/bfcl_bench.py");
    let out = Command::new(&a.python)
        .arg(&script)
        .arg("--bfcl-root")
        .arg(&root)
        .args(["--engines", &a.engines])
        .arg("--model")
        .arg(&model)
        .arg("--sglrs-bin")
        .arg(&sglrs)
        .args(["--llamacpp-python", &a.llamacpp_python])
        .args(["--vllm-python", &a.vllm_python])
        .arg("--hf-dir")
        .arg(&hf)
        .args(["--threads", &a.threads.to_string()])
        .args(["--limit", &a.limit.to_string()])
        .args(["--sessions", &a.sessions.to_string()])
        .args(["--concurrency", &a.concurrency.to_string()])
        .args(["--max-tokens", &a.max_tokens.to_string()])
        .args(["--parts", &a.parts])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .last()
        .context("the workload printed nothing")?;
    let mut v: Value = serde_json::from_str(last).context("the workload's last line")?;
    let rate = |e: &str, k: &str| v["engines"][e][k].as_f64();
    let replay = |e: &str, k: &str| v["engines"][e]["replay"][k].as_f64();
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => json!(x / y),
        _ => Value::Null,
    };
    v["ratios"] = json!({
        "sglrs_vs_vllm_turns_per_s": ratio(rate("sglrs", "turns_per_s"), rate("vllm", "turns_per_s")),
        "sglrs_vs_llamacpp_turns_per_s": ratio(rate("sglrs", "turns_per_s"), rate("llamacpp", "turns_per_s")),
        "sglrs_vs_free_turns_per_s": ratio(rate("sglrs", "turns_per_s"), rate("sglrs-free", "turns_per_s")),
        "sglrs_vs_vllm_steps_per_s": ratio(rate("sglrs", "steps_per_s"), rate("vllm", "steps_per_s")),
        "sglrs_vs_llamacpp_steps_per_s": ratio(rate("sglrs", "steps_per_s"), rate("llamacpp", "steps_per_s")),
        // The replay gives every engine the same prompts: the comparable agent-loop rate.
        "sglrs_vs_vllm_replay_turns_per_s": ratio(replay("sglrs", "turns_per_s"), replay("vllm", "turns_per_s")),
        "sglrs_vs_llamacpp_replay_turns_per_s": ratio(replay("sglrs", "turns_per_s"), replay("llamacpp", "turns_per_s")),
        "sglrs_vs_free_replay_turns_per_s": ratio(replay("sglrs", "turns_per_s"), replay("sglrs-free", "turns_per_s")),
    });
    v["bench"] = json!("agents");
    v["bfcl_eval"] = json!(a.bfcl_version);
    v["model"] = json!(model.display().to_string());
    v["cpu"] = json!(crate::common::cpu_model());
    v["env"] = crate::common::kernel_env();
    v["command"] = json!(crate::common::command_line());
    print_table(&v);
    Ok(v)
}

fn print_table(v: &Value) {
    let Some(engines) = v["engines"].as_object() else {
        return;
    };
    eprintln!(
        "{:<12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:>9} {:>6} {:>8} {:>9}",
        "engine",
        "simple",
        "multi",
        "par",
        "par_mul",
        "irrel",
        "m_turn",
        "valid",
        "turns/s",
        "p50 ms",
        "p99 ms",
        "cache",
        "replay/s",
        "rp p50 ms"
    );
    let f = |x: &Value| x.as_f64().map_or("-".to_string(), |x| format!("{x:.3}"));
    for (name, e) in engines {
        let acc = &e["accuracy"];
        eprintln!(
            "{:<12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:>9} {:>6} {:>8} {:>9}",
            name,
            f(&acc["simple_python"]),
            f(&acc["multiple"]),
            f(&acc["parallel"]),
            f(&acc["parallel_multiple"]),
            f(&acc["irrelevance"]),
            f(&acc["multi_turn_base"]),
            f(&e["valid_call_rate"]),
            f(&e["turns_per_s"]),
            f(&e["turn_latency_ms"]["p50"]),
            f(&e["turn_latency_ms"]["p99"]),
            f(&e["cache_hit_rate"]),
            f(&e["replay"]["turns_per_s"]),
            f(&e["replay"]["turn_latency_ms"]["p50"]),
        );
    }
}
