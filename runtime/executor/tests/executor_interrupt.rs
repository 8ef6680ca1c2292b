//! An interrupted pass stops between layers, and running its batch again gives exactly the
//! logits of a pass that was never interrupted (the K and V it half wrote are rewritten).

use sglrs_executor::{
    Batch, CpuExecutor, ExecConfig, ExecError, Executor, KvCapacity, LogitsWanted, SeqChunk,
};
use sglrs_model::default_model_path;
use sglrs_model::gguf::load_gguf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[allow(dead_code)] // the helpers other tests share
mod common;
use common::tokens;

fn exec(pages: usize) -> CpuExecutor {
    let (c, w, _) = load_gguf(&default_model_path()).expect("default model");
    let cfg = ExecConfig {
        page_size: 16,
        kv: KvCapacity::Pages(pages),
        threads: 2,
        ..ExecConfig::default()
    };
    CpuExecutor::new(&c, &w, &cfg).unwrap()
}

#[test]
fn an_interrupted_pass_stops_and_its_rerun_equals_an_uninterrupted_one() {
    let toks = tokens(384, 3);
    let pages: Vec<u32> = (0..toks.len().div_ceil(16) as u32).collect();
    let batch = Batch {
        seqs: vec![SeqChunk {
            tokens: &toks,
            start_pos: 0,
            pages: &pages,
            logits: LogitsWanted::Last,
        }],
    };
    let mut reference = exec(pages.len());
    let t = Instant::now();
    let want = reference.forward(&batch).unwrap();
    let full = t.elapsed();

    let mut ex = exec(pages.len());
    let flag = Arc::new(AtomicBool::new(true));
    ex.set_interrupt(flag.clone());
    // Raised before the pass: it stops at once.
    assert!(matches!(ex.forward(&batch), Err(ExecError::Interrupted)));
    // Raised in the middle of the pass (bounded tries: the timing is the machine's).
    let mut stopped_midway = false;
    for _ in 0..10 {
        flag.store(false, Ordering::Release);
        let f = flag.clone();
        let raise = std::thread::spawn(move || {
            std::thread::sleep(full / 3);
            f.store(true, Ordering::Release);
        });
        let t = Instant::now();
        let r = ex.forward(&batch);
        let took = t.elapsed();
        raise.join().unwrap();
        if matches!(r, Err(ExecError::Interrupted)) && took > Duration::ZERO {
            stopped_midway = true;
            assert!(took < full, "stopped after {took:?} of a {full:?} pass");
            break;
        }
    }
    assert!(stopped_midway, "no pass was interrupted midway");
    flag.store(false, Ordering::Release);
    let got = ex.forward(&batch).unwrap();
    assert_eq!(got.rows, want.rows);
    assert!(
        got.data
            .iter()
            .zip(&want.data)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "logits after an interrupted pass differ from an uninterrupted pass's"
    );
}
