//! The hierarchical cache's lower tiers (host RAM, disk) and the cache I/O thread.
//!
//! The radix tree indexes the device pages (the executor's KV pool). Below it, pages live
//! in a [`PageStore`] by [`PageHash`] (chained over the model fingerprint, the namespace and
//! the tokens): its RAM part is the host tier, its segment files the disk tier. The core
//! asks for copies ([`IoJob`]) and the I/O thread ([`spawn_io`]) runs them with the
//! executor's [`PageIo`], never on the scheduler thread:
//!
//! - **write** (write-through): pages a sequence has just put into the tree are copied out
//!   of the pool into the store, while a lock keeps them from being evicted;
//! - **load**: a request whose prompt continues below the device tier holds fresh device
//!   pages and waits (phase `Loading`) while its pages are copied in; other sequences keep
//!   running. The first page that is missing or fails its checksum ends the hit there: the
//!   rest is recomputed;
//! - **prefetch**: while a request is still queued, its lower-tier pages are read (from disk
//!   into memory, checksums verified) so that its load is a memory copy;
//! - **remote tier** ([`RemoteTier`], optional): a queued request's pages that neither the
//!   device nor the local tiers hold are asked of the remote tier (a KV store shared by
//!   replicas) as part of its prefetch; the pages found join the host tier. Pages written
//!   into the local tiers are written through to the remote tier as well.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam::channel::{Receiver, Sender};
use sglrs_executor::kv::PageIo;
use sglrs_radix_cache::store::{PageStore, Source};
use sglrs_radix_cache::PageHash;

use crate::request::{RequestId, SeqKey};

/// When pages are copied from the device tier into the lower tiers (SGLang's
/// `--hicache-write-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WritePolicy {
    /// Every full page, as soon as it is in the tree.
    #[default]
    WriteThrough,
    /// Only pages that were hit at least once on the device (reused prefixes).
    WriteThroughSelective,
    /// Pages are copied down only when evicted from the device: the scheduler thread copies
    /// them out of the pool before the pass that may reuse them, the I/O thread stores them.
    WriteBack,
}

impl WritePolicy {
    /// The policy's flag name.
    pub fn name(self) -> &'static str {
        match self {
            WritePolicy::WriteThrough => "write_through",
            WritePolicy::WriteThroughSelective => "write_through_selective",
            WritePolicy::WriteBack => "write_back",
        }
    }
}

/// How long admission waits for a queued request's prefetch (SGLang's
/// `--hicache-storage-prefetch-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PrefetchPolicy {
    /// Never wait: a request whose prefetch is unfinished is admitted when its turn comes
    /// and its load reads the rest itself.
    BestEffort,
    /// Admit a request only once its prefetch has finished.
    #[default]
    WaitComplete,
    /// Wait for the prefetch at most [`HiCacheConfig::prefetch_timeout`] after arrival.
    Timeout,
}

impl PrefetchPolicy {
    /// The policy's flag name.
    pub fn name(self) -> &'static str {
        match self {
            PrefetchPolicy::BestEffort => "best_effort",
            PrefetchPolicy::WaitComplete => "wait_complete",
            PrefetchPolicy::Timeout => "timeout",
        }
    }
}

/// A remote cache tier: pages shared by several servers (a KV store over the network). Both
/// calls return at once and never fail: a store that is down or slow is a miss or a
/// skipped write.
pub trait RemoteTier: Send + Sync {
    /// Reads pages in the background and calls `done` exactly once, within a bounded time,
    /// with one entry per hash (`None`: a miss, a page that failed its integrity check, or
    /// a store that did not answer in time).
    fn fetch(&self, hashes: Vec<PageHash>, done: Box<dyn FnOnce(Vec<Option<Bytes>>) + Send>);
    /// Writes pages in the background; those the remote tier holds already are skipped.
    fn write(&self, pages: Vec<(PageHash, Bytes)>);
}

/// The lower tiers of the cache and how the scheduler uses them.
#[derive(Clone)]
pub struct HiCacheConfig {
    /// Host RAM tier and disk tier.
    pub store: Arc<PageStore>,
    /// When pages are written down.
    pub write_policy: WritePolicy,
    /// How long admission waits for prefetches.
    pub prefetch_policy: PrefetchPolicy,
    /// The `timeout` policy's bound.
    pub prefetch_timeout: Duration,
    /// The model fingerprint: the parent hash of every sequence's first page.
    pub root_hash: PageHash,
    /// Bytes of one page in the executor's layout (for the byte counters).
    pub page_bytes: usize,
    /// The remote tier, below the disk tier.
    pub remote: Option<Arc<dyn RemoteTier>>,
    /// Whether pages written into the local tiers are written to the remote tier too (a
    /// decode server writes only when asked to offload what it computed).
    pub remote_write: bool,
}

impl std::fmt::Debug for HiCacheConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HiCacheConfig")
            .field("write_policy", &self.write_policy)
            .field("prefetch_policy", &self.prefetch_policy)
            .field("prefetch_timeout", &self.prefetch_timeout)
            .field("root_hash", &format_args!("{:032x}", self.root_hash.0))
            .field("remote", &self.remote.is_some())
            .field("remote_write", &self.remote_write)
            .finish_non_exhaustive()
    }
}

/// A copy the core asks the I/O thread for.
#[derive(Debug)]
pub enum IoJob {
    /// Copy `pages` (fresh device pages the sequence owns) in from the pages named `hashes`.
    Load {
        /// The loading sequence.
        key: SeqKey,
        /// Destination device pages, one per hash.
        pages: Vec<u32>,
        /// Names of the pages to load, in sequence order.
        hashes: Vec<PageHash>,
    },
    /// Copy tree pages (locked by pin `pin`) out into the store, skipping those it holds.
    Write {
        /// The core's lock on the pages.
        pin: u64,
        /// Device pages, one per hash.
        pages: Vec<u32>,
        /// Their names.
        hashes: Vec<PageHash>,
    },
    /// Store pages already copied out of the pool (write-back of evicted pages).
    Store {
        /// The pages and their names.
        pages: Vec<(PageHash, Bytes)>,
    },
    /// Read a queued request's lower-tier pages into memory ahead of its load.
    Prefetch {
        /// The request.
        id: RequestId,
        /// Names of its pages in the local lower tiers.
        hashes: Vec<PageHash>,
        /// Names of the pages after those, to ask the remote tier for (empty without one).
        remote: Vec<PageHash>,
    },
}

/// A finished [`IoJob`].
#[derive(Debug)]
pub enum IoDone {
    /// A load ended: the first `loaded` pages are in place.
    Loaded {
        /// The sequence.
        key: SeqKey,
        /// Leading pages copied in (a miss or bad checksum ends the hit).
        loaded: usize,
        /// Of those, served from the host tier.
        host: usize,
        /// Of those, served from the disk tier.
        disk: usize,
        /// Of those, fetched from the remote tier by the request's prefetch.
        remote: usize,
        /// How long the load took, from the job's start.
        seconds: f64,
    },
    /// A write ended.
    Written {
        /// The pin to release.
        pin: u64,
        /// Pages copied into the store.
        written: usize,
    },
    /// A store of copied pages ended.
    Stored {
        /// Pages stored.
        written: usize,
    },
    /// A prefetch ended.
    Prefetched {
        /// The request.
        id: RequestId,
        /// Pages the remote tier supplied (leading, after the local ones).
        remote: usize,
    },
}

/// Counters of the lower tiers, for `/metrics` and `/get_server_info`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TierStats {
    /// Loads run.
    pub loads: u64,
    /// Pages loaded from the host tier.
    pub loaded_host_pages: u64,
    /// Pages loaded from the disk tier.
    pub loaded_disk_pages: u64,
    /// Loads that ended short of their lookup (a page missing or corrupted meanwhile).
    pub short_loads: u64,
    /// Pages written into the store.
    pub written_pages: u64,
    /// Bytes loaded into the device pool.
    pub loaded_bytes: u64,
    /// Bytes written out of it.
    pub written_bytes: u64,
    /// Load latency histogram: counts per bucket of [`LOAD_BUCKETS`] (cumulative in the
    /// Prometheus sense is left to the exporter), then the overflow count.
    pub load_seconds_counts: Vec<u64>,
    /// Sum of load latencies, seconds.
    pub load_seconds_sum: f64,
    /// Prefetches run.
    pub prefetches: u64,
    /// Pages loaded that the remote tier supplied.
    pub loaded_remote_pages: u64,
    /// Pages prefetches fetched from the remote tier.
    pub fetched_remote_pages: u64,
}

/// Upper bounds (seconds) of the load latency histogram's buckets.
pub const LOAD_BUCKETS: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0];

impl TierStats {
    pub(crate) fn observe_load(&mut self, seconds: f64) {
        if self.load_seconds_counts.len() != LOAD_BUCKETS.len() + 1 {
            self.load_seconds_counts = vec![0; LOAD_BUCKETS.len() + 1];
        }
        let i = LOAD_BUCKETS
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(LOAD_BUCKETS.len());
        self.load_seconds_counts[i] += 1;
        self.load_seconds_sum += seconds;
    }
}

/// Most bytes of prefetched pages kept for loads not yet started; the oldest go first.
const STASH_BYTES: usize = 512 << 20;

/// Where a page read ahead came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Host,
    Disk,
    Remote,
}

impl Origin {
    fn local(s: Source) -> Origin {
        match s {
            Source::Ram => Origin::Host,
            Source::Disk => Origin::Disk,
        }
    }
}

/// Pages read ahead by prefetches, waiting for their loads.
#[derive(Default)]
struct Stash {
    pages: HashMap<PageHash, (Bytes, Origin)>,
    order: VecDeque<PageHash>,
    bytes: usize,
}

impl Stash {
    fn put(&mut self, h: PageHash, page: (Bytes, Origin)) {
        if self.pages.contains_key(&h) {
            return;
        }
        self.bytes += page.0.len();
        self.pages.insert(h, page);
        self.order.push_back(h);
        while self.bytes > STASH_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((b, _)) = self.pages.remove(&old) {
                self.bytes -= b.len();
            }
        }
    }

    fn take(&mut self, h: &PageHash) -> Option<(Bytes, Origin)> {
        let p = self.pages.remove(h)?;
        self.bytes -= p.0.len();
        // `order` keeps a stale entry; `put`'s loop skips it.
        Some(p)
    }
}

/// The I/O thread's ends of its channels.
pub struct IoChannels {
    /// Jobs to run (loads are taken before writes and prefetches).
    pub loads: Sender<IoJob>,
    /// Writes and prefetches.
    pub background: Sender<IoJob>,
    /// Finished jobs.
    pub done: Receiver<IoDone>,
}

/// Starts the cache I/O thread over the executor's pool (`io`) and the tiers of `cfg`. It
/// ends when both job senders are dropped.
pub fn spawn_io(io: PageIo, cfg: &HiCacheConfig) -> std::io::Result<IoChannels> {
    let (loads, load_rx) = crossbeam::channel::unbounded();
    let (background, bg_rx) = crossbeam::channel::unbounded();
    let (done_tx, done) = crossbeam::channel::unbounded();
    let mut t = IoThread::new(io, cfg.store.clone(), done_tx);
    t.remote = cfg.remote.clone();
    t.remote_write = cfg.remote_write;
    std::thread::Builder::new()
        .name("sglrs-cache-io".into())
        .spawn(move || t.run(load_rx, bg_rx))?;
    Ok(IoChannels {
        loads,
        background,
        done,
    })
}

/// Pages a remote fetch brought back for a request's prefetch.
struct Fetched {
    id: RequestId,
    hashes: Vec<PageHash>,
    pages: Vec<Option<Bytes>>,
}

struct IoThread {
    io: PageIo,
    store: Arc<PageStore>,
    done: Sender<IoDone>,
    stash: Stash,
    page_bytes: usize,
    remote: Option<Arc<dyn RemoteTier>>,
    remote_write: bool,
    /// Remote fetches answer here (from the remote tier's threads).
    fetched_tx: Sender<Fetched>,
    fetched_rx: Receiver<Fetched>,
}

impl IoThread {
    fn new(io: PageIo, store: Arc<PageStore>, done: Sender<IoDone>) -> IoThread {
        let page_bytes = io.layout().page_bytes();
        let (fetched_tx, fetched_rx) = crossbeam::channel::unbounded();
        IoThread {
            io,
            store,
            done,
            stash: Stash::default(),
            page_bytes,
            remote: None,
            remote_write: false,
            fetched_tx,
            fetched_rx,
        }
    }

    /// Writes pages just stored locally through to the remote tier.
    fn write_remote(&self, pages: &[(PageHash, Bytes)]) {
        if let Some(r) = self.remote.as_ref().filter(|_| self.remote_write) {
            if !pages.is_empty() {
                r.write(pages.to_vec());
            }
        }
    }

    fn run(mut self, loads: Receiver<IoJob>, background: Receiver<IoJob>) {
        let (mut loads_open, mut bg_open) = (true, true);
        let fetched = self.fetched_rx.clone();
        while loads_open || bg_open {
            // Loads first: a request waits on each of them.
            let job = match loads.try_recv() {
                Ok(j) => Some(j),
                Err(_) => {
                    let mut sel = crossbeam::channel::Select::new();
                    let l = loads_open.then(|| sel.recv(&loads));
                    let b = bg_open.then(|| sel.recv(&background));
                    let f = sel.recv(&fetched);
                    let op = sel.select();
                    let i = op.index();
                    if Some(i) == l {
                        op.recv(&loads).map_err(|_| loads_open = false).ok()
                    } else if Some(i) == b {
                        op.recv(&background).map_err(|_| bg_open = false).ok()
                    } else if i == f {
                        // This thread holds a sender: the channel never disconnects.
                        if let Ok(got) = op.recv(&fetched) {
                            let out = self.take_fetched(got);
                            if self.done.send(out).is_err() {
                                return;
                            }
                        }
                        None
                    } else {
                        None
                    }
                }
            };
            let Some(job) = job else { continue };
            let out = match job {
                IoJob::Load { key, pages, hashes } => Some(self.load(key, &pages, &hashes)),
                IoJob::Write { pin, pages, hashes } => Some(self.write(pin, &pages, &hashes)),
                IoJob::Prefetch { id, hashes, remote } => self.prefetch(id, &hashes, remote),
                IoJob::Store { pages } => {
                    let written = pages.len();
                    self.write_remote(&pages);
                    // A failed disk write is counted by the store.
                    let _ = self.store.put(pages);
                    Some(IoDone::Stored { written })
                }
            };
            if let Some(out) = out {
                if self.done.send(out).is_err() {
                    return;
                }
            }
        }
    }

    fn load(&mut self, key: SeqKey, pages: &[u32], hashes: &[PageHash]) -> IoDone {
        let t = Instant::now();
        let (mut loaded, mut host, mut disk, mut remote) = (0, 0, 0, 0);
        // Pages not read ahead by a prefetch are read now, all in one store call.
        let missing: Vec<PageHash> = hashes
            .iter()
            .filter(|h| !self.stash.pages.contains_key(h))
            .copied()
            .collect();
        let mut fetched: HashMap<PageHash, (Bytes, Origin)> = missing
            .iter()
            .copied()
            .zip(self.store.get_tiered(&missing))
            .filter_map(|(h, p)| p.map(|(b, s)| (h, (b, Origin::local(s)))))
            .collect();
        for (&page, h) in pages.iter().zip(hashes) {
            let Some((data, src)) = self.stash.take(h).or_else(|| fetched.remove(h)) else {
                break;
            };
            if data.len() != self.page_bytes {
                break;
            }
            // SAFETY: `pages` were allocated for this load by the core and belong to no
            // forward pass until the core hears back (`IoDone::Loaded`).
            if unsafe { self.io.write_pages(&[page], &data) }.is_err() {
                break;
            }
            loaded += 1;
            match src {
                Origin::Host => host += 1,
                Origin::Disk => disk += 1,
                Origin::Remote => remote += 1,
            }
        }
        IoDone::Loaded {
            key,
            loaded,
            host,
            disk,
            remote,
            seconds: t.elapsed().as_secs_f64(),
        }
    }

    fn write(&mut self, pin: u64, pages: &[u32], hashes: &[PageHash]) -> IoDone {
        let have = self.store.contains_each(hashes);
        let mut out = Vec::new();
        for ((&page, &h), have) in pages.iter().zip(hashes).zip(have) {
            if have {
                continue;
            }
            let mut buf = vec![0u8; self.page_bytes];
            // SAFETY: the pages are in the radix tree (full, never written again) and the
            // core's pin keeps them from being evicted until it hears back.
            if unsafe { self.io.read_pages(&[page], &mut buf) }.is_ok() {
                out.push((h, Bytes::from(buf)));
            }
        }
        let written = out.len();
        self.write_remote(&out);
        // A failed disk write is counted by the store; the page then simply is not stored.
        let _ = self.store.put(out);
        IoDone::Written { pin, written }
    }

    /// Reads the local pages into the stash, then asks the remote tier for the rest (its
    /// answer comes back through `fetched`, and the prefetch ends then).
    fn prefetch(
        &mut self,
        id: RequestId,
        hashes: &[PageHash],
        remote: Vec<PageHash>,
    ) -> Option<IoDone> {
        let want: Vec<PageHash> = hashes
            .iter()
            .filter(|h| !self.stash.pages.contains_key(h))
            .copied()
            .collect();
        let mut complete = true;
        for (h, p) in want.iter().zip(self.store.get_tiered(&want)) {
            let Some((data, src)) = p else {
                complete = false;
                break;
            };
            // Touching the bytes now (the checksum did for disk pages) is the point.
            self.stash.put(*h, (data, Origin::local(src)));
        }
        // Remote pages continue the local ones: a local page missing breaks the chain.
        match self.remote.as_ref() {
            Some(r) if complete && !remote.is_empty() => {
                let tx = self.fetched_tx.clone();
                let names = remote.clone();
                r.fetch(
                    remote,
                    Box::new(move |pages| {
                        let _ = tx.send(Fetched {
                            id,
                            hashes: names,
                            pages,
                        });
                    }),
                );
                None
            }
            _ => Some(IoDone::Prefetched { id, remote: 0 }),
        }
    }

    /// A remote fetch answered: its leading pages join the host tier (so admission sees
    /// them) and the stash (so the load counts them as remote).
    fn take_fetched(&mut self, got: Fetched) -> IoDone {
        let mut pages = Vec::new();
        for (h, p) in got.hashes.into_iter().zip(got.pages) {
            match p {
                Some(b) if b.len() == self.page_bytes => pages.push((h, b)),
                _ => break,
            }
        }
        let n = pages.len();
        for (h, b) in &pages {
            self.stash.put(*h, (b.clone(), Origin::Remote));
        }
        // A failed disk write is counted by the store.
        let _ = self.store.put(pages);
        IoDone::Prefetched {
            id: got.id,
            remote: n,
        }
    }
}
