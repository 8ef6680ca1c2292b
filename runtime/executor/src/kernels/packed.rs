//! Weights repacked for the matmul kernels, and the matmul itself.
//!
//! Q4_0, Q4_1 and Q8_0 become one "unsigned 8-bit blocks" form: each block of 32 holds
//! unsigned values `u` with a scale `d` and an offset `m`, the weight being `d * u + m`
//! (Q4_1: as stored; Q4_0: `m = -8d`; Q8_0: `u = q + 128`, `m = -128d`). A dot product with an
//! 8-bit activation block `(d_a, q_a, s_a = d_a Σq_a)` is then `d d_a Σ u q_a + m s_a`: one
//! unsigned × signed integer dot per block, which is exactly what VNNI's `vpdpbusd` computes.
//! Four-bit rows store two blocks per 32 bytes: byte `j` holds element `j` of the even block
//! in its low nibble and element `j` of the odd block in its high nibble, so one 256-bit load
//! unpacks into 64 values in activation order. Other types are dequantized to f32.

use super::pool::ThreadPool;
use super::quant::{padded_blocks, QuantActs, QK};
use super::{dot_avx2, dot_avx512, dot_scalar, Isa};
use half::f16;
use sglrs_model::ggml::{dequantize, row_bytes, DequantError};
use sglrs_model::{Weight, WeightType};

/// A weight in unsigned 8-bit block form (see the module docs).
#[derive(Clone, Debug)]
pub struct QuantMatrix {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Blocks per row, padded to even.
    pub nbp: usize,
    /// Four-bit values, two blocks per 32 bytes; otherwise one byte per value.
    pub nibble: bool,
    /// Layout of `qs`, `d` and `m` (see [`QuantLayout`]).
    pub layout: QuantLayout,
    /// Packed values, `rows_padded * nbp * (16 | 32)` bytes.
    pub qs: Vec<u8>,
    /// Block scales, `rows_padded * nbp`.
    pub d: Vec<f32>,
    /// Block offsets, `rows_padded * nbp`.
    pub m: Vec<f32>,
    /// [`QuantLayout::Vnni16`] only: the same scales and offsets as f16 bits, one 64-byte
    /// line per (row group, block) — its 16 scales, then its 16 offsets — for the AVX-512
    /// kernel, which then streams half the scale bytes (a sixth less weight traffic per
    /// decode step for Q4_1). Built only when every value converts to f16 and back exactly
    /// (GGUF scales are f16; the Q4_0/Q8_0 offsets -8d/-128d are too unless they overflow),
    /// so the kernel's f32 arithmetic is unchanged; empty otherwise.
    pub dm16: Vec<u16>,
    /// The offsets are unsigned-encoding offsets (Q4_0, Q8_0) that must cancel exactly, so
    /// they pair with the exact activation sums; Q4_1 minimums pair with llama.cpp's f16 sums.
    pub exact_sums: bool,
}

/// How a [`QuantMatrix`] lays out its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantLayout {
    /// Row by row: row `r`'s packed values at `qs[r * row_qs..]`, its block `b`'s scale and
    /// offset at `d[r * nbp + b]`, `m[r * nbp + b]` (the AVX2 and scalar kernels).
    Rows,
    /// VNNI tiles for the AVX-512 kernel: rows in groups of 16 (the last one zero-padded),
    /// each group's values in 64-byte vectors whose lane `i` holds 4 consecutive values of
    /// row `16g + i` (`vpdpbusd` order). Four-bit: vector `((grp * nbp/2 + j) * 8 + k)` holds
    /// values `4k..4k+4` of block `2j` (low nibbles) and `2j + 1` (high nibbles); eight-bit:
    /// vector `((grp * nbp + b) * 8 + k)` holds values `4k..4k+4` of block `b`. Scales and
    /// offsets: `d[(grp * nbp + b) * 16 + i]`.
    Vnni16,
}

impl QuantMatrix {
    /// Bytes of packed values per row.
    pub fn row_qs(&self) -> usize {
        self.nbp * if self.nibble { QK / 2 } else { QK }
    }

    /// Rows including the padding of the last 16-row group in the VNNI layout.
    pub fn rows_padded(&self) -> usize {
        match self.layout {
            QuantLayout::Rows => self.rows,
            QuantLayout::Vnni16 => self.rows.div_ceil(16) * 16,
        }
    }

    /// Unsigned value `k` of block `b` of row `r`, in either layout (reference kernels).
    pub fn value(&self, r: usize, b: usize, k: usize) -> u8 {
        match self.layout {
            QuantLayout::Rows => {
                if self.nibble {
                    (self.qs[r * self.row_qs() + (b / 2) * QK + k] >> ((b % 2) * 4)) & 0x0F
                } else {
                    self.qs[r * self.row_qs() + b * QK + k]
                }
            }
            QuantLayout::Vnni16 => {
                let (grp, i) = (r / 16, r % 16);
                let lane = i * 4 + k % 4;
                if self.nibble {
                    let v = ((grp * (self.nbp / 2) + b / 2) * 8 + k / 4) * 64 + lane;
                    (self.qs[v] >> ((b % 2) * 4)) & 0x0F
                } else {
                    self.qs[((grp * self.nbp + b) * 8 + k / 4) * 64 + lane]
                }
            }
        }
    }

    /// Index of row `r`'s block `b` in `d` and `m`.
    pub fn scale_index(&self, r: usize, b: usize) -> usize {
        match self.layout {
            QuantLayout::Rows => r * self.nbp + b,
            QuantLayout::Vnni16 => ((r / 16) * self.nbp + b) * 16 + r % 16,
        }
    }

    /// Rewrites a row-layout matrix into the VNNI layout.
    fn to_vnni(&self) -> QuantMatrix {
        let rp = self.rows.div_ceil(16) * 16;
        let mut out = QuantMatrix {
            layout: QuantLayout::Vnni16,
            qs: vec![0u8; rp * self.row_qs()],
            d: vec![0.0; rp * self.nbp],
            m: vec![0.0; rp * self.nbp],
            ..self.clone_header()
        };
        for r in 0..self.rows {
            for b in 0..self.nbp {
                let (src, dst) = (self.scale_index(r, b), out.scale_index(r, b));
                out.d[dst] = self.d[src];
                out.m[dst] = self.m[src];
                let (grp, i) = (r / 16, r % 16);
                for k in 0..QK {
                    let v = self.value(r, b, k);
                    let lane = i * 4 + k % 4;
                    if self.nibble {
                        let at = ((grp * (self.nbp / 2) + b / 2) * 8 + k / 4) * 64 + lane;
                        out.qs[at] |= v << ((b % 2) * 4);
                    } else {
                        out.qs[((grp * self.nbp + b) * 8 + k / 4) * 64 + lane] = v;
                    }
                }
            }
        }
        out.dm16 = half_scales(&out.d, &out.m).unwrap_or_default();
        out
    }

    fn clone_header(&self) -> QuantMatrix {
        QuantMatrix {
            rows: self.rows,
            cols: self.cols,
            nbp: self.nbp,
            nibble: self.nibble,
            layout: self.layout,
            qs: Vec::new(),
            d: Vec::new(),
            m: Vec::new(),
            dm16: Vec::new(),
            exact_sums: self.exact_sums,
        }
    }
}

/// A weight matrix ready for [`PackedMatrix::matmul`].
#[derive(Clone, Debug)]
pub enum PackedMatrix {
    /// Unsigned 8-bit blocks (from Q4_0, Q4_1, Q8_0).
    Quant(QuantMatrix),
    /// Row-major f32 (everything else, dequantized).
    F32 {
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// Values, `rows * cols`.
        data: Vec<f32>,
    },
}

/// The VNNI layout's scales `d` and offsets `m` (`[(grp * nbp + b) * 16 + i]`) as f16 bits,
/// per (group, block) 16 scales then 16 offsets; `None` if any value is not exactly an f16.
fn half_scales(d: &[f32], m: &[f32]) -> Option<Vec<u16>> {
    let mut out = Vec::with_capacity(2 * d.len());
    for (dc, mc) in d.chunks(16).zip(m.chunks(16)) {
        for &x in dc.iter().chain(mc) {
            let h = f16::from_f32(x);
            // Bit equality of the round trip (also tells -0.0 from 0.0; NaNs never pass).
            if h.to_f32().to_bits() != x.to_bits() {
                return None;
            }
            out.push(h.to_bits());
        }
    }
    Some(out)
}

fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

impl PackedMatrix {
    /// Repacks weights for the kernels of `isa` (the VNNI tile layout for AVX-512, rows
    /// otherwise); several weights with the same input width may be stacked into one matrix
    /// (their rows concatenated), so that e.g. Q, K and V run as one matmul.
    pub fn pack(ws: &[&Weight], isa: Isa) -> Result<PackedMatrix, DequantError> {
        let cols = ws[0].cols;
        let rows: usize = ws.iter().map(|w| w.rows).sum();
        let all_q4 = ws
            .iter()
            .all(|w| matches!(w.dtype, WeightType::Q4_0 | WeightType::Q4_1));
        let all_q8 = ws.iter().all(|w| w.dtype == WeightType::Q8_0);
        if ws.iter().any(|w| w.cols != cols) || !(all_q4 || all_q8) {
            let mut data = Vec::with_capacity(rows * cols);
            for w in ws {
                if w.cols != cols {
                    return Err(DequantError::Block {
                        dtype: w.dtype,
                        cols: w.cols,
                        block: cols,
                    });
                }
                data.extend(dequantize(w)?);
            }
            return Ok(PackedMatrix::F32 { rows, cols, data });
        }
        let nbp = padded_blocks(cols);
        let nb = cols / QK;
        let row_qs = nbp * if all_q4 { QK / 2 } else { QK };
        let mut qs = vec![0u8; rows * row_qs];
        let mut d = vec![0.0f32; rows * nbp];
        let mut m = vec![0.0f32; rows * nbp];
        let mut r_out = 0;
        for w in ws {
            let rb = row_bytes(w)?;
            for r in 0..w.rows {
                let src = &w.data[r * rb..(r + 1) * rb];
                let dst = &mut qs[r_out * row_qs..(r_out + 1) * row_qs];
                let (dd, mm) = (&mut d[r_out * nbp..], &mut m[r_out * nbp..]);
                match w.dtype {
                    WeightType::Q8_0 => {
                        for b in 0..nb {
                            let blk = &src[b * 34..(b + 1) * 34];
                            dd[b] = rd_f16(blk, 0);
                            mm[b] = -128.0 * dd[b];
                            for j in 0..QK {
                                dst[b * QK + j] = (blk[2 + j] as i8 as i16 + 128) as u8;
                            }
                        }
                    }
                    _ => {
                        let q40 = w.dtype == WeightType::Q4_0;
                        let (bb, off) = if q40 { (18, 2) } else { (20, 4) };
                        for b in 0..nb {
                            let blk = &src[b * bb..(b + 1) * bb];
                            dd[b] = rd_f16(blk, 0);
                            mm[b] = if q40 { -8.0 * dd[b] } else { rd_f16(blk, 2) };
                            let shift = if b % 2 == 0 { 0 } else { 4 };
                            let pair = &mut dst[(b / 2) * QK..(b / 2 + 1) * QK];
                            for j in 0..16 {
                                pair[j] |= (blk[off + j] & 0x0F) << shift;
                                pair[j + 16] |= (blk[off + j] >> 4) << shift;
                            }
                        }
                    }
                }
                r_out += 1;
            }
        }
        let q = QuantMatrix {
            rows,
            cols,
            nbp,
            nibble: all_q4,
            layout: QuantLayout::Rows,
            qs,
            d,
            m,
            dm16: Vec::new(),
            exact_sums: ws.iter().any(|w| w.dtype != WeightType::Q4_1),
        };
        Ok(PackedMatrix::Quant(if isa == Isa::Avx512Vnni {
            q.to_vnni()
        } else {
            q
        }))
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        match self {
            PackedMatrix::Quant(q) => q.rows,
            PackedMatrix::F32 { rows, .. } => *rows,
        }
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            PackedMatrix::Quant(q) => q.cols,
            PackedMatrix::F32 { cols, .. } => *cols,
        }
    }

    /// `out[t * rows + r] = Σ_c W[r, c] x[t, c]` for the `n` rows of `x` (f32, used by the
    /// f32 form) and `acts` (the same rows quantized, used by the quantized form).
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        x: &[f32],
        acts: &QuantActs,
        n: usize,
        out: &mut [f32],
    ) {
        assert!(out.len() >= n * self.rows(), "matmul output too short");
        // SAFETY: `out` holds `n * rows` floats and is borrowed exclusively.
        unsafe { self.matmul_ptr(pool, isa, x, acts, n, out.as_mut_ptr()) }
    }

    /// [`PackedMatrix::matmul`] into a new vector of `n * rows` values, without zeroing it
    /// first (for the output head: 6 MB at 32 rows, a serial `memset` before).
    pub fn matmul_new(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        x: &[f32],
        acts: &QuantActs,
        n: usize,
    ) -> Vec<f32> {
        let len = n * self.rows();
        let mut out: Vec<f32> = Vec::with_capacity(len);
        // SAFETY: the capacity holds `len` floats; every kernel writes each of the `n * rows`
        // outputs (through the raw pointer, reading none), so all `len` are initialized.
        unsafe {
            self.matmul_ptr(pool, isa, x, acts, n, out.as_mut_ptr());
            out.set_len(len);
        }
        out
    }

    /// Writes all `n * rows` outputs through `out`.
    ///
    /// # Safety
    /// `out` must be valid for writes of `n * rows` floats, with no other access meanwhile.
    unsafe fn matmul_ptr(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        x: &[f32],
        acts: &QuantActs,
        n: usize,
        out: *mut f32,
    ) {
        let rows = self.rows();
        let ptr = OutPtr(out);
        // Row chunks of a multiple of 16, about four per thread so a slow thread is helped.
        let per = rows.div_ceil(pool.threads() * 4).div_ceil(16) * 16;
        let tasks = rows.div_ceil(per);
        match self {
            PackedMatrix::Quant(w) => {
                debug_assert_eq!(acts.n, n);
                debug_assert_eq!(acts.nbp, w.nbp);
                pool.run(tasks, &|i| {
                    let (r0, r1) = (i * per, ((i + 1) * per).min(rows));
                    let out = &ptr;
                    // SAFETY: tasks write disjoint row ranges of `out`, which outlives `run`;
                    // the ISA was detected on this CPU (the VNNI layout is only built for it).
                    unsafe {
                        match (w.layout, isa) {
                            (QuantLayout::Vnni16, Isa::Avx512Vnni) => {
                                dot_avx512::matmul_rows(w, r0, r1, acts, out.0)
                            }
                            (QuantLayout::Rows, Isa::Avx2 | Isa::Avx512Vnni) => {
                                dot_avx2::matmul_rows(w, r0, r1, acts, out.0)
                            }
                            _ => dot_scalar::matmul_rows(w, r0, r1, acts, out.0),
                        }
                    }
                });
            }
            PackedMatrix::F32 { cols, data, .. } => {
                let cols = *cols;
                pool.run(tasks, &|i| {
                    let (r0, r1) = (i * per, ((i + 1) * per).min(rows));
                    let out = &ptr;
                    for t in 0..n {
                        let xr = &x[t * cols..(t + 1) * cols];
                        for r in r0..r1 {
                            let v = dot_f32(&data[r * cols..(r + 1) * cols], xr);
                            // SAFETY: as above, disjoint rows.
                            unsafe { *out.0.add(t * rows + r) = v };
                        }
                    }
                });
            }
        }
    }
}

/// An output pointer shared by tasks that write disjoint parts.
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: only used for disjoint writes while the owning slice is borrowed by `matmul`.
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}

/// f32 dot product written so that the compiler vectorizes it (16 independent lanes).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use candle_core::quantized::{k_quants, GgmlType};
    use sglrs_model::ggml::dequantize_row_bytes;

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_add(0x9E3779B97F4A7C15);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn quantized<T: GgmlType>(x: &[f32], rows: usize, cols: usize, dtype: WeightType) -> Weight {
        let mut blocks = vec![T::zeros(); x.len() / T::BLCK_SIZE];
        T::from_float(x, &mut blocks);
        // SAFETY: plain repr(C) blocks.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                blocks.as_ptr() as *const u8,
                std::mem::size_of_val(&blocks[..]),
            )
        }
        .to_vec();
        Weight {
            dtype,
            rows,
            cols,
            data: Bytes::from(bytes),
        }
    }

    /// Naive reference: dequantize the weight and the quantized activations, dot in f64.
    fn reference(w: &Weight, acts: &QuantActs) -> Vec<f32> {
        let rb = row_bytes(w).unwrap();
        let mut out = vec![0.0; acts.n * w.rows];
        let mut wr = vec![0.0f32; w.cols];
        for r in 0..w.rows {
            dequantize_row_bytes(w.dtype, &w.data[r * rb..(r + 1) * rb], &mut wr);
            for t in 0..acts.n {
                let mut s = 0.0f64;
                for c in 0..w.cols {
                    let (b, j) = (c / QK, c % QK);
                    let i = t * acts.nbp + b;
                    s += wr[c] as f64 * (acts.d[i] * acts.qs[i * QK + j] as f32) as f64;
                }
                // Q4_1 pairs its minimum with llama.cpp's f16-rounded block sum (documented
                // behaviour): apply the same rounding to the reference.
                if w.dtype == WeightType::Q4_1 {
                    for b in 0..w.cols / QK {
                        let m = rd_f16(&w.data[r * rb + b * 20..], 2) as f64;
                        let i = t * acts.nbp + b;
                        s += m * (acts.s[i] - acts.se[i]) as f64;
                    }
                }
                out[t * w.rows + r] = s as f32;
            }
        }
        out
    }

    fn check(w: &Weight, n: usize) {
        let x = rand_vec(n * w.cols, 99);
        let mut acts = QuantActs::default();
        acts.quantize(&x, n, w.cols);
        let want = reference(w, &acts);
        for threads in [1, 3] {
            let pool = ThreadPool::new(threads);
            for isa in Isa::all_supported() {
                let p = PackedMatrix::pack(&[w], isa).unwrap();
                let mut got = vec![0.0; n * w.rows];
                p.matmul(&pool, isa, &x, &acts, n, &mut got);
                let tol = 1e-4;
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() <= tol * (1.0 + e.abs()),
                        "{:?} {isa:?} n={n} [{i}]: {g} vs {e}",
                        w.dtype
                    );
                }
            }
        }
    }

    #[test]
    fn quantized_matmuls_match_naive_reference() {
        // 3 blocks per row (odd: exercises the padding block), 37 rows (a partial 16-row
        // group), 80 rows (the 4-group decode tile plus one group), 1..70 tokens (tiles of
        // 1..4 tokens, 1 x 8 tiles and their remainders, more than one token block).
        for (rows, cols) in [(37, 96), (64, 576), (80, 160)] {
            let x = rand_vec(rows * cols, 5);
            for n in [1, 2, 3, 4, 5, 9, 15, 70] {
                check(
                    &quantized::<k_quants::BlockQ4_1>(&x, rows, cols, WeightType::Q4_1),
                    n,
                );
                check(
                    &quantized::<k_quants::BlockQ4_0>(&x, rows, cols, WeightType::Q4_0),
                    n,
                );
                check(
                    &quantized::<k_quants::BlockQ8_0>(&x, rows, cols, WeightType::Q8_0),
                    n,
                );
            }
        }
    }

    #[test]
    fn stacked_and_f32_matmuls_match() {
        let (rows, cols) = (20, 256);
        let a = quantized::<k_quants::BlockQ4_1>(
            &rand_vec(rows * cols, 1),
            rows,
            cols,
            WeightType::Q4_1,
        );
        let b =
            quantized::<k_quants::BlockQ4K>(&rand_vec(rows * cols, 2), rows, cols, WeightType::Q4K);
        let x = rand_vec(3 * cols, 4);
        let mut acts = QuantActs::default();
        acts.quantize(&x, 3, cols);
        let pool = ThreadPool::new(2);
        let isa = Isa::detect();
        let stacked = PackedMatrix::pack(&[&a, &b], isa).unwrap();
        assert!(matches!(stacked, PackedMatrix::F32 { .. }));
        let mut got = vec![0.0; 3 * 2 * rows];
        stacked.matmul(&pool, isa, &x, &acts, 3, &mut got);
        let (wa, wb) = (dequantize(&a).unwrap(), dequantize(&b).unwrap());
        for t in 0..3 {
            for r in 0..2 * rows {
                let w = if r < rows {
                    &wa[r * cols..(r + 1) * cols]
                } else {
                    &wb[(r - rows) * cols..(r - rows + 1) * cols]
                };
                let e: f32 = w
                    .iter()
                    .zip(&x[t * cols..(t + 1) * cols])
                    .map(|(p, q)| p * q)
                    .sum();
                assert!((got[t * 2 * rows + r] - e).abs() < 1e-3 * (1.0 + e.abs()));
            }
        }
    }

    #[test]
    fn vnni_layout_holds_the_same_values() {
        let (rows, cols) = (21, 160);
        let x = rand_vec(rows * cols, 7);
        for w in [
            quantized::<k_quants::BlockQ4_1>(&x, rows, cols, WeightType::Q4_1),
            quantized::<k_quants::BlockQ8_0>(&x, rows, cols, WeightType::Q8_0),
        ] {
            let (PackedMatrix::Quant(a), PackedMatrix::Quant(b)) = (
                PackedMatrix::pack(&[&w], Isa::Scalar).unwrap(),
                PackedMatrix::pack(&[&w], Isa::Avx512Vnni).unwrap(),
            ) else {
                panic!("not quantized");
            };
            assert_eq!(
                (a.layout, b.layout),
                (QuantLayout::Rows, QuantLayout::Vnni16)
            );
            assert_eq!(b.rows_padded(), 32);
            for r in 0..rows {
                for blk in 0..a.nbp {
                    let (i, j) = (a.scale_index(r, blk), b.scale_index(r, blk));
                    assert_eq!((a.d[i], a.m[i]), (b.d[j], b.m[j]));
                    for k in 0..QK {
                        assert_eq!(a.value(r, blk, k), b.value(r, blk, k), "{r} {blk} {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn f16_scales_hold_the_same_values_and_give_bit_identical_outputs() {
        let (rows, cols) = (40, 224);
        let x = rand_vec(rows * cols, 11);
        for w in [
            quantized::<k_quants::BlockQ4_1>(&x, rows, cols, WeightType::Q4_1),
            quantized::<k_quants::BlockQ4_0>(&x, rows, cols, WeightType::Q4_0),
            quantized::<k_quants::BlockQ8_0>(&x, rows, cols, WeightType::Q8_0),
        ] {
            let PackedMatrix::Quant(q) = PackedMatrix::pack(&[&w], Isa::Avx512Vnni).unwrap() else {
                panic!("not quantized");
            };
            assert_eq!(q.dm16.len(), 2 * q.d.len(), "{:?}", w.dtype);
            for (k, (dc, mc)) in q.d.chunks(16).zip(q.m.chunks(16)).enumerate() {
                let line = &q.dm16[k * 32..(k + 1) * 32];
                for i in 0..16 {
                    assert_eq!(f16::from_bits(line[i]).to_f32().to_bits(), dc[i].to_bits());
                    assert_eq!(
                        f16::from_bits(line[16 + i]).to_f32().to_bits(),
                        mc[i].to_bits()
                    );
                }
            }
            if !Isa::all_supported().contains(&Isa::Avx512Vnni) {
                continue;
            }
            same_bits_with_switch_off(
                &PackedMatrix::Quant(q),
                &super::dot_avx512::HALF,
                (rows, cols),
                &[1, 2, 3, 4, 5, 8, 13, 64, 70],
                &format!("{:?}", w.dtype),
            );
        }
        // Q8_0 offsets -128d beyond f16's range: no f16 copy, the f32 scales are used.
        let big: Vec<f32> = x.iter().map(|v| v * 1e5).collect();
        let w = quantized::<k_quants::BlockQ8_0>(&big, rows, cols, WeightType::Q8_0);
        let PackedMatrix::Quant(q) = PackedMatrix::pack(&[&w], Isa::Avx512Vnni).unwrap() else {
            panic!("not quantized");
        };
        assert!(q.dm16.is_empty());
    }

    #[test]
    fn tile_shapes_give_bit_identical_outputs() {
        if !Isa::all_supported().contains(&Isa::Avx512Vnni) {
            return;
        }
        let (rows, cols) = (72, 320);
        let x = rand_vec(rows * cols, 3);
        let w = quantized::<k_quants::BlockQ4_1>(&x, rows, cols, WeightType::Q4_1);
        let p = PackedMatrix::pack(&[&w], Isa::Avx512Vnni).unwrap();
        same_bits_with_switch_off(
            &p,
            &super::dot_avx512::TILE8,
            (rows, cols),
            &[8, 13, 15, 32, 47],
            "Q4_1",
        );
    }

    /// The AMX tiles (16-token tiles of prefill) give the VNNI kernel's bits, for four- and
    /// eight-bit weights, a last row group cut short, f16 and f32 scales, and token counts
    /// that leave a remainder for VNNI.
    #[test]
    fn amx_tiles_give_bit_identical_outputs() {
        if !Isa::all_supported().contains(&Isa::Avx512Vnni) || !super::dot_avx512::amx_available() {
            eprintln!("skipped: this CPU (or kernel) exposes no AMX-INT8");
            return;
        }
        let (rows, cols) = (40, 224);
        let x = rand_vec(rows * cols, 5);
        // Offsets beyond f16's range: no f16 copy, the f32 scales.
        let big: Vec<f32> = x.iter().map(|v| v * 1e5).collect();
        for w in [
            quantized::<k_quants::BlockQ4_1>(&x, rows, cols, WeightType::Q4_1),
            quantized::<k_quants::BlockQ4_0>(&x, rows, cols, WeightType::Q4_0),
            quantized::<k_quants::BlockQ8_0>(&x, rows, cols, WeightType::Q8_0),
            quantized::<k_quants::BlockQ8_0>(&big, rows, cols, WeightType::Q8_0),
        ] {
            let p = PackedMatrix::pack(&[&w], Isa::Avx512Vnni).unwrap();
            let ns = [16, 17, 31, 32, 48, 64, 70, 100];
            let what = format!("{:?}", w.dtype);
            same_bits_with_switch_off(&p, &super::dot_avx512::AMX, (rows, cols), &ns, &what);
        }
        // The model's own shapes (fused QKV, attention output, FFN up, FFN down), across a
        // 128-token pass boundary.
        for (rows, cols) in [(832, 576), (576, 576), (3072, 576), (576, 1536)] {
            let x = rand_vec(rows * cols, 6);
            let w = quantized::<k_quants::BlockQ4_1>(&x, rows, cols, WeightType::Q4_1);
            let p = PackedMatrix::pack(&[&w], Isa::Avx512Vnni).unwrap();
            let what = format!("Q4_1 {rows}x{cols}");
            same_bits_with_switch_off(&p, &super::dot_avx512::AMX, (rows, cols), &[53, 150], &what);
        }
    }

    /// Prefill GEMM time per SmolLM2-135M shape, AMX tiles against VNNI alone, one thread,
    /// best of alternating runs:
    /// `cargo test --release -p sglrs-executor --lib -- --ignored --nocapture amx_prefill_speed`.
    #[test]
    #[ignore]
    fn amx_prefill_speed() {
        use std::sync::atomic::Ordering;
        if !Isa::all_supported().contains(&Isa::Avx512Vnni) || !super::dot_avx512::amx_available() {
            eprintln!("skipped: this CPU (or kernel) exposes no AMX-INT8");
            return;
        }
        let pool = ThreadPool::new(1);
        for n in [128usize, 512] {
            for (rows, cols) in [(832, 576), (576, 576), (3072, 576), (576, 1536)] {
                let x = rand_vec(rows * cols, 9);
                let w = quantized::<k_quants::BlockQ4_1>(&x, rows, cols, WeightType::Q4_1);
                let p = PackedMatrix::pack(&[&w], Isa::Avx512Vnni).unwrap();
                let mut acts = QuantActs::default();
                acts.quantize(&rand_vec(n * cols, 1), n, cols);
                let mut out = vec![0.0; n * rows];
                let mut best = [f64::MAX; 2];
                for _ in 0..5 {
                    for (k, on) in [true, false].into_iter().enumerate() {
                        super::dot_avx512::AMX.store(on, Ordering::Relaxed);
                        let t = std::time::Instant::now();
                        for _ in 0..4 {
                            p.matmul(&pool, Isa::Avx512Vnni, &[], &acts, n, &mut out);
                        }
                        best[k] = best[k].min(t.elapsed().as_secs_f64() / 4.0);
                    }
                }
                super::dot_avx512::AMX.store(true, Ordering::Relaxed);
                let gop = 2.0 * (n * rows * cols) as f64 / 1e9;
                println!(
                    "n={n} {rows}x{cols}: amx {:.2} ms ({:.0} GOP/s), vnni {:.2} ms ({:.0} GOP/s), {:.2}x",
                    best[0] * 1e3,
                    gop / best[0],
                    best[1] * 1e3,
                    gop / best[1],
                    best[1] / best[0]
                );
            }
        }
    }

    /// The VNNI matmul of `p` at each token count in `ns` gives the same bits with a kernel
    /// test switch on (as built) and off.
    fn same_bits_with_switch_off(
        p: &PackedMatrix,
        switch: &std::sync::atomic::AtomicBool,
        (rows, cols): (usize, usize),
        ns: &[usize],
        what: &str,
    ) {
        use std::sync::atomic::Ordering;
        let pool = ThreadPool::new(2);
        for &n in ns {
            let mut acts = QuantActs::default();
            acts.quantize(&rand_vec(n * cols, n as u64), n, cols);
            let (mut a, mut b) = (vec![0.0; n * rows], vec![0.0; n * rows]);
            p.matmul(&pool, Isa::Avx512Vnni, &[], &acts, n, &mut a);
            switch.store(false, Ordering::Relaxed);
            p.matmul(&pool, Isa::Avx512Vnni, &[], &acts, n, &mut b);
            switch.store(true, Ordering::Relaxed);
            assert!(
                a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{what} n={n}"
            );
        }
    }

    /// GEMM time of one decode step of a SmolLM2-135M-shaped model (30 layers of distinct
    /// Q4_1 weights, so they stream from memory as in a real step, plus the output head),
    /// as built and without the next-tile prefetch or the 1 x 8 tiles, 1 and 2 threads, best
    /// of alternating runs (ratio > 1: the built-in choice is faster):
    /// `cargo test --release -p sglrs-runtime --lib -- --ignored --nocapture matmul_speed`.
    #[test]
    #[ignore]
    fn matmul_speed() {
        use std::sync::atomic::Ordering;
        let isa = Isa::detect();
        let shapes = [(832, 576), (576, 576), (3072, 576), (576, 1536)];
        let mut ms = Vec::new();
        for l in 0..30u64 {
            for (k, &(rows, cols)) in shapes.iter().enumerate() {
                let x = rand_vec(rows * cols, l * 4 + k as u64);
                let w = quantized::<k_quants::BlockQ4_1>(&x, rows, cols, WeightType::Q4_1);
                ms.push(PackedMatrix::pack(&[&w], isa).unwrap());
            }
        }
        let x = rand_vec(49152 * 576, 7);
        let w = quantized::<k_quants::BlockQ4_1>(&x, 49152, 576, WeightType::Q4_1);
        ms.push(PackedMatrix::pack(&[&w], isa).unwrap());
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            for n in [1usize, 2, 4, 8, 16, 32, 64] {
                let acts: Vec<QuantActs> = [576, 1536]
                    .iter()
                    .map(|&c| {
                        let mut a = QuantActs::default();
                        a.quantize(&rand_vec(n * c, c as u64), n, c);
                        a
                    })
                    .collect();
                let mut out = vec![0.0; n * 49152];
                let mut step = |prefetch: bool| {
                    super::dot_avx512::PREFETCH.store(prefetch, Ordering::Relaxed);
                    let t = std::time::Instant::now();
                    for m in &ms {
                        let a = &acts[usize::from(m.cols() == 1536)];
                        m.matmul(&pool, isa, &[], a, n, &mut out);
                    }
                    t.elapsed().as_secs_f64()
                };
                let (mut on, mut off, mut t8, mut f32s) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
                for _ in 0..6 {
                    on = on.min(step(true));
                    off = off.min(step(false));
                    super::dot_avx512::TILE8.store(false, Ordering::Relaxed);
                    t8 = t8.min(step(true));
                    super::dot_avx512::TILE8.store(true, Ordering::Relaxed);
                    super::dot_avx512::HALF.store(false, Ordering::Relaxed);
                    f32s = f32s.min(step(true));
                    super::dot_avx512::HALF.store(true, Ordering::Relaxed);
                }
                println!(
                    "threads {threads} n={n:2}: {:7.2} ms; no prefetch {:7.2} ms ({:.3}x); \
                     no 1x8 tiles {:7.2} ms ({:.3}x); f32 scales {:7.2} ms ({:.3}x)",
                    on * 1e3,
                    off * 1e3,
                    off / on,
                    t8 * 1e3,
                    t8 / on,
                    f32s * 1e3,
                    f32s / on
                );
            }
        }
        super::dot_avx512::PREFETCH.store(true, Ordering::Relaxed);
    }
}
