//! Runs the `sglrs bench radix` workload without the CLI: `cargo run --release -p
//! sglrs-benches --example radix [-- --requests N]`; prints the table, then the JSON.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: sglrs_benches::radix::RadixArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let v = sglrs_benches::radix::run(&cli.args)?;
    println!("{v}");
    Ok(())
}
