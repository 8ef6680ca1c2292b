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

/// How much longer than an even share the busiest thread may be (1/20) before tasks are split.
const IMBALANCE: usize = 20;

/// The longest load of `threads` threads that each take the largest task left when they
/// finish one (how the pool runs tasks ordered by cost, largest first).
fn makespan(costs: &mut [usize], threads: usize) -> usize {
    costs.sort_unstable_by(|a, b| b.cmp(a));
    let mut loads = vec![0usize; threads.max(1)];
    for &c in costs.iter() {
        let least = loads.iter_mut().min().expect("at least one thread");
        *least += c;
    }
    loads.into_iter().max().unwrap_or(0)
}

/// Which tasks to split into their chunk parts so that `threads` threads finish together:
/// `costs[i]` is task `i`'s work (rows × positions), `parts[i]` how many chunk tasks it can
/// become (0 or 1: it cannot be split). None when the whole tasks already share out evenly;
/// else the fewest of the largest splittable tasks that make the split plan even, or all of
/// them when none does (each split task costs a little more: its partials and their merge).
/// With fewer than two tasks per thread, every splittable task.
pub(super) fn tasks_to_split(costs: &[usize], parts: &[usize], threads: usize) -> Vec<bool> {
    let mut split = vec![false; costs.len()];
    let total: usize = costs.iter().sum();
    if threads < 2 || total == 0 {
        return split;
    }
    let even = |m: usize| m * IMBALANCE <= total.div_ceil(threads) * (IMBALANCE + 1);
    if costs.len() < 2 * threads {
        // Fewer tasks than two per thread: finer parts also absorb a thread's stalls.
        for (s, &n) in split.iter_mut().zip(parts) {
            *s = n > 1;
        }
        return split;
    }
    if even(makespan(&mut costs.to_vec(), threads)) {
        return split;
    }
    let mut order: Vec<usize> = (0..costs.len()).filter(|&i| parts[i] > 1).collect();
    order.sort_by(|&a, &b| costs[b].cmp(&costs[a]).then(a.cmp(&b)));
    for (k, &i) in order.iter().enumerate() {
        split[i] = true;
        let mut plan: Vec<usize> = Vec::with_capacity(costs.len() + 16);
        for (j, &c) in costs.iter().enumerate() {
            if split[j] {
                plan.extend(std::iter::repeat_n(c.div_ceil(parts[j]), parts[j]));
            } else {
                plan.push(c);
            }
        }
        if even(makespan(&mut plan, threads)) || k + 1 == order.len() {
            break;
        }
    }
    split
}

#[cfg(test)]
mod tests {
    use super::tasks_to_split;

    fn count(v: &[bool]) -> usize {
        v.iter().filter(|&&b| b).count()
    }

    #[test]
    fn even_batches_split_nothing_and_odd_ones_split_the_fewest_tasks() {
        // Decode rows over 3,400 positions: 3 KV heads per sequence, 4 chunks per row.
        let row = 3_400;
        for (seqs, want) in [(1usize, 3usize), (2, 0), (3, 1), (4, 0), (5, 1), (8, 0)] {
            let costs = vec![row; 3 * seqs];
            let parts = vec![4; 3 * seqs];
            let got = tasks_to_split(&costs, &parts, 2);
            assert_eq!(count(&got), want, "{seqs} sequences on 2 threads");
        }
        // One thread: never.
        assert_eq!(count(&tasks_to_split(&[row; 3], &[4; 3], 1)), 0);
    }

    #[test]
    fn a_short_block_beside_decode_rows_is_split_and_unsplittable_tasks_stay_whole() {
        // Three decode sequences (lengths 3,900 / 3,700 / 2,500) and a 60-token block at
        // 3,600: the block's 3 tasks are each far more than the rest together.
        let mut costs = Vec::new();
        let mut parts = Vec::new();
        for len in [3_900usize, 3_700, 2_500] {
            costs.extend([len; 3]);
            parts.extend([len.div_ceil(1024); 3]);
        }
        costs.extend([60 * 3_660; 3]);
        parts.extend([4; 3]);
        let got = tasks_to_split(&costs, &parts, 2);
        assert!(got[9..].iter().any(|&b| b), "{got:?}");
        // The same tasks when nothing may be split: nothing is.
        let none = tasks_to_split(&costs, &vec![1; costs.len()], 2);
        assert_eq!(count(&none), 0);
    }
}
