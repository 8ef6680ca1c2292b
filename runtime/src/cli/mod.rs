//! The `sglrs` subcommands.

pub mod bench_executor;
pub mod export_hf;
pub mod generate;
pub mod kv_store;
pub mod serve;
