//! The grammar cache: compiles on background threads, never blocks the decoding caller.
//!
//! Compiled grammars are kept by (spec, options), least recently used dropped first. A
//! failed compile leaves them and is remembered apart, for [`CacheConfig::failure_ttl`]: a
//! client retrying a bad grammar gets the same error at once instead of occupying a
//! compiler thread again, the failures do not hold entries of the compiled grammars, and
//! none is kept forever (a timeout under load may pass later).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::{CompileError, CompileOptions, CompiledGrammar, GrammarSpec, TokenVocab};

/// Limits of a [`GrammarCache`].
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Compiler threads.
    pub workers: usize,
    /// Entries kept (least recently used are dropped first).
    pub max_entries: usize,
    /// Approximate bytes kept across all compiled grammars (their masks included).
    pub max_bytes: usize,
    /// How long a failed compile is remembered: the same grammar under the same options
    /// asked again within this time gets the same error without being compiled again.
    pub failure_ttl: Duration,
    /// Failed compiles remembered (the oldest are forgotten first).
    pub max_failures: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            workers: 1,
            max_entries: 512,
            max_bytes: 1 << 30,
            failure_ttl: Duration::from_secs(60),
            max_failures: 256,
        }
    }
}

/// Where a compilation stands.
#[derive(Clone, Debug)]
pub enum HandleState {
    /// Still compiling (or queued).
    Pending,
    /// Compiled.
    Ready(Arc<CompiledGrammar>),
    /// Failed; the error names what could not be honoured.
    Failed(CompileError),
}

#[derive(Debug)]
struct Slot {
    state: Mutex<HandleState>,
    cv: Condvar,
}

impl Slot {
    fn new(state: HandleState) -> Arc<Slot> {
        Arc::new(Slot {
            state: Mutex::new(state),
            cv: Condvar::new(),
        })
    }
}

/// A ticket for one grammar: poll it from the decode loop, or wait on it elsewhere.
#[derive(Clone, Debug)]
pub struct Handle {
    slot: Arc<Slot>,
}

impl Handle {
    /// The current state (never blocks beyond a short lock).
    pub fn poll(&self) -> HandleState {
        self.slot
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `None` while compiling, else the result.
    pub fn try_get(&self) -> Option<Result<Arc<CompiledGrammar>, CompileError>> {
        match self.poll() {
            HandleState::Pending => None,
            HandleState::Ready(g) => Some(Ok(g)),
            HandleState::Failed(e) => Some(Err(e)),
        }
    }

    /// Blocks until compiled (not for the decoding thread).
    pub fn wait(&self) -> Result<Arc<CompiledGrammar>, CompileError> {
        let mut st = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match &*st {
                HandleState::Pending => {
                    st = self.slot.cv.wait(st).unwrap_or_else(|e| e.into_inner())
                }
                HandleState::Ready(g) => return Ok(g.clone()),
                HandleState::Failed(e) => return Err(e.clone()),
            }
        }
    }

    /// Like [`Handle::wait`] with a limit; `None` on time-out.
    pub fn wait_timeout(&self, t: Duration) -> Option<Result<Arc<CompiledGrammar>, CompileError>> {
        let st = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        let (st, _) = self
            .slot
            .cv
            .wait_timeout_while(st, t, |s| matches!(s, HandleState::Pending))
            .unwrap_or_else(|e| e.into_inner());
        match &*st {
            HandleState::Pending => None,
            HandleState::Ready(g) => Some(Ok(g.clone())),
            HandleState::Failed(e) => Some(Err(e.clone())),
        }
    }
}

type Key = (GrammarSpec, CompileOptions);
type Job = (Key, Arc<Slot>);

#[derive(Debug)]
struct Inner {
    /// Compiled and pending grammars.
    map: HashMap<Key, Arc<Slot>>,
    lru: VecDeque<Key>,
    /// Failed compiles and when they failed.
    failed: HashMap<Key, (CompileError, Instant)>,
    /// `failed`'s keys, oldest first.
    failed_order: VecDeque<Key>,
}

impl Inner {
    /// Moves `key` from the compiled grammars to the failures (when `slot` is still its
    /// entry), forgetting the oldest failures past `max`.
    fn record_failure(&mut self, key: Key, slot: &Arc<Slot>, e: CompileError, max: usize) {
        if self.map.get(&key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            self.map.remove(&key);
            if let Some(i) = self.lru.iter().position(|k| *k == key) {
                self.lru.remove(i);
            }
        }
        if max == 0 {
            return;
        }
        if self
            .failed
            .insert(key.clone(), (e, Instant::now()))
            .is_some()
        {
            if let Some(i) = self.failed_order.iter().position(|k| *k == key) {
                self.failed_order.remove(i);
            }
        }
        self.failed_order.push_back(key);
        while self.failed_order.len() > max {
            if let Some(old) = self.failed_order.pop_front() {
                self.failed.remove(&old);
            }
        }
    }

    /// The remembered error of `key`, if it failed less than `ttl` ago (an older failure is
    /// forgotten).
    fn recent_failure(&mut self, key: &Key, ttl: Duration) -> Option<CompileError> {
        let (e, at) = self.failed.get(key)?;
        if at.elapsed() < ttl {
            return Some(e.clone());
        }
        self.failed.remove(key);
        if let Some(i) = self.failed_order.iter().position(|k| k == key) {
            self.failed_order.remove(i);
        }
        None
    }
}

/// Compiled grammars by (kind, text, options), compiled by background threads.
#[derive(Debug)]
pub struct GrammarCache {
    inner: Arc<Mutex<Inner>>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    cfg: CacheConfig,
    compiles: Arc<AtomicU64>,
}

impl GrammarCache {
    /// A cache compiling for `vocab` on `cfg.workers` threads.
    pub fn new(vocab: Arc<TokenVocab>, cfg: CacheConfig) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let inner = Arc::new(Mutex::new(Inner {
            map: HashMap::new(),
            lru: VecDeque::new(),
            failed: HashMap::new(),
            failed_order: VecDeque::new(),
        }));
        let compiles = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        for _ in 0..cfg.workers.max(1) {
            let rx = rx.clone();
            let vocab = vocab.clone();
            let inner = inner.clone();
            let compiles = compiles.clone();
            let max_failures = cfg.max_failures;
            workers.push(std::thread::spawn(move || loop {
                let job = { rx.lock().unwrap_or_else(|e| e.into_inner()).recv() };
                let Ok((key, slot)) = job else { break };
                compiles.fetch_add(1, Ordering::Relaxed);
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    CompiledGrammar::compile(&key.0, vocab.clone(), &key.1)
                }));
                let st = match res {
                    Ok(Ok(g)) => HandleState::Ready(g),
                    Ok(Err(e)) => HandleState::Failed(e),
                    Err(_) => HandleState::Failed(CompileError::InvalidSchema {
                        pointer: "#".into(),
                        reason: "internal error while compiling".into(),
                    }),
                };
                if let HandleState::Failed(e) = &st {
                    inner
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .record_failure(key, &slot, e.clone(), max_failures);
                }
                *slot.state.lock().unwrap_or_else(|e| e.into_inner()) = st;
                slot.cv.notify_all();
            }));
        }
        GrammarCache {
            inner,
            tx: Mutex::new(Some(tx)),
            workers,
            cfg,
            compiles,
        }
    }

    /// The handle for `spec` under `opts`: cached, failed recently (the same error again,
    /// see [`CacheConfig::failure_ttl`]), or queued for a background compile.
    pub fn get_or_compile(&self, spec: GrammarSpec, opts: CompileOptions) -> Handle {
        let key = (spec, opts);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = inner.map.get(&key).cloned() {
            // A grammar whose automaton ran past its thread limits while matching (too
            // ambiguous) is refused from now on, as a failed compile is.
            let poisoned = match &*slot.state.lock().unwrap_or_else(|e| e.into_inner()) {
                HandleState::Ready(g) => g.poison_error().is_some(),
                _ => false,
            };
            if poisoned {
                let e = CompileError::LimitExceeded {
                    limit: "parse threads of one step of an ambiguous recursion",
                    max: crate::lazy::MAX_CLOSURE_VISITS,
                };
                inner.record_failure(key, &slot, e.clone(), self.cfg.max_failures);
                return Handle {
                    slot: Slot::new(HandleState::Failed(e)),
                };
            }
            if let Some(i) = inner.lru.iter().position(|k| *k == key) {
                let k = inner.lru.remove(i);
                inner.lru.extend(k);
            }
            return Handle { slot };
        }
        if let Some(e) = inner.recent_failure(&key, self.cfg.failure_ttl) {
            return Handle {
                slot: Slot::new(HandleState::Failed(e)),
            };
        }
        let slot = Slot::new(HandleState::Pending);
        inner.map.insert(key.clone(), slot.clone());
        inner.lru.push_back(key.clone());
        self.evict(&mut inner);
        drop(inner);
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|tx| tx.send((key, slot.clone())).is_ok())
            .unwrap_or(false);
        if !sent {
            *slot.state.lock().unwrap_or_else(|e| e.into_inner()) =
                HandleState::Failed(CompileError::Timeout);
        }
        Handle { slot }
    }

    /// Compilations started so far (a grammar served from the cache, or refused from the
    /// failures remembered, is not compiled again).
    pub fn compiles(&self) -> u64 {
        self.compiles.load(Ordering::Relaxed)
    }

    /// Entries now cached: compiled and pending grammars, and failures remembered.
    pub fn len(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let ttl = self.cfg.failure_ttl;
        let failures = inner
            .failed
            .values()
            .filter(|(_, at)| at.elapsed() < ttl)
            .count();
        inner.map.len() + failures
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn evict(&self, inner: &mut Inner) {
        loop {
            let bytes: usize = inner
                .map
                .values()
                .map(
                    |s| match &*s.state.lock().unwrap_or_else(|e| e.into_inner()) {
                        HandleState::Ready(g) => g.heap_bytes(),
                        _ => 0,
                    },
                )
                .sum();
            if inner.map.len() <= self.cfg.max_entries && bytes <= self.cfg.max_bytes {
                return;
            }
            let Some(k) = inner.lru.pop_front() else {
                return;
            };
            inner.map.remove(&k);
        }
    }
}

impl Drop for GrammarCache {
    fn drop(&mut self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
