//! sglrs scheduler: decides what runs, step by step, and turns logits into tokens and text.
//!
//! A sans-IO core that decides what runs, plus a driver thread that owns the executor and
//! talks to the server over channels.
//!
//! # Key types and modules
//!
//! - [`SchedulerCore`] (sans-IO): waiting queue ordered by [`SchedulePolicy`] and priority;
//!   continuous batching that mixes decode steps with chunked prefill under a token budget;
//!   prefix matching, locking and insertion in the radix cache; eviction and retraction
//!   when pages run short; sampling, grammar masks, jump-forward; stop conditions; events.
//!   Inputs come through `handle_*(…, now)`, outputs through `poll_*()`: no threads, clocks
//!   or channels inside, so its tests run on a virtual clock.
//! - [`spawn`] runs a core and an [`Executor`](sglrs_executor::Executor) on their own
//!   thread and returns a [`SchedulerHandle`] to submit, abort and flush.
//! - [`sampler`]: penalties, temperature / top-k / top-p / min-p, seeded RNG, logprobs.
//! - [`detok`]: incremental detokenization, stop strings and `stop_regex`. Detokenization
//!   runs here, inside the scheduler: the events a request receives carry text deltas.
//! - [`SchedRequest`] in, [`SchedEvent`]s out; a request ends with a [`FinishReason`].
//!
//! A step: `poll_batch` plans a forward pass (allocating pages), the driver runs it,
//! `handle_forward` samples and appends tokens, and `poll_event` yields deltas and finishes.
//!
//! # Example
//!
//! ```no_run
//! use sglrs_executor::Executor;
//! use sglrs_scheduler::{spawn, SchedulePolicy, SchedulerConfig, SchedulerCore};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let model = sglrs_model::load(&sglrs_model::default_model_path(), &Default::default())?;
//! let exec = sglrs_executor::CpuExecutor::new(&model.config, &model.weights, &Default::default())?;
//! let cfg = SchedulerConfig {
//!     page_size: exec.kv_layout().page_size,
//!     num_pages: exec.num_pages(),
//!     max_running: 32,
//!     max_batch_tokens: 576,
//!     chunked_prefill_size: 512,
//!     policy: SchedulePolicy::Lpm,
//!     eos_tokens: model.tokenizer.eog_ids().to_vec(),
//!     max_context: exec.max_context(),
//!     vocab_size: exec.vocab_size(),
//!     jump_forward: true,
//!     speculative_ngram: 4,
//!     admission_hold: Duration::from_millis(15),
//!     max_queued: 256,
//!     max_queued_per_tenant: 128,
//!     priority_preemption: Some(10),
//!     hicache: None,
//!     kv_events: None,
//! };
//! let core = SchedulerCore::new(cfg, Arc::new(model.tokenizer))?;
//! let (handle, _thread) = spawn(core, Box::new(exec))?;
//! // handle.submit(request) returns the request's event channel.
//! # let _ = handle;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod cache;
mod constrain;
mod core;
pub mod detok;
mod driver;
pub mod hicache;
pub mod kv_events;
mod policy;
mod request;
pub mod sampler;
mod seq;
#[cfg(test)]
mod tests;

pub use self::cache::CacheStats;
pub use self::core::{
    CoreStats, DisaggStats, ExportJob, ImportJob, PlanItem, PlannedBatch, SchedulerConfig,
    SchedulerCore, SeqKey,
};
pub use driver::{spawn, spawn_with, Command, DriverStats, KvImporter, SchedulerHandle};
pub use policy::{order as policy_order, SchedulePolicy, WaitingInfo};
pub use request::{
    panic_message, AbortReason, CachedTokens, Disagg, FinishReason, KvImport, LogprobConfig,
    RequestId, SchedEvent, SchedRequest, StopConfig, TokenLogprob,
};

use detok::TokenDecoder;

/// What the scheduler needs of a tokenizer: decoding (output text, stop strings) and
/// encoding (jump-forward text).
pub trait Tokenizer: TokenDecoder + Send + Sync {
    /// Token ids of `text`, without special tokens added.
    fn encode_text(&self, text: &str) -> Result<Vec<u32>, String>;
}

impl Tokenizer for tokenizers::Tokenizer {
    fn encode_text(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }
}

impl Tokenizer for sglrs_model::tokenizer::Tokenizer {
    fn encode_text(&self, text: &str) -> Result<Vec<u32>, String> {
        let mut ids = self.encode(text, false).map_err(|e| e.to_string())?;
        if self.add_bos() && ids.first().copied() == self.bos_id() {
            ids.remove(0);
        }
        Ok(ids)
    }
}

/// Why the scheduler could not be built or reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// The configuration cannot work (sizes, pool).
    #[error("scheduler configuration: {0}")]
    Config(String),
    /// The scheduler thread has stopped.
    #[error("the scheduler has shut down")]
    Shutdown,
    /// The waiting queue is full: `limit` requests are submitted and not yet admitted
    /// ([`SchedulerConfig::max_queued`]); the request was not queued.
    #[error("the server is overloaded: {limit} requests are already waiting; retry later")]
    Overloaded {
        /// The queue's bound.
        limit: usize,
    },
    /// The request's tenant already holds its share of the queue
    /// ([`SchedulerConfig::max_queued_per_tenant`]); the request was not queued.
    #[error(
        "this tenant's share of the queue is full: {limit} of its requests are already waiting \
         (--max-queued-requests-per-tenant); retry later"
    )]
    TenantOverloaded {
        /// The per-tenant bound.
        limit: usize,
    },
}
