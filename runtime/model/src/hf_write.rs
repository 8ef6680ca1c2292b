//! Writing an HF model folder from a GGUF file (`sglrs convert`, tests, and the HF-side peers
//! that need safetensors): weights dequantized to F32 or BF16 with Q/K rows put back into HF's
//! rotate-half order, `tokenizer.json` from the GGUF vocabulary, `config.json`,
//! `tokenizer_config.json` (with the chat template) and `generation_config.json`.

use std::borrow::Cow;
use std::path::Path;

use safetensors::tensor::{Dtype, View};
use serde_json::{json, Value};

use super::error::LoadError;
use super::gguf::{self, GgufFile};
use super::progress::{Progress, ShowProgress};
use super::{permute, Arch, ModelConfig, RopeScaling, Weight};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Element type of the written safetensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HfDtype {
    /// 32-bit float: the dequantized GGUF values exactly.
    #[default]
    F32,
    /// bfloat16 (what most HF checkpoints and vLLM-CPU use), rounded to nearest even.
    Bf16,
}

/// Options of [`write_hf_folder_from_gguf`].
#[derive(Clone, Debug, Default)]
pub struct HfWriteOptions {
    /// Element type of the weights.
    pub dtype: HfDtype,
    /// Split the weights into shards of at most about this many bytes (with
    /// `model.safetensors.index.json`); `None` writes one `model.safetensors`.
    pub shard_bytes: Option<usize>,
    /// Progress bar on stderr.
    pub progress: ShowProgress,
}

struct OwnedTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &OwnedTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn encode(values: &[f32], shape: Vec<usize>, dtype: HfDtype) -> OwnedTensor {
    match dtype {
        HfDtype::F32 => OwnedTensor {
            dtype: Dtype::F32,
            shape,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        },
        HfDtype::Bf16 => OwnedTensor {
            dtype: Dtype::BF16,
            shape,
            data: values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        },
    }
}

fn hf_config_json(cfg: &ModelConfig, tk: &Tokenizer, dtype: HfDtype) -> Value {
    let (arch, model_type) = match cfg.arch {
        Arch::Llama => ("LlamaForCausalLM", "llama"),
        Arch::Mistral => ("MistralForCausalLM", "mistral"),
        Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
    };
    let rope_scaling = match cfg.rope_scaling {
        RopeScaling::None => Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    };
    json!({
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_context,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": cfg.arch == Arch::Qwen2,
        "mlp_bias": false,
        "bos_token_id": tk.bos_id(),
        "eos_token_id": tk.eos_id(),
        "torch_dtype": match dtype { HfDtype::F32 => "float32", HfDtype::Bf16 => "bfloat16" },
    })
}

fn write_json(path: &Path, v: &Value) -> Result<(), LoadError> {
    let text = serde_json::to_string_pretty(v).map_err(|source| LoadError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, text).map_err(|e| LoadError::io(path, e))
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> LoadError {
    LoadError::io(path, std::io::Error::other(e.to_string()))
}

/// Writes an HF folder for the GGUF model at `gguf_path` into `dir` (created if missing).
pub fn write_hf_folder_from_gguf(
    gguf_path: &Path,
    dir: &Path,
    opts: &HfWriteOptions,
) -> Result<(), LoadError> {
    std::fs::create_dir_all(dir).map_err(|e| LoadError::io(dir, e))?;
    let file = GgufFile::open(gguf_path)?;
    let cfg = file.config()?;
    let tk = Tokenizer::from_gguf(file.meta())?;
    let weights = file.weights(&cfg, ShowProgress::Never)?;

    // Tokenizer files.
    let tok_path = dir.join("tokenizer.json");
    tk.inner()
        .save(&tok_path, false)
        .map_err(|e| LoadError::Tokenizer(TokenizerError::Tokenizers(e.to_string())))?;
    let mut tok_cfg = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": cfg.max_context,
        "clean_up_tokenization_spaces": false,
        "add_bos_token": tk.add_bos(),
        "add_eos_token": false,
        "bos_token": tk.bos_token(),
        "eos_token": tk.eos_token(),
    });
    if let Some(t) = file.get_str("tokenizer.chat_template") {
        tok_cfg["chat_template"] = Value::String(t.to_string());
    }
    write_json(&dir.join("tokenizer_config.json"), &tok_cfg)?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"bos_token_id": tk.bos_id(), "eos_token_id": tk.eos_id()}),
    )?;
    write_json(
        &dir.join("config.json"),
        &hf_config_json(&cfg, &tk, opts.dtype),
    )?;

    // Weights, in HF names and HF row order.
    let progress = Progress::new(opts.progress, cfg.num_layers + 2, "writing safetensors");
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let mat = |w: &Weight| -> Result<OwnedTensor, LoadError> {
        Ok(encode(
            &gguf::dequantize(w)?,
            vec![w.rows, w.cols],
            opts.dtype,
        ))
    };
    let qk = |w: &Weight, heads: usize| -> Result<OwnedTensor, LoadError> {
        let v = permute::gguf_to_hf(&gguf::dequantize(w)?, heads, hd, w.cols);
        Ok(encode(&v, vec![w.rows, w.cols], opts.dtype))
    };
    let vec1 = |v: &[f32]| encode(v, vec![v.len()], opts.dtype);
    let mut tensors: Vec<(String, OwnedTensor)> = Vec::new();
    tensors.push(("model.embed_tokens.weight".into(), mat(&weights.embed)?));
    progress.inc();
    for (i, l) in weights.layers.iter().enumerate() {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        tensors.push((n("input_layernorm.weight"), vec1(&l.attn_norm)));
        tensors.push((n("post_attention_layernorm.weight"), vec1(&l.ffn_norm)));
        tensors.push((n("self_attn.q_proj.weight"), qk(&l.wq, nh)?));
        tensors.push((n("self_attn.k_proj.weight"), qk(&l.wk, nkv)?));
        tensors.push((n("self_attn.v_proj.weight"), mat(&l.wv)?));
        tensors.push((n("self_attn.o_proj.weight"), mat(&l.wo)?));
        if let Some(b) = &l.bq {
            tensors.push((
                n("self_attn.q_proj.bias"),
                vec1(&permute::gguf_to_hf(b, nh, hd, 1)),
            ));
        }
        if let Some(b) = &l.bk {
            tensors.push((
                n("self_attn.k_proj.bias"),
                vec1(&permute::gguf_to_hf(b, nkv, hd, 1)),
            ));
        }
        if let Some(b) = &l.bv {
            tensors.push((n("self_attn.v_proj.bias"), vec1(b)));
        }
        tensors.push((n("mlp.gate_proj.weight"), mat(&l.w_gate)?));
        tensors.push((n("mlp.up_proj.weight"), mat(&l.w_up)?));
        tensors.push((n("mlp.down_proj.weight"), mat(&l.w_down)?));
        progress.inc();
    }
    tensors.push(("model.norm.weight".into(), vec1(&weights.final_norm)));
    if let Some(w) = &weights.lm_head {
        tensors.push(("lm_head.weight".into(), mat(w)?));
    }

    // One file, or shards of about `shard_bytes` with an index.
    let mut shards: Vec<Vec<(String, OwnedTensor)>> = vec![Vec::new()];
    let mut size = 0usize;
    for t in tensors {
        if let Some(limit) = opts.shard_bytes {
            if size > 0 && size + t.1.data.len() > limit {
                shards.push(Vec::new());
                size = 0;
            }
        }
        size += t.1.data.len();
        if let Some(last) = shards.last_mut() {
            last.push(t);
        }
    }
    let meta = Some(std::collections::HashMap::from([(
        "format".to_string(),
        "pt".to_string(),
    )]));
    if opts.shard_bytes.is_none() {
        let path = dir.join("model.safetensors");
        let views = shards[0].iter().map(|(n, t)| (n.as_str(), t));
        safetensors::serialize_to_file(views, meta, &path).map_err(|e| io_err(&path, e))?;
    } else {
        let total = shards.len();
        let mut weight_map = serde_json::Map::new();
        let mut total_size = 0usize;
        for (k, shard) in shards.iter().enumerate() {
            let name = format!("model-{:05}-of-{:05}.safetensors", k + 1, total);
            let path = dir.join(&name);
            for (n, t) in shard {
                weight_map.insert(n.clone(), Value::String(name.clone()));
                total_size += t.data.len();
            }
            let views = shard.iter().map(|(n, t)| (n.as_str(), t));
            safetensors::serialize_to_file(views, meta.clone(), &path)
                .map_err(|e| io_err(&path, e))?;
        }
        write_json(
            &dir.join("model.safetensors.index.json"),
            &json!({"metadata": {"total_size": total_size}, "weight_map": weight_map}),
        )?;
    }
    progress.inc();
    progress.finish();
    Ok(())
}
