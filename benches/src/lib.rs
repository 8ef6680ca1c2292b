//! Benchmark workloads for sglrs.
//!
//! Every `sglrs bench <what>` runs a workload from here (the executor's lives in the runtime
//! crate, which this crate cannot depend on) and prints ratios against a baseline measured in
//! the same run. Each module exposes `XArgs` (clap arguments) and
//! `run(&XArgs) -> anyhow::Result<serde_json::Value>`, which prints a human-readable report as
//! it goes and returns the object that `--json` prints on its last line. The criterion
//! micro-benchmarks sit beside this crate as `benches/<operation>.rs`.
#![warn(missing_docs)]

pub mod agents;
mod common;
pub use common::cpu_model;
pub mod grammar;
pub mod hicache;
pub mod pd;
pub mod radix;
pub mod scale_out;
pub mod serving;
pub mod transfer;
