//! Runs the `sglrs bench transfer` workload without the CLI: `cargo run --release -p
//! sglrs-benches --example transfer [-- --pages N]`; prints the report, then the JSON.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: sglrs_benches::transfer::TransferArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let v = sglrs_benches::transfer::run(&cli.args)?;
    println!("{v}");
    Ok(())
}
