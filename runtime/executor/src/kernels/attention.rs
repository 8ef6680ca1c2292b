//! Causal attention for query rows that share one KV head, reading the paged KV in place.
//!
//! No per-step gather: the kernels read K and V straight from the sequence's pages
//! ([`PagedKv`]) and convert f16 to f32 in registers (`vcvtph2ps`). The pool stores K
//! transposed per page (`[head][d][slot]`), so 16 positions of one dimension are one load:
//! scores are broadcast-FMA tiles of 32 positions × up to 8 query rows (the GQA group's heads
//! of one or more tokens share every K load), with no horizontal sums; V stays row-major and
//! the weighted sum is a 4 rows × 64 dims FMA tile. Softmax is f32 with a vectorized exp.
//! Every row is computed the same way whatever tile, task or page size it lands in, so reusing
//! cached pages and batching sequences are bit-exact.

// Register tiles are indexed by (row, token) on purpose: the loops mirror the tile shape.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "x86_64")]
pub mod amx;
mod copies;
mod shared;

pub use copies::{HeadCopy, KvF32, Slots};

pub use shared::{attend_shared, shared_supported, SharedTile, MAX_SHARED_ROWS};

use super::Isa;
use crate::KvDtype;
use half::{bf16, f16};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One KV head of one sequence, in place in the paged pool (see `executor::kv`).
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    /// The whole pool.
    pub raw: &'a [u8],
    /// Element type.
    pub dtype: KvDtype,
    /// The sequence's page table.
    pub pages: &'a [u32],
    /// Positions per page.
    pub page_size: usize,
    /// Bytes per page.
    pub page_bytes: usize,
    /// Byte offset within a page of this head's K, stored `[head_dim][page_size]`.
    pub k_off: usize,
    /// Byte offset within a page of this head's V at slot 0 (`[head_dim]` per slot).
    pub v_off: usize,
    /// Bytes between the V rows of consecutive slots.
    pub v_stride: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl PagedKv<'_> {
    /// Positions the page table covers.
    pub fn capacity(&self) -> usize {
        self.pages.len() * self.page_size
    }

    #[inline]
    fn page_base(&self, p: usize) -> usize {
        self.pages[p / self.page_size] as usize * self.page_bytes
    }

    /// Byte offset in the pool of position `p`'s V row (`head_dim` elements).
    #[inline]
    fn v_row(&self, p: usize) -> usize {
        self.page_base(p) + self.v_off + (p % self.page_size) * self.v_stride
    }

    /// Key of position `p`, dimension `d`.
    pub fn k(&self, p: usize, d: usize) -> f32 {
        let es = self.dtype.size();
        let o = self.page_base(p) + self.k_off + (d * self.page_size + p % self.page_size) * es;
        elem(self.dtype, &self.raw[o..o + es])
    }

    /// Value of position `p`, dimension `d`.
    pub fn v(&self, p: usize, d: usize) -> f32 {
        let es = self.dtype.size();
        let o = self.v_row(p) + d * es;
        elem(self.dtype, &self.raw[o..o + es])
    }
}

fn elem(dtype: KvDtype, b: &[u8]) -> f32 {
    match dtype {
        KvDtype::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
        KvDtype::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        KvDtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}

/// Where [`attend`] reads K and V.
#[derive(Clone, Copy, Debug)]
pub enum KvSource<'a> {
    /// In place in the pages (decode, short chunks).
    Paged(PagedKv<'a>),
    /// A converted copy (many rows per task).
    F32(&'a KvF32),
}

impl KvSource<'_> {
    fn head_dim(&self) -> usize {
        match self {
            KvSource::Paged(kv) => kv.head_dim,
            KvSource::F32(c) => c.head_dim,
        }
    }

    fn capacity(&self) -> usize {
        match self {
            KvSource::Paged(kv) => kv.capacity(),
            KvSource::F32(c) => c.len,
        }
    }

    fn k(&self, p: usize, d: usize) -> f32 {
        match self {
            KvSource::Paged(kv) => kv.k(p, d),
            KvSource::F32(c) => c.kt[(p / 16) * c.head_dim * 16 + d * 16 + p % 16],
        }
    }

    fn v(&self, p: usize, d: usize) -> f32 {
        match self {
            KvSource::Paged(kv) => kv.v(p, d),
            KvSource::F32(c) => c.v[p * c.head_dim + d],
        }
    }
}

/// Query rows to attend: each `q[i]` sees positions `0..lens[i]` and writes `out[i]`.
pub struct AttnTile<'a> {
    /// Query vectors (`head_dim` each), at most [`MAX_ROWS`].
    pub q: &'a [&'a [f32]],
    /// Visible positions per query (at least 1, at most what the page table covers).
    pub lens: &'a [usize],
}

/// Query rows per [`attend`] call: their scores share one pass over K.
pub const MAX_ROWS: usize = 8;

/// Key blocks per decode score tile, and how many blocks beyond the tile
/// [`Src::prefetch_k_ahead`] hints.
#[cfg(target_arch = "x86_64")]
const PREFETCH_K_AHEAD: usize = 4;

/// How far ahead of the page being summed [`Src::prefetch_v`] reaches, in positions.
#[cfg(target_arch = "x86_64")]
const PREFETCH_V_AHEAD: usize = 16;

/// Largest head dimension of the AVX-512 path (larger heads take the portable one).
const MAX_HEAD_DIM: usize = 256;

/// Positions per softmax chunk of the AVX-512 kernels. A row longer than this is computed
/// as one partial per chunk of absolute positions `[c·CHUNK, (c+1)·CHUNK)` (the chunk's
/// max, its sum of exponentials and its unnormalised weighted sum of V), merged in chunk
/// order by [`merge_chunks`]; a row no longer than this is one chunk, computed as before
/// chunks existed. The chunks being fixed by position, a long decode row split across
/// threads ([`attend_chunks`], one task per chunk range) gives the same bits as the row
/// computed whole, in a decode step or in a prefill, alone or batched.
pub const SOFTMAX_CHUNK: usize = 1024;

/// Floats of one chunk's partial for a head dimension `hd`: max, sum, then `hd` sums.
pub fn chunk_partial_len(hd: usize) -> usize {
    hd + 2
}

/// Whether [`attend_chunks`] runs here (the AVX-512 kernel over f16 pages).
pub fn chunks_supported(isa: Isa, kv: &PagedKv<'_>) -> bool {
    cfg!(target_arch = "x86_64")
        && isa == Isa::Avx512Vnni
        && kv.dtype == KvDtype::F16
        && kv.head_dim.is_multiple_of(16)
        && kv.head_dim <= MAX_HEAD_DIM
}

/// Merges one row's chunk partials (`chunks` × [`chunk_partial_len`] floats, in chunk order)
/// into its attention output: Σ_c acc_c e^(m_c - M) / Σ_c l_c e^(m_c - M), M the largest
/// max. Chunks without a position (sum 0) are skipped.
pub fn merge_chunks(parts: &[f32], hd: usize, out: &mut [f32]) {
    let w = chunk_partial_len(hd);
    let big = parts
        .chunks_exact(w)
        .filter(|p| p[1] > 0.0)
        .fold(f32::NEG_INFINITY, |m, p| m.max(p[0]));
    let mut sum = 0.0f32;
    let o = &mut out[..hd];
    o.fill(0.0);
    for p in parts.chunks_exact(w).filter(|p| p[1] > 0.0) {
        let f = (p[0] - big).exp();
        sum += p[1] * f;
        for (x, &a) in o.iter_mut().zip(&p[2..]) {
            *x += a * f;
        }
    }
    let inv = 1.0 / sum;
    for x in o.iter_mut() {
        *x *= inv;
    }
}

/// One decode tile's rows (`tile`, at most [`MAX_ROWS`]) over the positions of chunks
/// `chunks` only, each row's partials written to `parts[i]` (`chunks.len()` ×
/// [`chunk_partial_len`] floats), for [`merge_chunks`] once every chunk is done.
///
/// # Panics
/// If [`chunks_supported`] is false, or a `parts` row is too short.
pub fn attend_chunks(
    isa: Isa,
    tile: &AttnTile<'_>,
    kv: &PagedKv<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    chunks: std::ops::Range<usize>,
    parts: &mut [&mut [f32]],
) {
    assert!(
        chunks_supported(isa, kv),
        "no chunked attention kernel here"
    );
    let nq = tile.q.len();
    let maxlen = tile.lens.iter().copied().max().unwrap_or(0);
    assert!(nq <= MAX_ROWS && nq == parts.len() && maxlen <= kv.capacity());
    assert!(tile.lens.iter().all(|&l| l >= 1));
    let w = chunk_partial_len(kv.head_dim) * chunks.len();
    assert!(parts.iter().all(|p| p.len() >= w));
    let stride = maxlen.div_ceil(32) * 32;
    if scores.len() < MAX_ROWS * stride {
        scores.resize(MAX_ROWS * stride, 0.0);
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512 F/BW/VL detected (`chunks_supported`); shapes checked above.
    unsafe {
        macro_rules! go {
            ($n:literal) => {
                chunks_n::<PagedKv<'_>, $n>(tile, kv, scale, stride, scores, chunks, parts)
            };
        }
        match nq {
            8 => go!(8),
            7 => go!(7),
            6 => go!(6),
            5 => go!(5),
            4 => go!(4),
            3 => go!(3),
            2 => go!(2),
            _ => go!(1),
        }
    }
}

/// Runs attention for up to [`MAX_ROWS`] query rows against `kv`, writing each result to
/// `out[i]`. `scores` is scratch.
pub fn attend(
    isa: Isa,
    tile: &AttnTile<'_>,
    kv: &KvSource<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    let nq = tile.q.len();
    let maxlen = tile.lens.iter().copied().max().unwrap_or(0);
    debug_assert!(nq <= MAX_ROWS && tile.lens.iter().all(|&l| l >= 1));
    debug_assert!(maxlen <= kv.capacity());
    // Score rows are padded to 32 positions; every score read is written first.
    let stride = maxlen.div_ceil(32) * 32;
    if scores.len() < MAX_ROWS * stride {
        scores.resize(MAX_ROWS * stride, 0.0);
    }
    let hd = kv.head_dim();
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && hd.is_multiple_of(16) && hd <= MAX_HEAD_DIM {
        match kv {
            KvSource::Paged(p) if p.dtype == KvDtype::F16 => {
                // SAFETY: AVX-512 F/BW/VL detected; shapes checked above and by the caller.
                unsafe { attend_avx512(tile, p, scale, stride, scores, out) };
                return;
            }
            KvSource::F32(c) => {
                // SAFETY: as above.
                unsafe { attend_avx512(tile, c, scale, stride, scores, out) };
                return;
            }
            KvSource::Paged(_) => {}
        }
    }
    let _ = isa;
    for i in 0..nq {
        let len = tile.lens[i];
        let s = &mut scores[i * stride..i * stride + len];
        for (p, sp) in s.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for d in 0..hd {
                acc += tile.q[i][d] * kv.k(p, d);
            }
            *sp = acc * scale;
        }
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0.0f32;
        for v in s.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let o = &mut out[i][..hd];
        o.fill(0.0);
        for (p, &w) in s.iter().enumerate() {
            for d in 0..hd {
                o[d] += w * kv.v(p, d);
            }
        }
        for v in o.iter_mut() {
            *v /= sum;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn attend_avx512<S: Src>(
    tile: &AttnTile<'_>,
    kv: &S,
    scale: f32,
    stride: usize,
    scores: &mut [f32],
    out: &mut [&mut [f32]],
) {
    match tile.q.len() {
        8 => attend_n::<S, 8>(tile, kv, scale, stride, scores, out),
        7 => attend_n::<S, 7>(tile, kv, scale, stride, scores, out),
        6 => attend_n::<S, 6>(tile, kv, scale, stride, scores, out),
        5 => attend_n::<S, 5>(tile, kv, scale, stride, scores, out),
        4 => attend_n::<S, 4>(tile, kv, scale, stride, scores, out),
        3 => attend_n::<S, 3>(tile, kv, scale, stride, scores, out),
        2 => attend_n::<S, 2>(tile, kv, scale, stride, scores, out),
        _ => attend_n::<S, 1>(tile, kv, scale, stride, scores, out),
    }
}

/// K/V as the AVX-512 kernels read them (in place in f16 pages, or an f32 copy).
#[cfg(target_arch = "x86_64")]
trait Src {
    /// Head dimension.
    fn head_dim(&self) -> usize;
    /// Whether [`Src::k_block`] may need a `[head_dim][16]` scratch of u16.
    fn needs_tmp(&self) -> bool;
    /// Keys of positions `16b..16b + 16` (those below `maxlen`): a pointer to dimension 0's
    /// 16 values, the distance in elements between dimensions, and the lane mask.
    fn k_block(&self, b: usize, maxlen: usize, tmp: &mut [u16]) -> (*const u8, usize, u16);
    /// 16 keys at element `at` of `p` (lanes outside `m` read as zero), as f32.
    unsafe fn load_k(p: *const u8, at: usize, m: u16) -> __m512;
    /// V rows from position `p`: a pointer to row `p`'s dimension `16c` (the next `C × 16`
    /// values are readable), the end of the run of rows reachable by stepping, the step in
    /// bytes.
    fn v_run(&self, p: usize, maxlen: usize, c: usize, cn: usize) -> (*const u8, usize, usize);
    /// The 16 values of chunk `j` of the V row at `p`, as f32.
    unsafe fn load_v(p: *const u8, j: usize) -> __m512;
    /// Hints the caches to fetch the keys of the [`PREFETCH_K_AHEAD`] blocks that follow a
    /// tile of that many blocks from `b` (those below `maxlen`).
    fn prefetch_k_ahead(&self, _b: usize, _maxlen: usize) {}
    /// Hints the caches to fetch dimensions `16c..16(c + cn)` of the V rows of the page
    /// holding position `p` (if below `maxlen`).
    fn prefetch_v(&self, _p: usize, _maxlen: usize, _c: usize, _cn: usize) {}
}

#[cfg(target_arch = "x86_64")]
impl Src for PagedKv<'_> {
    fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn needs_tmp(&self) -> bool {
        !self.page_size.is_multiple_of(16)
    }

    fn k_block(&self, b: usize, maxlen: usize, tmp: &mut [u16]) -> (*const u8, usize, u16) {
        paged_k_block(self, b, maxlen, tmp)
    }

    #[inline]
    unsafe fn load_k(p: *const u8, at: usize, m: u16) -> __m512 {
        load_ph((p as *const u16).add(at), m)
    }

    fn v_run(&self, p: usize, maxlen: usize, c: usize, cn: usize) -> (*const u8, usize, usize) {
        let ps = self.page_size;
        let end = ((p / ps + 1) * ps).min(maxlen);
        let first = self.v_row(p) + c * 32;
        // Every row read (cn × 16 values from `first + k * v_stride`) lies inside the pool.
        let last = first + (end - 1 - p) * self.v_stride + cn * 32;
        assert!(last <= self.raw.len());
        (self.raw[first..].as_ptr(), end, self.v_stride)
    }

    #[inline]
    unsafe fn load_v(p: *const u8, j: usize) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.add(j * 32) as *const __m256i))
    }

    // A sequence's pages lie a whole KV page (every layer) apart, so the hardware
    // prefetchers lose the stream at each page; decode over long contexts waits on memory
    // without these hints.
    #[inline]
    fn prefetch_k_ahead(&self, b: usize, maxlen: usize) {
        let ps = self.page_size;
        // One 32-byte row of 16 slots per dimension, `ps * 2` bytes apart.
        let span = ((self.head_dim - 1) * ps + 16) * 2;
        for blk in b + PREFETCH_K_AHEAD..b + 2 * PREFETCH_K_AHEAD {
            let p0 = blk * 16;
            if p0 >= maxlen {
                return;
            }
            let off = self.page_base(p0) + self.k_off + (p0 % ps) * 2;
            prefetch_lines(self.raw, off, span, (ps * 2).max(64));
        }
    }

    #[inline]
    fn prefetch_v(&self, p: usize, maxlen: usize, c: usize, cn: usize) {
        if p >= maxlen {
            return;
        }
        let ps = self.page_size;
        let first = self.page_base(p) + self.v_off + c * 32;
        let rows = (maxlen - p / ps * ps).min(ps);
        for r in 0..rows {
            prefetch_lines(self.raw, first + r * self.v_stride, cn * 32, 64);
        }
    }
}

/// Prefetches the cache lines of `raw[off..off + len]`, one hint every `step` bytes (no hint
/// outside `raw`).
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_lines(raw: &[u8], off: usize, len: usize, step: usize) {
    let end = (off + len).min(raw.len());
    let mut o = off;
    while o < end {
        // SAFETY: `o` is inside `raw`; a prefetch only hints the cache and faults on nothing.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(raw.as_ptr().add(o) as *const i8) };
        o += step;
    }
}

#[cfg(target_arch = "x86_64")]
impl Src for &KvF32 {
    fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn needs_tmp(&self) -> bool {
        false
    }

    fn k_block(&self, b: usize, maxlen: usize, _: &mut [u16]) -> (*const u8, usize, u16) {
        let hd = self.head_dim;
        assert!(maxlen <= self.len);
        let block = &self.kt[b * hd * 16..(b + 1) * hd * 16];
        (block.as_ptr() as *const u8, 16, lane_mask(maxlen, b))
    }

    #[inline]
    unsafe fn load_k(p: *const u8, at: usize, m: u16) -> __m512 {
        _mm512_maskz_loadu_ps(m, (p as *const f32).add(at))
    }

    fn v_run(&self, p: usize, maxlen: usize, c: usize, cn: usize) -> (*const u8, usize, usize) {
        let hd = self.head_dim;
        assert!(maxlen <= self.len && (c + cn) * 16 <= hd);
        let row = &self.v[p * hd + c * 16..];
        (row.as_ptr() as *const u8, maxlen, hd * 4)
    }

    #[inline]
    unsafe fn load_v(p: *const u8, j: usize) -> __m512 {
        _mm512_loadu_ps((p as *const f32).add(j * 16))
    }
}

/// Keys of positions `16b..16b + 16` of the pages (those below `maxlen`): a pointer to
/// dimension 0's 16 f16 values, the distance in elements between dimensions, and the lane
/// mask. With pages of a multiple of 16 positions the block is read in place; otherwise it is
/// copied into `tmp` (`[head_dim][16]`).
#[cfg(target_arch = "x86_64")]
#[inline]
fn paged_k_block(
    kv: &PagedKv<'_>,
    b: usize,
    maxlen: usize,
    tmp: &mut [u16],
) -> (*const u8, usize, u16) {
    let p0 = b * 16;
    let cnt = (maxlen - p0).min(16);
    let mask = if cnt == 16 {
        0xFFFF
    } else {
        ((1u32 << cnt) - 1) as u16
    };
    let ps = kv.page_size;
    if ps.is_multiple_of(16) {
        let off = kv.page_base(p0) + kv.k_off + (p0 % ps) * 2;
        // The block's 16 slots of every dimension lie inside the page (ps is a multiple of 16).
        let last = off + ((kv.head_dim - 1) * ps + 15) * 2;
        assert!(last + 2 <= kv.raw.len());
        return (kv.raw[off..].as_ptr(), ps, mask);
    }
    for j in 0..cnt {
        let p = p0 + j;
        let base = kv.page_base(p) + kv.k_off + (p % ps) * 2;
        for d in 0..kv.head_dim {
            let o = base + d * ps * 2;
            tmp[d * 16 + j] = u16::from_le_bytes([kv.raw[o], kv.raw[o + 1]]);
        }
    }
    (tmp.as_ptr() as *const u8, 16, mask)
}

/// 16 f16 values at `p` (lanes outside `m` read as zero) converted to f32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_ph(p: *const u16, m: u16) -> __m512 {
    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16))
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn attend_n<S: Src, const N: usize>(
    tile: &AttnTile<'_>,
    kv: &S,
    scale: f32,
    stride: usize,
    scores: &mut [f32],
    out: &mut [&mut [f32]],
) {
    let maxlen = tile.lens[..N].iter().copied().max().unwrap_or(0);
    let sp = scores.as_mut_ptr();
    let nchunks = maxlen.div_ceil(SOFTMAX_CHUNK);
    if nchunks > 1 {
        // Long rows: every chunk's partials, then the merge (the bits of a split row).
        merged_chunks(N, kv.head_dim(), nchunks, out, |rows| {
            chunks_n::<S, N>(tile, kv, scale, stride, scores, 0..nchunks, rows)
        });
        return;
    }
    let blocks = maxlen.div_ceil(16);
    score_blocks::<S, N>(tile, kv, scale, stride, sp, 0..blocks, maxlen);
    // Softmax per row; probabilities past a row's length become 0.
    let mut inv = [0.0f32; N];
    for i in 0..N {
        inv[i] = 1.0 / softmax_range(sp.add(i * stride), tile.lens[i], 0, blocks).1;
    }
    weighted_sums::<S, N>(tile, kv, sp, stride, 0, maxlen, &inv, out);
}

/// [`attend_n`]'s partials for the chunks `chunks` (see [`SOFTMAX_CHUNK`]): scores of
/// those positions only, then per chunk each row's max and sum, and its unnormalised
/// weighted sum of V into `parts[i]` at `(c - chunks.start) * chunk_partial_len`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn chunks_n<S: Src, const N: usize>(
    tile: &AttnTile<'_>,
    kv: &S,
    scale: f32,
    stride: usize,
    scores: &mut [f32],
    chunks: std::ops::Range<usize>,
    parts: &mut [&mut [f32]],
) {
    let maxlen = tile.lens[..N].iter().copied().max().unwrap_or(0);
    let sp = scores.as_mut_ptr();
    let hd = kv.head_dim();
    let (p_lo, p_hi) = (
        (chunks.start * SOFTMAX_CHUNK).min(maxlen),
        (chunks.end * SOFTMAX_CHUNK).min(maxlen),
    );
    score_blocks::<S, N>(
        tile,
        kv,
        scale,
        stride,
        sp,
        p_lo / 16..p_hi.div_ceil(16),
        maxlen,
    );
    let ones = [1.0f32; N];
    chunk_partials(
        sp,
        stride,
        &tile.lens[..N],
        maxlen,
        chunks,
        hd,
        parts,
        |p0, p1, accs| {
            // SAFETY: as the caller's: AVX-512 detected, the tile's shapes checked.
            unsafe { weighted_sums::<S, N>(tile, kv, sp, stride, p0, p1, &ones, accs) }
        },
    );
}

/// Rows of `n` × `hd` attention computed as `nchunks` chunk partials by `fill` (given each
/// row's partials, `nchunks` × [`chunk_partial_len`] floats), merged into `out`.
#[cfg(target_arch = "x86_64")]
fn merged_chunks(
    n: usize,
    hd: usize,
    nchunks: usize,
    out: &mut [&mut [f32]],
    fill: impl FnOnce(&mut [&mut [f32]]),
) {
    let w = nchunks * chunk_partial_len(hd);
    let mut parts = vec![0.0f32; n * w];
    let mut rows: Vec<&mut [f32]> = parts.chunks_mut(w).collect();
    fill(&mut rows);
    for (p, o) in parts.chunks(w).zip(out.iter_mut()) {
        merge_chunks(p, hd, o);
    }
}

/// For each chunk of `chunks` (see [`SOFTMAX_CHUNK`]), the partials of rows whose scores
/// are at `sp` (row stride `stride`, lengths `lens`): each row's softmax over the chunk's
/// positions (its max and sum), then `sums(p0, p1, accs)` writes the rows' unnormalised
/// weighted V sums over positions `p0..p1` into `accs`. Row `i`'s partial of chunk `c` is
/// at `(c - chunks.start) * chunk_partial_len` in `parts[i]`. One loop for every kernel,
/// so that they agree bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn chunk_partials(
    sp: *mut f32,
    stride: usize,
    lens: &[usize],
    maxlen: usize,
    chunks: std::ops::Range<usize>,
    hd: usize,
    parts: &mut [&mut [f32]],
    mut sums: impl FnMut(usize, usize, &mut [&mut [f32]]),
) {
    let w = chunk_partial_len(hd);
    for (k, c) in chunks.enumerate() {
        let (p0, p1) = (
            (c * SOFTMAX_CHUNK).min(maxlen),
            ((c + 1) * SOFTMAX_CHUNK).min(maxlen),
        );
        for (i, &len) in lens.iter().enumerate() {
            let (m, l) = softmax_range(sp.add(i * stride), len, p0 / 16, p1.div_ceil(16));
            parts[i][k * w] = m;
            parts[i][k * w + 1] = l;
        }
        // Rows with no position in the chunk get empty sums there.
        let mut accs: Vec<&mut [f32]> = parts
            .iter_mut()
            .take(lens.len())
            .map(|p| &mut p[k * w + 2..(k + 1) * w])
            .collect();
        sums(p0, p1, &mut accs);
    }
}

/// Scores of blocks `range` (16 positions each) for `N` rows into `sp` (row stride `stride`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn score_blocks<S: Src, const N: usize>(
    tile: &AttnTile<'_>,
    kv: &S,
    scale: f32,
    stride: usize,
    sp: *mut f32,
    range: std::ops::Range<usize>,
    maxlen: usize,
) {
    let blocks = range.end;
    // Copies of blocks that straddle pages (only with page sizes that are not multiples of 16).
    let mut tmp = if kv.needs_tmp() {
        vec![0u16; 4 * kv.head_dim() * 16]
    } else {
        Vec::new()
    };
    let q = tmp.len() / 4;
    let (t0, rest) = tmp.split_at_mut(q);
    let (t1, rest) = rest.split_at_mut(q);
    let (t2, t3) = rest.split_at_mut(q);
    // Scores: 32 positions × N queries per register tile (2N independent FMA chains).
    // Each block's scores are the same whatever tile it is in.
    let mut b = range.start;
    while b < blocks {
        if N <= 4 && b + 3 < blocks {
            // Few rows (decode): four blocks per tile, so that enough independent FMA chains
            // hide the latency.
            kv.prefetch_k_ahead(b, maxlen);
            let k0 = kv.k_block(b, maxlen, t0);
            let k1 = kv.k_block(b + 1, maxlen, t1);
            let k2 = kv.k_block(b + 2, maxlen, t2);
            let k3 = kv.k_block(b + 3, maxlen, t3);
            scores_tile::<S, N, 4>(
                tile,
                kv.head_dim(),
                [k0, k1, k2, k3],
                scale,
                sp.add(b * 16),
                stride,
            );
            b += 4;
        } else if b + 1 < blocks {
            let k0 = kv.k_block(b, maxlen, t0);
            let k1 = kv.k_block(b + 1, maxlen, t1);
            scores_tile::<S, N, 2>(tile, kv.head_dim(), [k0, k1], scale, sp.add(b * 16), stride);
            b += 2;
        } else {
            let k0 = kv.k_block(b, maxlen, t0);
            scores_tile::<S, N, 1>(tile, kv.head_dim(), [k0], scale, sp.add(b * 16), stride);
            b += 1;
        }
    }
}

/// `out[i] = inv[i] Σ_p P[i][p] V[p]` over positions `p0..p1` (the tile's rows' weights at
/// `sp`, 0 past each row's length).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn weighted_sums<S: Src, const N: usize>(
    tile: &AttnTile<'_>,
    kv: &S,
    sp: *mut f32,
    stride: usize,
    p0: usize,
    p1: usize,
    inv: &[f32],
    out: &mut [&mut [f32]],
) {
    let maxlen = p1;
    // Weighted sum of V rows. Five or more rows (prefill tiles): all of them × 32 dimensions
    // per register tile, so each V load (from L2 in a prefill task's f32 copy) feeds every
    // row of the tile — two 4-row passes over all dimensions read V twice as often. The
    // per-element FMA order (positions in order) is the same in every tile shape.
    let chunks = kv.head_dim() / 16;
    if N > 4 && chunks.is_multiple_of(2) {
        let len = maxlen;
        let mut c = 0;
        while c < chunks {
            pv::<S, N, 2>(kv, sp, stride, p0, len, c, inv, out);
            c += 2;
        }
        return;
    }
    // Otherwise 64 dimensions × up to 4 queries per register tile, then the rest 16 at a
    // time.
    let mut i0 = 0;
    while i0 < N {
        let nr = (N - i0).min(4);
        let len = tile.lens[i0..i0 + nr]
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .min(maxlen);
        if len <= p0 {
            // No position of these rows here (a chunk past them): empty sums.
            for o in out[i0..i0 + nr].iter_mut() {
                o[..kv.head_dim()].fill(0.0);
            }
            i0 += nr;
            continue;
        }
        let (sp, inv, out) = (
            sp.add(i0 * stride),
            &inv[i0..i0 + nr],
            &mut out[i0..i0 + nr],
        );
        match nr {
            4 => pv_rows::<S, 4>(kv, sp, stride, p0, len, inv, out),
            3 => pv_rows::<S, 3>(kv, sp, stride, p0, len, inv, out),
            2 => pv_rows::<S, 2>(kv, sp, stride, p0, len, inv, out),
            _ => pv_rows::<S, 1>(kv, sp, stride, p0, len, inv, out),
        }
        i0 += nr;
    }
}

/// Turns blocks `b0..b1` of one row of scores (16 positions each, at `row`) into
/// unnormalised probabilities in place (0 past `len`); returns their max score and their sum
/// (`-inf` and 0 when no position of the blocks is below `len`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn softmax_range(row: *mut f32, len: usize, b0: usize, b1: usize) -> (f32, f32) {
    use super::elementwise::exp512;
    let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
    for pb in b0..b1 {
        let m = lane_mask(len, pb);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_loadu_ps(row.add(pb * 16)));
    }
    let max = _mm512_reduce_max_ps(mx);
    let mxv = _mm512_set1_ps(max);
    let mut sum = _mm512_setzero_ps();
    for pb in b0..b1 {
        let m = lane_mask(len, pb);
        let e = _mm512_maskz_mov_ps(
            m,
            exp512(_mm512_sub_ps(_mm512_loadu_ps(row.add(pb * 16)), mxv)),
        );
        _mm512_storeu_ps(row.add(pb * 16), e);
        sum = _mm512_add_ps(sum, e);
    }
    (max, _mm512_reduce_add_ps(sum))
}

/// Scaled scores of `N` query rows against `B` key blocks of 16 positions (`k_block`
/// results), stored at `sp + i * stride + 16 j` (all 16 lanes; masked lanes score 0).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn scores_tile<S: Src, const N: usize, const B: usize>(
    tile: &AttnTile<'_>,
    hd: usize,
    ks: [(*const u8, usize, u16); B],
    scale: f32,
    sp: *mut f32,
    stride: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); N]; B];
    for d in 0..hd {
        let mut kk = [_mm512_setzero_ps(); B];
        for j in 0..B {
            kk[j] = S::load_k(ks[j].0, d * ks[j].1, ks[j].2);
        }
        for i in 0..N {
            let q = _mm512_set1_ps(*tile.q[i].get_unchecked(d));
            for j in 0..B {
                acc[j][i] = _mm512_fmadd_ps(q, kk[j], acc[j][i]);
            }
        }
    }
    let vscale = _mm512_set1_ps(scale);
    for i in 0..N {
        for j in 0..B {
            _mm512_storeu_ps(
                sp.add(i * stride + j * 16),
                _mm512_mul_ps(acc[j][i], vscale),
            );
        }
    }
}

/// [`pv`] over every dimension for `N` query rows.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_rows<S: Src, const N: usize>(
    kv: &S,
    sp: *const f32,
    stride: usize,
    p0: usize,
    maxlen: usize,
    inv: &[f32],
    out: &mut [&mut [f32]],
) {
    let chunks = kv.head_dim() / 16;
    let mut c = 0;
    while c + 4 <= chunks {
        pv::<S, N, 4>(kv, sp, stride, p0, maxlen, c, inv, out);
        c += 4;
    }
    while c < chunks {
        pv::<S, N, 1>(kv, sp, stride, p0, maxlen, c, inv, out);
        c += 1;
    }
}

/// `out[i][16c..16(c + C)] = inv[i] Σ_p P[i][p] V[p][16c..16(c + C)]` over positions
/// `p0..maxlen`, V read page by page.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv<S: Src, const N: usize, const C: usize>(
    kv: &S,
    sp: *const f32,
    stride: usize,
    p0: usize,
    maxlen: usize,
    c: usize,
    inv: &[f32],
    out: &mut [&mut [f32]],
) {
    let mut acc = [[_mm512_setzero_ps(); C]; N];
    let mut p = p0;
    while p < maxlen {
        let (mut vp, end, vstride) = kv.v_run(p, maxlen, c, C);
        kv.prefetch_v(end + PREFETCH_V_AHEAD, maxlen, c, C);
        for pos in p..end {
            let mut vv = [_mm512_setzero_ps(); C];
            for j in 0..C {
                vv[j] = S::load_v(vp, j);
            }
            for i in 0..N {
                let w = _mm512_set1_ps(*sp.add(i * stride + pos));
                for j in 0..C {
                    acc[i][j] = _mm512_fmadd_ps(w, vv[j], acc[i][j]);
                }
            }
            vp = vp.wrapping_add(vstride);
        }
        p = end;
    }
    for i in 0..N {
        for j in 0..C {
            let o = _mm512_mul_ps(acc[i][j], _mm512_set1_ps(inv[i]));
            _mm512_storeu_ps(out[i].as_mut_ptr().add((c + j) * 16), o);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn lane_mask(len: usize, pb: usize) -> __mmask16 {
    let valid = len.saturating_sub(pb * 16).min(16);
    if valid == 16 {
        0xFFFF
    } else {
        ((1u32 << valid) - 1) as u16
    }
}

#[cfg(test)]
mod tests;
