//! Helpers shared by the executor tests.

use sglrs_executor::{Batch, CpuExecutor, Executor, LogitsWanted, SeqChunk};

/// `n` deterministic pseudo-random token ids in `100..49100`, different per `seed`.
pub fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 49000 + 100)
        .collect()
}

/// Page tables of `n` sequences that all start with pages `0..shared_pages` (a prefix they
/// share, as the radix cache arranges) and then own `per` pages each, laid out after them.
pub fn shared_prefix_tables(shared_pages: usize, n: usize, per: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let first = shared_pages + i * per;
            (0..shared_pages)
                .chain(first..first + per)
                .map(|p| p as u32)
                .collect()
        })
        .collect()
}

/// Prefills `prefix` from position 0 into `pages` (no logits): the shared prefix the
/// sequences of [`shared_prefix_tables`] then continue.
pub fn prefill_prefix(ex: &mut CpuExecutor, prefix: &[u32], pages: &[u32]) {
    ex.forward(&Batch {
        seqs: vec![SeqChunk {
            tokens: prefix,
            start_pos: 0,
            pages,
            logits: LogitsWanted::None,
        }],
    })
    .unwrap();
}
