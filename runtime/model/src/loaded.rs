//! One entry point for every model format: [`load`].

use std::path::{Path, PathBuf};

use super::error::LoadError;
use super::gguf::GgufFile;
use super::quantize::quantize_model;
use super::{LoadOptions, LoadedModel};
use crate::chat::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// Loads a model from a `.gguf` file or an HF folder (`config.json`, safetensors, tokenizer).
pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    let mut m = load_stored(path, opts)?;
    if let Some(q) = opts.quantize {
        quantize_model(&mut m.weights, q).map_err(LoadError::Quantize)?;
    }
    Ok(m)
}

/// The model with its weights in their stored encodings.
fn load_stored(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    if path.is_dir() {
        return super::hf::load_hf(path, opts);
    }
    let file = GgufFile::open(path)?;
    let config = file.config()?;
    let tokenizer = Tokenizer::from_gguf(file.meta())?;
    let chat_template = match file.get_str("tokenizer.chat_template") {
        Some(src) => Some(ChatTemplate::new(
            src,
            tokenizer.bos_token(),
            tokenizer.eos_token(),
        )?),
        None => None,
    };
    let weights = file.weights(&config, opts.progress)?;
    Ok(LoadedModel {
        config,
        weights,
        tokenizer,
        chat_template,
        path: path.to_path_buf(),
    })
}

/// File name of the default model (fetched by `scripts/fetch-model.sh` into `models/`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where to find the model when none is named: `$SGLRS_MODEL` if set, else
/// `models/SmolLM2-135M-Instruct.Q4_1.gguf` in the current directory if it exists, else the same
/// file in the workspace this crate was built from.
pub fn default_model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SGLRS_MODEL") {
        return PathBuf::from(p);
    }
    let local = Path::new("models").join(DEFAULT_MODEL_FILE);
    if local.exists() {
        return local;
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join("models")
        .join(DEFAULT_MODEL_FILE)
}
