//! GGML block formats: the byte layout of each weight type and their dequantization.
//!
//! Weights stay in their stored encoding (GGML blocks) from the file to the kernels; this
//! module knows each block's shape and turns blocks back into f32 (the f32 reference path,
//! re-quantization at load, and the executor's embedding rows).

use crate::{Weight, WeightType};
use half::{bf16, f16};

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
}
