//! GGUF loading: header and metadata through candle's parser, tensor bytes as zero-copy slices
//! of a memory map.
//!
//! GGUF lists a tensor's dimensions innermost first; candle's parser reverses them, so a
//! [`TensorInfo`]'s shape is outermost first: `[rows, cols]`. Llama GGUFs already store Q/K in
//! the adjacent-pair RoPE order the executor runs; Qwen2 GGUFs keep HF's rotate-half order
//! (llama.cpp runs them with NEOX RoPE), so their Q/K rows and biases are reordered on load.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::GgmlDType;

use super::error::LoadError;
use super::meta::{value_as_f64, value_as_u64, GgufMeta};
use super::permute;
use super::progress::{Progress, ShowProgress};
use super::{Arch, LayerWeights, ModelConfig, ModelWeights, RopeScaling, Weight, WeightType};

/// Tensors every layer has at least: two norms, four attention and three FFN matrices.
const TENSORS_PER_LAYER: usize = 9;

/// An open, memory-mapped GGUF file: its metadata and tensor directory.
pub struct GgufFile {
    path: PathBuf,
    data: Bytes,
    content: Content,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("bytes", &self.data.len())
            .field("tensors", &self.content.tensor_infos.len())
            .field("metadata_keys", &self.content.metadata.len())
            .finish()
    }
}

/// Loads a GGUF model: its configuration, its weights (slices of the file's memory map) and
/// the open file (metadata for the tokenizer and chat template).
pub fn load_gguf(path: &Path) -> Result<(ModelConfig, ModelWeights, GgufFile), LoadError> {
    let file = GgufFile::open(path)?;
    let config = file.config()?;
    let weights = file.weights(&config, ShowProgress::Never)?;
    Ok((config, weights, file))
}

/// The weight type sglrs runs for a GGML type, if any.
pub fn weight_type(dtype: GgmlDType) -> Option<WeightType> {
    Some(match dtype {
        GgmlDType::F32 => WeightType::F32,
        GgmlDType::F16 => WeightType::F16,
        GgmlDType::BF16 => WeightType::Bf16,
        GgmlDType::Q8_0 => WeightType::Q8_0,
        GgmlDType::Q4_0 => WeightType::Q4_0,
        GgmlDType::Q4_1 => WeightType::Q4_1,
        GgmlDType::Q4K => WeightType::Q4K,
        GgmlDType::Q6K => WeightType::Q6K,
        _ => return None,
    })
}

/// The GGML type of a weight type (for dequantisation through candle).
pub fn ggml_type(dtype: WeightType) -> GgmlDType {
    match dtype {
        WeightType::F32 => GgmlDType::F32,
        WeightType::F16 => GgmlDType::F16,
        WeightType::Bf16 => GgmlDType::BF16,
        WeightType::Q8_0 => GgmlDType::Q8_0,
        WeightType::Q4_0 => GgmlDType::Q4_0,
        WeightType::Q4_1 => GgmlDType::Q4_1,
        WeightType::Q4K => GgmlDType::Q4K,
        WeightType::Q6K => GgmlDType::Q6K,
    }
}

/// Dequantizes a stored weight to row-major f32 `[rows * cols]` (through candle's reference
/// dequantisation).
pub fn dequantize(w: &Weight) -> Result<Vec<f32>, LoadError> {
    let tensor = || format!("{:?} [{} x {}]", w.dtype, w.rows, w.cols);
    let bad = |e: candle_core::Error| LoadError::BadTensorData {
        tensor: tensor(),
        reason: e.to_string(),
    };
    // candle reads the bytes as a slice of its block type without checking their length or
    // alignment: check the length here, and hand it an 8-byte-aligned copy when the weight
    // is not aligned (a tensor offset in a file need not be).
    super::ggml::row_bytes(w).map_err(|e| LoadError::BadTensorData {
        tensor: tensor(),
        reason: e.to_string(),
    })?;
    let mut copy = Vec::new();
    let data: &[u8] = if (w.data.as_ptr() as usize).is_multiple_of(8) {
        &w.data
    } else {
        copy.resize(w.data.len() + 7, 0u8);
        let at = copy.as_ptr().align_offset(8).min(7);
        copy[at..at + w.data.len()].copy_from_slice(&w.data);
        &copy[at..at + w.data.len()]
    };
    let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
        ggml_type(w.dtype),
        data,
        vec![w.rows, w.cols],
        &candle_core::Device::Cpu,
    )
    .map_err(bad)?;
    q.dequantize(&candle_core::Device::Cpu)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(bad)
}

impl GgufFile {
    /// Opens and memory-maps `path` and parses its header.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let mut f = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LoadError::MissingFile(path.to_path_buf()),
            _ => LoadError::io(path, e),
        })?;
        // SAFETY: the map is read-only; sglrs never writes model files, and a model file being
        // truncated underneath a running server is outside what any loader can defend against.
        let mmap = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| LoadError::io(path, e))?;
        let bad = |message: String| LoadError::Gguf {
            path: path.to_path_buf(),
            message,
        };
        // candle's parser divides by the alignment: refuse a 0 before it runs.
        super::gguf_header::check(&mmap).map_err(|m| bad(m.to_string()))?;
        let content = Content::read(&mut f).map_err(|e| bad(e.to_string()))?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            data: Bytes::from_owner(mmap),
            content,
        })
    }

    /// The file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All metadata key/value pairs.
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// The tensor directory (shapes outermost first).
    pub fn tensor_infos(&self) -> &HashMap<String, TensorInfo> {
        &self.content.tensor_infos
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// The metadata alone, for readers that need no tensors (the tokenizer).
    pub fn meta(&self) -> GgufMeta<'_> {
        GgufMeta::new(&self.content.metadata)
    }

    /// A string metadata value, if present and a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.meta().get_str(key)
    }

    /// An integer metadata value (any integer width), if present.
    pub fn get_uint(&self, key: &str) -> Result<Option<u64>, LoadError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        value_as_u64(v)
            .map(Some)
            .ok_or_else(|| LoadError::BadConfig {
                key: key.to_string(),
                reason: format!("expected an unsigned integer, found {v:?}"),
            })
    }

    /// A float metadata value (any numeric type), if present.
    pub fn get_float(&self, key: &str) -> Result<Option<f64>, LoadError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        value_as_f64(v)
            .map(Some)
            .ok_or_else(|| LoadError::BadConfig {
                key: key.to_string(),
                reason: format!("expected a number, found {v:?}"),
            })
    }

    /// A boolean metadata value, if present.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.meta().get_bool(key)
    }

    /// An array metadata value, if present.
    pub fn get_array(&self, key: &str) -> Option<&[Value]> {
        self.meta().get_array(key)
    }

    fn require_uint(&self, key: &str) -> Result<usize, LoadError> {
        self.get_uint(key)?
            .map(|v| v as usize)
            .ok_or_else(|| LoadError::MissingKey(key.to_string()))
    }

    /// The `general.architecture` string.
    pub fn architecture(&self) -> Result<&str, LoadError> {
        self.get_str("general.architecture")
            .ok_or_else(|| LoadError::MissingKey("general.architecture".into()))
    }

    /// The model configuration from the metadata (and, where the metadata is silent, the
    /// tensor shapes).
    pub fn config(&self) -> Result<ModelConfig, LoadError> {
        let arch_name = self.architecture()?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            other => return Err(LoadError::UnsupportedArch(other.to_string())),
        };
        let k = |s: &str| format!("{arch_name}.{s}");
        let num_layers = self.require_uint(&k("block_count"))?;
        let hidden_size = self.require_uint(&k("embedding_length"))?;
        let num_heads = self.require_uint(&k("attention.head_count"))?;
        let num_kv_heads = self
            .get_uint(&k("attention.head_count_kv"))?
            .map(|v| v as usize)
            .unwrap_or(num_heads);
        let intermediate_size = self.require_uint(&k("feed_forward_length"))?;
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(LoadError::BadConfig {
                key: k("attention.head_count_kv"),
                reason: format!("{num_kv_heads} KV heads for {num_heads} query heads"),
            });
        }
        let head_dim = match self.get_uint(&k("attention.key_length"))? {
            Some(v) => v as usize,
            None => hidden_size / num_heads,
        };
        // Sizes are read from the file: a layer count the tensors cannot hold, or head sizes
        // whose product overflows, are refused here rather than allocated or multiplied.
        let layer_tensors = self.content.tensor_infos.len() / TENSORS_PER_LAYER;
        if num_layers > layer_tensors {
            return Err(LoadError::BadConfig {
                key: k("block_count"),
                reason: format!(
                    "{num_layers} layers, but the file has {} tensors ({TENSORS_PER_LAYER} per layer)",
                    self.content.tensor_infos.len()
                ),
            });
        }
        if num_heads.checked_mul(head_dim).is_none() {
            return Err(LoadError::BadConfig {
                key: k("attention.key_length"),
                reason: format!("{num_heads} heads of {head_dim} dimensions overflow"),
            });
        }
        if let Some(rot) = self.get_uint(&k("rope.dimension_count"))? {
            if rot as usize != head_dim {
                return Err(LoadError::BadConfig {
                    key: k("rope.dimension_count"),
                    reason: format!("partial RoPE ({rot} of {head_dim} dims) is not supported"),
                });
            }
        }
        let embed = self.info("token_embd.weight")?;
        let vocab_size = match self.get_uint(&k("vocab_size"))? {
            Some(v) => v as usize,
            None => embed.shape.dims().first().copied().unwrap_or(0),
        };
        let max_context = self
            .get_uint(&k("context_length"))?
            .map(|v| v as usize)
            .unwrap_or(2048);
        let rope_theta = self.get_float(&k("rope.freq_base"))?.unwrap_or(10_000.0) as f32;
        let rms_norm_eps = self
            .get_float(&k("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5) as f32;
        let rope_scaling = self.rope_scaling(arch_name, rope_theta, head_dim)?;
        let tie_word_embeddings = !self.content.tensor_infos.contains_key("output.weight");
        Ok(ModelConfig {
            arch,
            num_layers,
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            vocab_size,
            max_context,
            rope_theta,
            rope_scaling,
            rms_norm_eps,
            tie_word_embeddings,
        })
    }

    fn rope_scaling(
        &self,
        arch: &str,
        theta: f32,
        head_dim: usize,
    ) -> Result<RopeScaling, LoadError> {
        let key = format!("{arch}.rope.scaling.type");
        let factor = self
            .get_float(&format!("{arch}.rope.scaling.factor"))?
            .unwrap_or(1.0) as f32;
        let scaling = match self.get_str(&key) {
            None | Some("none") => RopeScaling::None,
            Some("linear") if factor != 1.0 => RopeScaling::Linear { factor },
            Some("linear") => RopeScaling::None,
            Some(other) => {
                return Err(LoadError::BadConfig {
                    key,
                    reason: format!("RoPE scaling `{other}` is not supported"),
                })
            }
        };
        if self.content.tensor_infos.contains_key("rope_freqs.weight") {
            // Llama 3 stores its frequency-dependent scaling as per-frequency factors.
            let original = self
                .get_uint(&format!("{arch}.rope.scaling.original_context_length"))?
                .map(|v| v as usize)
                .unwrap_or(8192);
            let factors = self.f32_vec("rope_freqs.weight")?;
            return llama3_from_factors(&factors, theta, head_dim, original);
        }
        Ok(scaling)
    }

    fn info(&self, name: &str) -> Result<&TensorInfo, LoadError> {
        self.content
            .tensor_infos
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor(name.to_string()))
    }

    /// The bytes of tensor `name` (a zero-copy slice of the map) and its shape, outermost first.
    fn raw(&self, name: &str) -> Result<(GgmlDType, Vec<usize>, Bytes), LoadError> {
        let info = self.info(name)?;
        let dims = info.shape.dims().to_vec();
        let bs = info.ggml_dtype.block_size();
        let bad = |reason: String| LoadError::BadTensorData {
            tensor: name.to_string(),
            reason,
        };
        let elems = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {dims:?} overflows")))?;
        if !elems.is_multiple_of(bs) || dims.last().is_some_and(|c| c % bs != 0) {
            return Err(bad(format!(
                "shape {dims:?} is not a whole number of {bs}-element blocks per row"
            )));
        }
        let len = (elems / bs)
            .checked_mul(info.ggml_dtype.type_size())
            .ok_or_else(|| bad(format!("shape {dims:?} overflows")))?;
        let start = self
            .content
            .tensor_data_offset
            .checked_add(info.offset)
            .ok_or_else(|| bad("offset overflows".into()))? as usize;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| {
                bad(format!(
                    "{len} bytes at offset {start} run past the end of the file ({} bytes)",
                    self.data.len()
                ))
            })?;
        Ok((info.ggml_dtype, dims, self.data.slice(start..end)))
    }

    /// Tensor `name` as a stored [`Weight`] (a zero-copy slice of the map). One-dimensional
    /// tensors are one row.
    pub fn weight(&self, name: &str) -> Result<Weight, LoadError> {
        let (dtype, dims, data) = self.raw(name)?;
        let wt = weight_type(dtype).ok_or_else(|| LoadError::UnsupportedWeightType {
            tensor: name.to_string(),
            dtype: format!("{dtype:?}"),
        })?;
        let (rows, cols) = match dims.as_slice() {
            [c] => (1, *c),
            [r, c] => (*r, *c),
            _ => {
                return Err(LoadError::BadTensorData {
                    tensor: name.to_string(),
                    reason: format!("expected a matrix, found shape {dims:?}"),
                })
            }
        };
        Ok(Weight {
            dtype: wt,
            rows,
            cols,
            data,
        })
    }

    /// A weight, checked to be `[rows, cols]`.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        let w = self.weight(name)?;
        if w.rows != rows || w.cols != cols {
            return Err(LoadError::BadShape {
                tensor: name.to_string(),
                expected: vec![rows, cols],
                got: vec![w.rows, w.cols],
            });
        }
        Ok(w)
    }

    /// Tensor `name` (any supported type, any shape) dequantized to f32, row-major.
    pub fn f32_vec(&self, name: &str) -> Result<Vec<f32>, LoadError> {
        let w = self.weight(name)?;
        match w.dtype {
            WeightType::F32 => Ok(w
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()),
            _ => dequantize(&w),
        }
    }

    /// A vector of `len` f32s.
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
        if self.content.tensor_infos.contains_key(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    /// All weights the configuration calls for.
    pub fn weights(
        &self,
        cfg: &ModelConfig,
        show: ShowProgress,
    ) -> Result<ModelWeights, LoadError> {
        let h = cfg.hidden_size;
        let q_dim = cfg.num_heads * cfg.head_dim;
        let kv_dim = cfg.num_kv_heads * cfg.head_dim;
        let ffn = cfg.intermediate_size;
        // Qwen2 GGUFs keep HF's rotate-half order: reorder into adjacent pairs.
        let reorder = cfg.arch == Arch::Qwen2;
        let progress = Progress::new(show, cfg.num_layers + 2, "loading GGUF");
        let embed = self.matrix("token_embd.weight", cfg.vocab_size, h)?;
        progress.inc();
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let mut wq = self.matrix(&n("attn_q.weight"), q_dim, h)?;
            let mut wk = self.matrix(&n("attn_k.weight"), kv_dim, h)?;
            let mut bq = self.optional_vector(&n("attn_q.bias"), q_dim)?;
            let mut bk = self.optional_vector(&n("attn_k.bias"), kv_dim)?;
            if reorder {
                wq = permute::weight_hf_to_gguf(&wq, cfg.num_heads, cfg.head_dim);
                wk = permute::weight_hf_to_gguf(&wk, cfg.num_kv_heads, cfg.head_dim);
                bq = bq.map(|b| permute::hf_to_gguf(&b, cfg.num_heads, cfg.head_dim, 1));
                bk = bk.map(|b| permute::hf_to_gguf(&b, cfg.num_kv_heads, cfg.head_dim, 1));
            }
            layers.push(LayerWeights {
                attn_norm: self.vector(&n("attn_norm.weight"), h)?,
                wq,
                wk,
                wv: self.matrix(&n("attn_v.weight"), kv_dim, h)?,
                wo: self.matrix(&n("attn_output.weight"), h, q_dim)?,
                bq,
                bk,
                bv: self.optional_vector(&n("attn_v.bias"), kv_dim)?,
                ffn_norm: self.vector(&n("ffn_norm.weight"), h)?,
                w_gate: self.matrix(&n("ffn_gate.weight"), ffn, h)?,
                w_up: self.matrix(&n("ffn_up.weight"), ffn, h)?,
                w_down: self.matrix(&n("ffn_down.weight"), h, ffn)?,
            });
            progress.inc();
        }
        let final_norm = self.vector("output_norm.weight", h)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(self.matrix("output.weight", cfg.vocab_size, h)?)
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
}

/// Recovers Llama 3 RoPE scaling parameters from GGUF's per-frequency factors, checking that
/// the standard formula with them reproduces every factor.
fn llama3_from_factors(
    factors: &[f32],
    theta: f32,
    head_dim: usize,
    original: usize,
) -> Result<RopeScaling, LoadError> {
    let bad = |reason: String| LoadError::BadConfig {
        key: "rope_freqs.weight".into(),
        reason,
    };
    if factors.len() != head_dim / 2 {
        return Err(bad(format!(
            "{} factors for head dimension {head_dim}",
            factors.len()
        )));
    }
    let factor = factors.iter().copied().fold(1.0f32, f32::max);
    // Llama 3.1/3.2 all ship low 1, high 4; verify rather than assume.
    let (low, high) = (1.0f32, 4.0f32);
    let scaling = RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_max_position_embeddings: original,
    };
    let low_wavelen = original as f32 / low;
    let high_wavelen = original as f32 / high;
    for (i, &got) in factors.iter().enumerate() {
        let freq = 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32);
        let wavelen = 2.0 * std::f32::consts::PI / freq;
        let want = if wavelen < high_wavelen {
            1.0
        } else if wavelen > low_wavelen {
            factor
        } else {
            let smooth = (original as f32 / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        };
        if (want - got).abs() > 1e-3 * want.max(1.0) {
            return Err(bad(format!(
                "frequency factors do not follow Llama 3 scaling (index {i}: {got} vs {want})"
            )));
        }
    }
    Ok(scaling)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file: u32 metadata and F32 tensor infos (dimensions innermost first), no
    /// tensor data.
    fn file(meta: &[(&str, &str)], uints: &[(&str, u32)], tensors: &[(&str, &[u64])]) -> Vec<u8> {
        fn s(b: &mut Vec<u8>, v: &str) {
            b.extend((v.len() as u64).to_le_bytes());
            b.extend(v.as_bytes());
        }
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend(((meta.len() + uints.len()) as u64).to_le_bytes());
        for (k, v) in meta {
            s(&mut b, k);
            b.extend(8u32.to_le_bytes());
            s(&mut b, v);
        }
        for (k, v) in uints {
            s(&mut b, k);
            b.extend(4u32.to_le_bytes());
            b.extend(v.to_le_bytes());
        }
        for (name, dims) in tensors {
            s(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(0u32.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        b
    }

    fn open(bytes: &[u8]) -> GgufFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), bytes).unwrap();
        GgufFile::open(f.path()).unwrap()
    }

    #[test]
    fn dequantize_takes_unaligned_weights_and_refuses_short_ones() {
        let vals = [1.0f32, -2.0, 0.5, 3.0];
        let mut raw = vec![0u8];
        vals.iter().for_each(|v| raw.extend(v.to_le_bytes()));
        let raw = Bytes::from(raw);
        // At offset 1 the f32s are misaligned, as a tensor at an odd offset of a file is.
        let w = |data: Bytes| Weight {
            dtype: WeightType::F32,
            rows: 1,
            cols: 4,
            data,
        };
        assert_eq!(dequantize(&w(raw.slice(1..))).unwrap(), vals);
        assert!(matches!(
            dequantize(&w(raw.slice(1..13))),
            Err(LoadError::BadTensorData { .. })
        ));
    }

    #[test]
    fn sizes_from_the_file_are_checked_before_use() {
        let arch = [("general.architecture", "llama")];
        let uints = |layers: u32| {
            [
                ("llama.block_count", layers),
                ("llama.embedding_length", 8),
                ("llama.attention.head_count", 2),
                ("llama.feed_forward_length", 16),
            ]
        };
        let embd: &[(&str, &[u64])] = &[("token_embd.weight", &[8, 5])];
        // A layer count no file could hold was allocated up front (an abort).
        let f = open(&file(&arch, &uints(u32::MAX), embd));
        assert!(
            matches!(f.config(), Err(LoadError::BadConfig { key, .. }) if key == "llama.block_count")
        );
        assert!(open(&file(&arch, &uints(0), embd)).config().is_ok());
        // A shape whose element count overflows.
        let f = open(&file(
            &arch,
            &uints(0),
            &[("token_embd.weight", &[1 << 40, 1 << 40])],
        ));
        assert!(matches!(
            f.weight("token_embd.weight"),
            Err(LoadError::BadTensorData { .. })
        ));
    }
}
