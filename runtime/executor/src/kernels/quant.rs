//! Activation quantization (weight dequantization is `sglrs_model::ggml`).
//!
//! Activations are quantized per block of 32 to 8 bits exactly as llama.cpp's `q8_0`/`q8_1`
//! do (`d = amax / 127`, `q = round(x / d)`, `d` stored as f16), which keeps our logits close
//! to llama.cpp's. The block sums `s = d * Σq` serve the Q4_1 minimum and the unsigned offsets
//! of the packed weights.

use super::pool::ThreadPool;
use half::f16;

/// Elements per quantization block.
pub const QK: usize = 32;

/// Blocks of a row of `cols` elements, rounded up to an even count (the AVX-512 kernels take
/// two blocks per step; the padding block is all zeros).
pub fn padded_blocks(cols: usize) -> usize {
    cols.div_ceil(QK).div_ceil(2) * 2
}

/// Rows of activations quantized to 8-bit blocks, structure of arrays.
#[derive(Clone, Debug, Default)]
pub struct QuantActs {
    /// Rows (tokens).
    pub n: usize,
    /// Logical width of a row.
    pub cols: usize,
    /// Blocks per row, padded to even.
    pub nbp: usize,
    /// Quantized values, `n * nbp * 32`.
    pub qs: Vec<i8>,
    /// Per-block scale, `n * nbp`.
    pub d: Vec<f32>,
    /// Per-block `d * Σq` rounded to f16 as llama.cpp's `q8_1` stores it (the Q4_1 minimum
    /// term uses this, to match llama.cpp), `n * nbp`.
    pub s: Vec<f32>,
    /// Per-block `d * Σq` exactly (with the stored `d`): the unsigned offsets of Q4_0 and
    /// Q8_0 weights must cancel exactly, `n * nbp`.
    pub se: Vec<f32>,
}

impl QuantActs {
    /// The block sums a weight's offsets pair with (see [`QuantActs::s`] and
    /// [`QuantActs::se`]).
    pub fn sums(&self, exact: bool) -> &[f32] {
        if exact {
            &self.se
        } else {
            &self.s
        }
    }
}

impl QuantActs {
    /// Quantizes `n` rows of `cols` values (`x.len() == n * cols`), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        self.resize(n, cols);
        let nbp = self.nbp;
        for r in 0..n {
            let (qs, d, s, se) = self.row_parts(r);
            quantize_row(&x[r * cols..(r + 1) * cols], nbp, qs, d, s, se);
        }
    }

    /// [`QuantActs::quantize`] with the rows spread over `pool` (same results).
    pub fn quantize_par(&mut self, pool: &ThreadPool, x: &[f32], n: usize, cols: usize) {
        if n < 4 || pool.threads() == 1 {
            return self.quantize(x, n, cols);
        }
        self.resize(n, cols);
        let nbp = self.nbp;
        let per = n.div_ceil(pool.threads() * 4);
        let this = SyncPtr(self as *mut QuantActs);
        pool.run(n.div_ceil(per), &|c| {
            let this = &this;
            for r in c * per..((c + 1) * per).min(n) {
                // SAFETY: each task owns rows `c * per..`; `row_parts` hands out disjoint
                // parts of the buffers, which `resize` sized and nothing else touches.
                let (qs, d, s, se) = unsafe { (*this.0).row_parts_raw(r) };
                quantize_row(&x[r * cols..(r + 1) * cols], nbp, qs, d, s, se);
            }
        });
    }

    /// Sizes the buffers for `n` rows of `cols` values (all zero), to be filled row by row
    /// with [`QuantActs::quantize_row_shared`] from inside another per-row pass (so that,
    /// e.g., RMSNorm and quantization share one hand-off of the thread pool).
    pub fn reset(&mut self, n: usize, cols: usize) {
        self.resize(n, cols);
    }

    /// Quantizes `x` (`cols` values) into row `r` after [`QuantActs::reset`]; the same
    /// results as [`QuantActs::quantize`].
    ///
    /// # Safety
    /// `r < n` of the last `reset`, and no two concurrent calls (nor any other access to
    /// the buffers) may touch the same row.
    pub unsafe fn quantize_row_shared(&self, r: usize, x: &[f32]) {
        debug_assert!(r < self.n && x.len() == self.cols);
        let (qs, d, s, se) = self.row_parts_raw(r);
        quantize_row(x, self.nbp, qs, d, s, se);
    }

    fn resize(&mut self, n: usize, cols: usize) {
        let nbp = padded_blocks(cols);
        self.n = n;
        self.cols = cols;
        self.nbp = nbp;
        self.qs.clear();
        self.qs.resize(n * nbp * QK, 0);
        self.d.clear();
        self.d.resize(n * nbp, 0.0);
        self.s.clear();
        self.s.resize(n * nbp, 0.0);
        self.se.clear();
        self.se.resize(n * nbp, 0.0);
    }

    #[allow(clippy::type_complexity)]
    fn row_parts(&mut self, r: usize) -> (&mut [i8], &mut [f32], &mut [f32], &mut [f32]) {
        // SAFETY: `&mut self` is exclusive.
        unsafe { self.row_parts_raw(r) }
    }

    /// Row `r`'s parts of the buffers.
    ///
    /// # Safety
    /// No two live borrows may cover the same row.
    #[allow(clippy::type_complexity, clippy::mut_from_ref)]
    unsafe fn row_parts_raw(&self, r: usize) -> (&mut [i8], &mut [f32], &mut [f32], &mut [f32]) {
        let nbp = self.nbp;
        let part =
            |p: *const f32| std::slice::from_raw_parts_mut((p as *mut f32).add(r * nbp), nbp);
        (
            std::slice::from_raw_parts_mut(
                (self.qs.as_ptr() as *mut i8).add(r * nbp * QK),
                nbp * QK,
            ),
            part(self.d.as_ptr()),
            part(self.s.as_ptr()),
            part(self.se.as_ptr()),
        )
    }
}

struct SyncPtr(*mut QuantActs);
// SAFETY: used only for disjoint per-row writes while `quantize_par` holds `&mut self`.
unsafe impl Sync for SyncPtr {}

/// Quantizes one row into its blocks (the padding blocks stay zero).
fn quantize_row(
    x: &[f32],
    nbp: usize,
    qs: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    se: &mut [f32],
) {
    debug_assert!(x.len().div_ceil(QK) <= nbp);
    for (b, chunk) in x.chunks(QK).enumerate() {
        let q = &mut qs[b * QK..b * QK + chunk.len()];
        #[cfg(target_arch = "x86_64")]
        let r = if chunk.len() == QK && super::Isa::detect() == super::Isa::Avx512Vnni {
            // SAFETY: AVX-512 F detected; the block is full.
            unsafe { quantize_block_avx512(chunk, q) }
        } else {
            quantize_block(chunk, q)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let r = quantize_block(chunk, q);
        (d[b], s[b], se[b]) = r;
    }
}

/// Quantizes one block (up to 32 values) into `q`; returns (d, d * Σq) as llama.cpp stores
/// them (rounded to f16) and the exact `d * Σq` with the rounded `d`.
fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, f32, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (qi, &xi) in q.iter_mut().zip(x) {
        // Round half to even via the 1.5 * 2^23 trick (exact for |v| < 2^22; here |v| <= 127):
        // `round_ties_even` becomes a libm `rintf` call per value without SSE4.1 at compile
        // time, which was 11% of a prefill profile.
        let v = ((xi * id + 12_582_912.0) - 12_582_912.0) as i32;
        *qi = v as i8;
        sum += v;
    }
    block_scales(d, sum)
}

fn block_scales(d: f32, sum: i32) -> (f32, f32, f32) {
    let d16 = f16::from_f32(d).to_f32();
    (
        d16,
        f16::from_f32(d * sum as f32).to_f32(),
        d16 * sum as f32,
    )
}

/// [`quantize_block`] for a full block, with the same f32 operations (identical results).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_block_avx512(x: &[f32], q: &mut [i8]) -> (f32, f32, f32) {
    use std::arch::x86_64::*;
    let (a, b) = (
        _mm512_loadu_ps(x.as_ptr()),
        _mm512_loadu_ps(x.as_ptr().add(16)),
    );
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    let d = amax / 127.0;
    let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    let magic = _mm512_set1_ps(12_582_912.0);
    let round = |v: __m512| {
        _mm512_cvttps_epi32(_mm512_sub_ps(
            _mm512_add_ps(_mm512_mul_ps(v, id), magic),
            magic,
        ))
    };
    let (qa, qb) = (round(a), round(b));
    let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    _mm_storeu_si128(q.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128(
        q.as_mut_ptr().add(16) as *mut __m128i,
        _mm512_cvtepi32_epi8(qb),
    );
    block_scales(d, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn activation_quantization_round_trips_within_half_a_step() {
        let x = rand_vec(100, 3);
        let mut a = QuantActs::default();
        a.quantize(&x, 2, 50);
        assert_eq!(a.nbp, 2);
        for r in 0..2 {
            for c in 0..50 {
                let (b, j) = (c / 32, c % 32);
                let i = r * a.nbp + b;
                let v = a.d[i] * a.qs[i * 32 + j] as f32;
                assert!((v - x[r * 50 + c]).abs() <= a.d[i] * 0.51 + 1e-6);
            }
            for b in 0..2 {
                let i = r * a.nbp + b;
                let sum: i32 = a.qs[i * 32..i * 32 + 32].iter().map(|&q| q as i32).sum();
                assert!((a.s[i] - a.d[i] * sum as f32).abs() <= 1e-3 * a.s[i].abs().max(1.0));
            }
        }
    }

    #[test]
    fn simd_and_parallel_quantization_are_identical_to_scalar() {
        // Values on exact half steps exercise the ties-to-even rounding.
        let mut x = rand_vec(37 * 100, 11);
        for (i, v) in x.iter_mut().enumerate().step_by(7) {
            *v = (i % 255) as f32 * 0.5 - 63.5;
        }
        let mut want = QuantActs::default();
        want.resize(37, 100);
        for r in 0..37 {
            let row = &x[r * 100..(r + 1) * 100];
            for (b, chunk) in row.chunks(QK).enumerate() {
                let i = r * want.nbp + b;
                let (d, s, se) = quantize_block(chunk, &mut want.qs[i * QK..i * QK + chunk.len()]);
                (want.d[i], want.s[i], want.se[i]) = (d, s, se);
            }
        }
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            let mut got = QuantActs::default();
            got.quantize_par(&pool, &x, 37, 100);
            assert_eq!(got.qs, want.qs);
            assert_eq!((&got.d, &got.s, &got.se), (&want.d, &want.s, &want.se));
        }
        // Row by row after `reset` (rows in reverse, over stale buffers): the same.
        let mut got = QuantActs::default();
        got.quantize(&rand_vec(50 * 64, 3), 50, 64);
        got.reset(37, 100);
        for r in (0..37).rev() {
            // SAFETY: one row at a time, r < 37.
            unsafe { got.quantize_row_shared(r, &x[r * 100..(r + 1) * 100]) };
        }
        assert_eq!(got.qs, want.qs);
        assert_eq!((&got.d, &got.s, &got.se), (&want.d, &want.s, &want.se));
    }
}
