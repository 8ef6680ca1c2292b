//! KV events for cache-aware routers.

use crate::tier::PageHash;
use crate::types::{Namespace, TokenId};

/// A change to the set of cached pages, as cache-aware routers (sglang-router, Dynamo's
/// kv-router, llm-d) consume them. Emitted only when [`crate::CacheConfig::events`] is on,
/// and drained by the caller with [`crate::RadixCache::drain_events`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Pages were added to the tree: one edge of `hashes.len()` full pages.
    Stored {
        /// The namespace of the pages.
        namespace: Namespace,
        /// Hash of the page before the first stored one (`None` at the start of a sequence).
        parent: Option<PageHash>,
        /// Hashes of the stored pages, in order.
        hashes: Vec<PageHash>,
        /// The token ids of the stored pages (`page_size` per hash).
        tokens: Vec<TokenId>,
        /// Tokens per page.
        page_size: usize,
    },
    /// Pages were removed from the tree (evicted).
    Removed {
        /// The namespace of the pages.
        namespace: Namespace,
        /// Hashes of the removed pages.
        hashes: Vec<PageHash>,
    },
    /// Every page was removed (`/flush_cache`).
    AllCleared,
}
