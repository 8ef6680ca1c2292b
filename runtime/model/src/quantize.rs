//! In-situ quantization at load (`--quantize q8_0|q4_1`): float weight matrices (F32, F16,
//! BF16, e.g. from an HF folder) re-encoded as GGML blocks, so they run on the VNNI kernels
//! with 8-bit activations, as llama.cpp runs a Q8_0 or Q4_1 GGUF.
//!
//! Both are llama.cpp's reference encodings, per block of 32 values:
//! - Q8_0: `d = max|x| / 127` stored as f16, `q = round(x / d)` as i8;
//! - Q4_1: `d = (max − min) / 15` and `m = min` stored as f16, `q = min(15, ⌊(x − min) / d +
//!   0.5⌋)` as 4 bits (element `j` in the low nibble of byte `j`, element `j + 16` in its high
//!   nibble). As llama.cpp's Q4_1 files of tied-embedding models do (the default model is
//!   one), the embedding and output head take Q8_0: they are the logits' last matrix and
//!   cheap to keep at 8 bits.
//!
//! Weights already in a GGML block format are kept as they are; norms and biases stay f32.

use bytes::Bytes;
use half::f16;

use super::{ModelWeights, Weight, WeightType};
use crate::ggml::{dequantize, DequantError};

/// A weight encoding `--quantize` can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantize {
    /// GGML Q8_0 (blocks of 32, f16 scale, 32 × i8).
    Q8_0,
    /// GGML Q4_1 (blocks of 32, f16 scale and minimum, 32 × 4 bits) for the projections;
    /// Q8_0 for the embedding and output head.
    Q4_1,
}

impl std::str::FromStr for Quantize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(Self::Q8_0),
            "q4_1" => Ok(Self::Q4_1),
            other => Err(format!(
                "unsupported --quantize {other:?} (supported: q8_0, q4_1)"
            )),
        }
    }
}

const QK: usize = 32;

/// Encodes one row of floats (length a multiple of 32) as Q8_0 blocks into `out`.
fn q8_0_row(x: &[f32], out: &mut Vec<u8>) {
    for blk in x.chunks_exact(QK) {
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
    }
}

/// Appends one row of floats (length a multiple of 32), encoded, to the buffer.
type RowEncoder = fn(&[f32], &mut Vec<u8>);

/// Encodes one row of floats (length a multiple of 32) as Q4_1 blocks into `out`.
fn q4_1_row(x: &[f32], out: &mut Vec<u8>) {
    for blk in x.chunks_exact(QK) {
        let (min, max) = blk
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        out.extend((0..QK / 2).map(|j| q(blk[j]) | (q(blk[j + QK / 2]) << 4)));
    }
}

/// `w` re-encoded as `q` when it is a float matrix whose rows are whole blocks; otherwise
/// `w` unchanged (already quantized, or rows that the blocks cannot hold).
pub fn quantize_weight(w: &Weight, q: Quantize) -> Result<Weight, DequantError> {
    let float = matches!(
        w.dtype,
        WeightType::F32 | WeightType::F16 | WeightType::Bf16
    );
    if !float || !w.cols.is_multiple_of(QK) {
        return Ok(w.clone());
    }
    let values = dequantize(w)?;
    let (dtype, block_bytes, row_fn): (_, _, RowEncoder) = match q {
        Quantize::Q8_0 => (WeightType::Q8_0, 2 + QK, q8_0_row),
        Quantize::Q4_1 => (WeightType::Q4_1, 4 + QK / 2, q4_1_row),
    };
    let mut data = Vec::with_capacity(w.rows * (w.cols / QK) * block_bytes);
    for row in values.chunks_exact(w.cols) {
        row_fn(row, &mut data);
    }
    Ok(Weight {
        dtype,
        rows: w.rows,
        cols: w.cols,
        data: Bytes::from(data),
    })
}

/// Quantizes every float weight matrix of the model (embedding, projections, output head).
pub fn quantize_model(weights: &mut ModelWeights, q: Quantize) -> Result<(), DequantError> {
    // The embedding and output head stay at 8 bits (see the module docs).
    weights.embed = quantize_weight(&weights.embed, Quantize::Q8_0)?;
    if let Some(head) = &weights.lm_head {
        weights.lm_head = Some(quantize_weight(head, Quantize::Q8_0)?);
    }
    for l in &mut weights.layers {
        for w in [
            &mut l.wq,
            &mut l.wk,
            &mut l.wv,
            &mut l.wo,
            &mut l.w_gate,
            &mut l.w_up,
            &mut l.w_down,
        ] {
            *w = quantize_weight(w, q)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_weight(rows: usize, cols: usize, f: impl Fn(usize) -> f32) -> Weight {
        let data: Vec<u8> = (0..rows * cols).flat_map(|i| f(i).to_le_bytes()).collect();
        Weight {
            dtype: WeightType::F32,
            rows,
            cols,
            data: Bytes::from(data),
        }
    }

    #[test]
    fn q8_0_round_trips_within_half_a_step() {
        let w = f32_weight(3, 64, |i| ((i * 37 % 101) as f32 - 50.0) / 7.0);
        let q = quantize_weight(&w, Quantize::Q8_0).unwrap();
        assert_eq!(q.dtype, WeightType::Q8_0);
        assert_eq!(q.data.len(), 3 * 2 * 34);
        let back = dequantize(&q).unwrap();
        let orig = dequantize(&w).unwrap();
        for (blk_o, blk_b) in orig.chunks(32).zip(back.chunks(32)) {
            let amax = blk_o.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (o, b) in blk_o.iter().zip(blk_b) {
                // half a quantization step, plus the f16 rounding of the scale
                assert!(
                    (o - b).abs() <= amax / 127.0 * 0.5 + amax * 1e-3,
                    "{o} vs {b}"
                );
            }
        }
    }

    #[test]
    fn zero_blocks_and_non_float_weights() {
        let w = f32_weight(1, 32, |_| 0.0);
        let q = quantize_weight(&w, Quantize::Q8_0).unwrap();
        assert!(dequantize(&q).unwrap().iter().all(|v| *v == 0.0));
        // Rows that are not whole blocks stay as they are.
        let odd = f32_weight(2, 40, |i| i as f32);
        assert_eq!(
            quantize_weight(&odd, Quantize::Q8_0).unwrap().dtype,
            WeightType::F32
        );
        assert_eq!("Q8_0".parse::<Quantize>(), Ok(Quantize::Q8_0));
        assert_eq!("q4_1".parse::<Quantize>(), Ok(Quantize::Q4_1));
        assert!("q4_k".parse::<Quantize>().unwrap_err().contains("q4_k"));
    }

    /// Q4_1 matches candle's (llama.cpp's reference) encoder byte for byte, and re-encoding
    /// dequantized Q4_1 blocks gives the same blocks back (an HF folder written from a Q4_1
    /// GGUF loads as that GGUF again).
    #[test]
    fn q4_1_is_llama_cpps_encoding_and_round_trips() {
        use candle_core::quantized::k_quants::{BlockQ4_1, GgmlType};
        let x: Vec<f32> = (0..4 * 64)
            .map(|i| ((i * 7919 % 613) as f32 - 300.0) / 97.0)
            .collect();
        let w = f32_weight(4, 64, |i| x[i]);
        let q = quantize_weight(&w, Quantize::Q4_1).unwrap();
        assert_eq!(q.dtype, WeightType::Q4_1);
        let mut want = vec![BlockQ4_1::zeros(); 8];
        BlockQ4_1::from_float(&x, &mut want);
        let want_bytes = unsafe { std::slice::from_raw_parts(want.as_ptr() as *const u8, 8 * 20) };
        assert_eq!(&q.data[..], want_bytes);
        let back = dequantize(&q).unwrap();
        let again = quantize_weight(&f32_weight(4, 64, |i| back[i]), Quantize::Q4_1).unwrap();
        assert_eq!(again.data, q.data);
    }
}
