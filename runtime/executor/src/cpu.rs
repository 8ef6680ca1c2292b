//! The CPU executor: a Llama-family forward pass over the paged KV pool.

use super::kv::KvPool;
use super::rope::Rope;
use super::{Batch, ExecError, Executor, KvDtype, KvLayout, Logits};
#[cfg(target_arch = "x86_64")]
use crate::kernels::attention::amx as amx_attention;
use crate::kernels::attention::{chunks_supported, shared_supported, KvF32, Slots};
use crate::kernels::elementwise::rms_norm;
use crate::kernels::packed::{OutPtr, PackedMatrix};
use crate::kernels::pool::ThreadPool;
use crate::kernels::quant::QuantActs;
use crate::kernels::Isa;
use sglrs_model::ggml::{row_bytes, DequantError};
use sglrs_model::{ModelConfig, ModelWeights, Weight};
use std::cell::RefCell;
use std::sync::atomic::AtomicU64;

mod attn_tasks;
mod forward;
use attn_tasks::shared_bundles;
use forward::{AttnPlan, Dims, Flat, Pass};

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
    /// Chunk partials of split decode rows (`AttnPlan::parts` floats).
    parts: Vec<f32>,
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
    /// Split long decode rows into softmax-chunk tasks when a pass has few tasks (on by
    /// default; the bits are the same either way).
    split_attention: bool,
    /// Stops a pass between layers when raised ([`Executor::set_interrupt`]).
    interrupt: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
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
    /// A task's K/V converted to f32, when the task has more than one tile of rows, one copy
    /// per KV head.
    static ATTN_KV: RefCell<Slots<KvF32>> = RefCell::new(Slots::default());
    /// The same in the AMX tiles' bf16 layouts, one per KV head, with their scratch
    /// (`SGLRS_AMX_ATTENTION=1`).
    #[cfg(target_arch = "x86_64")]
    static ATTN_AMX: RefCell<(Slots<amx_attention::KvBf16>, amx_attention::Scratch)> =
        RefCell::new(Default::default());
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
            split_attention: true,
            interrupt: None,
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

    /// The opt-in AMX tiles the kernels use (`SGLRS_AMX`, `SGLRS_AMX_ATTENTION`).
    pub fn amx(&self) -> crate::kernels::AmxUse {
        crate::kernels::AmxUse::detect(self.isa)
    }

    /// Turns bundled attention over shared pages on or off (for benchmarks; results are
    /// bit-identical either way).
    pub fn set_shared_attention(&mut self, on: bool) {
        self.shared_attention = on;
    }

    /// Turns the splitting of long decode rows into softmax-chunk tasks on or off (on by
    /// default): with few sequences, one long row per KV head would leave threads idle.
    /// Outputs are bit-identical either way; the switch is for tests and benchmarks.
    pub fn set_split_attention(&mut self, on: bool) {
        self.split_attention = on;
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
            split_attention,
            interrupt,
        } = self;
        let flat = Flat::new(batch);
        let mut logits = Logits {
            vocab_size: cfg.vocab_size,
            data: Vec::new(),
            rows: Vec::new(),
        };
        if flat.n == 0 {
            return Ok(logits);
        }
        let p = Pass {
            pool,
            isa: *isa,
            batch,
            flat: &flat,
            d: Dims::new(cfg, kv.layout().page_size),
        };
        forward::embed(&p, embed, *embed_row_bytes, rope, s);
        // Decode steps over shared pages attend in bundles where the kernels support it.
        let bundles =
            if *shared_attention && shared_supported(p.isa, &kv.head(0, batch.seqs[0].pages, 0)) {
                shared_bundles(batch, p.d.ps, p.d.group, p.d.nkv, pool.threads())
            } else {
                Vec::new()
            };
        // Long decode rows split into softmax chunks where the kernel supports it.
        let split = (*split_attention
            && chunks_supported(p.isa, &kv.head(0, batch.seqs[0].pages, 0)))
        .then(|| pool.threads());
        let plan = AttnPlan::new(&p, &bundles, split);
        let distinct_slots = flat.distinct_slots(batch, p.d.ps);
        let interrupted = || {
            interrupt
                .as_ref()
                .is_some_and(|f| f.load(std::sync::atomic::Ordering::Acquire))
        };
        for (li, layer) in layers.iter().enumerate() {
            if interrupted() {
                return Err(ExecError::Interrupted);
            }
            forward::attention_block(&p, li, layer, kv, &plan, distinct_slots, s);
            forward::mlp_block(&p, layer, s);
        }
        add_rows(pool, &mut s.x, &s.o, flat.n, p.d.h);
        logits.rows = forward::logit_rows(batch);
        if logits.rows.is_empty() {
            return Ok(logits);
        }
        forward::head(&p, final_norm, lm_head, &mut logits, s);
        Ok(logits)
    }

    fn read_pages(&self, pages: &[u32], out: &mut [u8]) -> Result<(), ExecError> {
        self.kv.read_pages(pages, out)
    }

    fn write_pages(&mut self, pages: &[u32], data: &[u8]) -> Result<(), ExecError> {
        self.kv.write_pages(pages, data)
    }

    fn page_io(&self) -> Option<crate::kv::PageIo> {
        Some(self.kv.page_io())
    }

    fn set_interrupt(&mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        self.interrupt = Some(flag);
    }
}
