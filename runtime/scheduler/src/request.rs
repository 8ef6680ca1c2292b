//! What the server hands the scheduler, and what the scheduler sends back.

use crate::detok::StopRegex;
use crate::sampler::SamplingConfig;
use sglrs_grammar::CompiledGrammar;
use sglrs_radix_cache::Namespace;
use std::sync::Arc;

/// Identifier of a request inside the scheduler (assigned by the server, unique per process).
pub type RequestId = u64;

/// When generation stops.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct StopConfig {
    /// At most this many new tokens (0: prefill only, e.g. to warm the cache).
    pub max_new_tokens: usize,
    /// At least this many new tokens before EOS / stop tokens / stop strings count.
    pub min_new_tokens: usize,
    /// Stop strings.
    pub stop_strings: Vec<String>,
    /// Stop regexes (`stop_regex`), matched on the output text like stop strings.
    pub stop_regex: Option<StopRegex>,
    /// Stop token ids (in addition to the model's EOS tokens unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating through the model's EOS tokens.
    pub ignore_eos: bool,
    /// Keep the matched stop string in the output text.
    pub no_stop_trim: bool,
    /// Drop special tokens from the output text.
    pub skip_special_tokens: bool,
}

/// Which log-probabilities to return.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LogprobConfig {
    /// Input logprobs from this prompt position on (`None`: no input logprobs).
    pub input_start: Option<usize>,
    /// How many top alternatives per position (0: none).
    pub top_n: usize,
    /// Logprobs of these token ids at every position.
    pub token_ids: Vec<u32>,
}

/// A validated generation request. Built by the server; the scheduler accepts only these.
#[derive(Clone, Debug)]
pub struct SchedRequest {
    /// Scheduler-wide id.
    pub id: RequestId,
    /// Prompt token ids (never empty, shorter than the context).
    pub input_ids: Vec<u32>,
    /// Cache namespace (`extra_key`).
    pub namespace: Namespace,
    /// Sampling parameters.
    pub sampling: SamplingConfig,
    /// Stop conditions.
    pub stop: StopConfig,
    /// Number of samples sharing the prompt.
    pub n: usize,
    /// Grammar constraining the output (already compiled, off the scheduler thread).
    pub grammar: Option<Arc<CompiledGrammar>>,
    /// Logprobs to return (`None`: none).
    pub logprobs: Option<LogprobConfig>,
    /// Larger runs first.
    pub priority: i64,
    /// Who sent it (a hash of the tenant's name; 0: no tenant). Admission interleaves
    /// tenants (the one with the fewest running sequences first) and the driver's queue
    /// holds at most [`crate::SchedulerConfig::max_queued_per_tenant`] of one tenant's
    /// requests; tenant 0 is exempt from that cap.
    pub tenant: u64,
    /// Its part in prefill/decode disaggregation (`None`: the whole request runs here).
    pub disagg: Option<Disagg>,
}

/// A request's part in prefill/decode disaggregation (`docs/pd.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disagg {
    /// Prefill host: compute the prompt, sample the first token (no jump-forward), hand the
    /// prompt's pages out ([`SchedEvent::KvExport`], before `Finished`) and end there.
    Export,
    /// Decode host: the prompt's KV and first token come from a prefill host. At admission
    /// the prompt is matched against the local cache, pages are allocated for the rest and
    /// a [`crate::ImportJob`] is handed to the driver's [`crate::KvImporter`]; the request
    /// continues once [`crate::SchedulerHandle::kv_imported`] reports the pages written.
    Import,
}

/// What a prefill host sends with a request's pages, as the decode host's scheduler takes it.
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct KvImport {
    /// The first output token, sampled by the prefill host.
    pub first_token: u32,
    /// Its logprob entry, when logprobs were asked for.
    pub first_logprob: Option<TokenLogprob>,
    /// The prompt's logprobs, when asked for (the decode host computes none).
    pub input_logprobs: Vec<TokenLogprob>,
    /// The sampler's random stream position after the first token, so seeded sampling
    /// continues exactly where the prefill host left off.
    pub rng_position: u128,
    /// The arrangement of the pages sent (`sglrs_executor::kv::POOL_PAGE_FORMAT` of the
    /// prefill host's executor): the decode host refuses pages in another.
    #[serde(default)]
    pub page_format: u32,
}

/// Why a sample ended.
#[derive(Clone, Debug, PartialEq)]
pub enum FinishReason {
    /// `max_new_tokens` reached.
    Length(usize),
    /// A stop token (EOS or `stop_token_ids`).
    StopToken(u32),
    /// A stop string.
    StopString(String),
    /// The grammar reached its end.
    GrammarEnd,
    /// Aborted: by the client, or by a failure that ends only this request.
    Abort(AbortReason),
}

/// Why a request was aborted. Its `Display` text is the message the client receives
/// (`meta_info.finish_reason.message`, OpenAI's error message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AbortReason {
    /// `/abort_request` (or the Python engine's abort) named this request.
    #[error("aborted by request")]
    Requested,
    /// The client went away (its event channel closed).
    #[error("client disconnected")]
    ClientDisconnected,
    /// The KV pool cannot hold this sequence even when everything else is evicted.
    #[error("the KV pool cannot hold this sequence")]
    PoolTooSmall,
    /// The executor returned no logits for a sequence that was due to sample.
    #[error("executor returned no logits")]
    NoLogits,
    /// Sampling failed (e.g. every token masked out).
    #[error("sampling failed: {0}")]
    Sampling(String),
    /// The grammar rejected the sampled token.
    #[error("grammar rejected token {0}")]
    GrammarRejected(u32),
    /// The grammar cannot be followed further (e.g. too ambiguous).
    #[error("grammar: {0}")]
    Grammar(String),
    /// Decoding the output (stop strings, stop regex) failed.
    #[error("{0}")]
    Detokenize(String),
    /// The forward pass failed.
    #[error("forward pass failed: {0}")]
    Forward(String),
    /// The scheduler stopped before the request finished.
    #[error("the scheduler stopped")]
    Shutdown,
    /// Prefill/decode disaggregation: the prompt's KV did not arrive (the reason names the
    /// prefill host and the cause).
    #[error("KV transfer failed: {0}")]
    Transfer(String),
    /// The waiting queue is full: this request lost its place to one of higher priority
    /// (or found none to take). Like a refusal at submit, worth retrying later.
    #[error("{0}")]
    Overloaded(String),
    /// A bug: the scheduler panicked while serving this request (the panic's message). A
    /// panic in one request's sampling step ends only that request; one in planning or the
    /// cache ends every request in flight, and the scheduler goes on with an empty cache.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The message of a caught panic's payload (`panic!` with a string or a format).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_string())
}

/// One position's log-probability data.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenLogprob {
    /// The token at this position.
    pub token: u32,
    /// Its logprob (`None` for the first prompt token, which has no context).
    pub logprob: Option<f32>,
    /// Top alternatives `(token, logprob)`, most likely first.
    pub top: Vec<(u32, f32)>,
    /// Logprobs of the requested `token_ids`.
    pub chosen: Vec<(u32, f32)>,
}

/// Key of one sequence: (request, sample index).
pub type SeqKey = (RequestId, usize);

/// An update from the scheduler about one request.
#[derive(Clone, Debug, PartialEq)]
pub enum SchedEvent {
    /// New output of sample `sample`.
    Delta {
        /// Request id.
        id: RequestId,
        /// Sample index (0..n).
        sample: usize,
        /// New token ids.
        tokens: Vec<u32>,
        /// New text (held back while a stop string may still match).
        text: String,
        /// Logprobs of the new tokens, when asked for.
        logprobs: Vec<TokenLogprob>,
    },
    /// Logprobs of the prompt, from `input_start` on (sent once, before the first delta).
    InputLogprobs {
        /// Request id.
        id: RequestId,
        /// Sample index.
        sample: usize,
        /// One entry per prompt position from `input_start`.
        logprobs: Vec<TokenLogprob>,
    },
    /// Prefill host ([`Disagg::Export`]): the prompt's pages, copied out of the pool in the
    /// page layout, one `Bytes` per page (the last may be partly filled), or why they could
    /// not be read; sent before `Finished`.
    KvExport {
        /// Request id.
        id: RequestId,
        /// The pages, or the error.
        pages: Result<Vec<bytes::Bytes>, String>,
        /// The sampler's random stream position after the first token.
        rng_position: u128,
    },
    /// Sample `sample` finished.
    Finished {
        /// Request id.
        id: RequestId,
        /// Sample index.
        sample: usize,
        /// Why.
        reason: FinishReason,
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// Output tokens.
        completion_tokens: usize,
        /// Prompt tokens served from the cache, by tier.
        cached: CachedTokens,
    },
}

/// Prompt tokens served from the cache, by the tier they came from (SGLang's
/// `cached_tokens_details`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CachedTokens {
    /// From the device KV pool (the radix tree).
    pub device: usize,
    /// From the host RAM tier.
    pub host: usize,
    /// From the disk tier.
    pub disk: usize,
    /// From a remote KV store.
    pub remote: usize,
}

impl CachedTokens {
    /// All cached prompt tokens.
    pub fn total(&self) -> usize {
        self.device + self.host + self.disk + self.remote
    }
}

impl SchedEvent {
    /// The request this event belongs to.
    pub fn id(&self) -> RequestId {
        match self {
            SchedEvent::Delta { id, .. }
            | SchedEvent::InputLogprobs { id, .. }
            | SchedEvent::KvExport { id, .. }
            | SchedEvent::Finished { id, .. } => *id,
        }
    }
}
