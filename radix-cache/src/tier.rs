//! Page names and the lower-tier store interface.
//!
//! A full page of KV is named by a [`PageHash`], chained over (parent hash, namespace, token
//! ids) so that the same prefix gets the same names in every process, across restarts and on
//! the wire. Lower tiers of the hierarchical cache (the SSD tier, the remote KV store reached
//! through `sglrs-transfer`) implement [`KvStore`].

use bytes::Bytes;

/// Content hash naming one full page of KV: chained over the parent page's hash, the
/// namespace and the page's token ids (see the crate docs for the exact, versioned format).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageHash(pub u128);

impl PageHash {
    /// The 16 bytes of the hash as sent on the wire and used in file names (little endian).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_le_bytes()
    }

    /// The hash from its 16 wire bytes (little endian).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(u128::from_le_bytes(bytes))
    }
}

/// Why a lower-tier store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or the connection broke.
    #[error("kv store unavailable: {0}")]
    Unavailable(String),
    /// The store answered, but the answer was malformed or failed an integrity check.
    #[error("kv store protocol error: {0}")]
    Protocol(String),
    /// A local I/O error (disk tier).
    #[error("kv store i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A lower tier of the hierarchical cache: pages stored by hash, each page one opaque byte
/// string in the executor's page layout (per layer, K then V).
///
/// Calls block; the runtime drives them from its cache I/O thread, never from the scheduler.
pub trait KvStore: Send + Sync {
    /// How many of `hashes`, counted from the first, are present (the store's leading hits).
    fn exists(&self, hashes: &[PageHash]) -> Result<usize, StoreError>;
    /// The pages for `hashes`, `None` for each one that is missing or failed its integrity check.
    fn get(&self, hashes: &[PageHash]) -> Result<Vec<Option<Bytes>>, StoreError>;
    /// Stores pages; a page already present is left as it is.
    fn put(&self, pages: &[(PageHash, Bytes)]) -> Result<(), StoreError>;
}
