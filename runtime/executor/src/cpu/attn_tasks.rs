//! Planning the attention work of a forward pass: tasks of query rows against one KV head,
//! and bundles of decode steps whose sequences start with the same pages.

use crate::kernels::attention::MAX_SHARED_ROWS;
use crate::Batch;

/// Attention work item: some query rows against one KV head.
pub(super) struct AttnTask {
    pub kv_head: usize,
    pub work: AttnWork,
}

/// The query rows of an [`AttnTask`].
pub(super) enum AttnWork {
    /// A block of one sequence's query tokens: global token indices `t0..t1`, token `t0` at
    /// position `pos0`.
    Block {
        seq: usize,
        t0: usize,
        t1: usize,
        pos0: usize,
    },
    /// The decode steps of several sequences whose page tables start with the same pages:
    /// the sequences (a range of the bundle member list) and the positions they all read
    /// from those pages.
    Bundle {
        members: std::ops::Range<usize>,
        shared: usize,
    },
    /// Softmax chunks `chunks` of a block's rows (global tokens `t0..t1`, token `t0` at
    /// position `pos0`: one decode token, or a short chunk over a long context), their
    /// partials written at `parts` of the pass's partial buffer (see [`Split`]); merged once
    /// every chunk of the rows is done.
    Part {
        seq: usize,
        t0: usize,
        t1: usize,
        pos0: usize,
        chunks: std::ops::Range<usize>,
        parts: usize,
    },
}

/// A block's rows (tokens `t0..t1`, the GQA group's heads of each token in turn) for one KV
/// head split into chunk tasks: where their partials start in the pass's partial buffer
/// (row `r`, chunk `c` at `parts + (r * chunks + c) * chunk_partial_len`), and how many
/// chunks the block's longest row has.
pub(super) struct Split {
    pub t0: usize,
    pub t1: usize,
    pub kv_head: usize,
    pub parts: usize,
    pub chunks: usize,
}

/// Fewest shared positions worth a bundle (below it, sequences attend one by one).
const MIN_SHARED: usize = 64;

/// Decode steps of sequences that start with the same pages, bundled: (member sequence
/// indices, shared positions) per bundle. Sequences of a run with one first page are split
/// into bundles of at most [`MAX_SHARED_ROWS`] rows, and into enough bundles that the KV
/// heads' tasks keep every thread busy.
pub(super) fn shared_bundles(
    batch: &Batch<'_>,
    ps: usize,
    group: usize,
    nkv: usize,
    threads: usize,
) -> Vec<(Vec<usize>, usize)> {
    let max_members = MAX_SHARED_ROWS / group;
    let mut out = Vec::new();
    if max_members < 2 {
        return out;
    }
    let mut decode: Vec<usize> = (0..batch.seqs.len())
        .filter(|&i| batch.seqs[i].tokens.len() == 1 && !batch.seqs[i].pages.is_empty())
        .collect();
    decode.sort_by_key(|&i| (batch.seqs[i].pages[0], i));
    for run in decode.chunk_by(|&a, &b| batch.seqs[a].pages[0] == batch.seqs[b].pages[0]) {
        if run.len() < 2 {
            continue;
        }
        let bundles = run
            .len()
            .div_ceil(max_members)
            .max((2 * threads).div_ceil(nkv).min(run.len() / 2));
        for members in run.chunks(run.len().div_ceil(bundles)) {
            if members.len() < 2 {
                continue;
            }
            let first = batch.seqs[members[0]].pages;
            let mut shared = usize::MAX;
            for &m in members {
                let q = &batch.seqs[m];
                let common = q
                    .pages
                    .iter()
                    .zip(first)
                    .take_while(|(a, b)| a == b)
                    .count();
                shared = shared.min(common * ps).min(q.start_pos + 1);
            }
            let shared = shared / 16 * 16;
            if shared >= MIN_SHARED {
                out.push((members.to_vec(), shared));
            }
        }
    }
    out
}
