//! The opt-in AMX-BF16 prefill attention (`SGLRS_AMX_ATTENTION=1`) through the whole
//! executor, where the CPU has the tiles: prefills run on them (their last bits differ from
//! the f32 kernel's decode step) and still meet the golden bounds the f32 kernel meets. A
//! test binary of its own with one test: the switch is read once per process.

#[path = "common/golden.rs"]
mod golden;

use golden::{golden_executor, read_golden, teacher_forced};
use sglrs_executor::kernels::attention::amx;
use sglrs_executor::{Batch, CpuExecutor, Executor, LogitsWanted, SeqChunk};

#[test]
fn amx_prefill_attention_meets_the_golden_bounds() {
    if !amx::available() {
        eprintln!("skipped: this CPU has no AMX-BF16 tiles (or Linux did not grant them)");
        return;
    }
    // Before the first forward pass, which reads it.
    std::env::set_var("SGLRS_AMX_ATTENTION", "1");
    assert!(amx::wanted());
    let mut exec = golden_executor();
    let golden: serde_json::Value = serde_json::from_str(&read_golden()).unwrap();
    let (med, p99, clear, n) = teacher_forced(&mut exec, &golden);
    assert_eq!(n, 415, "the golden file has 415 steps");
    assert_eq!(clear, 0, "argmax differs from llama.cpp at a clear margin");
    assert!(med <= 0.05, "median |Δlogprob| {med}");
    assert!(p99 <= 0.3, "p99 |Δlogprob| {p99}");

    // The tiles are in use: a 100-token prefill's last row against the same token as a
    // decode step (one row per head, the f32 kernel) over the same cached pages.
    let ps = exec.kv_layout().page_size;
    let toks: Vec<u32> = (0..100u32).map(|i| 100 + i * 37 % 5000).collect();
    let pages: Vec<u32> = (0..toks.len().div_ceil(ps) as u32).collect();
    let run = |exec: &mut CpuExecutor, tokens: &[u32], start_pos: usize| {
        exec.forward(&Batch {
            seqs: vec![SeqChunk {
                tokens,
                start_pos,
                pages: &pages,
                logits: LogitsWanted::All,
            }],
        })
        .unwrap()
    };
    let whole = run(&mut exec, &toks, 0);
    let last = whole.row(toks.len() - 1).to_vec();
    run(&mut exec, &toks[..toks.len() - 1], 0);
    let step = run(&mut exec, &toks[toks.len() - 1..], toks.len() - 1);
    let d = last
        .iter()
        .zip(step.row(0))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let top = last.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    eprintln!("prefilled vs decoded last row: max |Δ| {d:e} (largest logit {top})");
    assert!(d > 0.0, "the prefill did not run on the tiles");
    assert!(d < 0.05 * top, "{d} against {top}");
}
