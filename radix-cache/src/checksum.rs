//! xxh3-64 of a page, fast: every page that crosses the wire is hashed once on each side.
//!
//! Pages are large (368,640 bytes for the default model), so all the time goes into xxh3's
//! long-input loop. Crates pick its SIMD width at compile time (xxhash-rust) or stop at AVX2
//! (twox-hash); on a CPU with AVX-512 this module runs the long-input loop on 512-bit
//! vectors (about twice the AVX2 speed), chosen at run time. The value is always the plain
//! xxh3-64 (seed 0, default secret); tests compare it with xxhash-rust at every length
//! class.

/// Checksum of one page: xxh3-64 of its bytes.
pub fn page_checksum(page: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if page.len() > MIDSIZE_MAX && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked just above).
        return unsafe { avx512::hash_long(page) };
    }
    twox_hash::XxHash3_64::oneshot(page)
}

/// Inputs up to this length take xxh3's short paths (no SIMD loop).
const MIDSIZE_MAX: usize = 240;

/// [`page_checksum`] of a page that arrives in pieces: feed the pieces in order with
/// [`update`](Self::update), read the value with [`finish`](Self::finish). Hashing each
/// piece as it arrives touches it while it is still in cache. The value equals
/// `page_checksum` of the concatenation, however the input is split.
#[derive(Clone)]
pub struct PageHasher {
    inner: HasherImpl,
}

#[derive(Clone)]
enum HasherImpl {
    #[cfg(target_arch = "x86_64")]
    Avx512(Box<avx512::Stream>),
    Portable(Box<xxhash_rust::xxh3::Xxh3>),
}

impl Default for PageHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for PageHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageHasher").finish_non_exhaustive()
    }
}

impl PageHasher {
    /// A hasher with nothing fed yet.
    pub fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Self {
                inner: HasherImpl::Avx512(Box::default()),
            };
        }
        Self {
            inner: HasherImpl::Portable(Box::default()),
        }
    }

    /// Feeds the next piece.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.inner {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: this variant is only made when the CPU supports AVX-512F.
            HasherImpl::Avx512(s) => unsafe { s.update(data) },
            HasherImpl::Portable(h) => h.update(data),
        }
    }

    /// xxh3-64 of everything fed so far.
    pub fn finish(&self) -> u64 {
        match &self.inner {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `update`.
            HasherImpl::Avx512(s) => unsafe { s.finish() },
            HasherImpl::Portable(h) => h.digest(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    const PRIME32_1: u64 = 0x9E37_79B1;
    const PRIME32_2: u64 = 0x85EB_CA77;
    const PRIME32_3: u64 = 0xC2B2_AE3D;
    const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
    const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
    const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
    const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
    const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

    const STRIPE: usize = 64;
    const SECRET_CONSUME_RATE: usize = 8;
    const SECRET_LASTACC_START: usize = 7;
    const SECRET_MERGEACCS_START: usize = 11;

    /// xxh3's default secret.
    const SECRET: [u8; 192] = [
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad,
        0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3,
        0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc,
        0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
        0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65,
        0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19,
        0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9,
        0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
        0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb,
        0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0,
        0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d,
        0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
        0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
    ];

    fn read64(b: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    }

    /// Adds one 64-byte stripe to the accumulators, with the secret at `secret`.
    ///
    /// # Safety
    /// `stripe` and `secret` must each point at 64 readable bytes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn accumulate(acc: __m512i, stripe: *const u8, secret: *const u8) -> __m512i {
        // SAFETY: the caller guarantees 64 readable bytes at each; unaligned loads.
        let (data, key) = unsafe {
            (
                _mm512_loadu_si512(stripe.cast()),
                _mm512_loadu_si512(secret.cast()),
            )
        };
        let data_key = _mm512_xor_si512(data, key);
        let data_key_hi = _mm512_srli_epi64::<32>(data_key);
        // (lo 32 bits) * (hi 32 bits) of each lane.
        let product = _mm512_mul_epu32(data_key, data_key_hi);
        // acc[i ^ 1] += data[i]: swap the two 64-bit lanes of every 128-bit pair.
        let swapped = _mm512_shuffle_epi32::<0b01_00_11_10>(data);
        _mm512_add_epi64(acc, _mm512_add_epi64(product, swapped))
    }

    /// Adds `stripes` stripes starting at `input` (secret offsets 0, 8, 16, …).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn accumulate_stripes(acc: __m512i, input: &[u8], stripes: usize) -> __m512i {
        accumulate_stripes_from(acc, input, stripes, 0)
    }

    /// Adds `stripes` stripes starting at `input`, the first with the secret at stripe
    /// position `at` of its block (secret offsets `8 * at`, `8 * (at + 1)`, …).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn accumulate_stripes_from(
        mut acc: __m512i,
        input: &[u8],
        stripes: usize,
        at: usize,
    ) -> __m512i {
        assert!(input.len() >= stripes * STRIPE);
        assert!((at + stripes.max(1) - 1) * SECRET_CONSUME_RATE + STRIPE <= SECRET.len());
        for s in 0..stripes {
            // SAFETY: stripe `s` lies inside `input` and its secret inside `SECRET`
            // (asserted above).
            acc = unsafe {
                accumulate(
                    acc,
                    input.as_ptr().add(s * STRIPE),
                    SECRET.as_ptr().add((at + s) * SECRET_CONSUME_RATE),
                )
            };
        }
        acc
    }

    /// xxh3's per-block scramble.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn scramble(acc: __m512i, secret: &[u8]) -> __m512i {
        assert!(secret.len() >= STRIPE);
        // SAFETY: the slice holds at least 64 bytes (asserted); unaligned load.
        let key = unsafe { _mm512_loadu_si512(secret.as_ptr().cast()) };
        let shifted = _mm512_srli_epi64::<47>(acc);
        let mixed = _mm512_xor_si512(_mm512_xor_si512(acc, shifted), key);
        let prime = _mm512_set1_epi64(PRIME32_1 as i64);
        let lo = _mm512_mul_epu32(mixed, prime);
        let hi = _mm512_mul_epu32(_mm512_srli_epi64::<32>(mixed), prime);
        _mm512_add_epi64(lo, _mm512_slli_epi64::<32>(hi))
    }

    fn mul128_fold64(a: u64, b: u64) -> u64 {
        let p = u128::from(a) * u128::from(b);
        (p as u64) ^ ((p >> 64) as u64)
    }

    fn avalanche(mut h: u64) -> u64 {
        h ^= h >> 37;
        h = h.wrapping_mul(0x1656_6791_9E37_79F9);
        h ^ (h >> 32)
    }

    const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE) / SECRET_CONSUME_RATE;
    const INIT_ACC: [u64; 8] = [
        PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
    ];

    /// Final mix of the accumulators of an input of `len` bytes (> 240).
    fn merge(lanes: &[u64; 8], len: usize) -> u64 {
        let merge = &SECRET[SECRET_MERGEACCS_START..];
        let mut h = (len as u64).wrapping_mul(PRIME64_1);
        for i in 0..4 {
            h = h.wrapping_add(mul128_fold64(
                lanes[2 * i] ^ read64(merge, 16 * i),
                lanes[2 * i + 1] ^ read64(merge, 16 * i + 8),
            ));
        }
        avalanche(h)
    }

    /// Streaming state of xxh3-64's long-input loop. A stripe is consumed only once a byte
    /// past it has arrived (the one-shot loop leaves the input's last stripe to the final,
    /// overlapping one), so `pending` always holds the 1..=64 bytes not yet consumed.
    #[derive(Clone)]
    pub(super) struct Stream {
        acc: [u64; 8],
        /// Stripes consumed in the current block.
        in_block: usize,
        /// Bytes fed so far.
        len: usize,
        /// The first bytes, for inputs of at most 240 bytes (xxh3's short paths).
        head: [u8; super::MIDSIZE_MAX],
        /// Bytes not consumed yet (`pending[..pending_len]`).
        pending: [u8; STRIPE],
        pending_len: usize,
        /// The last 64 bytes consumed (the final stripe may reach back into them).
        last: [u8; STRIPE],
    }

    impl Default for Stream {
        fn default() -> Self {
            Self {
                acc: INIT_ACC,
                in_block: 0,
                len: 0,
                head: [0; super::MIDSIZE_MAX],
                pending: [0; STRIPE],
                pending_len: 0,
                last: [0; STRIPE],
            }
        }
    }

    impl Stream {
        /// Consumes whole stripes of `input` (`input.len()` a multiple of 64), scrambling at
        /// block ends. Only called with more input known to follow.
        #[target_feature(enable = "avx512f")]
        fn consume(&mut self, acc: &mut __m512i, mut input: &[u8]) {
            debug_assert!(input.len().is_multiple_of(STRIPE));
            let last_secret = &SECRET[SECRET.len() - STRIPE..];
            while !input.is_empty() {
                let n = (input.len() / STRIPE).min(STRIPES_PER_BLOCK - self.in_block);
                *acc = accumulate_stripes_from(*acc, input, n, self.in_block);
                self.in_block += n;
                if self.in_block == STRIPES_PER_BLOCK {
                    *acc = scramble(*acc, last_secret);
                    self.in_block = 0;
                }
                input = &input[n * STRIPE..];
            }
        }

        /// Feeds `data`.
        ///
        /// # Safety
        /// The CPU must support AVX-512F.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn update(&mut self, mut data: &[u8]) {
            if data.is_empty() {
                return;
            }
            if self.len < super::MIDSIZE_MAX {
                let n = data.len().min(super::MIDSIZE_MAX - self.len);
                self.head[self.len..self.len + n].copy_from_slice(&data[..n]);
            }
            self.len += data.len();
            // SAFETY: `acc` is 64 bytes; unaligned load.
            let mut acc = unsafe { _mm512_loadu_si512(self.acc.as_ptr().cast()) };
            if self.pending_len > 0 {
                let n = data.len().min(STRIPE - self.pending_len);
                self.pending[self.pending_len..self.pending_len + n].copy_from_slice(&data[..n]);
                self.pending_len += n;
                data = &data[n..];
                if data.is_empty() {
                    return; // the pending stripe may be the input's last: keep it
                }
                let stripe = self.pending;
                self.consume(&mut acc, &stripe);
                self.last = stripe;
                self.pending_len = 0;
            }
            // Consume every whole stripe with at least one byte after it.
            let whole = (data.len() - 1) / STRIPE * STRIPE;
            if whole > 0 {
                self.consume(&mut acc, &data[..whole]);
                self.last.copy_from_slice(&data[whole - STRIPE..whole]);
            }
            let rest = &data[whole..];
            self.pending[..rest.len()].copy_from_slice(rest);
            self.pending_len = rest.len();
            // SAFETY: as above; unaligned store.
            unsafe { _mm512_storeu_si512(self.acc.as_mut_ptr().cast(), acc) };
        }

        /// xxh3-64 of everything fed.
        ///
        /// # Safety
        /// The CPU must support AVX-512F.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn finish(&self) -> u64 {
            if self.len <= super::MIDSIZE_MAX {
                return twox_hash::XxHash3_64::oneshot(&self.head[..self.len]);
            }
            // The input's last 64 bytes: the tail of what was consumed, then `pending`.
            let mut stripe = [0u8; STRIPE];
            let p = self.pending_len;
            stripe[..STRIPE - p].copy_from_slice(&self.last[p..]);
            stripe[STRIPE - p..].copy_from_slice(&self.pending[..p]);
            // SAFETY: `acc` is 64 bytes; unaligned load.
            let mut acc = unsafe { _mm512_loadu_si512(self.acc.as_ptr().cast()) };
            let last_key = &SECRET[SECRET.len() - STRIPE - SECRET_LASTACC_START..];
            // SAFETY: both hold at least 64 bytes.
            acc = unsafe { accumulate(acc, stripe.as_ptr(), last_key.as_ptr()) };
            let mut lanes = [0u64; 8];
            // SAFETY: `lanes` is 64 bytes; unaligned store.
            unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), acc) };
            merge(&lanes, self.len)
        }
    }

    /// xxh3-64 (seed 0, default secret) of an input longer than 240 bytes.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn hash_long(input: &[u8]) -> u64 {
        let len = input.len();
        debug_assert!(len > super::MIDSIZE_MAX);
        // SAFETY: `INIT_ACC` is 64 bytes; unaligned load.
        let mut acc = unsafe { _mm512_loadu_si512(INIT_ACC.as_ptr().cast()) };
        let stripes_per_block = STRIPES_PER_BLOCK;
        let block_len = STRIPE * stripes_per_block;
        let blocks = (len - 1) / block_len;
        let last_secret = &SECRET[SECRET.len() - STRIPE..];
        for block in input.chunks_exact(block_len).take(blocks) {
            acc = accumulate_stripes(acc, block, stripes_per_block);
            acc = scramble(acc, last_secret);
        }
        // The last partial block, then the last stripe (which may overlap it).
        let tail = &input[blocks * block_len..];
        acc = accumulate_stripes(acc, tail, (len - 1 - blocks * block_len) / STRIPE);
        let last = &input[len - STRIPE..];
        let last_key = &SECRET[SECRET.len() - STRIPE - SECRET_LASTACC_START..];
        // SAFETY: both slices hold at least 64 bytes.
        acc = unsafe { accumulate(acc, last.as_ptr(), last_key.as_ptr()) };
        let mut lanes = [0u64; 8];
        // SAFETY: `lanes` is 64 bytes; unaligned store.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), acc) };
        merge(&lanes, len)
    }
}

#[cfg(test)]
mod tests {
    use super::page_checksum;

    fn data(n: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// The page checksum is xxh3-64: the reference implementation's value at every length
    /// up to past two 1,024-byte blocks (short paths, partial blocks, the overlapping last
    /// stripe), at block multiples and at the default page size.
    #[test]
    fn page_checksum_is_xxh3_64() {
        let d = data(400_000);
        let lens = (0..2_200).chain([
            3_072, 3_073, 4_096, 65_536, 65_599, 368_640, 399_999, 400_000,
        ]);
        for n in lens {
            let s = &d[..n];
            assert_eq!(
                page_checksum(s),
                xxhash_rust::xxh3::xxh3_64(s),
                "length {n}"
            );
        }
    }

    /// Unaligned starts take the same path.
    #[test]
    fn page_checksum_at_unaligned_offsets() {
        let d = data(10_000);
        for off in 1..70 {
            let s = &d[off..off + 5_000];
            assert_eq!(
                page_checksum(s),
                xxhash_rust::xxh3::xxh3_64(s),
                "offset {off}"
            );
        }
    }

    /// The streaming hasher gives the one-shot value however the input is split: every
    /// length class, pieces of 1, 63, 64, 65 and 1,000 bytes and random splits.
    #[test]
    fn page_hasher_equals_the_one_shot_value() {
        let d = data(400_000);
        let mut seed = 0x1234_5678_9ABC_DEF1u64;
        let mut rnd = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed as usize) % n
        };
        let lens = (0..1_200).step_by(7).chain([
            239, 240, 241, 1_024, 1_025, 2_048, 2_049, 65_536, 368_640, 399_999,
        ]);
        for n in lens {
            let s = &d[..n];
            let want = xxhash_rust::xxh3::xxh3_64(s);
            for piece in [1usize, 63, 64, 65, 1_000, 16_000] {
                if n > 50_000 && piece < 64 {
                    continue;
                }
                let mut h = super::PageHasher::new();
                s.chunks(piece).for_each(|c| h.update(c));
                assert_eq!(h.finish(), want, "length {n}, pieces of {piece}");
            }
            for _ in 0..4 {
                let mut h = super::PageHasher::new();
                let mut rest = s;
                while !rest.is_empty() {
                    let k = 1 + rnd(rest.len().min(20_000));
                    h.update(&rest[..k]);
                    h.update(&[]);
                    rest = &rest[k..];
                }
                assert_eq!(h.finish(), want, "length {n}, random pieces");
            }
        }
    }

    /// On a CPU with AVX-512 the vector loop itself is checked (not only the fallback).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_loop_matches_when_available() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let d = data(368_640);
        for n in [241, 1_024, 1_025, 2_048, 368_640] {
            // SAFETY: AVX-512F is available (checked above).
            let h = unsafe { super::avx512::hash_long(&d[..n]) };
            assert_eq!(h, xxhash_rust::xxh3::xxh3_64(&d[..n]), "length {n}");
        }
    }
}
