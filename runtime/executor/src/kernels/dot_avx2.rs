//! AVX2 quantized matmul: one block of 32 per 256-bit step (`vpmaddubsw` for four-bit
//! weights, widening multiplies for eight-bit ones, which would saturate `vpmaddubsw`).

use super::packed::QuantMatrix;
use super::quant::{QuantActs, QK};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Computes rows `r0..r1` of `out[t * rows + r]` for every activation row.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `out` must point to `a.n * w.rows` writable floats and
/// no other thread writes these rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matmul_rows(
    w: &QuantMatrix,
    r0: usize,
    r1: usize,
    a: &QuantActs,
    out: *mut f32,
) {
    let (nbp, rq) = (w.nbp, w.row_qs());
    let sums = a.sums(w.exact_sums);
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let (wq, aq) = (w.qs.as_ptr(), a.qs.as_ptr() as *const u8);
    for t in 0..a.n {
        for r in r0..r1 {
            let mut acc = _mm256_setzero_ps();
            for j in 0..nbp / 2 {
                let (b0, b1) = (2 * j, 2 * j + 1);
                let a0 = _mm256_loadu_si256(aq.add((t * nbp + b0) * QK) as *const __m256i);
                let a1 = _mm256_loadu_si256(aq.add((t * nbp + b1) * QK) as *const __m256i);
                let (dp0, dp1) = if w.nibble {
                    let p = _mm256_loadu_si256(wq.add(r * rq + j * QK) as *const __m256i);
                    let lo = _mm256_and_si256(p, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), mask);
                    (
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), ones),
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), ones),
                    )
                } else {
                    let u0 = _mm256_loadu_si256(wq.add(r * rq + b0 * QK) as *const __m256i);
                    let u1 = _mm256_loadu_si256(wq.add(r * rq + b1 * QK) as *const __m256i);
                    (widen_dot(u0, a0), widen_dot(u1, a1))
                };
                let wi = r * nbp + b0;
                let ai = t * nbp + b0;
                let s0 = _mm256_set1_ps(w.d[wi] * a.d[ai]);
                let s1 = _mm256_set1_ps(w.d[wi + 1] * a.d[ai + 1]);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp0), s0, acc);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp1), s1, acc);
            }
            let mut s = hsum(acc);
            for b in 0..nbp {
                s += w.m[r * nbp + b] * sums[t * nbp + b];
            }
            *out.add(t * w.rows + r) = s;
        }
    }
}

/// Σ u8 × i8 over 32 bytes into eight i32 lanes, exactly (no 16-bit saturation).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn widen_dot(u: __m256i, a: __m256i) -> __m256i {
    let ul = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(u));
    let uh = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(u, 1));
    let al = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a));
    let ah = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1));
    _mm256_add_epi32(_mm256_madd_epi16(ul, al), _mm256_madd_epi16(uh, ah))
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
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
