//! Causal attention for query rows that share one KV head.
//!
//! The caller gathers the sequence's stored K and V for that head into f32 ([`KvGather`]:
//! K transposed `[head_dim][stride]`, V `[len][head_dim]`), so that both products are
//! broadcast-FMA loops without horizontal sums: scores for 16 positions at a time, and the
//! weighted sum of V rows. Softmax is f32 with a vectorized exp.

// Register tiles are indexed by (row, token) on purpose: the loops mirror the tile shape.
#![allow(clippy::needless_range_loop)]

use super::Isa;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One KV head of one sequence, gathered to f32.
#[derive(Clone, Debug, Default)]
pub struct KvGather {
    /// Positions gathered.
    pub len: usize,
    /// `len` rounded up to 32: positions held by `kt` (the padding is zero) and the row
    /// stride of the score buffer.
    pub stride: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Keys transposed in panels of 32 positions: `kt[kt_index(d, p)]`, so that the scores
    /// of 32 positions read one contiguous 8 KiB panel (at head_dim 64).
    pub kt: Vec<f32>,
    /// Values: `v[p * head_dim + d]`.
    pub v: Vec<f32>,
}

impl KvGather {
    /// Resizes for `len` positions (contents unspecified except the zeroed `kt` padding).
    pub fn reset(&mut self, len: usize, head_dim: usize) {
        self.len = len;
        self.head_dim = head_dim;
        self.stride = len.div_ceil(32) * 32;
        // Only the padding positions of the last panel must be zero: the caller overwrites
        // every position below `len` (zeroing whole buffers was 7% of a batch-32 decode).
        self.kt.resize(head_dim * self.stride, 0.0);
        self.v.resize(len * head_dim, 0.0);
        for p in len..self.stride {
            for d in 0..head_dim {
                let i = self.kt_index(d, p);
                self.kt[i] = 0.0;
            }
        }
    }

    /// Index of key `p`'s dimension `d` in `kt`.
    #[inline]
    pub fn kt_index(&self, d: usize, p: usize) -> usize {
        (p / 32) * (self.head_dim * 32) + d * 32 + p % 32
    }
}

/// Query rows to attend: each `q[i]` sees positions `0..lens[i]` and writes `out[i]`.
pub struct AttnTile<'a> {
    /// Query vectors (`head_dim` each), at most [`MAX_ROWS`].
    pub q: &'a [&'a [f32]],
    /// Visible positions per query (at least 1, at most the gathered length).
    pub lens: &'a [usize],
}

/// Query rows per [`attend`] call: their scores share one pass over K.
pub const MAX_ROWS: usize = 8;

/// Runs attention for up to [`MAX_ROWS`] query rows against `g`, writing each result to
/// `out[i]`.
/// `scores` is scratch.
pub fn attend(
    isa: Isa,
    tile: &AttnTile<'_>,
    g: &KvGather,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    let nq = tile.q.len();
    debug_assert!(nq <= MAX_ROWS && tile.lens.iter().all(|&l| l >= 1 && l <= g.len));
    // Every score read is written first (up to the tile's padded length).
    scores.resize(MAX_ROWS * g.stride, 0.0);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && g.head_dim.is_multiple_of(16) {
        // SAFETY: AVX-512 F detected; shapes checked above.
        unsafe { attend_avx512(tile, g, scale, scores, out) };
        return;
    }
    let _ = isa;
    let hd = g.head_dim;
    for i in 0..nq {
        let len = tile.lens[i];
        let s = &mut scores[i * g.stride..i * g.stride + len];
        for (p, sp) in s.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for d in 0..hd {
                acc += tile.q[i][d] * g.kt[g.kt_index(d, p)];
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
                o[d] += w * g.v[p * hd + d];
            }
        }
        for v in o.iter_mut() {
            *v /= sum;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn attend_avx512(
    tile: &AttnTile<'_>,
    g: &KvGather,
    scale: f32,
    scores: &mut [f32],
    out: &mut [&mut [f32]],
) {
    match tile.q.len() {
        8 => attend_n::<8>(tile, g, scale, scores, out),
        7 => attend_n::<7>(tile, g, scale, scores, out),
        6 => attend_n::<6>(tile, g, scale, scores, out),
        5 => attend_n::<5>(tile, g, scale, scores, out),
        4 => attend_n::<4>(tile, g, scale, scores, out),
        3 => attend_n::<3>(tile, g, scale, scores, out),
        2 => attend_n::<2>(tile, g, scale, scores, out),
        _ => attend_n::<1>(tile, g, scale, scores, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn attend_n<const N: usize>(
    tile: &AttnTile<'_>,
    g: &KvGather,
    scale: f32,
    scores: &mut [f32],
    out: &mut [&mut [f32]],
) {
    use super::elementwise::exp512;
    let (hd, stride) = (g.head_dim, g.stride);
    let maxlen = tile.lens[..N].iter().copied().max().unwrap_or(0);
    let blocks = maxlen.div_ceil(16);
    let kt = g.kt.as_ptr();
    let sp = scores.as_mut_ptr();
    let vscale = _mm512_set1_ps(scale);
    // Scores: 32 positions × N queries per register tile (2N independent FMA chains; the
    // stride is a multiple of 32 and the tail of `kt` is zero).
    for pp in 0..blocks.div_ceil(2) {
        let at = pp * 32;
        let mut acc = [[_mm512_setzero_ps(); N]; 2];
        for d in 0..hd {
            let k0 = _mm512_loadu_ps(kt.add(at * hd + d * 32));
            let k1 = _mm512_loadu_ps(kt.add(at * hd + d * 32 + 16));
            for i in 0..N {
                let q = _mm512_set1_ps(*tile.q[i].get_unchecked(d));
                acc[0][i] = _mm512_fmadd_ps(q, k0, acc[0][i]);
                acc[1][i] = _mm512_fmadd_ps(q, k1, acc[1][i]);
            }
        }
        for i in 0..N {
            _mm512_storeu_ps(sp.add(i * stride + at), _mm512_mul_ps(acc[0][i], vscale));
            _mm512_storeu_ps(
                sp.add(i * stride + at + 16),
                _mm512_mul_ps(acc[1][i], vscale),
            );
        }
    }
    // Softmax per row; probabilities past a row's length become 0.
    let mut inv = [0.0f32; N];
    for i in 0..N {
        let len = tile.lens[i];
        let row = sp.add(i * stride);
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for pb in 0..blocks {
            let m = lane_mask(len, pb);
            mx = _mm512_mask_max_ps(mx, m, mx, _mm512_loadu_ps(row.add(pb * 16)));
        }
        let mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        let mut sum = _mm512_setzero_ps();
        for pb in 0..blocks {
            let m = lane_mask(len, pb);
            let e = _mm512_maskz_mov_ps(
                m,
                exp512(_mm512_sub_ps(_mm512_loadu_ps(row.add(pb * 16)), mxv)),
            );
            _mm512_storeu_ps(row.add(pb * 16), e);
            sum = _mm512_add_ps(sum, e);
        }
        inv[i] = 1.0 / _mm512_reduce_add_ps(sum);
    }
    // Weighted sum of V rows: 64 dimensions × up to 4 queries per register tile, then the
    // rest 16 at a time.
    let mut i0 = 0;
    while i0 < N {
        let nr = (N - i0).min(4);
        let len = tile.lens[i0..i0 + nr].iter().copied().max().unwrap_or(0);
        let (sp, inv, out) = (
            sp.add(i0 * stride),
            &inv[i0..i0 + nr],
            &mut out[i0..i0 + nr],
        );
        match nr {
            4 => pv_rows::<4>(g, sp, stride, len, inv, out),
            3 => pv_rows::<3>(g, sp, stride, len, inv, out),
            2 => pv_rows::<2>(g, sp, stride, len, inv, out),
            _ => pv_rows::<1>(g, sp, stride, len, inv, out),
        }
        i0 += nr;
    }
}

/// [`pv`] over every dimension for `N` query rows.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pv_rows<const N: usize>(
    g: &KvGather,
    sp: *const f32,
    stride: usize,
    maxlen: usize,
    inv: &[f32],
    out: &mut [&mut [f32]],
) {
    let chunks = g.head_dim / 16;
    let mut c = 0;
    while c + 4 <= chunks {
        pv::<N, 4>(g, sp, stride, maxlen, c, inv, out);
        c += 4;
    }
    while c < chunks {
        pv::<N, 1>(g, sp, stride, maxlen, c, inv, out);
        c += 1;
    }
}

/// `out[i][16c..16(c + C)] = inv[i] Σ_p P[i][p] V[p][16c..16(c + C)]`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pv<const N: usize, const C: usize>(
    g: &KvGather,
    sp: *const f32,
    stride: usize,
    maxlen: usize,
    c: usize,
    inv: &[f32],
    out: &mut [&mut [f32]],
) {
    let (hd, v) = (g.head_dim, g.v.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); C]; N];
    for p in 0..maxlen {
        let mut vv = [_mm512_setzero_ps(); C];
        for j in 0..C {
            vv[j] = _mm512_loadu_ps(v.add(p * hd + (c + j) * 16));
        }
        for i in 0..N {
            let w = _mm512_set1_ps(*sp.add(i * stride + p));
            for j in 0..C {
                acc[i][j] = _mm512_fmadd_ps(w, vv[j], acc[i][j]);
            }
        }
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
mod tests {
    use super::*;

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn simd_attention_matches_naive_softmax() {
        let (hd, len) = (64, 37);
        let k = vals(len * hd, 1);
        let v = vals(len * hd, 2);
        let mut g = KvGather::default();
        g.reset(len, hd);
        for p in 0..len {
            for d in 0..hd {
                let i = g.kt_index(d, p);
                g.kt[i] = k[p * hd + d];
                g.v[p * hd + d] = v[p * hd + d];
            }
        }
        let qs: Vec<Vec<f32>> = (0..8).map(|i| vals(hd, 10 + i)).collect();
        let qrefs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        let lens = [37, 20, 1, 16, 33, 32, 5, 36];
        let scale = 0.125;
        for isa in Isa::all_supported() {
            for nq in 1..=MAX_ROWS {
                let mut outs = vec![vec![0.0f32; hd]; nq];
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                let tile = AttnTile {
                    q: &qrefs[..nq],
                    lens: &lens[..nq],
                };
                attend(isa, &tile, &g, scale, &mut Vec::new(), &mut refs);
                for i in 0..nq {
                    let s: Vec<f64> = (0..lens[i])
                        .map(|p| {
                            (0..hd)
                                .map(|d| (qs[i][d] * k[p * hd + d]) as f64)
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                    let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for d in 0..hd {
                        let want: f64 = (0..lens[i])
                            .map(|p| w[p] * v[p * hd + d] as f64)
                            .sum::<f64>()
                            / z;
                        assert!((outs[i][d] as f64 - want).abs() < 1e-5, "{isa:?} q{i} d{d}");
                    }
                }
            }
        }
    }
}
