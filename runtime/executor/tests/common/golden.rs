//! The golden file (llama.cpp's greedy output and top-5 logprobs for the default model) and
//! the teacher-forced comparison against it, shared by the golden tests.

use sglrs_executor::{
    Batch, CpuExecutor, ExecConfig, Executor, KvCapacity, LogitsWanted, SeqChunk,
};
use sglrs_model::default_model_path;
use sglrs_model::gguf::load_gguf;
use std::path::PathBuf;

pub fn golden_path() -> PathBuf {
    std::env::var_os("SGLRS_GOLDEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/golden/smollm2-q4_1-greedy.json")
        })
}

/// The golden file's text; a missing file names the path and how to point elsewhere.
pub fn read_golden() -> String {
    let path = golden_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "golden file {}: {e} (the checkout expects ../shared beside it; set SGLRS_GOLDEN to the file's path)",
            path.display()
        )
    })
}

fn log_softmax_at(row: &[f32], id: usize) -> f64 {
    let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&v| (v as f64 - mx).exp()).sum();
    row[id] as f64 - mx - z.ln()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

/// Runs the teacher-forced comparison with one executor; returns (median, p99, mismatches).
pub fn teacher_forced(
    exec: &mut CpuExecutor,
    golden: &serde_json::Value,
) -> (f64, f64, usize, usize) {
    let ps = exec.kv_layout().page_size;
    let mut diffs = Vec::new();
    let mut clear_mismatch = 0;
    let mut flips = 0;
    for case in golden["cases"].as_array().unwrap() {
        let ids = |k: &str| -> Vec<u32> {
            case[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        };
        let prompt = ids("prompt_ids");
        let greedy = ids("greedy_ids");
        let top5 = case["top5_logprobs"].as_array().unwrap();
        let mut tokens = prompt.clone();
        tokens.extend(&greedy);
        let pages: Vec<u32> = (0..tokens.len().div_ceil(ps) as u32).collect();
        let batch = Batch {
            seqs: vec![SeqChunk {
                tokens: &tokens,
                start_pos: 0,
                pages: &pages,
                logits: LogitsWanted::All,
            }],
        };
        let logits = exec.forward(&batch).unwrap();
        for (step, ref_top) in top5.iter().enumerate() {
            let row = logits.row(prompt.len() - 1 + step);
            let top: Vec<(usize, f64)> = ref_top
                .as_array()
                .unwrap()
                .iter()
                .map(|e| (e[0].as_u64().unwrap() as usize, e[1].as_f64().unwrap()))
                .collect();
            let (id1, lp1) = top[0];
            let gap = lp1 - top[1].1;
            let ours = argmax(row);
            if ours != id1 {
                flips += 1;
                if gap >= 0.5 {
                    clear_mismatch += 1;
                    eprintln!(
                        "step {step} of {:?}: ours {ours}, llama.cpp {id1} (gap {gap:.3})",
                        case["prompt"].as_str().map(|s| &s[..s.len().min(40)])
                    );
                }
            }
            diffs.push((log_softmax_at(row, id1) - lp1).abs());
        }
    }
    let n = diffs.len();
    diffs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (med, p99) = (percentile(&diffs, 0.5), percentile(&diffs, 0.99));
    eprintln!(
        "teacher-forced over {n} steps: |Δlogprob| median {med:.4}, p99 {p99:.4}, max {:.4}; argmax differs at {flips} steps, {clear_mismatch} of them with a gap ≥ 0.5",
        diffs[n - 1]
    );
    (med, p99, clear_mismatch, n)
}

/// An executor over the default model with room for every golden case (64 pages).
pub fn golden_executor() -> CpuExecutor {
    let (config, weights, _) =
        load_gguf(&default_model_path()).expect("default model (run scripts/fetch-model.sh)");
    let cfg = ExecConfig {
        kv: KvCapacity::Pages(64),
        ..ExecConfig::default()
    };
    CpuExecutor::new(&config, &weights, &cfg).unwrap()
}
