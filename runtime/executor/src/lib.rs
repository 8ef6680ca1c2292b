//! sglrs executor: runs the model over a paged KV pool.
//!
//! [`Executor`] is the one interface between the device-independent runtime (scheduler,
//! sampler, server) and the hardware. The CPU executor ([`CpuExecutor`]) implements it here;
//! a GPU executor implements the same trait later. Nothing above this trait knows the device.
//!
//! KV lives in pages of `page_size` tokens. Page ids are owned by the caller (the radix cache
//! and the scheduler); the executor only reads and writes the pages it is told to use.
//!
//! # Key types and modules
//!
//! - [`Batch`] of [`SeqChunk`]s: prefill chunks and decode steps mixed in one forward pass,
//!   each continuing a sequence from its cached pages; [`Logits`] come back for the rows
//!   asked for ([`LogitsWanted`]).
//! - [`KvLayout`] / [`KvDtype`]: the byte layout of one page, shared with the transfer crate
//!   and the cache tiers ([`Executor::read_pages`] / [`Executor::write_pages`] copy in it).
//! - [`kv::KvPool`]: the pool's pages in memory (K transposed per head for attention).
//! - [`kernels`]: repacked quantized GEMMs (AVX-512 / AVX2 / scalar chosen at run time),
//!   paged attention, fused element-wise passes and the parking thread pool.
//!
//! # Example
//!
//! ```no_run
//! use sglrs_executor::{Batch, CpuExecutor, ExecConfig, Executor, LogitsWanted, SeqChunk};
//!
//! let model = sglrs_model::load(&sglrs_model::default_model_path(), &Default::default())?;
//! let mut exec = CpuExecutor::new(&model.config, &model.weights, &ExecConfig::default())?;
//! let prompt = model.tokenizer.encode("The capital of France is", true)?;
//! let pages: Vec<u32> = (0..prompt.len().div_ceil(exec.kv_layout().page_size) as u32).collect();
//! let batch = Batch {
//!     seqs: vec![SeqChunk { tokens: &prompt, start_pos: 0, pages: &pages, logits: LogitsWanted::Last }],
//! };
//! let logits = exec.forward(&batch)?;
//! let next = logits.row(0).iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i);
//! println!("next token: {next:?}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

/// Which positions of a chunk the caller wants logits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// No logits (a prefill chunk that does not end the prompt).
    None,
    /// Logits for the last token of the chunk only (the usual prefill end and every decode step).
    Last,
    /// Logits for every token of the chunk (input logprobs, teacher forcing).
    All,
    /// Logits for these offsets within the chunk, ascending.
    Offsets(Vec<usize>),
}

/// One sequence's share of a forward pass: `tokens` continue a sequence whose first
/// `start_pos` tokens are already stored in its KV pages.
///
/// A decode step is a chunk of one token. `pages` is the sequence's page table: page `i`
/// holds positions `i * page_size .. (i + 1) * page_size`, and it must cover every position up
/// to `start_pos + tokens.len()`. The new tokens' K and V are written into those pages (a
/// chunk may begin and end inside a page).
#[derive(Clone, Debug)]
pub struct SeqChunk<'a> {
    /// Token ids to run.
    pub tokens: &'a [u32],
    /// Tokens of this sequence already in its KV pages (the position of `tokens[0]`).
    pub start_pos: usize,
    /// Page table of the sequence (page ids into the executor's KV pool).
    pub pages: &'a [u32],
    /// Which logits to return for this chunk.
    pub logits: LogitsWanted,
}

/// A forward pass over many sequences: prefill chunks and decode steps mixed freely.
#[derive(Clone, Debug, Default)]
pub struct Batch<'a> {
    /// The sequences, each continuing from its own cached pages.
    pub seqs: Vec<SeqChunk<'a>>,
}

/// Logits of a forward pass: one row of `vocab_size` values per requested position, in batch
/// order and, within a sequence, in position order.
#[derive(Clone, Debug, Default)]
pub struct Logits {
    /// Width of each row.
    pub vocab_size: usize,
    /// Row-major values, `rows.len() * vocab_size` of them.
    pub data: Vec<f32>,
    /// For each row: (index of the sequence in the batch, offset of the token in its chunk).
    pub rows: Vec<(usize, usize)>,
}

impl Logits {
    /// Row `i` of the logits.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab_size..(i + 1) * self.vocab_size]
    }
}

/// The page layout (one type shared with `sglrs-transfer` and the cache tiers): for each
/// layer, K then V, each `[page_size, num_kv_heads, head_dim]` elements of [`KvDtype`].
pub use sglrs_radix_cache::{KvDtype, KvLayout};

/// Why a forward pass or a page copy failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The pass stopped between layers because its interrupt flag was raised
    /// ([`Executor::set_interrupt`]): it produced nothing, and the K and V it wrote are in
    /// the batch's chunk positions only (rewritten identically when the chunks run again).
    #[error("the forward pass was interrupted")]
    Interrupted,
    /// A page id is outside the KV pool.
    #[error("page id {0} is outside the KV pool")]
    BadPage(u32),
    /// A page table does not cover every position of its chunk.
    #[error("sequence {seq}: page table covers {covered} positions, {needed} needed")]
    PagesTooShort {
        /// Index of the sequence in the batch.
        seq: usize,
        /// Positions the page table covers.
        covered: usize,
        /// Positions the chunk needs.
        needed: usize,
    },
    /// A token id is outside the vocabulary.
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    /// A sequence would run past the model's context length.
    #[error("position {pos} exceeds the context length {max}")]
    ContextOverflow {
        /// The position asked for.
        pos: usize,
        /// The model's context length.
        max: usize,
    },
    /// A buffer passed to a page copy has the wrong size.
    #[error("page buffer has {got} bytes, {want} expected")]
    BadBuffer {
        /// Bytes given.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
}

/// Runs a model over a paged KV pool. Implemented by the CPU executor; a GPU executor
/// implements the same trait.
pub trait Executor: Send {
    /// Shape of one KV page.
    fn kv_layout(&self) -> KvLayout;
    /// Pages in the KV pool; valid page ids are `0..num_pages()`.
    fn num_pages(&self) -> usize;
    /// Vocabulary size (width of a logits row).
    fn vocab_size(&self) -> usize;
    /// Longest sequence the model supports.
    fn max_context(&self) -> usize;
    /// Runs one forward pass: writes the chunks' K and V into their pages and returns the
    /// logits asked for.
    fn forward(&mut self, batch: &Batch<'_>) -> Result<Logits, ExecError>;
    /// Copies pages out of the pool, each `kv_layout().page_bytes()` bytes, in order.
    fn read_pages(&self, pages: &[u32], out: &mut [u8]) -> Result<(), ExecError>;
    /// Copies pages into the pool (from a transfer or a lower cache tier).
    fn write_pages(&mut self, pages: &[u32], data: &[u8]) -> Result<(), ExecError>;
    /// A handle that copies pages in and out of the pool from another thread while forward
    /// passes run (the hierarchical cache's I/O thread); `None` when the executor has none,
    /// and lower tiers are then off.
    fn page_io(&self) -> Option<kv::PageIo> {
        None
    }
    /// A flag that, once raised while a pass runs, stops it at the next layer boundary with
    /// [`ExecError::Interrupted`] (a request that must not wait for the pass in flight).
    /// The caller lowers it before each pass. Executors without layer boundaries to stop
    /// at ignore it (the default).
    fn set_interrupt(&mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        let _ = flag;
    }
}

pub mod cpu;
pub mod kernels;
pub mod kv;
pub mod rope;

pub use cpu::{BuildError, CpuExecutor, ExecConfig, KvCapacity};
