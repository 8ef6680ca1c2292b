//! Runs the `sglrs bench grammar` workload without the CLI: `cargo run --release -p
//! sglrs-benches --example grammar -- --data DIR --tokenizer FILE [--per-subset N]`;
//! prints the table, then the JSON.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: sglrs_benches::grammar::GrammarArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let v = sglrs_benches::grammar::run(&cli.args)?;
    println!("{v}");
    Ok(())
}
