//! Full invariant checks, for tests and debug builds.

use crate::cache::RadixCache;
use crate::hash::page_hash;
use crate::pool::PageState;
use crate::types::NodeId;

/// A broken invariant found by [`RadixCache::check_invariants`]: a bug in this crate, or a
/// caller that handed the cache pages it did not own behind its back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("radix cache invariant broken: {0}")]
pub struct InvariantViolation(pub String);

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(InvariantViolation(format!($($arg)*)));
        }
    };
}

impl RadixCache {
    /// Checks every structural invariant in O(tree + pool): edges page-aligned and keyed by
    /// their first page, parent links, lock counts covering the locks below, evictable +
    /// protected = tokens in the tree, the evictable set holding exactly the unlocked leaves
    /// under their current keys, computed page hashes matching the format, and every page
    /// owned by exactly one of the free list, the tree and the callers.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let ps = self.cfg.page_size;
        let total = self.pool.total_pages();
        let tracked = self.pool.tracks_pages();
        let mut seen = vec![0u8; total];
        let (mut evictable, mut protected, mut leaves, mut root_locks) = (0, 0, 0, 0usize);
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.alive {
                continue;
            }
            let id = NodeId(i as u32, n.gen);
            if n.is_root {
                ensure!(
                    self.roots.get(&n.namespace) == Some(&id) || self.void == Some(id),
                    "root {i} not registered"
                );
                ensure!(
                    self.void != Some(id) || n.is_leaf(),
                    "the void root has children"
                );
                ensure!(
                    n.tokens.is_empty() && n.pages.is_empty(),
                    "root {i} holds tokens"
                );
                root_locks += n.lock as usize;
            } else {
                ensure!(!n.tokens.is_empty(), "node {i} has an empty edge");
                ensure!(
                    n.tokens.len() == n.pages.len() * ps,
                    "node {i} edge not page-aligned"
                );
                let p = &self.nodes[n.parent.idx()];
                ensure!(p.alive, "node {i} has a dead parent");
                ensure!(p.namespace == n.namespace, "node {i} crosses namespaces");
                ensure!(
                    p.children.get(n.tokens.first_key(ps)) == Some(id),
                    "node {i} is not its parent's child under its first page"
                );
                if n.lock > 0 {
                    protected += n.tokens.len();
                } else {
                    evictable += n.tokens.len();
                }
                for pg in n.pages.iter() {
                    ensure!(
                        pg.index() < total,
                        "node {i} holds page {} outside the pool",
                        pg.0
                    );
                    ensure!(seen[pg.index()] == 0, "page {} is in the tree twice", pg.0);
                    seen[pg.index()] = 1;
                    ensure!(
                        !tracked || self.pool.state(pg) == Some(PageState::Tree),
                        "tree page {} is not marked as the tree's",
                        pg.0
                    );
                }
                if !n.hashes.is_empty() {
                    ensure!(
                        n.hashes.len() == n.pages.len(),
                        "node {i} has partial hashes"
                    );
                    let mut prev = if p.is_root {
                        self.cfg.root_hash
                    } else {
                        p.hashes.last().copied()
                    };
                    ensure!(
                        p.is_root || prev.is_some(),
                        "node {i} hashed below an unhashed parent"
                    );
                    let tokens = n.tokens.to_vec();
                    for (h, page) in n.hashes.iter().zip(tokens.chunks_exact(ps)) {
                        let want = page_hash(prev, n.namespace, page);
                        ensure!(*h == want, "node {i} has a wrong page hash");
                        prev = Some(want);
                    }
                }
            }
            let mut child_locks = 0usize;
            let mut bad = None;
            n.children.for_each(|k, c| {
                let cn = &self.nodes[c.idx()];
                if !cn.alive
                    || cn.parent != id
                    || cn.tokens.len() < ps
                    || cn.tokens.first_key(ps) != k
                {
                    bad = Some(c);
                }
                child_locks += cn.lock as usize;
            });
            if let Some(c) = bad {
                return Err(InvariantViolation(format!(
                    "node {i} has a stray child {}",
                    c.0
                )));
            }
            ensure!(
                n.lock as usize >= child_locks,
                "node {i} locked less than its children"
            );
            let listed = !n.is_root && n.lock == 0 && n.is_leaf();
            if listed {
                leaves += 1;
                let (a, b) = n.evict_key.unwrap_or((u64::MAX, u64::MAX));
                ensure!(
                    n.evict_key.is_some() && self.evictable.contains(&(a, b, id.0)),
                    "unlocked leaf {i} is not in the evictable set"
                );
                ensure!(
                    (a, b) <= self.current_key(id),
                    "leaf {i} is listed under a key above its current one"
                );
            } else {
                ensure!(
                    n.evict_key.is_none(),
                    "node {i} is in the evictable set but not evictable"
                );
            }
        }
        ensure!(
            self.evictable.len() == leaves,
            "evictable set has stale entries"
        );
        ensure!(
            root_locks == self.held_locks,
            "root locks {root_locks} != held {}",
            self.held_locks
        );
        ensure!(
            evictable == self.evictable_tokens,
            "evictable tokens {} != {evictable}",
            self.evictable_tokens
        );
        ensure!(
            protected == self.protected_tokens,
            "protected tokens {} != {protected}",
            self.protected_tokens
        );
        ensure!(
            evictable + protected == self.tree_tokens,
            "evictable + protected != tokens in tree"
        );
        let mut free = 0;
        let mut double = None;
        self.pool.for_each_free(|p| {
            if seen[p.index()] != 0 {
                double = Some(p);
            }
            seen[p.index()] = 2;
            free += 1;
        });
        if let Some(p) = double {
            return Err(InvariantViolation(format!(
                "page {} is both free and elsewhere",
                p.0
            )));
        }
        ensure!(
            free == self.pool.free_pages(),
            "free count {} != {free}",
            self.pool.free_pages()
        );
        let tree = seen.iter().filter(|&&s| s == 1).count();
        ensure!(
            tree == self.pool.tree_pages(),
            "tree holds {tree} pages, pool counts {}",
            self.pool.tree_pages()
        );
        if !tracked {
            return Ok(());
        }
        let mut caller = 0;
        for (i, s) in seen.iter().enumerate() {
            let state = self.pool.state(crate::types::PageId(i as u32));
            match s {
                0 => {
                    ensure!(
                        state == Some(PageState::Caller),
                        "page {i} is nowhere but not held"
                    );
                    caller += 1;
                }
                2 => ensure!(
                    state == Some(PageState::Free),
                    "free page {i} not marked free"
                ),
                _ => {}
            }
        }
        ensure!(
            caller == self.pool.caller_pages(),
            "caller count {} != {caller}",
            self.pool.caller_pages()
        );
        Ok(())
    }
}
