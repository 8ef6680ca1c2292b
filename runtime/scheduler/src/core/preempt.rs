//! Priority preemption: when every running place is taken, a waiting sequence whose
//! `priority` exceeds a running sequence's by more than
//! [`SchedulerConfig::priority_preemption`] takes that sequence's place.
//!
//! The running sequence is retracted as under memory pressure: its computed full pages stay
//! in the radix cache, the rest are freed, and it returns to the front of its priority in
//! the waiting queue with every token it has produced; re-admitted, it finds its KV in the
//! cache and goes on where it stopped (its output is unchanged). Victims are the lowest
//! priority first, the newest admitted among equals (SGLang's order), and only of the
//! waiting sequence's own tenant: priorities order work within a tenant, and tenants share
//! the server through the queue shares and admission's interleaving, not through each
//! other's priorities. A sequence that is loading pages from a lower tier, receiving or
//! exporting KV (disaggregation) is never a victim.
//!
//! A pass that holds the prompt of such a sequence (one whose priority exceeds the lowest
//! of its tenant's in the pass by more than the threshold) leaves out that tenant's
//! sequences below the bar, so the urgent request's first token comes after its own
//! prefill rather than after a full mixed batch; their decode steps wait one pass, and
//! other tenants' sequences run as planned. Its decode steps then share passes with
//! everyone again. An interrupt (below) does delay every tenant of the pass in flight, by
//! at most that pass, and never two passes in a row.
//!
//! The pass in flight when such a request arrives does not make it wait either: the driver
//! publishes these bars for each pass ([`SchedulerCore::preemption_bars`]), and a submit
//! above one raises the executor's interrupt flag, which stops the pass at its next layer
//! boundary; it produced nothing, so its sequences simply run again in the next pass (whose
//! plan now holds the newcomer). A pass right after an interrupted one cannot be
//! interrupted, so at least every other pass completes whatever arrives.
//!
//! [`SchedulerConfig::priority_preemption`]: super::SchedulerConfig::priority_preemption

use super::{PlanItem, SchedulerCore, SeqKey};
use crate::seq::Phase;
use std::collections::HashMap;
use std::time::Instant;

impl SchedulerCore {
    /// Retracts running sequences for waiting ones of much higher priority (see the module
    /// docs), before the step is planned.
    pub(super) fn preempt_for_priority(&mut self, now: Instant) {
        let Some(threshold) = self.cfg.priority_preemption else {
            return;
        };
        if self.running.len() < self.cfg.max_running || self.waiting.is_empty() {
            return;
        }
        // Every step of a full server comes here: without a waiting sequence above the
        // lowest running one by more than the threshold (the usual case), nothing to sort.
        let priority = |k: &SeqKey| self.seqs[k].shared.priority;
        let lowest = self.running.iter().map(priority).min().unwrap_or(i64::MAX);
        let highest = self.waiting.iter().map(priority).max().unwrap_or(i64::MIN);
        if highest <= lowest.saturating_add(threshold) {
            return;
        }
        // The best waiting candidates, highest priority first; no more of them than there
        // are running places.
        let mut candidates: Vec<(i64, u64, u64)> = self
            .waiting
            .iter()
            .filter(|k| {
                let s = &self.seqs[*k];
                !s.blocked_on_prefill && !self.prefetch_holds(k.0, now)
            })
            .map(|k| {
                let s = &self.seqs[k];
                (s.shared.priority, s.order, s.shared.tenant)
            })
            .collect();
        candidates.sort_by_key(|&(p, order, _)| (std::cmp::Reverse(p), order));
        candidates.truncate(self.cfg.max_running);
        // Every running place is taken: each candidate needs a victim's.
        for (priority, _, tenant) in candidates {
            let Some(victim) = self.preemption_victim(tenant) else {
                continue;
            };
            if priority <= self.seqs[&victim].shared.priority.saturating_add(threshold) {
                continue;
            }
            self.retract(victim);
            self.stats.preemptions += 1;
        }
    }

    /// Leaves a tenant's low-priority sequences out of a planned pass that prefills the
    /// prompt of one of its high-priority ones (see the module docs). Those left out keep
    /// the pages planning gave them and run in the next pass.
    pub(super) fn urgent_prefill_first(&mut self, items: &mut Vec<PlanItem>) {
        let priority = |it: &PlanItem| self.seqs[&it.key].shared.priority;
        let mut priorities = items.iter().map(priority);
        let first = priorities.next();
        // One priority in the pass (the usual case): nothing can be urgent.
        if self.cfg.priority_preemption.is_none() || priorities.all(|p| Some(p) == first) {
            return;
        }
        let bars = self.bars_of(items);
        let shared = |it: &PlanItem| &self.seqs[&it.key].shared;
        let urgent: Vec<u64> = items
            .iter()
            .filter(|it| {
                let s = shared(it);
                s.priority > bars[&s.tenant] && self.seqs[&it.key].in_prompt()
            })
            .map(|it| shared(it).tenant)
            .collect();
        if urgent.is_empty() {
            return;
        }
        items.retain(|it| {
            let s = shared(it);
            !urgent.contains(&s.tenant) || s.priority > bars[&s.tenant]
        });
        self.stats.urgent_passes += 1;
    }

    /// Per tenant in `plan`, the priority a newcomer must exceed to preempt the pass's
    /// lowest-priority sequence of that tenant (its priority plus the threshold); empty
    /// without priority preemption.
    pub(crate) fn preemption_bars(&self, plan: &super::PlannedBatch) -> HashMap<u64, i64> {
        self.bars_of(&plan.items)
    }

    /// [`SchedulerCore::preemption_bars`] of a pass's items.
    fn bars_of(&self, items: &[PlanItem]) -> HashMap<u64, i64> {
        let mut bars = HashMap::new();
        let Some(threshold) = self.cfg.priority_preemption else {
            return bars;
        };
        for it in items {
            let s = &self.seqs[&it.key].shared;
            let bar = s.priority.saturating_add(threshold);
            let b = bars.entry(s.tenant).or_insert(bar);
            *b = (*b).min(bar);
        }
        bars
    }

    /// The running sequence of `tenant` to retract first: lowest priority, newest admitted.
    fn preemption_victim(&self, tenant: u64) -> Option<SeqKey> {
        self.running
            .iter()
            .copied()
            .filter(|k| {
                let s = &self.seqs[k];
                s.shared.tenant == tenant && s.phase == Phase::Running && s.shared.disagg.is_none()
            })
            .min_by_key(|k| {
                let s = &self.seqs[k];
                (s.shared.priority, std::cmp::Reverse(s.admitted_at))
            })
    }
}
