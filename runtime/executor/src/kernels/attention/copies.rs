//! Converted copies of a task's K/V (f32 for the AVX-512 kernels; the AMX tiles' bf16
//! halves live in `amx.rs`), and the few a thread keeps, one per KV head.

use super::{load_ph, paged_k_block, PagedKv};
use crate::kernels::Isa;
use crate::KvDtype;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One task's K/V converted to f32 once, for tasks whose many query rows (a prefill block)
/// would otherwise convert every page once per tile. f16 → f32 is exact, so attention over
/// this copy is bit-identical to attention over the pages.
#[derive(Clone, Debug, Default)]
pub struct KvF32 {
    pub(super) len: usize,
    pub(super) head_dim: usize,
    /// Keys in blocks of 16 positions, `kt[(p / 16) * head_dim * 16 + d * 16 + p % 16]`
    /// (zero past `len`).
    pub(super) kt: Vec<f32>,
    /// Values, `v[p * head_dim + d]`.
    pub(super) v: Vec<f32>,
    /// What the held positions were converted from (see [`KvF32::fill_reusing`]): the pool's
    /// address, this head's K and V offsets, and the caller's epoch.
    key: Option<(usize, usize, usize, u64)>,
    /// The page table the held positions came from.
    from_pages: Vec<u32>,
}

impl KvF32 {
    /// Converts positions `0..len` of `kv` (at most its capacity).
    pub fn fill(&mut self, isa: Isa, kv: &PagedKv<'_>, len: usize) {
        self.key = None;
        self.fill_from(isa, kv, len, 0);
    }

    /// Like [`KvF32::fill`], but keeps the positions already held that come from the same
    /// pages of the same pool and head, converted under the same `epoch`: the caller
    /// promises that no page changed between two fills with one epoch (the executor uses one
    /// per layer of a forward pass, while the pages are read only). Sequences that share a
    /// cached prefix (the radix cache's shared pages) then convert it once per thread
    /// instead of once each. The copy is exact either way, so results do not change.
    pub fn fill_reusing(&mut self, isa: Isa, kv: &PagedKv<'_>, len: usize, epoch: u64) {
        // Whole pages (so whole 16-position blocks) that were fully converted.
        let held = if kv.page_size.is_multiple_of(16) {
            self.len
        } else {
            0
        };
        let keep = held_pages(&mut self.key, &mut self.from_pages, kv, epoch, held, len);
        self.fill_from(isa, kv, len, keep);
    }

    /// Converts positions `from..len` (`from` a multiple of 16; those below it are held).
    fn fill_from(&mut self, isa: Isa, kv: &PagedKv<'_>, len: usize, from: usize) {
        let hd = kv.head_dim;
        assert!(len <= kv.capacity() && from.is_multiple_of(16) && from <= len);
        self.len = len;
        self.head_dim = hd;
        let blocks = len.div_ceil(16);
        // Grow only: tasks of every length reuse the buffers (shrinking then growing again
        // would zero-fill them each time).
        if self.kt.len() < blocks * hd * 16 {
            self.kt.resize(blocks * hd * 16, 0.0);
        }
        if self.v.len() < len * hd {
            self.v.resize(len * hd, 0.0);
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512Vnni && kv.dtype == KvDtype::F16 && hd.is_multiple_of(16) {
            // SAFETY: AVX-512 F/BW/VL detected; buffers sized above.
            unsafe { self.fill_avx512(kv, from) };
            return;
        }
        let _ = isa;
        for p in from..blocks * 16 {
            for d in 0..hd {
                self.kt[(p / 16) * hd * 16 + d * 16 + p % 16] =
                    if p < len { kv.k(p, d) } else { 0.0 };
            }
        }
        for p in from..len {
            for d in 0..hd {
                self.v[p * hd + d] = kv.v(p, d);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn fill_avx512(&mut self, kv: &PagedKv<'_>, from: usize) {
        let (hd, len) = (self.head_dim, self.len);
        let mut tmp = if kv.page_size.is_multiple_of(16) {
            Vec::new()
        } else {
            vec![0u16; hd * 16]
        };
        for b in from / 16..len.div_ceil(16) {
            let (kp, ks, m) = paged_k_block(kv, b, len, &mut tmp);
            let dst = self.kt[b * hd * 16..(b + 1) * hd * 16].as_mut_ptr();
            for d in 0..hd {
                _mm512_storeu_ps(dst.add(d * 16), load_ph((kp as *const u16).add(d * ks), m));
            }
        }
        for p in from..len {
            let o = kv.v_row(p);
            let src = kv.raw[o..o + hd * 2].as_ptr();
            let dst = self.v[p * hd..(p + 1) * hd].as_mut_ptr();
            for c in 0..hd / 16 {
                let x = _mm256_loadu_si256(src.add(c * 32) as *const __m256i);
                _mm512_storeu_ps(dst.add(c * 16), _mm512_cvtph_ps(x));
            }
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How many leading positions of a converted copy (`held` of them, converted from the page
/// table `from` under `key`) may be kept for positions `0..len` of `kv` under `epoch`: those
/// on whole pages the two tables share, when the key is the same. Records `kv`'s key and
/// page table as the copy's.
pub(super) fn held_pages(
    key: &mut Option<(usize, usize, usize, u64)>,
    from: &mut Vec<u32>,
    kv: &PagedKv<'_>,
    epoch: u64,
    held: usize,
    len: usize,
) -> usize {
    let new_key = (kv.raw.as_ptr() as usize, kv.k_off, kv.v_off, epoch);
    let mut keep = 0;
    if *key == Some(new_key) {
        let same = kv
            .pages
            .iter()
            .zip(from.iter())
            .take_while(|(a, b)| a == b)
            .count();
        keep = (same * kv.page_size).min(len).min(held) / kv.page_size * kv.page_size;
    }
    *key = Some(new_key);
    from.clear();
    from.extend_from_slice(kv.pages);
    keep
}

/// A task's converted copy of one KV head (see [`Slots`]).
pub trait HeadCopy: Default {
    /// What the held positions were converted from: the pool's address, the head's K and V
    /// offsets, and the caller's epoch (`None` before the first fill).
    fn key(&self) -> Option<(usize, usize, usize, u64)>;
    /// Bytes its buffers hold.
    fn heap_bytes(&self) -> usize;
}

impl HeadCopy for KvF32 {
    fn key(&self) -> Option<(usize, usize, usize, u64)> {
        self.key
    }

    fn heap_bytes(&self) -> usize {
        (self.kt.capacity() + self.v.capacity()) * 4
    }
}

/// A few converted copies kept per thread, one per KV head it works on: a long prefill's
/// tasks alternate heads, and with one copy per thread each change of head converted the
/// whole range again. (Which copy is reused changes no result: the copies are exact.)
#[derive(Clone, Debug, Default)]
pub struct Slots<T> {
    slots: Vec<T>,
    next: usize,
}

/// Copies a thread keeps (at least the KV heads per layer: 3 for SmolLM2). Each holds the
/// longest task's positions × head dimension × 8 bytes (K and V in f32, or the bf16
/// halves): 1.7 MiB at 3,400 positions and 64 dimensions.
const SLOTS: usize = 4;

/// No further copy is added while a thread's copies hold this much (long contexts of wide
/// heads: 32,768 positions × 128 dimensions is 32 MiB a copy); the existing ones are then
/// reused in turn.
const SLOTS_BYTES: usize = 64 << 20;

impl<T: HeadCopy> Slots<T> {
    /// The copy already holding `kv`'s head under `epoch` (its caller then converts only
    /// what it lacks), else a new one while there is room, else the next in turn.
    pub fn slot(&mut self, kv: &PagedKv<'_>, epoch: u64) -> &mut T {
        let key = (kv.raw.as_ptr() as usize, kv.k_off, kv.v_off, epoch);
        // Room for another copy (its bytes counted only when one would be added).
        let room = |slots: &[T]| {
            slots.is_empty()
                || (slots.len() < SLOTS
                    && slots.iter().map(HeadCopy::heap_bytes).sum::<usize>() < SLOTS_BYTES)
        };
        let i = match self.slots.iter().position(|s| s.key() == Some(key)) {
            Some(i) => i,
            None if room(&self.slots) => {
                self.slots.push(T::default());
                self.slots.len() - 1
            }
            None => {
                self.next = (self.next + 1) % self.slots.len();
                self.next
            }
        };
        &mut self.slots[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy that only remembers its key and claims `bytes` of buffers.
    #[derive(Default)]
    struct Fake {
        key: Option<(usize, usize, usize, u64)>,
        bytes: usize,
    }

    impl HeadCopy for Fake {
        fn key(&self) -> Option<(usize, usize, usize, u64)> {
            self.key
        }

        fn heap_bytes(&self) -> usize {
            self.bytes
        }
    }

    fn head(raw: &[u8], k_off: usize) -> PagedKv<'_> {
        PagedKv {
            raw,
            dtype: KvDtype::F16,
            pages: &[],
            page_size: 16,
            page_bytes: 0,
            k_off,
            v_off: k_off + 1,
            v_stride: 0,
            head_dim: 64,
        }
    }

    /// A head seen again under the same epoch gets its own copy back; new heads get new
    /// copies up to the count, then the existing ones in turn; past the byte budget no copy
    /// is added.
    #[test]
    fn slots_keep_one_copy_per_head_within_their_bounds() {
        let raw = [0u8; 4];
        let mut s: Slots<Fake> = Slots::default();
        let key = |k_off: usize| Some((raw.as_ptr() as usize, k_off, k_off + 1, 7));
        for k_off in 0..SLOTS {
            let c = s.slot(&head(&raw, k_off), 7);
            assert_eq!(c.key, None, "head {k_off} gets a fresh copy");
            c.key = key(k_off);
        }
        for k_off in (0..SLOTS).rev() {
            assert_eq!(s.slot(&head(&raw, k_off), 7).key, key(k_off));
        }
        // A fifth head reuses one of the four; a new epoch finds none of them.
        assert!(s.slot(&head(&raw, SLOTS), 7).key.is_some());
        assert_eq!(s.slots.len(), SLOTS);
        let epoch8 = Some((raw.as_ptr() as usize, 0, 1, 8));
        assert_ne!(
            s.slot(&head(&raw, 0), 8).key,
            epoch8,
            "no copy holds a new epoch"
        );

        let mut big: Slots<Fake> = Slots::default();
        let c = big.slot(&head(&raw, 0), 1);
        (c.key, c.bytes) = (key(0), SLOTS_BYTES);
        assert_eq!(
            big.slot(&head(&raw, 1), 1).key,
            key(0),
            "no second copy past the budget"
        );
        assert_eq!(big.slots.len(), 1);
    }
}
