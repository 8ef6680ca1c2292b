//! sglrs models: everything read from a model file, before anything runs.
//!
//! A GGUF file or an HF folder (safetensors, `config.json`, `tokenizer.json`) becomes a
//! [`LoadedModel`]: its [`ModelConfig`] (shapes, RoPE, norms), its [`ModelWeights`] in their
//! stored encoding (GGML blocks stay quantized, usually memory-mapped), its
//! [`tokenizer::Tokenizer`] and its [`chat::ChatTemplate`]. Nothing here runs the model; the
//! executor (`sglrs-executor`) consumes the weights, the scheduler and server the tokenizer
//! and template.
//!
//! # Key types and modules
//!
//! - [`load()`] and [`LoadOptions`]: one entry point for every format ([`gguf`], [`hf`]),
//!   with optional re-quantization at load ([`Quantize`]).
//! - [`Weight`] / [`WeightType`]: one matrix in its stored encoding; [`ggml`] knows each
//!   block format's shape and dequantizes it.
//! - [`tokenizer::Tokenizer`]: a `tokenizers::Tokenizer` built from GGUF metadata
//!   ([`meta`]) with llama.cpp's pre-tokenizer rules, or from `tokenizer.json`.
//! - [`chat::ChatTemplate`]: HF-compatible chat templates on minijinja.
//! - [`hf_write`]: writes an HF folder from a GGUF (`sglrs export-hf`).
//!
//! # Example
//!
//! ```no_run
//! use sglrs_model::chat::{Message, RenderOptions};
//! use sglrs_model::{load, LoadOptions};
//!
//! let model = load(&sglrs_model::default_model_path(), &LoadOptions::default())?;
//! println!("{} layers, vocabulary {}", model.config.num_layers, model.config.vocab_size);
//! let ids = model.tokenizer.encode("The capital of France is", true)?;
//! if let Some(t) = &model.chat_template {
//!     let msgs = [Message::new("user", "Hello!")];
//!     let prompt = t.render(&msgs[..], &RenderOptions::default())?;
//!     println!("{prompt}");
//! }
//! println!("{} prompt tokens", ids.len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Conventions every loader guarantees:
//!
//! - a matrix is row-major `[rows = output features, cols = input features]`, quantized along
//!   `cols` (one row is a run of whole blocks), exactly as GGUF stores it;
//! - Q and K rows are in GGUF's order: RoPE rotates *adjacent* pairs `(2i, 2i + 1)` of each
//!   head (llama.cpp's "normal" RoPE). HF checkpoints use rotate-half order, so the HF loader
//!   permutes Q/K rows into this order on load.

#![warn(missing_docs)]

use bytes::Bytes;
use chat::ChatTemplate;
use std::path::PathBuf;
use tokenizer::Tokenizer;

pub mod chat;
mod error;
pub mod ggml;
pub mod gguf;
mod gguf_header;
pub mod hf;
pub mod hf_write;
mod loaded;
pub mod meta;
pub mod permute;
mod progress;
pub mod quantize;
pub mod tokenizer;

pub use error::LoadError;
pub use loaded::{default_model_path, load, DEFAULT_MODEL_FILE};
pub use progress::ShowProgress;
pub use quantize::Quantize;

/// Model family; decides small architectural details (biases, defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama / SmolLM.
    Llama,
    /// Mistral (Llama layout, sliding-window attention ignored at these context lengths).
    Mistral,
    /// Qwen2 (Llama layout plus Q/K/V biases).
    Qwen2,
}

/// RoPE frequency scaling, as the model's config gives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// Scale factor.
        factor: f32,
    },
    /// Llama 3 frequency-dependent scaling.
    Llama3 {
        /// Scale factor.
        factor: f32,
        /// Low-frequency factor.
        low_freq_factor: f32,
        /// High-frequency factor.
        high_freq_factor: f32,
        /// Context length the model was trained at.
        original_max_position_embeddings: usize,
    },
}

/// Shapes and hyper-parameters of a Llama-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Model family.
    pub arch: Arch,
    /// Transformer layers.
    pub num_layers: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Context length the model supports.
    pub max_context: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Output projection shares the token embedding.
    pub tie_word_embeddings: bool,
}

/// Encoding of a stored weight matrix (GGML block formats keep GGML's byte layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// GGML Q8_0: blocks of 32, f16 scale + 32 × i8 (34 bytes).
    Q8_0,
    /// GGML Q4_0: blocks of 32, f16 scale + 16 bytes of nibbles (18 bytes).
    Q4_0,
    /// GGML Q4_1: blocks of 32, f16 scale, f16 min + 16 bytes of nibbles (20 bytes).
    Q4_1,
    /// GGML Q4_K: super-blocks of 256 (144 bytes).
    Q4K,
    /// GGML Q6_K: super-blocks of 256 (210 bytes).
    Q6K,
}

/// A weight matrix in its stored encoding.
#[derive(Clone, Debug)]
pub struct Weight {
    /// Encoding of `data`.
    pub dtype: WeightType,
    /// Output features.
    pub rows: usize,
    /// Input features (the quantized axis).
    pub cols: usize,
    /// Row-major bytes, usually a slice of the memory-mapped file.
    pub data: Bytes,
}

/// Weights of one transformer layer.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection `[num_heads * head_dim, hidden]` (GGUF RoPE order).
    pub wq: Weight,
    /// Key projection `[num_kv_heads * head_dim, hidden]` (GGUF RoPE order).
    pub wk: Weight,
    /// Value projection `[num_kv_heads * head_dim, hidden]`.
    pub wv: Weight,
    /// Attention output projection `[hidden, num_heads * head_dim]`.
    pub wo: Weight,
    /// Query bias (Qwen2), in the same order as `wq`'s rows.
    pub bq: Option<Vec<f32>>,
    /// Key bias (Qwen2), in the same order as `wk`'s rows.
    pub bk: Option<Vec<f32>>,
    /// Value bias (Qwen2).
    pub bv: Option<Vec<f32>>,
    /// RMSNorm before the MLP.
    pub ffn_norm: Vec<f32>,
    /// SwiGLU gate `[intermediate, hidden]`.
    pub w_gate: Weight,
    /// SwiGLU up `[intermediate, hidden]`.
    pub w_up: Weight,
    /// SwiGLU down `[hidden, intermediate]`.
    pub w_down: Weight,
}

/// All weights of a model.
#[derive(Clone, Debug)]
pub struct ModelWeights {
    /// Token embedding `[vocab, hidden]`.
    pub embed: Weight,
    /// Transformer layers.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm.
    pub final_norm: Vec<f32>,
    /// Output projection `[vocab, hidden]`; `None` when tied to `embed`.
    pub lm_head: Option<Weight>,
}

/// Options of [`load()`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// When to draw a progress bar on stderr.
    pub progress: ShowProgress,
    /// Re-encode float weight matrices at load (`--quantize q8_0|q4_1`); `None` keeps them.
    pub quantize: Option<Quantize>,
}

/// A model ready to run: configuration, weights, tokenizer and chat template.
#[derive(Debug)]
pub struct LoadedModel {
    /// Shapes and hyper-parameters.
    pub config: ModelConfig,
    /// The weights (memory-mapped where the format allows).
    pub weights: ModelWeights,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template, if it has one.
    pub chat_template: Option<ChatTemplate>,
    /// Where the model was loaded from (a `.gguf` file or an HF folder).
    pub path: PathBuf,
}
