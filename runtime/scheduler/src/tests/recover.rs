//! Recovery from a panic in planning (`driver/recover.rs`): the requests in flight end with
//! an explicit error, the thread swaps in a fresh core and serves on, and a fault that keeps
//! coming back stops it after a few recoveries.

use super::priority::{slow_exec, tokens_and_end};
use super::*;
use crate::driver::DriverStats;

const FAULT: u32 = 37;

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..5000 {
        if done() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("never: {what}");
}

fn internal_failure(end: &Option<FinishReason>) -> bool {
    matches!(end, Some(FinishReason::Abort(AbortReason::Internal(m)))
        if m.contains("the scheduler failed") && m.contains("planning fault"))
}

#[test]
fn a_panic_in_planning_fails_the_requests_in_flight_and_the_scheduler_serves_on() {
    let mut core = SchedulerCore::new(config(64, 4), Arc::new(ToyTok)).unwrap();
    core.planning_fault = Some(FAULT);
    let exec = slow_exec(ToyExec::new(64, 4), std::time::Duration::from_millis(5));
    let (handle, join) = spawn(core, Box::new(exec)).unwrap();
    let mut a = handle.submit(request(1, (1..9).collect(), 100)).unwrap();
    wait_for("A admitted", || handle.queued() == 0);
    let mut b = handle.submit(request(2, vec![1, 2, FAULT, 4], 4)).unwrap();
    let (_, b_end) = tokens_and_end(&mut b);
    let (_, a_end) = tokens_and_end(&mut a);
    assert!(internal_failure(&b_end), "{b_end:?}");
    assert!(
        internal_failure(&a_end),
        "the running request hears it too: {a_end:?}"
    );
    assert!(handle.is_alive());
    let stats = |h: &SchedulerHandle| -> DriverStats { h.stats() };
    wait_for("the restart published", || {
        stats(&handle).scheduler_restarts == 1
    });
    let s = stats(&handle);
    assert_eq!(s.cache.free_pages, s.cache.total_pages, "{:?}", s.cache);
    assert_eq!(handle.queued(), 0);
    assert!(
        s.core.prompt_tokens >= 8,
        "the counters carry on: {:?}",
        s.core
    );
    // Served as before the fault.
    let prompt: Vec<u32> = (1..9).collect();
    let mut c = handle.submit(request(3, prompt.clone(), 6)).unwrap();
    let (out, end) = tokens_and_end(&mut c);
    assert_eq!(out, reference(&prompt, 6));
    assert!(matches!(end, Some(FinishReason::Length(6))), "{end:?}");
    // A fault that keeps coming back: recovered up to the limit, then the thread stops.
    for k in 2..=recover_limit() + 1 {
        let mut r = handle
            .submit(request(10 + k as u64, vec![FAULT, 1], 2))
            .unwrap();
        let (_, end) = tokens_and_end(&mut r);
        assert!(internal_failure(&end), "{end:?}");
        if k <= recover_limit() {
            wait_for("restart", || stats(&handle).scheduler_restarts == k as u64);
            assert!(handle.is_alive());
        }
    }
    wait_for("the thread stopped", || !handle.is_alive());
    assert!(matches!(
        handle.submit(request(99, vec![1, 2], 2)),
        Err(SchedError::Shutdown)
    ));
    drop(handle);
    join.join().expect("the thread ends without a panic");
}

fn recover_limit() -> usize {
    crate::driver::MAX_RESTARTS
}
