//! Paged KV reuse is exact, and batching does not change results.

use sglrs_executor::{
    Batch, CpuExecutor, ExecConfig, ExecError, Executor, KvCapacity, LogitsWanted, SeqChunk,
};
use sglrs_model::gguf::load_gguf;
use sglrs_model::{default_model_path, ModelConfig, ModelWeights};
use std::sync::OnceLock;

mod common;
use common::{prefill_prefix, shared_prefix_tables, tokens};

fn model() -> &'static (ModelConfig, ModelWeights) {
    static M: OnceLock<(ModelConfig, ModelWeights)> = OnceLock::new();
    M.get_or_init(|| {
        let (c, w, _) = load_gguf(&default_model_path()).expect("default model");
        (c, w)
    })
}

fn exec(page_size: usize, pages: usize) -> CpuExecutor {
    let m = model();
    let cfg = ExecConfig {
        page_size,
        kv: KvCapacity::Pages(pages),
        threads: 2,
        ..ExecConfig::default()
    };
    CpuExecutor::new(&m.0, &m.1, &cfg).unwrap()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// One forward pass of a single chunk: `tokens` at `start_pos` over `pages`.
fn run_chunk(
    ex: &mut CpuExecutor,
    tokens: &[u32],
    start_pos: usize,
    pages: &[u32],
    logits: LogitsWanted,
) -> sglrs_executor::Logits {
    ex.forward(&Batch {
        seqs: vec![SeqChunk {
            tokens,
            start_pos,
            pages,
            logits,
        }],
    })
    .unwrap()
}

#[test]
fn prefix_then_rest_equals_one_prefill() {
    let toks = tokens(100, 1);
    for (ps, splits) in [
        (1usize, vec![1, 37, 99]),
        (16, vec![16, 23, 64]),
        (64, vec![64, 40, 1]),
    ] {
        let npages = toks.len().div_ceil(ps);
        let mut ex = exec(ps, 2 * npages + 1);
        // The whole sequence on pages 0..npages.
        let pages_a: Vec<u32> = (0..npages as u32).collect();
        let whole = run_chunk(&mut ex, &toks, 0, &pages_a, LogitsWanted::All);
        for k in splits {
            // The same sequence on other pages, in reverse order, in two chunks.
            let pages_b: Vec<u32> = (0..npages as u32)
                .rev()
                .map(|p| p + npages as u32 + 1)
                .collect();
            ex.forward(&Batch {
                seqs: vec![SeqChunk {
                    tokens: &toks[..k],
                    start_pos: 0,
                    pages: &pages_b,
                    logits: LogitsWanted::None,
                }],
            })
            .unwrap();
            let rest = ex
                .forward(&Batch {
                    seqs: vec![SeqChunk {
                        tokens: &toks[k..],
                        start_pos: k,
                        pages: &pages_b,
                        logits: LogitsWanted::All,
                    }],
                })
                .unwrap();
            assert_eq!(rest.rows.len(), toks.len() - k);
            let mut max_d = 0.0f32;
            let mut max_l = 0.0f32;
            for j in 0..toks.len() - k {
                for (a, b) in rest.row(j).iter().zip(whole.row(k + j)) {
                    max_d = max_d.max((a - b).abs());
                    max_l = max_l.max(b.abs());
                }
            }
            eprintln!("page size {ps}, split {k}: max |Δ| {max_d:e} (largest logit {max_l})");
            assert!(max_d <= 1e-3 * max_l, "page size {ps} split {k}: {max_d}");
        }
    }
}

/// Short chunks after a cached prefix (a jump-forward's forced tokens, speculated tokens, a
/// short new turn) read the KV pages in place, while the blocks of a long prefill attend
/// over one f32 copy of them: the logits are the same bits either way.
#[test]
fn short_chunks_read_in_place_match_a_whole_prefill_bit_for_bit() {
    let toks = tokens(160, 3);
    let ps = 16;
    let npages = toks.len().div_ceil(ps);
    let mut ex = exec(ps, 2 * npages + 1);
    let pages_a: Vec<u32> = (0..npages as u32).collect();
    let whole = run_chunk(&mut ex, &toks, 0, &pages_a, LogitsWanted::All);
    let pages_b: Vec<u32> = (npages as u32 + 1..2 * npages as u32 + 1).collect();
    // 128 tokens as one prefill (its 64-token blocks use the copy), then chunks of 1 to 16
    // tokens, each attending in place over everything before it.
    run_chunk(&mut ex, &toks[..128], 0, &pages_b, LogitsWanted::None);
    let mut pos = 128;
    for n in [1usize, 2, 3, 4, 6, 16] {
        let l = run_chunk(
            &mut ex,
            &toks[pos..pos + n],
            pos,
            &pages_b,
            LogitsWanted::All,
        );
        for j in 0..n {
            assert!(
                l.row(j) == whole.row(pos + j),
                "chunk of {n} at {pos}: row {j} differs from the whole prefill's"
            );
        }
        pos += n;
    }
}

/// Greedy-decodes `steps` tokens for each prompt, either one sequence at a time or all in
/// one batch per step.
fn decode(
    ex: &mut CpuExecutor,
    prompts: &[Vec<u32>],
    steps: usize,
    batched: bool,
) -> Vec<Vec<u32>> {
    let ps = ex.kv_layout().page_size;
    let per = (prompts.iter().map(|p| p.len()).max().unwrap() + steps).div_ceil(ps);
    // Interleaved page ids, so that sequences' pages are not contiguous.
    let tables: Vec<Vec<u32>> = (0..prompts.len())
        .map(|i| (0..per).map(|j| (j * prompts.len() + i) as u32).collect())
        .collect();
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    let groups: Vec<Vec<usize>> = if batched {
        vec![(0..prompts.len()).collect()]
    } else {
        (0..prompts.len()).map(|i| vec![i]).collect()
    };
    for g in groups {
        // Prefill (all of the group's prompts in one batch), then decode step by step.
        let batch = Batch {
            seqs: g
                .iter()
                .map(|&i| SeqChunk {
                    tokens: &prompts[i],
                    start_pos: 0,
                    pages: &tables[i],
                    logits: LogitsWanted::Last,
                })
                .collect(),
        };
        let l = ex.forward(&batch).unwrap();
        let next: Vec<u32> = (0..g.len()).map(|r| argmax(l.row(r))).collect();
        for (r, &i) in g.iter().enumerate() {
            seqs[i].push(next[r]);
        }
        for _ in 1..steps {
            let snapshot = seqs.clone();
            let batch = Batch {
                seqs: g
                    .iter()
                    .map(|&i| {
                        let s = &snapshot[i];
                        SeqChunk {
                            tokens: &s[s.len() - 1..],
                            start_pos: s.len() - 1,
                            pages: &tables[i],
                            logits: LogitsWanted::Last,
                        }
                    })
                    .collect(),
            };
            let l = ex.forward(&batch).unwrap();
            for (r, &i) in g.iter().enumerate() {
                seqs[i].push(argmax(l.row(r)));
            }
        }
    }
    seqs.iter()
        .zip(prompts)
        .map(|(s, p)| s[p.len()..].to_vec())
        .collect()
}

#[test]
fn batched_decode_of_16_sequences_equals_decoding_each_alone() {
    let prompts: Vec<Vec<u32>> = (0..16).map(|i| tokens(3 + 7 * i, i as u32 + 10)).collect();
    let mut ex = exec(16, 16 * 10);
    let alone = decode(&mut ex, &prompts, 8, false);
    let together = decode(&mut ex, &prompts, 8, true);
    assert_eq!(alone, together);
}

/// Decode steps of sequences whose page tables start with the same pages (a prefix computed
/// once, as the radix cache shares it) give bit-identical logits whether each sequence runs
/// alone or all run in one batch, where attention bundles them over the shared pages. Page
/// size 5 makes 16-position key blocks straddle pages.
#[test]
fn decode_over_shared_pages_is_bit_identical_to_decoding_alone() {
    // 1,104 shared tokens: rows longer than a softmax chunk, the bundle's chunked kernel
    // against each sequence alone (a decode step of one sequence splits its rows into
    // chunk tasks).
    for &(ps, shared_tokens) in &[(16usize, 160usize), (5, 65), (16, 1104)] {
        let n = 7;
        let steps = 4;
        let own: Vec<usize> = (0..n).map(|i| 1 + 9 * i).collect();
        let per = (own.iter().max().unwrap() + steps).div_ceil(ps) + 1;
        let shared_pages = shared_tokens / ps;
        let mut ex = exec(ps, shared_pages + n * per);
        let tables = shared_prefix_tables(shared_pages, n, per);
        let prefix = tokens(shared_tokens, 77);
        prefill_prefix(&mut ex, &prefix, &tables[0]);
        // Teacher-forced inputs, so both runs feed the same tokens.
        let rest: Vec<Vec<u32>> = (0..n)
            .map(|i| tokens(own[i] + steps, 300 + i as u32))
            .collect();
        let run = |ex: &mut CpuExecutor, group: &[usize]| -> Vec<Vec<Vec<f32>>> {
            let l = ex
                .forward(&Batch {
                    seqs: group
                        .iter()
                        .map(|&i| SeqChunk {
                            tokens: &rest[i][..own[i]],
                            start_pos: shared_tokens,
                            pages: &tables[i],
                            logits: LogitsWanted::Last,
                        })
                        .collect(),
                })
                .unwrap();
            let mut out: Vec<Vec<Vec<f32>>> = group.iter().map(|_| Vec::new()).collect();
            for (r, o) in out.iter_mut().enumerate() {
                o.push(l.row(r).to_vec());
            }
            for s in 0..steps {
                let l = ex
                    .forward(&Batch {
                        seqs: group
                            .iter()
                            .map(|&i| SeqChunk {
                                tokens: &rest[i][own[i] + s..own[i] + s + 1],
                                start_pos: shared_tokens + own[i] + s,
                                pages: &tables[i],
                                logits: LogitsWanted::Last,
                            })
                            .collect(),
                    })
                    .unwrap();
                for (r, o) in out.iter_mut().enumerate() {
                    o.push(l.row(r).to_vec());
                }
            }
            out
        };
        let alone: Vec<Vec<Vec<f32>>> = (0..n).map(|i| run(&mut ex, &[i]).remove(0)).collect();
        let together = run(&mut ex, &(0..n).collect::<Vec<_>>());
        for i in 0..n {
            for s in 0..=steps {
                assert!(
                    alone[i][s] == together[i][s],
                    "page size {ps}, sequence {i}, step {s}: batched logits differ from alone"
                );
            }
        }
    }
}

/// A decode step over a context longer than a softmax chunk, its rows split into one task
/// per chunk (the default with few sequences) or computed whole: the same bits, step after
/// step, and the same as a batch where the row is one of many.
#[test]
fn long_decode_rows_split_into_chunks_are_bit_identical() {
    let (ps, ctx, steps) = (16usize, 2_500usize, 3usize);
    let toks = tokens(ctx + steps, 5);
    let npages = (ctx + steps).div_ceil(ps);
    let mut ex = exec(ps, npages + 1);
    let pages: Vec<u32> = (0..npages as u32).collect();
    prefill_prefix(&mut ex, &toks[..ctx], &pages);
    let run = |ex: &mut CpuExecutor, split: bool| -> Vec<Vec<f32>> {
        ex.set_split_attention(split);
        (0..steps)
            .map(|s| {
                ex.forward(&Batch {
                    seqs: vec![SeqChunk {
                        tokens: &toks[ctx + s..ctx + s + 1],
                        start_pos: ctx + s,
                        pages: &pages,
                        logits: LogitsWanted::Last,
                    }],
                })
                .unwrap()
                .row(0)
                .to_vec()
            })
            .collect()
    };
    let split = run(&mut ex, true);
    let whole = run(&mut ex, false);
    for s in 0..steps {
        assert!(
            split[s] == whole[s],
            "step {s}: split rows differ from whole ones"
        );
    }
    ex.set_split_attention(true);
}

/// Short chunks over a context longer than a softmax chunk (a new turn's tool result, a
/// jump-forward run), alone or beside a decode step: split into one task per chunk and KV
/// head (the default when such a block would leave a thread idle) or computed whole, every
/// row has the same bits. The lengths cover blocks that read the pages in place (≤ 16
/// tokens), ones that convert them to f32 when whole, and a block whose rows straddle a
/// chunk boundary (2,040 + 20 crosses 2,048).
#[test]
fn short_chunks_over_long_contexts_split_into_chunks_are_bit_identical() {
    let ps = 16usize;
    let ctx = 2_040usize;
    let toks = tokens(ctx + 200, 9);
    let npages = (ctx + 200).div_ceil(ps);
    let mut ex = exec(ps, 2 * npages + 2);
    let pages: Vec<u32> = (0..npages as u32).collect();
    let other: Vec<u32> = (npages as u32..2 * npages as u32).collect();
    prefill_prefix(&mut ex, &toks[..ctx], &pages);
    prefill_prefix(&mut ex, &toks[..ctx], &other);
    for n in [4usize, 16, 20, 64, 100] {
        let run = |ex: &mut CpuExecutor, split: bool, with_decode: bool| -> Vec<Vec<f32>> {
            ex.set_split_attention(split);
            let mut seqs = vec![SeqChunk {
                tokens: &toks[ctx..ctx + n],
                start_pos: ctx,
                pages: &pages,
                logits: LogitsWanted::All,
            }];
            if with_decode {
                seqs.push(SeqChunk {
                    tokens: &toks[ctx..ctx + 1],
                    start_pos: ctx,
                    pages: &other,
                    logits: LogitsWanted::Last,
                });
            }
            let l = ex.forward(&Batch { seqs }).unwrap();
            (0..n).map(|r| l.row(r).to_vec()).collect()
        };
        let whole = run(&mut ex, false, false);
        for (split, with_decode) in [(true, false), (true, true), (false, true)] {
            let got = run(&mut ex, split, with_decode);
            for r in 0..n {
                assert!(
                    got[r] == whole[r],
                    "{n}-token chunk, split {split}, beside a decode step {with_decode}: row {r} differs"
                );
            }
        }
    }
    ex.set_split_attention(true);
}

#[test]
fn bad_batches_are_rejected_with_clear_errors() {
    let mut ex = exec(16, 4);
    let toks = tokens(20, 3);
    let one = [0u32];
    let r = ex.forward(&Batch {
        seqs: vec![SeqChunk {
            tokens: &toks,
            start_pos: 0,
            pages: &one,
            logits: LogitsWanted::Last,
        }],
    });
    assert!(matches!(
        r,
        Err(ExecError::PagesTooShort {
            seq: 0,
            covered: 16,
            needed: 20
        })
    ));
    let bad_page = [0u32, 9];
    let r = ex.forward(&Batch {
        seqs: vec![SeqChunk {
            tokens: &toks,
            start_pos: 0,
            pages: &bad_page,
            logits: LogitsWanted::Last,
        }],
    });
    assert!(matches!(r, Err(ExecError::BadPage(9))));
    let bad_tok = [1u32 << 30];
    let r = ex.forward(&Batch {
        seqs: vec![SeqChunk {
            tokens: &bad_tok,
            start_pos: 0,
            pages: &one,
            logits: LogitsWanted::Last,
        }],
    });
    assert!(matches!(r, Err(ExecError::BadToken(_))));
}
