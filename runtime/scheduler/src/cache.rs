//! The scheduler's view of the radix cache: page ids as the executor's `u32`s, locks that
//! move down the tree as a running sequence inserts its pages, and page accounting.
//!
//! Every radix-cache error here would be a scheduler bug (a page freed twice, a foreign lock);
//! they are counted in [`CacheStats::internal_errors`] and surface in `/get_server_info`
//! rather than panicking the scheduler thread.

use super::SchedError;
use sglrs_radix_cache::{
    page_hash, CacheConfig, LockHandle, Namespace, PageHash, PageId, RadixCache,
};

/// A lock on a cache node; give it back with [`PageCache::unlock`].
pub type Lock = LockHandle;

/// Page accounting, for `/get_server_info` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Pages in the pool.
    pub total_pages: usize,
    /// Pages on the free list.
    pub free_pages: usize,
    /// Pages held by running sequences (not in the tree).
    pub running_pages: usize,
    /// Pages owned by the radix tree.
    pub tree_pages: usize,
    /// Tokens in unlocked tree nodes.
    pub evictable_tokens: usize,
    /// Locks held by running sequences.
    pub held_locks: usize,
    /// Pages evicted so far.
    pub evicted_pages: u64,
    /// Radix-cache calls that failed (a scheduler bug if non-zero).
    pub internal_errors: u64,
}

/// A match that is locked in the tree.
pub(crate) struct LockedMatch {
    /// Matched tokens (a multiple of the page size).
    pub len: usize,
    /// Page ids of the match.
    pub pages: Vec<u32>,
    /// The lock protecting them.
    pub lock: Lock,
}

/// The radix cache plus its page pool, in the scheduler's terms.
pub(crate) struct PageCache {
    tree: RadixCache,
    scratch: Vec<PageId>,
    errors: u64,
    /// Pages evicted (with `demote`), for a write-back tier to copy down.
    demoted: Vec<(PageHash, u32)>,
}

fn ids(pages: &[PageId]) -> Vec<u32> {
    pages.iter().map(|p| p.0).collect()
}

fn page_ids(pages: &[u32]) -> Vec<PageId> {
    pages.iter().map(|&p| PageId(p)).collect()
}

impl PageCache {
    /// A cache over `num_pages` pages; `root` chains every sequence's first page hash on
    /// the model fingerprint (the lower tiers' page names).
    /// With `demote`, evicted pages are kept for [`PageCache::take_demoted`]; with `events`,
    /// the tree records [`sglrs_radix_cache::KvEvent`]s for [`PageCache::drain_events`].
    pub fn new(
        num_pages: usize,
        page_size: usize,
        root: Option<PageHash>,
        demote: bool,
        events: bool,
    ) -> Result<Self, SchedError> {
        let mut cfg = CacheConfig::new(num_pages, page_size)
            .with_demote(demote)
            .with_events(events);
        if let Some(root) = root {
            cfg = cfg.with_root_hash(root);
        }
        let tree = RadixCache::new(cfg).map_err(|e| SchedError::Config(e.to_string()))?;
        Ok(Self {
            tree,
            scratch: Vec::new(),
            errors: 0,
            demoted: Vec::new(),
        })
    }

    /// The KV events recorded since the last call.
    pub fn drain_events(&mut self) -> Vec<sglrs_radix_cache::KvEvent> {
        self.tree.drain_events().collect()
    }

    fn note<T, E: std::fmt::Display>(&mut self, r: Result<T, E>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(_) => {
                self.errors += 1;
                None
            }
        }
    }

    /// Cached prefix length of `tokens` and a key of the node it ends at (for the policies).
    pub fn peek(&mut self, ns: Namespace, tokens: &[u32]) -> (usize, u64) {
        self.scratch.clear();
        let m = self.tree.match_prefix(ns, tokens, &mut self.scratch);
        (m.len, u64::from(m.position.node.raw()))
    }

    /// Matches the longest cached prefix of `tokens` and locks it.
    pub fn match_and_lock(&mut self, ns: Namespace, tokens: &[u32]) -> LockedMatch {
        self.scratch.clear();
        let m = self.tree.match_prefix(ns, tokens, &mut self.scratch);
        let pages = ids(&self.scratch);
        // The node was found a moment ago, so locking it cannot fail.
        let lock = self.tree.lock(m.position.node);
        match lock {
            Ok(lock) => LockedMatch {
                len: m.len,
                pages,
                lock,
            },
            Err(_) => {
                self.errors += 1;
                // Fall back to no match, locked at the namespace root.
                self.scratch.clear();
                let root = self.tree.match_prefix(ns, &[], &mut self.scratch);
                let lock = self
                    .tree
                    .lock(root.position.node)
                    .expect("a namespace root always exists");
                LockedMatch {
                    len: 0,
                    pages: Vec::new(),
                    lock,
                }
            }
        }
    }

    /// The tokens of `tokens`' longest cached prefix on the device, and the names of the
    /// full pages of `tokens` after it (where a lower tier may continue the match).
    pub fn lower_candidates(&mut self, ns: Namespace, tokens: &[u32]) -> (usize, Vec<PageHash>) {
        self.scratch.clear();
        let m = self.tree.match_prefix(ns, tokens, &mut self.scratch);
        let mut hashes = Vec::new();
        let r = self.tree.page_hashes(m.position, &mut hashes);
        if self.note(r).is_none() {
            return (m.len, Vec::new());
        }
        let ps = self.tree.page_size();
        let mut prev = hashes.last().copied().or(self.tree.config().root_hash);
        let out = tokens[m.len..]
            .chunks_exact(ps)
            .map(|page| {
                let h = page_hash(prev, ns, page);
                prev = Some(h);
                h
            })
            .collect();
        (m.len, out)
    }

    /// Locks the cached path of `tokens` (all of it must be cached) and returns the lock,
    /// the path's page ids and their hashes.
    pub fn pin(
        &mut self,
        ns: Namespace,
        tokens: &[u32],
    ) -> Option<(Lock, Vec<u32>, Vec<PageHash>)> {
        self.scratch.clear();
        let m = self.tree.match_prefix(ns, tokens, &mut self.scratch);
        let pages = ids(&self.scratch);
        let mut hashes = Vec::new();
        let r = self.tree.page_hashes(m.position, &mut hashes);
        self.note(r)?;
        let lock = self.tree.lock(m.position.node);
        let lock = self.note(lock)?;
        Some((lock, pages, hashes))
    }

    /// Releases a lock.
    pub fn unlock(&mut self, lock: Lock) {
        let r = self.tree.unlock(lock);
        self.note(r);
    }

    /// Pages that could be had now: free plus evictable.
    pub fn available(&self) -> usize {
        let s = self.tree.stats();
        s.free_pages + s.evictable_tokens / self.tree.page_size()
    }

    /// Pages free now (without evicting anything).
    pub fn free_pages(&self) -> usize {
        self.tree.stats().free_pages
    }

    /// `n` pages for a running sequence, evicting unlocked cache pages if needed.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        let mut out = Vec::with_capacity(n);
        let r = self.tree.alloc(n, &mut out);
        self.demoted
            .extend(self.tree.drain_demoted().into_iter().map(|(h, p)| (h, p.0)));
        r.ok()?;
        Some(ids(&out))
    }

    /// Pages evicted since the last call, with their names (write-back).
    pub fn take_demoted(&mut self) -> Vec<(PageHash, u32)> {
        std::mem::take(&mut self.demoted)
    }

    /// Returns a sequence's own pages to the pool.
    pub fn free(&mut self, pages: &[u32]) {
        if pages.is_empty() {
            return;
        }
        let r = self.tree.free(&page_ids(pages));
        self.note(r);
    }

    /// Inserts a finished (or retracted) sequence's full pages: `pages[..tree_pages]` are
    /// already the tree's, the rest the sequence's own. Hands back a lock on the inserted
    /// path (which the caller then releases) after releasing `old`.
    pub fn insert(
        &mut self,
        ns: Namespace,
        tokens: &[u32],
        pages: &[u32],
        _tree_pages: usize,
        old: Lock,
    ) -> Lock {
        let (lock, _) = self.insert_running(ns, tokens, pages, _tree_pages, old);
        lock
    }

    /// Inserts a running sequence's full pages and moves its lock to the end of the inserted
    /// path. Returns the new lock and the tree's page ids for `tokens` (the sequence must use
    /// these from now on: the tree may already have held some of the prefix).
    pub fn insert_running(
        &mut self,
        ns: Namespace,
        tokens: &[u32],
        pages: &[u32],
        _tree_pages: usize,
        old: Lock,
    ) -> (Lock, Vec<u32>) {
        if tokens.is_empty() {
            return (old, Vec::new());
        }
        let mut returned = Vec::new();
        let r = self
            .tree
            .insert(ns, tokens, &page_ids(pages), &mut returned);
        if self.note(r).is_none() {
            return (old, pages.to_vec());
        }
        if !returned.is_empty() {
            let r = self.tree.free(&returned);
            self.note(r);
        }
        self.scratch.clear();
        let m = self.tree.match_prefix(ns, tokens, &mut self.scratch);
        let canonical = ids(&self.scratch);
        match self.tree.lock(m.position.node) {
            Ok(lock) => {
                self.unlock(old);
                (lock, canonical)
            }
            Err(_) => {
                self.errors += 1;
                (old, canonical)
            }
        }
    }

    /// Panics when the tree breaks one of its invariants (tests).
    #[cfg(test)]
    pub fn check_invariants(&self) {
        self.tree
            .check_invariants()
            .expect("radix cache invariants");
    }

    /// Drops every cached page (only called with no locks held).
    pub fn flush(&mut self) {
        let r = self.tree.reset();
        self.note(r);
    }

    /// Page accounting.
    pub fn stats(&self) -> CacheStats {
        let s = self.tree.stats();
        let pool = self.tree.pool();
        CacheStats {
            total_pages: pool.total_pages(),
            free_pages: pool.free_pages(),
            running_pages: pool.caller_pages(),
            tree_pages: pool.tree_pages(),
            evictable_tokens: s.evictable_tokens,
            held_locks: s.held_locks,
            evicted_pages: s.evicted_pages,
            internal_errors: self.errors,
        }
    }
}
