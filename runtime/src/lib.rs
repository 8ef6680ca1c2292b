//! The sglrs runtime: model loading, the executor trait and the CPU executor over a paged KV
//! pool, tokenizer and chat templates, the scheduler, the sampler and the HTTP server.
#![warn(missing_docs)]

pub mod executor;
pub mod kernels;
pub mod model;
pub mod chat;
pub mod tokenizer;
pub mod detok;
pub mod sampler;
pub mod scheduler;
pub mod metrics;
pub mod server;
pub mod cli;
