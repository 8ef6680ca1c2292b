//! The core's side of prefill/decode disaggregation (`docs/pd.md`).
//!
//! - **Export** (prefill host): a request runs its prompt and samples its first token as
//!   usual; when it ends, the page ids covering the prompt are queued
//!   ([`SchedulerCore::take_exports`]) and the driver copies them out of the pool before the
//!   next pass can reuse a freed page, then sends them to the request as
//!   [`SchedEvent::KvExport`](crate::SchedEvent::KvExport). The full pages stay in the radix
//!   cache like any finished prompt's.
//! - **Import** (decode host): admission matches the whole prompt against the local cache,
//!   allocates pages for the rest and queues an [`ImportJob`]
//!   ([`SchedulerCore::poll_import`]); the sequence waits in `Phase::Receiving`, in no batch
//!   and never retracted, while the server writes the arriving pages into those pages.
//!   [`SchedulerCore::handle_kv_imported`] then appends the first token (stop checks,
//!   grammar, jump-forward, as if it had been sampled here) and the sequence decodes on. A
//!   sequence that ends while receiving keeps its pages in `orphans` until the import is
//!   reported, since the writer may still be copying into them.

use std::collections::{HashMap, VecDeque};

use super::{SchedulerCore, SeqKey};
use crate::cache::Lock;
use crate::request::{AbortReason, Disagg, FinishReason, KvImport, RequestId, SchedEvent};
use crate::seq::Phase;

/// Pages a decode host must fill with a prompt's KV from its prefill host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportJob {
    /// The request.
    pub id: RequestId,
    /// Destination pages for the prompt's pages `skip_pages..prompt_pages`, in order.
    pub dst_pages: Vec<u32>,
    /// Leading prompt pages found in the local cache (not transferred).
    pub skip_pages: usize,
    /// Pages the whole prompt covers.
    pub prompt_pages: usize,
}

/// A finished prefill whose prompt pages the driver copies out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportJob {
    /// The request.
    pub id: RequestId,
    /// The prompt's pages, in order (the last may be partly filled).
    pub pages: Vec<u32>,
    /// The sampler's random stream position after the first token.
    pub rng_position: u128,
}

/// Counters of the disaggregation paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DisaggStats {
    /// Prefill host: requests whose pages were handed out.
    pub exported_requests: u64,
    /// Decode host: imports started.
    pub import_started: u64,
    /// Decode host: imports that delivered.
    pub imported_requests: u64,
    /// Decode host: imports that failed.
    pub import_failures: u64,
    /// Decode host: pages asked from prefill hosts.
    pub imported_pages: u64,
    /// Decode host: prompt pages found in the local cache instead.
    pub local_pages: u64,
}

/// Import and export bookkeeping of the core.
#[derive(Default)]
pub(crate) struct DisaggState {
    imports: VecDeque<ImportJob>,
    exports: Vec<ExportJob>,
    /// Sequences that ended while receiving: their fresh pages and lock, released when the
    /// import is reported.
    orphans: HashMap<RequestId, (Vec<u32>, Option<Lock>)>,
    stats: DisaggStats,
}

impl DisaggState {
    /// Takes over another state's counters (a rebuilt core's).
    pub(crate) fn carry_stats(&mut self, old: &DisaggState) {
        self.stats = old.stats.clone();
    }
}

impl SchedulerCore {
    /// The next import for the driver to start (decode host).
    pub fn poll_import(&mut self) -> Option<ImportJob> {
        self.disagg.imports.pop_front()
    }

    /// Finished prefills whose pages must be copied out now, before the next forward pass.
    pub fn take_exports(&mut self) -> Vec<ExportJob> {
        std::mem::take(&mut self.disagg.exports)
    }

    /// Counters of the disaggregation paths.
    pub fn disagg_stats(&self) -> &DisaggStats {
        &self.disagg.stats
    }

    /// True while an import's pages are still being written (by a live or an ended
    /// sequence).
    pub(super) fn receiving(&self) -> bool {
        !self.disagg.orphans.is_empty()
            || self
                .running
                .iter()
                .any(|k| self.seqs[k].phase == Phase::Receiving)
    }

    /// Admits a decode host's sequence: the whole prompt is matched against the cache
    /// (nothing needs computing here, so no token is held back), the rest gets fresh pages
    /// and an import job. `None` when memory is short (the sequence keeps waiting).
    pub(super) fn admit_import(&mut self, key: SeqKey) -> bool {
        let ps = self.cfg.page_size;
        let (ns, tokens) = {
            let s = &self.seqs[&key];
            (s.shared.namespace, s.tokens.clone())
        };
        let m = self.cache.match_and_lock(ns, &tokens);
        let prompt_pages = tokens.len().div_ceil(ps);
        let skip = m.pages.len().min(prompt_pages);
        let need = (prompt_pages + 1).saturating_sub(skip) + self.running.len();
        if self.cache.available() < need && !self.running.is_empty() {
            self.cache.unlock(m.lock);
            return false;
        }
        let Some(fresh) = self.cache.alloc(prompt_pages - skip) else {
            self.cache.unlock(m.lock);
            if self.running.is_empty() {
                self.finish(key, FinishReason::Abort(AbortReason::PoolTooSmall));
            }
            return false;
        };
        let mut pages = m.pages;
        pages.truncate(skip);
        pages.extend_from_slice(&fresh);
        self.take_admission(key, skip * ps, pages, skip, m.lock);
        self.seqs.get_mut(&key).expect("admitted").phase = Phase::Receiving;
        let st = &mut self.disagg.stats;
        st.import_started += 1;
        st.imported_pages += fresh.len() as u64;
        st.local_pages += skip as u64;
        self.disagg.imports.push_back(ImportJob {
            id: key.0,
            dst_pages: fresh,
            skip_pages: skip,
            prompt_pages,
        });
        true
    }

    /// The server finished writing an import's pages (`Ok`, with what the prefill host
    /// sent along) or gave up (`Err`, the reason the client gets). Unknown ids are ignored.
    pub fn handle_kv_imported(&mut self, id: RequestId, result: Result<KvImport, String>) {
        if let Some((pages, lock)) = self.disagg.orphans.remove(&id) {
            self.cache.free(&pages);
            if let Some(lock) = lock {
                self.cache.unlock(lock);
            }
            return;
        }
        let key = (id, 0);
        let Some(s) = self.seqs.get_mut(&key) else {
            return;
        };
        if s.phase != Phase::Receiving {
            return;
        }
        s.phase = Phase::Running;
        let imp = match result {
            Ok(imp) => imp,
            Err(message) => {
                self.disagg.stats.import_failures += 1;
                // `computed` still counts only the local prefix: the fresh pages are freed.
                self.finish(key, FinishReason::Abort(AbortReason::Transfer(message)));
                return;
            }
        };
        self.disagg.stats.imported_requests += 1;
        s.computed = s.shared.prompt_len;
        s.awaiting_kv = false;
        s.sampler.set_rng_position(imp.rng_position);
        let wants_input = s
            .shared
            .logprobs
            .as_ref()
            .is_some_and(|l| l.input_start.is_some());
        if wants_input && !s.input_logprobs_sent {
            s.input_logprobs_sent = true;
            self.events.push_back(SchedEvent::InputLogprobs {
                id,
                sample: 0,
                logprobs: imp.input_logprobs,
            });
        }
        self.share_prompt(key);
        let lp = imp.first_logprob.into_iter().collect();
        self.append_tokens(key, &[imp.first_token], lp, true);
    }

    /// `finish`'s part for disaggregated sequences: a receiving sequence's pages become
    /// orphans (true: the caller must not release them); a prefill host's sequence that
    /// produced its first token queues its prompt pages for export.
    pub(super) fn finish_disagg(&mut self, key: SeqKey, aborted: bool) -> bool {
        let ps = self.cfg.page_size;
        let s = self.seqs.get_mut(&key).expect("finish of a live key");
        if s.phase == Phase::Receiving {
            let pages = s.pages.split_off(s.tree_pages.min(s.pages.len()));
            let lock = s.lock.take();
            self.disagg.orphans.insert(key.0, (pages, lock));
            return true;
        }
        if s.shared.disagg == Some(Disagg::Export) && !aborted && s.output_len() > 0 {
            let n = s.shared.prompt_len.div_ceil(ps).min(s.pages.len());
            self.disagg.exports.push(ExportJob {
                id: key.0,
                pages: s.pages[..n].to_vec(),
                rng_position: s.sampler.rng_position(),
            });
            self.disagg.stats.exported_requests += 1;
        }
        false
    }
}
