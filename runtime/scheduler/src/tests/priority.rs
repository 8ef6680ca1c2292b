//! Priority: preemption of running sequences (`core/preempt.rs`) and a full queue that
//! takes a request of higher priority in place of a waiting one of lower priority.

use super::*;

fn prio(id: u64, prompt: Vec<u32>, max_new: usize, priority: i64) -> SchedRequest {
    SchedRequest {
        priority,
        ..request(id, prompt, max_new)
    }
}

/// Steps the core once; returns the request ids of the planned pass.
fn step_once(c: &mut SchedulerCore, e: &mut ToyExec, now: Instant) -> Vec<u64> {
    let Some(plan) = c.poll_batch(now) else {
        return Vec::new();
    };
    let ids = plan.items.iter().map(|it| it.key.0).collect();
    let logits = e.forward(&plan.batch()).unwrap();
    c.handle_forward(plan, &logits, now);
    ids
}

/// A core with `max_running` places and the preemption `threshold`, its executor, a clock.
fn with_places(max_running: usize, threshold: Option<i64>) -> (SchedulerCore, ToyExec, Instant) {
    let mut cfg = config(64, 4);
    cfg.max_running = max_running;
    cfg.priority_preemption = threshold;
    let c = SchedulerCore::new(cfg, Arc::new(ToyTok)).unwrap();
    (c, ToyExec::new(64, 4), Instant::now())
}

fn two_running(threshold: Option<i64>) -> (SchedulerCore, ToyExec, Instant) {
    let (mut c, mut e, now) = with_places(2, threshold);
    c.handle_request(prio(1, (1..9).collect(), 30, 0), now);
    c.handle_request(prio(2, (2..10).collect(), 30, 5), now);
    for _ in 0..4 {
        step_once(&mut c, &mut e, now);
    }
    assert_eq!(c.num_running(), 2);
    (c, e, now)
}

#[test]
fn a_much_higher_priority_request_preempts_the_lowest_running_one_which_resumes_unchanged() {
    let (mut c, mut e, now) = two_running(Some(10));
    c.handle_request(prio(3, (3..11).collect(), 6, 16), now);
    // Request 1 (the lowest priority) is retracted, and request 3's prompt runs in a pass of
    // its own (request 2's decode step waits for the next one).
    assert_eq!(step_once(&mut c, &mut e, now), [3]);
    assert_eq!(c.stats().preemptions, 1);
    assert_eq!(c.stats().urgent_passes, 1);
    let ids = step_once(&mut c, &mut e, now);
    assert!(
        ids.contains(&3) && ids.contains(&2) && !ids.contains(&1),
        "request 3 runs in request 1's place: {ids:?}"
    );
    assert_eq!(c.num_waiting(), 1);
    // Request 1 is not queued again (its queue place was given back at its admission).
    assert!(!c.is_queued(1));
    let outs = run(&mut c, &mut e, &[]);
    // Every output equals an uninterrupted run's; request 1 resumed from its cached KV.
    for (id, prompt, n) in [(1, 1..9, 30), (2, 2..10, 30), (3, 3..11, 6)] {
        let prompt: Vec<u32> = prompt.collect();
        assert_eq!(outs[&(id, 0)].tokens, reference(&prompt, n), "request {id}");
    }
    assert_eq!(c.stats().preemptions, 1);
    assert_no_leaks(&c);
}

#[test]
fn the_preempted_request_keeps_every_token_it_produced() {
    let (mut c, mut e, now) = two_running(Some(10));
    let mut first = run_until_tokens(&mut c, &mut e, now, 1);
    c.handle_request(prio(3, (3..11).collect(), 6, 100), now);
    let rest = run(&mut c, &mut e, &[]);
    first.extend(rest[&(1, 0)].tokens.iter().copied());
    assert_eq!(first, reference(&(1..9).collect::<Vec<_>>(), 30));
    assert_eq!(c.stats().preemptions, 1);
    assert_no_leaks(&c);
}

/// Steps until request `id` has produced something; returns its tokens so far (from the
/// start: the tokens of [`two_running`]'s steps are drained too).
fn run_until_tokens(c: &mut SchedulerCore, e: &mut ToyExec, now: Instant, id: u64) -> Vec<u32> {
    let mut out = Vec::new();
    for _ in 0..100 {
        while let Some(ev) = c.poll_event() {
            if let SchedEvent::Delta { id: i, tokens, .. } = ev {
                if i == id {
                    out.extend(tokens);
                }
            }
        }
        if !out.is_empty() {
            return out;
        }
        step_once(c, e, now);
    }
    panic!("request {id} produced nothing");
}

#[test]
fn a_gap_within_the_threshold_or_no_threshold_preempts_nothing() {
    for (threshold, priority) in [(Some(10), 15), (None, 1000)] {
        let (mut c, mut e, now) = two_running(threshold);
        // 15 exceeds request 1's 0 by more than 10 but request 2's 5 by only 10: still the
        // lowest (request 1) is the one compared, and is preempted when there is a threshold.
        c.handle_request(prio(3, (3..11).collect(), 6, priority), now);
        let ids = step_once(&mut c, &mut e, now);
        match threshold {
            Some(_) => assert!(ids.contains(&3), "{ids:?}"),
            None => assert!(!ids.contains(&3), "{ids:?}"),
        }
        run(&mut c, &mut e, &[]);
        assert_no_leaks(&c);
    }
    let (mut c, mut e, now) = two_running(Some(10));
    c.handle_request(prio(3, (3..11).collect(), 6, 10), now);
    assert!(!step_once(&mut c, &mut e, now).contains(&3));
    assert_eq!(c.stats().preemptions, 0, "10 over 0 is not more than 10");
}

#[test]
fn another_tenants_running_request_is_not_preempted() {
    let (mut c, mut e, now) = with_places(1, Some(10));
    c.handle_request(
        SchedRequest {
            tenant: 7,
            ..prio(1, (1..9).collect(), 20, 0)
        },
        now,
    );
    step_once(&mut c, &mut e, now);
    c.handle_request(
        SchedRequest {
            tenant: 8,
            ..prio(2, (2..10).collect(), 4, 100)
        },
        now,
    );
    assert!(!step_once(&mut c, &mut e, now).contains(&2));
    assert_eq!(c.stats().preemptions, 0);
    run(&mut c, &mut e, &[]);
    assert_no_leaks(&c);
}

/// An executor whose forward passes each wait for a token on `gate` (free once the sender
/// is dropped), so a test can hold the scheduler thread while it fills the queue.
fn gated_exec(toy: ToyExec, gate: crossbeam::channel::Receiver<()>) -> impl Executor {
    HookExec::new(
        toy,
        move |_: &Batch<'_>, _: Option<&std::sync::atomic::AtomicBool>| {
            let _ = gate.recv();
            Ok(())
        },
    )
}

#[test]
fn a_full_queue_takes_a_higher_priority_request_in_place_of_the_lowest_waiting_one() {
    let mut cfg = config(64, 4);
    cfg.max_running = 1;
    cfg.max_queued = 2;
    cfg.max_queued_per_tenant = 2;
    let (gate, rx) = crossbeam::channel::unbounded();
    let core = SchedulerCore::new(cfg, Arc::new(ToyTok)).unwrap();
    let (handle, join) = spawn(core, Box::new(gated_exec(ToyExec::new(64, 4), rx))).unwrap();
    let mut a = handle.submit(prio(1, (1..9).collect(), 20, 0)).unwrap();
    // A is admitted (its place given back) before its first pass, which waits at the gate.
    for _ in 0..1000 {
        if handle.queued() == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(handle.queued(), 0, "A was never admitted");
    let mut b = handle.submit(prio(2, (2..10).collect(), 4, 0)).unwrap();
    let mut c = handle.submit(prio(3, (3..11).collect(), 4, 1)).unwrap();
    // Let passes through until the thread has seen B and C waiting (and published the
    // queue's lowest priority).
    let mut seen = false;
    for _ in 0..1000 {
        gate.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        if handle.stats().waiting == 2 {
            seen = true;
            break;
        }
    }
    assert!(seen, "B and C never waited together");
    assert_eq!(handle.queued(), 2);
    // Same priority as the lowest waiting (0): refused at once, as a full queue refuses.
    assert!(matches!(
        handle.submit(prio(4, (4..12).collect(), 4, 0)),
        Err(SchedError::Overloaded { limit: 2 })
    ));
    // Higher: takes B's place (the lowest priority waiting), and B hears why.
    let mut d = handle.submit(prio(5, (5..13).collect(), 4, 50)).unwrap();
    drop(gate);
    let ends = finishes(&mut b);
    match &ends[..] {
        [(2, 0, FinishReason::Abort(AbortReason::Overloaded(m)))] => {
            assert!(m.contains("higher priority"), "{m}")
        }
        other => panic!("B ended with {other:?}"),
    }
    for (rx, id) in [(&mut a, 1), (&mut c, 3), (&mut d, 5)] {
        let ends = finishes(rx);
        assert!(
            matches!(ends[..], [(i, 0, FinishReason::Length(_))] if i == id),
            "request {id}: {ends:?}"
        );
    }
    assert_eq!(handle.queued(), 0, "every place was given back");
    drop(handle);
    join.join().expect("the thread ends without a panic");
}

/// An executor whose passes take `pass` each unless its interrupt flag is raised meanwhile
/// (then it stops with [`ExecError::Interrupted`], as the CPU executor does between layers).
pub(super) fn slow_exec(toy: ToyExec, pass: std::time::Duration) -> impl Executor {
    HookExec::new(
        toy,
        move |_: &Batch<'_>, flag: Option<&std::sync::atomic::AtomicBool>| {
            let end = Instant::now() + pass;
            while Instant::now() < end {
                if flag.is_some_and(|f| f.load(std::sync::atomic::Ordering::Acquire)) {
                    return Err(ExecError::Interrupted);
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            Ok(())
        },
    )
}

/// Every token and the end of one request (bounded: the channel closes after its end).
pub(super) fn tokens_and_end(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<SchedEvent>,
) -> (Vec<u32>, Option<FinishReason>) {
    let (mut out, mut end) = (Vec::new(), None);
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            SchedEvent::Delta { tokens, .. } => out.extend(tokens),
            SchedEvent::Finished { reason, .. } => end = Some(reason),
            _ => {}
        }
    }
    (out, end)
}

#[test]
fn a_much_higher_priority_arrival_stops_the_pass_in_flight_and_nothing_changes_but_its_wait() {
    for threshold in [Some(10), None] {
        let mut cfg = config(64, 4);
        cfg.max_running = 1;
        cfg.priority_preemption = threshold;
        let exec = slow_exec(ToyExec::new(64, 4), std::time::Duration::from_millis(300));
        let core = SchedulerCore::new(cfg, Arc::new(ToyTok)).unwrap();
        let (handle, join) = spawn(core, Box::new(exec)).unwrap();
        let low: Vec<u32> = (1..9).collect();
        let high: Vec<u32> = (3..11).collect();
        let mut a = handle.submit(prio(1, low.clone(), 3, 0)).unwrap();
        // A's first pass is in flight once its place was given back (admitted).
        for _ in 0..1000 {
            if handle.queued() == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        let t = Instant::now();
        let mut b = handle.submit(prio(2, high.clone(), 1, 100)).unwrap();
        let (b_out, b_end) = tokens_and_end(&mut b);
        let b_took = t.elapsed();
        let (a_out, a_end) = tokens_and_end(&mut a);
        assert_eq!(b_out, reference(&high, 1));
        assert_eq!(
            a_out,
            reference(&low, 3),
            "the preempted request's output is unchanged"
        );
        assert!(matches!(b_end, Some(FinishReason::Length(1))), "{b_end:?}");
        assert!(matches!(a_end, Some(FinishReason::Length(3))), "{a_end:?}");
        let s = handle.stats();
        match threshold {
            Some(_) => {
                assert!(s.interrupted_passes >= 1, "{s:?}");
                assert_eq!(s.core.preemptions, 1, "{s:?}");
                // B's one pass, and not the rest of A's (~270 ms) before it.
                assert!(
                    b_took < std::time::Duration::from_millis(560),
                    "B took {b_took:?}"
                );
            }
            None => {
                assert_eq!(s.interrupted_passes, 0);
                assert_eq!(s.core.preemptions, 0);
                assert!(
                    b_took >= std::time::Duration::from_millis(500),
                    "B took {b_took:?}"
                );
            }
        }
        drop(handle);
        join.join().expect("the thread ends without a panic");
    }
}

#[test]
fn an_urgent_prompt_leaves_out_only_its_own_tenants_low_priority_steps() {
    let (mut c, mut e, now) = with_places(3, Some(10));
    let of = |tenant, r| SchedRequest { tenant, ..r };
    c.handle_request(of(7, prio(1, (1..9).collect(), 20, 0)), now);
    c.handle_request(of(8, prio(2, (2..10).collect(), 20, 0)), now);
    for _ in 0..3 {
        step_once(&mut c, &mut e, now);
    }
    c.handle_request(of(7, prio(3, (3..11).collect(), 4, 50)), now);
    let mut ids = step_once(&mut c, &mut e, now);
    ids.sort();
    assert_eq!(
        ids,
        [2, 3],
        "tenant 7's low-priority decode waits, tenant 8's runs"
    );
    assert_eq!(c.stats().urgent_passes, 1);
    let outs = run(&mut c, &mut e, &[]);
    for (id, prompt, n) in [(1, 1..9, 20), (2, 2..10, 20), (3, 3..11, 4)] {
        let prompt: Vec<u32> = prompt.collect();
        assert_eq!(outs[&(id, 0)].tokens, reference(&prompt, n), "request {id}");
    }
    assert_no_leaks(&c);
}
