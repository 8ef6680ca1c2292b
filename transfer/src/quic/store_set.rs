//! Several KV store servers as one remote cache tier: every page has one owner among them,
//! chosen by rendezvous hashing over the page hash, so adding a store moves only the pages it
//! now owns. Every call is bounded in time and never fails: a store that is down, refuses
//! this cluster or answers too late is a miss (reads) or a skipped write, counted in
//! [`StoreSetStats`]. One task per store keeps its connection up, redialing with backoff.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sglrs_radix_cache::{KvLayout, PageHash};
use tokio::task::JoinSet;

use super::{QuicConfig, QuicError, RemoteStore, Security};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How to reach the stores.
#[derive(Clone, Debug)]
pub struct StoreSetConfig {
    /// The stores, `HOST:PORT` each (names are resolved on every dial, so a store that moves
    /// behind a DNS name is found again). The order does not matter: a page's owner depends
    /// only on the names.
    pub addrs: Vec<String>,
    /// The page layout every store checks at the hello.
    pub layout: KvLayout,
    /// Cluster certificate and secret.
    pub security: Security,
    /// Transport tuning.
    pub quic: QuicConfig,
    /// The longest a read waits for its answer; after it the pages are misses.
    pub read_timeout: Duration,
    /// The longest a write waits for its answer.
    pub write_timeout: Duration,
    /// Bytes of writes in flight at most; a write beyond it is dropped (and counted).
    pub max_write_bytes: usize,
    /// How long [`StoreSet::start`] waits for the first connections.
    pub connect_grace: Duration,
}

/// One store as `/get_server_info` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreStatus {
    /// The address as configured.
    pub addr: String,
    /// `connected`, `connecting` or `down`.
    pub state: &'static str,
    /// Why it is down (the last dial's or connection's error).
    pub reason: Option<String>,
    /// Connections made so far (a reconnect after a restart adds one).
    pub connects: u64,
}

/// Counters of the remote tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreSetStats {
    /// Each store's state.
    pub stores: Vec<StoreStatus>,
    /// Pages asked for.
    pub read_pages: u64,
    /// Of those, found (and intact).
    pub hit_pages: u64,
    /// Read requests (of up to 16 pages of one store) that ran past the read timeout.
    pub read_timeouts: u64,
    /// Read requests that failed, or reads that found their store down.
    pub read_errors: u64,
    /// Pages written into a store.
    pub written_pages: u64,
    /// Pages offered for writing that the store already held.
    pub skipped_pages: u64,
    /// Pages not written: the store was down, slow or too much was in flight.
    pub dropped_pages: u64,
    /// Bytes read from the stores.
    pub read_bytes: u64,
    /// Bytes written to them.
    pub written_bytes: u64,
    /// Microseconds the reads took, summed over reads (from the call to its answer).
    pub read_micros: u64,
}

#[derive(Default)]
struct Counters {
    read_pages: AtomicU64,
    hit_pages: AtomicU64,
    read_timeouts: AtomicU64,
    read_errors: AtomicU64,
    written_pages: AtomicU64,
    skipped_pages: AtomicU64,
    dropped_pages: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    read_micros: AtomicU64,
}

enum State {
    Connecting,
    Up(Arc<RemoteStore>),
    Down(String),
}

struct Slot {
    addr: String,
    seed: u64,
    state: Mutex<State>,
    connects: AtomicU64,
}

impl Slot {
    fn new(addr: &str) -> Arc<Slot> {
        Arc::new(Slot {
            addr: addr.to_string(),
            seed: xxhash_rust::xxh3::xxh3_64(addr.as_bytes()),
            state: Mutex::new(State::Connecting),
            connects: AtomicU64::new(0),
        })
    }

    fn store(&self) -> Option<Arc<RemoteStore>> {
        match &*lock(&self.state) {
            State::Up(s) => Some(s.clone()),
            _ => None,
        }
    }
}

/// The remote tier: connections to every store, kept up in the background.
pub struct StoreSet {
    rt: Option<tokio::runtime::Runtime>,
    slots: Vec<Arc<Slot>>,
    counters: Arc<Counters>,
    writing: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    cfg: StoreSetConfig,
}

/// The first redial comes this soon after a failure; each failure doubles it up to
/// [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(3);
/// Pages per read request: a fetch of more is split into requests of this many, sent
/// together.
const READ_BATCH: usize = 16;
/// How often a live connection is checked for having ended.
const WATCH: Duration = Duration::from_millis(100);

impl StoreSet {
    /// Starts the connections and waits up to [`StoreSetConfig::connect_grace`] for them, so
    /// the first requests find the stores. A store that cannot be reached is not an error:
    /// it is retried in the background and its pages are misses until then.
    pub fn start(cfg: StoreSetConfig) -> Result<StoreSet, QuicError> {
        if cfg.addrs.is_empty() {
            return Err(QuicError::Config("no store address".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for a in &cfg.addrs {
            if !seen.insert(a.as_str()) {
                return Err(QuicError::Config(format!("store {a} is listed twice")));
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sglrs-kv-remote")
            .enable_all()
            .build()?;
        let slots: Vec<Arc<Slot>> = cfg.addrs.iter().map(|a| Slot::new(a)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        for slot in &slots {
            rt.spawn(keep_connected(slot.clone(), cfg.clone(), stop.clone()));
        }
        let set = StoreSet {
            rt: Some(rt),
            slots,
            counters: Arc::default(),
            writing: Arc::default(),
            stop,
            cfg,
        };
        let until = Instant::now() + set.cfg.connect_grace;
        while Instant::now() < until
            && set
                .slots
                .iter()
                .any(|s| matches!(*lock(&s.state), State::Connecting))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(set)
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.rt.as_ref().expect("runtime lives until drop").handle()
    }

    /// The index of the store that owns page `h`: the highest score of (store, page).
    pub fn owner(&self, h: &PageHash) -> usize {
        owner(&self.slots, h)
    }

    /// Reads pages, waiting at most the read timeout; `None` for a miss, a page that failed
    /// its integrity check, or a page whose store is down or slow. Blocks the calling thread,
    /// which must not be one of the set's own.
    pub fn get(&self, hashes: &[PageHash]) -> Vec<Option<Bytes>> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.fetch(hashes.to_vec(), move |pages| {
            let _ = tx.send(pages);
        });
        // `fetch` answers within the read timeout; the margin covers scheduling.
        rx.recv_timeout(self.cfg.read_timeout + Duration::from_secs(1))
            .unwrap_or_else(|_| vec![None; hashes.len()])
    }

    /// Reads pages in the background and calls `done` with them (one entry per hash, as
    /// [`get`](Self::get) returns) within the read timeout. `done` is called exactly once.
    pub fn fetch(
        &self,
        hashes: Vec<PageHash>,
        done: impl FnOnce(Vec<Option<Bytes>>) + Send + 'static,
    ) {
        let n = hashes.len();
        let mut done = Once(Some(Box::new(done)), n);
        if n == 0 {
            done.call(Vec::new());
            return;
        }
        self.counters
            .read_pages
            .fetch_add(n as u64, Ordering::Relaxed);
        let groups = group(&self.slots, &hashes);
        let (slots, counters, timeout) = (
            self.slots.clone(),
            self.counters.clone(),
            self.cfg.read_timeout,
        );
        let t0 = Instant::now();
        self.handle().spawn(async move {
            let mut out: Vec<Option<Bytes>> = vec![None; n];
            let mut tasks = JoinSet::new();
            for (slot, idx) in groups {
                let Some(store) = slots[slot].store() else {
                    counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                // Requests of a few pages each, all in flight at once: each answer is its
                // own stream, so a long read is not one stream's window at a time.
                for chunk in idx.chunks(READ_BATCH) {
                    let (store, idx) = (store.clone(), chunk.to_vec());
                    let want: Vec<PageHash> = idx.iter().map(|&i| hashes[i]).collect();
                    tasks.spawn(async move {
                        (
                            idx,
                            tokio::time::timeout(timeout, store.get_async(want)).await,
                        )
                    });
                }
            }
            while let Some(r) = tasks.join_next().await {
                let Ok((idx, r)) = r else { continue };
                match r {
                    Ok(Ok(pages)) => {
                        for (i, p) in idx.into_iter().zip(pages) {
                            if let Some(p) = &p {
                                counters.hit_pages.fetch_add(1, Ordering::Relaxed);
                                counters
                                    .read_bytes
                                    .fetch_add(p.len() as u64, Ordering::Relaxed);
                            }
                            out[i] = p;
                        }
                    }
                    Ok(Err(_)) => {
                        counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        counters.read_timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            counters
                .read_micros
                .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
            done.call(out);
        });
    }

    /// Writes pages in the background (write-through): each store is first asked which of its
    /// pages it already holds, and only the others are sent. Returns at once; a write that
    /// would put more than the in-flight budget on the way is dropped and counted.
    pub fn write(&self, pages: Vec<(PageHash, Bytes)>) {
        if pages.is_empty() {
            return;
        }
        let bytes: usize = pages.iter().map(|(_, b)| b.len()).sum();
        let counters = self.counters.clone();
        let inflight = self.writing.fetch_add(bytes, Ordering::AcqRel);
        if inflight + bytes > self.cfg.max_write_bytes {
            self.writing.fetch_sub(bytes, Ordering::AcqRel);
            counters
                .dropped_pages
                .fetch_add(pages.len() as u64, Ordering::Relaxed);
            return;
        }
        let hashes: Vec<PageHash> = pages.iter().map(|(h, _)| *h).collect();
        let groups = group(&self.slots, &hashes);
        let (slots, writing, timeout) = (
            self.slots.clone(),
            self.writing.clone(),
            self.cfg.write_timeout,
        );
        self.handle().spawn(async move {
            let mut tasks = JoinSet::new();
            for (slot, idx) in groups {
                let n = idx.len() as u64;
                let Some(store) = slots[slot].store() else {
                    counters.dropped_pages.fetch_add(n, Ordering::Relaxed);
                    continue;
                };
                let mine: Vec<(PageHash, Bytes)> = idx.iter().map(|&i| pages[i].clone()).collect();
                let counters = counters.clone();
                tasks.spawn(async move {
                    let sent = tokio::time::timeout(timeout, async {
                        // The pages of one sequence come in order: the store's leading hits
                        // are the ones it holds.
                        let hashes = mine.iter().map(|(h, _)| *h).collect();
                        let have = store.exists_async(hashes).await?;
                        counters
                            .skipped_pages
                            .fetch_add(have as u64, Ordering::Relaxed);
                        let rest = mine[have.min(mine.len())..].to_vec();
                        let (k, b) = (
                            rest.len() as u64,
                            rest.iter().map(|(_, p)| p.len()).sum::<usize>(),
                        );
                        if k > 0 {
                            store.put_async(rest).await?;
                        }
                        Ok::<_, QuicError>((k, b as u64))
                    })
                    .await;
                    match sent {
                        Ok(Ok((k, b))) => {
                            counters.written_pages.fetch_add(k, Ordering::Relaxed);
                            counters.written_bytes.fetch_add(b, Ordering::Relaxed);
                        }
                        _ => {
                            counters.dropped_pages.fetch_add(n, Ordering::Relaxed);
                        }
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
            writing.fetch_sub(bytes, Ordering::AcqRel);
        });
    }

    /// True while some write is on its way.
    pub fn writes_pending(&self) -> bool {
        self.writing.load(Ordering::Acquire) > 0
    }

    /// The stores' states and the counters.
    pub fn stats(&self) -> StoreSetStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreSetStats {
            stores: self
                .slots
                .iter()
                .map(|s| {
                    let (state, reason) = match &*lock(&s.state) {
                        State::Connecting => ("connecting", None),
                        State::Up(_) => ("connected", None),
                        State::Down(r) => ("down", Some(r.clone())),
                    };
                    StoreStatus {
                        addr: s.addr.clone(),
                        state,
                        reason,
                        connects: s.connects.load(Ordering::Relaxed),
                    }
                })
                .collect(),
            read_pages: g(&c.read_pages),
            hit_pages: g(&c.hit_pages),
            read_timeouts: g(&c.read_timeouts),
            read_errors: g(&c.read_errors),
            written_pages: g(&c.written_pages),
            skipped_pages: g(&c.skipped_pages),
            dropped_pages: g(&c.dropped_pages),
            read_bytes: g(&c.read_bytes),
            written_bytes: g(&c.written_bytes),
            read_micros: g(&c.read_micros),
        }
    }
}

impl Drop for StoreSet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for s in &self.slots {
            if let Some(store) = s.store() {
                store.close();
            }
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}

/// Calls its function once: with the pages, or with misses if it is dropped uncalled (the
/// runtime shut down under it), so a waiter always hears back.
type DoneFn = Box<dyn FnOnce(Vec<Option<Bytes>>) + Send>;
struct Once(Option<DoneFn>, usize);

impl Once {
    fn call(&mut self, pages: Vec<Option<Bytes>>) {
        if let Some(f) = self.0.take() {
            f(pages);
        }
    }
}

impl Drop for Once {
    fn drop(&mut self) {
        let n = self.1;
        self.call(vec![None; n]);
    }
}

fn owner(slots: &[Arc<Slot>], h: &PageHash) -> usize {
    let key = h.0.to_le_bytes();
    slots
        .iter()
        .enumerate()
        .max_by_key(|(_, s)| xxhash_rust::xxh3::xxh3_64_with_seed(&key, s.seed))
        .map_or(0, |(i, _)| i)
}

/// The positions of `hashes` per owning store, in order.
fn group(slots: &[Arc<Slot>], hashes: &[PageHash]) -> Vec<(usize, Vec<usize>)> {
    let mut by: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, h) in hashes.iter().enumerate() {
        by.entry(owner(slots, h)).or_default().push(i);
    }
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by_key(|(s, _)| *s);
    v
}

/// Keeps one store's connection up until the set is dropped: dial (bounded), check the
/// hello with an empty request, watch the connection, and redial with backoff once it ends.
async fn keep_connected(slot: Arc<Slot>, cfg: StoreSetConfig, stop: Arc<AtomicBool>) {
    let mut backoff = MIN_BACKOFF;
    let dial_timeout = cfg.read_timeout.max(Duration::from_secs(2));
    while !stop.load(Ordering::Acquire) {
        match tokio::time::timeout(dial_timeout, dial(&slot.addr, &cfg)).await {
            Ok(Ok(store)) => {
                let store = Arc::new(store);
                slot.connects.fetch_add(1, Ordering::Relaxed);
                *lock(&slot.state) = State::Up(store.clone());
                backoff = MIN_BACKOFF;
                let reason = loop {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(r) = store.closed_reason() {
                        break r;
                    }
                    tokio::time::sleep(WATCH).await;
                };
                *lock(&slot.state) = State::Down(reason);
            }
            Ok(Err(e)) => *lock(&slot.state) = State::Down(e.to_string()),
            Err(_) => *lock(&slot.state) = State::Down("dial timed out".into()),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn dial(addr: &str, cfg: &StoreSetConfig) -> Result<RemoteStore, QuicError> {
    let to: SocketAddr = tokio::net::lookup_host(addr)
        .await?
        .next()
        .ok_or_else(|| QuicError::Config(format!("{addr} resolves to no address")))?;
    let bind: SocketAddr = if to.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let store = RemoteStore::connect(bind, to, cfg.layout, &cfg.security, cfg.quic.clone()).await?;
    // The hello (secret, layout) is checked on the first request: an empty one.
    store.exists_async(Vec::new()).await?;
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(names: &[&str]) -> Vec<Arc<Slot>> {
        names.iter().map(|a| Slot::new(a)).collect()
    }

    #[test]
    fn adding_a_store_moves_only_the_pages_it_now_owns() {
        let two = slots(&["a:1", "b:1"]);
        let three = slots(&["a:1", "b:1", "c:1"]);
        let pages: Vec<PageHash> = (0..10_000u128).map(|i| PageHash(i * 0x9e37_79b9)).collect();
        let (mut moved, mut to_new) = (0, 0);
        let mut per = [0usize; 3];
        for h in &pages {
            let (a, b) = (owner(&two, h), owner(&three, h));
            per[b] += 1;
            if a != b {
                moved += 1;
                if b == 2 {
                    to_new += 1;
                }
            }
        }
        // Every page that moved went to the new store, and it got about a third.
        assert_eq!(moved, to_new);
        assert!((2_900..3_800).contains(&to_new), "{to_new}");
        assert!(per.iter().all(|&n| n > 2_900), "{per:?}");
        // The owner depends on the names, not on their order.
        let swapped = slots(&["b:1", "a:1"]);
        for h in pages.iter().take(100) {
            assert_eq!(two[owner(&two, h)].addr, swapped[owner(&swapped, h)].addr);
        }
    }

    #[test]
    fn a_dropped_callback_still_answers_with_misses() {
        let (tx, rx) = std::sync::mpsc::channel();
        drop(Once(
            Some(Box::new(move |p: Vec<Option<Bytes>>| {
                let _ = tx.send(p.len());
            })),
            3,
        ));
        assert_eq!(rx.recv().unwrap(), 3);
    }
}
