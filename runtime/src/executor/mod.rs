//! The executor: runs the model over a paged KV pool.
//!
//! [`Executor`] is the one interface between the device-independent runtime (scheduler,
//! sampler, server) and the hardware. The CPU executor implements it here; a GPU executor
//! implements the same trait later. Nothing above this trait knows the device.
//!
//! KV lives in pages of `page_size` tokens. Page ids are owned by the caller (the radix cache
//! and the scheduler); the executor only reads and writes the pages it is told to use.

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

/// Element type of the stored K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    /// IEEE half precision (what llama.cpp stores by default).
    F16,
    /// bfloat16.
    Bf16,
    /// 32-bit float.
    F32,
}

impl KvDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::F32 => 4,
        }
    }
}

/// Shape of one KV page, which is also its layout on the wire (transfer) and on disk (HiCache):
/// for each layer, K then V, each `[page_size, num_kv_heads, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Transformer layers.
    pub num_layers: usize,
    /// Key/value heads per layer.
    pub num_kv_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Element type.
    pub dtype: KvDtype,
}

impl KvLayout {
    /// Bytes of one page across all layers, K and V.
    pub fn page_bytes(&self) -> usize {
        self.num_layers * 2 * self.page_size * self.num_kv_heads * self.head_dim * self.dtype.size()
    }
}

/// Why a forward pass or a page copy failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
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
}

pub mod cpu;
pub mod kv;
pub mod rope;

pub use cpu::{BuildError, CpuExecutor, ExecConfig, KvCapacity};
