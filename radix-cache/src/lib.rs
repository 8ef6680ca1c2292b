//! RadixAttention index over a paged KV cache.
//!
//! A request that shares a prefix with earlier work finds the KV pages of that prefix here,
//! holds them while it runs, and adds its own pages when it finishes; under memory pressure
//! the least valuable unlocked pages are evicted. Pure data structure: no tokio, no tensors,
//! no pyo3; time is a logical tick.
//!
//! # Key types
//!
//! - [`RadixCache`]: one radix tree per [`Namespace`] over token ids. Every edge is a whole
//!   number of pages; a node stores its edge's tokens contiguously (two bytes a token when
//!   they all fit, four otherwise), its [`PageId`]s (as one run `start..start + len` when they
//!   are consecutive, as a list otherwise), lazily its [`PageHash`]es, a lock count and its
//!   [`TierSet`]. Nodes live in an arena (`Vec` + free list), children are keyed by their
//!   first page.
//! - [`PagePool`]: the page-id allocator, owned by the cache; it records for every page
//!   whether it is free, held by a caller or owned by the tree, so misuse is an error.
//! - [`LockHandle`]: a lock on a node and its path to the root, released only by
//!   [`RadixCache::unlock`] (a leaked handle panics in debug builds).
//! - [`KvEvent`]: pages stored / removed / all cleared, for cache-aware routers.
//!
//! # Usage loop (one request)
//!
//! 1. [`RadixCache::match_prefix`] appends the cached pages of the longest page-aligned
//!    prefix to the request's page list and returns where it ended. Reads never split nodes,
//!    so repeated partial lookups cannot fragment the tree.
//! 2. [`RadixCache::lock`] that position; [`RadixCache::alloc`] pages for the rest (evicting
//!    if needed) and run the model.
//! 3. [`RadixCache::insert`] the request's tokens with all its pages; pages it hands back
//!    (duplicates of pages cached meanwhile, the partial tail page) go to
//!    [`RadixCache::free`]. Then [`RadixCache::unlock`].
//!
//! ```
//! use sglrs_radix_cache::{CacheConfig, Namespace, RadixCache};
//!
//! let mut cache = RadixCache::new(CacheConfig::new(1024, 4))?;
//! let ns = Namespace::DEFAULT;
//! let prompt: Vec<u32> = (0..10).collect(); // 2 full pages + a 2-token tail
//!
//! let mut pages = Vec::new();
//! let hit = cache.match_prefix(ns, &prompt, &mut pages);
//! assert_eq!(hit.len, 0);
//! let lock = cache.lock(hit.position.node)?;
//! cache.alloc(3 - pages.len(), &mut pages)?; // 3 pages cover 10 tokens
//! // ... prefill and decode into `pages` ...
//! let mut give_back = Vec::new();
//! let ins = cache.insert(ns, &prompt, &pages, &mut give_back)?;
//! assert_eq!(ins.stored_len, 8); // only whole pages are cached
//! assert_eq!(give_back, vec![pages[2]]); // the tail page stays the caller's
//! cache.free(&give_back)?;
//! cache.unlock(lock)?;
//!
//! let mut again = Vec::new();
//! assert_eq!(cache.match_prefix(ns, &prompt, &mut again).len, 8);
//! assert_eq!(again, pages[..2]);
//! cache.check_invariants()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Page hash format, version 1
//!
//! Each full page is named by a [`PageHash`] (`u128`), chained from the first page of a
//! sequence; this names pages in the disk tier, the remote store and on the wire, so it is
//! stable across processes, machines and restarts. For page `i` of a sequence in namespace
//! `ns`:
//!
//! ```text
//! bytes_i = 0x01                          // format version (PAGE_HASH_VERSION), 1 byte
//!         ‖ parent_i                      // hash of page i-1 as 16 bytes little endian;
//!                                         // for page 0 the cache's root hash (the model
//!                                         // fingerprint, CacheConfig::root_hash), or 16
//!                                         // zero bytes without one
//!         ‖ ns                            // Namespace as u64 little endian, 8 bytes
//!         ‖ token_0 ‖ … ‖ token_{P-1}     // the page's P = page_size token ids, u32 LE each
//! hash_i  = xxh3_128_with_seed(bytes_i, seed = 0x31762d73726c6773)
//!           // the seed is the ASCII "sglrs-v1" read as a little-endian u64 (PAGE_HASH_SEED)
//! ```
//!
//! On the wire and in file names a hash is its 16 bytes little endian
//! ([`PageHash::to_bytes`]). A namespace named by a string is
//! `xxh3_64_with_seed(utf8, 0x736e2d73726c6773)` (`"sglrs-ns"`; the empty name is namespace
//! 0), see [`Namespace::from_name`]. Any change to this layout bumps the version byte.
//!
//! # Invariants
//!
//! Evictable + protected tokens = tokens in the tree; every page is owned by exactly one of
//! the free list, the tree and a caller; a node's lock count covers every lock at or below
//! it. Cheap counters are asserted after every operation in debug builds;
//! [`RadixCache::check_invariants`] checks everything (tests call it after every step).
#![warn(missing_docs)]

mod cache;
mod check;
pub mod checksum;
mod events;
mod evict;
pub mod hash;
pub mod layout;
mod lock;
mod node;
mod pages;
pub mod pool;
pub(crate) mod prefetch;
pub mod store;
pub mod tier;
mod tokens;
mod types;

#[cfg(test)]
mod tests;

pub use cache::{
    CacheConfig, CacheError, CacheStats, EvictionPolicy, InsertResult, MatchResult, Position,
    RadixCache,
};
pub use check::InvariantViolation;
pub use events::KvEvent;
pub use hash::{page_hash, PAGE_HASH_SEED, PAGE_HASH_VERSION};
pub use layout::{KvDtype, KvLayout};
pub use lock::LockHandle;
pub use node::TierSet;
pub use pool::{PagePool, PageState, PoolError};
pub use tier::{KvStore, PageHash, StoreError};
pub use types::{Namespace, NodeId, PageId, TokenId};
