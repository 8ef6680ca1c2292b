//! The HF folder loader, on a folder built from the default GGUF inside the test: same
//! configuration, same tokenization, weights that round-trip (dequantized GGUF == HF-loaded
//! after the Q/K permutation), shards, and clear errors.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sglrs_model::chat::{Message, RenderOptions};
use sglrs_model::hf_write::{write_hf_folder_from_gguf, HfDtype, HfWriteOptions};
use sglrs_model::{gguf, LoadError, LoadOptions, LoadedModel, WeightType};

fn golden() -> Value {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let p = std::env::var_os("SGLRS_GOLDEN")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            [here.join("../../../shared"), PathBuf::from("/work/shared")]
                .into_iter()
                .map(|b| b.join("golden/smollm2-q4_1-greedy.json")),
        )
        .find(|p| p.exists())
        .expect("golden file (set SGLRS_GOLDEN)");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn load(p: &Path) -> LoadedModel {
    sglrs_model::load(p, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn f32s(w: &sglrs_model::Weight) -> Vec<f32> {
    match w.dtype {
        WeightType::F32 => w
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        WeightType::Bf16 => w
            .data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => gguf::dequantize(w).unwrap(),
    }
}

/// Reads one tensor of a written folder straight from its safetensors file, in HF order.
fn raw_hf_tensor(dir: &Path, name: &str) -> Vec<f32> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn hf_folder_from_gguf_round_trips() {
    let gguf_path = sglrs_model::default_model_path();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("f32");
    write_hf_folder_from_gguf(&gguf_path, &dir, &HfWriteOptions::default()).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    let g = load(&gguf_path);
    let h = load(&dir);
    assert_eq!(g.config, h.config);

    // Tokenization is identical on every golden text and prompt, plain and special.
    let gold = golden();
    let mut texts: Vec<String> = gold["tokenization"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    texts.extend(
        gold["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["prompt"].as_str().unwrap().to_string()),
    );
    for t in &texts {
        for special in [false, true] {
            assert_eq!(
                g.tokenizer.encode(t, special).unwrap(),
                h.tokenizer.encode(t, special).unwrap(),
                "{t:?} special={special}"
            );
        }
    }
    assert_eq!(g.tokenizer.bos_id(), h.tokenizer.bos_id());
    assert_eq!(g.tokenizer.eos_id(), h.tokenizer.eos_id());
    assert_eq!(g.tokenizer.add_bos(), h.tokenizer.add_bos());
    assert_eq!(g.tokenizer.vocab_size(), h.tokenizer.vocab_size());
    for id in (0..49152u32).step_by(97).chain(0..20) {
        assert_eq!(
            g.tokenizer.token_bytes(id),
            h.tokenizer.token_bytes(id),
            "id {id}"
        );
    }
    let msgs = [Message::new("user", "What is 2+2?")];
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    assert_eq!(
        g.chat_template
            .as_ref()
            .unwrap()
            .render(&msgs, &opts)
            .unwrap(),
        h.chat_template
            .as_ref()
            .unwrap()
            .render(&msgs, &opts)
            .unwrap()
    );

    // Weights: HF-loaded (Q/K permuted back into GGUF order) equal the dequantized GGUF.
    assert_eq!(h.weights.embed.dtype, WeightType::F32);
    assert_eq!(f32s(&g.weights.embed), f32s(&h.weights.embed));
    assert_eq!(g.weights.final_norm, h.weights.final_norm);
    assert!(h.weights.lm_head.is_none());
    for (i, (a, b)) in g.weights.layers.iter().zip(&h.weights.layers).enumerate() {
        assert_eq!(f32s(&a.wq), f32s(&b.wq), "layer {i} wq");
        assert_eq!(f32s(&a.wk), f32s(&b.wk), "layer {i} wk");
        assert_eq!(f32s(&a.wv), f32s(&b.wv), "layer {i} wv");
        assert_eq!(f32s(&a.wo), f32s(&b.wo), "layer {i} wo");
        assert_eq!(f32s(&a.w_gate), f32s(&b.w_gate), "layer {i} gate");
        assert_eq!(f32s(&a.w_up), f32s(&b.w_up), "layer {i} up");
        assert_eq!(f32s(&a.w_down), f32s(&b.w_down), "layer {i} down");
        assert_eq!(a.attn_norm, b.attn_norm);
        assert_eq!(a.ffn_norm, b.ffn_norm);
    }

    // The file itself is in HF rotate-half order: HF row i of a head is GGUF row 2i, HF row
    // i + d/2 is GGUF row 2i + 1 (llama.cpp's converter permutation, written out here
    // independently of the loader's permute module).
    let (cols, d) = (576, 64);
    for (name, w) in [
        (
            "model.layers.7.self_attn.q_proj.weight",
            &g.weights.layers[7].wq,
        ),
        (
            "model.layers.7.self_attn.k_proj.weight",
            &g.weights.layers[7].wk,
        ),
    ] {
        let hf = raw_hf_tensor(&dir, name);
        let gg = f32s(w);
        let heads = w.rows / d;
        for h_ in 0..heads {
            for i in 0..d / 2 {
                for (hf_row, gg_row) in [(i, 2 * i), (i + d / 2, 2 * i + 1)] {
                    let a = &hf[(h_ * d + hf_row) * cols..(h_ * d + hf_row + 1) * cols];
                    let b = &gg[(h_ * d + gg_row) * cols..(h_ * d + gg_row + 1) * cols];
                    assert_eq!(a, b, "{name} head {h_} row {hf_row}");
                }
            }
        }
    }
}

#[test]
fn sharded_bf16_folder_loads() {
    let gguf_path = sglrs_model::default_model_path();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bf16");
    let opts = HfWriteOptions {
        dtype: HfDtype::Bf16,
        shard_bytes: Some(64 << 20),
        ..Default::default()
    };
    write_hf_folder_from_gguf(&gguf_path, &dir, &opts).unwrap();
    assert!(dir.join("model.safetensors.index.json").exists());
    assert!(!dir.join("model.safetensors").exists());
    let shards = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".safetensors")
        })
        .count();
    assert!(shards >= 3, "{shards} shards");
    let g = load(&gguf_path);
    let h = load(&dir);
    assert_eq!(g.config, h.config);
    assert_eq!(h.weights.layers[0].wq.dtype, WeightType::Bf16);
    for (a, b) in g.weights.layers.iter().zip(&h.weights.layers) {
        for (x, y) in [(&a.wq, &b.wq), (&a.wk, &b.wk), (&a.w_down, &b.w_down)] {
            let (x, y) = (f32s(x), f32s(y));
            let max_err = x
                .iter()
                .zip(&y)
                .map(|(p, q)| (p - q).abs() / p.abs().max(1e-3))
                .fold(0f32, f32::max);
            assert!(max_err <= 1.0 / 128.0, "bf16 relative error {max_err}");
        }
    }
}

#[test]
fn hf_errors_name_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // No config.json: not a model.
    let err = sglrs_model::load(dir, &LoadOptions::default()).unwrap_err();
    assert!(matches!(err, LoadError::NotAModel(_)), "{err}");

    let cfg = serde_json::json!({
        "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = sglrs_model::load(dir, &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("GPTNeoXForCausalLM"), "{err}");

    let mut cfg = cfg;
    cfg["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = sglrs_model::load(dir, &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(&err, LoadError::MissingFile(p) if p.ends_with("tokenizer.json")),
        "{err}"
    );
}
