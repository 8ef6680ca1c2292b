//! The sglrs runtime: model loading, the executor trait and the CPU executor over a paged KV
//! pool, tokenizer and chat templates, the scheduler, the sampler and the HTTP server.
#![warn(missing_docs)]

pub mod chat;
pub mod cli;
pub mod detok;
pub mod executor;
pub mod kernels;
pub mod metrics;
pub mod model;
pub mod sampler;
pub mod scheduler;
pub mod server;
pub mod tokenizer;
