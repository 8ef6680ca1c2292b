//! Decode-step timing over a shared 1,024-token prefix (the serving benchmark's shape) with
//! variants alternating step by step in one process, so that both see the same load (the box
//! these were written on is shared): shared-pages attention on and off at batch 2, 4 and 8,
//! two threads. Ignored (a measurement, not a check):
//! `cargo test --release -p sglrs-runtime --test executor_speed -- --ignored --nocapture`.

use sglrs_executor::{
    Batch, CpuExecutor, ExecConfig, Executor, KvCapacity, LogitsWanted, SeqChunk,
};
use sglrs_model::default_model_path;
use sglrs_model::gguf::load_gguf;
use std::time::Instant;

mod common;
use common::{prefill_prefix, shared_prefix_tables, tokens};

/// An executor with `b` sequences whose page tables start with the same `shared / ps` pages
/// (then `per` pages each), the shared prefix already prefilled through the first table.
fn over_shared_prefix(
    threads: usize,
    (ps, shared, b, per): (usize, usize, usize, usize),
) -> (CpuExecutor, Vec<Vec<u32>>) {
    let (c, w, _) = load_gguf(&default_model_path()).expect("default model");
    let cfg = ExecConfig {
        page_size: ps,
        kv: KvCapacity::Pages(shared / ps + b * per),
        threads,
        ..ExecConfig::default()
    };
    let mut ex = CpuExecutor::new(&c, &w, &cfg).unwrap();
    let tables = shared_prefix_tables(shared / ps, b, per);
    let prefix = tokens(shared, 9);
    prefill_prefix(&mut ex, &prefix, &tables[0]);
    (ex, tables)
}

#[test]
#[ignore]
fn decode_steps_over_a_shared_prefix() {
    let (ps, shared, own, steps) = (16usize, 1024usize, 16usize, 40usize);
    let per = (own + steps).div_ceil(ps);
    for b in [2usize, 4, 8] {
        let (mut ex, tables) = over_shared_prefix(2, (ps, shared, b, per));
        let owns: Vec<Vec<u32>> = (0..b).map(|i| tokens(own, 100 + i as u32)).collect();
        ex.forward(&Batch {
            seqs: (0..b)
                .map(|i| SeqChunk {
                    tokens: &owns[i],
                    start_pos: shared,
                    pages: &tables[i],
                    logits: LogitsWanted::None,
                })
                .collect(),
        })
        .unwrap();
        // Each step runs twice at the same position, once per variant (bit-identical results,
        // so the second run rewrites the same K/V): paired times, median ratio.
        let step_toks: Vec<[u32; 1]> = (0..b).map(|i| [500 + i as u32]).collect();
        let step = |ex: &mut CpuExecutor, on: bool, pos: usize| {
            ex.set_shared_attention(on);
            let t = Instant::now();
            ex.forward(&Batch {
                seqs: (0..b)
                    .map(|i| SeqChunk {
                        tokens: &step_toks[i],
                        start_pos: pos,
                        pages: &tables[i],
                        logits: LogitsWanted::Last,
                    })
                    .collect(),
            })
            .unwrap();
            t.elapsed().as_secs_f64()
        };
        let (mut on, mut off, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for s in 0..steps {
            let (a, z) = if s % 2 == 0 {
                let a = step(&mut ex, true, shared + own + s);
                (a, step(&mut ex, false, shared + own + s))
            } else {
                let z = step(&mut ex, false, shared + own + s);
                (step(&mut ex, true, shared + own + s), z)
            };
            on.push(a);
            off.push(z);
            ratios.push(z / a);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "batch {b}: step median {:.2} ms with shared-pages attention, {:.2} ms without; \
             median paired ratio without / with {:.3}",
            med(&mut on) * 1e3,
            med(&mut off) * 1e3,
            med(&mut ratios)
        );
    }
}

/// The prefill pass of a serving round (issue #6): 4 sequences × 24 new tokens each,
/// continuing from 1,008 cached positions on shared pages, run `SGLRS_CHUNK_REPS` times
/// (default 30) at the same positions (each pass rewrites the same K/V). Prints the median
/// wall time per pass; for A/B of two builds run both under `perf stat -e cycles:u` at the
/// same time (one thread each: `SGLRS_CHUNK_THREADS=1`).
#[test]
#[ignore]
fn chunk_prefill_over_a_shared_prefix() {
    let (ps, shared, own, b) = (16usize, 1008usize, 24usize, 4usize);
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (reps, threads) = (env("SGLRS_CHUNK_REPS", 30), env("SGLRS_CHUNK_THREADS", 2));
    let per = own.div_ceil(ps) + 1;
    let (mut ex, tables) = over_shared_prefix(threads, (ps, shared, b, per));
    let owns: Vec<Vec<u32>> = (0..b).map(|i| tokens(own, 100 + i as u32)).collect();
    let mut times = Vec::with_capacity(reps);
    let mut cpu = Vec::with_capacity(reps);
    let mut first: Option<Vec<f32>> = None;
    for _ in 0..reps {
        let (t, c0) = (Instant::now(), thread_cpu_ns());
        let l = ex
            .forward(&Batch {
                seqs: (0..b)
                    .map(|i| SeqChunk {
                        tokens: &owns[i],
                        start_pos: shared,
                        pages: &tables[i],
                        logits: LogitsWanted::Last,
                    })
                    .collect(),
            })
            .unwrap();
        times.push(t.elapsed().as_secs_f64());
        cpu.push((thread_cpu_ns() - c0) as f64 * 1e-9);
        // Rerunning at the same positions gives the same logits.
        match &first {
            None => first = Some(l.data.clone()),
            Some(f) => assert_eq!(&l.data, f),
        }
    }
    times.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    eprintln!(
        "chunk prefill {b} x {own} tokens from {shared}, {threads} threads: median {:.2} ms, \
         best {:.2} ms over {reps}; calling thread's CPU time median {:.2} ms, best {:.2} ms",
        times[reps / 2] * 1e3,
        times[0] * 1e3,
        cpu[reps / 2] * 1e3,
        cpu[0] * 1e3
    );
}

/// CPU time of the calling thread in ns (`/proc/thread-self/schedstat`; 0 where missing).
/// With one executor thread every job runs on the caller, so this is the pass's CPU time.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
