//! The stages of one forward pass, in the order [`CpuExecutor::forward`](super::CpuExecutor)
//! runs them: flatten the batch, embed, per layer an attention block (norm, QKV projection,
//! RoPE, K/V into the pages, attention over the pages, output projection) and an MLP block,
//! then the logits of the rows asked for.

use super::attn_tasks::{tasks_to_split, AttnTask, AttnWork, Split};
#[cfg(target_arch = "x86_64")]
use super::{amx_attention, ATTN_AMX};
use super::{
    norm_quant_rows, par_tokens, round_to_f16, row_mut, Layer, Scratch, ATTN_BLOCK, ATTN_KV,
    ATTN_SCORES, KV_EPOCH,
};
use crate::kernels::attention::{
    attend, attend_chunks, attend_shared, chunk_partial_len, merge_chunks, AttnTile, KvSource,
    SharedTile, MAX_ROWS, SOFTMAX_CHUNK,
};
use crate::kernels::elementwise::{rms_norm, silu_mul};
use crate::kernels::packed::{OutPtr, PackedMatrix};
use crate::kernels::pool::ThreadPool;
use crate::kernels::Isa;
use crate::kv::KvPool;
use crate::rope::Rope;
use crate::{Batch, KvDtype, Logits, LogitsWanted};
use sglrs_model::ggml::dequantize_row_bytes;
use sglrs_model::{ModelConfig, Weight};
use std::sync::atomic::Ordering;

/// The model's shapes, as every stage uses them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    /// Hidden size.
    pub h: usize,
    /// Head dimension.
    pub hd: usize,
    /// KV heads.
    pub nkv: usize,
    /// Width of the Q part of a QKV row (`nh * hd`).
    pub qd: usize,
    /// Width of the K (and of the V) part of a QKV row (`nkv * hd`).
    pub kvd: usize,
    /// MLP width.
    pub inter: usize,
    /// Width of a QKV row.
    pub qkv_w: usize,
    /// Tokens per KV page.
    pub ps: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Query heads per KV head.
    pub group: usize,
    /// Attention score scale, `1 / sqrt(hd)`.
    pub scale: f32,
}

impl Dims {
    pub fn new(cfg: &ModelConfig, ps: usize) -> Self {
        let (h, hd, nh, nkv) = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_heads,
            cfg.num_kv_heads,
        );
        let (qd, kvd) = (nh * hd, nkv * hd);
        Dims {
            h,
            hd,
            nkv,
            qd,
            kvd,
            inter: cfg.intermediate_size,
            qkv_w: qd + 2 * kvd,
            ps,
            eps: cfg.rms_norm_eps,
            group: nh / nkv,
            scale: 1.0 / (hd as f32).sqrt(),
        }
    }
}

/// The batch flattened: global token `t` belongs to sequence `seq_of[t]` at position
/// `pos_of[t]`; sequence `i`'s tokens start at global index `first[i]`.
pub(super) struct Flat {
    pub n: usize,
    pub seq_of: Vec<usize>,
    pub pos_of: Vec<usize>,
    pub first: Vec<usize>,
}

impl Flat {
    pub fn new(batch: &Batch<'_>) -> Self {
        let n: usize = batch.seqs.iter().map(|q| q.tokens.len()).sum();
        let mut seq_of = Vec::with_capacity(n);
        let mut pos_of = Vec::with_capacity(n);
        let mut first = Vec::with_capacity(batch.seqs.len());
        for (i, q) in batch.seqs.iter().enumerate() {
            first.push(seq_of.len());
            for j in 0..q.tokens.len() {
                seq_of.push(i);
                pos_of.push(q.start_pos + j);
            }
        }
        Flat {
            n,
            seq_of,
            pos_of,
            first,
        }
    }

    /// Whether no two tokens of the batch write the same page slot (then tokens write their
    /// K/V in parallel).
    pub fn distinct_slots(&self, batch: &Batch<'_>, ps: usize) -> bool {
        let mut slots: Vec<(u32, usize)> = (0..self.n)
            .map(|t| {
                let p = self.pos_of[t];
                (batch.seqs[self.seq_of[t]].pages[p / ps], p % ps)
            })
            .collect();
        slots.sort_unstable();
        slots.windows(2).all(|w| w[0] != w[1])
    }
}

/// What every stage of one pass reads.
pub(super) struct Pass<'a, 'b> {
    pub pool: &'a ThreadPool,
    pub isa: Isa,
    pub batch: &'a Batch<'b>,
    pub flat: &'a Flat,
    pub d: Dims,
}

/// Embeddings of every token into `s.x` and the RoPE table of every position into `s.rope`.
pub(super) fn embed(
    p: &Pass<'_, '_>,
    embed: &Weight,
    row_bytes: usize,
    rope: &Rope,
    s: &mut Scratch,
) {
    let h = p.d.h;
    s.x.resize(p.flat.n * h, 0.0);
    let mut t = 0;
    for q in &p.batch.seqs {
        for &tok in q.tokens {
            let row = &embed.data[tok as usize * row_bytes..(tok as usize + 1) * row_bytes];
            dequantize_row_bytes(embed.dtype, row, &mut s.x[t * h..(t + 1) * h]);
            t += 1;
        }
    }
    s.rope.clear();
    for &pos in &p.flat.pos_of {
        rope.push_table(pos, &mut s.rope);
    }
}

/// The attention work of a pass: tasks of query blocks × KV heads, then the bundles of
/// decode steps over shared pages (pushed last: the pool runs tasks from the end, largest
/// first), and the bundles' member sequences.
pub(super) struct AttnPlan {
    pub tasks: Vec<AttnTask>,
    pub members: Vec<usize>,
    /// Decode rows split into chunk tasks ([`AttnWork::Part`]), merged after each layer's
    /// tasks; `parts` floats of partials in all.
    pub splits: Vec<Split>,
    pub parts: usize,
}

impl AttnPlan {
    /// `split_threads`: the pool's threads when long decode rows may be split into softmax
    /// chunks (the kernel supports it); then a pass with fewer than two tasks per thread
    /// splits every decode row longer than one chunk, one task per chunk, so that a few long
    /// sequences keep every thread busy (the bits are those of the row computed whole).
    pub fn new(
        p: &Pass<'_, '_>,
        bundles: &[(Vec<usize>, usize)],
        split_threads: Option<usize>,
    ) -> Self {
        let (batch, first, nkv) = (p.batch, &p.flat.first, p.d.nkv);
        let mut in_bundle = vec![false; batch.seqs.len()];
        for (ms, _) in bundles {
            ms.iter().for_each(|&m| in_bundle[m] = true);
        }
        let mut tasks = Vec::new();
        for (i, q) in batch.seqs.iter().enumerate() {
            if in_bundle[i] {
                continue;
            }
            let mut j = 0;
            while j < q.tokens.len() {
                let j1 = (j + ATTN_BLOCK).min(q.tokens.len());
                for g in 0..nkv {
                    tasks.push(AttnTask {
                        kv_head: g,
                        work: AttnWork::Block {
                            seq: i,
                            t0: first[i] + j,
                            t1: first[i] + j1,
                            pos0: q.start_pos + j,
                        },
                    });
                }
                j = j1;
            }
        }
        // Blocks of the same size class (block index within its sequence) run head by head,
        // sequences next to each other: a thread's next task is then often the same head of
        // another sequence, whose shared prefix its f32 copy already holds. (The pool claims
        // tasks from the end; the last blocks of long prefills still come first.)
        tasks.sort_by_key(|t| match t.work {
            AttnWork::Block { seq, pos0, .. } => {
                ((pos0 - batch.seqs[seq].start_pos) / ATTN_BLOCK, t.kv_head)
            }
            AttnWork::Bundle { .. } | AttnWork::Part { .. } => (0, 0),
        });
        let mut members = Vec::new();
        for (ms, shared) in bundles {
            let range = members.len()..members.len() + ms.len();
            members.extend_from_slice(ms);
            for g in 0..nkv {
                tasks.push(AttnTask {
                    kv_head: g,
                    work: AttnWork::Bundle {
                        members: range.clone(),
                        shared: *shared,
                    },
                });
            }
        }
        let (mut splits, mut parts) = (Vec::new(), 0);
        if let Some(threads) = split_threads {
            // A task's work is about rows × positions. When the whole tasks cannot keep every
            // thread busy to the end (a few long decode rows; a short chunk over a long
            // context, whose 3 KV-head tasks outweigh everything else; an odd number of equal
            // rows), the fewest of the largest long ones are split into one task per softmax
            // chunk, and the tasks then run largest first. The opt-in AMX tiles take
            // multi-row blocks whole (other bits).
            #[cfg(target_arch = "x86_64")]
            let amx = amx_attention::wanted();
            #[cfg(not(target_arch = "x86_64"))]
            let amx = false;
            let cost = |w: &AttnWork| match *w {
                AttnWork::Block { t0, t1, pos0, .. } => (t1 - t0) * (pos0 + t1 - t0),
                AttnWork::Bundle {
                    ref members,
                    shared,
                } => members.len() * shared,
                AttnWork::Part { .. } => 0,
            };
            let chunks_of = |w: &AttnWork| match *w {
                AttnWork::Block { t0, t1, pos0, .. }
                    if pos0 + 1 > SOFTMAX_CHUNK && (t1 == t0 + 1 || !amx) =>
                {
                    (pos0 + t1 - t0).div_ceil(SOFTMAX_CHUNK)
                }
                _ => 1,
            };
            let costs: Vec<usize> = tasks.iter().map(|t| cost(&t.work)).collect();
            let nparts: Vec<usize> = tasks.iter().map(|t| chunks_of(&t.work)).collect();
            let chosen = tasks_to_split(&costs, &nparts, threads);
            if chosen.iter().any(|&b| b) {
                let w = chunk_partial_len(p.d.hd);
                let mut kept = Vec::with_capacity(tasks.len());
                for ((task, split), c) in tasks.into_iter().zip(chosen).zip(costs) {
                    match task.work {
                        AttnWork::Block { seq, t0, t1, pos0 } if split => {
                            let chunks = (pos0 + t1 - t0).div_ceil(SOFTMAX_CHUNK);
                            splits.push(Split {
                                t0,
                                t1,
                                kv_head: task.kv_head,
                                parts,
                                chunks,
                            });
                            for ch in 0..chunks {
                                let part = AttnTask {
                                    kv_head: task.kv_head,
                                    work: AttnWork::Part {
                                        seq,
                                        t0,
                                        t1,
                                        pos0,
                                        chunks: ch..ch + 1,
                                        parts: parts + ch * w,
                                    },
                                };
                                kept.push((c.div_ceil(chunks), part));
                            }
                            parts += (t1 - t0) * p.d.group * chunks * w;
                        }
                        _ => kept.push((c, task)),
                    }
                }
                // The pool runs tasks from the end: largest first.
                kept.sort_by_key(|(c, _)| *c);
                tasks = kept.into_iter().map(|(_, t)| t).collect();
            }
        }
        AttnPlan {
            tasks,
            members,
            splits,
            parts,
        }
    }
}

/// Layer `li`'s attention block: the previous layer's MLP output joins the residual stream,
/// RMSNorm, QKV projection, RoPE, K/V into the pages, attention, output projection into
/// `s.o`.
pub(super) fn attention_block(
    p: &Pass<'_, '_>,
    li: usize,
    layer: &Layer,
    kv: &mut KvPool,
    plan: &AttnPlan,
    distinct_slots: bool,
    s: &mut Scratch,
) {
    let (n, d) = (p.flat.n, p.d);
    s.h.resize(n * d.h, 0.0);
    let mlp_out = (li > 0).then_some(&s.o[..]);
    norm_quant_rows(
        p.pool,
        &mut s.x,
        mlp_out,
        &layer.attn_norm,
        d.eps,
        d.h,
        &mut s.h,
        &mut s.acts,
    );
    s.qkv.resize(n * d.qkv_w, 0.0);
    layer
        .qkv
        .matmul(p.pool, p.isa, &s.h, &s.acts, n, &mut s.qkv);
    rope_and_store(p, li, layer, kv, distinct_slots, s);
    s.attn.resize(n * d.qd, 0.0);
    attend_layer(p, li, kv, plan, s);
    s.acts.quantize_par(p.pool, &s.attn, n, d.qd);
    s.o.resize(n * d.h, 0.0);
    layer
        .wo
        .matmul(p.pool, p.isa, &s.attn, &s.acts, n, &mut s.o);
}

/// Bias, RoPE and the f16 rounding of Q on every QKV row; each token's K/V into its page slot
/// (in parallel when no two tokens share a slot, else in order on this thread).
fn rope_and_store(
    p: &Pass<'_, '_>,
    li: usize,
    layer: &Layer,
    kv: &mut KvPool,
    distinct_slots: bool,
    s: &mut Scratch,
) {
    let (n, d) = (p.flat.n, p.d);
    let (qd, kvd, qkv_w, ps, half) = (d.qd, d.kvd, d.qkv_w, d.ps, d.hd / 2);
    {
        let (qkv_ptr, table, f16_q) = (
            OutPtr(s.qkv.as_mut_ptr()),
            &s.rope,
            kv.layout().dtype == KvDtype::F16,
        );
        let (writer, seqs, seq_of, pos_of) =
            (kv.writer(), &p.batch.seqs, &p.flat.seq_of, &p.flat.pos_of);
        par_tokens(p.pool, n, &|t| {
            // SAFETY: each token's row is touched by one call only.
            let row = unsafe { row_mut(&qkv_ptr, t, qkv_w) };
            if let Some(b) = &layer.qkv_bias {
                row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
            }
            Rope::apply(&table[t * half..(t + 1) * half], &mut row[..qd + kvd]);
            // llama.cpp converts Q to the KV type (f16) before QKᵀ, in both its attention
            // paths; doing the same keeps our logits within its noise (the teacher-forced
            // golden test: p99 |Δlogprob| 0.21 → 0.18 nat, no clear-margin flips).
            if f16_q {
                round_to_f16(&mut row[..qd]);
            }
            if !distinct_slots {
                return;
            }
            // This token's K/V into its slot, on the thread that computed it.
            let (q, pos) = (&seqs[seq_of[t]], pos_of[t]);
            // SAFETY: no two tokens of the batch share a slot (checked by the caller).
            unsafe {
                writer.write_token(
                    li,
                    q.pages[pos / ps] as usize,
                    pos % ps,
                    &row[qd..qd + kvd],
                    &row[qd + kvd..],
                )
            };
        });
    }
    if !distinct_slots {
        // A batch that writes one slot twice (a caller bug, kept well defined): in order,
        // on this thread.
        for t in 0..n {
            let row = &s.qkv[t * qkv_w..(t + 1) * qkv_w];
            let (q, pos) = (&p.batch.seqs[p.flat.seq_of[t]], p.flat.pos_of[t]);
            kv.write_token(
                li,
                q.pages[pos / ps] as usize,
                pos % ps,
                &row[qd..qd + kvd],
                &row[qd + kvd..],
            );
        }
    }
}

/// Attention of every query row of layer `li` into `s.attn`. K/V are read in place from the
/// sequences' pages, once per tile of the GQA group's rows. The pool runs tasks from the
/// end: bundles, then the last query blocks of a prefill first, so the threads finish
/// together. The pages are only read during this pass: a thread's f32 copy of one sequence's
/// prefix serves the next sequence sharing those pages.
fn attend_layer(p: &Pass<'_, '_>, li: usize, kv: &KvPool, plan: &AttnPlan, s: &mut Scratch) {
    let epoch = KV_EPOCH.fetch_add(1, Ordering::Relaxed);
    let out = OutPtr(s.attn.as_mut_ptr());
    s.parts.resize(plan.parts, 0.0);
    let parts = OutPtr(s.parts.as_mut_ptr());
    let qkv = &s.qkv;
    let tasks = &plan.tasks;
    p.pool.run(tasks.len(), &|ti| {
        let task = &tasks[tasks.len() - 1 - ti];
        match &task.work {
            AttnWork::Block { seq, t0, t1, pos0 } => attend_block(
                p,
                li,
                kv,
                qkv,
                &out,
                epoch,
                task.kv_head,
                (*seq, *t0, *t1, *pos0),
            ),
            AttnWork::Bundle {
                members: range,
                shared,
            } => attend_bundle(
                p,
                li,
                kv,
                qkv,
                &out,
                task.kv_head,
                &plan.members[range.clone()],
                *shared,
            ),
            AttnWork::Part {
                seq,
                t0,
                t1,
                pos0,
                chunks,
                parts: at,
            } => attend_part(
                p,
                li,
                kv,
                qkv,
                &parts,
                task.kv_head,
                (*seq, *t0, *t1, *pos0),
                chunks.clone(),
                *at,
            ),
        }
    });
    // The split rows: their chunks' partials merged in chunk order.
    let (d, w) = (&p.d, chunk_partial_len(p.d.hd));
    for sp in &plan.splits {
        for (r, (t, hh)) in block_rows(sp.kv_head, d.group, (sp.t0, sp.t1))
            .into_iter()
            .enumerate()
        {
            let at = sp.parts + r * sp.chunks * w;
            // SAFETY: the pool's tasks are done; this row's output is written here only.
            let o = unsafe { out_row(&out, d, t, hh) };
            merge_chunks(&s.parts[at..at + sp.chunks * w], d.hd, o);
        }
    }
}

/// Softmax chunks `chunks` of the rows of tokens `t0..t1` (token `t0` at position `pos0`)
/// against one KV head, their partials into the pass's partial buffer at `at` (row `r` at
/// `at + r * chunks_total * chunk_partial_len`, the split's layout). The rows go in the
/// tiles [`attend_block`] would make, and a tile takes only the chunks its own longest row
/// reaches (the others get empty partials, which the merge skips): each row then has the
/// bits of the block computed whole.
#[allow(clippy::too_many_arguments)]
fn attend_part(
    p: &Pass<'_, '_>,
    li: usize,
    kv: &KvPool,
    qkv: &[f32],
    parts: &OutPtr,
    kv_head: usize,
    (seq, t0, t1, pos0): (usize, usize, usize, usize),
    chunks: std::ops::Range<usize>,
    at: usize,
) {
    let d = &p.d;
    let g = kv.head(li, p.batch.seqs[seq].pages, kv_head);
    let total = (pos0 + t1 - t0).div_ceil(SOFTMAX_CHUNK);
    let w = chunk_partial_len(d.hd);
    let rows = block_rows(kv_head, d.group, (t0, t1));
    ATTN_SCORES.with(|c| {
        let scores = &mut *c.borrow_mut();
        for (ti, tile) in rows.chunks(MAX_ROWS).enumerate() {
            let qs: Vec<&[f32]> = tile.iter().map(|&(t, hh)| q_row(qkv, d, t, hh)).collect();
            let lens: Vec<usize> = tile.iter().map(|&(t, _)| pos0 + (t - t0) + 1).collect();
            // SAFETY: each split row's chunk range is one task's; the buffer holds
            // `plan.parts`.
            let mut outs: Vec<&mut [f32]> = (0..tile.len())
                .map(|k| unsafe {
                    let r = ti * MAX_ROWS + k;
                    std::slice::from_raw_parts_mut(
                        parts.0.add(at + r * total * w),
                        chunks.len() * w,
                    )
                })
                .collect();
            let reach = lens
                .iter()
                .copied()
                .max()
                .unwrap_or(0)
                .div_ceil(SOFTMAX_CHUNK);
            let live = chunks.start.min(reach)..chunks.end.min(reach);
            if !live.is_empty() {
                let mut head: Vec<&mut [f32]> = outs
                    .iter_mut()
                    .map(|o| &mut o[(live.start - chunks.start) * w..])
                    .collect();
                attend_chunks(
                    p.isa,
                    &AttnTile {
                        q: &qs,
                        lens: &lens,
                    },
                    &g,
                    d.scale,
                    scores,
                    live.clone(),
                    &mut head,
                );
            }
            for o in outs.iter_mut() {
                for c in live.end.max(chunks.start)..chunks.end {
                    let k = (c - chunks.start) * w;
                    o[k] = f32::NEG_INFINITY;
                    o[k + 1] = 0.0;
                }
            }
        }
    });
}

/// The query row of token `t`, head `hh`, in the QKV rows.
fn q_row<'q>(qkv: &'q [f32], d: &Dims, t: usize, hh: usize) -> &'q [f32] {
    &qkv[t * d.qkv_w + hh * d.hd..t * d.qkv_w + (hh + 1) * d.hd]
}

/// The attention output of token `t`, head `hh`.
///
/// # Safety
/// Each (token, head) output slice is written by one task only, and `out` holds `n * qd`
/// floats.
#[allow(clippy::mut_from_ref)]
unsafe fn out_row<'o>(out: &'o OutPtr, d: &Dims, t: usize, hh: usize) -> &'o mut [f32] {
    std::slice::from_raw_parts_mut(out.0.add(t * d.qd + hh * d.hd), d.hd)
}

/// One bundle's decode steps (sequences `ms`, reading `shared` positions from the same
/// pages) against one KV head, in one pass over the shared pages.
#[allow(clippy::too_many_arguments)]
fn attend_bundle(
    p: &Pass<'_, '_>,
    li: usize,
    kv: &KvPool,
    qkv: &[f32],
    out: &OutPtr,
    kv_head: usize,
    ms: &[usize],
    shared: usize,
) {
    let (d, seqs, first) = (&p.d, &p.batch.seqs, &p.flat.first);
    let group = d.group;
    let mut qs: Vec<&[f32]> = Vec::with_capacity(ms.len() * group);
    let mut lens = Vec::with_capacity(ms.len() * group);
    let mut outs: Vec<&mut [f32]> = Vec::with_capacity(ms.len() * group);
    let mut kvs = Vec::with_capacity(ms.len());
    for &m in ms {
        let t = first[m];
        kvs.push(kv.head(li, seqs[m].pages, kv_head));
        for k in 0..group {
            let hh = kv_head * group + k;
            qs.push(q_row(qkv, d, t, hh));
            lens.push(seqs[m].start_pos + 1);
            // SAFETY: each (token, head) output slice is written by one task only.
            outs.push(unsafe { out_row(out, d, t, hh) });
        }
    }
    let tile = SharedTile {
        q: &qs,
        lens: &lens,
        kv: &kvs,
        rows_per_member: group,
        shared,
    };
    ATTN_SCORES.with(|c| attend_shared(p.isa, &tile, d.scale, &mut c.borrow_mut(), &mut outs));
}

/// Most query rows of a block (for one KV head) that read the pages in place; larger blocks
/// convert their K and V range to f32 once and run every tile over the copy. The copy pays
/// only when many tiles share it: over 3,400 positions, blocks of up to 16 tokens (48 rows
/// at SmolLM2's group of 3; jump-forward chunks, speculated tokens, short prompt suffixes)
/// run as fast or faster in place (`sglrs bench executor --step-tokens N`, docs/executor.md),
/// while whole 64-token prefill blocks gain ~3% from the copy.
const COPY_MIN_ROWS: usize = 6 * MAX_ROWS;

/// One block of a sequence's query tokens (global `t0..t1`, token `t0` at position `pos0`)
/// against one KV head. Small blocks (decode steps, short chunks) read the pages in place; a
/// larger block's many tiles share one f32 conversion of its range (bit-identical).
#[allow(clippy::too_many_arguments)]
fn attend_block(
    p: &Pass<'_, '_>,
    li: usize,
    kv: &KvPool,
    qkv: &[f32],
    out: &OutPtr,
    epoch: u64,
    kv_head: usize,
    (seq, t0, t1, pos0): (usize, usize, usize, usize),
) {
    let (d, isa) = (&p.d, p.isa);
    let group = d.group;
    let g = kv.head(li, p.batch.seqs[seq].pages, kv_head);
    let rows = (t1 - t0) * group;
    // The opt-in tiles take every block of more than one tile of rows, whatever its size
    // (so that a row's bits do not depend on how a prompt was chunked).
    #[cfg(target_arch = "x86_64")]
    if rows > MAX_ROWS && amx_attention::wanted() && amx_attention::supports(&g) {
        attend_block_amx(p, &g, qkv, out, epoch, kv_head, (t0, t1, pos0));
        return;
    }
    ATTN_SCORES.with(|c| {
        ATTN_KV.with(|kc| {
            let scores = &mut *c.borrow_mut();
            let slots = &mut *kc.borrow_mut();
            let src = if rows > COPY_MIN_ROWS {
                let kc = slots.slot(&g, epoch);
                kc.fill_reusing(isa, &g, pos0 + (t1 - t0), epoch);
                KvSource::F32(kc)
            } else {
                KvSource::Paged(g)
            };
            let rows = block_rows(kv_head, group, (t0, t1));
            for chunk in rows.chunks(MAX_ROWS) {
                // SAFETY: each (token, head) output slice is written by one task only.
                let (qs, lens, mut outs) = unsafe { row_slices(d, qkv, out, chunk, (t0, pos0)) };
                attend(
                    isa,
                    &AttnTile {
                        q: &qs,
                        lens: &lens,
                    },
                    &src,
                    d.scale,
                    scores,
                    &mut outs,
                );
            }
        })
    });
}

/// The query rows of tokens `t0..t1` for KV head `kv_head`: (token, query head), the
/// group's heads of each token in turn.
fn block_rows(kv_head: usize, group: usize, (t0, t1): (usize, usize)) -> Vec<(usize, usize)> {
    (t0..t1)
        .flat_map(|t| (0..group).map(move |k| (t, kv_head * group + k)))
        .collect()
}

/// Each row's query vector, visible length (token `t0` at position `pos0`, causal) and
/// output slice.
///
/// # Safety
/// As [`out_row`]: no other task writes these rows' outputs.
#[allow(clippy::type_complexity, clippy::mut_from_ref)]
unsafe fn row_slices<'q, 'o>(
    d: &Dims,
    qkv: &'q [f32],
    out: &'o OutPtr,
    rows: &[(usize, usize)],
    (t0, pos0): (usize, usize),
) -> (Vec<&'q [f32]>, Vec<usize>, Vec<&'o mut [f32]>) {
    let qs = rows.iter().map(|&(t, hh)| q_row(qkv, d, t, hh)).collect();
    let lens = rows.iter().map(|&(t, _)| pos0 + (t - t0) + 1).collect();
    let outs = rows.iter().map(|&(t, hh)| out_row(out, d, t, hh)).collect();
    (qs, lens, outs)
}

/// [`attend_block`] on AMX-BF16 tiles, all the block's query rows in one pass over the
/// positions (see `kernels::attention::amx`).
#[cfg(target_arch = "x86_64")]
fn attend_block_amx(
    p: &Pass<'_, '_>,
    g: &crate::kernels::attention::PagedKv<'_>,
    qkv: &[f32],
    out: &OutPtr,
    epoch: u64,
    kv_head: usize,
    (t0, t1, pos0): (usize, usize, usize),
) {
    let d = &p.d;
    let group = d.group;
    ATTN_AMX.with(|c| {
        let (slots, scratch) = &mut *c.borrow_mut();
        let kb = slots.slot(g, epoch);
        kb.fill_reusing(g, pos0 + (t1 - t0), epoch);
        let rows = block_rows(kv_head, group, (t0, t1));
        // SAFETY: each (token, head) output slice is written by one task only.
        let (qs, lens, mut outs) = unsafe { row_slices(d, qkv, out, &rows, (t0, pos0)) };
        let tile = AttnTile {
            q: &qs,
            lens: &lens,
        };
        amx_attention::attend(&tile, kb, d.scale, scratch, &mut outs);
    });
}

/// Layer `li`'s MLP block: the attention output joins the residual stream, RMSNorm, gate and
/// up projections, SiLU(gate) × up, down projection into `s.o` (which joins the residual in
/// the next layer's norm pass, or at the end).
pub(super) fn mlp_block(p: &Pass<'_, '_>, layer: &Layer, s: &mut Scratch) {
    let (n, d) = (p.flat.n, p.d);
    let inter = d.inter;
    let attn_out = Some(&s.o[..]);
    norm_quant_rows(
        p.pool,
        &mut s.x,
        attn_out,
        &layer.ffn_norm,
        d.eps,
        d.h,
        &mut s.h,
        &mut s.acts,
    );
    s.gu.resize(n * 2 * inter, 0.0);
    layer
        .gate_up
        .matmul(p.pool, p.isa, &s.h, &s.acts, n, &mut s.gu);
    s.act.resize(n * inter, 0.0);
    s.acts.reset(n, inter);
    {
        let (gu, act, acts) = (&s.gu, OutPtr(s.act.as_mut_ptr()), &s.acts);
        par_tokens(p.pool, n, &|t| {
            let gu = &gu[t * 2 * inter..(t + 1) * 2 * inter];
            // SAFETY: each token's rows of `act` and `acts` are touched by one call only;
            // `acts` was sized for `n` rows of `inter`.
            let dst = unsafe { row_mut(&act, t, inter) };
            silu_mul(&gu[..inter], &gu[inter..], dst);
            unsafe { acts.quantize_row_shared(t, dst) };
        });
    }
    layer
        .down
        .matmul(p.pool, p.isa, &s.act, &s.acts, n, &mut s.o);
}

/// (sequence, offset in its chunk) of every logits row the batch asks for, in batch order.
pub(super) fn logit_rows(batch: &Batch<'_>) -> Vec<(usize, usize)> {
    let mut rows = Vec::new();
    for (i, q) in batch.seqs.iter().enumerate() {
        let len = q.tokens.len();
        match &q.logits {
            LogitsWanted::None => {}
            LogitsWanted::Last => {
                if len > 0 {
                    rows.push((i, len - 1));
                }
            }
            LogitsWanted::All => rows.extend((0..len).map(|j| (i, j))),
            LogitsWanted::Offsets(offs) => {
                rows.extend(offs.iter().filter(|&&j| j < len).map(|&j| (i, j)))
            }
        }
    }
    rows
}

/// The final RMSNorm and the output head over the rows in `logits.rows`.
pub(super) fn head(
    p: &Pass<'_, '_>,
    final_norm: &[f32],
    lm_head: &PackedMatrix,
    logits: &mut Logits,
    s: &mut Scratch,
) {
    let (h, m) = (p.d.h, logits.rows.len());
    s.h.resize(m * h, 0.0);
    for (r, &(i, j)) in logits.rows.iter().enumerate() {
        let t = p.flat.first[i] + j;
        rms_norm(
            &s.x[t * h..(t + 1) * h],
            final_norm,
            p.d.eps,
            &mut s.h[r * h..(r + 1) * h],
        );
    }
    s.acts.quantize_par(p.pool, &s.h[..m * h], m, h);
    logits.data = lm_head.matmul_new(p.pool, p.isa, &s.h[..m * h], &s.acts, m);
}
