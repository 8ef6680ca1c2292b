//! A small persistent thread pool for data-parallel kernels.
//!
//! [`ThreadPool::run`] splits `n` tasks over the workers and the calling thread, which claim
//! task indices from a shared counter (so a worker slowed by another process simply takes
//! fewer). Between jobs a worker spins only briefly, yielding its time slice, and then parks on
//! a condition variable: an idle or contended pool costs no CPU. `run` waits for the *tasks*,
//! not for the workers: a worker that the OS has not scheduled yet (another process is busy)
//! is simply not waited for — when it wakes it finds the job closed and goes back to sleep.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker (or the caller waiting for workers) polls before parking.
const SPIN: Duration = Duration::from_micros(50);

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped to publish a job; workers compare it with the last one they ran.
    generation: AtomicU64,
    job: UnsafeCell<Option<Job>>,
    tasks: AtomicUsize,
    next: AtomicUsize,
    /// Tasks of the current job that have finished.
    finished: AtomicUsize,
    /// Workers inside the current job (they hold the job pointer).
    active: AtomicUsize,
    /// Set once every task has finished: late workers must not enter.
    closed: AtomicBool,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers parked (or about to park) on `wake`: `run` takes the lock and notifies only
    /// when this is non-zero (a futex call per job saved while the workers are polling).
    sleepers: AtomicUsize,
    /// Whether `run`'s caller is parked (or about to park) on `done`: the last task notifies
    /// only then.
    waiting: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    done: Condvar,
}

// SAFETY: `job` is written only by the thread in `run` while no worker is inside a job
// (`active == 0` and the job `closed`); a worker reads it only after registering in `active`
// and checking (SeqCst) that the job is not closed, and leaves `active` when done with it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of worker threads (see the module docs).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes callers of `run` (the pool runs one job at a time).
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl ThreadPool {
    /// A pool running jobs on `threads` threads in all (the caller plus `threads - 1` workers).
    pub fn new(threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            closed: AtomicBool::new(true),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            waiting: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("sglrs-exec-{i}"))
                    .spawn(move || worker(&s))
                    .expect("spawning an executor thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// Threads that run a job (workers + the caller).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every `i in 0..n`, spread over the pool; returns when all are done.
    /// A panic in a task is re-raised here.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if self.workers.is_empty() || n == 1 {
            (0..n).for_each(f);
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: no worker is inside a job (the previous `run` closed it and waited for
        // `active == 0`); the lifetime is erased but the job is used only until it closes.
        unsafe {
            let job: Job = std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f);
            *s.job.get() = Some(job);
        }
        s.tasks.store(n, Ordering::Relaxed);
        s.next.store(0, Ordering::Relaxed);
        s.finished.store(0, Ordering::Relaxed);
        s.closed.store(false, Ordering::SeqCst);
        // Publish, then wake parked workers, if any. A worker registers in `sleepers` under
        // the lock before it checks `generation` and parks (both SeqCst, as here): either it
        // sees the new generation and does not park, or this load sees it and the notify
        // (under the lock, so after it parked) wakes it.
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        claim_tasks(s, f);
        // Wait for the tasks still running on workers: poll briefly, then park.
        let start = Instant::now();
        while s.finished.load(Ordering::Acquire) < n {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            // Same handshake as `sleepers`, with the last task's `finished` increment.
            let l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.waiting.store(true, Ordering::SeqCst);
            let _l = s
                .done
                .wait_while(l, |_| s.finished.load(Ordering::SeqCst) < n)
                .unwrap_or_else(|e| e.into_inner());
            s.waiting.store(false, Ordering::SeqCst);
        }
        // Close the job; wait for workers that entered it (they are running, not sleeping:
        // they only check for more tasks and leave).
        s.closed.store(true, Ordering::SeqCst);
        while s.active.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        // SAFETY: the job is closed and no worker holds it.
        unsafe { *s.job.get() = None };
        if s.panicked.swap(false, Ordering::AcqRel) {
            panic!("an executor worker task panicked");
        }
    }
}

fn claim_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync)) {
    let n = s.tasks.load(Ordering::Relaxed);
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).is_err() {
            s.panicked.store(true, Ordering::Release);
        }
        if s.finished.fetch_add(1, Ordering::SeqCst) + 1 == n && s.waiting.load(Ordering::SeqCst) {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.done.notify_all();
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Poll for the next job briefly (yielding), then park.
        let start = Instant::now();
        let mut gen = s.generation.load(Ordering::Acquire);
        while gen == seen && start.elapsed() < SPIN && !s.shutdown.load(Ordering::Acquire) {
            std::thread::yield_now();
            gen = s.generation.load(Ordering::Acquire);
        }
        if gen == seen {
            let l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let _l = s
                .wake
                .wait_while(l, |_| {
                    s.generation.load(Ordering::SeqCst) == seen
                        && !s.shutdown.load(Ordering::Acquire)
                })
                .unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            gen = s.generation.load(Ordering::Acquire);
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = gen;
        s.active.fetch_add(1, Ordering::SeqCst);
        if !s.closed.load(Ordering::SeqCst) && s.generation.load(Ordering::SeqCst) == gen {
            // SAFETY: registered in `active` while the job is open, so `run` keeps it alive.
            if let Some(job) = unsafe { *s.job.get() } {
                claim_tasks(s, unsafe { &*job });
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.shutdown.store(true, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once() {
        let pool = ThreadPool::new(3);
        for n in [0, 1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50));
        }
    }

    #[test]
    fn jobs_complete_when_workers_and_the_caller_park() {
        // Pauses longer than the polling window park the workers before the next job
        // (`sleepers`), slow tasks park the caller before the last one ends (`waiting`).
        let pool = ThreadPool::new(3);
        for round in 0..30 {
            std::thread::sleep(SPIN * 4);
            let hits: Vec<AtomicUsize> = (0..5).map(|_| AtomicUsize::new(0)).collect();
            pool.run(5, &|i| {
                if (i + round) % 3 == 0 {
                    std::thread::sleep(SPIN * 3);
                }
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn a_panicking_task_is_reported_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(4, &|i| assert!(i != 2, "task 2 fails"))
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }
}
