//! The core's side of the hierarchical cache: looking prompts up in the lower tiers,
//! loading their pages back, and writing new tree pages down (see `crate::hicache`).
//!
//! Page ownership across tiers: a loading sequence owns its fresh device pages (they are in
//! no batch and cannot be retracted until its load is done; if it is aborted meanwhile they
//! wait in `orphans` for the I/O thread); a write job pins its tree pages with a lock, so
//! they are neither evicted nor reused while they are copied out.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use sglrs_radix_cache::{Namespace, PageHash};

use super::{SchedulerCore, SeqKey};
use crate::cache::Lock;
use crate::hicache::{HiCacheConfig, IoDone, IoJob, PrefetchPolicy, TierStats, WritePolicy};
use crate::request::RequestId;
use crate::seq::Phase;

/// Lower-tier state of the core.
pub(crate) struct Tiers {
    cfg: HiCacheConfig,
    jobs: VecDeque<IoJob>,
    /// Locks held by write jobs in flight.
    pins: HashMap<u64, Lock>,
    next_pin: u64,
    /// Loads in flight: whether the load counts toward the request's cached tokens (its
    /// first admission).
    loading: HashMap<SeqKey, bool>,
    /// Pages and locks of sequences that ended while loading, freed when the load is done.
    orphans: HashMap<SeqKey, (Vec<u32>, Option<Lock>)>,
    /// Prefetches in flight, with the request's arrival.
    prefetching: HashMap<RequestId, Instant>,
    /// Write-back stores in flight.
    stores: usize,
    stats: TierStats,
}

impl Tiers {
    pub(crate) fn new(cfg: HiCacheConfig) -> Tiers {
        Tiers {
            cfg,
            jobs: VecDeque::new(),
            pins: HashMap::new(),
            next_pin: 0,
            loading: HashMap::new(),
            orphans: HashMap::new(),
            prefetching: HashMap::new(),
            stores: 0,
            stats: TierStats::default(),
        }
    }
}

impl Tiers {
    /// Takes over another state's counters (a rebuilt core's).
    pub(crate) fn carry_stats(&mut self, old: &Tiers) {
        self.stats = old.stats.clone();
    }
}

impl SchedulerCore {
    /// The next copy for the cache I/O thread.
    pub fn poll_io(&mut self) -> Option<IoJob> {
        self.tiers.as_mut()?.jobs.pop_front()
    }

    /// True while a copy is queued or in flight (loads, writes, prefetches).
    pub fn io_pending(&self) -> bool {
        self.tiers.as_ref().is_some_and(|t| {
            !t.jobs.is_empty()
                || !t.pins.is_empty()
                || !t.loading.is_empty()
                || !t.prefetching.is_empty()
                || t.stores > 0
        })
    }

    /// Write-back: the pages evicted since the last call, with their names. The caller copies
    /// them out of the pool before the next forward pass (which may write them) and hands
    /// the copies to [`SchedulerCore::store_copies`].
    pub fn take_demoted(&mut self) -> Vec<(PageHash, u32)> {
        if self.tiers.is_none() {
            return Vec::new();
        }
        self.cache.take_demoted()
    }

    /// Write-back: queues the store of pages copied out of the pool.
    pub fn store_copies(&mut self, pages: Vec<(PageHash, bytes::Bytes)>) {
        if pages.is_empty() {
            return;
        }
        if let Some(t) = self.tiers.as_mut() {
            t.stores += 1;
            t.jobs.push_back(IoJob::Store { pages });
        }
    }

    /// The lower tiers' configuration, if there are lower tiers.
    pub fn hicache(&self) -> Option<&HiCacheConfig> {
        self.tiers.as_ref().map(|t| &t.cfg)
    }

    /// Counters of the lower tiers.
    pub fn tier_stats(&self) -> Option<TierStats> {
        self.tiers.as_ref().map(|t| t.stats.clone())
    }

    /// Panics when the radix tree breaks an invariant (tests).
    #[cfg(test)]
    pub(crate) fn check_cache_invariants(&self) {
        self.cache.check_invariants();
    }

    /// A copy finished on the I/O thread.
    pub fn handle_io_done(&mut self, done: IoDone) {
        let ps = self.cfg.page_size;
        let Some(t) = self.tiers.as_mut() else {
            return;
        };
        match done {
            IoDone::Written { pin, written } => {
                t.stats.written_pages += written as u64;
                t.stats.written_bytes += (written * t.cfg.page_bytes) as u64;
                if let Some(lock) = t.pins.remove(&pin) {
                    self.cache.unlock(lock);
                }
            }
            IoDone::Stored { written } => {
                t.stores = t.stores.saturating_sub(1);
                t.stats.written_pages += written as u64;
                t.stats.written_bytes += (written * t.cfg.page_bytes) as u64;
            }
            IoDone::Prefetched { id, remote } => {
                t.stats.prefetches += 1;
                t.stats.fetched_remote_pages += remote as u64;
                t.prefetching.remove(&id);
            }
            IoDone::Loaded {
                key,
                loaded,
                host,
                disk,
                remote,
                seconds,
            } => {
                let first = t.loading.remove(&key).unwrap_or(false);
                t.stats.loads += 1;
                t.stats.loaded_host_pages += host as u64;
                t.stats.loaded_disk_pages += disk as u64;
                t.stats.loaded_remote_pages += remote as u64;
                t.stats.observe_load(seconds);
                t.stats.loaded_bytes += (loaded * t.cfg.page_bytes) as u64;
                if let Some((pages, lock)) = t.orphans.remove(&key) {
                    self.cache.free(&pages);
                    if let Some(lock) = lock {
                        self.cache.unlock(lock);
                    }
                    return;
                }
                let Some(s) = self.seqs.get_mut(&key) else {
                    return;
                };
                if loaded < s.pages.len() - s.tree_pages {
                    if let Some(t) = self.tiers.as_mut() {
                        t.stats.short_loads += 1;
                    }
                }
                s.computed += loaded * ps;
                s.offloaded = s.computed / ps;
                s.phase = Phase::Running;
                if first {
                    // The loaded pages come in sequence order, but their tiers interleave;
                    // the prompt's share (the last page may hold output) is split in
                    // proportion, host first, then remote, then disk.
                    let extra = (loaded * ps).min(s.shared.prompt_len - s.cached.device);
                    let from_host = (host * ps).min(extra);
                    let from_remote = (remote * ps).min(extra - from_host);
                    let from_disk = extra - from_host - from_remote;
                    s.cached.host += from_host;
                    s.cached.remote += from_remote;
                    s.cached.disk += from_disk;
                    s.cached_tokens = Some(s.cached.total());
                    self.stats.cached_tokens += extra as u64;
                    self.stats.cached_host_tokens += from_host as u64;
                    self.stats.cached_remote_tokens += from_remote as u64;
                    self.stats.cached_disk_tokens += from_disk as u64;
                }
            }
        }
    }

    /// The tokens of `tokens` cached on the device, and the names of the full pages after
    /// them that the lower tiers hold, from the first (the lower-tier hit); one walk of the
    /// tree. Nothing without lower tiers.
    pub(super) fn lower_hit(&mut self, ns: Namespace, tokens: &[u32]) -> (usize, Vec<PageHash>) {
        let Some(t) = &self.tiers else {
            return (0, Vec::new());
        };
        let store = t.cfg.store.clone();
        let (device_len, mut hashes) = self.cache.lower_candidates(ns, tokens);
        let n = store.exists(&hashes);
        hashes.truncate(n);
        (device_len, hashes)
    }

    /// On arrival: the pages the lower tiers hold beyond the device match are read into
    /// memory while the request waits, and the remote tier (if any) is asked for the full
    /// pages after those.
    pub(super) fn prefetch_on_arrival(
        &mut self,
        id: RequestId,
        ns: Namespace,
        prompt: &[u32],
        now: Instant,
    ) {
        if self.tiers.is_none() || prompt.len() < 2 {
            return;
        }
        let limit = prompt.len() - 1;
        let Some(t) = &self.tiers else {
            return;
        };
        let (store, with_remote) = (t.cfg.store.clone(), t.cfg.remote.is_some());
        let (_, mut hashes) = self.cache.lower_candidates(ns, &prompt[..limit]);
        let n = store.exists(&hashes);
        let remote = if with_remote {
            hashes.split_off(n)
        } else {
            hashes.truncate(n);
            Vec::new()
        };
        if hashes.is_empty() && remote.is_empty() {
            return;
        }
        if let Some(t) = self.tiers.as_mut() {
            t.prefetching.insert(id, now);
            t.jobs.push_back(IoJob::Prefetch { id, hashes, remote });
        }
    }

    /// Whether admission waits for request `id`'s prefetch (per the prefetch policy).
    pub(super) fn prefetch_holds(&self, id: RequestId, now: Instant) -> bool {
        let Some(t) = &self.tiers else {
            return false;
        };
        let Some(&since) = t.prefetching.get(&id) else {
            return false;
        };
        match t.cfg.prefetch_policy {
            PrefetchPolicy::BestEffort => false,
            PrefetchPolicy::WaitComplete => true,
            PrefetchPolicy::Timeout => now.duration_since(since) < t.cfg.prefetch_timeout,
        }
    }

    /// The request ended: a prefetch still running for it no longer holds anything back.
    pub(super) fn forget_prefetch(&mut self, id: RequestId) {
        if let Some(t) = self.tiers.as_mut() {
            t.prefetching.remove(&id);
        }
    }

    /// Hands a load to the I/O thread: `pages` (fresh) receive the pages named `hashes`,
    /// which continue the sequence's device match.
    pub(super) fn start_load(
        &mut self,
        key: SeqKey,
        pages: Vec<u32>,
        hashes: Vec<PageHash>,
        first: bool,
    ) {
        let s = self.seqs.get_mut(&key).expect("admitted key");
        s.pages.extend_from_slice(&pages);
        s.phase = Phase::Loading;
        let t = self.tiers.as_mut().expect("a load needs lower tiers");
        t.loading.insert(key, first);
        t.jobs.push_back(IoJob::Load { key, pages, hashes });
    }

    /// A sequence ended while its load runs: its pages and lock wait for the load's end.
    pub(super) fn orphan_loading(&mut self, key: SeqKey) {
        let Some(s) = self.seqs.get_mut(&key) else {
            return;
        };
        let pages = std::mem::take(&mut s.pages);
        let lock = s.lock.take();
        // The tree's pages among them go back with the lock, not to the free list.
        let own = pages[s.tree_pages.min(pages.len())..].to_vec();
        s.tree_pages = 0;
        if let Some(t) = self.tiers.as_mut() {
            t.orphans.insert(key, (own, lock));
        }
    }

    /// Write-through: the sequence's first `full` pages are in the tree now; those beyond
    /// what it already offloaded are copied down (write-through policy only).
    pub(super) fn offload_inserted(&mut self, key: SeqKey, full: usize) {
        let ps = self.cfg.page_size;
        let Some(t) = &self.tiers else {
            return;
        };
        if t.cfg.write_policy != WritePolicy::WriteThrough {
            return;
        }
        let Some(s) = self.seqs.get(&key) else {
            return;
        };
        let from = s.offloaded;
        if full <= from {
            return;
        }
        let (ns, tokens) = (s.shared.namespace, s.tokens[..full * ps].to_vec());
        self.pin_and_write(ns, &tokens, from);
        if let Some(s) = self.seqs.get_mut(&key) {
            s.offloaded = full;
        }
    }

    /// Selective write-through: a prefix hit on the device is worth keeping below it too.
    pub(super) fn offload_hit(&mut self, ns: Namespace, tokens: &[u32]) {
        let selective = self
            .tiers
            .as_ref()
            .is_some_and(|t| t.cfg.write_policy == WritePolicy::WriteThroughSelective);
        if selective {
            self.pin_and_write(ns, tokens, 0);
        }
    }

    /// Pins the cached path of `tokens` and queues a write of its pages from `from` on.
    fn pin_and_write(&mut self, ns: Namespace, tokens: &[u32], from: usize) {
        let Some((lock, pages, hashes)) = self.cache.pin(ns, tokens) else {
            return;
        };
        let Some(t) = self.tiers.as_mut() else {
            self.cache.unlock(lock);
            return;
        };
        if from >= pages.len() || pages.len() != hashes.len() {
            self.cache.unlock(lock);
            return;
        }
        let pin = t.next_pin;
        t.next_pin += 1;
        t.pins.insert(pin, lock);
        t.jobs.push_back(IoJob::Write {
            pin,
            pages: pages[from..].to_vec(),
            hashes: hashes[from..].to_vec(),
        });
    }
}
