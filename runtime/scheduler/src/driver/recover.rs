//! Recovery from a panic outside the per-request guards (in planning or the radix cache).
//!
//! Such a panic leaves the core in no state to trust, so every request in flight has
//! already ended with an explicit error ([`Driver::fail_all`]). The thread then waits until
//! nothing outside it touches the KV pool — the cache I/O thread's loads into pages and
//! writes out of them, decode imports filling pages — setting aside the commands that
//! arrive meanwhile, replaces the core with a fresh one over the same pool (empty radix
//! tree, every page free; the lower tiers' store keeps its pages, the counters carry on),
//! tells KV-event subscribers the device cache was cleared, and serves the commands it set
//! aside. A thread that cannot get there within [`DRAIN_TIMEOUT`], or that has already
//! recovered [`MAX_RESTARTS`] times within [`RESTART_WINDOW`] (a fault that keeps coming
//! back), stops as before: later submits fail and `/health` turns 503.

use super::{Command, Driver, DRAIN_TIMEOUT};
use crate::hicache::{IoDone, IoJob};
use std::time::{Duration, Instant};

/// Most recoveries within [`RESTART_WINDOW`] before the thread stops for good.
pub(crate) const MAX_RESTARTS: usize = 3;
/// See [`MAX_RESTARTS`].
pub(super) const RESTART_WINDOW: Duration = Duration::from_secs(600);

/// Copies in flight that touch the pool's pages (loads write into them, writes read them).
pub(super) fn touches_pool_job(job: &IoJob) -> bool {
    matches!(job, IoJob::Load { .. } | IoJob::Write { .. })
}

/// The completion of a [`touches_pool_job`] job.
pub(super) fn touches_pool_done(done: &IoDone) -> bool {
    matches!(done, IoDone::Loaded { .. } | IoDone::Written { .. })
}

impl Driver {
    /// After [`Driver::fail_all`]: quiesces, swaps in a fresh core, and returns true to
    /// serve on; false when the thread must stop (see the module docs).
    pub(super) fn recover(&mut self) -> bool {
        let now = Instant::now();
        self.restarts
            .retain(|t| now.duration_since(*t) < RESTART_WINDOW);
        if self.restarts.len() >= MAX_RESTARTS {
            return false;
        }
        let fresh = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.core.rebuilt()));
        let Ok(Ok(fresh)) = fresh else {
            return false;
        };
        let deadline = now + DRAIN_TIMEOUT;
        let never = crossbeam::channel::never();
        while self.pool_io_in_flight > 0 || self.imports_in_flight > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let done = self.io.as_ref().map_or(never.clone(), |io| io.done.clone());
            crossbeam::select! {
                recv(done) -> d => match d {
                    Ok(d) if touches_pool_done(&d) => self.pool_io_in_flight -= 1,
                    Ok(_) => {}
                    // The I/O thread is gone: it touches nothing any more.
                    Err(_) => self.pool_io_in_flight = 0,
                },
                recv(self.rx) -> c => match c {
                    Ok(Command::KvImported(..)) => {
                        self.imports_in_flight = self.imports_in_flight.saturating_sub(1)
                    }
                    Ok(other) => self.replay.push(other),
                    Err(_) => return false,
                },
                recv(crossbeam::channel::after(left)) -> _ => return false,
            }
        }
        // The old core's waiting requests ended in `fail_all`: their places are free.
        let tenants: Vec<u64> = self.queued.drain().map(|(_, (t, _))| t).collect();
        self.queue.release(&tenants);
        self.queued_changed = true;
        self.core = fresh;
        self.interrupt.bars().clear();
        self.interrupted_last = false;
        if let Some(k) = &self.core.config().kv_events {
            k.sink
                .publish(vec![crate::kv_events::KvEvent::AllCleared], Vec::new());
        }
        self.restarts.push(now);
        self.totals.restarts += 1;
        self.settle_queue();
        self.publish();
        true
    }
}
