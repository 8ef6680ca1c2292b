//! Eviction and reset.

use crate::cache::{CacheError, RadixCache};
use crate::events::KvEvent;
use crate::node::Children;
use crate::pages::Pages;
use crate::tokens::Tokens;
use crate::types::NodeId;

impl RadixCache {
    /// Frees at least `n_pages` pages from unlocked leaves, in the policy's order, if that
    /// many are evictable; returns the pages freed (fewer only when nothing more is
    /// evictable). Takes the tail pages of the last leaf it touches rather than the whole
    /// node, so it frees exactly `n_pages` when it can. Locked nodes and their ancestors are
    /// never touched. O(log n) per node removed.
    pub fn evict(&mut self, n_pages: usize) -> usize {
        let ps = self.cfg.page_size;
        let mut freed = 0;
        while freed < n_pages {
            let Some(&(a, b, raw)) = self.evictable.first() else {
                break;
            };
            let id = NodeId(raw, self.nodes[raw as usize].gen);
            let key = self.current_key(id);
            if key != (a, b) {
                // Used since it was listed: file it under its current key and look again.
                self.evictable.pop_first();
                self.evictable.insert((key.0, key.1, raw));
                self.nodes[id.idx()].evict_key = Some(key);
                continue;
            }
            let want = n_pages - freed;
            if self.cfg.demote {
                self.ensure_hashes(id);
                let n = &self.nodes[id.idx()];
                let keep = n.pages.len().saturating_sub(want);
                let gone = n.hashes[keep..]
                    .iter()
                    .copied()
                    .zip(n.pages.iter().skip(keep));
                self.demoted.extend(gone);
            }
            let n = &mut self.nodes[id.idx()];
            if n.pages.len() > want {
                // Trim the leaf's tail: it stays the least valuable leaf, now shorter.
                let keep = n.pages.len() - want;
                let pages = n.pages.split_off(keep);
                n.tokens.truncate(keep * ps);
                let hashes = if n.hashes.is_empty() {
                    Vec::new()
                } else {
                    n.hashes.split_off(keep)
                };
                let ns = n.namespace;
                self.evictable_tokens -= want * ps;
                self.tree_tokens -= want * ps;
                self.pool.release_from_tree(pages);
                if self.cfg.events {
                    self.events.push(KvEvent::Removed {
                        namespace: ns,
                        hashes,
                    });
                }
                freed += want;
            } else {
                freed += self.remove_leaf(id);
            }
        }
        self.stats.evicted_pages += freed as u64;
        self.debug_check_counts();
        freed
    }

    /// Removes an unlocked leaf, returns its pages to the pool; returns how many.
    fn remove_leaf(&mut self, id: NodeId) -> usize {
        let ps = self.cfg.page_size;
        let n = &mut self.nodes[id.idx()];
        debug_assert!(n.alive && !n.is_root && n.lock == 0 && n.is_leaf());
        if let Some((a, b)) = n.evict_key.take() {
            self.evictable.remove(&(a, b, id.0));
        }
        let key = n.tokens.first_key(ps);
        let parent = n.parent;
        let ns = n.namespace;
        let count = n.pages.len();
        let pages = std::mem::replace(&mut n.pages, Pages::EMPTY);
        let hashes = std::mem::take(&mut n.hashes);
        self.evictable_tokens -= n.tokens.len();
        self.tree_tokens -= n.tokens.len();
        n.tokens = Tokens::default();
        n.alive = false;
        self.free_nodes.push(id);
        self.pool.release_from_tree(pages);
        if self.cfg.events {
            self.events.push(KvEvent::Removed {
                namespace: ns,
                hashes,
            });
        }
        let p = &mut self.nodes[parent.idx()];
        p.children.remove(key);
        if p.is_root && p.is_leaf() && p.lock == 0 {
            // An empty namespace: drop its root so that namespaces do not accumulate.
            p.alive = false;
            p.children = Children::None;
            self.roots.remove(&ns);
            self.free_nodes.push(parent);
        } else {
            self.refresh(parent);
        }
        count
    }

    /// Empties the tree (`/flush_cache`): every tree page goes back to the pool and an
    /// [`KvEvent::AllCleared`] is recorded. Refused while any lock is held. Pages held by
    /// callers stay theirs.
    pub fn reset(&mut self) -> Result<(), CacheError> {
        if self.held_locks > 0 {
            return Err(CacheError::Locked(self.held_locks));
        }
        // Slots stay (with their generations) so that ids from before the reset name nothing.
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if !n.alive {
                continue;
            }
            self.pool
                .release_from_tree(std::mem::replace(&mut n.pages, Pages::EMPTY));
            n.tokens = Tokens::default();
            n.hashes = Vec::new();
            n.children = Children::None;
            n.evict_key = None;
            n.lock = 0;
            n.alive = false;
            self.free_nodes.push(NodeId(i as u32, n.gen));
        }
        self.roots.clear();
        self.void = None;
        self.evictable.clear();
        self.evictable_tokens = 0;
        self.protected_tokens = 0;
        self.tree_tokens = 0;
        if self.cfg.events {
            self.events.push(KvEvent::AllCleared);
        }
        self.debug_check_counts();
        Ok(())
    }
}
