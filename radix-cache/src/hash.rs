//! The page hash format (version 1), the in-process child keys and the map hasher.
//!
//! See the crate docs for the exact byte layout of a [`PageHash`]; this module is its one
//! implementation.

use std::hash::{BuildHasherDefault, Hasher};

use crate::tier::PageHash;
use crate::types::{Namespace, TokenId};

/// The page hash format version, the first byte hashed for every page.
pub const PAGE_HASH_VERSION: u8 = 1;

/// The xxh3-128 seed of page hash format version 1: the ASCII bytes `"sglrs-v1"` read as a
/// little-endian `u64`.
pub const PAGE_HASH_SEED: u64 = u64::from_le_bytes(*b"sglrs-v1");

pub use crate::types::NAMESPACE_SEED;

/// The hash of one full page, chained on its parent page's hash (`None` for the first page
/// of a sequence), in format version [`PAGE_HASH_VERSION`]:
///
/// `xxh3_128_with_seed(version:u8 ‖ parent:16 bytes LE (zeros if none) ‖ namespace:u64 LE ‖
/// tokens: u32 LE each, PAGE_HASH_SEED)`.
pub fn page_hash(parent: Option<PageHash>, namespace: Namespace, tokens: &[TokenId]) -> PageHash {
    let mut scratch = Vec::with_capacity(HEADER_LEN + 4 * tokens.len());
    page_hash_with(&mut scratch, parent, namespace, tokens)
}

/// Bytes before the tokens: version, parent hash, namespace.
const HEADER_LEN: usize = 1 + 16 + 8;

/// [`page_hash`] with a caller-owned scratch buffer (no allocation once it is large enough).
pub(crate) fn page_hash_with(
    scratch: &mut Vec<u8>,
    parent: Option<PageHash>,
    namespace: Namespace,
    tokens: &[TokenId],
) -> PageHash {
    scratch.clear();
    scratch.push(PAGE_HASH_VERSION);
    scratch.extend_from_slice(&parent.map_or([0u8; 16], PageHash::to_bytes));
    scratch.extend_from_slice(&namespace.0.to_le_bytes());
    for t in tokens {
        scratch.extend_from_slice(&t.to_le_bytes());
    }
    PageHash(xxhash_rust::xxh3::xxh3_128_with_seed(
        scratch,
        PAGE_HASH_SEED,
    ))
}

/// The in-process key of a child edge: its first page. For one-token pages it is the token
/// itself (exact); for longer pages a 64-bit mix of the page's tokens, verified against the
/// child's tokens on every use (a collision costs a cache miss, never a wrong match).
#[inline]
pub(crate) fn child_key<T: Copy + Into<u64>>(first_page: &[T]) -> u64 {
    if let [t] = first_page {
        return (*t).into();
    }
    let mut k: u64 = first_page.len() as u64;
    let mut chunks = first_page.chunks_exact(2);
    for c in &mut chunks {
        let w = c[0].into() | (c[1].into() << 32);
        k = mix(k ^ w);
    }
    if let [t] = chunks.remainder() {
        k = mix(k ^ (*t).into());
    }
    k
}

#[inline]
fn mix(x: u64) -> u64 {
    let r = u128::from(x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (r as u64) ^ ((r >> 64) as u64)
}

/// A hasher for `u64` keys that are token ids or already-mixed child keys: one folded
/// multiply, so the table's high and low bits both vary.
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = mix(self.0 ^ u64::from(*b));
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = mix(self.0 ^ x);
    }

    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
}

/// `BuildHasher` for maps keyed by child keys or namespaces.
pub(crate) type KeyBuild = BuildHasherDefault<KeyHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_hash_is_the_documented_byte_format() {
        let tokens = [1u32, 2, 3, 0xdead_beef];
        let parent = PageHash(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff);
        let ns = Namespace(42);
        let mut bytes = vec![1u8];
        bytes.extend_from_slice(&parent.0.to_le_bytes());
        bytes.extend_from_slice(&42u64.to_le_bytes());
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        let want = xxhash_rust::xxh3::xxh3_128_with_seed(&bytes, PAGE_HASH_SEED);
        assert_eq!(page_hash(Some(parent), ns, &tokens), PageHash(want));
    }

    #[test]
    fn page_hash_fixed_vector() {
        // Pinned values of format version 1: if these change, the on-disk and on-wire names
        // of every page change, and PAGE_HASH_VERSION must be bumped.
        let first = page_hash(None, Namespace::DEFAULT, &[1, 2, 3, 4]);
        let second = page_hash(Some(first), Namespace::DEFAULT, &[5, 6, 7, 8]);
        assert_eq!(first, PageHash(FIRST), "first = {:#034x}", first.0);
        assert_eq!(second, PageHash(SECOND), "second = {:#034x}", second.0);
        assert_ne!(page_hash(None, Namespace(1), &[1, 2, 3, 4]), first);
        assert_eq!(Namespace::from_name(""), Namespace::DEFAULT);
        assert_eq!(Namespace::from_name("tenant-a"), Namespace(NS_TENANT_A));
    }

    // Computed independently with the reference C xxHash (python-xxhash 3.x,
    // `xxh3_128_intdigest(bytes, seed=PAGE_HASH_SEED)`) from the documented byte layout.
    const FIRST: u128 = 0xdf4d_1cb8_2382_52ee_3f53_a1cd_958b_27b8;
    const SECOND: u128 = 0xa4f4_8a9c_697c_f002_4a66_53ba_1438_48c8;
    const NS_TENANT_A: u64 = 0x77c1_c36f_a7c3_b4f8;

    #[test]
    fn child_keys_differ_within_a_page() {
        assert_eq!(child_key(&[7u32]), 7);
        assert_ne!(child_key(&[1u32, 2]), child_key(&[2u32, 1]));
        assert_ne!(child_key(&[1u32, 2, 3]), child_key(&[1u32, 2, 4]));
        // Narrow and wide storage of the same tokens give the same key.
        assert_eq!(child_key(&[1u16, 2, 3]), child_key(&[1u32, 2, 3]));
    }
}
