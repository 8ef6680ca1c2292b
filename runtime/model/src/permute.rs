//! Row permutations between the two RoPE layouts of Q and K projections.
//!
//! HF checkpoints rotate the two *halves* of each head (`rotate_half`): dimension `i` pairs
//! with `i + d/2`. GGUF (llama.cpp's "normal" RoPE, what the executor runs) rotates *adjacent*
//! pairs `(2i, 2i + 1)`. llama.cpp's converter reorders the rows of `W_q` and `W_k` so that the
//! two conventions compute the same attention scores; these functions do the same, on rows of
//! any encoding (a row is a run of whole quantization blocks, so rows move as byte runs).

use bytes::Bytes;

use super::Weight;

/// Index of the HF (rotate-half) row that lands at adjacent-pair row `r` within one head of
/// dimension `head_dim`.
fn hf_row_for_gguf_row(r: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    (r % 2) * half + r / 2
}

/// Reorders rows `[heads * head_dim]` from HF rotate-half order into GGUF adjacent-pair order.
///
/// `rows` holds `heads * head_dim` rows of `row_len` items each.
pub fn hf_to_gguf<T: Copy>(rows: &[T], heads: usize, head_dim: usize, row_len: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(rows.len());
    for h in 0..heads {
        for r in 0..head_dim {
            let src = h * head_dim + hf_row_for_gguf_row(r, head_dim);
            out.extend_from_slice(&rows[src * row_len..(src + 1) * row_len]);
        }
    }
    out
}

/// Reorders rows from GGUF adjacent-pair order back into HF rotate-half order (the inverse of
/// [`hf_to_gguf`]).
pub fn gguf_to_hf<T: Copy>(rows: &[T], heads: usize, head_dim: usize, row_len: usize) -> Vec<T> {
    let mut out = vec![None; heads * head_dim];
    for h in 0..heads {
        for r in 0..head_dim {
            out[h * head_dim + hf_row_for_gguf_row(r, head_dim)] = Some(h * head_dim + r);
        }
    }
    let mut v = Vec::with_capacity(rows.len());
    for src in out.into_iter().flatten() {
        v.extend_from_slice(&rows[src * row_len..(src + 1) * row_len]);
    }
    v
}

/// Reorders the rows of a stored weight from HF order into GGUF order (any encoding; the
/// result owns a fresh copy of the bytes).
pub fn weight_hf_to_gguf(w: &Weight, heads: usize, head_dim: usize) -> Weight {
    let row_bytes = w.data.len() / w.rows.max(1);
    Weight {
        dtype: w.dtype,
        rows: w.rows,
        cols: w.cols,
        data: Bytes::from(hf_to_gguf(&w.data, heads, head_dim, row_bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_pairs() {
        let heads = 3;
        let d = 8;
        let rows: Vec<u32> = (0..(heads * d) as u32).collect();
        let g = hf_to_gguf(&rows, heads, d, 1);
        // Within head 1, adjacent pair (2, 3) of GGUF order is HF rows (1, 1 + d/2).
        assert_eq!(&g[d..d + 4], &[8, 12, 9, 13]);
        assert_eq!(gguf_to_hf(&g, heads, d, 1), rows);
        let wide: Vec<u32> = (0..(heads * d * 5) as u32).collect();
        assert_eq!(
            gguf_to_hf(&hf_to_gguf(&wide, heads, d, 5), heads, d, 5),
            wide
        );
    }
}
