//! Decode attention of several sequences whose first positions lie in the same pages (a
//! system prompt or document the radix cache shares): one pass over those pages scores every
//! sequence's query rows, so each K block and V row is fetched from memory once for all of
//! them instead of once per sequence; each sequence then goes on over its own pages.
//!
//! Every row's arithmetic is exactly that of [`attend`](super::attend) on its own: the same
//! score chains per 16-position block, the same softmax, and its weighted sum of V
//! accumulated over positions in the same order (the shared positions first, then its own).
//! Batching sequences over shared pages is therefore bit-identical to running each alone,
//! whatever else is in the batch.

use super::{AttnTile, PagedKv};
use crate::kernels::Isa;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Most query rows one [`SharedTile`] holds.
pub const MAX_SHARED_ROWS: usize = 12;

/// Decode rows of sequences ("members") that read positions `0..shared` from the same pages.
pub struct SharedTile<'a> {
    /// Query vectors, member by member (`rows_per_member` each).
    pub q: &'a [&'a [f32]],
    /// Visible positions per row (each at least `shared`).
    pub lens: &'a [usize],
    /// Each member's K/V: page tables that agree on the pages holding positions `0..shared`.
    pub kv: &'a [PagedKv<'a>],
    /// Rows per member (the GQA group's heads of its one token).
    pub rows_per_member: usize,
    /// Positions read once for every row, from member 0's pages: a multiple of 16.
    pub shared: usize,
}

/// Whether [`attend_shared`] has a kernel for this ISA and KV layout (AVX-512, f16 pages of a
/// multiple of 16 positions); otherwise callers attend member by member.
pub fn shared_supported(isa: Isa, kv: &PagedKv<'_>) -> bool {
    super::chunks_supported(isa, kv) && kv.page_size.is_multiple_of(16)
}

/// Runs attention for the tile's rows, writing each result to `out[i]`. `scores` is scratch.
///
/// # Panics
/// If [`shared_supported`] is false for member 0's KV, if the tile holds more than
/// [`MAX_SHARED_ROWS`] rows, or if its shapes disagree.
pub fn attend_shared(
    isa: Isa,
    tile: &SharedTile<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    let n = tile.q.len();
    assert!(
        shared_supported(isa, &tile.kv[0]),
        "no shared-prefix kernel here"
    );
    assert!(n <= MAX_SHARED_ROWS && n == tile.lens.len() && n == out.len());
    assert_eq!(n, tile.kv.len() * tile.rows_per_member);
    assert!(tile.shared.is_multiple_of(16));
    assert!(tile.lens.iter().all(|&l| l >= tile.shared.max(1)));
    for (m, kv) in tile.kv.iter().enumerate() {
        let rows = m * tile.rows_per_member..(m + 1) * tile.rows_per_member;
        assert!(tile.lens[rows].iter().all(|&l| l <= kv.capacity()));
        assert_eq!(
            (kv.page_size, kv.head_dim, kv.dtype),
            (tile.kv[0].page_size, tile.kv[0].head_dim, tile.kv[0].dtype)
        );
        let sp = tile.shared / kv.page_size;
        assert_eq!(kv.pages[..sp], tile.kv[0].pages[..sp], "member {m}");
    }
    let maxlen = tile.lens.iter().copied().max().unwrap_or(0);
    let stride = maxlen.div_ceil(32) * 32;
    if scores.len() < n * stride {
        scores.resize(n * stride, 0.0);
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512 F/BW/VL detected (`shared_supported`); shapes checked above.
    unsafe {
        shared_avx512(tile, scale, stride, scores, out)
    }
}

/// Scores of rows `r0..r0 + nr` (at most 4) against `nb` (at most 4) blocks from `b`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn score_rows(
    tile: &SharedTile<'_>,
    kv: &PagedKv<'_>,
    rows: std::ops::Range<usize>,
    b: usize,
    nb: usize,
    maxlen: usize,
    scale: f32,
    sp: *mut f32,
    stride: usize,
) {
    use super::{scores_tile, Src};
    let sub = AttnTile {
        q: &tile.q[rows.clone()],
        lens: &tile.lens[rows.clone()],
    };
    let hd = kv.head_dim;
    // Pages hold a multiple of 16 positions: blocks are read in place, no scratch needed.
    let k = |j: usize| kv.k_block(b + j, maxlen, &mut []);
    let at = sp.add(rows.start * stride + b * 16);
    macro_rules! go {
        ($n:literal) => {
            match nb {
                4 => scores_tile::<PagedKv<'_>, $n, 4>(
                    &sub,
                    hd,
                    [k(0), k(1), k(2), k(3)],
                    scale,
                    at,
                    stride,
                ),
                3 => scores_tile::<PagedKv<'_>, $n, 3>(
                    &sub,
                    hd,
                    [k(0), k(1), k(2)],
                    scale,
                    at,
                    stride,
                ),
                2 => scores_tile::<PagedKv<'_>, $n, 2>(&sub, hd, [k(0), k(1)], scale, at, stride),
                _ => scores_tile::<PagedKv<'_>, $n, 1>(&sub, hd, [k(0)], scale, at, stride),
            }
        };
    }
    match rows.len() {
        4 => go!(4),
        3 => go!(3),
        2 => go!(2),
        _ => go!(1),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn shared_avx512(
    tile: &SharedTile<'_>,
    scale: f32,
    stride: usize,
    scores: &mut [f32],
    out: &mut [&mut [f32]],
) {
    use super::Src;
    let n = tile.q.len();
    let rpm = tile.rows_per_member;
    let sp = scores.as_mut_ptr();
    let kv0 = &tile.kv[0];
    // Shared blocks: all rows, four rows × four blocks per register tile; the next rows'
    // tiles find the same K blocks in L1.
    let sb = tile.shared / 16;
    let mut b = 0;
    while b < sb {
        let nb = (sb - b).min(4);
        kv0.prefetch_k_ahead(b, tile.shared);
        let mut r = 0;
        while r < n {
            let nr = (n - r).min(4);
            score_rows(tile, kv0, r..r + nr, b, nb, tile.shared, scale, sp, stride);
            r += nr;
        }
        b += nb;
    }
    // Each member's own blocks.
    for (m, kv) in tile.kv.iter().enumerate() {
        let rows = m * rpm..(m + 1) * rpm;
        let mlen = tile.lens[rows.clone()].iter().copied().max().unwrap_or(0);
        let blocks = mlen.div_ceil(16);
        let mut b = sb;
        while b < blocks {
            let nb = (blocks - b).min(4);
            kv.prefetch_k_ahead(b, mlen);
            let mut r = rows.start;
            while r < rows.end {
                let nr = (rows.end - r).min(4);
                score_rows(tile, kv, r..r + nr, b, nb, mlen, scale, sp, stride);
                r += nr;
            }
            b += nb;
        }
    }
    let maxlen = tile.lens.iter().copied().max().unwrap_or(0);
    let nchunks = maxlen.div_ceil(super::SOFTMAX_CHUNK);
    if nchunks > 1 {
        // Long rows: per-chunk partials merged in order, as `attend` computes them.
        let ones = [1.0f32; MAX_SHARED_ROWS];
        super::merged_chunks(n, kv0.head_dim, nchunks, out, |rows| {
            super::chunk_partials(
                sp,
                stride,
                tile.lens,
                maxlen,
                0..nchunks,
                kv0.head_dim,
                rows,
                |p0, p1, accs| {
                    // SAFETY: as this function's: AVX-512 detected, shapes checked.
                    unsafe { weighted_rows(tile, sp, stride, (p0, p1), &ones, accs) }
                },
            )
        });
        return;
    }
    let mut inv = [0.0f32; MAX_SHARED_ROWS];
    for i in 0..n {
        let blocks = tile.lens[i].div_ceil(16);
        inv[i] = 1.0 / super::softmax_range(sp.add(i * stride), tile.lens[i], 0, blocks).1;
    }
    weighted_rows(tile, sp, stride, (0, maxlen), &inv, out);
}

/// Every row's weighted sum of V over positions `p0..p1` (clipped to each row's length),
/// times `inv[row]`: four rows × 64 dimensions per register tile; the shared V rows once for
/// the tile's rows, then each row's own.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn weighted_rows(
    tile: &SharedTile<'_>,
    sp: *mut f32,
    stride: usize,
    range: (usize, usize),
    inv: &[f32],
    out: &mut [&mut [f32]],
) {
    let n = tile.q.len();
    let chunks = tile.kv[0].head_dim / 16;
    let mut r = 0;
    while r < n {
        let nr = (n - r).min(4);
        let mut c = 0;
        while c < chunks {
            let cn = if c + 4 <= chunks { 4 } else { 1 };
            macro_rules! go {
                ($n:literal) => {
                    match cn {
                        4 => pv_shared::<$n, 4>(tile, r, sp, stride, range, c, inv, out),
                        _ => pv_shared::<$n, 1>(tile, r, sp, stride, range, c, inv, out),
                    }
                };
            }
            match nr {
                4 => go!(4),
                3 => go!(3),
                2 => go!(2),
                _ => go!(1),
            }
            c += cn;
        }
        r += nr;
    }
}

/// `out[r0 + i][16c..16(c + C)]` for `N` rows from `r0` over positions `range`: Σ over the
/// shared positions (read from member 0's pages), then over the row's own, in position order.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_shared<const N: usize, const C: usize>(
    tile: &SharedTile<'_>,
    r0: usize,
    sp: *const f32,
    stride: usize,
    (p0, p1): (usize, usize),
    c: usize,
    inv: &[f32],
    out: &mut [&mut [f32]],
) {
    use super::{Src, PREFETCH_V_AHEAD};
    let mut acc = [[_mm512_setzero_ps(); C]; N];
    let kv0 = &tile.kv[0];
    let shared_end = tile.shared.min(p1);
    let mut p = p0.min(shared_end);
    while p < shared_end {
        let (mut vp, end, vstride) = kv0.v_run(p, shared_end, c, C);
        kv0.prefetch_v(end + PREFETCH_V_AHEAD, shared_end, c, C);
        for pos in p..end {
            let mut vv = [_mm512_setzero_ps(); C];
            for j in 0..C {
                vv[j] = <PagedKv<'_> as Src>::load_v(vp, j);
            }
            for i in 0..N {
                let w = _mm512_set1_ps(*sp.add((r0 + i) * stride + pos));
                for j in 0..C {
                    acc[i][j] = _mm512_fmadd_ps(w, vv[j], acc[i][j]);
                }
            }
            vp = vp.wrapping_add(vstride);
        }
        p = end;
    }
    for i in 0..N {
        let row = r0 + i;
        let kv = &tile.kv[row / tile.rows_per_member];
        let len = tile.lens[row].min(p1);
        let mut a = acc[i];
        let mut p = tile.shared.max(p0);
        while p < len {
            let (mut vp, end, vstride) = kv.v_run(p, len, c, C);
            kv.prefetch_v(end + PREFETCH_V_AHEAD, len, c, C);
            for pos in p..end {
                let w = _mm512_set1_ps(*sp.add(row * stride + pos));
                for j in 0..C {
                    a[j] = _mm512_fmadd_ps(w, <PagedKv<'_> as Src>::load_v(vp, j), a[j]);
                }
                vp = vp.wrapping_add(vstride);
            }
            p = end;
        }
        for j in 0..C {
            let o = _mm512_mul_ps(a[j], _mm512_set1_ps(inv[row]));
            _mm512_storeu_ps(out[row].as_mut_ptr().add((c + j) * 16), o);
        }
    }
}
