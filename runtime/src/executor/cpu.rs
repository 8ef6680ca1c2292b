//! The CPU executor: a Llama-family forward pass over the paged KV pool.

use super::kv::KvPool;
use super::rope::Rope;
use super::{Batch, ExecError, Executor, KvDtype, KvLayout, Logits, LogitsWanted};
use crate::kernels::attention::{
    attend, attend_shared, shared_supported, AttnTile, KvF32, KvSource, SharedTile, MAX_ROWS,
};
use crate::kernels::elementwise::{rms_norm, silu_mul};
use crate::kernels::packed::{OutPtr, PackedMatrix};
use crate::kernels::pool::ThreadPool;
use crate::kernels::quant::{dequantize_row_bytes, row_bytes, DequantError, QuantActs};
use crate::kernels::Isa;
use crate::model::{ModelConfig, ModelWeights, Weight};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

mod attn_tasks;
use attn_tasks::{shared_bundles, AttnTask, AttnWork};

/// How much KV memory to allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCapacity {
    /// Exactly this many pages.
    Pages(usize),
    /// As many pages as fit in this many bytes.
    Bytes(usize),
}

/// Options of [`CpuExecutor::new`].
#[derive(Clone, Debug)]
pub struct ExecConfig {
    /// Tokens per KV page.
    pub page_size: usize,
    /// Size of the KV pool.
    pub kv: KvCapacity,
    /// Element type of the stored K and V.
    pub kv_dtype: KvDtype,
    /// Threads for the kernels (the calling thread included).
    pub threads: usize,
}

impl Default for ExecConfig {
    /// Pages of 16 tokens, 512 MiB of f16 KV, one thread per available core.
    fn default() -> Self {
        ExecConfig {
            page_size: 16,
            kv: KvCapacity::Bytes(512 << 20),
            kv_dtype: KvDtype::F16,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Why an executor cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A weight cannot be repacked or dequantized.
    #[error("weight {name}: {source}")]
    Weight {
        /// Which weight.
        name: String,
        /// The underlying error.
        source: DequantError,
    },
    /// A weight's shape does not match the configuration.
    #[error("weight {name} is [{rows}, {cols}], expected [{want_rows}, {want_cols}]")]
    Shape {
        /// Which weight.
        name: String,
        /// Its rows.
        rows: usize,
        /// Its columns.
        cols: usize,
        /// Rows the config implies.
        want_rows: usize,
        /// Columns the config implies.
        want_cols: usize,
    },
    /// The configuration is unusable (zero sizes, head counts that do not divide).
    #[error("bad configuration: {0}")]
    Config(String),
}

struct Layer {
    attn_norm: Vec<f32>,
    /// Q, K and V stacked.
    qkv: PackedMatrix,
    qkv_bias: Option<Vec<f32>>,
    wo: PackedMatrix,
    ffn_norm: Vec<f32>,
    /// Gate and up stacked.
    gate_up: PackedMatrix,
    down: PackedMatrix,
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gu: Vec<f32>,
    act: Vec<f32>,
    acts: QuantActs,
    rope: Vec<(f32, f32)>,
}

/// The CPU executor (see the module docs and [`Executor`]).
pub struct CpuExecutor {
    cfg: ModelConfig,
    layers: Vec<Layer>,
    embed: Weight,
    embed_row_bytes: usize,
    final_norm: Vec<f32>,
    lm_head: PackedMatrix,
    kv: KvPool,
    rope: Rope,
    pool: ThreadPool,
    isa: Isa,
    s: Scratch,
    /// Bundle decode steps over shared pages into one attention pass (on by default).
    shared_attention: bool,
}

impl std::fmt::Debug for CpuExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuExecutor")
            .field("layers", &self.layers.len())
            .field("kv_layout", &self.kv.layout())
            .field("num_pages", &self.kv.num_pages())
            .field("isa", &self.isa)
            .field("threads", &self.pool.threads())
            .finish()
    }
}

fn check_shape(name: &str, w: &Weight, rows: usize, cols: usize) -> Result<(), BuildError> {
    if w.rows != rows || w.cols != cols {
        return Err(BuildError::Shape {
            name: name.to_string(),
            rows: w.rows,
            cols: w.cols,
            want_rows: rows,
            want_cols: cols,
        });
    }
    Ok(())
}

fn pack(name: &str, ws: &[&Weight], isa: Isa) -> Result<PackedMatrix, BuildError> {
    PackedMatrix::pack(ws, isa).map_err(|source| BuildError::Weight {
        name: name.to_string(),
        source,
    })
}

/// Query tokens per attention task.
const ATTN_BLOCK: usize = 64;

/// A fresh value per attention pass (any executor), for [`KvF32::fill_reusing`].
static KV_EPOCH: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static ATTN_SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A task's K/V converted to f32, when the task has more than one tile of rows.
    static ATTN_KV: RefCell<KvF32> = RefCell::new(KvF32::default());
}

/// Tokens below which the per-token element-wise work stays on the calling thread.
const PAR_TOKENS: usize = 8;

/// Runs `f(t)` for every token `t in 0..n`, spread over the pool when `n` is large enough.
fn par_tokens(pool: &ThreadPool, n: usize, f: &(dyn Fn(usize) + Sync)) {
    if n < PAR_TOKENS || pool.threads() == 1 {
        (0..n).for_each(f);
        return;
    }
    let per = n.div_ceil(pool.threads() * 4);
    pool.run(n.div_ceil(per), &|c| {
        (c * per..((c + 1) * per).min(n)).for_each(f)
    });
}

/// Row `t` (of width `w`) of the buffer behind `p`.
///
/// # Safety
/// The buffer must hold `(t + 1) * w` floats and no other live reference may cover the row.
#[allow(clippy::mut_from_ref)]
unsafe fn row_mut(p: &OutPtr, t: usize, w: usize) -> &mut [f32] {
    std::slice::from_raw_parts_mut(p.0.add(t * w), w)
}

/// `x += o` for `n` rows of `w`, parallel over tokens.
fn add_rows(pool: &ThreadPool, x: &mut [f32], o: &[f32], n: usize, w: usize) {
    let xp = OutPtr(x.as_mut_ptr());
    par_tokens(pool, n, &|t| {
        // SAFETY: each token's row is written by one call only.
        let row = unsafe { row_mut(&xp, t, w) };
        row.iter_mut()
            .zip(&o[t * w..(t + 1) * w])
            .for_each(|(x, o)| *x += o);
    });
}

/// Rounds every value to f16 precision (one F16C pass when available; same rounding as
/// `f16::from_f32`).
fn round_to_f16(xs: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let mut tmp = [half::f16::ZERO; 64];
    for c in xs.chunks_mut(64) {
        let t = &mut tmp[..c.len()];
        t.convert_from_f32_slice(c);
        t.convert_to_f32_slice(c);
    }
}

/// For every token row `t` of `x` (rows of `h`): `x += add` (the residual of the previous
/// block, when given), RMSNorm into `out`, and that row quantized into `acts` — one pass over
/// the pool instead of three (same results as doing them one after the other).
#[allow(clippy::too_many_arguments)]
fn norm_quant_rows(
    pool: &ThreadPool,
    x: &mut [f32],
    add: Option<&[f32]>,
    w: &[f32],
    eps: f32,
    h: usize,
    out: &mut [f32],
    acts: &mut QuantActs,
) {
    let n = x.len() / h;
    debug_assert!(out.len() >= n * h && add.is_none_or(|a| a.len() >= n * h));
    acts.reset(n, h);
    let (xp, op, acts) = (OutPtr(x.as_mut_ptr()), OutPtr(out.as_mut_ptr()), &*acts);
    par_tokens(pool, n, &|t| {
        // SAFETY: each token's rows of `x`, `out` and `acts` are touched by one call only;
        // both buffers hold `n * h` floats and `acts` was sized for `n` rows of `h`.
        let (xr, dst) = unsafe { (row_mut(&xp, t, h), row_mut(&op, t, h)) };
        if let Some(a) = add {
            xr.iter_mut()
                .zip(&a[t * h..(t + 1) * h])
                .for_each(|(x, o)| *x += o);
        }
        rms_norm(xr, w, eps, dst);
        unsafe { acts.quantize_row_shared(t, dst) };
    });
}

impl CpuExecutor {
    /// Repacks the weights for the kernels and allocates the KV pool.
    pub fn new(
        cfg: &ModelConfig,
        w: &ModelWeights,
        ec: &ExecConfig,
    ) -> Result<CpuExecutor, BuildError> {
        let (h, hd, nh, nkv) = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_heads,
            cfg.num_kv_heads,
        );
        if h == 0 || hd == 0 || nh == 0 || nkv == 0 || nh % nkv != 0 || hd % 2 != 0 {
            return Err(BuildError::Config(format!(
                "hidden {h}, head_dim {hd}, heads {nh}, kv heads {nkv}"
            )));
        }
        if ec.page_size == 0 {
            return Err(BuildError::Config("page_size must be at least 1".into()));
        }
        if w.layers.len() != cfg.num_layers {
            return Err(BuildError::Config(format!(
                "{} layers of weights for {} layers",
                w.layers.len(),
                cfg.num_layers
            )));
        }
        let (qd, kvd, inter) = (nh * hd, nkv * hd, cfg.intermediate_size);
        check_shape("token_embd", &w.embed, cfg.vocab_size, h)?;
        let embed_row_bytes = row_bytes(&w.embed).map_err(|source| BuildError::Weight {
            name: "token_embd".into(),
            source,
        })?;
        let isa = Isa::detect();
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (i, l) in w.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            check_shape(&n("attn_q"), &l.wq, qd, h)?;
            check_shape(&n("attn_k"), &l.wk, kvd, h)?;
            check_shape(&n("attn_v"), &l.wv, kvd, h)?;
            check_shape(&n("attn_output"), &l.wo, h, qd)?;
            check_shape(&n("ffn_gate"), &l.w_gate, inter, h)?;
            check_shape(&n("ffn_up"), &l.w_up, inter, h)?;
            check_shape(&n("ffn_down"), &l.w_down, h, inter)?;
            let qkv_bias = if l.bq.is_some() || l.bk.is_some() || l.bv.is_some() {
                let mut b = vec![0.0f32; qd + 2 * kvd];
                for (src, off, len) in [(&l.bq, 0, qd), (&l.bk, qd, kvd), (&l.bv, qd + kvd, kvd)] {
                    if let Some(v) = src {
                        if v.len() != len {
                            return Err(BuildError::Config(format!(
                                "{}: bias of {} values, {len} expected",
                                n("attn"),
                                v.len()
                            )));
                        }
                        b[off..off + len].copy_from_slice(v);
                    }
                }
                Some(b)
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: l.attn_norm.clone(),
                qkv: pack(&n("attn_qkv"), &[&l.wq, &l.wk, &l.wv], isa)?,
                qkv_bias,
                wo: pack(&n("attn_output"), &[&l.wo], isa)?,
                ffn_norm: l.ffn_norm.clone(),
                gate_up: pack(&n("ffn_gate_up"), &[&l.w_gate, &l.w_up], isa)?,
                down: pack(&n("ffn_down"), &[&l.w_down], isa)?,
            });
        }
        let lm_head = match &w.lm_head {
            Some(head) => {
                check_shape("output", head, cfg.vocab_size, h)?;
                pack("output", &[head], isa)?
            }
            None => pack("token_embd", &[&w.embed], isa)?,
        };
        let layout = KvLayout {
            num_layers: cfg.num_layers,
            num_kv_heads: nkv,
            head_dim: hd,
            page_size: ec.page_size,
            dtype: ec.kv_dtype,
        };
        let num_pages = match ec.kv {
            KvCapacity::Pages(n) => n,
            KvCapacity::Bytes(b) => b / layout.page_bytes(),
        };
        Ok(CpuExecutor {
            cfg: cfg.clone(),
            layers,
            embed: w.embed.clone(),
            embed_row_bytes,
            final_norm: w.final_norm.clone(),
            lm_head,
            kv: KvPool::new(layout, num_pages),
            rope: Rope::new(cfg),
            pool: ThreadPool::new(ec.threads.max(1)),
            isa,
            s: Scratch::default(),
            shared_attention: true,
        })
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Instruction set the kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Turns bundled attention over shared pages on or off (for benchmarks; results are
    /// bit-identical either way).
    pub fn set_shared_attention(&mut self, on: bool) {
        self.shared_attention = on;
    }

    /// Threads the kernels use.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Runs `f(i)` for every `i in 0..n` on the executor's threads (the caller's included) and
    /// returns when all are done: per-row work between forwards, such as picking each
    /// sequence's next token from its logits, in parallel as a server samples them.
    pub fn par_for(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.pool.run(n, f)
    }

    fn validate(&self, batch: &Batch<'_>) -> Result<(), ExecError> {
        let ps = self.kv.layout().page_size;
        for (i, s) in batch.seqs.iter().enumerate() {
            let end = s.start_pos + s.tokens.len();
            if end > self.cfg.max_context {
                return Err(ExecError::ContextOverflow {
                    pos: end,
                    max: self.cfg.max_context,
                });
            }
            if s.pages.len() * ps < end {
                return Err(ExecError::PagesTooShort {
                    seq: i,
                    covered: s.pages.len() * ps,
                    needed: end,
                });
            }
            if let Some(&p) = s.pages[..end.div_ceil(ps)]
                .iter()
                .find(|&&p| p as usize >= self.kv.num_pages())
            {
                return Err(ExecError::BadPage(p));
            }
            if let Some(&t) = s
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                return Err(ExecError::BadToken(t));
            }
        }
        Ok(())
    }
}

impl Executor for CpuExecutor {
    fn kv_layout(&self) -> KvLayout {
        self.kv.layout()
    }

    fn num_pages(&self) -> usize {
        self.kv.num_pages()
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn max_context(&self) -> usize {
        self.cfg.max_context
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<Logits, ExecError> {
        self.validate(batch)?;
        let CpuExecutor {
            cfg,
            layers,
            embed,
            embed_row_bytes,
            final_norm,
            lm_head,
            kv,
            rope,
            pool,
            isa,
            s,
            shared_attention,
        } = self;
        let isa = *isa;
        let (h, hd, nh, nkv) = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_heads,
            cfg.num_kv_heads,
        );
        let (qd, kvd, inter) = (nh * hd, nkv * hd, cfg.intermediate_size);
        let qkv_w = qd + 2 * kvd;
        let ps = kv.layout().page_size;
        let eps = cfg.rms_norm_eps;

        // Flatten the batch: global token t belongs to seq_of[t] at position pos_of[t].
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
        let mut logits = Logits {
            vocab_size: cfg.vocab_size,
            data: Vec::new(),
            rows: Vec::new(),
        };
        if n == 0 {
            return Ok(logits);
        }

        // Embeddings and the RoPE table of every token.
        s.x.resize(n * h, 0.0);
        let mut t = 0;
        for q in &batch.seqs {
            for &tok in q.tokens {
                let rb = *embed_row_bytes;
                let row = &embed.data[tok as usize * rb..(tok as usize + 1) * rb];
                dequantize_row_bytes(embed.dtype, row, &mut s.x[t * h..(t + 1) * h]);
                t += 1;
            }
        }
        s.rope.clear();
        for &p in &pos_of {
            rope.push_table(p, &mut s.rope);
        }
        let half = hd / 2;

        // Attention work: blocks of query tokens × KV heads; decode steps over shared pages
        // in bundles (pushed last: the pool runs tasks from the end, largest first).
        let group = nh / nkv;
        let bundles =
            if *shared_attention && shared_supported(isa, &kv.head(0, batch.seqs[0].pages, 0)) {
                shared_bundles(batch, ps, group, nkv, pool.threads())
            } else {
                Vec::new()
            };
        let mut in_bundle = vec![false; batch.seqs.len()];
        for (ms, _) in &bundles {
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
            AttnWork::Bundle { .. } => (0, 0),
        });
        let mut members = Vec::new();
        for (ms, shared) in &bundles {
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
        let scale = 1.0 / (hd as f32).sqrt();
        // Tokens write their K/V in parallel when no two share a page slot.
        let distinct_slots = {
            let mut slots: Vec<(u32, usize)> = (0..n)
                .map(|t| (batch.seqs[seq_of[t]].pages[pos_of[t] / ps], pos_of[t] % ps))
                .collect();
            slots.sort_unstable();
            slots.windows(2).all(|w| w[0] != w[1])
        };

        for (li, layer) in layers.iter().enumerate() {
            // Attention block.
            s.h.resize(n * h, 0.0);
            // The previous layer's MLP output joins the residual stream in this pass.
            let mlp_out = (li > 0).then_some(&s.o[..]);
            let x = &mut s.x;
            norm_quant_rows(
                pool,
                x,
                mlp_out,
                &layer.attn_norm,
                eps,
                h,
                &mut s.h,
                &mut s.acts,
            );
            s.qkv.resize(n * qkv_w, 0.0);
            layer.qkv.matmul(pool, isa, &s.h, &s.acts, n, &mut s.qkv);
            {
                let (qkv_ptr, table, f16_q) = (
                    OutPtr(s.qkv.as_mut_ptr()),
                    &s.rope,
                    kv.layout().dtype == KvDtype::F16,
                );
                let (writer, seqs, seq_of, pos_of) = (kv.writer(), &batch.seqs, &seq_of, &pos_of);
                par_tokens(pool, n, &|t| {
                    // SAFETY: each token's row is touched by one call only.
                    let row = unsafe { row_mut(&qkv_ptr, t, qkv_w) };
                    if let Some(b) = &layer.qkv_bias {
                        row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                    }
                    Rope::apply(&table[t * half..(t + 1) * half], &mut row[..qd + kvd]);
                    // llama.cpp converts Q to the KV type (f16) before QKᵀ, in both its
                    // attention paths; doing the same keeps our logits within its noise (the
                    // teacher-forced golden test: p99 |Δlogprob| 0.21 → 0.18 nat, no
                    // clear-margin flips).
                    if f16_q {
                        round_to_f16(&mut row[..qd]);
                    }
                    if !distinct_slots {
                        return;
                    }
                    // This token's K/V into its slot, on the thread that computed it.
                    let (q, p) = (&seqs[seq_of[t]], pos_of[t]);
                    // SAFETY: no two tokens of the batch share a slot (checked above).
                    unsafe {
                        writer.write_token(
                            li,
                            q.pages[p / ps] as usize,
                            p % ps,
                            &row[qd..qd + kvd],
                            &row[qd + kvd..],
                        )
                    };
                });
            }
            if !distinct_slots {
                // A batch that writes one slot twice (a caller bug, kept well defined): in
                // order, on this thread.
                for t in 0..n {
                    let row = &s.qkv[t * qkv_w..(t + 1) * qkv_w];
                    let (q, p) = (&batch.seqs[seq_of[t]], pos_of[t]);
                    kv.write_token(
                        li,
                        q.pages[p / ps] as usize,
                        p % ps,
                        &row[qd..qd + kvd],
                        &row[qd + kvd..],
                    );
                }
            }
            s.attn.resize(n * qd, 0.0);
            {
                // The pages are read only during this pass: a thread's f32 copy of one
                // sequence's prefix serves the next sequence sharing those pages.
                let epoch = KV_EPOCH.fetch_add(1, Ordering::Relaxed);
                let out = OutPtr(s.attn.as_mut_ptr());
                let (qkv, kvr, seqs) = (&s.qkv, &*kv, &batch.seqs);
                // K/V are read in place from the sequences' pages, once per tile of the GQA
                // group's rows. The pool runs tasks from the end: bundles, then the last
                // query blocks of a prefill first, so that the threads finish together.
                let (members, first) = (&members, &first);
                pool.run(tasks.len(), &|ti| {
                    let task = &tasks[tasks.len() - 1 - ti];
                    let out = &out;
                    let (seq, t0, t1, pos0) = match &task.work {
                        AttnWork::Block { seq, t0, t1, pos0 } => (*seq, *t0, *t1, *pos0),
                        AttnWork::Bundle {
                            members: range,
                            shared,
                        } => {
                            let ms = &members[range.clone()];
                            let mut qs: Vec<&[f32]> = Vec::with_capacity(ms.len() * group);
                            let mut lens = Vec::with_capacity(ms.len() * group);
                            let mut outs: Vec<&mut [f32]> = Vec::with_capacity(ms.len() * group);
                            let mut kvs = Vec::with_capacity(ms.len());
                            for &m in ms {
                                let t = first[m];
                                kvs.push(kvr.head(li, seqs[m].pages, task.kv_head));
                                for k in 0..group {
                                    let hh = task.kv_head * group + k;
                                    qs.push(&qkv[t * qkv_w + hh * hd..t * qkv_w + (hh + 1) * hd]);
                                    lens.push(seqs[m].start_pos + 1);
                                    // SAFETY: each (token, head) output slice is written by one
                                    // task only.
                                    outs.push(unsafe {
                                        std::slice::from_raw_parts_mut(
                                            out.0.add(t * qd + hh * hd),
                                            hd,
                                        )
                                    });
                                }
                            }
                            let tile = SharedTile {
                                q: &qs,
                                lens: &lens,
                                kv: &kvs,
                                rows_per_member: group,
                                shared: *shared,
                            };
                            ATTN_SCORES.with(|c| {
                                attend_shared(isa, &tile, scale, &mut c.borrow_mut(), &mut outs)
                            });
                            return;
                        }
                    };
                    let g = kvr.head(li, seqs[seq].pages, task.kv_head);
                    // Decode (one tile of rows) reads the pages in place; a prefill block's
                    // many tiles share one f32 conversion of its range (bit-identical).
                    let copy = (t1 - t0) * group > MAX_ROWS;
                    ATTN_SCORES.with(|c| {
                        ATTN_KV.with(|kc| {
                            let scores = &mut *c.borrow_mut();
                            let kc = &mut *kc.borrow_mut();
                            let src = if copy {
                                kc.fill_reusing(isa, &g, pos0 + (t1 - t0), epoch);
                                KvSource::F32(kc)
                            } else {
                                KvSource::Paged(g)
                            };
                            let rows: Vec<(usize, usize)> = (t0..t1)
                                .flat_map(|t| {
                                    (0..group).map(move |k| (t, task.kv_head * group + k))
                                })
                                .collect();
                            for chunk in rows.chunks(MAX_ROWS) {
                                let qs: Vec<&[f32]> = chunk
                                    .iter()
                                    .map(|&(t, hh)| {
                                        &qkv[t * qkv_w + hh * hd..t * qkv_w + (hh + 1) * hd]
                                    })
                                    .collect();
                                let lens: Vec<usize> =
                                    chunk.iter().map(|&(t, _)| pos0 + (t - t0) + 1).collect();
                                // SAFETY: each (token, head) output slice is written by one task only.
                                let mut outs: Vec<&mut [f32]> = chunk
                                    .iter()
                                    .map(|&(t, hh)| unsafe {
                                        std::slice::from_raw_parts_mut(
                                            out.0.add(t * qd + hh * hd),
                                            hd,
                                        )
                                    })
                                    .collect();
                                attend(
                                    isa,
                                    &AttnTile {
                                        q: &qs,
                                        lens: &lens,
                                    },
                                    &src,
                                    scale,
                                    scores,
                                    &mut outs,
                                );
                            }
                        })
                    });
                });
            }
            s.acts.quantize_par(pool, &s.attn, n, qd);
            s.o.resize(n * h, 0.0);
            layer.wo.matmul(pool, isa, &s.attn, &s.acts, n, &mut s.o);

            // MLP block (residual add, norm and quantization in one pass).
            let attn_out = Some(&s.o[..]);
            let x = &mut s.x;
            norm_quant_rows(
                pool,
                x,
                attn_out,
                &layer.ffn_norm,
                eps,
                h,
                &mut s.h,
                &mut s.acts,
            );
            s.gu.resize(n * 2 * inter, 0.0);
            layer.gate_up.matmul(pool, isa, &s.h, &s.acts, n, &mut s.gu);
            s.act.resize(n * inter, 0.0);
            s.acts.reset(n, inter);
            {
                let (gu, act, acts) = (&s.gu, OutPtr(s.act.as_mut_ptr()), &s.acts);
                par_tokens(pool, n, &|t| {
                    let gu = &gu[t * 2 * inter..(t + 1) * 2 * inter];
                    // SAFETY: each token's rows of `act` and `acts` are touched by one call
                    // only; `acts` was sized for `n` rows of `inter`.
                    let dst = unsafe { row_mut(&act, t, inter) };
                    silu_mul(&gu[..inter], &gu[inter..], dst);
                    unsafe { acts.quantize_row_shared(t, dst) };
                });
            }
            layer.down.matmul(pool, isa, &s.act, &s.acts, n, &mut s.o);
            // The residual add joins the next layer's norm pass (the last one is below).
        }
        add_rows(pool, &mut s.x, &s.o, n, h);

        // Logits for the rows asked for.
        for (i, q) in batch.seqs.iter().enumerate() {
            let len = q.tokens.len();
            match &q.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => {
                    if len > 0 {
                        logits.rows.push((i, len - 1));
                    }
                }
                LogitsWanted::All => logits.rows.extend((0..len).map(|j| (i, j))),
                LogitsWanted::Offsets(offs) => logits
                    .rows
                    .extend(offs.iter().filter(|&&j| j < len).map(|&j| (i, j))),
            }
        }
        let m = logits.rows.len();
        if m == 0 {
            return Ok(logits);
        }
        s.h.resize(m * h, 0.0);
        for (r, &(i, j)) in logits.rows.iter().enumerate() {
            let t = first[i] + j;
            rms_norm(
                &s.x[t * h..(t + 1) * h],
                final_norm,
                eps,
                &mut s.h[r * h..(r + 1) * h],
            );
        }
        s.acts.quantize_par(pool, &s.h[..m * h], m, h);
        logits.data = lm_head.matmul_new(pool, isa, &s.h[..m * h], &s.acts, m);
        Ok(logits)
    }

    fn read_pages(&self, pages: &[u32], out: &mut [u8]) -> Result<(), ExecError> {
        self.kv.read_pages(pages, out)
    }

    fn write_pages(&mut self, pages: &[u32], data: &[u8]) -> Result<(), ExecError> {
        self.kv.write_pages(pages, data)
    }
}
