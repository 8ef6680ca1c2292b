//! Locks: counted along the path to the root, released only through the handle.

use crate::cache::{CacheError, RadixCache};
use crate::types::NodeId;

/// A lock on a node and its path to the root: the node's pages cannot be evicted until the
/// handle is given back to [`RadixCache::unlock`]. Dropping a handle without unlocking is a
/// leaked lock: a panic in debug builds, and visible as [`CacheStats::held_locks`] otherwise.
#[must_use = "a lock must be released with RadixCache::unlock"]
#[derive(Debug)]
pub struct LockHandle {
    cache: u32,
    node: NodeId,
    armed: bool,
}

impl LockHandle {
    /// The locked node.
    pub fn node(&self) -> NodeId {
        self.node
    }
}

impl Drop for LockHandle {
    fn drop(&mut self) {
        if cfg!(debug_assertions) && self.armed && !std::thread::panicking() {
            panic!(
                "leaked radix cache lock on node {}: dropped without unlock",
                self.node.0
            );
        }
    }
}

impl RadixCache {
    /// Locks `node` and its path to the root against eviction.
    pub fn lock(&mut self, node: NodeId) -> Result<LockHandle, CacheError> {
        if self.live(node).is_none() {
            return Err(CacheError::NoSuchNode(node.0));
        }
        let mut id = node;
        loop {
            let n = &mut self.nodes[id.idx()];
            if n.lock == 0 && !n.is_root {
                self.evictable_tokens -= n.tokens.len();
                self.protected_tokens += n.tokens.len();
            }
            n.lock += 1;
            let (root, parent, listed) = (n.is_root, n.parent, n.evict_key.is_some());
            if listed {
                self.refresh(id);
            }
            if root {
                break;
            }
            id = parent;
        }
        self.held_locks += 1;
        self.debug_check_counts();
        Ok(LockHandle {
            cache: self.id,
            node,
            armed: true,
        })
    }

    /// Releases a lock taken by [`RadixCache::lock`].
    pub fn unlock(&mut self, mut handle: LockHandle) -> Result<(), CacheError> {
        handle.armed = false;
        if handle.cache != self.id {
            return Err(CacheError::ForeignHandle);
        }
        let node = handle.node;
        match self.live(node) {
            Some(n) if n.lock > 0 => {}
            _ => return Err(CacheError::NoSuchNode(node.0)),
        }
        let mut id = node;
        loop {
            let n = &mut self.nodes[id.idx()];
            n.lock -= 1;
            let (root, parent, freed) = (n.is_root, n.parent, n.lock == 0);
            if freed && !root {
                self.evictable_tokens += n.tokens.len();
                self.protected_tokens -= n.tokens.len();
                self.refresh(id);
            }
            if root {
                break;
            }
            id = parent;
        }
        let r = &mut self.nodes[id.idx()];
        if r.lock == 0 && r.is_leaf() && Some(id) != self.void {
            // The last lock on an emptied namespace: drop its root.
            r.alive = false;
            let ns = r.namespace;
            self.roots.remove(&ns);
            self.free_nodes.push(id);
        }
        self.held_locks -= 1;
        self.debug_check_counts();
        Ok(())
    }
}
