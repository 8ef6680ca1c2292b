//! Portable quantized matmul over either weight layout (the reference the SIMD kernels are
//! tested against).

use super::packed::QuantMatrix;
use super::quant::{QuantActs, QK};

/// Computes rows `r0..r1` of `out[t * rows + r]` for every activation row.
///
/// # Safety
/// `out` must point to `a.n * w.rows` writable floats; no other thread writes these rows.
pub(super) unsafe fn matmul_rows(
    w: &QuantMatrix,
    r0: usize,
    r1: usize,
    a: &QuantActs,
    out: *mut f32,
) {
    let nbp = w.nbp;
    let sums = a.sums(w.exact_sums);
    for t in 0..a.n {
        for r in r0..r1 {
            let mut s = 0.0f32;
            for b in 0..nbp {
                let ai = t * nbp + b;
                let aq = &a.qs[ai * QK..(ai + 1) * QK];
                let mut isum = 0i32;
                for (k, &q) in aq.iter().enumerate() {
                    isum += w.value(r, b, k) as i32 * q as i32;
                }
                let wi = w.scale_index(r, b);
                s += w.d[wi] * a.d[ai] * isum as f32 + w.m[wi] * sums[ai];
            }
            *out.add(t * w.rows + r) = s;
        }
    }
}
