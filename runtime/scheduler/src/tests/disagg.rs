//! Prefill/decode disaggregation under the toy executor: a prefill core exports a prompt's
//! pages, a decode core imports them (the test copies the toy KV slots, as the transfer
//! endpoint copies pages) and decodes on; the output equals one core's.

use super::*;
use crate::request::{Disagg, KvImport};

fn disagg_request(id: u64, prompt: Vec<u32>, max_new: usize, role: Disagg) -> SchedRequest {
    SchedRequest {
        disagg: Some(role),
        ..request(id, prompt, max_new)
    }
}

/// Runs a prefill core until request `id` ends; returns its first token, the exported page
/// ids and the sampler position.
fn prefill(c: &mut SchedulerCore, e: &mut ToyExec, id: u64) -> (u32, Vec<u32>, u128) {
    let now = Instant::now();
    let (mut first, mut export) = (None, None);
    for _ in 0..10_000 {
        if let Some(plan) = c.poll_batch(now) {
            let logits = e.forward(&plan.batch()).unwrap();
            c.handle_forward(plan, &logits, now);
        }
        for job in c.take_exports() {
            assert_eq!(job.id, id);
            export = Some((job.pages, job.rng_position));
        }
        while let Some(ev) = c.poll_event() {
            match ev {
                SchedEvent::Delta { tokens, .. } if first.is_none() && !tokens.is_empty() => {
                    first = Some(tokens[0]);
                }
                SchedEvent::Finished { reason, .. } => {
                    assert_eq!(
                        reason,
                        FinishReason::Length(1),
                        "a prefill ends at its first token"
                    );
                }
                _ => {}
            }
        }
        if c.is_idle() {
            let (pages, rng) = export.expect("the prefill exported its pages");
            return (first.expect("a first token"), pages, rng);
        }
    }
    panic!("prefill did not finish");
}

/// Runs a decode core; every import is served from `src` (the prefill's slots and page ids
/// of each request) unless `fail` names the request. Returns each request's output.
fn decode(
    c: &mut SchedulerCore,
    e: &mut ToyExec,
    src: &HashMap<u64, (&ToyExec, Vec<u32>, u32)>,
    fail: Option<u64>,
    jobs: &mut Vec<ImportJob>,
) -> HashMap<u64, Out> {
    let now = Instant::now();
    let ps = e.page_size;
    let mut outs: HashMap<u64, Out> = HashMap::new();
    for _ in 0..10_000 {
        let plan = c.poll_batch(now);
        while let Some(job) = c.poll_import() {
            jobs.push(job.clone());
            if Some(job.id) == fail {
                c.handle_kv_imported(job.id, Err("prefill host gone".into()));
                continue;
            }
            let (pe, pages, first) = &src[&job.id];
            assert_eq!(pages.len(), job.prompt_pages);
            for (i, &dst) in job.dst_pages.iter().enumerate() {
                let from = pages[job.skip_pages + i] as usize;
                for slot in 0..ps {
                    e.kv[dst as usize * ps + slot] = pe.kv[from * ps + slot];
                }
            }
            let imp = KvImport {
                first_token: *first,
                ..KvImport::default()
            };
            c.handle_kv_imported(job.id, Ok(imp));
        }
        if let Some(plan) = plan {
            let logits = e.forward(&plan.batch()).unwrap();
            c.handle_forward(plan, &logits, now);
        }
        while let Some(ev) = c.poll_event() {
            match ev {
                SchedEvent::Delta { id, tokens, .. } => {
                    outs.entry(id).or_default().tokens.extend(tokens)
                }
                SchedEvent::Finished {
                    id, reason, cached, ..
                } => {
                    let o = outs.entry(id).or_default();
                    o.reason = Some(reason);
                    o.cached = cached.total();
                }
                _ => {}
            }
        }
        if c.is_idle() {
            return outs;
        }
    }
    panic!("decode did not finish");
}

#[test]
fn prefill_then_decode_equals_one_host_and_a_follow_up_moves_only_its_new_pages() {
    let (mut pc, mut pe) = (core(64, 4), ToyExec::new(64, 4));
    let (mut dc, mut de) = (core(64, 4), ToyExec::new(64, 4));
    let turn1: Vec<u32> = (1..23).collect(); // 22 tokens: 5 full pages + 2
    let mut turn2 = turn1.clone();
    turn2.extend(reference(&turn1, 6));
    turn2.extend([5, 6, 7]);
    let mut jobs = Vec::new();
    for (id, prompt) in [(1, &turn1), (2, &turn2)] {
        pc.handle_request(
            disagg_request(id, prompt.clone(), 6, Disagg::Export),
            Instant::now(),
        );
        let (first, pages, _) = prefill(&mut pc, &mut pe, id);
        assert_eq!(first, reference(prompt, 1)[0]);
        assert_eq!(pages.len(), prompt.len().div_ceil(4));
        dc.handle_request(
            disagg_request(id, prompt.clone(), 6, Disagg::Import),
            Instant::now(),
        );
        let src = HashMap::from([(id, (&pe, pages, first))]);
        let outs = decode(&mut dc, &mut de, &src, None, &mut jobs);
        assert_eq!(outs[&id].tokens, reference(prompt, 6), "request {id}");
        assert_eq!(outs[&id].reason, Some(FinishReason::Length(6)));
    }
    // Turn 1 moved every page; turn 2 found turn 1's prompt and output in the decode
    // host's cache (27 tokens have KV there: 6 full pages) and moved only the rest.
    assert_eq!((jobs[0].skip_pages, jobs[0].dst_pages.len()), (0, 6));
    assert_eq!(jobs[1].skip_pages, 6);
    assert_eq!(jobs[1].dst_pages.len(), turn2.len().div_ceil(4) - 6);
    let st = dc.disagg_stats();
    assert_eq!(
        (st.imported_requests, st.import_failures, st.local_pages),
        (2, 0, 6)
    );
    assert_eq!(pc.disagg_stats().exported_requests, 2);
    assert_no_leaks(&pc);
    assert_no_leaks(&dc);
}

#[test]
fn a_failed_import_ends_only_its_request_and_frees_its_pages() {
    let (mut pc, mut pe) = (core(64, 4), ToyExec::new(64, 4));
    let (mut dc, mut de) = (core(64, 4), ToyExec::new(64, 4));
    let a: Vec<u32> = (1..18).collect();
    let b: Vec<u32> = (3..30).collect();
    pc.handle_request(
        disagg_request(1, a.clone(), 4, Disagg::Export),
        Instant::now(),
    );
    let (fa, pa, _) = prefill(&mut pc, &mut pe, 1);
    let pe_a = ToyExec {
        page_size: 4,
        kv: pe.kv.clone(),
        rule: next_of,
    };
    pc.handle_request(
        disagg_request(2, b.clone(), 4, Disagg::Export),
        Instant::now(),
    );
    let (fb, pb, _) = prefill(&mut pc, &mut pe, 2);
    dc.handle_request(
        disagg_request(1, a.clone(), 4, Disagg::Import),
        Instant::now(),
    );
    dc.handle_request(
        disagg_request(2, b.clone(), 4, Disagg::Import),
        Instant::now(),
    );
    let src = HashMap::from([(1, (&pe_a, pa, fa)), (2, (&pe, pb, fb))]);
    let outs = decode(&mut dc, &mut de, &src, Some(1), &mut Vec::new());
    assert_eq!(
        outs[&1].reason,
        Some(FinishReason::Abort(AbortReason::Transfer(
            "prefill host gone".into()
        )))
    );
    assert_eq!(outs[&2].tokens, reference(&b, 4));
    assert_eq!(dc.disagg_stats().import_failures, 1);
    assert_no_leaks(&dc);
}

#[test]
fn an_abort_while_receiving_keeps_the_pages_until_the_import_ends() {
    let (mut dc, _) = (core(64, 4), ToyExec::new(64, 4));
    let now = Instant::now();
    dc.handle_request(disagg_request(1, (1..18).collect(), 4, Disagg::Import), now);
    assert!(
        dc.poll_batch(now).is_none(),
        "nothing runs while the KV is on its way"
    );
    let job = dc.poll_import().expect("an import job");
    assert_eq!(job.dst_pages.len(), 5);
    dc.handle_abort(1, AbortReason::ClientDisconnected);
    let ev: Vec<_> = std::iter::from_fn(|| dc.poll_event()).collect();
    assert!(ev.iter().any(|e| matches!(e, SchedEvent::Finished { .. })));
    assert!(dc.is_idle());
    // The writer may still be copying into the pages: they are not free yet.
    assert!(dc.cache_stats().free_pages < 64);
    assert!(!dc.handle_flush());
    // A late success for an ended request only releases them.
    dc.handle_kv_imported(1, Ok(KvImport::default()));
    assert!(dc.poll_event().is_none());
    assert_no_leaks(&dc);
    assert_eq!(dc.cache_stats().free_pages, 64);
}
