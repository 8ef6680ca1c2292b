//! Activation quantization and weight dequantization.
//!
//! Activations are quantized per block of 32 to 8 bits exactly as llama.cpp's `q8_0`/`q8_1`
//! do (`d = amax / 127`, `q = round(x / d)`, `d` stored as f16), which keeps our logits close
//! to llama.cpp's. The block sums `s = d * Σq` serve the Q4_1 minimum and the unsigned offsets
//! of the packed weights.

use super::pool::ThreadPool;
use crate::model::{Weight, WeightType};
use half::{bf16, f16};

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

/// Why a weight cannot be dequantized.
#[derive(Debug, thiserror::Error)]
pub enum DequantError {
    /// The byte length does not match the shape and type.
    #[error("{dtype:?} weight [{rows}, {cols}] needs {want} bytes, has {got}")]
    Size {
        /// Weight type.
        dtype: WeightType,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Bytes expected.
        want: usize,
        /// Bytes present.
        got: usize,
    },
    /// Columns are not a multiple of the type's block size.
    #[error("{dtype:?} weight has {cols} columns, not a multiple of its block size {block}")]
    Block {
        /// Weight type.
        dtype: WeightType,
        /// Columns.
        cols: usize,
        /// Block size.
        block: usize,
    },
}

/// (elements, bytes) of one block of a weight type.
pub fn block_shape(t: WeightType) -> (usize, usize) {
    match t {
        WeightType::F32 => (1, 4),
        WeightType::F16 | WeightType::Bf16 => (1, 2),
        WeightType::Q8_0 => (32, 34),
        WeightType::Q4_0 => (32, 18),
        WeightType::Q4_1 => (32, 20),
        WeightType::Q4K => (256, 144),
        WeightType::Q6K => (256, 210),
    }
}

/// Bytes of one row of a weight; checks the block size and the total length.
pub fn row_bytes(w: &Weight) -> Result<usize, DequantError> {
    let (be, bb) = block_shape(w.dtype);
    if !w.cols.is_multiple_of(be) {
        return Err(DequantError::Block {
            dtype: w.dtype,
            cols: w.cols,
            block: be,
        });
    }
    let rb = w.cols / be * bb;
    if w.data.len() != rb * w.rows {
        return Err(DequantError::Size {
            dtype: w.dtype,
            rows: w.rows,
            cols: w.cols,
            want: rb * w.rows,
            got: w.data.len(),
        });
    }
    Ok(rb)
}

fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Copies raw bytes into properly aligned candle blocks.
fn candle_blocks<T: candle_core::quantized::GgmlType>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut v: Vec<T> = Vec::with_capacity(n);
    // SAFETY: candle's block types are plain `repr(C)` structs of f16/u8/i8 fields, valid for
    // any bit pattern; `n * size_of::<T>() <= bytes.len()` and the vector has capacity `n`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            v.as_mut_ptr() as *mut u8,
            n * std::mem::size_of::<T>(),
        );
        v.set_len(n);
    }
    v
}

/// Dequantizes one row's bytes of type `t` into `out` (`out.len()` elements).
pub fn dequantize_row_bytes(t: WeightType, b: &[u8], out: &mut [f32]) {
    use candle_core::quantized::{k_quants, GgmlType};
    match t {
        WeightType::F32 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightType::F16 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightType::Bf16 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightType::Q8_0 => {
            for (o, c) in out.chunks_mut(32).zip(b.chunks_exact(34)) {
                let d = rd_f16(c, 0);
                for (j, oj) in o.iter_mut().enumerate() {
                    *oj = d * (c[2 + j] as i8) as f32;
                }
            }
        }
        WeightType::Q4_0 | WeightType::Q4_1 => {
            let (bb, off) = if t == WeightType::Q4_0 {
                (18, 2)
            } else {
                (20, 4)
            };
            for (o, c) in out.chunks_mut(32).zip(b.chunks_exact(bb)) {
                let d = rd_f16(c, 0);
                let m = if t == WeightType::Q4_0 {
                    -8.0 * d
                } else {
                    rd_f16(c, 2)
                };
                for j in 0..16 {
                    o[j] = d * (c[off + j] & 0x0F) as f32 + m;
                    o[j + 16] = d * (c[off + j] >> 4) as f32 + m;
                }
            }
        }
        WeightType::Q4K => k_quants::BlockQ4K::to_float(&candle_blocks(b), out),
        WeightType::Q6K => k_quants::BlockQ6K::to_float(&candle_blocks(b), out),
    }
}

/// Dequantizes a whole weight to row-major f32.
pub fn dequantize(w: &Weight) -> Result<Vec<f32>, DequantError> {
    let rb = row_bytes(w)?;
    let mut out = vec![0.0f32; w.rows * w.cols];
    for r in 0..w.rows {
        dequantize_row_bytes(
            w.dtype,
            &w.data[r * rb..(r + 1) * rb],
            &mut out[r * w.cols..(r + 1) * w.cols],
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{k_quants, GgmlType};

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

    fn as_bytes<T>(v: &[T]) -> Vec<u8> {
        // SAFETY: reading the bytes of plain `repr(C)` blocks.
        unsafe {
            std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)).to_vec()
        }
    }

    #[test]
    fn q4_and_q8_dequant_match_candle() {
        let x = rand_vec(256, 7);
        let mut b41 = vec![k_quants::BlockQ4_1::zeros(); 8];
        k_quants::BlockQ4_1::from_float(&x, &mut b41);
        let mut b40 = vec![k_quants::BlockQ4_0::zeros(); 8];
        k_quants::BlockQ4_0::from_float(&x, &mut b40);
        let mut b80 = vec![k_quants::BlockQ8_0::zeros(); 8];
        k_quants::BlockQ8_0::from_float(&x, &mut b80);
        let mut want = vec![0.0; 256];
        let mut got = vec![0.0; 256];
        k_quants::BlockQ4_1::to_float(&b41, &mut want);
        dequantize_row_bytes(WeightType::Q4_1, &as_bytes(&b41), &mut got);
        assert_eq!(want, got);
        k_quants::BlockQ4_0::to_float(&b40, &mut want);
        dequantize_row_bytes(WeightType::Q4_0, &as_bytes(&b40), &mut got);
        assert_eq!(want, got);
        k_quants::BlockQ8_0::to_float(&b80, &mut want);
        dequantize_row_bytes(WeightType::Q8_0, &as_bytes(&b80), &mut got);
        assert_eq!(want, got);
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
