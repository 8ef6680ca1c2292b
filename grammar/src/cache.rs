//! The grammar cache: compiles on background threads, never blocks the decoding caller.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

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
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            workers: 1,
            max_entries: 512,
            max_bytes: 1 << 30,
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
    map: HashMap<Key, Arc<Slot>>,
    lru: VecDeque<Key>,
}

/// Compiled grammars by (kind, text, options), compiled by background threads.
#[derive(Debug)]
pub struct GrammarCache {
    inner: Arc<Mutex<Inner>>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    cfg: CacheConfig,
}

impl GrammarCache {
    /// A cache compiling for `vocab` on `cfg.workers` threads.
    pub fn new(vocab: Arc<TokenVocab>, cfg: CacheConfig) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::new();
        for _ in 0..cfg.workers.max(1) {
            let rx = rx.clone();
            let vocab = vocab.clone();
            workers.push(std::thread::spawn(move || loop {
                let job = { rx.lock().unwrap_or_else(|e| e.into_inner()).recv() };
                let Ok(((spec, opts), slot)) = job else { break };
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    CompiledGrammar::compile(&spec, vocab.clone(), &opts)
                }));
                let st = match res {
                    Ok(Ok(g)) => HandleState::Ready(g),
                    Ok(Err(e)) => HandleState::Failed(e),
                    Err(_) => HandleState::Failed(CompileError::InvalidSchema {
                        pointer: "#".into(),
                        reason: "internal error while compiling".into(),
                    }),
                };
                *slot.state.lock().unwrap_or_else(|e| e.into_inner()) = st;
                slot.cv.notify_all();
            }));
        }
        GrammarCache {
            inner: Arc::new(Mutex::new(Inner {
                map: HashMap::new(),
                lru: VecDeque::new(),
            })),
            tx: Mutex::new(Some(tx)),
            workers,
            cfg,
        }
    }

    /// The handle for `spec` under `opts`: cached, or queued for a background compile.
    pub fn get_or_compile(&self, spec: GrammarSpec, opts: CompileOptions) -> Handle {
        let key = (spec, opts);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = inner.map.get(&key).cloned() {
            if let Some(i) = inner.lru.iter().position(|k| *k == key) {
                let k = inner.lru.remove(i);
                inner.lru.extend(k);
            }
            return Handle { slot };
        }
        let slot = Arc::new(Slot {
            state: Mutex::new(HandleState::Pending),
            cv: Condvar::new(),
        });
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

    /// Entries now cached (compiled, failed or pending).
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .len()
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
