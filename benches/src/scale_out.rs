//! `sglrs bench scale-out`: two replicas on loopback (one CPU each) behind sglang-router,
//! with and without one shared `sglrs kv-store` as the hierarchical cache's remote tier.
//!
//! - Prefix-heavy workload: `--docs` (5) documents of ~`--doc-tokens` (1,000) tokens, each
//!   asked `--questions` (6) short questions, interleaved (every document's first question,
//!   then every document's second, …) and sent by `--clients` (2) concurrent clients
//!   through the router, streamed, `--answer-tokens` (8) each. Three phases on fresh
//!   replicas: `cache_aware` and `round_robin` without the store, `round_robin_store` with
//!   it. Each reports the hit rate (cached prompt tokens / prompt tokens, from the
//!   replicas' own `meta_info`), requests per second and the TTFT p50.
//! - A → B: on the store phase's replicas, `--reps` (3) prompts of ~`--ttft-prompt-tokens`
//!   (2,000) tokens are each computed on replica A, then sent to replica B once A's writes
//!   to the store are done: B's TTFT with the store (`b_remote_ttft_s`, the median) against
//!   B's TTFT for a fresh prompt of the same length (`b_cold_ttft_s`).
//! - `store_read_gb_s`: the same store read by a client in this process (125 pages, one
//!   ~2,000-token prompt's worth, the best of 5 reads); `quic_gb_s`: `sglrs bench
//!   transfer`'s QUIC rate over loopback, in the same run. `b_fetch_gb_s` is what replica B
//!   saw in the A → B part (bytes over the summed read time its remote tier reports,
//!   `hicache_remote.read_seconds`): it also pays for the fresh memory that fetched pages
//!   are kept in (page faults), which a client that drops what it reads does not.
//!
//! The servers are pinned one CPU each from their first instruction (as `sglrs bench pd`
//! does); the store, the router and the clients are not. Every process is stopped at the
//! end, and killed on drop, so an error leaves none behind.
//!
//! The result (last line with `--json`): `{"cache_aware": R, "round_robin": R,
//! "round_robin_store": R, "b_remote_ttft_s", "b_cold_ttft_s", "b_remote_vs_cold",
//! "b_remote_hit_tokens", "b_fetch_gb_s", "b_fetch_bytes", "store_read_gb_s", "quic_gb_s", "store_vs_quic", "cpu", "date", "command", "goals":
//! {"b_remote_ttft_le_20pct_of_cold", "round_robin_store_hit_ge_90pct_of_cache_aware",
//! "store_read_ge_50pct_of_quic"}}`, each `R` `{"hit_rate", "throughput_req_s",
//! "ttft_p50_s", "requests", "remote_hit_tokens"}`.

use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::{percentile, words_text};
use crate::hicache::server::{generate_at, Reply, ServeCommand, Server};
use crate::pd::cluster::{
    allowed_cpus, free_udp_port, start_pinned, write_identity, Router, RunDir,
};

/// Options of `sglrs bench scale-out`.
#[derive(clap::Args, Debug, Clone)]
pub struct ScaleOutArgs {
    /// The `sglrs` binary that serves and stores (default: this one).
    #[arg(long)]
    pub sglrs_bin: Option<PathBuf>,
    /// Model passed to every server and to the store.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// Python with `sglang_router` installed.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Shared documents of the prefix-heavy workload (odd, so that round-robin over two
    /// replicas does not keep each document on one of them by accident).
    #[arg(long, default_value_t = 5)]
    pub docs: usize,
    /// Tokens of each document (approximate).
    #[arg(long, default_value_t = 1000)]
    pub doc_tokens: usize,
    /// Questions asked of each document.
    #[arg(long, default_value_t = 6)]
    pub questions: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// New tokens of each answer.
    #[arg(long, default_value_t = 8)]
    pub answer_tokens: usize,
    /// Tokens of each A → B prompt (approximate).
    #[arg(long, default_value_t = 2000)]
    pub ttft_prompt_tokens: usize,
    /// A → B prompts.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Seed of the generated text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where logs and the cluster identity go, in a fresh folder removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

const QUESTIONS: [&str; 8] = [
    "Which word comes up most often above?",
    "Summarise the text above in one sentence.",
    "What is the third sentence about?",
    "Name two words from the last sentence.",
    "Is the text above about the sea?",
    "Give the text above a title.",
    "Which sentence is the shortest?",
    "What would a reader remember first?",
];

/// A `sglrs kv-store` child on 127.0.0.1, killed on drop.
struct Store {
    child: Child,
    addr: String,
}

impl Store {
    fn start(how: &ServeCommand, identity: &Path, log: PathBuf) -> anyhow::Result<Store> {
        let bin = match &how.bin {
            Some(b) => b.clone(),
            None => std::env::current_exe().context("locating the sglrs binary")?,
        };
        let addr = format!("127.0.0.1:{}", free_udp_port()?);
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(&bin)
            .args(["kv-store", "--listen", &addr, "--ram-gb", "2"])
            .arg("--cluster-identity")
            .arg(identity)
            .arg("--model")
            .arg(&how.model)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} kv-store", bin.display()))?;
        let mut s = Store { child, addr };
        let t0 = Instant::now();
        loop {
            let mut text = String::new();
            std::fs::File::open(&log)?.read_to_string(&mut text)?;
            if text.contains("KV store on") {
                println!("  kv-store on udp://{}", s.addr);
                return Ok(s);
            }
            if let Some(st) = s.child.try_wait()? {
                bail!("sglrs kv-store exited while starting ({st}): {text}");
            }
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("sglrs kv-store did not start within 60 s: {text}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One phase's figures.
fn phase_json(replies: &[Reply], wall: f64) -> Value {
    let prompt: u64 = replies.iter().map(|r| r.prompt_tokens).sum();
    let cached: u64 = replies.iter().map(|r| r.cached_tokens).sum();
    let remote: u64 = replies
        .iter()
        .filter_map(|r| r.details.map(|d| d.remote))
        .sum();
    let ttft: Vec<f64> = replies.iter().map(|r| r.ttft).collect();
    json!({
        "hit_rate": cached as f64 / prompt.max(1) as f64,
        "throughput_req_s": replies.len() as f64 / wall,
        "ttft_p50_s": percentile(&ttft, 50.0),
        "requests": replies.len(),
        "remote_hit_tokens": remote,
    })
}

/// The prefix-heavy workload through `base`: every request, in the interleaved order.
fn prefix_workload(args: &ScaleOutArgs, base: &str) -> anyhow::Result<(Vec<Reply>, f64)> {
    let docs: Vec<String> = (0..args.docs)
        .map(|d| words_text(args.seed * 1000 + d as u64, args.doc_tokens))
        .collect();
    let prompts: Vec<String> = (0..args.questions)
        .flat_map(|q| {
            docs.iter()
                .map(move |d| format!("{d}\n\nQuestion: {}", QUESTIONS[q % QUESTIONS.len()]))
        })
        .collect();
    let next = Mutex::new(0usize);
    let out = Mutex::new(Vec::new());
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(600))
        .build();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..args.clients.max(1))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let i = {
                            let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                            let i = *n;
                            *n += 1;
                            i
                        };
                        let Some(p) = prompts.get(i) else {
                            return Ok(());
                        };
                        let r = generate_at(&agent, base, p, args.answer_tokens)?;
                        out.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| bail!("a client panicked")))
            .collect::<anyhow::Result<Vec<()>>>()
    })?;
    let wall = t0.elapsed().as_secs_f64();
    Ok((out.into_inner().unwrap_or_default(), wall))
}

fn remote_info(s: &Server) -> Value {
    s.info().map_or(Value::Null, |v| {
        v["internal_states"][0]["hicache_remote"].clone()
    })
}

/// Pages handed to the store so far (written, skipped as held, or dropped), from a
/// replica's `hicache_remote` info.
fn offered(r: &Value) -> u64 {
    ["written_pages", "skipped_pages", "dropped_pages"]
        .iter()
        .map(|k| r[*k].as_u64().unwrap_or(0))
        .sum()
}

fn offered_pages(s: &Server) -> u64 {
    offered(&remote_info(s))
}

/// Waits until `s` has offered the store `pages` more pages than `before` and has no
/// write in flight (at most 30 s).
fn wait_written(s: &Server, before: u64, pages: u64) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        let r = remote_info(s);
        if offered(&r) >= before + pages && r["writes_pending"] == json!(false) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!(
        "the replica's writes to the store did not finish within 30 s: {} pages offered, {} expected",
        offered_pages(s) - before,
        pages
    )
}

struct Replicas {
    a: Server,
    b: Server,
}

fn replicas(
    args: &ScaleOutArgs,
    run: &RunDir,
    cpus: &[usize],
    store: Option<(&Store, &Path)>,
    tag: &str,
) -> anyhow::Result<Replicas> {
    let how = ServeCommand {
        bin: args.sglrs_bin.clone(),
        model: args.model.clone(),
        threads: Some(1),
    };
    let mut flags: Vec<String> = Vec::new();
    if let Some((st, id)) = store {
        flags.extend(
            [
                "--enable-hierarchical-cache",
                "--hicache-storage-backend",
                "quic",
                "--hicache-storage-addr",
                &st.addr,
                "--cluster-identity",
            ]
            .map(String::from),
        );
        flags.push(id.display().to_string());
    }
    let a = start_pinned(&how, &flags, run.0.join(format!("{tag}-a.log")), &cpus[..1])?;
    let b = start_pinned(
        &how,
        &flags,
        run.0.join(format!("{tag}-b.log")),
        &cpus[1..2],
    )?;
    for s in [&a, &b] {
        s.generate("Hello", 2)?; // warm-up
    }
    Ok(Replicas { a, b })
}

fn routed_phase(
    args: &ScaleOutArgs,
    run: &RunDir,
    r: &Replicas,
    policy: &str,
    tag: &str,
) -> anyhow::Result<Value> {
    let router = Router::start_regular(
        &args.python,
        &[&r.a, &r.b],
        policy,
        run.0.join(format!("{tag}-router.log")),
    )?;
    let (replies, wall) = prefix_workload(args, &router.base)?;
    router.stop()?;
    let v = phase_json(&replies, wall);
    println!(
        "  {tag:18} hit rate {:.3}  {:.2} req/s  TTFT p50 {:.3} s",
        v["hit_rate"].as_f64().unwrap_or(0.0),
        v["throughput_req_s"].as_f64().unwrap_or(0.0),
        v["ttft_p50_s"].as_f64().unwrap_or(0.0)
    );
    Ok(v)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A → B: B's TTFT for prompts A computed, against fresh ones; and B's store read rate.
fn a_to_b(args: &ScaleOutArgs, r: &Replicas) -> anyhow::Result<Value> {
    let before = remote_info(&r.b);
    let (mut remote, mut cold, mut hit_tokens) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..args.reps.max(1) {
        let seed = 1_000_000 + args.seed * 100 + rep as u64;
        let shared = words_text(seed, args.ttft_prompt_tokens);
        let before = offered_pages(&r.a);
        let first = r.a.generate(&shared, 1)?;
        // Every full page of the prompt (the new token has no KV yet).
        wait_written(&r.a, before, first.prompt_tokens / 16)?;
        let hit = r.b.generate(&shared, 1)?;
        hit_tokens.push(hit.details.map_or(0, |d| d.remote));
        remote.push(hit.ttft);
        let fresh = words_text(seed + 500_000, args.ttft_prompt_tokens);
        cold.push(r.b.generate(&fresh, 1)?.ttft);
    }
    let after = remote_info(&r.b);
    let d = |k: &str| after[k].as_f64().unwrap_or(0.0) - before[k].as_f64().unwrap_or(0.0);
    let fetch_gb_s = d("read_bytes") / 1e9 / d("read_seconds").max(1e-9);
    let (rm, cm) = (median(remote), median(cold));
    println!(
        "  A -> B: TTFT {rm:.3} s from the store vs {cm:.3} s cold ({:.1}%), remote hit tokens {hit_tokens:?}; B's fetches {fetch_gb_s:.2} GB/s",
        100.0 * rm / cm
    );
    Ok(json!({
        "b_remote_ttft_s": rm,
        "b_cold_ttft_s": cm,
        "b_remote_vs_cold": rm / cm,
        "b_remote_hit_tokens": hit_tokens,
        "b_fetch_gb_s": fetch_gb_s,
        "b_fetch_bytes": d("read_bytes"),
    }))
}

/// Reads from the store as a client: `pages` pages (one prompt of ~2,000 tokens) written
/// through a [`StoreSet`] of this process, then read back `rounds` times; the best round's
/// GB/s. Every page is verified by the store client's checksum, as in serving.
fn store_read_rate(
    store: &Store,
    identity: &Path,
    pages: usize,
    rounds: usize,
) -> anyhow::Result<f64> {
    use sglrs_transfer::quic::{QuicConfig, StoreSet, StoreSetConfig};
    let layout = sglrs_transfer::KvLayout {
        dtype: sglrs_transfer::KvDtype::F16,
        ..sglrs_transfer::KvLayout::smollm2_135m()
    };
    let security = sglrs_transfer::quic::read_identity(identity).map_err(anyhow::Error::msg)?;
    let set = StoreSet::start(StoreSetConfig {
        addrs: vec![store.addr.clone()],
        layout,
        security,
        quic: QuicConfig::loopback(),
        read_timeout: Duration::from_secs(10),
        write_timeout: Duration::from_secs(30),
        max_write_bytes: 1 << 30,
        connect_grace: Duration::from_secs(5),
    })
    .context("connecting to the store")?;
    let pb = layout.page_bytes();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let data: Vec<(sglrs_radix_cache::PageHash, bytes::Bytes)> = (0..pages)
        .map(|i| {
            let page: Vec<u8> = (0..pb)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            (
                sglrs_radix_cache::PageHash(0x5ca1_e000 + i as u128),
                page.into(),
            )
        })
        .collect();
    let hashes: Vec<_> = data.iter().map(|(h, _)| *h).collect();
    set.write(data);
    let t0 = Instant::now();
    while set.writes_pending() {
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("the store set's writes did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut best = 0.0f64;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        let got = set.get(&hashes);
        let secs = t.elapsed().as_secs_f64();
        let bytes: usize = got.iter().flatten().map(|b| b.len()).sum();
        if bytes != pages * pb {
            bail!("the store answered {bytes} of {} bytes", pages * pb);
        }
        best = best.max(bytes as f64 / 1e9 / secs);
    }
    println!("  store reads (a client of this process, {pages} pages): {best:.2} GB/s");
    Ok(best)
}

/// `sglrs bench transfer`'s QUIC rate over loopback, now.
fn quic_rate() -> anyhow::Result<f64> {
    #[derive(clap::Parser)]
    struct P {
        #[command(flatten)]
        t: crate::transfer::TransferArgs,
    }
    let p = <P as clap::Parser>::try_parse_from(["transfer", "--pages", "512", "--rounds", "3"])
        .context("transfer bench arguments")?;
    let v = crate::transfer::run(&p.t)?;
    v["quic_gb_s"]
        .as_f64()
        .context("the transfer bench reported no quic_gb_s")
}

/// Runs the benchmark; returns the JSON object described in the module docs.
pub fn run(args: &ScaleOutArgs) -> anyhow::Result<Value> {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        bail!(
            "sglrs bench scale-out needs two CPUs (one per replica); this process may use {cpus:?}"
        );
    }
    let cpu = crate::common::cpu_model();
    println!(
        "scale-out: {} documents x {} questions (~{} tokens each), {} clients, on {cpu}",
        args.docs, args.questions, args.doc_tokens, args.clients
    );
    let run_dir = RunDir::new(args.dir.as_deref())?;
    let how = ServeCommand {
        bin: args.sglrs_bin.clone(),
        model: args.model.clone(),
        threads: Some(1),
    };
    let identity = run_dir.0.join("identity");
    write_identity(&how, &identity)?;
    let mut out = json!({});
    for (policy, tag) in [
        ("cache_aware", "cache_aware"),
        ("round_robin", "round_robin"),
    ] {
        let r = replicas(args, &run_dir, &cpus, None, tag)?;
        out[tag] = routed_phase(args, &run_dir, &r, policy, tag)?;
        r.a.stop()?;
        r.b.stop()?;
    }
    let store = Store::start(&how, &identity, run_dir.0.join("kv-store.log"))?;
    let r = replicas(
        args,
        &run_dir,
        &cpus,
        Some((&store, &identity)),
        "round_robin_store",
    )?;
    out["round_robin_store"] =
        routed_phase(args, &run_dir, &r, "round_robin", "round_robin_store")?;
    let ab = a_to_b(args, &r)?;
    r.a.stop()?;
    r.b.stop()?;
    let store_gb_s = store_read_rate(&store, &identity, 125, 5)?;
    drop(store);
    out["store_read_gb_s"] = json!(store_gb_s);
    for (k, v) in ab.as_object().into_iter().flatten() {
        out[k] = v.clone();
    }
    let quic = quic_rate()?;
    out["quic_gb_s"] = json!(quic);
    out["store_vs_quic"] = json!(store_gb_s / quic);
    let hits: Vec<f64> = ["cache_aware", "round_robin", "round_robin_store"]
        .iter()
        .map(|k| out[*k]["hit_rate"].as_f64().unwrap_or(0.0))
        .collect();
    let (ca, rr, rs) = (hits[0], hits[1], hits[2]);
    let remote_ok = out["b_remote_vs_cold"].as_f64().is_some_and(|x| x <= 0.2);
    out["goals"] = json!({
        "b_remote_ttft_le_20pct_of_cold": remote_ok,
        "round_robin_store_hit_ge_90pct_of_cache_aware": rs >= 0.9 * ca,
        "store_read_ge_50pct_of_quic": store_gb_s >= 0.5 * quic,
    });
    out["cpu"] = json!(cpu);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    out["date"] = json!(crate::pd::report::utc_date(now));
    out["command"] = json!(crate::common::command_line());
    println!(
        "  round_robin with the store reaches {:.0}% of cache_aware's hit rate (round_robin without: {:.0}%); store reads at {:.0}% of QUIC's {quic:.2} GB/s",
        100.0 * rs / ca.max(1e-9),
        100.0 * rr / ca.max(1e-9),
        100.0 * store_gb_s / quic
    );
    Ok(out)
}
