//! Loading an HF model folder: `config.json`, `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`, each memory-mapped), `tokenizer.json`,
//! `tokenizer_config.json` (chat template, BOS/EOS) and, if present, `generation_config.json`
//! and `chat_template.jinja`.
//!
//! Weights stay in their stored type (F32, F16 or BF16). Q/K projection rows (and Qwen2's
//! Q/K biases) are permuted from HF's rotate-half order into the adjacent-pair order the
//! executor runs (see [`super::permute`]).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use safetensors::tensor::{Dtype, SafeTensors};
use serde_json::Value;

use super::error::LoadError;
use super::permute;
use super::progress::{Progress, ShowProgress};
use super::{Arch, LayerWeights, ModelConfig, ModelWeights, RopeScaling, Weight, WeightType};
use super::{LoadOptions, LoadedModel};
use crate::chat::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LoadError::MissingFile(path.to_path_buf()),
        _ => LoadError::io(path, e),
    })?;
    serde_json::from_str(&text).map_err(|source| LoadError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn read_json_opt(path: &Path) -> Result<Option<Value>, LoadError> {
    if path.exists() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// The model configuration from a parsed `config.json`.
pub fn config_from_json(cfg: &Value) -> Result<ModelConfig, LoadError> {
    let arch_name = cfg
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .or_else(|| cfg.get("model_type").and_then(Value::as_str))
        .ok_or_else(|| LoadError::MissingKey("architectures".into()))?;
    let arch = match arch_name {
        "LlamaForCausalLM" | "llama" => Arch::Llama,
        "MistralForCausalLM" | "mistral" => Arch::Mistral,
        "Qwen2ForCausalLM" | "qwen2" => Arch::Qwen2,
        other => return Err(LoadError::UnsupportedArch(other.to_string())),
    };
    let uint = |key: &str| -> Result<Option<usize>, LoadError> {
        match cfg.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| LoadError::BadConfig {
                    key: key.into(),
                    reason: format!("expected an unsigned integer, found {v}"),
                }),
        }
    };
    let req = |key: &str| uint(key)?.ok_or_else(|| LoadError::MissingKey(key.into()));
    let float = |key: &str, default: f64| -> Result<f64, LoadError> {
        match cfg.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| LoadError::BadConfig {
                key: key.into(),
                reason: format!("expected a number, found {v}"),
            }),
        }
    };
    let hidden_size = req("hidden_size")?;
    let num_heads = req("num_attention_heads")?;
    let num_kv_heads = uint("num_key_value_heads")?.unwrap_or(num_heads);
    if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
        return Err(LoadError::BadConfig {
            key: "num_key_value_heads".into(),
            reason: format!("{num_kv_heads} KV heads for {num_heads} query heads"),
        });
    }
    let head_dim = uint("head_dim")?.unwrap_or(hidden_size / num_heads);
    let default_tie = false;
    Ok(ModelConfig {
        arch,
        num_layers: req("num_hidden_layers")?,
        hidden_size,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_size: req("intermediate_size")?,
        vocab_size: req("vocab_size")?,
        max_context: uint("max_position_embeddings")?.unwrap_or(2048),
        rope_theta: float("rope_theta", 10_000.0)? as f32,
        rope_scaling: rope_scaling(cfg.get("rope_scaling"))?,
        rms_norm_eps: float("rms_norm_eps", 1e-6)? as f32,
        tie_word_embeddings: cfg
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(default_tie),
    })
}

fn rope_scaling(v: Option<&Value>) -> Result<RopeScaling, LoadError> {
    let Some(v @ Value::Object(o)) = v else {
        return Ok(RopeScaling::None);
    };
    let kind = o
        .get("rope_type")
        .or_else(|| o.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let f = |k: &str, d: f64| o.get(k).and_then(Value::as_f64).unwrap_or(d) as f32;
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: f("factor", 1.0),
        },
        "llama3" => RopeScaling::Llama3 {
            factor: f("factor", 8.0),
            low_freq_factor: f("low_freq_factor", 1.0),
            high_freq_factor: f("high_freq_factor", 4.0),
            original_max_position_embeddings: o
                .get("original_max_position_embeddings")
                .and_then(Value::as_u64)
                .unwrap_or(8192) as usize,
        },
        other => {
            return Err(LoadError::BadConfig {
                key: "rope_scaling".into(),
                reason: format!("RoPE scaling `{other}` is not supported ({v})"),
            })
        }
    })
}

/// Where one tensor lives: file index, dtype, shape, byte range within the data section.
struct TensorLoc {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    range: (usize, usize),
}

/// The memory-mapped safetensors files of a folder and where each tensor lives.
pub struct SafetensorsSet {
    /// (path, mapped bytes, start of the data section).
    files: Vec<(PathBuf, Bytes, usize)>,
    tensors: HashMap<String, TensorLoc>,
}

impl SafetensorsSet {
    /// Maps `model.safetensors`, or every shard listed in `model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let names: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index.exists() {
            let idx = read_json(&index)?;
            let map = idx
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| LoadError::MissingKey(format!("{}: weight_map", index.display())))?;
            let mut shards: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            return Err(LoadError::MissingFile(single));
        };
        let mut set = SafetensorsSet {
            files: Vec::new(),
            tensors: HashMap::new(),
        };
        for path in names {
            let f = File::open(&path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => LoadError::MissingFile(path.clone()),
                _ => LoadError::io(&path, e),
            })?;
            // SAFETY: read-only map of a model file sglrs never writes.
            let mmap = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| LoadError::io(&path, e))?;
            let bytes = Bytes::from_owner(mmap);
            let (header, meta) =
                SafeTensors::read_metadata(&bytes).map_err(|e| LoadError::Safetensors {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            let data_start = 8 + header;
            let i = set.files.len();
            for (name, info) in meta.tensors() {
                let (a, b) = info.data_offsets;
                if data_start + b > bytes.len() || a > b {
                    return Err(LoadError::BadTensorData {
                        tensor: name,
                        reason: format!("data runs past the end of {}", path.display()),
                    });
                }
                set.tensors.insert(
                    name,
                    TensorLoc {
                        file: i,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        range: info.data_offsets,
                    },
                );
            }
            set.files.push((path, bytes, data_start));
        }
        Ok(set)
    }

    /// Whether the set has tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Tensor `name` as a stored weight (a zero-copy slice of its file's map); vectors are
    /// one row.
    pub fn weight(&self, name: &str) -> Result<Weight, LoadError> {
        let TensorLoc {
            file: fi,
            dtype,
            shape,
            range: (a, b),
        } = self
            .tensors
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor(name.to_string()))?;
        let wt = match dtype {
            Dtype::F32 => WeightType::F32,
            Dtype::F16 => WeightType::F16,
            Dtype::BF16 => WeightType::Bf16,
            other => {
                return Err(LoadError::UnsupportedWeightType {
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        let (rows, cols) = match shape.as_slice() {
            [c] => (1, *c),
            [r, c] => (*r, *c),
            _ => {
                return Err(LoadError::BadTensorData {
                    tensor: name.to_string(),
                    reason: format!("expected a matrix, found shape {shape:?}"),
                })
            }
        };
        let (_, bytes, start) = &self.files[*fi];
        let data = bytes.slice(start + a..start + b);
        if data.len() != rows * cols * dtype.bitsize() / 8 {
            return Err(LoadError::BadTensorData {
                tensor: name.to_string(),
                reason: format!("{} bytes for shape {shape:?}", data.len()),
            });
        }
        Ok(Weight {
            dtype: wt,
            rows,
            cols,
            data,
        })
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        let w = self.weight(name)?;
        if (w.rows, w.cols) != (rows, cols) {
            return Err(LoadError::BadShape {
                tensor: name.to_string(),
                expected: vec![rows, cols],
                got: vec![w.rows, w.cols],
            });
        }
        Ok(w)
    }

    /// Tensor `name` converted to f32.
    pub fn f32_vec(&self, name: &str) -> Result<Vec<f32>, LoadError> {
        Ok(weight_to_f32(&self.weight(name)?))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        let v = self.f32_vec(name)?;
        if v.len() != len {
            return Err(LoadError::BadShape {
                tensor: name.to_string(),
                expected: vec![len],
                got: vec![v.len()],
            });
        }
        Ok(v)
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, LoadError> {
        if self.contains(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// An unquantized (F32/F16/BF16) weight as f32 values.
fn weight_to_f32(w: &Weight) -> Vec<f32> {
    match w.dtype {
        WeightType::F32 => w
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        WeightType::F16 => w
            .data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        WeightType::Bf16 => w
            .data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        // Quantized types never come out of safetensors (rejected in `weight`).
        _ => Vec::new(),
    }
}

/// The weights of an HF checkpoint, Q/K rows permuted into adjacent-pair order.
pub fn hf_weights(
    st: &SafetensorsSet,
    cfg: &ModelConfig,
    show: ShowProgress,
) -> Result<ModelWeights, LoadError> {
    let progress = Progress::new(show, cfg.num_layers + 2, "loading safetensors");
    let h = cfg.hidden_size;
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let ffn = cfg.intermediate_size;
    let embed = st.matrix("model.embed_tokens.weight", cfg.vocab_size, h)?;
    progress.inc();
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        let wq = st.matrix(&n("self_attn.q_proj.weight"), nh * hd, h)?;
        let wk = st.matrix(&n("self_attn.k_proj.weight"), nkv * hd, h)?;
        let bq = st.optional_vector(&n("self_attn.q_proj.bias"), nh * hd)?;
        let bk = st.optional_vector(&n("self_attn.k_proj.bias"), nkv * hd)?;
        layers.push(LayerWeights {
            attn_norm: st.vector(&n("input_layernorm.weight"), h)?,
            wq: permute::weight_hf_to_gguf(&wq, nh, hd),
            wk: permute::weight_hf_to_gguf(&wk, nkv, hd),
            wv: st.matrix(&n("self_attn.v_proj.weight"), nkv * hd, h)?,
            wo: st.matrix(&n("self_attn.o_proj.weight"), h, nh * hd)?,
            bq: bq.map(|b| permute::hf_to_gguf(&b, nh, hd, 1)),
            bk: bk.map(|b| permute::hf_to_gguf(&b, nkv, hd, 1)),
            bv: st.optional_vector(&n("self_attn.v_proj.bias"), nkv * hd)?,
            ffn_norm: st.vector(&n("post_attention_layernorm.weight"), h)?,
            w_gate: st.matrix(&n("mlp.gate_proj.weight"), ffn, h)?,
            w_up: st.matrix(&n("mlp.up_proj.weight"), ffn, h)?,
            w_down: st.matrix(&n("mlp.down_proj.weight"), h, ffn)?,
        });
        progress.inc();
    }
    let final_norm = st.vector("model.norm.weight", h)?;
    let lm_head = if cfg.tie_word_embeddings || !st.contains("lm_head.weight") {
        None
    } else {
        Some(st.matrix("lm_head.weight", cfg.vocab_size, h)?)
    };
    progress.inc();
    progress.finish();
    Ok(ModelWeights {
        embed,
        layers,
        final_norm,
        lm_head,
    })
}

/// The chat template of an HF folder: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of named templates: `default` is used).
fn chat_template_source(dir: &Path, tok_cfg: Option<&Value>) -> Result<Option<String>, LoadError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| LoadError::io(&jinja, e));
    }
    Ok(match tok_cfg.and_then(|c| c.get("chat_template")) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(String::from),
        _ => None,
    })
}

/// Loads an HF model folder.
pub fn load_hf(dir: &Path, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    let config_path = dir.join("config.json");
    if !config_path.exists() {
        return Err(LoadError::NotAModel(dir.to_path_buf()));
    }
    let cfg_json = read_json(&config_path)?;
    let mut config = config_from_json(&cfg_json)?;
    let tok_cfg = read_json_opt(&dir.join("tokenizer_config.json"))?;
    let gen_cfg = read_json_opt(&dir.join("generation_config.json"))?;
    let tokenizer_json = dir.join("tokenizer.json");
    if !tokenizer_json.exists() {
        return Err(LoadError::MissingFile(tokenizer_json));
    }
    let tokenizer = Tokenizer::from_hf_files(&tokenizer_json, tok_cfg.as_ref(), gen_cfg.as_ref())?;
    let chat_template = match chat_template_source(dir, tok_cfg.as_ref())? {
        Some(src) => Some(ChatTemplate::new(
            &src,
            tokenizer.bos_token(),
            tokenizer.eos_token(),
        )?),
        None => None,
    };
    let st = SafetensorsSet::open(dir)?;
    if !config.tie_word_embeddings && !st.contains("lm_head.weight") {
        config.tie_word_embeddings = true;
    }
    let weights = hf_weights(&st, &config, opts.progress)?;
    Ok(LoadedModel {
        config,
        weights,
        tokenizer,
        chat_template,
        path: dir.to_path_buf(),
    })
}
