//! Identifier newtypes shared by the pool and the tree.

/// A token id, as the tokenizer produces it.
pub type TokenId = u32;

/// The id of one KV page (`page_size` token slots) in the executor's KV pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u32);

impl PageId {
    /// The page id as an index into per-page arrays.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The id of one node of the radix tree: an index into the node arena and the generation of
/// that slot, so an id kept past its node's removal names nothing (operations on it fail with
/// `NoSuchNode`) even after the slot is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub(crate) u32, pub(crate) u32);

impl NodeId {
    /// The raw arena index (for logs and metrics).
    pub fn raw(self) -> u32 {
        self.0
    }

    #[inline]
    pub(crate) fn idx(self) -> usize {
        self.0 as usize
    }
}

/// A cache namespace: requests in different namespaces never share nodes or pages
/// (tenant, LoRA adapter, `cache_salt`). [`Namespace::DEFAULT`] is the shared one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Namespace(pub u64);

/// The xxh3-64 seed that turns a namespace name into a [`Namespace`]: the ASCII bytes
/// `"sglrs-ns"` read as a little-endian `u64`.
pub const NAMESPACE_SEED: u64 = u64::from_le_bytes(*b"sglrs-ns");

impl Namespace {
    /// The namespace of requests without tenant, adapter or salt.
    pub const DEFAULT: Namespace = Namespace(0);

    /// A namespace named by a string (adapter name, `cache_salt`, tenant id): the low 64 bits
    /// of `xxh3_64_with_seed(name_utf8, NAMESPACE_SEED)`, stable across processes, so the
    /// same name gives the same page hashes everywhere. The empty string maps to
    /// [`Namespace::DEFAULT`].
    pub fn from_name(name: &str) -> Namespace {
        if name.is_empty() {
            return Namespace::DEFAULT;
        }
        Namespace(xxhash_rust::xxh3::xxh3_64_with_seed(
            name.as_bytes(),
            NAMESPACE_SEED,
        ))
    }
}
