//! KV cache events: the radix cache's record of pages stored and removed, handed after every
//! step to a [`KvEventSink`] (the server's publisher for cache-aware routers such as llm-d).

use std::sync::Arc;

pub use sglrs_radix_cache::store::StoreEvent;
pub use sglrs_radix_cache::KvEvent;
use sglrs_radix_cache::PageHash;

/// Where the scheduler's KV events go. Called on the scheduler thread: must not block.
pub trait KvEventSink: Send + Sync {
    /// The events of one step (at least one of either kind), each kind in the order it
    /// happened: the device tier's (the radix tree), then the lower tiers' (the page store
    /// of the hierarchical cache, when it is on).
    fn publish(&self, device: Vec<KvEvent>, tiers: Vec<StoreEvent>);
}

/// KV events on: the sink, and the hash every sequence's first page chains on (the model
/// fingerprint, so two models' pages never share a hash).
#[derive(Clone)]
pub struct KvEventsConfig {
    /// Receives the events.
    pub sink: Arc<dyn KvEventSink>,
    /// The root of the page hash chain; the hierarchical cache's, when it is on, wins.
    pub root_hash: PageHash,
}

impl std::fmt::Debug for KvEventsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEventsConfig")
            .field("root_hash", &format_args!("{:032x}", self.root_hash.0))
            .finish_non_exhaustive()
    }
}
