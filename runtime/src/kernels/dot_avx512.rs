//! AVX-512 VNNI quantized matmul: two blocks of 32 per 512-bit `vpdpbusd`, register tiles of
//! up to 4 weight rows × 4 activation rows so each unpacked weight vector serves 4 tokens.

// Register tiles are indexed by (row, token) on purpose: the loops mirror the tile shape.
#![allow(clippy::needless_range_loop)]

use super::packed::QuantMatrix;
use super::quant::{QuantActs, QK};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Activation rows per cache block: their quantized values stay in L1/L2 while a task's
/// weight rows stream past.
const TOKEN_BLOCK: usize = 64;

/// Computes rows `r0..r1` of `out[t * rows + r]` for every activation row.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI; `out` must point to `a.n * w.rows` writable
/// floats and no other thread writes these rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn matmul_rows(
    w: &QuantMatrix,
    r0: usize,
    r1: usize,
    a: &QuantActs,
    out: *mut f32,
) {
    if w.nibble {
        rows_impl::<true>(w, r0, r1, a, out)
    } else {
        rows_impl::<false>(w, r0, r1, a, out)
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_impl<const NIB: bool>(
    w: &QuantMatrix,
    r0: usize,
    r1: usize,
    a: &QuantActs,
    out: *mut f32,
) {
    let n = a.n;
    let mut t0 = 0;
    while t0 < n {
        let t1 = (t0 + TOKEN_BLOCK).min(n);
        let mut r = r0;
        while r < r1 {
            let nr = if r1 - r >= 4 { 4 } else { 1 };
            let mut t = t0;
            while t < t1 {
                let nt = (t1 - t).min(4);
                match (nr, nt) {
                    (4, 4) => tile::<4, 4, NIB>(w, r, a, t, out),
                    (4, 3) => tile::<4, 3, NIB>(w, r, a, t, out),
                    (4, 2) => tile::<4, 2, NIB>(w, r, a, t, out),
                    (4, _) => tile::<4, 1, NIB>(w, r, a, t, out),
                    (_, 4) => tile::<1, 4, NIB>(w, r, a, t, out),
                    (_, 3) => tile::<1, 3, NIB>(w, r, a, t, out),
                    (_, 2) => tile::<1, 2, NIB>(w, r, a, t, out),
                    _ => tile::<1, 1, NIB>(w, r, a, t, out),
                }
                t += nt;
            }
            r += nr;
        }
        t0 = t1;
    }
}

/// `[x0, x1]` at `p` → `[x0 × 8, x1 × 8]`: one scale per 32-value block in a 512-bit vector.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_bcast(p: *const f32, idx: __m512i) -> __m512 {
    let v = _mm_castsi128_ps(_mm_loadl_epi64(p as *const __m128i));
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const T: usize, const NIB: bool>(
    w: &QuantMatrix,
    r: usize,
    a: &QuantActs,
    t: usize,
    out: *mut f32,
) {
    let (nbp, rq) = (w.nbp, w.row_qs());
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let mask = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let (wq, wd) = (w.qs.as_ptr(), w.d.as_ptr());
    let (aq, ad) = (a.qs.as_ptr(), a.d.as_ptr());
    for j in 0..nbp / 2 {
        let mut wv = [_mm512_setzero_si512(); R];
        let mut dw = [_mm512_setzero_ps(); R];
        for i in 0..R {
            let row = r + i;
            wv[i] = if NIB {
                let p = _mm256_loadu_si256(wq.add(row * rq + j * QK) as *const __m256i);
                let lo = _mm256_and_si256(p, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), mask);
                _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
            } else {
                _mm512_loadu_si512(wq.add(row * rq + j * 2 * QK) as *const __m512i)
            };
            dw[i] = pair_bcast(wd.add(row * nbp + 2 * j), idx);
        }
        for k in 0..T {
            let tk = t + k;
            let av = _mm512_loadu_si512(aq.add((tk * nbp + 2 * j) * QK) as *const __m512i);
            let da = pair_bcast(ad.add(tk * nbp + 2 * j), idx);
            for i in 0..R {
                let dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[i], av);
                acc[i][k] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(dw[i], da), acc[i][k]);
            }
        }
    }
    // The offsets: Σ_b m[b] s[b], folded into the same accumulators.
    let (wm, asum) = (w.m.as_ptr(), a.sums(w.exact_sums).as_ptr());
    let mut b = 0;
    while b < nbp {
        let cnt = (nbp - b).min(16);
        let mk: __mmask16 = if cnt == 16 { 0xFFFF } else { (1u16 << cnt) - 1 };
        for i in 0..R {
            let mv = _mm512_maskz_loadu_ps(mk, wm.add((r + i) * nbp + b));
            for k in 0..T {
                let sv = _mm512_maskz_loadu_ps(mk, asum.add((t + k) * nbp + b));
                acc[i][k] = _mm512_fmadd_ps(mv, sv, acc[i][k]);
            }
        }
        b += 16;
    }
    for i in 0..R {
        for k in 0..T {
            *out.add((t + k) * w.rows + r + i) = _mm512_reduce_add_ps(acc[i][k]);
        }
    }
}

/// Stand-in on other architectures: never selected, since detection yields `Scalar` there.
///
/// # Safety
/// Same contract as the x86 version.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn matmul_rows(
    w: &QuantMatrix,
    r0: usize,
    r1: usize,
    a: &QuantActs,
    out: *mut f32,
) {
    super::dot_scalar::matmul_rows(w, r0, r1, a, out)
}
