//! Vectorized element-wise helpers: exp (softmax), SiLU-gated products, RMSNorm.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `e^x` for 16 lanes (max error ~2 ulp on the range softmax uses; clamps below -88).
///
/// # Safety
/// The CPU must support AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub unsafe fn exp512(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-88.0));
    let x = _mm512_min_ps(x, _mm512_set1_ps(88.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::Isa::detect() == super::Isa::Avx512Vnni
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[i] = silu(g[i]) * u[i]`, `silu(x) = x / (1 + e^-x)`.
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = out.len().min(g.len()).min(u.len());
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512 F detected; all accesses are below `n`.
        unsafe { i = silu_mul_avx512(g, u, out, n) };
    }
    for j in i..n {
        out[j] = g[j] / (1.0 + (-g[j]).exp()) * u[j];
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_mul_avx512(g: &[f32], u: &[f32], out: &mut [f32], n: usize) -> usize {
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i + 16 <= n {
        let gv = _mm512_loadu_ps(g.as_ptr().add(i));
        let uv = _mm512_loadu_ps(u.as_ptr().add(i));
        let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        let s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_mul_ps(s, uv));
        i += 16;
    }
    i
}

/// `out = x / sqrt(mean(x²) + eps) * w` (sum of squares accumulated in f64, as ggml does).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((o, &v), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * wi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_matches_scalar_formula() {
        let g: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) * 0.37).collect();
        let u: Vec<f32> = (0..100).map(|i| 1.0 + i as f32 * 0.01).collect();
        let mut out = vec![0.0; 100];
        silu_mul(&g, &u, &mut out);
        for i in 0..100 {
            let want = g[i] / (1.0 + (-g[i]).exp()) * u[i];
            assert!(
                (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{i}: {} {want}",
                out[i]
            );
        }
    }

    #[test]
    fn rms_norm_normalizes() {
        let x = [3.0f32, 4.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 8.0 / r).abs() < 1e-6);
    }
}
