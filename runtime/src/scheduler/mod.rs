//! The scheduler: a sans-IO core that decides what runs, plus a driver thread that owns the
//! executor and talks to the HTTP server over channels.
//!
//! - [`SchedulerCore`] (sans-IO): waiting queue ordered by [`SchedulePolicy`] and priority;
//!   continuous batching that mixes decode steps with chunked prefill under a token budget;
//!   prefix matching, locking and insertion in the radix cache; eviction and retraction
//!   when pages run short; sampling, grammar masks, jump-forward; stop conditions; events.
//! - [`spawn`] runs a core and an [`Executor`](crate::executor::Executor) on their own
//!   thread and returns a [`SchedulerHandle`] to submit, abort and flush.
//!
//! A step: `poll_batch` plans a forward pass (allocating pages), the driver runs it,
//! `handle_forward` samples and appends tokens, and `poll_event` yields deltas and finishes.

mod cache;
mod constrain;
mod core;
mod driver;
mod policy;
mod request;
mod seq;
#[cfg(test)]
mod tests;

pub use self::cache::CacheStats;
pub use self::core::{CoreStats, PlanItem, PlannedBatch, SchedulerConfig, SchedulerCore, SeqKey};
pub use driver::{spawn, Command, DriverStats, SchedulerHandle};
pub use policy::{order as policy_order, SchedulePolicy, WaitingInfo};
pub use request::{
    FinishReason, LogprobConfig, RequestId, SchedEvent, SchedRequest, StopConfig, TokenLogprob,
};

use crate::detok::TokenDecoder;

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

impl Tokenizer for crate::tokenizer::Tokenizer {
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
}
