//! The `sglrs` command line: a thin dispatcher to [`sglrs_runtime::cli`].

use clap::{Parser, Subcommand};
use sglrs_runtime::cli;

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
    Serve(cli::serve::ServeArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Prefill and decode throughput of the CPU executor.
    Executor(cli::bench_executor::BenchExecutorArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Generate(a) => cli::generate::run(&a),
        Command::Serve(a) => cli::serve::run(&a),
        Command::Bench(BenchCommand::Executor(a)) => cli::bench_executor::run(&a),
    }
}
