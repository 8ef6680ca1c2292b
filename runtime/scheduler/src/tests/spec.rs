//! N-gram drafts verified in the pass (`core/spec.rs`): the same tokens as decoding one at a
//! time, drafts accepted and refused, pages returned.

use super::*;

/// Mostly repeats the token three back (so drafts by lookup are often right), but every
/// seventh position and after a 5 takes another turn (so some drafts are wrong).
fn periodic(seq: &[u32]) -> u32 {
    let n = seq.len();
    let last = seq[n - 1];
    if n.is_multiple_of(7) || last == 5 {
        (last * 3 + n as u32) % (VOCAB as u32 - 1) + 1
    } else if n >= 3 {
        seq[n - 3]
    } else {
        last % (VOCAB as u32 - 1) + 1
    }
}

fn reference_by(rule: fn(&[u32]) -> u32, prompt: &[u32], max_new: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..max_new {
        let t = rule(&seq);
        seq.push(t);
    }
    seq.split_off(prompt.len())
}

fn spec_core(num_pages: usize, page_size: usize, draft: usize) -> SchedulerCore {
    let mut cfg = config(num_pages, page_size);
    cfg.speculative_ngram = draft;
    SchedulerCore::new(cfg, Arc::new(ToyTok)).unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    (0..5u32)
        .map(|i| (0..9 + 3 * i).map(|j| (i * 11 + j * 7) % 38 + 1).collect())
        .collect()
}

#[test]
fn drafted_tokens_give_the_same_output_as_one_token_per_step() {
    for (pages, ps) in [(128, 4), (96, 16), (40, 4)] {
        let mut outs_by_draft = Vec::new();
        for draft in [0, 1, 4, 7] {
            let mut c = spec_core(pages, ps, draft);
            let mut e = ToyExec::new(pages, ps);
            e.rule = periodic;
            for (id, p) in prompts().into_iter().enumerate() {
                c.handle_request(request(id as u64, p, 40 + id), Instant::now());
            }
            let outs = run(&mut c, &mut e, &[]);
            for (id, p) in prompts().iter().enumerate() {
                let o = &outs[&(id as u64, 0)];
                assert_eq!(
                    o.tokens,
                    reference_by(periodic, p, 40 + id),
                    "draft {draft}, {pages} pages of {ps}"
                );
                assert_eq!(o.reason, Some(FinishReason::Length(40 + id)));
                assert_eq!(o.text.len(), 40 + id);
            }
            let st = c.stats().clone();
            if draft == 0 {
                assert_eq!(st.spec_draft_tokens, 0);
            } else {
                // Some drafts are taken and some refused: both paths ran.
                assert!(st.spec_accepted_tokens > 20, "{st:?}");
                assert!(st.spec_draft_tokens > st.spec_accepted_tokens, "{st:?}");
            }
            assert_no_leaks(&c);
            outs_by_draft.push(st.generated_tokens);
        }
        assert!(outs_by_draft.windows(2).all(|w| w[0] == w[1]));
    }
}

#[test]
fn drafts_save_steps_and_stop_at_stop_tokens_and_limits() {
    // A sequence that repeats its last two tokens forever: every draft is right.
    fn two_cycle(seq: &[u32]) -> u32 {
        seq[seq.len() - 2]
    }
    let prompt = vec![3, 9, 3, 9, 3, 9];
    let steps = |draft: usize, max_new: usize| {
        let mut c = spec_core(64, 4, draft);
        let mut e = ToyExec::new(64, 4);
        e.rule = two_cycle;
        c.handle_request(request(1, prompt.clone(), max_new), Instant::now());
        let mut n = 0;
        let t0 = Instant::now();
        while let Some(plan) = c.poll_batch(t0) {
            let logits = e.forward(&plan.batch()).unwrap();
            c.handle_forward(plan, &logits, t0);
            n += 1;
        }
        let mut toks = Vec::new();
        while let Some(ev) = c.poll_event() {
            if let SchedEvent::Delta { tokens, .. } = ev {
                toks.extend(tokens);
            }
        }
        assert_eq!(toks, reference_by(two_cycle, &prompt, max_new));
        assert_no_leaks(&c);
        (n, c.stats().clone())
    };
    let (plain, _) = steps(0, 21);
    let (drafted, st) = steps(4, 21);
    assert_eq!(plain, 21); // one prefill that samples, then 20 decode steps
                           // Each decode step takes its sampled token and 4 drafted ones: 20 tokens in 4 steps.
    assert_eq!(drafted, 1 + 4);
    assert_eq!(st.spec_accepted_tokens, 4 * 4);
    // Never a draft beyond the token limit: the last token is sampled, not drafted.
    assert_eq!(st.spec_draft_tokens, st.spec_accepted_tokens);

    // A stop token in the lookup's continuation ends the draft before it.
    let mut c = spec_core(64, 4, 4);
    let mut e = ToyExec::new(64, 4);
    e.rule = two_cycle;
    let mut r = request(2, vec![3, EOS, 3, EOS, 3], 10);
    r.stop.ignore_eos = false;
    c.handle_request(r, Instant::now());
    let outs = run(&mut c, &mut e, &[]);
    assert_eq!(outs[&(2, 0)].tokens, vec![EOS]);
    assert_eq!(outs[&(2, 0)].reason, Some(FinishReason::StopToken(EOS)));
    assert_eq!(c.stats().spec_draft_tokens, 0);
    assert_no_leaks(&c);
}

#[test]
fn a_sequence_whose_drafts_fail_backs_off() {
    // "1 2 c" with a new c every time: after "1 2" the lookup drafts the last c, always wrong.
    fn new_c_each_time(seq: &[u32]) -> u32 {
        match seq[seq.len() - 1] {
            1 => 2,
            2 => seq.iter().filter(|&&t| t == 2).count() as u32 % 30 + 3,
            _ => 1,
        }
    }
    let prompt = vec![1, 2, 3];
    let mut c = spec_core(64, 4, 4);
    let mut e = ToyExec::new(64, 4);
    e.rule = new_c_each_time;
    c.handle_request(request(1, prompt.clone(), 84), Instant::now());
    let outs = run(&mut c, &mut e, &[]);
    assert_eq!(
        outs[&(1, 0)].tokens,
        reference_by(new_c_each_time, &prompt, 84)
    );
    let st = c.stats();
    assert_eq!(st.spec_accepted_tokens, 0, "{st:?}");
    // 28 chances to draft; backing off 1, 3, 7, 15, 16 steps after each refusal (every
    // third step a chance), and one token after the first: 4 + 1 + 1 + 1 + 1.
    assert!(st.spec_draft_tokens <= 10, "{st:?}");
    assert!(st.spec_draft_tokens >= 4, "{st:?}");
    assert_no_leaks(&c);
}
