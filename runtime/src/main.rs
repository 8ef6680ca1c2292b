//! The `sglrs` command line: a thin dispatcher to [`sglrs_runtime::cli`].

use clap::{Parser, Subcommand};
mod cli;

/// mimalloc for the whole process: grammar masks and compiles allocate many small
/// configurations (A/B on `sglrs bench grammar`: ~8% fewer masks over 100 µs, compile p50
/// 0.29 → 0.21 ms; `docs/grammar-masks.md`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sglrs",
    version,
    about = "sglrs: an SGLang-style LLM serving runtime in Rust"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one prompt through the model and print the continuation and tokens/s.
    Generate(cli::generate::GenerateArgs),
    /// Start the HTTP server.
    Serve(Box<cli::serve::ServeArgs>),
    /// Write an HF folder (bf16 safetensors, config, tokenizer, chat template) from a GGUF.
    ExportHf(cli::export_hf::ExportHfArgs),
    /// Write a cluster identity (certificate, key, shared secret) for prefill/decode
    /// disaggregation and the KV store: give the same folder to every host.
    ClusterIdentity(ClusterIdentityArgs),
    /// Serve the shared KV store (pages by hash in RAM and on disk, over QUIC).
    KvStore(cli::kv_store::KvStoreArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Prefill and decode throughput of the CPU executor.
    Executor(cli::bench_executor::BenchExecutorArgs),
    /// RadixAttention index: insert / match / evict / lifecycle against SGLang's figures.
    Radix(JsonBench<sglrs_benches::radix::RadixArgs>),
    /// Grammar engine on JSONSchemaBench-style data: coverage, compile and mask times.
    Grammar(JsonBench<sglrs_benches::grammar::GrammarArgs>),
    /// KV page transfer: QUIC vs TCP vs memcpy, in one run.
    Transfer(JsonBench<sglrs_benches::transfer::TransferArgs>),
    /// Serving workloads against any OpenAI-compatible server (sglrs or a peer).
    Serving(JsonBench<sglrs_benches::serving::ServingArgs>),
    /// Hierarchical KV cache: multi-turn off/host/disk/host+disk, a restart from disk, and
    /// the disk tier's read rate against dd; starts its own servers.
    Hicache(JsonBench<sglrs_benches::hicache::HicacheArgs>),
    /// Prefill/decode disaggregation: decode streams' inter-token latency while long prompts
    /// arrive, unified vs prefill and decode servers behind sglang-router, with each
    /// prompt's KV transfer time; starts its own servers and router.
    Pd(JsonBench<sglrs_benches::pd::PdArgs>),
    /// Scale-out: two replicas behind sglang-router, cache_aware vs round_robin, with and
    /// without a shared `sglrs kv-store`, and a prompt computed on one replica sent to the
    /// other; starts its own servers, store and router.
    #[command(name = "scale-out")]
    ScaleOut(JsonBench<sglrs_benches::scale_out::ScaleOutArgs>),
    /// Agent workloads: BFCL's single-turn categories and multi-turn agent loops, sglrs with
    /// and without tool-call enforcement next to vLLM-CPU and llama.cpp; starts each server.
    Agents(JsonBench<sglrs_benches::agents::AgentsArgs>),
}

#[derive(clap::Args)]
struct ClusterIdentityArgs {
    /// Folder to write `cert.pem`, `key.pem` and `secret` into (created if missing).
    #[arg(long)]
    out: std::path::PathBuf,
}

/// A workload from `sglrs-benches` plus `--json`.
#[derive(clap::Args)]
struct JsonBench<A: clap::Args> {
    #[command(flatten)]
    args: A,
    /// Print one JSON object with the results on the last line.
    #[arg(long)]
    json: bool,
}

impl<A: clap::Args> JsonBench<A> {
    fn run(self, f: fn(&A) -> anyhow::Result<serde_json::Value>) -> anyhow::Result<()> {
        let result = f(&self.args)?;
        if self.json {
            println!("{}", serde_json::to_string(&result)?);
        }
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Generate(a) => cli::generate::run(&a),
        Command::Serve(a) => cli::serve::run(&a),
        Command::ExportHf(a) => cli::export_hf::run(&a),
        Command::KvStore(a) => cli::kv_store::run(&a),
        Command::ClusterIdentity(a) => {
            sglrs_server::pd::write_identity(&a.out).map_err(anyhow::Error::msg)?;
            println!("cluster identity written to {}", a.out.display());
            Ok(())
        }
        Command::Bench(BenchCommand::Executor(a)) => cli::bench_executor::run(&a),
        Command::Bench(BenchCommand::Radix(b)) => b.run(sglrs_benches::radix::run),
        Command::Bench(BenchCommand::Grammar(b)) => b.run(sglrs_benches::grammar::run),
        Command::Bench(BenchCommand::Transfer(b)) => b.run(sglrs_benches::transfer::run),
        Command::Bench(BenchCommand::Serving(b)) => b.run(sglrs_benches::serving::run),
        Command::Bench(BenchCommand::Hicache(b)) => b.run(sglrs_benches::hicache::run),
        Command::Bench(BenchCommand::Pd(b)) => b.run(sglrs_benches::pd::run),
        Command::Bench(BenchCommand::ScaleOut(b)) => b.run(sglrs_benches::scale_out::run),
        Command::Bench(BenchCommand::Agents(b)) => b.run(sglrs_benches::agents::run),
    }
}
