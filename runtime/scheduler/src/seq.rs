//! One sample of a request as the scheduler tracks it.

use super::cache::Lock;
use super::request::{CachedTokens, LogprobConfig, StopConfig, TokenLogprob};
use crate::detok::DetokStream;
use crate::sampler::{SamplerState, SamplingConfig};
use sglrs_radix_cache::Namespace;
use std::sync::Arc;

/// The parts of a request its samples share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub namespace: Namespace,
    pub sampling: SamplingConfig,
    pub stop: StopConfig,
    pub logprobs: Option<LogprobConfig>,
    pub priority: i64,
    pub tenant: u64,
    pub prompt_len: usize,
    pub disagg: Option<crate::request::Disagg>,
}

/// Where a sequence is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// In the waiting queue.
    Waiting,
    /// Admitted: holds pages and runs each step.
    Running,
    /// Admitted: holds pages while the cache I/O thread copies part of its prefix in from a
    /// lower tier; joins forward passes once that is done.
    Loading,
    /// Admitted (decode host): holds pages while the prompt's KV arrives from a prefill
    /// host; runs once the import is reported.
    Receiving,
}

/// One sample: its tokens, its pages, its sampler and detokenizer.
pub(crate) struct Seq {
    pub shared: Arc<Shared>,
    pub sample: usize,
    /// Prompt then output tokens (the last one may not have KV yet).
    pub tokens: Vec<u32>,
    /// Tokens whose K and V are in `pages`.
    pub computed: usize,
    /// Page table; the first `tree_pages` belong to the cache (protected by `lock`).
    pub pages: Vec<u32>,
    pub tree_pages: usize,
    pub lock: Option<Lock>,
    /// Prompt tokens served from the cache at first admission.
    pub cached_tokens: Option<usize>,
    /// Of those, per tier.
    pub cached: CachedTokens,
    /// Leading pages of `pages` already written to (or known to be in) the lower tiers.
    pub offloaded: usize,
    pub phase: Phase,
    /// Queue order (arrival; retracted sequences get a low number so they return first).
    pub order: u64,
    /// Admission counter (the newest running sequence is retracted first).
    pub admitted_at: u64,
    /// Siblings (samples 1..n) wait until sample 0 has its prompt in the cache.
    pub blocked_on_prefill: bool,
    pub sampler: SamplerState,
    pub detok: DetokStream,
    pub matcher: Option<sglrs_grammar::Matcher>,
    /// Input logprobs still to send (filled while the prompt is prefilled).
    pub input_logprobs: Vec<TokenLogprob>,
    pub input_logprobs_sent: bool,
    /// Decode host: the prompt's KV is still to come from a prefill host (cleared when it
    /// arrived; a retracted sequence then recomputes like any other).
    pub awaiting_kv: bool,
    /// Drafting (`core/spec.rs`): drafts wholly refused in a row, steps still to go
    /// without one, and the most tokens the next one drafts (0: the configured most).
    pub spec_misses: u32,
    pub spec_skip: u32,
    pub spec_k: usize,
}

impl Seq {
    /// Output tokens so far.
    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.shared.prompt_len
    }

    /// Tokens still to feed through the model.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// True while the prompt itself is being prefilled.
    pub fn in_prompt(&self) -> bool {
        self.computed < self.shared.prompt_len
    }
}
