//! The sans-IO scheduler core: admission, batching, memory, sampling, stop conditions.
//!
//! Inputs: [`SchedulerCore::handle_request`], [`SchedulerCore::handle_abort`],
//! [`SchedulerCore::handle_flush`] and [`SchedulerCore::handle_forward`] (the logits of a
//! batch planned by [`SchedulerCore::poll_batch`]). Outputs: [`SchedulerCore::poll_batch`]
//! and [`SchedulerCore::poll_event`]. No threads, clocks or channels: time is passed in.

mod admit;
mod disagg;
mod hold;
mod logprobs;
mod preempt;
mod spec;
mod tier;

pub use disagg::{DisaggStats, ExportJob, ImportJob};

use super::cache::{CacheStats, PageCache};
use super::constrain;
use super::policy::SchedulePolicy;
use super::request::{
    AbortReason, CachedTokens, FinishReason, RequestId, SchedEvent, SchedRequest, TokenLogprob,
};
use super::seq::{Phase, Seq, Shared};
use super::{SchedError, Tokenizer};
use crate::detok::{DetokStream, StreamOptions};
use crate::sampler::{self, LogSoftmax, SamplerState};
use sglrs_executor::{Batch, Logits, LogitsWanted, SeqChunk};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::request::SeqKey;

/// Limits and choices of the scheduler.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Tokens per KV page.
    pub page_size: usize,
    /// Pages in the KV pool.
    pub num_pages: usize,
    /// Most sequences running at once.
    pub max_running: usize,
    /// Token budget of one forward pass (decode tokens plus prefill chunks).
    pub max_batch_tokens: usize,
    /// Most prompt tokens one sequence prefills in one step.
    pub chunked_prefill_size: usize,
    /// Waiting-queue order.
    pub policy: SchedulePolicy,
    /// The model's end-of-sequence tokens.
    pub eos_tokens: Vec<u32>,
    /// Longest sequence the model supports.
    pub max_context: usize,
    /// Width of a logits row.
    pub vocab_size: usize,
    /// Jump forward over grammar-forced text.
    pub jump_forward: bool,
    /// Most tokens a greedy sequence drafts per step by n-gram lookup over its own tokens,
    /// verified in the same pass (`core/spec.rs`; the output is the same token for token).
    /// Zero: no drafts.
    pub speculative_ngram: usize,
    /// Longest wait for the followers of requests that finished together before their
    /// prefills are admitted (one pass instead of several; `core/hold.rs`). Zero: never wait.
    pub admission_hold: Duration,
    /// Most requests submitted and not yet admitted (see [`SchedulerCore::is_queued`]); the
    /// driver's handle refuses more with [`SchedError::Overloaded`] instead of queueing
    /// them. Must be positive.
    pub max_queued: usize,
    /// Most of those places one tenant ([`crate::SchedRequest::tenant`], not 0) may hold, so
    /// that a tenant flooding the server cannot take every place; refused like a full queue.
    /// Must be positive.
    pub max_queued_per_tenant: usize,
    /// Priority preemption: when every running place is taken, a waiting sequence whose
    /// priority exceeds a running one's (of its tenant) by more than this retracts it and
    /// takes its place (`core/preempt.rs`). `None`: never. The waiting queue is ordered by
    /// priority either way.
    pub priority_preemption: Option<i64>,
    /// The hierarchical cache's lower tiers (host RAM, disk); `None`: the device tier only.
    pub hicache: Option<crate::hicache::HiCacheConfig>,
    /// KV events for cache-aware routers (`None`: none are recorded).
    pub kv_events: Option<crate::kv_events::KvEventsConfig>,
}

/// One sequence's share of a planned forward pass.
#[derive(Clone, Debug)]
pub struct PlanItem {
    /// The sequence.
    pub key: SeqKey,
    /// Tokens to run.
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]`.
    pub start_pos: usize,
    /// Page table covering `start_pos + tokens.len()`.
    pub pages: Vec<u32>,
    /// Logits wanted.
    pub logits: LogitsWanted,
    /// The chunk ends the sequence's pending tokens: sample after it.
    pub sample_after: bool,
    /// The last `draft` of `tokens` are drafted (`core/spec.rs`), not yet the sequence's:
    /// their rows are used while the tokens before them are the ones sampled.
    pub draft: usize,
}

/// A forward pass the core wants run.
#[derive(Clone, Debug, Default)]
pub struct PlannedBatch {
    /// The sequences of the pass.
    pub items: Vec<PlanItem>,
}

impl PlannedBatch {
    /// The executor's view of this plan.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            seqs: self
                .items
                .iter()
                .map(|it| SeqChunk {
                    tokens: &it.tokens,
                    start_pos: it.start_pos,
                    pages: &it.pages,
                    logits: it.logits.clone(),
                })
                .collect(),
        }
    }

    /// Tokens in the pass.
    pub fn num_tokens(&self) -> usize {
        self.items.iter().map(|i| i.tokens.len()).sum()
    }
}

/// Counters for metrics.
#[derive(Clone, Debug, Default)]
pub struct CoreStats {
    /// Prompt tokens admitted (first admission only).
    pub prompt_tokens: u64,
    /// Of those, served from the cache (every tier).
    pub cached_tokens: u64,
    /// Of those, loaded from the host tier.
    pub cached_host_tokens: u64,
    /// Of those, loaded from the disk tier.
    pub cached_disk_tokens: u64,
    /// Of those, fetched from the remote tier.
    pub cached_remote_tokens: u64,
    /// Output tokens produced.
    pub generated_tokens: u64,
    /// Sequences retracted (under memory pressure, or preempted).
    pub retractions: u64,
    /// Of those, preempted for a waiting sequence of higher priority.
    pub preemptions: u64,
    /// Passes that ran only a high-priority prompt (and its priority class), leaving the
    /// other sequences' steps to the next pass.
    pub urgent_passes: u64,
    /// Tokens appended by jump-forward.
    pub jump_forward_tokens: u64,
    /// Tokens drafted by n-gram lookup and run for verification.
    pub spec_draft_tokens: u64,
    /// Of those, the ones the model chose (each saved a decode step).
    pub spec_accepted_tokens: u64,
    /// Requests finished.
    pub finished_requests: u64,
}

/// The scheduler state machine.
pub struct SchedulerCore {
    cfg: SchedulerConfig,
    cache: PageCache,
    tokenizer: Arc<dyn Tokenizer>,
    seqs: HashMap<SeqKey, Seq>,
    waiting: Vec<SeqKey>,
    running: Vec<SeqKey>,
    /// Samples of each request still alive.
    alive: HashMap<RequestId, usize>,
    events: VecDeque<SchedEvent>,
    next_order: u64,
    next_retract_order: u64,
    next_admit: u64,
    stats: CoreStats,
    mask: Vec<u32>,
    scratch: Vec<f32>,
    /// Requests finished (not aborted) in the step being handled.
    finished_in_step: usize,
    /// The last step in which requests finished (admission hold).
    burst: Option<hold::FinishBurst>,
    /// The lower cache tiers and their pending copies.
    tiers: Option<tier::Tiers>,
    /// Prefill/decode disaggregation: imports and exports in flight.
    disagg: disagg::DisaggState,
    /// Tests: planning panics while a waiting sequence holds this token.
    #[cfg(test)]
    pub(crate) planning_fault: Option<u32>,
}

const ARRIVAL_BASE: u64 = 1 << 40;

impl SchedulerCore {
    /// A core over a fresh page pool.
    pub fn new(cfg: SchedulerConfig, tokenizer: Arc<dyn Tokenizer>) -> Result<Self, SchedError> {
        if cfg.page_size == 0
            || cfg.max_batch_tokens == 0
            || cfg.chunked_prefill_size == 0
            || cfg.max_running == 0
            || cfg.max_queued == 0
            || cfg.max_queued_per_tenant == 0
        {
            return Err(SchedError::Config(
                "page size, batch tokens, chunk size, max running and the queue bounds must be positive"
                    .into(),
            ));
        }
        if cfg.num_pages * cfg.page_size < cfg.max_context.min(4096) + cfg.page_size {
            return Err(SchedError::Config(format!(
                "KV pool of {} pages x {} tokens cannot hold one sequence of {} tokens",
                cfg.num_pages,
                cfg.page_size,
                cfg.max_context.min(4096)
            )));
        }
        let root = cfg
            .hicache
            .as_ref()
            .map(|h| h.root_hash)
            .or(cfg.kv_events.as_ref().map(|k| k.root_hash));
        let write_back = cfg
            .hicache
            .as_ref()
            .is_some_and(|h| h.write_policy == crate::hicache::WritePolicy::WriteBack);
        let cache = PageCache::new(
            cfg.num_pages,
            cfg.page_size,
            root,
            write_back,
            cfg.kv_events.is_some(),
        )?;
        let tiers = cfg.hicache.clone().map(tier::Tiers::new);
        Ok(Self {
            mask: vec![0; cfg.vocab_size.div_ceil(32)],
            cfg,
            cache,
            tokenizer,
            seqs: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            alive: HashMap::new(),
            events: VecDeque::new(),
            next_order: ARRIVAL_BASE,
            next_retract_order: ARRIVAL_BASE - 1,
            next_admit: 0,
            stats: CoreStats::default(),
            scratch: Vec::new(),
            finished_in_step: 0,
            burst: None,
            tiers,
            disagg: disagg::DisaggState::default(),
            #[cfg(test)]
            planning_fault: None,
        })
    }

    /// A fresh core over the same pool and configuration (empty cache, nothing in flight)
    /// that carries on this one's counters: the driver's recovery from a panic that left
    /// this one in no state to trust (`driver/recover.rs`).
    pub(crate) fn rebuilt(&self) -> Result<SchedulerCore, SchedError> {
        let mut fresh = SchedulerCore::new(self.cfg.clone(), self.tokenizer.clone())?;
        fresh.stats = self.stats.clone();
        fresh.disagg.carry_stats(&self.disagg);
        if let (Some(new), Some(old)) = (fresh.tiers.as_mut(), self.tiers.as_ref()) {
            new.carry_stats(old);
        }
        #[cfg(test)]
        {
            fresh.planning_fault = self.planning_fault;
        }
        Ok(fresh)
    }

    /// The KV events the radix cache recorded since the last call (none unless
    /// [`SchedulerConfig::kv_events`] is set).
    pub fn drain_kv_events(&mut self) -> Vec<crate::kv_events::KvEvent> {
        if self.cfg.kv_events.is_none() {
            return Vec::new();
        }
        self.cache.drain_events()
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Counters.
    pub fn stats(&self) -> &CoreStats {
        &self.stats
    }

    /// Page accounting of the cache.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// True while request `id` is submitted and not yet admitted: none of its samples has
    /// held pages yet (sample 0 is always the first admitted; a retracted request does not
    /// count again). Ended and unknown requests are not queued.
    pub fn is_queued(&self, id: RequestId) -> bool {
        self.seqs
            .get(&(id, 0))
            .is_some_and(|s| s.cached_tokens.is_none())
    }

    /// True when nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Queues a validated request.
    pub fn handle_request(&mut self, req: SchedRequest, now: Instant) {
        self.note_arrival();
        // A decode host's import brings the prompt's pages from its prefill host, and its
        // admission looks at the device tree only: reading the lower tiers would only hold
        // it back.
        if req.disagg != Some(crate::request::Disagg::Import) {
            self.prefetch_on_arrival(req.id, req.namespace, &req.input_ids, now);
        }
        let prompt_len = req.input_ids.len();
        let shared = Arc::new(Shared {
            namespace: req.namespace,
            sampling: req.sampling.clone(),
            stop: req.stop.clone(),
            logprobs: req.logprobs.clone(),
            priority: req.priority,
            tenant: req.tenant,
            prompt_len,
            disagg: req.disagg,
        });
        let n = req.n.max(1);
        for sample in 0..n {
            let matcher = req
                .grammar
                .as_ref()
                .map(|g| sglrs_grammar::Matcher::new(g.clone()));
            let seq = Seq {
                shared: shared.clone(),
                sample,
                tokens: req.input_ids.clone(),
                computed: 0,
                pages: Vec::new(),
                tree_pages: 0,
                lock: None,
                cached_tokens: None,
                cached: CachedTokens::default(),
                offloaded: 0,
                phase: Phase::Waiting,
                order: self.next_order,
                admitted_at: 0,
                blocked_on_prefill: sample > 0,
                sampler: SamplerState::new(&req.sampling, &req.input_ids, sample as u64),
                detok: DetokStream::new(
                    &req.input_ids,
                    StreamOptions {
                        skip_special: req.stop.skip_special_tokens,
                        stops: req.stop.stop_strings.clone(),
                        stop_regex: req.stop.stop_regex.clone(),
                        no_stop_trim: req.stop.no_stop_trim,
                    },
                ),
                matcher,
                input_logprobs: Vec::new(),
                input_logprobs_sent: false,
                awaiting_kv: req.disagg == Some(crate::request::Disagg::Import),
                spec_misses: 0,
                spec_skip: 0,
                spec_k: 0,
            };
            self.next_order += 1;
            self.seqs.insert((req.id, sample), seq);
            self.waiting.push((req.id, sample));
        }
        self.alive.insert(req.id, n);
    }

    /// Aborts every sample of request `id` (client gone or explicit abort). Unknown ids are
    /// ignored (the request may have just finished).
    pub fn handle_abort(&mut self, id: RequestId, reason: AbortReason) {
        let keys: Vec<SeqKey> = self.seqs.keys().filter(|k| k.0 == id).copied().collect();
        for key in keys {
            self.finish(key, FinishReason::Abort(reason.clone()));
        }
    }

    /// Drops every cached page of the device tier if nothing is running or waiting and no
    /// cache copy is in flight; returns whether it did. (The driver empties the host tier
    /// next; the disk tier is cleared only on request.)
    pub fn handle_flush(&mut self) -> bool {
        if !self.seqs.is_empty() || self.io_pending() || self.receiving() {
            return false;
        }
        self.cache.flush();
        true
    }

    /// The next event for the server.
    pub fn poll_event(&mut self) -> Option<SchedEvent> {
        self.events.pop_front()
    }

    /// Plans the next forward pass, allocating pages (evicting and retracting as needed).
    /// `None` when there is nothing to run.
    pub fn poll_batch(&mut self, now: Instant) -> Option<PlannedBatch> {
        #[cfg(test)]
        if let Some(t) = self.planning_fault {
            if self
                .waiting
                .iter()
                .any(|k| self.seqs[k].tokens.contains(&t))
            {
                panic!("planning fault");
            }
        }
        self.preempt_for_priority(now);
        let mut hold = self.hold_admission(now);
        let mut budget = self.cfg.max_batch_tokens;
        let mut items: Vec<PlanItem> = Vec::new();
        // Running sequences: decodes first, then continuing prefills, oldest first.
        let mut order = self.running.clone();
        order.sort_by_key(|k| {
            let s = &self.seqs[k];
            (s.pending() > 1, s.admitted_at)
        });
        for key in order {
            if budget == 0 {
                break;
            }
            if !self
                .seqs
                .get(&key)
                .is_some_and(|s| s.phase == Phase::Running)
            {
                continue; // retracted earlier in this loop
            }
            if let Some(item) = self.plan_seq(key, budget, &items) {
                budget -= item.tokens.len();
                items.push(item);
            }
        }
        // Admit waiting sequences. (A hold while sequences run only delays a step that runs
        // something; if none of them could be planned, admission goes ahead.)
        if items.is_empty() && !self.running.is_empty() {
            hold = false;
        }
        if !hold
            && budget > 0
            && self.running.len() < self.cfg.max_running
            && !self.waiting.is_empty()
        {
            self.admit(&mut budget, &mut items, now);
        }
        self.urgent_prefill_first(&mut items);
        if items.is_empty() {
            if hold || self.loading() || self.io_pending() || self.receiving() {
                // Admission waits (bounded; see `core/hold.rs`), or a copy to or from a
                // lower tier is in flight: a load's sequence runs once it is done, and a
                // write's pinned pages become evictable.
                return None;
            }
            // Nothing fits: a lone sequence larger than the pool. Fail it rather than spin.
            if let Some(&key) = self.running.first() {
                self.finish(key, FinishReason::Abort(AbortReason::PoolTooSmall));
            }
            return None;
        }
        Some(PlannedBatch { items })
    }

    /// True while a sequence waits for its pages from a lower tier.
    fn loading(&self) -> bool {
        self.running
            .iter()
            .any(|k| self.seqs[k].phase == Phase::Loading)
    }

    /// Plans the next chunk of a running sequence, allocating its pages. Other running
    /// sequences not yet in `items` may be retracted to make room; `None` when even that
    /// does not free enough (the sequence then simply waits a step).
    fn plan_seq(&mut self, key: SeqKey, budget: usize, items: &[PlanItem]) -> Option<PlanItem> {
        let ps = self.cfg.page_size;
        let (computed, n) = {
            let s = &self.seqs[&key];
            (
                s.computed,
                s.pending().min(budget).min(self.cfg.chunked_prefill_size),
            )
        };
        if n == 0 {
            return None;
        }
        let need = (computed + n)
            .div_ceil(ps)
            .saturating_sub(self.seqs[&key].pages.len());
        if need > 0 {
            loop {
                if let Some(pages) = self.cache.alloc(need) {
                    self.seqs
                        .get_mut(&key)
                        .expect("running key")
                        .pages
                        .extend(pages);
                    break;
                }
                // Retract the newest running sequence that is neither this one nor planned.
                let victim = self
                    .running
                    .iter()
                    .copied()
                    .filter(|k| *k != key && !items.iter().any(|it| it.key == *k))
                    // A loading sequence's pages are being written by the I/O thread.
                    .filter(|k| self.seqs[k].phase == Phase::Running)
                    .max_by_key(|k| self.seqs[k].admitted_at);
                match victim {
                    Some(v) => self.retract(v),
                    None => return None,
                }
            }
        }
        let end = computed + n;
        let sample_after = end == self.seqs[&key].tokens.len();
        let draft = if sample_after {
            self.draft_for(key, n, budget - n)
        } else {
            Vec::new()
        };
        let s = &self.seqs[&key];
        let logits = if draft.is_empty() {
            self.logits_wanted(s, computed, n, sample_after)
        } else {
            // The sampled token's row and one per drafted token.
            LogitsWanted::Offsets((n - 1..n + draft.len()).collect())
        };
        let mut tokens = s.tokens[computed..end].to_vec();
        tokens.extend_from_slice(&draft);
        Some(PlanItem {
            key,
            pages: s.pages[..(end + draft.len()).div_ceil(ps)].to_vec(),
            tokens,
            start_pos: computed,
            logits,
            sample_after,
            draft: draft.len(),
        })
    }

    /// Returns a running sequence to the front of the waiting queue, keeping its computed
    /// full pages in the cache (so re-admission finds them) and freeing the rest.
    fn retract(&mut self, key: SeqKey) {
        // Not written down now: a pin would keep the pages from being evicted, and room is
        // what the retraction is for.
        self.release_pages(key, false);
        let order = self.next_retract_order;
        self.next_retract_order -= 1;
        let s = self.seqs.get_mut(&key).expect("retract of a live key");
        s.phase = Phase::Waiting;
        s.computed = 0;
        s.order = order;
        self.running.retain(|k| *k != key);
        self.waiting.push(key);
        self.stats.retractions += 1;
    }

    /// Inserts the sequence's computed full pages into the cache, frees the rest, unlocks;
    /// with `offload`, the new tree pages are written down to the lower tiers.
    fn release_pages(&mut self, key: SeqKey, offload: bool) {
        let ps = self.cfg.page_size;
        let s = self.seqs.get_mut(&key).expect("release of a live key");
        let Some(lock) = s.lock.take() else {
            return;
        };
        let full = (s.computed / ps).min(s.pages.len());
        let pages = std::mem::take(&mut s.pages);
        let lock = self.cache.insert(
            s.shared.namespace,
            &s.tokens[..full * ps],
            &pages[..full],
            s.tree_pages,
            lock,
        );
        self.cache.free(&pages[full..]);
        s.tree_pages = 0;
        if offload {
            self.offload_inserted(key, full);
        }
        self.cache.unlock(lock);
    }

    /// Inserts the computed full pages of the prompt into the cache while the sequence keeps
    /// running (after every prefill chunk, so that requests sharing the prefix can match it
    /// as soon as it is computed), and once the whole prompt is in, releases the blocked
    /// siblings of sample 0.
    fn share_prompt(&mut self, key: SeqKey) {
        let ps = self.cfg.page_size;
        let s = self.seqs.get_mut(&key).expect("live key");
        let full = (s.computed.min(s.shared.prompt_len) / ps).min(s.pages.len());
        if full > s.tree_pages {
            if let Some(lock) = s.lock.take() {
                let (lock, canonical) = self.cache.insert_running(
                    s.shared.namespace,
                    &s.tokens[..full * ps],
                    &s.pages[..full],
                    s.tree_pages,
                    lock,
                );
                s.pages[..full].copy_from_slice(&canonical);
                s.tree_pages = full;
                s.lock = Some(lock);
                self.offload_inserted(key, full);
            }
        }
        let s = &self.seqs[&key];
        if s.in_prompt() || s.sample != 0 {
            return;
        }
        let id = key.0;
        for (k, sib) in self.seqs.iter_mut() {
            if k.0 == id {
                sib.blocked_on_prefill = false;
            }
        }
    }

    /// Applies the logits of a planned batch: advances KV counts, samples, checks stops.
    pub fn handle_forward(&mut self, plan: PlannedBatch, logits: &Logits, now: Instant) {
        self.handle_forward_rows(plan, logits);
        self.note_step_end(now);
    }

    fn handle_forward_rows(&mut self, plan: PlannedBatch, logits: &Logits) {
        let mut rows_of: Vec<Vec<(usize, usize)>> = vec![Vec::new(); plan.items.len()];
        for (r, &(seq, off)) in logits.rows.iter().enumerate() {
            if let Some(v) = rows_of.get_mut(seq) {
                v.push((r, off));
            }
        }
        for (i, item) in plan.items.into_iter().enumerate() {
            let key = item.key;
            let Some(s) = self.seqs.get_mut(&key) else {
                continue; // aborted meanwhile
            };
            if s.phase != Phase::Running {
                continue;
            }
            let was_in_prompt = s.in_prompt();
            s.computed = item.start_pos + item.tokens.len() - item.draft;
            self.stats.spec_draft_tokens += item.draft as u64;
            self.collect_input_logprobs(key, &item, &rows_of[i], logits);
            let s = &self.seqs[&key];
            if was_in_prompt && s.lock.is_some() {
                self.share_prompt(key);
            }
            if !item.sample_after {
                continue;
            }
            let rows = &rows_of[i];
            if rows.len() < item.draft + 1 {
                self.finish(key, FinishReason::Abort(AbortReason::NoLogits));
                continue;
            }
            let rows = &rows[rows.len() - item.draft - 1..];
            let drafted = &item.tokens[item.tokens.len() - item.draft..];
            self.step_seq_or_abort(key, logits.row(rows[0].0));
            let mut accepted = 0;
            for (j, &(row, _)) in rows.iter().enumerate().skip(1) {
                // Row j follows drafted token j - 1: it is this sequence's next row only if
                // that token is the one just sampled and nothing else came with it (a stop,
                // forced tokens); its K and V, written in this pass, are then the sequence's.
                let Some(s) = self.seqs.get_mut(&key) else {
                    break;
                };
                let next = s.computed;
                if s.phase != Phase::Running
                    || s.tokens.len() != next + 1
                    || s.tokens[next] != drafted[j - 1]
                {
                    break;
                }
                s.computed += 1;
                accepted += 1;
                self.stats.spec_accepted_tokens += 1;
                self.step_seq_or_abort(key, logits.row(row));
            }
            if item.draft > 0 {
                self.note_draft(key, item.draft, accepted);
            }
        }
    }

    /// [`Self::step_seq`], with a panic in it (sampler, grammar, detokenizer: code that
    /// works on this sequence alone) ending only this sequence, with
    /// [`AbortReason::Internal`]. What the step may have left half done belongs to the
    /// sequence (its tokens, matcher, detokenizer, sampler state) or is scratch refilled
    /// before every use (`mask`, `scratch`); `finish` then returns its pages by `computed`,
    /// which the step never changes.
    fn step_seq_or_abort(&mut self, key: SeqKey, row: &[f32]) {
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.step_seq(key, row);
        }));
        if let Err(payload) = step {
            let message = crate::request::panic_message(payload.as_ref());
            let reason = FinishReason::Abort(AbortReason::Internal(message));
            if self.seqs.contains_key(&key) {
                self.finish(key, reason);
                return;
            }
            // `finish` itself panicked after taking the sequence out: make sure the request
            // still hears that this sample ended.
            let ended = self.events.iter().any(
                |e| matches!(e, SchedEvent::Finished { id, sample, .. } if (*id, *sample) == key),
            );
            if !ended {
                self.events.push_back(SchedEvent::Finished {
                    id: key.0,
                    sample: key.1,
                    reason,
                    prompt_tokens: 0,
                    completion_tokens: 0,
                    cached: CachedTokens::default(),
                });
                if let Some(n) = self.alive.get_mut(&key.0) {
                    *n -= 1;
                    if *n == 0 {
                        self.alive.remove(&key.0);
                    }
                }
            }
        }
    }

    /// Samples the next token of a sequence whose pending tokens all have KV now.
    fn step_seq(&mut self, key: SeqKey, row: &[f32]) {
        let s = self.seqs.get_mut(&key).expect("live key");
        let stop = &s.shared.stop;
        if s.output_len() >= stop.max_new_tokens {
            let n = s.output_len();
            self.finish(key, FinishReason::Length(n));
            return;
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(row);
        // min_new_tokens: no stop token yet.
        if s.output_len() < stop.min_new_tokens {
            let eos = if stop.ignore_eos {
                &[][..]
            } else {
                &self.cfg.eos_tokens[..]
            };
            for &t in eos.iter().chain(&stop.stop_token_ids) {
                if let Some(l) = self.scratch.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let mut use_mask = false;
        if let Some(m) = s.matcher.as_ref() {
            let remaining = stop.max_new_tokens - s.output_len();
            if let Err(e) = constrain::fill_mask(m, &mut self.mask, remaining) {
                self.finish(
                    key,
                    FinishReason::Abort(AbortReason::Grammar(e.to_string())),
                );
                return;
            }
            use_mask = true;
        }
        let want_lp = s.shared.logprobs.is_some();
        let raw = want_lp.then(|| LogSoftmax::new(row));
        // The chosen token's logprob only when asked for: one pass over the vocabulary less.
        let token = match sampler::sample_token(
            &mut self.scratch,
            &s.shared.sampling,
            &mut s.sampler,
            use_mask.then_some(&self.mask[..]),
        ) {
            Ok(t) => t,
            Err(e) => {
                self.finish(
                    key,
                    FinishReason::Abort(AbortReason::Sampling(e.to_string())),
                );
                return;
            }
        };
        let lp_entry = raw
            .as_ref()
            .zip(s.shared.logprobs.as_ref())
            .map(|(ls, lp)| logprobs::entry(ls, token, lp));
        self.append_tokens(key, &[token], lp_entry.into_iter().collect(), true);
    }

    /// Appends tokens (sampled, or forced by the grammar), updates the detokenizer and
    /// checks the stop conditions; emits a delta, and finishes the sequence when it ends.
    fn append_tokens(
        &mut self,
        key: SeqKey,
        tokens: &[u32],
        logprobs: Vec<TokenLogprob>,
        jump: bool,
    ) {
        let tok = self.tokenizer.clone();
        let s = self.seqs.get_mut(&key).expect("live key");
        let shared = s.shared.clone();
        let stop = &shared.stop;
        let mut finish: Option<FinishReason> = None;
        let mut accepted = Vec::with_capacity(tokens.len());
        for &t in tokens {
            s.tokens.push(t);
            s.sampler.observe(t);
            accepted.push(t);
            self.stats.generated_tokens += 1;
            let out_len = s.output_len();
            let is_stop_token = (!stop.ignore_eos && self.cfg.eos_tokens.contains(&t))
                || stop.stop_token_ids.contains(&t);
            if let Some(m) = s.matcher.as_mut() {
                if !is_stop_token && m.accept_token(t).is_err() {
                    finish = Some(FinishReason::Abort(AbortReason::GrammarRejected(t)));
                    break;
                }
            }
            if is_stop_token && out_len >= stop.min_new_tokens {
                finish = Some(FinishReason::StopToken(t));
                break;
            }
            match s
                .detok
                .push(tok.as_ref(), t, out_len >= stop.min_new_tokens)
            {
                Ok(Some(matched)) => {
                    finish = Some(FinishReason::StopString(matched));
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    finish = Some(FinishReason::Abort(AbortReason::Detokenize(e.to_string())));
                    break;
                }
            }
            if s.matcher.as_ref().is_some_and(|m| m.is_finished()) {
                finish = Some(FinishReason::GrammarEnd);
                break;
            }
            if out_len >= stop.max_new_tokens {
                finish = Some(FinishReason::Length(out_len));
                break;
            }
            if s.tokens.len() >= self.cfg.max_context {
                finish = Some(FinishReason::Length(out_len));
                break;
            }
        }
        // A prefill host samples the first token only: the decode host goes on from it
        // (jump-forward included).
        let export = s.shared.disagg == Some(crate::request::Disagg::Export);
        if finish.is_none() && export {
            finish = Some(FinishReason::Length(s.output_len()));
        }
        let forced =
            if finish.is_none() && jump && self.cfg.jump_forward && s.shared.logprobs.is_none() {
                // Leave one token of the budget for the model (or the grammar's end).
                let limit = stop.max_new_tokens.saturating_sub(s.output_len() + 1);
                constrain::forced_tokens(s, tok.as_ref(), limit)
            } else {
                None
            };
        let text = s.detok.take_delta(finish.is_some());
        self.events.push_back(SchedEvent::Delta {
            id: key.0,
            sample: key.1,
            tokens: accepted,
            text,
            logprobs,
        });
        if let Some(reason) = finish {
            self.finish(key, reason);
        } else if let Some(forced) = forced {
            self.stats.jump_forward_tokens += forced.len() as u64;
            self.append_tokens(key, &forced, Vec::new(), false);
        }
    }

    /// Ends a sequence: flushes its text, returns its pages to the cache, emits `Finished`.
    fn finish(&mut self, key: SeqKey, reason: FinishReason) {
        if !self.seqs.contains_key(&key) {
            return;
        }
        let tok = self.tokenizer.clone();
        let aborted = matches!(reason, FinishReason::Abort(_));
        if self.finish_disagg(key, aborted) {
            // Receiving: the server may still be writing its pages (`core/disagg.rs`).
        } else if self.seqs[&key].phase == Phase::Loading {
            // The I/O thread is writing its pages: they are freed when it is done.
            self.orphan_loading(key);
        } else {
            self.release_pages(key, true);
        }
        let mut s = self.seqs.remove(&key).expect("checked above");
        self.running.retain(|k| *k != key);
        self.waiting.retain(|k| *k != key);
        if !matches!(reason, FinishReason::StopString(_) | FinishReason::Abort(_)) {
            let _ = s.detok.finish(tok.as_ref());
        }
        let text = s.detok.take_delta(true);
        if !text.is_empty() {
            self.events.push_back(SchedEvent::Delta {
                id: key.0,
                sample: key.1,
                tokens: vec![],
                text,
                logprobs: vec![],
            });
        }
        if s.sample == 0 {
            // Siblings blocked on this prompt must not wait forever.
            for (k, sib) in self.seqs.iter_mut() {
                if k.0 == key.0 {
                    sib.blocked_on_prefill = false;
                }
            }
        }
        self.events.push_back(SchedEvent::Finished {
            id: key.0,
            sample: key.1,
            reason,
            prompt_tokens: s.shared.prompt_len,
            completion_tokens: s.output_len(),
            cached: s.cached,
        });
        if let Some(n) = self.alive.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                self.alive.remove(&key.0);
                self.forget_prefetch(key.0);
                self.stats.finished_requests += 1;
                if !aborted {
                    self.finished_in_step += 1;
                }
            }
        }
    }
}

impl SchedulerCore {
    /// The executor failed on a planned batch: its sequences end with `message`.
    pub fn handle_forward_error(&mut self, plan: PlannedBatch, message: &str) {
        for item in plan.items {
            self.finish(
                item.key,
                FinishReason::Abort(AbortReason::Forward(message.to_string())),
            );
        }
    }
}
