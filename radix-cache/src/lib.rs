//! RadixAttention index over a paged KV cache.
//!
//! Owns the radix tree over token ids, the page-id allocator, lock counting, eviction
//! policies, tier bookkeeping and the chained page hashes. Pure data structure: no tokio,
//! no tensors, no pyo3. Filled in by the radix-cache work (see `ARCHITECTURE.md`).
#![warn(missing_docs)]

pub mod tier;

pub use tier::{KvStore, PageHash, StoreError};
