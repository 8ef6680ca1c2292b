//! [`Page`]: one KV page's bytes, in one buffer or in the pieces the transport delivered.

use bytes::{Bytes, BytesMut};

use super::{page_checksum, PageHasher};

/// One KV page's bytes. A page built by the application (or decoded from one received
/// buffer) is one [`Bytes`]; a page received over QUIC is the list of pieces quinn
/// delivered (slices of its receive buffers), handed over without gathering them into one
/// buffer. Copy it where it belongs with [`copy_to`](Self::copy_to) (one copy, as from a
/// plain buffer), or make it one buffer with [`to_bytes`](Self::to_bytes).
///
/// Equality compares contents, however they are split.
#[derive(Clone, Default)]
pub struct Page {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    One(Bytes),
    /// At least two non-empty pieces, and the total length.
    Many(Vec<Bytes>, usize),
}

impl Default for Repr {
    fn default() -> Self {
        Self::One(Bytes::new())
    }
}

impl Page {
    /// A page made of `chunks`, in order (empty pieces are dropped).
    pub fn from_chunks(chunks: Vec<Bytes>) -> Self {
        let mut chunks = chunks;
        chunks.retain(|c| !c.is_empty());
        match chunks.len() {
            0 => Self::default(),
            1 => Self::from(chunks.swap_remove(0)),
            _ => {
                let len = chunks.iter().map(Bytes::len).sum();
                Self {
                    repr: Repr::Many(chunks, len),
                }
            }
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::One(b) => b.len(),
            Repr::Many(_, len) => *len,
        }
    }

    /// Whether the page holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces, in order (one for a page in one buffer).
    pub fn chunks(&self) -> &[Bytes] {
        match &self.repr {
            Repr::One(b) => std::slice::from_ref(b),
            Repr::Many(c, _) => c,
        }
    }

    /// Copies the page into `dst`, which must be exactly [`len`](Self::len) bytes long
    /// (panics otherwise, like [`slice::copy_from_slice`]).
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(
            dst.len(),
            self.len(),
            "Page::copy_to: destination of {} bytes for a page of {}",
            dst.len(),
            self.len()
        );
        let mut at = 0;
        for c in self.chunks() {
            dst[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
    }

    /// The page as one buffer: shared without a copy when it is one piece, gathered
    /// (one copy) otherwise.
    pub fn to_bytes(&self) -> Bytes {
        match &self.repr {
            Repr::One(b) => b.clone(),
            Repr::Many(chunks, len) => {
                let mut b = BytesMut::with_capacity(*len);
                for c in chunks {
                    b.extend_from_slice(c);
                }
                b.freeze()
            }
        }
    }

    /// The page's [`page_checksum`] (xxh3-64 of its bytes).
    pub fn checksum(&self) -> u64 {
        match &self.repr {
            Repr::One(b) => page_checksum(b),
            Repr::Many(chunks, _) => {
                let mut h = PageHasher::new();
                chunks.iter().for_each(|c| h.update(c));
                h.finish()
            }
        }
    }

    /// Whether the contents equal `other`.
    fn eq_slice(&self, other: &[u8]) -> bool {
        if self.len() != other.len() {
            return false;
        }
        let mut at = 0;
        self.chunks().iter().all(|c| {
            let same = c[..] == other[at..at + c.len()];
            at += c.len();
            same
        })
    }
}

impl From<Bytes> for Page {
    fn from(b: Bytes) -> Self {
        Self { repr: Repr::One(b) }
    }
}

impl From<Vec<u8>> for Page {
    fn from(v: Vec<u8>) -> Self {
        Self::from(Bytes::from(v))
    }
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Page({} bytes in {} pieces, xxh3 {:#018x})",
            self.len(),
            self.chunks().len(),
            self.checksum()
        )
    }
}

impl PartialEq for Page {
    fn eq(&self, other: &Self) -> bool {
        match &other.repr {
            Repr::One(b) => self.eq_slice(b),
            Repr::Many(..) => self.len() == other.len() && self.eq_slice(&other.to_bytes()),
        }
    }
}

impl Eq for Page {}

impl PartialEq<[u8]> for Page {
    fn eq(&self, other: &[u8]) -> bool {
        self.eq_slice(other)
    }
}

impl PartialEq<Bytes> for Page {
    fn eq(&self, other: &Bytes) -> bool {
        self.eq_slice(other)
    }
}

impl PartialEq<Page> for Bytes {
    fn eq(&self, other: &Page) -> bool {
        other.eq_slice(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(data: &[u8], cuts: &[usize]) -> Page {
        let b = Bytes::copy_from_slice(data);
        let mut at = 0;
        let mut chunks = Vec::new();
        for &c in cuts.iter().chain([&data.len()]) {
            chunks.push(b.slice(at..c));
            at = c;
        }
        Page::from_chunks(chunks)
    }

    #[test]
    fn a_page_in_pieces_behaves_like_one_buffer() {
        let data: Vec<u8> = (0..5_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let one = Page::from(data.clone());
        let many = pieces(&data, &[0, 1, 1, 300, 4_096, 4_999]);
        assert_eq!(many.len(), 5_000);
        assert_eq!(many.chunks().len(), 5); // the empty pieces are dropped
        assert_eq!(one.chunks().len(), 1);
        assert_eq!(many, one);
        assert_eq!(one, many);
        assert_eq!(many, data[..]);
        assert_eq!(many.to_bytes(), Bytes::from(data.clone()));
        assert_eq!(many.checksum(), xxhash_rust::xxh3::xxh3_64(&data));
        assert_eq!(one.checksum(), many.checksum());
        let mut dst = vec![0u8; 5_000];
        many.copy_to(&mut dst);
        assert_eq!(dst, data);
        let mut other = data.clone();
        other[4_500] ^= 1;
        assert_ne!(many, Page::from(other.clone()));
        assert_ne!(many, pieces(&other, &[2_000]));
        assert_ne!(many, Page::from(data[..4_999].to_vec()));
        assert!(Page::from_chunks(vec![Bytes::new()]).is_empty());
    }

    #[test]
    #[should_panic(expected = "destination of 10 bytes for a page of 12")]
    fn copy_to_a_wrong_sized_slot_panics_with_both_sizes() {
        Page::from(vec![1u8; 12]).copy_to(&mut [0u8; 10]);
    }
}
