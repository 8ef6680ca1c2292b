//! `sglrs bench pd`: prefill/decode disaggregation against one unified server, under
//! interference — long prompts arriving while decode streams run — and a follow-up turn
//! that should move only its new pages.
//!
//! The bench starts its own servers (`--sglrs-bin`, default this binary) on free ports of
//! 127.0.0.1, like `sglrs bench hicache` ([`crate::hicache`]), each phase on fresh ones,
//! and stops them with SIGTERM (every server and router is killed on drop, so an error
//! leaves none behind). It needs two CPUs: the first two this process may run on, `A` and
//! `B` below.
//!
//! - Streams: `--streams` (4) clients each stream `POST /generate` of a short prompt
//!   (~24 tokens, distinct) for `--stream-tokens` (300) new tokens at temperature 0 with
//!   `ignore_eos`. The inter-token latency (ITL) is the time between consecutive events
//!   that carry new tokens, over every stream request.
//! - Long prompts: once every stream has its first token, `--long-prompts` (6) prompts of
//!   ~`--long-prompt-tokens` (2,000) tokens, distinct so nothing is cached, are sent one after
//!   another for `--long-output-tokens` (4) tokens, streamed: TTFT is the time to the first
//!   event with a token. Each stream client sends its next request when one ends, until the
//!   last long prompt is answered; then the streams stop at their next token (the client
//!   drops the stream), so every ITL was measured while long prompts kept arriving.
//!
//! Phases, one after another:
//! - `baseline`: one unified server, `--threads 1`, pinned to CPU A: the streams only, one
//!   request each, to completion.
//! - `unified`: one unified server, `--threads 2`, pinned to A and B: streams and long
//!   prompts.
//! - `pd`: a prefill server (`--threads 1`, CPU A, `--disaggregation-mode prefill` on a free
//!   UDP bootstrap port) and a decode server (`--threads 1`, CPU B), one cluster identity
//!   (`sglrs cluster-identity`), behind `python3 -m sglang_router.launch_router
//!   --pd-disaggregation` (`--python`); streams and long prompts through the router. Each
//!   long prompt's final event carries the decode host's `meta_info.disaggregation`:
//!   `transfer_ms` (from the room's first message to its last page written) and
//!   `pages_received`. Then the follow-up turn through the router: a ~`--follow-up-tokens`
//!   (1,000) prompt for 16 tokens, then that prompt + its answer + a short question.
//!
//! A server is pinned from its first instruction: it is started from a thread pinned to its
//! CPUs, whose affinity the child inherits (what `taskset -c` does). The router and the
//! bench's clients are not pinned. Each server answers one short request before a phase is
//! measured.
//!
//! The result: `{"baseline": P, "unified": P, "pd": P + {"transfer_ms_p50",
//! "transfer_vs_ttft_p50", "transfer_pct_of_ttft_p50", "pages_p50",
//! "long_prompt_transfers": [{"ttft_s", "transfer_ms", "wait_ms", "pages_received",
//! "pages_skipped", "prompt_tokens"}], "long_prompts_without_transfer", "follow_up":
//! {"turn1_pages_received", "turn2_pages_received", "turn2_pages_skipped",
//! "turn1_prompt_tokens", "turn2_prompt_tokens", "page_size", "turn2_transfer_ms",
//! "moves_only_new_pages"}}, "cpu", "date", "command", "goals": {"pd_itl_p99_vs_baseline"
//! (goal ≤ 1.5), "unified_itl_p99_vs_baseline", "transfer_vs_ttft" (the p50 over long
//! prompts of transfer_ms / TTFT; goal ≤ 0.10), "follow_up_moves_only_new_pages"}}` where
//! each phase `P` is `{"itl_p50_ms", "itl_p99_ms", "itl_max_ms", "itl_samples",
//! "ttft_p50_s" (null without long prompts), "long_prompts", "long_prompt_tokens_p50",
//! "stream_requests", "stream_tokens", "stream_tok_s", "wall_s", "threads", "cpus"}`.
//! The follow-up turn moves only new pages when turn 2 skipped some pages, received fewer
//! than turn 1, and at most those its tokens past turn 1's prompt span plus one. `--only`
//! runs a subset of the phases (the goals of the others are null).

use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::PathBuf;

pub(crate) mod cluster;
pub(crate) mod report;
mod server_itl;
mod workload;

use crate::hicache::server::ServeCommand;
use cluster::{allowed_cpus, free_udp_port, start_pinned, write_identity, Router, RunDir};
use report::{add_transfers, follow_up_json, goals, phase_json, print_table};
use workload::{agent, generate, prompt, run_load, words_text, Load};

/// Arguments of `sglrs bench pd`.
#[derive(clap::Args, Debug, Clone)]
pub struct PdArgs {
    /// The `sglrs` binary that serves (default: this one).
    #[arg(long)]
    pub sglrs_bin: Option<PathBuf>,
    /// Model passed to every server.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// Python with `sglang_router` installed (runs `-m sglang_router.launch_router`).
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Concurrent decode streams.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// New tokens of each stream request.
    #[arg(long, default_value_t = 300)]
    pub stream_tokens: usize,
    /// Long prompts, sent one after another while the streams run.
    #[arg(long, default_value_t = 6)]
    pub long_prompts: usize,
    /// Tokens of each long prompt (approximate: words are generated, ~1.09 tokens each).
    #[arg(long, default_value_t = 2000)]
    pub long_prompt_tokens: usize,
    /// New tokens of each long prompt.
    #[arg(long, default_value_t = 4)]
    pub long_output_tokens: usize,
    /// Tokens of the follow-up turn's first prompt (approximate).
    #[arg(long, default_value_t = 1000)]
    pub follow_up_tokens: usize,
    /// Seed of the generated text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the logs and the cluster identity go, in a fresh folder removed at the end
    /// (default: the system temp folder).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Phases to run (comma separated): baseline, unified, pd.
    #[arg(long, default_value = "baseline,unified,pd")]
    pub only: String,
}

/// Every phase `--only` accepts, in the order they run.
const PHASES: [&str; 3] = ["baseline", "unified", "pd"];
/// Prompt tokens of a stream request (approximate).
const STREAM_PROMPT_TOKENS: usize = 24;
/// New tokens of each follow-up turn.
const FOLLOW_UP_ANSWER_TOKENS: usize = 16;
/// The follow-up turn's question.
const FOLLOW_UP_QUESTION: &str = "Which of those words is the longest, and why?";

/// How a phase's server starts.
fn serve_command(args: &PdArgs, threads: usize) -> ServeCommand {
    ServeCommand {
        bin: args.sglrs_bin.clone(),
        model: args.model.clone(),
        threads: Some(threads),
    }
}

/// What a phase sends: the streams, and the long prompts unless `streams_only`.
fn load(args: &PdArgs, streams_only: bool) -> Load {
    let long = if streams_only { 0 } else { args.long_prompts };
    Load {
        streams: args.streams,
        stream_tokens: args.stream_tokens,
        stream_prompt_tokens: STREAM_PROMPT_TOKENS,
        long_prompts: (0..long)
            .map(|k| {
                prompt(&words_text(
                    args.seed ^ (1 << 20 | k as u64),
                    args.long_prompt_tokens,
                ))
            })
            .collect(),
        long_output_tokens: args.long_output_tokens,
        seed: args.seed,
    }
}

/// One short request, so the first measured one pays no first-request costs (and, through
/// the router, the path to both servers is known to work).
fn warm_up(agent: &ureq::Agent, base: &str) -> anyhow::Result<()> {
    generate(agent, base, &prompt("Say hello."), 8, &mut || true)
        .map(drop)
        .context("the warm-up request")
}

/// Adds the measured server's own ITL (`server_itl_p50_ms`, `server_itl_p99_ms`; for PD the
/// decode server's) between the readings taken around the load.
fn add_server_itl(v: &mut Value, itl: Option<&(server_itl::Buckets, server_itl::Buckets)>) {
    let ms = |p: f64| {
        itl.and_then(|(b, a)| server_itl::percentile(b, a, p))
            .map_or(Value::Null, |s| json!(s * 1e3))
    };
    v["server_itl_p50_ms"] = ms(50.0);
    v["server_itl_p99_ms"] = ms(99.0);
}

/// A unified phase: one server on `cpus` with as many threads, the load, stop.
fn unified(
    args: &PdArgs,
    run_dir: &RunDir,
    name: &str,
    cpus: &[usize],
    streams_only: bool,
) -> anyhow::Result<Value> {
    println!("{name}:");
    let how = serve_command(args, cpus.len());
    let log = run_dir.0.join(format!("{name}.log"));
    let mut server = start_pinned(&how, &[], log, cpus)
        .with_context(|| format!("starting the {name} server"))?;
    let client = agent();
    let mut itl = None;
    let run = warm_up(&client, &server.base).and_then(|()| {
        let before = server_itl::read(&client, &server.base)?;
        let run = run_load(&client, &server.base, &load(args, streams_only))?;
        itl = Some((before, server_itl::read(&client, &server.base)?));
        Ok(run)
    });
    let run = run.map_err(|e| {
        let why = server.failure_context();
        e.context(format!("{name} phase; {why}"))
    })?;
    server.stop()?;
    let mut v = phase_json(&run);
    add_server_itl(&mut v, itl.as_ref());
    v["threads"] = json!(cpus.len());
    v["cpus"] = json!(cpus);
    print_phase(&v);
    Ok(v)
}

/// The PD phase: identity, prefill on `cpus[0]`, decode on `cpus[1]`, the router, the load
/// and the follow-up turn, stop.
fn pd(args: &PdArgs, run_dir: &RunDir, cpus: &[usize]) -> anyhow::Result<Value> {
    println!("pd:");
    let how = serve_command(args, 1);
    let identity = run_dir.0.join("identity");
    write_identity(&how, &identity)?;
    let id = identity.display().to_string();
    let bootstrap = free_udp_port()?;
    let prefill_flags: Vec<String> = [
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        &bootstrap.to_string(),
        "--cluster-identity",
        &id,
    ]
    .map(String::from)
    .into();
    let decode_flags: Vec<String> = ["--disaggregation-mode", "decode", "--cluster-identity", &id]
        .map(String::from)
        .into();
    let mut prefill = start_pinned(
        &how,
        &prefill_flags,
        run_dir.0.join("prefill.log"),
        &cpus[..1],
    )
    .context("starting the prefill server")?;
    let mut decode = start_pinned(
        &how,
        &decode_flags,
        run_dir.0.join("decode.log"),
        &cpus[1..2],
    )
    .context("starting the decode server")?;
    let router = Router::start(
        &args.python,
        &prefill,
        bootstrap,
        &decode,
        run_dir.0.join("router.log"),
    )?;
    let client = agent();
    let mut itl = None;
    let measured = warm_up(&client, &router.base).and_then(|()| {
        let before = server_itl::read(&client, &decode.base)?;
        let run = run_load(&client, &router.base, &load(args, false))?;
        itl = Some((before, server_itl::read(&client, &decode.base)?));
        let turn1 = prompt(&words_text(args.seed ^ (2 << 20), args.follow_up_tokens));
        let t1 = generate(
            &client,
            &router.base,
            &turn1,
            FOLLOW_UP_ANSWER_TOKENS,
            &mut || true,
        )
        .context("follow-up turn 1")?;
        let turn2 = format!("{turn1}{}\n{}", t1.text, prompt(FOLLOW_UP_QUESTION));
        let t2 = generate(
            &client,
            &router.base,
            &turn2,
            FOLLOW_UP_ANSWER_TOKENS,
            &mut || true,
        )
        .context("follow-up turn 2")?;
        Ok((run, t1, t2))
    });
    let (run, t1, t2) = measured.map_err(|e| {
        let why = format!(
            "prefill: {}; decode: {}; router:{}",
            prefill.failure_context(),
            decode.failure_context(),
            router.log_tail()
        );
        e.context(format!("pd phase; {why}"))
    })?;
    let page_size = decode.info().and_then(|i| i["page_size"].as_u64());
    router.stop()?;
    decode.stop()?;
    prefill.stop()?;
    let mut v = phase_json(&run);
    add_server_itl(&mut v, itl.as_ref());
    v["threads"] = json!(1);
    v["cpus"] = json!({"prefill": cpus[0], "decode": cpus[1]});
    add_transfers(&mut v, &run);
    v["follow_up"] = follow_up_json(&t1, &t2, page_size);
    print_phase(&v);
    if v["long_prompts_without_transfer"].as_u64().unwrap_or(0) > 0 {
        println!(
            "  warning: {} long prompts had no meta_info.disaggregation",
            v["long_prompts_without_transfer"]
        );
    }
    Ok(v)
}

/// One phase's lines of figures.
fn print_phase(v: &Value) {
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "  {} stream requests, {} ITLs: p50 {:.1} ms, p99 {:.1} ms; {:.1} s",
        v["stream_requests"],
        v["itl_samples"],
        f("itl_p50_ms"),
        f("itl_p99_ms"),
        f("wall_s")
    );
    if v["long_prompts"].as_u64().unwrap_or(0) > 0 {
        println!(
            "  {} long prompts of ~{:.0} tokens: TTFT p50 {:.3} s",
            v["long_prompts"],
            f("long_prompt_tokens_p50"),
            f("ttft_p50_s")
        );
    }
    if v.get("transfer_ms_p50").is_some() {
        println!(
            "  transfer p50 {:.1} ms = {:.1}% of TTFT, {:.0} pages",
            f("transfer_ms_p50"),
            f("transfer_pct_of_ttft_p50"),
            f("pages_p50")
        );
    }
}

/// The phases `only` names, checked.
fn parse_only(only: &str) -> anyhow::Result<Vec<&str>> {
    let parts: Vec<&str> = only
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(p) = parts.iter().find(|p| !PHASES.contains(p)) {
        bail!(
            "--only: unknown phase {p:?} (phases: {})",
            PHASES.join(", ")
        );
    }
    Ok(parts)
}

/// Runs the selected phases; returns the `--json` object.
pub fn run(args: &PdArgs) -> anyhow::Result<Value> {
    let only = parse_only(&args.only)?;
    if !args.model.exists() {
        bail!(
            "model {} not found (`make model` fetches the default; or pass --model)",
            args.model.display()
        );
    }
    if args.streams == 0 || args.stream_tokens < 2 {
        bail!(
            "--streams must be at least 1 and --stream-tokens at least 2 (an ITL needs two tokens)"
        );
    }
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        bail!("bench pd needs two CPUs (it may run on {cpus:?})");
    }
    let cpus = &cpus[..2];
    let cpu = report::cpu_model();
    println!("bench pd: cpu {cpu}, CPUs {} and {}", cpus[0], cpus[1]);
    println!(
        "  model {}, {} streams x {} tokens; {} long prompts of ~{} tokens (+{} out), one after another",
        args.model.display(), args.streams, args.stream_tokens, args.long_prompts,
        args.long_prompt_tokens, args.long_output_tokens
    );
    let run_dir = RunDir::new(args.dir.as_deref())?;
    let mut out = json!({});
    if only.contains(&"baseline") {
        out["baseline"] = unified(args, &run_dir, "baseline", &cpus[..1], true)?;
    }
    if only.contains(&"unified") {
        out["unified"] = unified(args, &run_dir, "unified", cpus, false)?;
    }
    if only.contains(&"pd") {
        out["pd"] = pd(args, &run_dir, cpus)?;
    }
    out["cpu"] = json!(cpu);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    out["date"] = json!(report::utc_date(now));
    out["command"] = json!(report::command_line());
    out["goals"] = goals(&out);
    print_table(&out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_and_loads() {
        assert_eq!(
            parse_only("baseline, pd").expect("phases"),
            ["baseline", "pd"]
        );
        assert!(parse_only("pd,bogus").is_err());
        let args = PdArgs {
            sglrs_bin: None,
            model: "m".into(),
            python: "python3".into(),
            streams: 2,
            stream_tokens: 60,
            long_prompts: 3,
            long_prompt_tokens: 800,
            long_output_tokens: 4,
            follow_up_tokens: 100,
            seed: 0,
            dir: None,
            only: "pd".into(),
        };
        assert!(load(&args, true).long_prompts.is_empty());
        let l = load(&args, false);
        assert_eq!(l.long_prompts.len(), 3);
        assert!(l.long_prompts[0] != l.long_prompts[1] && l.long_prompts[1] != l.long_prompts[2]);
        assert_eq!(serve_command(&args, 2).threads, Some(2));
    }
}
