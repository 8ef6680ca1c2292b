//! GGUF loading: the default model's configuration and weights, and clear errors on small
//! synthetic GGUF files written with candle's GGUF writer.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sglrs_model::{gguf, Arch, LoadError, LoadOptions, RopeScaling, WeightType};

fn model_path() -> PathBuf {
    sglrs_model::default_model_path()
}

#[test]
fn default_model_config_and_weights() {
    let m = sglrs_model::load(&model_path(), &LoadOptions::default()).expect("load default model");
    let c = &m.config;
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!(c.num_layers, 30);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.num_heads, 9);
    assert_eq!(c.num_kv_heads, 3);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.max_context, 8192);
    assert_eq!(c.rope_theta, 100_000.0);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!((c.rms_norm_eps - 1e-5).abs() < 1e-9);
    assert!(c.tie_word_embeddings);

    let w = &m.weights;
    assert_eq!(w.embed.dtype, WeightType::Q8_0);
    assert_eq!((w.embed.rows, w.embed.cols), (49152, 576));
    assert_eq!(w.embed.data.len(), 49152 * 576 / 32 * 34);
    assert!(w.lm_head.is_none());
    assert_eq!(w.layers.len(), 30);
    assert_eq!(w.final_norm.len(), 576);
    for l in &w.layers {
        assert_eq!(l.wq.dtype, WeightType::Q4_1);
        assert_eq!((l.wq.rows, l.wq.cols), (576, 576));
        assert_eq!((l.wk.rows, l.wk.cols), (192, 576));
        assert_eq!((l.wv.rows, l.wv.cols), (192, 576));
        assert_eq!((l.wo.rows, l.wo.cols), (576, 576));
        assert_eq!((l.w_gate.rows, l.w_gate.cols), (1536, 576));
        assert_eq!((l.w_up.rows, l.w_up.cols), (1536, 576));
        assert_eq!((l.w_down.rows, l.w_down.cols), (576, 1536));
        assert_eq!(l.wq.data.len(), 576 * 576 / 32 * 20);
        assert!(l.bq.is_none() && l.bk.is_none() && l.bv.is_none());
        assert_eq!(l.attn_norm.len(), 576);
        assert!(l.attn_norm.iter().all(|x| x.is_finite()));
        assert!(l.ffn_norm.iter().any(|&x| x != 0.0));
    }

    // Dequantized embedding rows are finite and not all zero; the data is a view of the map
    // (the same bytes candle reads from the file).
    let f = gguf::GgufFile::open(&model_path()).unwrap();
    let e = gguf::dequantize(&w.embed).unwrap();
    assert_eq!(e.len(), 49152 * 576);
    assert!(e.iter().all(|x| x.is_finite()));
    let mut file = std::fs::File::open(model_path()).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let q = content
        .tensor(&mut file, "blk.3.attn_k.weight", &Device::Cpu)
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(gguf::dequantize(&w.layers[3].wk).unwrap(), q);
    assert_eq!(f.get_str("tokenizer.ggml.model"), Some("gpt2"));
}

/// A tiny llama GGUF: 1 layer, hidden 32, 2 heads of 16, 1 KV head, ffn 64, vocab 8.
fn write_tiny(dir: &Path, arch: &str, matrix_type: GgmlDType, skip: Option<&str>) -> PathBuf {
    let dev = Device::Cpu;
    let mk = |rows: usize, cols: usize, dt: GgmlDType| {
        let t = Tensor::arange(0f32, (rows * cols) as f32, &dev)
            .unwrap()
            .affine(1e-3, -0.1)
            .unwrap()
            .reshape((rows, cols))
            .unwrap();
        QTensor::quantize(&t, dt).unwrap()
    };
    let vec1 = |n: usize| {
        QTensor::quantize(
            &Tensor::ones(n, candle_core::DType::F32, &dev).unwrap(),
            GgmlDType::F32,
        )
        .unwrap()
    };
    let tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), mk(8, 32, GgmlDType::F32)),
        ("output_norm.weight".into(), vec1(32)),
        ("blk.0.attn_norm.weight".into(), vec1(32)),
        ("blk.0.ffn_norm.weight".into(), vec1(32)),
        ("blk.0.attn_q.weight".into(), mk(32, 32, matrix_type)),
        ("blk.0.attn_k.weight".into(), mk(16, 32, matrix_type)),
        ("blk.0.attn_v.weight".into(), mk(16, 32, matrix_type)),
        ("blk.0.attn_output.weight".into(), mk(32, 32, matrix_type)),
        ("blk.0.ffn_gate.weight".into(), mk(64, 32, matrix_type)),
        ("blk.0.ffn_up.weight".into(), mk(64, 32, matrix_type)),
        ("blk.0.ffn_down.weight".into(), mk(32, 64, matrix_type)),
    ];
    let tensors: Vec<(String, QTensor)> = tensors
        .into_iter()
        .filter(|(n, _)| Some(n.as_str()) != skip)
        .collect();
    let meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), Value::U32(1)),
        (format!("{arch}.embedding_length"), Value::U32(32)),
        (format!("{arch}.attention.head_count"), Value::U32(2)),
        (format!("{arch}.attention.head_count_kv"), Value::U32(1)),
        (format!("{arch}.feed_forward_length"), Value::U32(64)),
        (format!("{arch}.context_length"), Value::U32(128)),
        (format!("{arch}.rope.freq_base"), Value::F32(10000.0)),
    ];
    let path = dir.join(format!("tiny-{arch}-{matrix_type:?}.gguf"));
    let mut f = std::fs::File::create(&path).unwrap();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta_refs, &t_refs).unwrap();
    path
}

#[test]
fn tiny_gguf_loads_every_supported_type() {
    let dir = tempfile::tempdir().unwrap();
    for (dt, wt) in [
        (GgmlDType::F32, WeightType::F32),
        (GgmlDType::F16, WeightType::F16),
        (GgmlDType::BF16, WeightType::Bf16),
        (GgmlDType::Q8_0, WeightType::Q8_0),
        (GgmlDType::Q4_0, WeightType::Q4_0),
        (GgmlDType::Q4_1, WeightType::Q4_1),
    ] {
        let p = write_tiny(dir.path(), "llama", dt, None);
        let (cfg, w, _) = gguf::load_gguf(&p).unwrap();
        assert_eq!(cfg.head_dim, 16);
        assert_eq!(cfg.vocab_size, 8);
        assert_eq!(w.layers[0].wq.dtype, wt);
        assert_eq!((w.layers[0].w_down.rows, w.layers[0].w_down.cols), (32, 64));
        let deq = gguf::dequantize(&w.layers[0].wq).unwrap();
        // Row 1 starts at element 32 of the ramp 1e-3 * i - 0.1.
        assert!(
            (deq[32] - (32.0 * 1e-3 - 0.1)).abs() < 0.02,
            "{dt:?}: {}",
            deq[32]
        );
    }
}

#[test]
fn unsupported_weight_type_names_tensor_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_tiny(dir.path(), "llama", GgmlDType::Q5_0, None);
    let err = gguf::load_gguf(&p).unwrap_err();
    assert!(
        matches!(err, LoadError::UnsupportedWeightType { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("blk.0.attn_q.weight") && msg.contains("Q5_0"),
        "{msg}"
    );
}

#[test]
fn unsupported_arch_and_missing_tensor_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_tiny(dir.path(), "gpt2", GgmlDType::F32, None);
    let err = gguf::load_gguf(&p).unwrap_err();
    assert!(err.to_string().contains("`gpt2`"), "{err}");

    let p = write_tiny(
        dir.path(),
        "llama",
        GgmlDType::F16,
        Some("blk.0.ffn_up.weight"),
    );
    let err = gguf::load_gguf(&p).unwrap_err();
    assert!(
        matches!(&err, LoadError::MissingTensor(t) if t == "blk.0.ffn_up.weight"),
        "{err}"
    );

    let err = sglrs_model::load(
        Path::new("/nonexistent/model.gguf"),
        &LoadOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");

    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    let err = sglrs_model::load(&junk, &LoadOptions::default()).unwrap_err();
    assert!(matches!(err, LoadError::Gguf { .. }), "{err}");
}

#[test]
fn k_quant_weights_are_sliced_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Device::Cpu;
    let t = Tensor::arange(0f32, 4.0 * 512.0, &dev)
        .unwrap()
        .affine(1e-3, -1.0)
        .unwrap()
        .reshape((4, 512))
        .unwrap();
    let q4k = QTensor::quantize(&t, GgmlDType::Q4K).unwrap();
    let q6k = QTensor::quantize(&t, GgmlDType::Q6K).unwrap();
    let path = dir.path().join("k.gguf");
    let mut f = std::fs::File::create(&path).unwrap();
    let arch = Value::String("llama".into());
    gguf_file::write(
        &mut f,
        &[("general.architecture", &arch)],
        &[("a.weight", &q4k), ("b.weight", &q6k)],
    )
    .unwrap();
    drop(f);
    let g = gguf::GgufFile::open(&path).unwrap();
    for (name, q, wt, block) in [
        ("a.weight", &q4k, WeightType::Q4K, 144),
        ("b.weight", &q6k, WeightType::Q6K, 210),
    ] {
        let w = g.weight(name).unwrap();
        assert_eq!((w.dtype, w.rows, w.cols), (wt, 4, 512));
        assert_eq!(w.data.len(), 4 * 2 * block);
        let want = q
            .dequantize(&dev)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(gguf::dequantize(&w).unwrap(), want, "{name}");
    }
}
