//! Admission: which waiting sequences join the next forward pass.
//!
//! Candidates are taken in policy order. Each one's cached prefix is matched and locked, and
//! it is admitted only if the pool has room for its whole remaining prompt plus one page of
//! headroom per running sequence; the first one that does not fit ends admission for this
//! step (so the order is kept).
//!
//! **Tenants.** The policy orders candidates within a tenant; across tenants the one with
//! the fewest running sequences goes first (ties: policy order), counting each admission of
//! this step as it is planned ([`policy::interleave_tenants`]). A tenant with hundreds of
//! requests waiting thus cannot keep another's request out past the next step with room.
//! Each tenant contributes up to [`CANDIDATES`] of its waiting sequences, so a long queue of
//! one tenant does not hide another's from the ordering either.
//!
//! **In-batch prefix sharing.** Requests that arrive together often share a prefix nobody
//! has cached yet (a system prompt, few-shot examples, a document). Admitting them all at
//! once would compute that prefix once per request. Instead a candidate waits while a
//! running sequence is still prefilling a prefix it shares (at least two pages beyond what
//! is cached); that sequence inserts its full pages into the cache after every
//! chunk, so the candidate is admitted a step or two later and computes only its own part.

use super::super::policy::{self, WaitingInfo};
use super::{PlanItem, SchedulerCore, SeqKey};
use crate::seq::Phase;
use std::collections::HashMap;
use std::time::Instant;

/// Shortest shared, uncached prefix worth waiting for, in pages (32 tokens with the default
/// page size of 16, SGLang's in-batch prefix threshold).
const SHARE_MIN_PAGES: usize = 2;

/// Waiting sequences of one tenant ordered by policy per step (and four times as many in
/// all, however many tenants wait).
const CANDIDATES: usize = 256;

/// What admitting one candidate did.
enum Admitted {
    /// It runs in the next pass: its first chunk.
    Planned(PlanItem),
    /// It holds its pages and waits for a load from a lower tier.
    Loading,
    /// Memory is short: it stays waiting.
    Short,
}

impl SchedulerCore {
    pub(super) fn admit(&mut self, budget: &mut usize, items: &mut Vec<PlanItem>, now: Instant) {
        let mut per_tenant: HashMap<u64, usize> = HashMap::new();
        let candidates: Vec<SeqKey> = self
            .waiting
            .iter()
            .copied()
            .filter(|k| !self.seqs[k].blocked_on_prefill && !self.prefetch_holds(k.0, now))
            .filter(|k| {
                let n = per_tenant.entry(self.seqs[k].shared.tenant).or_default();
                *n += 1;
                *n <= CANDIDATES
            })
            .take(4 * CANDIDATES)
            .collect();
        let tenants: Vec<u64> = candidates
            .iter()
            .map(|k| self.seqs[k].shared.tenant)
            .collect();
        let mut running: HashMap<u64, usize> = HashMap::new();
        for k in &self.running {
            *running.entry(self.seqs[k].shared.tenant).or_default() += 1;
        }
        let infos: Vec<WaitingInfo> = candidates
            .iter()
            .map(|k| {
                let s = &self.seqs[k];
                let (prefix_len, group) = self
                    .cache
                    .peek(s.shared.namespace, &s.tokens[..s.tokens.len() - 1]);
                WaitingInfo {
                    order: s.order,
                    priority: s.shared.priority,
                    prefix_len,
                    group,
                }
            })
            .collect();
        let order = policy::order(self.cfg.policy, &infos);
        for i in policy::interleave_tenants(order, &tenants, running) {
            if *budget == 0 || self.running.len() >= self.cfg.max_running {
                break;
            }
            let key = candidates[i];
            if self.shares_a_prefill(key, infos[i].prefix_len) {
                // A running prefill is computing this prompt's prefix right now: admitted
                // after it, this sequence finds that prefix in the cache.
                continue;
            }
            match self.try_admit(key, *budget, items) {
                Admitted::Planned(item) => {
                    *budget -= item.tokens.len();
                    items.push(item);
                }
                Admitted::Loading => {}
                Admitted::Short => break, // keep the order, try again next step
            }
        }
    }

    /// Matches the prefix, checks memory for the whole pending prompt and plans the first
    /// chunk, or starts loading the part of the prefix found in a lower tier.
    fn try_admit(&mut self, key: SeqKey, budget: usize, items: &[PlanItem]) -> Admitted {
        if self.seqs[&key].awaiting_kv {
            // Decode host: the prompt's KV comes from the prefill host (`core/disagg.rs`).
            return if self.admit_import(key) {
                Admitted::Loading
            } else {
                Admitted::Short
            };
        }
        let ps = self.cfg.page_size;
        let (ns, match_limit) = {
            let s = &self.seqs[&key];
            // Leave one token to compute (its logits give the next token), and do not skip
            // positions whose input logprobs were asked for.
            let mut limit = s.tokens.len() - 1;
            if let Some(start) = s.shared.logprobs.as_ref().and_then(|l| l.input_start) {
                limit = limit.min(start.saturating_sub(1));
            }
            (s.shared.namespace, limit)
        };
        let tokens = self.seqs[&key].tokens.clone();
        let m = self.cache.match_and_lock(ns, &tokens[..match_limit]);
        let total_pages = tokens.len().div_ceil(ps) + 1;
        // Headroom: one page per running sequence for its next decode steps.
        let need = total_pages.saturating_sub(m.pages.len()) + self.running.len();
        if self.cache.available() < need && !self.running.is_empty() {
            self.cache.unlock(m.lock);
            return Admitted::Short;
        }
        let (device_len, mut lower) = self.lower_hit(ns, &tokens[..match_limit]);
        if device_len != m.len {
            lower.clear(); // cannot happen: the tree did not change since the match
        }
        let load_pages = if lower.is_empty() {
            Vec::new()
        } else {
            match self.cache.alloc(lower.len()) {
                Some(p) => p,
                None => {
                    self.cache.unlock(m.lock);
                    return Admitted::Short;
                }
            }
        };
        let first = self.seqs[&key].cached_tokens.is_none();
        if first && m.len > 0 {
            self.offload_hit(ns, &tokens[..m.len]);
        }
        let tree_pages = m.pages.len();
        self.take_admission(key, m.len, m.pages, tree_pages, m.lock);
        if !lower.is_empty() {
            self.start_load(key, load_pages, lower, first);
            return Admitted::Loading;
        }
        self.seqs.get_mut(&key).expect("admitted").phase = Phase::Running;
        match self.plan_seq(key, budget, items) {
            Some(item) => Admitted::Planned(item),
            None => {
                self.retract(key);
                Admitted::Short
            }
        }
    }

    /// Moves a waiting sequence to the running set holding `pages` (the first `tree_pages`
    /// of them the tree's, under `lock`) with `computed` tokens of KV, and counts its cached
    /// prompt tokens at its first admission.
    pub(super) fn take_admission(
        &mut self,
        key: SeqKey,
        computed: usize,
        pages: Vec<u32>,
        tree_pages: usize,
        lock: crate::cache::Lock,
    ) {
        let s = self.seqs.get_mut(&key).expect("waiting key present");
        s.computed = computed;
        s.pages = pages;
        s.tree_pages = tree_pages;
        s.lock = Some(lock);
        if s.cached_tokens.is_none() {
            let cached = computed.min(s.shared.prompt_len);
            s.cached_tokens = Some(cached);
            s.cached.device = cached;
            self.stats.prompt_tokens += s.shared.prompt_len as u64;
            self.stats.cached_tokens += cached as u64;
        }
        s.offloaded = tree_pages;
        s.admitted_at = self.next_admit;
        self.next_admit += 1;
        self.waiting.retain(|k| *k != key);
        self.running.push(key);
    }

    /// True when a running sequence is still prefilling a prefix of `key`'s prompt that is at
    /// least [`SHARE_MIN_PAGES`] pages longer than the `cached` tokens `key` would match now.
    fn shares_a_prefill(&self, key: SeqKey, cached: usize) -> bool {
        let share_min = SHARE_MIN_PAGES * self.cfg.page_size;
        let c = &self.seqs[&key];
        let want = &c.tokens[..c.tokens.len() - 1];
        if want.len() < cached + share_min {
            return false;
        }
        self.running.iter().any(|r| {
            let r = &self.seqs[r];
            if r.shared.namespace != c.shared.namespace || !r.in_prompt() {
                return false;
            }
            let prompt = &r.tokens[..r.shared.prompt_len];
            // Cheap rejection first: the pages right after the cached part must agree.
            if prompt.len() < cached + share_min
                || want[cached..cached + share_min] != prompt[cached..cached + share_min]
            {
                return false;
            }
            let lcp = want.iter().zip(prompt).take_while(|(a, b)| a == b).count();
            // Only a part `r` has not computed yet is worth waiting for (what it has computed
            // is in the cache already).
            lcp >= cached + share_min && r.computed < lcp
        })
    }
}
