//! `sglrs export-hf`: write an HF model folder (safetensors, `config.json`, `tokenizer.json`,
//! `tokenizer_config.json` with the chat template) from a GGUF file, for HF-side peers such
//! as vLLM that cannot read GGUF.

use anyhow::Context;
use sglrs_model::hf_write::{write_hf_folder_from_gguf, HfDtype, HfWriteOptions};
use sglrs_model::ShowProgress;
use std::path::PathBuf;

/// Options of `sglrs export-hf`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportHfArgs {
    /// The GGUF file (default: `$SGLRS_MODEL` or the bundled model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Folder to write (created if missing; files in it are overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// Element type of the weights: bf16 or f32 (both dequantize the GGUF weights).
    #[arg(long, default_value = "bf16", value_parser = ["bf16", "f32"])]
    pub dtype: String,
}

/// Entry point of `sglrs export-hf`.
pub fn run(args: &ExportHfArgs) -> anyhow::Result<()> {
    let path = args
        .model
        .clone()
        .unwrap_or_else(sglrs_model::default_model_path);
    let dtype = match args.dtype.as_str() {
        "f32" => HfDtype::F32,
        _ => HfDtype::Bf16,
    };
    let opts = HfWriteOptions {
        dtype,
        shard_bytes: None,
        progress: ShowProgress::Auto,
    };
    write_hf_folder_from_gguf(&path, &args.out, &opts).with_context(|| {
        format!(
            "writing an HF folder for {} into {}",
            path.display(),
            args.out.display()
        )
    })?;
    println!(
        "wrote {} ({} weights) from {}",
        args.out.display(),
        args.dtype,
        path.display()
    );
    Ok(())
}
