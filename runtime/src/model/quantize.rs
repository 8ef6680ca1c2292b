//! In-situ quantization at load (`--quantize q8_0`): float weight matrices (F32, F16, BF16,
//! e.g. from an HF folder) re-encoded as GGML Q8_0 blocks, so they run on the 8-bit VNNI
//! kernels with 8-bit activations, as llama.cpp runs a Q8_0 GGUF.
//!
//! Q8_0 is llama.cpp's reference encoding: per block of 32 values, `d = max|x| / 127` stored as
//! f16 and `q = round(x / d)` as i8. Weights already in a GGML block format are kept as they
//! are; norms and biases stay f32.

use bytes::Bytes;
use half::f16;

use super::{ModelWeights, Weight, WeightType};
use crate::kernels::quant::{dequantize, DequantError};

/// A weight encoding `--quantize` can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantize {
    /// GGML Q8_0 (blocks of 32, f16 scale, 32 × i8).
    Q8_0,
}

impl std::str::FromStr for Quantize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(Self::Q8_0),
            other => Err(format!(
                "unsupported --quantize {other:?} (supported: q8_0)"
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

/// `w` re-encoded as Q8_0 when it is a float matrix whose rows are whole blocks; otherwise
/// `w` unchanged (already quantized, or rows that Q8_0 cannot hold).
pub fn quantize_weight(w: &Weight, q: Quantize) -> Result<Weight, DequantError> {
    let Quantize::Q8_0 = q;
    let float = matches!(
        w.dtype,
        WeightType::F32 | WeightType::F16 | WeightType::Bf16
    );
    if !float || !w.cols.is_multiple_of(QK) {
        return Ok(w.clone());
    }
    let values = dequantize(w)?;
    let mut data = Vec::with_capacity(w.rows * (w.cols / QK) * (2 + QK));
    for row in values.chunks_exact(w.cols) {
        q8_0_row(row, &mut data);
    }
    Ok(Weight {
        dtype: WeightType::Q8_0,
        rows: w.rows,
        cols: w.cols,
        data: Bytes::from(data),
    })
}

/// Quantizes every float weight matrix of the model (embedding, projections, output head).
pub fn quantize_model(weights: &mut ModelWeights, q: Quantize) -> Result<(), DequantError> {
    weights.embed = quantize_weight(&weights.embed, q)?;
    if let Some(head) = &weights.lm_head {
        weights.lm_head = Some(quantize_weight(head, q)?);
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
        assert!("q4_k".parse::<Quantize>().unwrap_err().contains("q4_k"));
    }
}
