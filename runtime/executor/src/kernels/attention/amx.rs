//! Prefill attention on AMX-BF16 tiles (opt-in: `SGLRS_AMX_ATTENTION=1`).
//!
//! A prefill task's query rows go 16 at a time through `tdpbf16ps`, which multiplies bf16
//! pairs and adds in f32. bf16 keeps 8 significant bits, so every operand is split in two,
//! `x = hi + lo` (both rounded to bf16 with `vcvtne2ps2bf16`), and each product is three
//! tile products, `hi·hi + hi·lo + lo·hi`:
//! - K and V come from f16 pages (11 significant bits): `hi + lo` is exactly the stored value;
//!   so is Q, which the forward pass rounds to f16 first (as llama.cpp does), scaled by
//!   `1/√d` where that is a power of two (d = 64);
//! - the softmax weights (and Q under other scales) are f32: `hi + lo` is within 2⁻¹⁷ of
//!   them (relative), and the dropped `lo·lo` is below 2⁻¹⁶ of the product.
//!
//! So a score or a weighted sum is within about 2⁻¹⁵ (relative to the magnitudes summed) of
//! the f32 kernel's (`tiles_match_the_f32_kernel_closely`: at most 1.2e-5 apart on values
//! of ±2), far closer than llama.cpp's CPU attention, which rounds Q and the weights to f16.
//! It is not the same bits as the f32 kernels, though: decode steps (one row per head) stay
//! on those, so a page written by a decode step and the same position prefilled here differ
//! in the last bits, and a prefix-cache hit is no longer bit-identical to recomputing it.
//! That is why it is opt-in (unlike `SGLRS_AMX=1`'s matmul tiles, which are bit-identical).
//! Within the tiles each row's result depends only on the row (other rows of its tile and
//! the task's split change nothing), so batching and chunking stay bit-exact.
//!
//! The positions are taken [`CHUNK`] at a time with an online softmax (running max and sum
//! per row, earlier sums rescaled), so that a chunk's K and V stay in cache while all the
//! task's query tiles pass over them.
//!
//! Layouts (all bf16 as `u16`, tiles 16 rows × 64 bytes):
//! - K, per block of 16 positions and chunk of 32 dimensions: the B tile of the scores, row
//!   `r` holding dimensions `2r, 2r + 1` of the 16 positions, interleaved;
//! - V, per block of 32 positions and chunk of 16 dimensions: the B tile of the weighted sum,
//!   row `r` holding positions `2r, 2r + 1` of the 16 dimensions, interleaved;
//! - Q and the weights: row-major A tiles, one row per query; the scores block-major.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{lane_mask, load_ph, paged_k_block, AttnTile, PagedKv};
use crate::kernels::dot_avx512::amx::{cpu_has, TileConfig};
use crate::KvDtype;

/// Query rows per tile.
pub const ROWS: usize = 16;

/// Largest head dimension (a multiple of 32) the tiles take.
const MAX_HEAD_DIM: usize = 256;

/// The CPU has AMX-TILE and AMX-BF16 and Linux let this process use the tile data. Cached.
pub fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    // SAFETY: `cpuid` exists on every x86-64; the syscall only asks for a permission.
    *ON.get_or_init(|| unsafe { detect() })
}

unsafe fn detect() -> bool {
    // AMX-BF16 (bit 22) and AMX-TILE (bit 24); AVX-512 F/BW/BF16 for the conversions.
    cpu_has(1 << 22 | 1 << 24)
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16")
        && crate::kernels::dot_avx512::amx::request_tile_data()
}

/// `SGLRS_AMX_ATTENTION=1`. Cached.
pub fn wanted() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SGLRS_AMX_ATTENTION").is_ok_and(|v| v == "1"))
}

/// Whether [`attend`] can run over `kv` here (f16 pages, a head dimension that is a
/// multiple of 32, tiles available).
pub fn supports(kv: &PagedKv<'_>) -> bool {
    kv.dtype == KvDtype::F16
        && kv.head_dim.is_multiple_of(32)
        && kv.head_dim <= MAX_HEAD_DIM
        && available()
}

/// One task's K and V in the tiles' bf16 hi/lo layouts (see the module's notes).
#[derive(Clone, Debug, Default)]
pub struct KvBf16 {
    len: usize,
    head_dim: usize,
    kh: Vec<u16>,
    kl: Vec<u16>,
    vh: Vec<u16>,
    vl: Vec<u16>,
    /// What the held positions were converted from (as [`super::KvF32`]'s).
    key: Option<(usize, usize, usize, u64)>,
    from_pages: Vec<u32>,
}

/// u16 per tile (16 rows × 32).
const TILE: usize = 512;

impl KvBf16 {
    /// Converts positions `0..len` of `kv`, keeping those already held that come from the
    /// same pages of the same pool and head under the same `epoch` (the caller promises no
    /// page changed between two fills with one epoch; see [`super::KvF32::fill_reusing`]).
    ///
    /// # Panics
    /// Unless [`supports`]`(kv)` and `len` is within the page table.
    pub fn fill_reusing(&mut self, kv: &PagedKv<'_>, len: usize, epoch: u64) {
        assert!(supports(kv) && len <= kv.capacity());
        // Whole 32-position blocks (one V tile) of the whole pages still held (the same key
        // means the same pool and head, so the same head dimension).
        let held = super::copies::held_pages(
            &mut self.key,
            &mut self.from_pages,
            kv,
            epoch,
            self.len,
            len,
        );
        let keep = held / 32 * 32;
        let hd = kv.head_dim;
        self.len = len;
        self.head_dim = hd;
        // Room for whole 32-position blocks (two K blocks each), grown only.
        let n = len.div_ceil(32) * 32 * hd;
        for b in [&mut self.kh, &mut self.kl, &mut self.vh, &mut self.vl] {
            if b.len() < n {
                b.resize(n, 0);
            }
        }
        // SAFETY: `supports` checked AVX-512 F/BW/BF16; buffers sized above.
        unsafe { self.fill_from(kv, keep) };
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn fill_from(&mut self, kv: &PagedKv<'_>, from: usize) {
        let (hd, len) = (self.head_dim, self.len);
        let (dch, vch) = (hd / 32, hd / 16);
        let end = len.div_ceil(32) * 32;
        let mut tmp = if kv.page_size.is_multiple_of(16) {
            Vec::new()
        } else {
            vec![0u16; hd * 16]
        };
        let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr() as *const __m512i);
        // K: 16 positions per block; blocks past `len` hold zeros.
        for b in from / 16..end / 16 {
            let base = b * dch * TILE;
            if b * 16 >= len {
                for buf in [&mut self.kh, &mut self.kl] {
                    buf[base..base + dch * TILE].fill(0);
                }
                continue;
            }
            let (kp, ks, m) = paged_k_block(kv, b, len, &mut tmp);
            for d in (0..hd).step_by(2) {
                let x0 = load_ph((kp as *const u16).add(d * ks), m);
                let x1 = load_ph((kp as *const u16).add((d + 1) * ks), m);
                let (h, l) = split2(x0, x1);
                let at = base + (d / 32) * TILE + (d % 32) / 2 * 32;
                store_interleaved(self.kh.as_mut_ptr().add(at), idx, h);
                store_interleaved(self.kl.as_mut_ptr().add(at), idx, l);
            }
        }
        // V: 32 positions per block, pairs of positions interleaved.
        let row = |p: usize, c: usize| -> __m512 {
            if p >= len {
                return _mm512_setzero_ps();
            }
            let o = kv.v_row(p) + c * 32;
            let src = kv.raw[o..o + 32].as_ptr();
            _mm512_cvtph_ps(_mm256_loadu_si256(src as *const __m256i))
        };
        for vb in from / 32..end / 32 {
            for r in 0..16 {
                let p = vb * 32 + 2 * r;
                for c in 0..vch {
                    let (h, l) = split2(row(p, c), row(p + 1, c));
                    let at = (vb * vch + c) * TILE + r * 32;
                    store_interleaved(self.vh.as_mut_ptr().add(at), idx, h);
                    store_interleaved(self.vl.as_mut_ptr().add(at), idx, l);
                }
            }
        }
    }
}

impl super::HeadCopy for KvBf16 {
    fn key(&self) -> Option<(usize, usize, usize, u64)> {
        self.key
    }

    fn heap_bytes(&self) -> usize {
        [&self.kh, &self.kl, &self.vh, &self.vl]
            .iter()
            .map(|b| b.capacity() * 2)
            .sum()
    }
}

/// Lane order that interleaves two 16-lane halves: `a0 b0 a1 b1 …`.
static INTERLEAVE: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut i = 0;
    while i < 16 {
        t[2 * i] = i as u16;
        t[2 * i + 1] = 16 + i as u16;
        i += 1;
    }
    t
};

/// `x = hi + lo` for the 32 lanes of `x0` then `x1`: hi is `x` rounded to bf16, lo the rest
/// rounded to bf16 (both to nearest, ties to even); 32 bf16 each, in lane order. Exact for
/// values with at most 16 significant bits (every f16); within 2⁻¹⁶ of others (relative).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn split2(x0: __m512, x1: __m512) -> (__m512i, __m512i) {
    let hi = _mm512_cvtne2ps_pbh(x1, x0);
    let h: __m512i = std::mem::transmute(hi);
    // bf16 → f32 is a shift into the high half.
    let h0 = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)));
    let h1 = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(h)));
    let r0 = _mm512_sub_ps(x0, _mm512_castsi512_ps(h0));
    let r1 = _mm512_sub_ps(x1, _mm512_castsi512_ps(h1));
    (
        h,
        std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(r1, r0)),
    )
}

/// Stores the two 16-lane halves of `v` interleaved at `dst`: `a0 b0 a1 b1 …` (32 values).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn store_interleaved(dst: *mut u16, idx: __m512i, v: __m512i) {
    _mm512_storeu_si512(dst as *mut __m512i, _mm512_permutexvar_epi16(idx, v));
}

/// Positions per chunk of the online softmax: a chunk's K and V (256 KiB each at 64
/// dimensions) stay in L2 while every query tile of the task passes over them. Fewer
/// chunks mean fewer rescales and sum stores: at 3,400-token prefills 1,024 gave +4.5% over
/// 256, 2,048 the same as 1,024, a single chunk less (2026-12-06, 2-vCPU Xeon).
const CHUNK: usize = 1024;

/// Online softmax over one chunk for row `i` of a tile: the chunk's scores (`blocks` blocks
/// of 16 × 16 at `scores`, block-major; block `pb` is position block `pb0 + pb`, lanes at or
/// past `len` excluded) update the row's running max `m` and sum `l`; the weights
/// `exp(s - m)` are written split to `ph`/`pl` (blocks of 16 rows × 32 positions, 0 for
/// excluded lanes and for blocks `blocks..out_blocks`). Returns the factor the row's
/// earlier sums must be scaled by (`exp(m_old - m_new)`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn softmax_chunk(
    scores: *const f32,
    i: usize,
    len: usize,
    pb0: usize,
    blocks: usize,
    out_blocks: usize,
    (m, l): (&mut f32, &mut f32),
    ph: *mut u16,
    pl: *mut u16,
) -> f32 {
    use crate::kernels::elementwise::exp512;
    let row = scores.add(i * 16);
    let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
    for pb in 0..blocks {
        let k = lane_mask(len, pb0 + pb);
        mx = _mm512_mask_max_ps(mx, k, mx, _mm512_load_ps(row.add(pb * 256)));
    }
    let m_new = m.max(_mm512_reduce_max_ps(mx));
    let mxv = _mm512_set1_ps(m_new);
    let mut sum = _mm512_setzero_ps();
    let weights = |pb: usize| -> __m512 {
        let k = if pb < blocks {
            lane_mask(len, pb0 + pb)
        } else {
            0
        };
        if k == 0 {
            return _mm512_setzero_ps();
        }
        let x = _mm512_sub_ps(_mm512_load_ps(row.add(pb * 256)), mxv);
        _mm512_maskz_mov_ps(k, exp512(x))
    };
    for pb in (0..out_blocks).step_by(2) {
        let (e0, e1) = (weights(pb), weights(pb + 1));
        sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
        let (h, lo) = split2(e0, e1);
        let at = p_at(i, pb);
        _mm512_store_si512(ph.add(at) as *mut __m512i, h);
        _mm512_store_si512(pl.add(at) as *mut __m512i, lo);
    }
    // The first chunk has m = -inf and nothing summed yet: any factor does.
    let factor = if *m == f32::NEG_INFINITY {
        0.0
    } else {
        (*m - m_new).exp()
    };
    *l = *l * factor + _mm512_reduce_add_ps(sum);
    *m = m_new;
    factor
}

/// Where positions `16pb..16pb + 16` of weight row `i` go: blocks of 16 rows × 32 positions.
#[inline]
fn p_at(i: usize, pb: usize) -> usize {
    (pb / 2) * TILE + i * 32 + (pb % 2) * 16
}

/// `v` grown to hold `n` elements from a 64-byte boundary; that boundary.
fn aligned<T: Default + Clone>(v: &mut Vec<T>, n: usize) -> *mut T {
    let extra = 64 / std::mem::size_of::<T>();
    if v.len() < n + extra {
        v.resize(n + extra, T::default());
    }
    let p = v.as_mut_ptr();
    // SAFETY: the offset is below `extra`, and `n` elements follow it inside `v`.
    unsafe { p.add(p.align_offset(64)) }
}

/// Scratch of [`attend`], reused between calls.
#[derive(Debug, Default)]
pub struct Scratch {
    scores: Vec<f32>,
    qh: Vec<u16>,
    ql: Vec<u16>,
    ph: Vec<u16>,
    pl: Vec<u16>,
    sums: Vec<f32>,
    acc: Vec<f32>,
    ml: Vec<(f32, f32)>,
}

/// Runs attention for query rows `tile.q` against `kv` (row `i` sees positions
/// `0..tile.lens[i]`), writing `out[i]`, like [`super::attend`] but on the tiles: any number
/// of rows, 16 per tile, every tile passing over the positions a chunk at a time.
///
/// # Panics
/// If `kv` holds fewer positions than a row sees, or the shapes disagree.
pub fn attend(
    tile: &AttnTile<'_>,
    kv: &KvBf16,
    scale: f32,
    s: &mut Scratch,
    out: &mut [&mut [f32]],
) {
    let nq = tile.q.len();
    let hd = kv.head_dim;
    assert!(tile.lens.len() == nq && out.len() == nq);
    assert!(tile.lens.iter().all(|&l| l >= 1 && l <= kv.len));
    assert!(tile.q.iter().all(|q| q.len() >= hd) && out.iter().all(|o| o.len() >= hd));
    if nq == 0 {
        return;
    }
    // SAFETY: `supports` held for the fill of `kv` (AMX-BF16, AVX-512 F/BW/BF16); the scratch is
    // sized in `attend_tiles`, and every tile read lies inside it or in `kv`.
    unsafe { attend_tiles(tile, kv, scale, s, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn attend_tiles(
    tile: &AttnTile<'_>,
    kv: &KvBf16,
    scale: f32,
    s: &mut Scratch,
    out: &mut [&mut [f32]],
) {
    let nq = tile.q.len();
    let hd = kv.head_dim;
    let (dch, vch) = (hd / 32, hd / 16);
    let tiles = nq.div_ceil(ROWS);
    let maxlen = tile.lens.iter().copied().max().unwrap_or(0);
    let sp = aligned(&mut s.scores, CHUNK * ROWS);
    let (php, plp) = (
        aligned(&mut s.ph, CHUNK * ROWS),
        aligned(&mut s.pl, CHUNK * ROWS),
    );
    let (qhp, qlp) = (
        aligned(&mut s.qh, tiles * ROWS * hd),
        aligned(&mut s.ql, tiles * ROWS * hd),
    );
    let sums = aligned(&mut s.sums, ROWS * 64);
    let acc = aligned(&mut s.acc, tiles * ROWS * hd);
    s.ml.clear();
    s.ml.resize(tiles * ROWS, (f32::NEG_INFINITY, 0.0));
    std::ptr::write_bytes(acc, 0, tiles * ROWS * hd);
    // Q × scale, split; rows past `nq` are zero.
    let vs = _mm512_set1_ps(scale);
    for r in 0..tiles * ROWS {
        for c in (0..vch).step_by(2) {
            let x = |c: usize| {
                if r < nq {
                    _mm512_mul_ps(_mm512_loadu_ps(tile.q[r].as_ptr().add(c * 16)), vs)
                } else {
                    _mm512_setzero_ps()
                }
            };
            let (h, l) = split2(x(c), x(c + 1));
            _mm512_store_si512(qhp.add(r * hd + c * 16) as *mut __m512i, h);
            _mm512_store_si512(qlp.add(r * hd + c * 16) as *mut __m512i, l);
        }
    }
    // All eight tiles 16 rows × 64 bytes.
    let cfg = TileConfig::new(&[(16, 64); 8]);
    asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
    let (kh, kl) = (kv.kh.as_ptr(), kv.kl.as_ptr());
    let (vh, vl) = (kv.vh.as_ptr(), kv.vl.as_ptr());
    let mut c0 = 0;
    while c0 < maxlen {
        let c1 = (c0 + CHUNK).min(maxlen);
        for t in 0..tiles {
            let rows = (nq - t * ROWS).min(ROWS);
            let lens = &tile.lens[t * ROWS..t * ROWS + rows];
            let tmax = lens.iter().copied().max().unwrap_or(0).min(c1);
            if tmax <= c0 {
                continue;
            }
            let (b0, blocks) = (c0 / 16, (tmax - c0).div_ceil(16));
            let out_blocks = blocks.div_ceil(2) * 2;
            // Scores: tmm0 16 rows × 16 positions, tmm1/tmm2 Q hi/lo, tmm3/tmm4 K hi/lo.
            let (qh, ql) = (qhp.add(t * ROWS * hd), qlp.add(t * ROWS * hd));
            for b in 0..blocks {
                asm!("tilezero tmm0", options(nostack, nomem));
                for c in 0..dch {
                    let kt = ((b0 + b) * dch + c) * TILE;
                    asm!(
                        "tileloadd tmm1, [{qh} + {sq}*1]",
                        "tileloadd tmm3, [{kh} + {sk}*1]",
                        "tdpbf16ps tmm0, tmm1, tmm3",
                        "tileloadd tmm4, [{kl} + {sk}*1]",
                        "tdpbf16ps tmm0, tmm1, tmm4",
                        "tileloadd tmm2, [{ql} + {sq}*1]",
                        "tdpbf16ps tmm0, tmm2, tmm3",
                        qh = in(reg) qh.add(c * 32),
                        ql = in(reg) ql.add(c * 32),
                        sq = in(reg) hd * 2,
                        kh = in(reg) kh.add(kt),
                        kl = in(reg) kl.add(kt),
                        sk = in(reg) 64usize,
                        options(nostack, readonly),
                    );
                }
                asm!(
                    "tilestored [{c} + {sc}*1], tmm0",
                    c = in(reg) sp.add(b * 256),
                    sc = in(reg) 64usize,
                    options(nostack),
                );
            }
            // Online softmax per row; rows past `rows` weigh 0.
            let mut factor = [0.0f32; ROWS];
            for i in 0..ROWS {
                if i < rows {
                    let ml = &mut s.ml[t * ROWS + i];
                    let len = lens[i];
                    let (m, l) = (&mut ml.0, &mut ml.1);
                    factor[i] = softmax_chunk(sp, i, len, b0, blocks, out_blocks, (m, l), php, plp);
                } else {
                    for pb in 0..out_blocks {
                        std::ptr::write_bytes(php.add(p_at(i, pb)), 0, 16);
                        std::ptr::write_bytes(plp.add(p_at(i, pb)), 0, 16);
                    }
                }
            }
            // Weighted sums of the chunk, 4 chunks of 16 dimensions at a time: tmm0-tmm3
            // the sums, tmm4/tmm5 the weights hi/lo of 32 positions, tmm6/tmm7 V hi/lo;
            // then folded into the running sums.
            let (vb0, vbs) = (c0 / 32, out_blocks / 2);
            let mut d0 = 0;
            while d0 < vch {
                let n = (vch - d0).min(4);
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
                for vb in 0..vbs {
                    asm!(
                        "tileloadd tmm4, [{ph} + {sp}*1]",
                        "tileloadd tmm5, [{pl} + {sp}*1]",
                        ph = in(reg) php.add(vb * TILE),
                        pl = in(reg) plp.add(vb * TILE),
                        sp = in(reg) 64usize,
                        options(nostack, readonly),
                    );
                    for j in 0..n {
                        let vt = ((vb0 + vb) * vch + d0 + j) * TILE;
                        let (h, l) = (vh.add(vt), vl.add(vt));
                        macro_rules! step {
                            ($acc:literal) => {
                                asm!(
                                    "tileloadd tmm6, [{vh} + {sv}*1]",
                                    concat!("tdpbf16ps ", $acc, ", tmm4, tmm6"),
                                    "tileloadd tmm7, [{vl} + {sv}*1]",
                                    concat!("tdpbf16ps ", $acc, ", tmm4, tmm7"),
                                    concat!("tdpbf16ps ", $acc, ", tmm5, tmm6"),
                                    vh = in(reg) h,
                                    vl = in(reg) l,
                                    sv = in(reg) 64usize,
                                    options(nostack, readonly),
                                )
                            };
                        }
                        match j {
                            0 => step!("tmm0"),
                            1 => step!("tmm1"),
                            2 => step!("tmm2"),
                            _ => step!("tmm3"),
                        }
                    }
                }
                asm!(
                    "tilestored [{s} + {st}*1], tmm0",
                    "tilestored [{s1} + {st}*1], tmm1",
                    "tilestored [{s2} + {st}*1], tmm2",
                    "tilestored [{s3} + {st}*1], tmm3",
                    s = in(reg) sums,
                    s1 = in(reg) sums.add(16),
                    s2 = in(reg) sums.add(32),
                    s3 = in(reg) sums.add(48),
                    st = in(reg) 256usize,
                    options(nostack),
                );
                for i in 0..rows {
                    let f = _mm512_set1_ps(factor[i]);
                    let a = acc.add((t * ROWS + i) * hd + d0 * 16);
                    for j in 0..n {
                        let x = _mm512_load_ps(sums.add(i * 64 + j * 16));
                        let y = _mm512_fmadd_ps(_mm512_load_ps(a.add(j * 16)), f, x);
                        _mm512_store_ps(a.add(j * 16), y);
                    }
                }
                d0 += n;
            }
        }
        c0 = c1;
    }
    asm!("tilerelease", options(nostack, nomem));
    for r in 0..nq {
        let w = _mm512_set1_ps(1.0 / s.ml[r].1);
        let a = acc.add(r * hd);
        for c in 0..vch {
            let v = _mm512_mul_ps(_mm512_load_ps(a.add(c * 16)), w);
            _mm512_storeu_ps(out[r].as_mut_ptr().add(c * 16), v);
        }
    }
}

#[cfg(test)]
mod tests_pool {
    use super::*;
    use crate::kernels::attention::{attend as attend_f32, KvF32, KvSource};
    use crate::kernels::Isa;
    use half::f16;

    /// The f32 kernel over the same rows, 8 at a time (its tile size), into `out`.
    pub(super) fn attend_f32_rows(
        tile: &AttnTile<'_>,
        kv: &KvF32,
        scale: f32,
        out: &mut [Vec<f32>],
    ) {
        let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|v| &mut v[..]).collect();
        let mut sc = Vec::new();
        for (i0, chunk) in outs.chunks_mut(8).enumerate() {
            let t = AttnTile {
                q: &tile.q[i0 * 8..i0 * 8 + chunk.len()],
                lens: &tile.lens[i0 * 8..i0 * 8 + chunk.len()],
            };
            attend_f32(Isa::detect(), &t, &KvSource::F32(kv), scale, &mut sc, chunk);
        }
    }

    /// A pool of f16 pages laid out as the executor's (`[head_dim][page]` K, then V rows).
    pub(super) struct Pool {
        raw: Vec<u8>,
        pages: Vec<u32>,
        page_size: usize,
        hd: usize,
    }

    impl Pool {
        pub(super) fn new(len: usize, hd: usize, page_size: usize, seed: u64) -> Pool {
            let n_pages = len.div_ceil(page_size);
            let page_bytes = 2 * hd * page_size * 2;
            let mut raw = vec![0u8; (n_pages + 1) * page_bytes];
            let mut x = seed;
            let mut rnd = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            };
            // Pages in reverse order, so that positions are not contiguous in the pool.
            let pages: Vec<u32> = (0..n_pages as u32).rev().map(|p| p + 1).collect();
            for &pg in &pages {
                let base = pg as usize * page_bytes;
                for slot in 0..page_size {
                    for d in 0..hd {
                        let k = f16::from_f32(rnd()).to_le_bytes();
                        let ko = base + (d * page_size + slot) * 2;
                        raw[ko..ko + 2].copy_from_slice(&k);
                        let v = f16::from_f32(rnd()).to_le_bytes();
                        let vo = base + hd * page_size * 2 + (slot * hd + d) * 2;
                        raw[vo..vo + 2].copy_from_slice(&v);
                    }
                }
            }
            Pool {
                raw,
                pages,
                page_size,
                hd,
            }
        }

        pub(super) fn kv(&self) -> PagedKv<'_> {
            PagedKv {
                raw: &self.raw,
                dtype: KvDtype::F16,
                pages: &self.pages,
                page_size: self.page_size,
                page_bytes: 2 * self.hd * self.page_size * 2,
                k_off: 0,
                v_off: self.hd * self.page_size * 2,
                v_stride: self.hd * 2,
                head_dim: self.hd,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_pool::{attend_f32_rows, Pool};
    use super::*;
    use crate::kernels::Isa;

    /// The tiles agree with the f32 kernel to within the split's precision, over causal
    /// rows of every length class (short, page-straddling, not a multiple of 16 or 32), with
    /// fewer than 16 rows, and after a refill that keeps converted pages.
    #[test]
    fn tiles_match_the_f32_kernel_closely() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 here");
            return;
        }
        for &(len, page_size, hd, nq) in &[
            (37usize, 16usize, 64usize, 16usize),
            (300, 64, 64, 16),
            (1000, 32, 64, 11),
            (77, 24, 32, 3),
            (130, 16, 128, 16),
            (700, 64, 64, 40),
            (600, 16, 64, 192),
        ] {
            let pool = Pool::new(len, hd, page_size, 7 + len as u64);
            let kv = pool.kv();
            let mut bf = KvBf16::default();
            // A shorter fill first, then the full one in the same epoch (keeps pages).
            bf.fill_reusing(&kv, len / 2, 1);
            bf.fill_reusing(&kv, len, 1);
            let mut f32c = crate::kernels::attention::KvF32::default();
            f32c.fill(Isa::detect(), &kv, len);
            let mut x = 99u64 + len as u64;
            let qs: Vec<Vec<f32>> = (0..nq)
                .map(|_| {
                    (0..hd)
                        .map(|_| {
                            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
                        })
                        .collect()
                })
                .collect();
            // Causal rows of consecutive tokens, three heads each (as a prefill task's).
            let lens: Vec<usize> = (0..nq).map(|i| len - (nq - 1 - i) / 3).collect();
            let q: Vec<&[f32]> = qs.iter().map(|v| &v[..]).collect();
            let tile = AttnTile { q: &q, lens: &lens };
            let scale = 1.0 / (hd as f32).sqrt();
            let mut a = vec![vec![0.0f32; hd]; nq];
            let mut b = vec![vec![0.0f32; hd]; nq];
            {
                let mut outs: Vec<&mut [f32]> = a.iter_mut().map(|v| &mut v[..]).collect();
                attend(&tile, &bf, scale, &mut Scratch::default(), &mut outs);
            }
            attend_f32_rows(&tile, &f32c, scale, &mut b);
            let mut worst = 0.0f32;
            for i in 0..nq {
                for d in 0..hd {
                    worst = worst.max((a[i][d] - b[i][d]).abs());
                }
            }
            // Values are within ±2; 2⁻¹⁵-relative errors over sums of ±2 values stay far
            // below 1e-3 (a wrong layout or a lost term errs by 1e-2 and more).
            assert!(worst < 2e-4, "len {len} page {page_size} hd {hd}: {worst}");
        }
    }
}

/// Timings, run by hand (`--ignored --nocapture`).
#[cfg(test)]
mod measure {
    use super::tests_pool::{attend_f32_rows, Pool};
    use super::*;

    /// Time of one prefill task (64 tokens × 3 heads) at the end of a 3,400-token prompt,
    /// against the f32 kernel's tiles of 8 rows (`--ignored --nocapture`).
    #[test]
    #[ignore]
    fn amx_attention_speed() {
        if !available() {
            return;
        }
        let (len, hd, rows) = (3400usize, 64usize, 192usize);
        let pool = Pool::new(len, hd, 64, 3);
        let kv = pool.kv();
        let mut bf = KvBf16::default();
        let t = std::time::Instant::now();
        bf.fill_reusing(&kv, len, 1);
        eprintln!("bf16 fill {:?}", t.elapsed());
        let mut f32c = crate::kernels::attention::KvF32::default();
        let t = std::time::Instant::now();
        f32c.fill(crate::kernels::Isa::detect(), &kv, len);
        eprintln!("f32 fill {:?}", t.elapsed());
        let qs: Vec<Vec<f32>> = (0..rows).map(|i| vec![0.01 * (i % 7) as f32; hd]).collect();
        let q: Vec<&[f32]> = qs.iter().map(|v| &v[..]).collect();
        let lens: Vec<usize> = (0..rows).map(|i| len - 63 + i / 3).collect();
        let tile = AttnTile { q: &q, lens: &lens };
        let mut out = vec![vec![0.0f32; hd]; rows];
        let mut s = Scratch::default();
        let n = 20;
        let t = std::time::Instant::now();
        for _ in 0..n {
            let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|v| &mut v[..]).collect();
            attend(&tile, &bf, 0.125, &mut s, &mut outs);
        }
        let amx = t.elapsed() / n;
        let t = std::time::Instant::now();
        for _ in 0..n {
            attend_f32_rows(&tile, &f32c, 0.125, &mut out);
        }
        let f = t.elapsed() / n;
        eprintln!(
            "task: amx {amx:?}, f32 {f:?}, {:.2}x",
            f.as_secs_f64() / amx.as_secs_f64()
        );
    }

    /// TSC cycles per `tdpbf16ps` with operands in tiles, and with a tile load from L1
    /// before each pair (`--ignored --nocapture`): the bound the kernel is measured against.
    #[test]
    #[ignore]
    fn amx_bf16_peak() {
        if !available() {
            return;
        }
        let cfg = TileConfig::new(&[(16, 64); 8]);
        let buf = vec![0u16; 4096];
        let (p, s) = (buf.as_ptr(), 64usize);
        // SAFETY: `available`; every tile load reads inside `buf`.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
            asm!(
                "tileloadd tmm4, [{p} + {s}*1]",
                "tileloadd tmm5, [{p} + {s}*1]",
                "tileloadd tmm6, [{p} + {s}*1]",
                "tileloadd tmm7, [{p} + {s}*1]",
                p = in(reg) p,
                s = in(reg) s,
                options(nostack, readonly),
            );
            for (name, k) in [("4 chains", 0), ("1 chain", 1), ("with loads", 2)] {
                let t0 = _rdtsc();
                for _ in 0..10_000 {
                    match k {
                        0 => asm!(
                            "tdpbf16ps tmm0, tmm4, tmm5",
                            "tdpbf16ps tmm1, tmm4, tmm6",
                            "tdpbf16ps tmm2, tmm4, tmm7",
                            "tdpbf16ps tmm3, tmm5, tmm6",
                            options(nostack, nomem)
                        ),
                        1 => asm!(
                            "tdpbf16ps tmm0, tmm4, tmm5",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm0, tmm4, tmm7",
                            "tdpbf16ps tmm0, tmm5, tmm6",
                            options(nostack, nomem)
                        ),
                        _ => asm!(
                            "tileloadd tmm6, [{p} + {s}*1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tileloadd tmm7, [{p2} + {s}*1]",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            p = in(reg) p,
                            p2 = in(reg) p.add(1024),
                            s = in(reg) s,
                            options(nostack, readonly)
                        ),
                    }
                }
                let cycles = (_rdtsc() - t0) as f64 / 40_000.0;
                eprintln!("{name}: {cycles:.1} TSC cycles per tdpbf16ps");
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    }
}
