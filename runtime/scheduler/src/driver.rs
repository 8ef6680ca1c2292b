//! The scheduler thread: owns the executor and a [`SchedulerCore`], takes commands over a
//! crossbeam channel and sends each request's events to its own tokio channel.

use super::cache::CacheStats;
use super::core::{CoreStats, DisaggStats, ImportJob, SchedulerCore};
use super::hicache::{IoChannels, IoJob, TierStats};
use super::request::{
    panic_message, AbortReason, CachedTokens, FinishReason, KvImport, RequestId, SchedEvent,
    SchedRequest,
};
use super::SchedError;
use crossbeam::channel::{Receiver, Sender};
use sglrs_executor::Executor;
use sglrs_radix_cache::store::{PageStore, StoreStats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

mod queue;
mod recover;
use queue::{Interrupt, Queue};
#[cfg(test)]
pub(crate) use recover::MAX_RESTARTS;

/// Longest sleep of the scheduler thread while sequences wait and nothing runs.
const IDLE_POLL: Duration = Duration::from_millis(5);

/// A message to the scheduler thread.
pub enum Command {
    /// Queue a request; its events go to the sender.
    Submit(Box<SchedRequest>, mpsc::UnboundedSender<SchedEvent>),
    /// Queue several requests at once (each with its sender): they are all waiting before
    /// the next step is planned, so they are admitted together (e.g. a fork's branches).
    SubmitGroup(Vec<(Box<SchedRequest>, mpsc::UnboundedSender<SchedEvent>)>),
    /// Queue a request that found the queue (or its tenant's share) full but may take the
    /// place of a waiting request of its tenant with lower priority: the thread ends that
    /// one ([`AbortReason::Overloaded`]) and queues this one in its place, or, if there is
    /// none any more, ends this one the same way.
    Displace(Box<SchedRequest>, mpsc::UnboundedSender<SchedEvent>),
    /// Abort a request.
    Abort(RequestId),
    /// Drop the cache (device and host tiers) if idle; answers whether it did.
    Flush(oneshot::Sender<bool>),
    /// Finish every cache copy in flight and write the host tier's pages to disk (a clean
    /// shutdown); answers with the error if the flush failed.
    Drain(oneshot::Sender<Result<(), String>>),
    /// Delete the disk tier's pages (`/clear_hicache_storage_backend`); answers whether
    /// there was a disk tier to clear, or the error.
    ClearStorage(oneshot::Sender<Result<bool, String>>),
    /// Decode host: an import's pages are written (`Ok`, with the prefill host's data) or
    /// it failed (`Err`, the reason).
    KvImported(RequestId, Result<KvImport, String>),
}

/// Decode host: starts filling an [`ImportJob`]'s pages with the prompt's KV from the
/// prefill host (the server's transfer endpoint). Called on the scheduler thread: it must
/// not block. Whatever happens, it must end with exactly one
/// [`SchedulerHandle::kv_imported`] for the job's request, after its last write into the
/// job's pages (the pages stay reserved until then).
pub trait KvImporter: Send + Sync {
    /// Starts the import.
    fn start(&self, job: ImportJob);
}

/// Longest wait for cache copies in flight before a flush or shutdown goes ahead without
/// them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A snapshot of the scheduler for `/metrics` and `/get_server_info`, refreshed every step.
#[derive(Clone, Debug, Default)]
pub struct DriverStats {
    /// Sequences waiting.
    pub waiting: usize,
    /// Sequences running.
    pub running: usize,
    /// Core counters.
    pub core: CoreStats,
    /// Page accounting.
    pub cache: CacheStats,
    /// Forward passes run.
    pub steps: u64,
    /// Tokens run through the model.
    pub forward_tokens: u64,
    /// Seconds spent in forward passes.
    pub forward_seconds: f64,
    /// Of the forward passes, those stopped between layers for a newcomer of much higher
    /// priority (they produced nothing and ran again).
    pub interrupted_passes: u64,
    /// Times the scheduler recovered from a panic outside one request's work (every request
    /// in flight then ended with an error, and the cache started empty).
    pub scheduler_restarts: u64,
    /// Lower cache tiers: the scheduler's counters.
    pub tiers: Option<TierStats>,
    /// Lower cache tiers: the store's counters and occupancy.
    pub store: Option<StoreStats>,
    /// Prefill/decode disaggregation counters.
    pub disagg: DisaggStats,
}

/// The server's handle on the scheduler thread.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: Sender<Command>,
    stats: Arc<Mutex<DriverStats>>,
    /// The lower tiers' store, read live by [`SchedulerHandle::stats`].
    store: Option<Arc<PageStore>>,
    queue: Arc<Queue>,
    alive: Arc<AtomicBool>,
    interrupt: Arc<Interrupt>,
}

impl SchedulerHandle {
    /// Queues a request; events arrive on the returned receiver until `Finished` for every
    /// sample. Dropping the receiver aborts the request. Refused at once, without queueing,
    /// with [`SchedError::Overloaded`] when [`SchedulerConfig::max_queued`] requests are
    /// already waiting, unless one of them (of the same tenant) has a lower priority: then
    /// this request takes its place and that one ends with [`AbortReason::Overloaded`]
    /// (as does this one, should the other have been admitted meanwhile).
    ///
    /// [`SchedulerConfig::max_queued`]: crate::SchedulerConfig::max_queued
    pub fn submit(
        &self,
        req: SchedRequest,
    ) -> Result<mpsc::UnboundedReceiver<SchedEvent>, SchedError> {
        let tenant = [req.tenant];
        let (who, priority) = (req.tenant, req.priority);
        let (tx, rx) = mpsc::unbounded_channel();
        if let Err(full) = self.queue.reserve(&tenant) {
            if !self.queue.may_displace(req.tenant, req.priority) {
                return Err(full);
            }
            self.tx
                .send(Command::Displace(Box::new(req), tx))
                .map_err(|_| SchedError::Shutdown)?;
        } else {
            self.tx
                .send(Command::Submit(Box::new(req), tx))
                .map_err(|_| {
                    self.queue.release(&tenant);
                    SchedError::Shutdown
                })?;
        }
        self.interrupt.arrived(who, priority);
        Ok(rx)
    }

    /// Queues several requests in one message, so that the scheduler takes them in the same
    /// step (a fork's branches prefill and decode as one batch from their first step).
    /// Receivers in request order; each behaves as [`SchedulerHandle::submit`]'s. All or
    /// nothing: the group is refused when the queue has no room for every one of them.
    pub fn submit_group(
        &self,
        reqs: Vec<SchedRequest>,
    ) -> Result<Vec<mpsc::UnboundedReceiver<SchedEvent>>, SchedError> {
        let k = reqs.len();
        let tenants: Vec<u64> = reqs.iter().map(|r| r.tenant).collect();
        let priorities: Vec<(u64, i64)> = reqs.iter().map(|r| (r.tenant, r.priority)).collect();
        self.queue.reserve(&tenants)?;
        let mut items = Vec::with_capacity(k);
        let mut rxs = Vec::with_capacity(k);
        for req in reqs {
            let (tx, rx) = mpsc::unbounded_channel();
            items.push((Box::new(req), tx));
            rxs.push(rx);
        }
        self.tx.send(Command::SubmitGroup(items)).map_err(|_| {
            self.queue.release(&tenants);
            SchedError::Shutdown
        })?;
        for (tenant, priority) in priorities {
            self.interrupt.arrived(tenant, priority);
        }
        Ok(rxs)
    }

    /// Requests submitted and not yet admitted (places taken in the bounded queue).
    pub fn queued(&self) -> usize {
        self.queue.queued.load(Ordering::Acquire)
    }

    /// The queue's bound ([`SchedulerConfig::max_queued`]).
    ///
    /// [`SchedulerConfig::max_queued`]: crate::SchedulerConfig::max_queued
    pub fn max_queued(&self) -> usize {
        self.queue.limit
    }

    /// Aborts a request (no error if it already finished).
    pub fn abort(&self, id: RequestId) -> Result<(), SchedError> {
        self.tx
            .send(Command::Abort(id))
            .map_err(|_| SchedError::Shutdown)
    }

    /// Flushes the cache; `Ok(false)` when requests are in flight.
    pub async fn flush(&self) -> Result<bool, SchedError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Flush(tx))
            .map_err(|_| SchedError::Shutdown)?;
        rx.await.map_err(|_| SchedError::Shutdown)
    }

    /// Finishes the cache copies in flight and writes the host tier to disk (call before
    /// exiting, so a restart finds every page).
    pub async fn drain(&self) -> Result<(), SchedError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Drain(tx))
            .map_err(|_| SchedError::Shutdown)?;
        rx.await
            .map_err(|_| SchedError::Shutdown)?
            .map_err(SchedError::Config)
    }

    /// Deletes the disk tier's pages; `Ok(false)` without a disk tier.
    pub async fn clear_storage(&self) -> Result<bool, SchedError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::ClearStorage(tx))
            .map_err(|_| SchedError::Shutdown)?;
        rx.await
            .map_err(|_| SchedError::Shutdown)?
            .map_err(SchedError::Config)
    }

    /// Decode host: reports an import's end (see [`KvImporter`]).
    pub fn kv_imported(&self, id: RequestId, result: Result<KvImport, String>) {
        // A stopped scheduler has nothing left to release.
        let _ = self.tx.send(Command::KvImported(id, result));
    }

    /// False once the scheduler thread has stopped (after a panic it could not recover
    /// from, see `driver/recover.rs`, or when every handle is gone): submits then fail with
    /// [`SchedError::Shutdown`].
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// The latest snapshot (the lower tiers' store counters as they are now).
    pub fn stats(&self) -> DriverStats {
        let mut s = match self.stats.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        if let Some(store) = &self.store {
            s.store = Some(store.stats());
        }
        s
    }
}

/// Starts the scheduler thread.
pub fn spawn(
    core: SchedulerCore,
    exec: Box<dyn Executor>,
) -> Result<(SchedulerHandle, std::thread::JoinHandle<()>), SchedError> {
    spawn_with(core, exec, None)
}

/// Starts the scheduler thread with a decode host's [`KvImporter`] (without one, requests
/// marked [`crate::Disagg::Import`] fail at admission).
pub fn spawn_with(
    core: SchedulerCore,
    mut exec: Box<dyn Executor>,
    importer: Option<Arc<dyn KvImporter>>,
) -> Result<(SchedulerHandle, std::thread::JoinHandle<()>), SchedError> {
    let interrupt = Arc::new(Interrupt::default());
    if core.config().priority_preemption.is_some() {
        exec.set_interrupt(interrupt.flag.clone());
    }
    let int = interrupt.clone();
    let (tx, rx) = crossbeam::channel::unbounded();
    let stats = Arc::new(Mutex::new(DriverStats::default()));
    let st = stats.clone();
    let queue = Arc::new(Queue::new(
        core.config().max_queued,
        core.config().max_queued_per_tenant,
    ));
    let q = queue.clone();
    let alive = Arc::new(AtomicBool::new(true));
    let dead_on_exit = Stopped(alive.clone());
    let (io, store) = match core.hicache() {
        None => (None, None),
        Some(h) => {
            let page_io = exec.page_io().ok_or_else(|| {
                SchedError::Config(
                    "this executor cannot copy pages off its thread, so it has no lower cache tiers"
                        .into(),
                )
            })?;
            let io = super::hicache::spawn_io(page_io, h).map_err(|e| {
                SchedError::Config(format!("cannot start the cache I/O thread: {e}"))
            })?;
            (Some(io), Some(h.store.clone()))
        }
    };
    if core.config().kv_events.is_some() {
        if let Some(s) = &store {
            s.record_events();
        }
    }
    let live_store = store.clone();
    let join = std::thread::Builder::new()
        .name("sglrs-scheduler".into())
        .spawn(move || {
            let _stopped = dead_on_exit;
            Driver {
                core,
                exec,
                rx,
                senders: HashMap::new(),
                queue: q,
                queued: HashMap::new(),
                queued_changed: false,
                stats: st,
                totals: Totals::default(),
                trace: std::env::var_os("SGLRS_TRACE_STEPS").map(|_| Instant::now()),
                io,
                store,
                importer,
                interrupt: int,
                interrupted_last: false,
                pool_io_in_flight: 0,
                imports_in_flight: 0,
                restarts: Vec::new(),
                replay: Vec::new(),
            }
            .run()
        })
        .map_err(|e| SchedError::Config(format!("cannot start the scheduler thread: {e}")))?;
    Ok((
        SchedulerHandle {
            tx,
            stats,
            store: live_store,
            queue,
            alive,
            interrupt,
        },
        join,
    ))
}

/// Clears the handle's `alive` flag when the scheduler thread ends, however it ends.
struct Stopped(Arc<AtomicBool>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[derive(Default)]
struct Totals {
    /// Passes stopped for a newcomer of higher priority (also counted in `steps`).
    interrupted: u64,
    /// Recoveries from a panic outside the per-request guards.
    restarts: u64,
    steps: u64,
    tokens: u64,
    seconds: f64,
}

struct Driver {
    core: SchedulerCore,
    exec: Box<dyn Executor>,
    rx: Receiver<Command>,
    /// Per request: its event channel and which samples have finished.
    senders: HashMap<RequestId, (mpsc::UnboundedSender<SchedEvent>, Vec<bool>)>,
    /// The handle's bounded queue, and the requests holding a place in it (tenant,
    /// priority); `queued_changed` when the lowest priorities are to be published again.
    queue: Arc<Queue>,
    queued: HashMap<RequestId, (u64, i64)>,
    queued_changed: bool,
    stats: Arc<Mutex<DriverStats>>,
    totals: Totals,
    /// With `SGLRS_TRACE_STEPS` set: when the thread started; every submit and forward
    /// pass is then printed to stderr with its time since then.
    trace: Option<Instant>,
    /// The cache I/O thread's channels (with lower cache tiers).
    io: Option<IoChannels>,
    /// The lower tiers' store.
    store: Option<Arc<PageStore>>,
    /// Decode host: fills imported pages.
    importer: Option<Arc<dyn KvImporter>>,
    /// Stops a pass for a newcomer of much higher priority.
    interrupt: Arc<Interrupt>,
    /// The last pass was interrupted (this one may not be).
    interrupted_last: bool,
    /// Loads into and writes out of the pool's pages the I/O thread has not finished.
    pool_io_in_flight: usize,
    /// Decode imports started and not yet reported ([`Command::KvImported`]).
    imports_in_flight: usize,
    /// When the thread recovered from a panic (`driver/recover.rs`).
    restarts: Vec<Instant>,
    /// Commands set aside while recovering, served first when serving resumes.
    replay: Vec<Command>,
}

impl Driver {
    /// Publishes the pass's preemption bars (a newcomer above one stops it), none after an
    /// interrupted pass. Until then the last pass's bars stand, so a newcomer that arrives
    /// while this pass is planned (too late for its plan) stops it before its first layer.
    fn arm_interrupt(&mut self, plan: &super::core::PlannedBatch) {
        if self.core.config().priority_preemption.is_none() {
            return;
        }
        let bars = if self.interrupted_last {
            HashMap::new()
        } else {
            self.core.preemption_bars(plan)
        };
        *self.interrupt.bars() = bars;
        if self.interrupted_last {
            self.interrupt.flag.store(false, Ordering::Release);
        }
    }

    /// One line per forward pass under `SGLRS_TRACE_STEPS`: end time, duration,
    /// `request:tokens` per sequence (`request:tokens+drafted`), and the drafted and accepted
    /// token counts so far.
    fn trace_step(&self, start: Instant, plan: &super::core::PlannedBatch) {
        let Some(t0) = self.trace else {
            return;
        };
        let items: Vec<String> = plan
            .items
            .iter()
            .map(|it| match it.draft {
                0 => format!("{}:{}", it.key.0, it.tokens.len()),
                d => format!("{}:{}+{d}", it.key.0, it.tokens.len() - d),
            })
            .collect();
        let st = self.core.stats();
        eprintln!(
            "step {:.4} s: {:.2} ms, {} (drafted {}, accepted {} so far)",
            t0.elapsed().as_secs_f64(),
            start.elapsed().as_secs_f64() * 1e3,
            items.join(" "),
            st.spec_draft_tokens,
            st.spec_accepted_tokens,
        );
    }

    /// Serves until every handle is gone. A panic that escapes the per-request guards (in
    /// planning, the cache) leaves the core in no state to trust: every request in flight
    /// then ends with [`AbortReason::Internal`] instead of hanging, and the thread goes on
    /// with a fresh core (`driver/recover.rs`), or, when it cannot, stops, so later submits
    /// fail at once ([`SchedulerHandle::is_alive`]).
    fn run(mut self) {
        loop {
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
            let Err(payload) = served else {
                return;
            };
            self.fail_all(&panic_message(payload.as_ref()));
            if !self.recover() {
                return;
            }
        }
    }

    /// Ends every request in flight after a panic: the events already produced are sent,
    /// then a `Finished` with [`AbortReason::Internal`] for each sample still open.
    fn fail_all(&mut self, message: &str) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.route_events()));
        let reason = AbortReason::Internal(format!("the scheduler failed: {message}"));
        for (id, (tx, done)) in self.senders.drain() {
            for (sample, _) in done.iter().enumerate().filter(|(_, d)| !**d) {
                let _ = tx.send(SchedEvent::Finished {
                    id,
                    sample,
                    reason: FinishReason::Abort(reason.clone()),
                    prompt_tokens: 0,
                    completion_tokens: 0,
                    cached: CachedTokens::default(),
                });
            }
        }
    }

    fn serve(&mut self) {
        for cmd in std::mem::take(&mut self.replay) {
            self.command(cmd);
        }
        loop {
            // Commands taken from here on are in the next plan: a newcomer that raised the
            // flag before is in it already.
            self.interrupt.flag.store(false, Ordering::Release);
            self.pump_io();
            if self.core.is_idle() {
                self.settle_queue();
                self.publish();
                self.emit_kv_events();
                self.interrupt.bars().clear();
                match self.wait(None) {
                    Ok(Some(cmd)) => self.command(cmd),
                    Ok(None) => continue,
                    Err(()) => {
                        self.shutdown_tiers();
                        return;
                    }
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(crossbeam::channel::TryRecvError::Empty) => break,
                    Err(crossbeam::channel::TryRecvError::Disconnected) => {
                        if self.core.is_idle() {
                            self.shutdown_tiers();
                            return;
                        }
                        break;
                    }
                }
            }
            self.reap_disconnected();
            self.pump_io();
            let now = Instant::now();
            let planned = self.core.poll_batch(now);
            self.start_imports();
            self.write_back_evicted();
            self.pump_io();
            // Admission happened in `poll_batch`: free those places before the pass runs.
            self.settle_queue();
            match planned {
                Some(plan) => {
                    self.arm_interrupt(&plan);
                    let t = Instant::now();
                    // A pass that panics (a kernel bug an input triggers) ends the requests
                    // of its batch, as a failed pass does, and the server goes on: their
                    // pages written in it are their own and are not kept.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.exec.forward(&plan.batch())
                    }));
                    self.interrupted_last =
                        matches!(result, Ok(Err(sglrs_executor::ExecError::Interrupted)));
                    self.trace_step(t, &plan);
                    self.totals.seconds += t.elapsed().as_secs_f64();
                    self.totals.steps += 1;
                    if !self.interrupted_last {
                        self.totals.tokens += plan.num_tokens() as u64;
                    }
                    match result {
                        Ok(Ok(logits)) => self.core.handle_forward(plan, &logits, Instant::now()),
                        // Nothing ran: the plan's sequences keep their pages and state and
                        // are planned again next, with the newcomer that stopped the pass.
                        Ok(Err(sglrs_executor::ExecError::Interrupted)) => {
                            self.totals.interrupted += 1
                        }
                        Ok(Err(e)) => self.core.handle_forward_error(plan, &e.to_string()),
                        Err(payload) => self.core.handle_forward_error(
                            plan,
                            &format!(
                                "the forward pass panicked: {}",
                                panic_message(payload.as_ref())
                            ),
                        ),
                    }
                }
                None => {
                    // Waiting requests that cannot be admitted yet (memory, loads from a
                    // lower tier, or admission waiting for more arrivals until a
                    // deadline); do not spin.
                    if !self.core.is_idle() {
                        let now = Instant::now();
                        let wait = self
                            .core
                            .admission_deadline(now)
                            .map_or(IDLE_POLL, |d| d.saturating_duration_since(now))
                            .min(IDLE_POLL);
                        if let Ok(Some(cmd)) = self.wait(Some(wait)) {
                            self.command(cmd);
                        }
                    }
                }
            }
            self.route_events();
            self.settle_queue();
            self.publish();
            self.emit_kv_events();
        }
    }

    /// Hands the step's KV events to the sink.
    fn emit_kv_events(&mut self) {
        let Some(sink) = self
            .core
            .config()
            .kv_events
            .as_ref()
            .map(|k| k.sink.clone())
        else {
            return;
        };
        let device = self.core.drain_kv_events();
        let tiers = self
            .store
            .as_ref()
            .map(|s| s.drain_events())
            .unwrap_or_default();
        if !device.is_empty() || !tiers.is_empty() {
            sink.publish(device, tiers);
        }
    }

    /// Waits for a command, handling cache copies that finish meanwhile: `Ok(Some)` a
    /// command, `Ok(None)` a copy finished or the wait timed out, `Err` every handle is gone.
    fn wait(&mut self, timeout: Option<Duration>) -> Result<Option<Command>, ()> {
        let Some(io) = &self.io else {
            return match timeout {
                None => self.rx.recv().map(Some).map_err(|_| ()),
                Some(t) => match self.rx.recv_timeout(t) {
                    Ok(c) => Ok(Some(c)),
                    Err(crossbeam::channel::RecvTimeoutError::Timeout) => Ok(None),
                    Err(crossbeam::channel::RecvTimeoutError::Disconnected) => Err(()),
                },
            };
        };
        let done = io.done.clone();
        let never = crossbeam::channel::never();
        let deadline = timeout.map_or(never, crossbeam::channel::after);
        crossbeam::select! {
            recv(self.rx) -> c => c.map(Some).map_err(|_| ()),
            recv(done) -> d => {
                if let Ok(d) = d {
                    self.pool_io_in_flight -= usize::from(recover::touches_pool_done(&d));
                    self.core.handle_io_done(d);
                }
                self.pump_io();
                Ok(None)
            }
            recv(deadline) -> _ => Ok(None),
        }
    }

    /// Hands finished copies to the core and its new copy jobs to the I/O thread.
    fn pump_io(&mut self) {
        let Some(io) = &self.io else {
            return;
        };
        while let Ok(d) = io.done.try_recv() {
            self.pool_io_in_flight -= usize::from(recover::touches_pool_done(&d));
            self.core.handle_io_done(d);
        }
        while let Some(job) = self.core.poll_io() {
            self.pool_io_in_flight += usize::from(recover::touches_pool_job(&job));
            let tx = match job {
                IoJob::Load { .. } => &io.loads,
                _ => &io.background,
            };
            // The I/O thread ends only when these senders are dropped.
            let _ = tx.send(job);
        }
    }

    /// Write-back: copies the pages the last planning evicted out of the pool (before the
    /// pass that may reuse them runs), skipping those the store holds; the I/O thread stores
    /// the copies. This copy is on the scheduler thread: the pass must wait for it.
    fn write_back_evicted(&mut self) {
        let evicted = self.core.take_demoted();
        if evicted.is_empty() {
            return;
        }
        let Some(store) = &self.store else { return };
        let hashes: Vec<_> = evicted.iter().map(|(h, _)| *h).collect();
        let have = store.contains_each(&hashes);
        let page_bytes = self.exec.kv_layout().page_bytes();
        let mut copies = Vec::new();
        for ((h, page), have) in evicted.into_iter().zip(have) {
            if have {
                continue;
            }
            let mut buf = vec![0u8; page_bytes];
            if self.exec.read_pages(&[page], &mut buf).is_ok() {
                copies.push((h, bytes::Bytes::from(buf)));
            }
        }
        self.core.store_copies(copies);
    }

    /// Lets every cache copy in flight finish (at most [`DRAIN_TIMEOUT`]).
    fn drain_io(&mut self) {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        self.pump_io();
        while self.core.io_pending() {
            let Some(io) = &self.io else { return };
            let left = deadline.saturating_duration_since(Instant::now());
            match io.done.recv_timeout(left) {
                Ok(d) => {
                    self.pool_io_in_flight -= usize::from(recover::touches_pool_done(&d));
                    self.core.handle_io_done(d)
                }
                Err(_) => return,
            }
            self.pump_io();
        }
    }

    /// Before the thread ends: finish copies, write the host tier down to disk.
    fn shutdown_tiers(&mut self) {
        if self.store.is_none() {
            return;
        }
        self.drain_io();
        if let Some(store) = &self.store {
            let _ = store.flush();
        }
    }

    /// Gives back the queue places of requests admitted or ended since the last call.
    fn settle_queue(&mut self) {
        let core = &self.core;
        let mut left = Vec::new();
        self.queued.retain(|id, (tenant, _)| {
            let still = core.is_queued(*id);
            if !still {
                left.push(*tenant);
            }
            still
        });
        if !left.is_empty() {
            self.queue.release(&left);
            self.queued_changed = true;
        }
        if std::mem::take(&mut self.queued_changed) {
            let mut lowest: HashMap<u64, i64> = HashMap::new();
            for &(tenant, priority) in self.queued.values() {
                let p = lowest.entry(tenant).or_insert(priority);
                *p = (*p).min(priority);
            }
            *self.queue.lowest.lock().unwrap_or_else(|p| p.into_inner()) = lowest;
        }
    }

    /// [`Command::Displace`]: the waiting request of `req`'s tenant with the lowest
    /// priority below `req`'s (the newest among equals) ends, and `req` takes its place.
    fn displace(&mut self, req: Box<SchedRequest>, tx: mpsc::UnboundedSender<SchedEvent>) {
        let core = &self.core;
        let victim = self
            .queued
            .iter()
            .filter(|(id, (t, p))| *t == req.tenant && *p < req.priority && core.is_queued(**id))
            .min_by_key(|(id, (_, p))| (*p, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id);
        let Some(victim) = victim else {
            let reason = AbortReason::Overloaded(format!(
                "the server is overloaded: {} requests are already waiting; retry later",
                self.queue.limit
            ));
            for sample in 0..req.n.max(1) {
                let _ = tx.send(SchedEvent::Finished {
                    id: req.id,
                    sample,
                    reason: FinishReason::Abort(reason.clone()),
                    prompt_tokens: req.input_ids.len(),
                    completion_tokens: 0,
                    cached: CachedTokens::default(),
                });
            }
            return;
        };
        self.core.handle_abort(
            victim,
            AbortReason::Overloaded(format!(
                "the waiting queue is full and a request of higher priority ({}) took this \
                 request's place; retry later",
                req.priority
            )),
        );
        // The victim's place, handed over: it is given back for the victim just below.
        self.queue.take(req.tenant);
        self.command(Command::Submit(req, tx));
        self.route_events();
        self.settle_queue();
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(req, tx) => {
                if let Some(t0) = self.trace {
                    eprintln!(
                        "submit {:.4} s: request {}",
                        t0.elapsed().as_secs_f64(),
                        req.id
                    );
                }
                let n = req.n.max(1);
                self.senders.insert(req.id, (tx, vec![false; n]));
                self.queued.insert(req.id, (req.tenant, req.priority));
                self.queued_changed = true;
                self.core.handle_request(*req, Instant::now());
            }
            Command::SubmitGroup(items) => {
                for (req, tx) in items {
                    self.command(Command::Submit(req, tx));
                }
            }
            Command::Displace(req, tx) => self.displace(req, tx),
            Command::Abort(id) => {
                self.core.handle_abort(id, AbortReason::Requested);
                self.route_events();
            }
            Command::Flush(reply) => {
                if self.core.is_idle() {
                    self.drain_io();
                }
                let flushed = self.core.handle_flush();
                if flushed {
                    if let Some(store) = &self.store {
                        // Host pages not on disk yet go there first: a flush keeps what a
                        // restart would serve.
                        let _ = store.clear_ram();
                    }
                }
                // The snapshot shows the flush before the caller hears of it.
                self.publish();
                let _ = reply.send(flushed);
            }
            Command::Drain(reply) => {
                self.drain_io();
                let r = match &self.store {
                    Some(store) => store.flush().map_err(|e| format!("cache flush: {e}")),
                    None => Ok(()),
                };
                let _ = reply.send(r);
            }
            Command::KvImported(id, result) => {
                self.imports_in_flight = self.imports_in_flight.saturating_sub(1);
                self.core.handle_kv_imported(id, result);
                self.route_events();
            }
            Command::ClearStorage(reply) => {
                let r = match &self.store {
                    Some(store) if store.has_disk() => store
                        .clear_disk()
                        .map(|()| true)
                        .map_err(|e| format!("clearing the disk tier: {e}")),
                    _ => Ok(false),
                };
                self.publish();
                let _ = reply.send(r);
            }
        }
    }

    /// Aborts requests whose receiver is gone (the client disconnected).
    fn reap_disconnected(&mut self) {
        let gone: Vec<RequestId> = self
            .senders
            .iter()
            .filter(|(_, (tx, _))| tx.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.core.handle_abort(id, AbortReason::ClientDisconnected);
        }
        if !self.senders.is_empty() {
            self.route_events();
        }
    }

    /// Decode host: hands the imports admission started to the importer.
    fn start_imports(&mut self) {
        while let Some(job) = self.core.poll_import() {
            match &self.importer {
                Some(imp) => {
                    self.imports_in_flight += 1;
                    imp.start(job)
                }
                None => self.core.handle_kv_imported(
                    job.id,
                    Err("this server has no KV transfer endpoint (not a decode server)".into()),
                ),
            }
        }
    }

    /// Prefill host: copies the prompt pages of the prefills that just ended out of the pool
    /// (before the next pass may reuse a freed page) and sends them to their requests. The
    /// copies are in the raw order (`POOL_PAGE_FORMAT`: no transpose on either
    /// host; the decode host checks the format).
    fn export_pages(&mut self) {
        for job in self.core.take_exports() {
            let pb = self.exec.kv_layout().page_bytes();
            let mut buf = vec![0u8; pb * job.pages.len()];
            let read = match self.exec.page_io() {
                // SAFETY: on the scheduler thread between forward passes: nothing writes
                // the pool now.
                Some(io) => {
                    unsafe { io.read_pages_raw(&job.pages, &mut buf) }.map_err(|e| e.to_string())
                }
                None => Err("this executor cannot copy its pages out raw".to_string()),
            };
            let pages = read
                .map(|()| {
                    let all = bytes::Bytes::from(buf);
                    (0..job.pages.len())
                        .map(|i| all.slice(i * pb..(i + 1) * pb))
                        .collect()
                })
                .map_err(|e| format!("reading the prompt's pages: {e}"));
            if let Some((tx, _)) = self.senders.get(&job.id) {
                let _ = tx.send(SchedEvent::KvExport {
                    id: job.id,
                    pages,
                    rng_position: job.rng_position,
                });
            }
        }
    }

    fn route_events(&mut self) {
        self.export_pages();
        while let Some(ev) = self.core.poll_event() {
            let id = ev.id();
            let finished = match &ev {
                SchedEvent::Finished { sample, .. } => Some(*sample),
                _ => None,
            };
            let Some((tx, done)) = self.senders.get_mut(&id) else {
                continue;
            };
            let closed = tx.send(ev).is_err();
            if let Some(sample) = finished {
                if let Some(d) = done.get_mut(sample) {
                    *d = true;
                }
                if done.iter().all(|d| *d) {
                    self.senders.remove(&id);
                    continue;
                }
            }
            if closed {
                self.core.handle_abort(id, AbortReason::ClientDisconnected);
            }
        }
    }

    fn publish(&self) {
        let snap = DriverStats {
            waiting: self.core.num_waiting(),
            running: self.core.num_running(),
            core: self.core.stats().clone(),
            cache: self.core.cache_stats(),
            steps: self.totals.steps,
            forward_tokens: self.totals.tokens,
            forward_seconds: self.totals.seconds,
            interrupted_passes: self.totals.interrupted,
            scheduler_restarts: self.totals.restarts,
            tiers: self.core.tier_stats(),
            store: self.store.as_ref().map(|s| s.stats()),
            disagg: self.core.disagg_stats().clone(),
        };
        if let Ok(mut s) = self.stats.lock() {
            *s = snap;
        }
    }
}
