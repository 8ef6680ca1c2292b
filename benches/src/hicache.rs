//! `sglrs bench hicache`: the hierarchical KV cache (device pool, host tier, disk tier)
//! under a multi-turn workload that does not fit the device pool, a restart that finds its
//! pages on disk, and the disk tier's read rate against `dd`.
//!
//! The bench starts its own `sglrs serve` children (`--sglrs-bin`, default this binary), one
//! at a time, on a free port of 127.0.0.1, waits for `GET /health`, and stops each with
//! SIGTERM (SIGKILL if it has not exited after two minutes).
//!
//! - Multi-turn workload, in the manner of SGLang's `benchmark/hicache/bench_multiturn.py`:
//!   `--clients` conversations (16) of `--rounds` turns (6). Each turn appends
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
//! `restart`). The result has the shape `{"cpu", "off": C, "host": C, "disk": C,
//! "host_disk": C, "restart": {"cold_ttft_s", "warm_ttft_s", "warm_cached_tokens_details",
//! "prompt_tokens"}, "disk_read_gb_s", "dd_read_gb_s", "dd_note", "disk_read_note", "ratios":
//! {"disk_throughput_vs_off", "disk_ttft_p50_vs_off", "host_disk_throughput_vs_off",
//! "restart_warm_vs_cold", "disk_read_vs_dd"}, "command"}` where each configuration `C` is
//! `{"ttft_p50_s", "ttft_p90_s", "throughput_req_s", "input_tok_s", "cached_tokens_by_source":
//! {"device", "host", "disk", "remote"}, "cached_tokens", "requests", "prompt_tokens",
//! "wall_s", "conversation_tokens", "pool_tokens", "pool_ratio", "ram_note"}`.
//! `cached_tokens_by_source` sums each reply's final `meta_info.cached_tokens_details` (a
//! reply without one adds nothing and is counted in a warning); `cached_tokens` sums
//! `meta_info.cached_tokens`. `pool_tokens` is `num_pages × page_size` of
//! `/get_server_info` (absent, with `pool_ratio`, where it does not say). Only the keys of
//! what ran are present, and only the ratios whose inputs are.

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::BufRead;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use sglrs_radix_cache::store::{DiskConfig, PageStore, PageStoreConfig};

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
    #[arg(long, default_value_t = 6)]
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
/// Conversation tokens per pool token below which the workload may fit the device pool.
const MIN_POOL_RATIO: f64 = 8.0;
/// Bounds on a server's start, stop and on one request.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_TIMEOUT: Duration = Duration::from_secs(120);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------------------------------
// Workload text

/// Common English words, separated by spaces; with SmolLM2's tokenizer each is one token
/// after a space.
const WORDS: &str = "\
    the of and to in is was for on that with as by at from his her they this which or had \
    are but not have one were all there when can said who more been if will out so about \
    what up their would them into has some time could other than then its two may only now \
    like first over new years also after made most many way down did people three such \
    where before well back through much any even good year same long work day own world \
    part under last because while just place little still life both between great found \
    here state those never being old high each small house water thought room another \
    around night point story river city town field light voice road stone green black \
    white north south early late open close hand face eye door table window garden morning \
    evening market school letter paper music bread winter summer spring autumn mountain \
    island forest valley bridge tower church train ship horse bird tree flower fire wind \
    rain snow cloud sun moon star sea";

/// SplitMix64: a fixed, dependency-free generator, so the text never changes with a crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Words for ~`tokens` tokens: SmolLM2 counts 1.087 tokens per word of this text (277 words
/// are 301 tokens, 2,300 are 2,501), so 12 words per 13 tokens.
fn words_for(tokens: usize) -> usize {
    (tokens * 12).div_ceil(13)
}

/// Seeded lowercase sentences of [`WORDS`], 8–14 words each, ~`tokens` tokens in all.
fn words_text(seed: u64, tokens: usize) -> String {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut rng = Rng(seed);
    let mut out = String::new();
    let mut left = 8 + rng.below(7);
    for i in 0..words_for(tokens) {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(words[rng.below(words.len())]);
        left -= 1;
        if left == 0 {
            out.push('.');
            left = 8 + rng.below(7);
        }
    }
    out
}

/// The seed of one turn's text: distinct for every (seed, client, round).
fn turn_seed(seed: u64, client: usize, round: usize) -> u64 {
    let mut r = Rng(seed ^ ((client as u64) << 32 | round as u64));
    r.next() ^ Rng(seed.rotate_left(17) ^ client as u64).next()
}

/// The user text of every turn: `turns[client][round]`.
struct Workload {
    turns: Vec<Vec<String>>,
}

impl Workload {
    fn new(clients: usize, rounds: usize, turn_tokens: usize, seed: u64) -> Self {
        let turns = (0..clients)
            .map(|c| {
                (0..rounds)
                    .map(|r| words_text(turn_seed(seed, c, r), turn_tokens))
                    .collect()
            })
            .collect();
        Workload { turns }
    }

    /// The prompt of turn `round` after the conversation `history`.
    fn prompt(&self, history: &str, client: usize, round: usize) -> String {
        format!("{history}User: {}\nAssistant:", self.turns[client][round])
    }
}

// ---------------------------------------------------------------------------------------
// Statistics and results

/// Percentile `p` (0–100) of `v`, interpolated linearly between ranks (numpy's default).
fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = p / 100.0 * (s.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (rank - lo as f64)
}

/// Cached prompt tokens by the tier they came from (`meta_info.cached_tokens_details`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cached {
    device: u64,
    host: u64,
    disk: u64,
    remote: u64,
}

impl Cached {
    fn from_json(v: &Value) -> Option<Cached> {
        let o = v.as_object()?;
        let f = |k: &str| o.get(k).and_then(Value::as_u64).unwrap_or(0);
        Some(Cached {
            device: f("device"),
            host: f("host"),
            disk: f("disk"),
            remote: f("remote"),
        })
    }

    fn add(&mut self, o: Cached) {
        self.device += o.device;
        self.host += o.host;
        self.disk += o.disk;
        self.remote += o.remote;
    }

    fn to_json(self) -> Value {
        json!({"device": self.device, "host": self.host, "disk": self.disk, "remote": self.remote})
    }
}

/// One streamed `/generate` reply.
#[derive(Clone, Debug)]
struct Reply {
    text: String,
    ttft: f64,
    prompt_tokens: u64,
    completion_tokens: u64,
    cached_tokens: u64,
    /// `None` when the final event has no `cached_tokens_details`.
    details: Option<Cached>,
}

/// `b / a`, where both are present and `a` is not zero.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a != 0.0 => Some(b / a),
        _ => None,
    }
}

/// The ratios of `out` that its keys allow: `x_vs_y` is x / y.
fn ratios(out: &Value) -> Value {
    let f = |part: &str, key: &str| out.get(part).and_then(|p| p.get(key)?.as_f64());
    let top = |key: &str| out.get(key).and_then(Value::as_f64);
    let mut r = serde_json::Map::new();
    let mut put = |k: &str, v: Option<f64>| {
        if let Some(v) = v {
            r.insert(k.into(), json!(v));
        }
    };
    let off_tput = f("off", "throughput_req_s");
    put(
        "disk_throughput_vs_off",
        ratio(off_tput, f("disk", "throughput_req_s")),
    );
    put(
        "disk_ttft_p50_vs_off",
        ratio(f("off", "ttft_p50_s"), f("disk", "ttft_p50_s")),
    );
    put(
        "host_disk_throughput_vs_off",
        ratio(off_tput, f("host_disk", "throughput_req_s")),
    );
    put(
        "restart_warm_vs_cold",
        ratio(f("restart", "cold_ttft_s"), f("restart", "warm_ttft_s")),
    );
    put(
        "disk_read_vs_dd",
        ratio(top("dd_read_gb_s"), top("disk_read_gb_s")),
    );
    Value::Object(r)
}

/// Adds `cpu`, `ratios` and `command` to the parts that ran.
fn assemble(mut out: Value, cpu: &str, command: &str) -> Value {
    out["cpu"] = json!(cpu);
    out["ratios"] = ratios(&out);
    out["command"] = json!(command);
    out
}

/// Bytes and seconds from `dd`'s summary (GNU: `N bytes (…) copied, S s, R MB/s`; busybox:
/// `N bytes (…) copied, S seconds, R/s`).
fn parse_dd(stderr: &str) -> Option<(u64, f64)> {
    let line = stderr.lines().rev().find(|l| l.contains(" copied"))?;
    let bytes = line.split_whitespace().next()?.parse().ok()?;
    let (_, after) = line.split_once(" copied, ")?;
    let secs = after.split_whitespace().next()?;
    Some((bytes, secs.parse().ok()?))
}

/// The first "model name" of `/proc/cpuinfo`.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// This process's command line, quoted for a POSIX shell.
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            let plain = !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=,:+@".contains(&b));
            if plain {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------
// Servers

/// A `sglrs serve` child on 127.0.0.1; killed on drop if still running.
struct Server {
    child: Child,
    base: String,
    log: PathBuf,
    agent: ureq::Agent,
}

impl Server {
    /// Starts `bin serve` with `flags` and waits until `/health` answers 200.
    fn start(args: &HicacheArgs, flags: &[String], log: PathBuf) -> anyhow::Result<Server> {
        let bin = match &args.sglrs_bin {
            Some(b) => b.clone(),
            None => std::env::current_exe().context("locating the sglrs binary")?,
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port")?
            .port();
        let mut cmd = Command::new(&bin);
        cmd.arg("serve").arg("--model").arg(&args.model).args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ]);
        if let Some(t) = args.threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        cmd.args(flags);
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        println!("  serve {}", flags.join(" "));
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let agent = ureq::AgentBuilder::new().timeout(REQUEST_TIMEOUT).build();
        let mut s = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
            agent,
        };
        s.wait_healthy()?;
        Ok(s)
    }

    fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let t0 = Instant::now();
        while t0.elapsed() < START_TIMEOUT {
            if let Some(st) = self.child.try_wait()? {
                bail!("the server exited while starting ({st}){}", self.log_tail());
            }
            let r = self
                .agent
                .get(&format!("{}/health", self.base))
                .timeout(Duration::from_secs(2))
                .call();
            if matches!(r, Ok(ref resp) if resp.status() == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "the server did not answer /health with 200 within {} s{}",
            START_TIMEOUT.as_secs(),
            self.log_tail()
        )
    }

    /// The last lines of the server's output, for an error message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("\n--- {} (last lines) ---\n{tail}", self.log.display())
    }

    /// Why a request may have failed: the server's state and its last output.
    fn failure_context(&mut self) -> String {
        match self.child.try_wait() {
            Ok(Some(st)) => format!("the server exited ({st}){}", self.log_tail()),
            _ => format!("the server is still running{}", self.log_tail()),
        }
    }

    /// `num_pages × page_size` from `/get_server_info`, if it reports both.
    fn pool_tokens(&self) -> Option<u64> {
        let v: Value = self
            .agent
            .get(&format!("{}/get_server_info", self.base))
            .call()
            .ok()?
            .into_json()
            .ok()?;
        Some(v["num_pages"].as_u64()? * v["page_size"].as_u64()?)
    }

    /// Streams `POST /generate` of `text` for `max_new_tokens` tokens at temperature 0.
    fn generate(&self, text: &str, max_new_tokens: usize) -> anyhow::Result<Reply> {
        let body = json!({
            "text": text,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
            "stream": true,
        });
        let t0 = Instant::now();
        let resp = match self
            .agent
            .post(&format!("{}/generate", self.base))
            .send_json(body)
        {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                bail!(
                    "POST /generate: HTTP {code}: {}",
                    r.into_string().unwrap_or_default()
                )
            }
            Err(e) => return Err(anyhow!(e).context("POST /generate")),
        };
        let mut ttft = None;
        let mut first_event = None;
        let mut last: Option<Value> = None;
        for line in std::io::BufReader::new(resp.into_reader()).lines() {
            let line = line.context("reading the event stream")?;
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                break;
            }
            let v: Value = serde_json::from_str(data).with_context(|| format!("event {data:?}"))?;
            if let Some(e) = v.get("error") {
                bail!("POST /generate: error event {e}");
            }
            let now = t0.elapsed().as_secs_f64();
            first_event.get_or_insert(now);
            if v["text"].as_str().is_some_and(|t| !t.is_empty()) {
                ttft.get_or_insert(now);
            }
            last = Some(v);
        }
        let last = last.ok_or_else(|| anyhow!("POST /generate: no event before [DONE]"))?;
        let meta = &last["meta_info"];
        let n = |k: &str| meta[k].as_u64().unwrap_or(0);
        Ok(Reply {
            text: last["text"].as_str().unwrap_or("").to_string(),
            ttft: ttft.or(first_event).unwrap_or_default(),
            prompt_tokens: n("prompt_tokens"),
            completion_tokens: n("completion_tokens"),
            cached_tokens: n("cached_tokens"),
            details: Cached::from_json(&meta["cached_tokens_details"]),
        })
    }

    /// SIGTERM, then waits (SIGKILL after [`STOP_TIMEOUT`]). Whether the exit was a clean
    /// shutdown (status 0), the only kind that flushes the disk tier; warns when not.
    fn stop(mut self) -> anyhow::Result<bool> {
        let pid = libc::pid_t::try_from(self.child.id()).context("server pid")?;
        // SAFETY: `pid` is our own child, not yet reaped (it is reaped below), so the id
        // names that process; kill(2) takes no pointers.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < STOP_TIMEOUT {
            if let Some(st) = self.child.try_wait()? {
                if st.signal() == Some(libc::SIGTERM) {
                    println!("  warning: the server died of SIGTERM without a clean shutdown (its disk tier may not be flushed)");
                } else if !st.success() {
                    println!("  warning: the server exited with {st}{}", self.log_tail());
                }
                return Ok(st.success());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        println!(
            "  warning: the server did not exit within {} s of SIGTERM; killed",
            STOP_TIMEOUT.as_secs()
        );
        self.child.kill()?;
        self.child.wait()?;
        Ok(false)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
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

/// What every request of a workload run returned, and its wall time.
struct WorkloadRun {
    replies: Vec<Reply>,
    wall: f64,
    /// Tokens of every conversation at its end (last prompt plus last answer).
    conversation_tokens: u64,
}

/// Shared state of the workload's worker threads.
struct Turns {
    /// Conversations ready for their next turn: (client, next round, text so far).
    ready: VecDeque<(usize, usize, String)>,
    /// Conversations not yet finished.
    unfinished: usize,
    replies: Vec<Reply>,
    conversation_tokens: u64,
    error: Option<anyhow::Error>,
}

/// Runs every conversation of `w` on `server`, `in_flight` requests at a time.
fn run_workload(
    server: &Server,
    w: &Workload,
    rounds: usize,
    output_tokens: usize,
    in_flight: usize,
) -> anyhow::Result<WorkloadRun> {
    let state = Mutex::new(Turns {
        ready: (0..w.turns.len()).map(|c| (c, 0, String::new())).collect(),
        unfinished: if rounds == 0 { 0 } else { w.turns.len() },
        replies: Vec::new(),
        conversation_tokens: 0,
        error: None,
    });
    let wake = Condvar::new();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..in_flight.max(1) {
            s.spawn(|| loop {
                // Bounded: every pass either takes a turn, or waits for one of the requests
                // in flight (each bounded by REQUEST_TIMEOUT) to finish or fail.
                let (client, round, history) = {
                    let mut st = state.lock().expect("workload state");
                    loop {
                        if st.error.is_some() || st.unfinished == 0 {
                            return;
                        }
                        if let Some(t) = st.ready.pop_front() {
                            break t;
                        }
                        st = wake
                            .wait_timeout(st, Duration::from_secs(1))
                            .expect("workload state")
                            .0;
                    }
                };
                let prompt = w.prompt(&history, client, round);
                let reply = server.generate(&prompt, output_tokens);
                let mut st = state.lock().expect("workload state");
                match reply {
                    Ok(r) => {
                        let history = format!("{prompt}{}\n", r.text);
                        if round + 1 < rounds {
                            st.ready.push_back((client, round + 1, history));
                        } else {
                            st.unfinished -= 1;
                            st.conversation_tokens += r.prompt_tokens + r.completion_tokens;
                        }
                        st.replies.push(r);
                    }
                    Err(e) => {
                        st.error = Some(e.context(format!("client {client}, round {round}")));
                    }
                }
                wake.notify_all();
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let st = state.into_inner().expect("workload state");
    if let Some(e) = st.error {
        return Err(e);
    }
    Ok(WorkloadRun {
        replies: st.replies,
        wall,
        conversation_tokens: st.conversation_tokens,
    })
}

/// The figures of one configuration's run.
fn summarize(run: &WorkloadRun, pool_tokens: Option<u64>, ram_note: String) -> Value {
    let ttfts: Vec<f64> = run.replies.iter().map(|r| r.ttft).collect();
    let prompt: u64 = run.replies.iter().map(|r| r.prompt_tokens).sum();
    let mut by_source = Cached::default();
    for r in &run.replies {
        by_source.add(r.details.unwrap_or_default());
    }
    let n = run.replies.len();
    let wall = run.wall.max(1e-9);
    let mut v = json!({
        "ttft_p50_s": percentile(&ttfts, 50.0),
        "ttft_p90_s": percentile(&ttfts, 90.0),
        "throughput_req_s": n as f64 / wall,
        "input_tok_s": prompt as f64 / wall,
        "cached_tokens_by_source": by_source.to_json(),
        "cached_tokens": run.replies.iter().map(|r| r.cached_tokens).sum::<u64>(),
        "requests": n,
        "prompt_tokens": prompt,
        "wall_s": run.wall,
        "conversation_tokens": run.conversation_tokens,
        "ram_note": ram_note,
    });
    if let Some(p) = pool_tokens {
        v["pool_tokens"] = json!(p);
        v["pool_ratio"] = json!(run.conversation_tokens as f64 / p.max(1) as f64);
    }
    v
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
    let mut server = Server::start(args, &flags, run_dir.0.join(format!("{name}.log")))
        .with_context(|| format!("starting the {name} server"))?;
    let pool = server.pool_tokens();
    let run = match run_workload(&server, w, args.rounds, args.output_tokens, args.in_flight) {
        Ok(r) => r,
        Err(e) => {
            let why = server.failure_context();
            return Err(e.context(format!("{name} workload; {why}")));
        }
    };
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
    let v = summarize(&run, pool, ram_note);
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
        let mut server =
            Server::start(args, &flags, run_dir.0.join(format!("restart-{label}.log")))
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

/// The segment files `seg-*.kv` of `dir`, sorted.
fn segments(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seg-") && n.ends_with(".kv"))
        })
        .collect();
    v.sort();
    Ok(v)
}

/// Drops `files` from the page cache; says which ways worked.
fn drop_caches(files: &[PathBuf]) -> String {
    let mut advised = 0;
    for p in files {
        let Ok(f) = std::fs::File::open(p) else {
            continue;
        };
        // Dirty pages are not dropped: write them back first.
        let _ = f.sync_all();
        // SAFETY: `f` is an open file for the whole call; the call takes no pointers.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc == 0 {
            advised += 1;
        }
    }
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let global = match std::fs::write("/proc/sys/vm/drop_caches", "1") {
        Ok(()) => "drop_caches written".to_string(),
        Err(e) => format!("drop_caches not writable ({e})"),
    };
    format!(
        "fadvise(DONTNEED) on {advised}/{} files, {global}",
        files.len()
    )
}

/// `dd` of the first `bytes` of `file` (`direct`: O_DIRECT); (bytes, seconds) or why not.
fn dd(file: &Path, bytes: u64, direct: bool) -> Result<(u64, f64), String> {
    const BS: u64 = 4 << 20;
    let mut cmd = Command::new("dd");
    cmd.env("LC_ALL", "C")
        .arg(format!("if={}", file.display()))
        .args(["of=/dev/null", "bs=4M"])
        .arg(format!("count={}", bytes.div_ceil(BS).max(1)));
    if direct {
        cmd.arg("iflag=direct");
    }
    let out = cmd.output().map_err(|e| format!("running dd: {e}"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(err.trim().to_string());
    }
    parse_dd(&err).ok_or_else(|| format!("unreadable dd output: {}", err.trim()))
}

/// The disk read rate of the store on `dir` against `dd` on its largest segment.
fn disk_read(dir: &Path) -> anyhow::Result<Value> {
    println!("disk_read: {}", dir.display());
    let files = segments(dir)?;
    if files.is_empty() {
        bail!(
            "no seg-*.kv in {}: the restart servers left no disk tier",
            dir.display()
        );
    }
    let note_open = drop_caches(&files);
    let t0 = Instant::now();
    let store = PageStore::open(PageStoreConfig {
        ram_bytes: 0,
        disk: Some(DiskConfig {
            dir: dir.to_path_buf(),
            max_bytes: u64::MAX,
            segment_bytes: 64 << 20,
        }),
        disk_write_through: false,
    })
    .with_context(|| format!("opening the page store in {}", dir.display()))?;
    let hashes = store.stored_hashes();
    let open_s = t0.elapsed().as_secs_f64();
    let note_get = drop_caches(&files);
    let t0 = Instant::now();
    let pages = store.get(&hashes);
    let get_s = t0.elapsed().as_secs_f64();
    let bytes: u64 = pages.iter().flatten().map(|p| p.len() as u64).sum();
    let found = pages.iter().flatten().count();
    drop(pages);
    drop(store);
    if bytes == 0 {
        bail!("the page store in {} returned no pages", dir.display());
    }
    let gb_s = bytes as f64 / get_s.max(1e-9) / 1e9;
    println!(
        "  open {open_s:.3} s; get {found}/{} pages, {:.1} MB in {get_s:.3} s = {gb_s:.2} GB/s",
        hashes.len(),
        bytes as f64 / 1e6
    );
    println!("  page cache: {note_get}");

    // The largest segment by allocated bytes: records fill a preallocated (sparse) file
    // from its start, so that prefix is what was written.
    let (seg, used) = files
        .iter()
        .filter_map(|p| {
            let m = std::fs::metadata(p).ok()?;
            let alloc = m.blocks() * 512;
            Some((
                p.clone(),
                if alloc == 0 {
                    m.len()
                } else {
                    alloc.min(m.len())
                },
            ))
        })
        .max_by_key(|(_, n)| *n)
        .ok_or_else(|| anyhow!("no readable segment in {}", dir.display()))?;
    let note_dd = drop_caches(&files);
    let (dd_note, (dd_bytes, dd_s)) = match dd(&seg, used, true) {
        Ok(r) => ("O_DIRECT".to_string(), r),
        Err(why) => {
            let again = drop_caches(&files);
            let r = dd(&seg, used, false).map_err(|e| anyhow!("dd of {}: {e}", seg.display()))?;
            (
                format!("O_DIRECT refused ({why}); plain dd after dropping caches ({again})"),
                r,
            )
        }
    };
    let dd_gb_s = dd_bytes as f64 / dd_s.max(1e-9) / 1e9;
    println!(
        "  dd {}: {:.1} MB in {dd_s:.3} s = {dd_gb_s:.2} GB/s ({dd_note}; {note_dd})",
        seg.display(),
        dd_bytes as f64 / 1e6
    );
    Ok(json!({
        "disk_read_gb_s": gb_s,
        "dd_read_gb_s": dd_gb_s,
        "dd_note": dd_note,
        "disk_read_note": format!(
            "{found} pages, {bytes} bytes in {get_s:.3} s after open ({open_s:.3} s); page cache before open: {note_open}; before get: {note_get}"
        ),
    }))
}

// ---------------------------------------------------------------------------------------

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
        }
    }
    if only.contains(&"restart") {
        let (v, dir) = restart(args, &run_dir)?;
        out["restart"] = v;
        if only.contains(&"disk_read") {
            let d = disk_read(&dir)?;
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
    fn workload_is_deterministic_and_sized() {
        let a = Workload::new(16, 6, 300, 7);
        let b = Workload::new(16, 6, 300, 7);
        assert_eq!(a.turns, b.turns);
        assert_ne!(a.turns, Workload::new(16, 6, 300, 8).turns);
        let mut all: Vec<&String> = a.turns.iter().flatten().collect();
        assert_eq!(all.len(), 96);
        for t in &all {
            // ~1.087 tokens per word: 277 words for 300 tokens.
            assert_eq!(t.split_whitespace().count(), 277);
            assert!(t.ends_with(|c: char| c.is_ascii_lowercase() || c == '.'));
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 96, "every turn's text differs");
        // No two conversations start alike, so no page is shared across clients.
        let starts: std::collections::HashSet<String> = a
            .turns
            .iter()
            .map(|c| {
                c[0].split_whitespace()
                    .take(8)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        assert_eq!(starts.len(), 16);
        let restart = words_text(turn_seed(0, usize::MAX, 0), 4200);
        let words = restart.split_whitespace().count();
        // 4200 × 12/13 words ≈ 4,214 tokens at 1.087 per word: over 4,000, under 4,608.
        assert_eq!(words, 3877);
        let estimate = words as f64 * 1.087;
        assert!(estimate > RESTART_MIN_TOKENS as f64 && estimate < (RESTART_CONTEXT - 1) as f64);
    }

    #[test]
    fn prompts_extend_the_conversation() {
        let w = Workload::new(2, 2, 20, 1);
        let p0 = w.prompt("", 1, 0);
        assert_eq!(p0, format!("User: {}\nAssistant:", w.turns[1][0]));
        let history = format!("{p0} an answer\n");
        let p1 = w.prompt(&history, 1, 1);
        assert!(p1.starts_with(&history));
        assert!(p1.ends_with("\nAssistant:"));
    }

    #[test]
    fn percentiles() {
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), 2.5);
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!((percentile(&v, 90.0) - 9.1).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 10.0);
        assert_eq!(percentile(&[5.0], 90.0), 5.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn json_with_missing_parts() {
        let c = |tput: f64, p50: f64| json!({"throughput_req_s": tput, "ttft_p50_s": p50});
        let out = assemble(
            json!({"off": c(2.0, 0.4), "disk": c(3.0, 0.1)}),
            "cpu x",
            "sglrs bench hicache --only off,disk",
        );
        assert_eq!(out["cpu"], "cpu x");
        assert_eq!(out["command"], "sglrs bench hicache --only off,disk");
        let r = out["ratios"].as_object().expect("ratios");
        let keys: Vec<&str> = r.keys().map(String::as_str).collect();
        assert_eq!(keys, ["disk_throughput_vs_off", "disk_ttft_p50_vs_off"]);
        assert_eq!(r["disk_throughput_vs_off"], 1.5);
        assert_eq!(r["disk_ttft_p50_vs_off"], 0.25);
        assert!(out.get("host").is_none() && out.get("restart").is_none());

        let out = assemble(
            json!({"restart": {"cold_ttft_s": 2.0, "warm_ttft_s": 0.5},
                   "disk_read_gb_s": 1.0, "dd_read_gb_s": 2.0}),
            "c",
            "x",
        );
        assert_eq!(out["ratios"]["restart_warm_vs_cold"], 0.25);
        assert_eq!(out["ratios"]["disk_read_vs_dd"], 0.5);
        assert!(out["ratios"].get("disk_throughput_vs_off").is_none());
        assert_eq!(assemble(json!({}), "c", "x")["ratios"], json!({}));
    }

    #[test]
    fn summary_sums_sources() {
        let reply = |ttft: f64, d: Option<Cached>| Reply {
            text: String::new(),
            ttft,
            prompt_tokens: 100,
            completion_tokens: 8,
            cached_tokens: 64,
            details: d,
        };
        let run = WorkloadRun {
            replies: vec![
                reply(
                    0.1,
                    Some(Cached {
                        device: 16,
                        host: 32,
                        disk: 16,
                        remote: 0,
                    }),
                ),
                reply(
                    0.3,
                    Some(Cached {
                        device: 0,
                        host: 0,
                        disk: 64,
                        remote: 0,
                    }),
                ),
                reply(0.2, None),
            ],
            wall: 2.0,
            conversation_tokens: 1000,
        };
        let v = summarize(&run, Some(100), "note".into());
        assert_eq!(
            v["cached_tokens_by_source"],
            json!({"device": 16, "host": 32, "disk": 80, "remote": 0})
        );
        assert_eq!(v["requests"], 3);
        assert_eq!(v["throughput_req_s"], 1.5);
        assert_eq!(v["input_tok_s"], 150.0);
        assert_eq!(v["ttft_p50_s"], 0.2);
        assert_eq!(v["pool_ratio"], 10.0);
        assert_eq!(v["cached_tokens"], 192);
        assert!(summarize(&run, None, String::new())
            .get("pool_ratio")
            .is_none());
        assert_eq!(
            Cached::from_json(&json!({"device": 1, "disk": 2})),
            Some(Cached {
                device: 1,
                host: 0,
                disk: 2,
                remote: 0
            })
        );
        assert_eq!(Cached::from_json(&Value::Null), None);
    }

    #[test]
    fn dd_output() {
        let gnu = "25+0 records in\n25+0 records out\n104857600 bytes (105 MB, 100 MiB) copied, 0.0523 s, 2.0 GB/s\n";
        assert_eq!(parse_dd(gnu), Some((104857600, 0.0523)));
        let gnu1 = "1+0 records in\n1+0 records out\n4194304 bytes (4.2 MB, 4.0 MiB) copied, 1 s, 4.2 MB/s";
        assert_eq!(parse_dd(gnu1), Some((4194304, 1.0)));
        let busybox = "25+0 records in\n25+0 records out\n104857600 bytes (100.0MB) copied, 0.061234 seconds, 1.6GB/s";
        assert_eq!(parse_dd(busybox), Some((104857600, 0.061234)));
        assert_eq!(parse_dd("dd: failed to open 'x': Invalid argument"), None);
    }

    #[test]
    fn segment_hashes_and_dd() {
        let tmp = RunDir::new(None).expect("temp folder");
        let dir = tmp.fresh("store").expect("store folder");
        let cfg = PageStoreConfig {
            ram_bytes: 0,
            disk: Some(DiskConfig {
                dir: dir.clone(),
                max_bytes: u64::MAX,
                segment_bytes: 1 << 20,
            }),
            disk_write_through: false,
        };
        let pages: Vec<(PageHash, bytes::Bytes)> = (0..40u8)
            .map(|i| (PageHash(u128::from(i) << 64 | 7), vec![i; 64 << 10].into()))
            .collect();
        let store = PageStore::open(cfg.clone()).expect("open");
        store.put(pages.clone()).expect("put");
        store.flush().expect("flush");
        drop(store);
        let files = segments(&dir).expect("segments");
        assert!(files.len() >= 2, "40 pages of 64 KiB span 1 MiB segments");
        let store = PageStore::open(cfg).expect("reopen");
        let mut hashes = store.stored_hashes();
        hashes.sort_by_key(|h| h.0);
        let want: Vec<PageHash> = pages.iter().map(|p| p.0).collect();
        assert_eq!(hashes, want);
        let got = store.get(&hashes);
        assert!(got
            .iter()
            .zip(&pages)
            .all(|(g, p)| g.as_ref() == Some(&p.1)));
        let (bytes, secs) = dd(&files[0], 1 << 20, false).expect("dd");
        assert_eq!(bytes, 1 << 20);
        assert!(secs >= 0.0);
    }

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
