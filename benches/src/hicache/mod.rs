//! `sglrs bench hicache`: the hierarchical KV cache (device pool, host tier, disk tier)
//! under a multi-turn workload that does not fit the device pool, a restart that finds its
//! pages on disk, and the disk tier's read rate against `dd`.
//!
//! The bench starts its own `sglrs serve` children (`--sglrs-bin`, default this binary), one
//! at a time, on a free port of 127.0.0.1, waits for `GET /health`, and stops each with
//! SIGTERM (SIGKILL if it has not exited after two minutes).
//!
//! - Multi-turn workload, in the manner of SGLang's `benchmark/hicache/bench_multiturn.py`:
//!   `--clients` conversations (16) of `--rounds` turns (8). Each turn appends
//!   ~`--turn-tokens` (300) tokens of seeded pseudo-random lowercase words, different for
//!   every client and round, to the conversation so far (`User: …\nAssistant:`, the previous
//!   answers included) and asks for `--output-tokens` (8) tokens at temperature 0 through the
//!   native `POST /generate`, streamed; TTFT is the time to the first event with text. At most
//!   `--in-flight` (4) conversations have a request outstanding; a conversation whose turn
//!   finished queues behind the others, so by its next turn its pages have left the device
//!   pool. It runs on four servers with the same device pool (`--kv-memory-mb`, 64, and
//!   `--context-length 2560`): `off` (no hierarchical cache), `host` (a host tier of
//!   `--host-gb`), `disk` (a file-backed disk tier only) and `host_disk` (both). The defaults
//!   make all conversations together ≥ 8× the pool's tokens; the bench prints the ratio and
//!   warns below 8.
//! - Host loads against memcpy (the goal: host → device page loads at ≥ 50% of memcpy
//!   bandwidth): after the `host` workload, before its server stops, `GET /get_server_info`
//!   gives `internal_states[0].hicache.loaded_bytes` (bytes copied into the device pool from
//!   the lower tiers), `.load_seconds_sum` (seconds spent in loads) and
//!   `internal_states[0].hicache_store.host_hits`; `host_load_gb_s` is bytes / seconds.
//!   Then the bench copies a 256 MiB buffer into another (both written first) five times in
//!   its own process: `memcpy_gb_s` is the fastest, each byte counted once.
//! - `restart`: a disk-tier server (`--context-length 4608 --kv-memory-mb 256`) gets one
//!   prompt of ~`--restart-tokens` (4200; at least 4,000 or the bench fails) and one output
//!   token (cold TTFT); it is stopped with SIGTERM (a clean shutdown flushes the disk tier), a
//!   new server starts on the same directory and gets the same prompt (warm TTFT).
//! - `disk_read`: the restart case's segment files are dropped from the page cache
//!   (`posix_fadvise(DONTNEED)`, and `/proc/sys/vm/drop_caches` where writable), opened as a
//!   `PageStore`, dropped again, and every stored page read back with checksums verified:
//!   `disk_read_gb_s`. Then `dd iflag=direct` (a plain `dd` after dropping caches where
//!   O_DIRECT is refused, e.g. tmpfs) reads the largest segment: `dd_read_gb_s`.
//!
//! `--only` picks a subset (`off,host,disk,host_disk,restart,disk_read`; `disk_read` needs
//! `restart`). The result has the shape `{"cpu", "off": C, "host": C + {"loaded_bytes",
//! "load_seconds_sum", "host_hits", "host_load_gb_s"}, "memcpy_gb_s", "disk": C,
//! "host_disk": C, "restart": {"cold_ttft_s", "warm_ttft_s", "warm_cached_tokens_details",
//! "prompt_tokens"}, "disk_read_gb_s", "dd_read_gb_s", "dd_note", "disk_read_note", "ratios":
//! {"disk_throughput_vs_off", "disk_ttft_p50_vs_off", "host_disk_throughput_vs_off",
//! "restart_warm_vs_cold", "disk_read_vs_dd", "host_load_vs_memcpy"}, "command"}` where
//! each configuration `C` is `{"ttft_p50_s", "ttft_p90_s", "throughput_req_s", "input_tok_s",
//! "cached_tokens_by_source": {"device", "host", "disk", "remote"}, "cached_tokens",
//! "requests", "prompt_tokens", "wall_s", "conversation_tokens", "pool_tokens", "pool_ratio",
//! "ram_note"}`.
//! `cached_tokens_by_source` sums each reply's final `meta_info.cached_tokens_details` (a
//! reply without one adds nothing and is counted in a warning); `cached_tokens` sums
//! `meta_info.cached_tokens`. `pool_tokens` is `num_pages × page_size` of
//! `/get_server_info` (absent, with `pool_ratio`, where it does not say); so are the host
//! load keys the server does not report, and `host_load_gb_s` when no load took time. Only
//! the keys of what ran are present (`memcpy_gb_s` with `host`), and only the ratios whose
//! inputs are.

use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

mod disk;
mod report;
pub(crate) mod server;
mod workload;

use report::{
    assemble, command_line, cpu_model, host_loads, memcpy_gb_s, MEMCPY_BYTES, MEMCPY_REPS,
};
use server::{Cached, Reply, ServeCommand, Server};
use workload::{run_workload, summarize, turn_seed, words_text, Workload};

/// Arguments of `sglrs bench hicache`.
#[derive(clap::Args, Debug, Clone)]
pub struct HicacheArgs {
    /// The `sglrs` binary that serves (default: this one).
    #[arg(long)]
    pub sglrs_bin: Option<PathBuf>,
    /// Model passed to every server.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// Kernel threads of each server (default: the server's, all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Conversations of the multi-turn workload.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 8)]
    pub rounds: usize,
    /// New user tokens per turn (approximate: words are generated, ~1.09 tokens each).
    #[arg(long, default_value_t = 300)]
    pub turn_tokens: usize,
    /// Answer tokens per turn.
    #[arg(long, default_value_t = 8)]
    pub output_tokens: usize,
    /// Most conversations with a request outstanding at once.
    #[arg(long, default_value_t = 4)]
    pub in_flight: usize,
    /// Device KV pool of the multi-turn servers, MiB (`--kv-memory-mb` of serve).
    #[arg(long, default_value_t = 64)]
    pub kv_memory_mb: usize,
    /// Host tier of the `host` and `host_disk` servers, GB (`--hicache-size` of serve).
    #[arg(long, default_value_t = 1.0)]
    pub host_gb: f64,
    /// Where the disk tiers and server logs go, in a fresh folder removed at the end
    /// (default: the system temp folder).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Prompt tokens of the restart case (approximate; the server's count must be ≥ 4,000).
    #[arg(long, default_value_t = 4200)]
    pub restart_tokens: usize,
    /// Seed of the generated text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Parts to run (comma separated): off, host, disk, host_disk, restart, disk_read.
    #[arg(long, default_value = "off,host,disk,host_disk,restart,disk_read")]
    pub only: String,
}

/// Every part `--only` accepts, in the order they run.
const PARTS: [&str; 6] = ["off", "host", "disk", "host_disk", "restart", "disk_read"];
/// Context length of the multi-turn servers: small, so a small pool is allowed.
const MULTITURN_CONTEXT: usize = 2560;
/// The restart server's context length and device pool, MiB.
const RESTART_CONTEXT: usize = 4608;
const RESTART_KV_MB: usize = 256;
/// Fewest prompt tokens the restart case accepts.
const RESTART_MIN_TOKENS: u64 = 4000;
/// The fraction of memcpy bandwidth host -> device page loads should reach.
const HOST_LOAD_GOAL: f64 = 0.5;
/// Conversation tokens per pool token below which the workload may fit the device pool.
const MIN_POOL_RATIO: f64 = 8.0;

/// How `args` starts its servers.
fn serve_command(args: &HicacheArgs) -> ServeCommand {
    ServeCommand {
        bin: args.sglrs_bin.clone(),
        model: args.model.clone(),
        threads: args.threads,
    }
}

/// A fresh folder for disk tiers and logs, removed on drop.
struct RunDir(PathBuf);

impl RunDir {
    fn new(parent: Option<&Path>) -> anyhow::Result<RunDir> {
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = parent.join(format!(
            "sglrs-bench-hicache-{}-{nanos:09}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(RunDir(dir))
    }

    /// A fresh, empty subfolder.
    fn fresh(&self, name: &str) -> anyhow::Result<PathBuf> {
        let d = self.0.join(name);
        if d.exists() {
            std::fs::remove_dir_all(&d)?;
        }
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// Multi-turn configurations

/// The serve flags of a multi-turn configuration beyond the shared pool flags.
fn tier_flags(name: &str, host_gb: f64, disk_dir: Option<&Path>) -> Vec<String> {
    let dir = disk_dir.map_or_else(String::new, |d| d.display().to_string());
    let gb = host_gb.to_string();
    let host = ["--enable-hierarchical-cache", "--hicache-size", &gb];
    let no_host = [
        "--enable-hierarchical-cache",
        "--hicache-size",
        "0",
        "--hicache-ratio",
        "0",
    ];
    let disk = [
        "--hicache-storage-backend",
        "file",
        "--hicache-storage-dir",
        &dir,
    ];
    let v = match name {
        "host" => host.to_vec(),
        "disk" => [&no_host[..], &disk].concat(),
        "host_disk" => [&host[..], &disk].concat(),
        _ => vec![],
    };
    v.into_iter().map(String::from).collect()
}

/// One multi-turn configuration: start its server, run the workload, stop it.
fn multiturn(
    args: &HicacheArgs,
    run_dir: &RunDir,
    name: &str,
    w: &Workload,
) -> anyhow::Result<Value> {
    println!("{name}:");
    let disk = matches!(name, "disk" | "host_disk");
    let disk_dir = if disk {
        Some(run_dir.fresh(&format!("{name}-tier"))?)
    } else {
        None
    };
    let mut flags = vec![
        "--kv-memory-mb".to_string(),
        args.kv_memory_mb.to_string(),
        "--context-length".into(),
        MULTITURN_CONTEXT.to_string(),
    ];
    flags.extend(tier_flags(name, args.host_gb, disk_dir.as_deref()));
    let log = run_dir.0.join(format!("{name}.log"));
    let mut server = Server::start(&serve_command(args), &flags, log)
        .with_context(|| format!("starting the {name} server"))?;
    let pool = server.pool_tokens();
    let run = match run_workload(&server, w, args.rounds, args.output_tokens, args.in_flight) {
        Ok(r) => r,
        Err(e) => {
            let why = server.failure_context();
            return Err(e.context(format!("{name} workload; {why}")));
        }
    };
    // The host tier's loads, while the server that made them still runs.
    let loads = (name == "host").then(|| {
        server
            .info()
            .map_or_else(Default::default, |i| host_loads(&i))
    });
    server.stop()?;
    if let Some(d) = &disk_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    let host = if matches!(name, "host" | "host_disk") {
        format!("host tier {} GB", args.host_gb)
    } else {
        "no host tier".into()
    };
    let ram_note = format!("device pool {} MB; {host}", args.kv_memory_mb);
    let mut v = summarize(&run, pool, ram_note);
    for (k, x) in loads.iter().flatten() {
        v[k.as_str()] = x.clone();
    }
    let c = &v["cached_tokens_by_source"];
    println!(
        "  {} requests in {:.2} s: {:.2} req/s, {:.0} input tok/s; TTFT p50 {:.3} s, p90 {:.3} s",
        v["requests"],
        run.wall,
        v["throughput_req_s"].as_f64().unwrap_or(0.0),
        v["input_tok_s"].as_f64().unwrap_or(0.0),
        v["ttft_p50_s"].as_f64().unwrap_or(0.0),
        v["ttft_p90_s"].as_f64().unwrap_or(0.0)
    );
    println!(
        "  cached tokens: {} of {} prompt tokens (device {}, host {}, disk {}, remote {})",
        v["cached_tokens"], v["prompt_tokens"], c["device"], c["host"], c["disk"], c["remote"]
    );
    let missing = run.replies.iter().filter(|r| r.details.is_none()).count();
    if missing > 0 {
        println!("  warning: {missing} replies had no meta_info.cached_tokens_details");
    }
    match pool {
        Some(p) => {
            let ratio = run.conversation_tokens as f64 / p.max(1) as f64;
            println!(
                "  conversations end at {} tokens = {ratio:.1}x the pool's {p} tokens",
                run.conversation_tokens
            );
            if ratio < MIN_POOL_RATIO {
                println!("  warning: under {MIN_POOL_RATIO}x the pool: the workload may largely fit the device pool");
            }
        }
        None => println!("  (no num_pages/page_size in /get_server_info: pool ratio unknown)"),
    }
    if let Some(m) = &loads {
        match m.get("host_load_gb_s").and_then(Value::as_f64) {
            Some(r) => println!(
                "  host -> device loads: {:.1} MB in {:.3} s = {r:.2} GB/s ({} host hits)",
                m["loaded_bytes"].as_f64().unwrap_or(0.0) / 1e6,
                m["load_seconds_sum"].as_f64().unwrap_or(0.0),
                m.get("host_hits").unwrap_or(&Value::Null)
            ),
            None => println!(
                "  warning: no host load rate (/get_server_info: loaded_bytes {}, load_seconds_sum {})",
                m.get("loaded_bytes").unwrap_or(&Value::Null),
                m.get("load_seconds_sum").unwrap_or(&Value::Null)
            ),
        }
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------
// Restart and disk read

/// The restart case; returns its result and the disk tier folder it left.
fn restart(args: &HicacheArgs, run_dir: &RunDir) -> anyhow::Result<(Value, PathBuf)> {
    println!("restart:");
    let dir = run_dir.fresh("restart-tier")?;
    let mut flags = tier_flags("disk", 0.0, Some(&dir));
    flags.extend([
        "--context-length".into(),
        RESTART_CONTEXT.to_string(),
        "--kv-memory-mb".into(),
        RESTART_KV_MB.to_string(),
    ]);
    let prompt = words_text(turn_seed(args.seed, usize::MAX, 0), args.restart_tokens);
    let one = |label: &str| -> anyhow::Result<Reply> {
        let log = run_dir.0.join(format!("restart-{label}.log"));
        let mut server = Server::start(&serve_command(args), &flags, log)
            .with_context(|| format!("starting the {label} restart server"))?;
        let r = match server.generate(&prompt, 1) {
            Ok(r) => r,
            Err(e) => {
                let why = server.failure_context();
                return Err(e.context(format!("{label} restart request; {why}")));
            }
        };
        if !server.stop()? && label == "cold" {
            bail!("the cold restart server did not shut down cleanly, so its disk tier was not flushed");
        }
        if r.prompt_tokens < RESTART_MIN_TOKENS {
            bail!(
                "the restart prompt is {} tokens, under {RESTART_MIN_TOKENS}: raise --restart-tokens",
                r.prompt_tokens
            );
        }
        Ok(r)
    };
    let cold = one("cold")?;
    println!(
        "  cold: {} prompt tokens, TTFT {:.3} s",
        cold.prompt_tokens, cold.ttft
    );
    let warm = one("warm")?;
    let d = warm.details.unwrap_or_default();
    println!(
        "  warm: TTFT {:.3} s ({:.2}x cold), cached {} (device {}, host {}, disk {}, remote {})",
        warm.ttft,
        warm.ttft / cold.ttft.max(1e-9),
        warm.cached_tokens,
        d.device,
        d.host,
        d.disk,
        d.remote
    );
    if d.disk == 0 {
        println!("  warning: the warm request found nothing on disk");
    }
    let v = json!({
        "cold_ttft_s": cold.ttft,
        "warm_ttft_s": warm.ttft,
        "warm_cached_tokens_details": warm.details.map_or(Value::Null, Cached::to_json),
        "warm_cached_tokens": warm.cached_tokens,
        "prompt_tokens": cold.prompt_tokens,
    });
    Ok((v, dir))
}

// ---------------------------------------------------------------------------------------

/// The memcpy rate of this machine, the baseline of the `host` configuration's loads
/// (`host`, its result); prints both.
fn memcpy_baseline(host: &Value) -> Option<f64> {
    let m = memcpy_gb_s(MEMCPY_BYTES, MEMCPY_REPS)?;
    let mib = MEMCPY_BYTES >> 20;
    println!("memcpy: {m:.2} GB/s (fastest of {MEMCPY_REPS} copies of {mib} MiB)");
    if let Some(h) = host["host_load_gb_s"].as_f64() {
        println!(
            "  host -> device loads at {h:.2} GB/s are {:.0}% of memcpy (goal: at least {:.0}%)",
            100.0 * h / m,
            100.0 * HOST_LOAD_GOAL
        );
    }
    Some(m)
}

/// The parts `only` names, checked.
fn parse_only(only: &str) -> anyhow::Result<Vec<&str>> {
    let parts: Vec<&str> = only
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(p) = parts.iter().find(|p| !PARTS.contains(p)) {
        bail!("--only: unknown part {p:?} (parts: {})", PARTS.join(", "));
    }
    if parts.contains(&"disk_read") && !parts.contains(&"restart") {
        bail!("--only: disk_read reads the disk tier the restart case writes; add restart");
    }
    Ok(parts)
}

/// Runs the selected parts; returns the `--json` object.
pub fn run(args: &HicacheArgs) -> anyhow::Result<Value> {
    let only = parse_only(&args.only)?;
    if !args.model.exists() {
        bail!(
            "model {} not found (`make model` fetches the default; or pass --model)",
            args.model.display()
        );
    }
    let cpu = cpu_model();
    println!("bench hicache: cpu {cpu}");
    println!(
        "  model {}, {} clients x {} rounds x ~{} tokens (+{} answer), {} in flight; device pool {} MB",
        args.model.display(), args.clients, args.rounds, args.turn_tokens,
        args.output_tokens, args.in_flight, args.kv_memory_mb
    );
    let run_dir = RunDir::new(args.dir.as_deref())?;
    let w = Workload::new(args.clients, args.rounds, args.turn_tokens, args.seed);
    let mut out = json!({});
    for name in ["off", "host", "disk", "host_disk"] {
        if only.contains(&name) {
            out[name] = multiturn(args, &run_dir, name, &w)?;
            if name == "host" {
                if let Some(m) = memcpy_baseline(&out["host"]) {
                    out["memcpy_gb_s"] = json!(m);
                }
            }
        }
    }
    if only.contains(&"restart") {
        let (v, dir) = restart(args, &run_dir)?;
        out["restart"] = v;
        if only.contains(&"disk_read") {
            let d = disk::disk_read(&dir)?;
            for (k, v) in d.as_object().into_iter().flatten() {
                out[k.as_str()] = v.clone();
            }
        }
    }
    let out = assemble(out, &cpu, &command_line());
    for (k, v) in out["ratios"].as_object().into_iter().flatten() {
        println!("ratio {k}: {:.3}", v.as_f64().unwrap_or(f64::NAN));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_parts() {
        let d = Path::new("/tmp/d");
        assert!(tier_flags("off", 1.0, None).is_empty());
        assert_eq!(
            tier_flags("host", 1.0, None).join(" "),
            "--enable-hierarchical-cache --hicache-size 1"
        );
        assert_eq!(
            tier_flags("disk", 1.0, Some(d)).join(" "),
            "--enable-hierarchical-cache --hicache-size 0 --hicache-ratio 0 --hicache-storage-backend file --hicache-storage-dir /tmp/d"
        );
        assert_eq!(
            tier_flags("host_disk", 0.5, Some(d)).join(" "),
            "--enable-hierarchical-cache --hicache-size 0.5 --hicache-storage-backend file --hicache-storage-dir /tmp/d"
        );
        assert_eq!(parse_only("off, disk").expect("parts"), ["off", "disk"]);
        assert!(parse_only("off,bogus").is_err());
        assert!(parse_only("disk_read").is_err());
        assert!(parse_only("restart,disk_read").is_ok());
    }
}
