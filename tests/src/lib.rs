//! End-to-end tests of sglrs: real processes, the real default model, real clients.
//!
//! Helpers shared by the tests in `tests/tests/`: where the default model and the shared
//! reference data live.
#![warn(missing_docs)]

use std::path::PathBuf;

/// The workspace root (the folder holding the top-level `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits inside the workspace")
        .to_path_buf()
}

/// Path of the default model: `$SGLRS_MODEL` if set, else `models/SmolLM2-135M-Instruct.Q4_1.gguf`.
pub fn default_model() -> PathBuf {
    std::env::var_os("SGLRS_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// The shared reference data folder: `$SGLRS_SHARED` if set, else `../shared` beside the checkout.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("SGLRS_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared"))
}
