//! Errors of model loading.

use std::path::PathBuf;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// `--quantize` could not re-encode a weight.
    #[error("quantizing the weights at load: {0}")]
    Quantize(crate::ggml::DequantError),
    /// A file could not be opened, mapped or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file the model format requires is not there.
    #[error("missing file {0}")]
    MissingFile(PathBuf),
    /// The path is neither a GGUF file nor a folder with `config.json`.
    #[error("{0} is neither a .gguf file nor an HF model folder (no config.json)")]
    NotAModel(PathBuf),
    /// The GGUF header or metadata could not be parsed.
    #[error("{path}: bad GGUF file: {message}")]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A safetensors file could not be parsed.
    #[error("{path}: bad safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A JSON file (config, tokenizer config, shard index) could not be parsed.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The model's architecture is not one sglrs runs.
    #[error("unsupported architecture `{0}` (supported: llama, mistral, qwen2)")]
    UnsupportedArch(String),
    /// A tensor is stored in an encoding sglrs cannot run.
    #[error(
        "tensor `{tensor}` has unsupported weight type {dtype} \
         (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)"
    )]
    UnsupportedWeightType {
        /// Name of the tensor.
        tensor: String,
        /// Its stored type.
        dtype: String,
    },
    /// A tensor the architecture needs is not in the checkpoint.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A tensor's shape does not match the model configuration.
    #[error("tensor `{tensor}` has shape {got:?}, expected {expected:?}")]
    BadShape {
        /// Name of the tensor.
        tensor: String,
        /// Shape the configuration implies (outermost first).
        expected: Vec<usize>,
        /// Shape found (outermost first).
        got: Vec<usize>,
    },
    /// A tensor's bytes lie outside its file or do not match its shape.
    #[error("tensor `{tensor}`: {reason}")]
    BadTensorData {
        /// Name of the tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A required configuration key is missing.
    #[error("missing configuration key `{0}`")]
    MissingKey(String),
    /// A configuration value has the wrong type or an impossible value.
    #[error("configuration key `{key}`: {reason}")]
    BadConfig {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The tokenizer could not be built or loaded.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// The chat template does not compile.
    #[error("chat template: {0}")]
    ChatTemplate(#[from] crate::chat::ChatError),
}

impl LoadError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LoadError::Io {
            path: path.into(),
            source,
        }
    }
}
