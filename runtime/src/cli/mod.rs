//! The `sglrs` subcommands.

pub mod bench_executor;
pub mod generate;
pub mod serve;
