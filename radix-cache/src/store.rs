//! Pages by hash: an LRU-bounded RAM tier (the hierarchical cache's host tier) over an
//! on-disk tier of memory-mapped segment files that survives restarts. The same store backs
//! `sglrs serve`'s host and disk tiers and the shared KV store server (`sglrs-transfer`).
//!
//! With [`PageStoreConfig::disk_write_through`] a page is written to disk as soon as it is
//! put (a `kill -9` then loses nothing already put); without it pages reach the disk only
//! when they leave RAM (spilled by the LRU, by [`PageStore::clear_ram`] or by
//! [`PageStore::flush`]).
//!
//! Disk format: segment files `seg-NNNNNNNN.kv`, each preallocated to the segment size and
//! filled with records `[b"SGKV"][u32 len][16-byte hash][u64 xxh3-64 of data][data]`
//! (little endian). Records are written with `pwrite` and read through a shared read-only
//! mapping of the file (`memmap2`); served pages are slices of that mapping, not copies. On
//! open, every segment's record headers are scanned (not the data: a restart on a large disk
//! tier reads a few bytes per page); every read verifies the page's checksum, so a page
//! corrupted on disk is counted and reported as a miss, never served. When the disk budget is exceeded the oldest segment is
//! deleted whole.
//!
//! A segment truncated under its mapping would raise SIGBUS on access: every read first checks
//! the file's current length (`fstat`) and drops a segment that has shrunk, so a truncation
//! noticed before the read is a miss. (A truncation racing the copy itself, between that check
//! and the last byte read, is not covered: nothing but this store should write its files.)

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::tier::{KvStore, PageHash, StoreError};
use bytes::Bytes;
use memmap2::Mmap;

use crate::checksum::page_checksum;

const MAGIC: &[u8; 4] = b"SGKV";
const HEADER: usize = 32;

/// Where and how much the store spills to disk.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// Directory of the segment files (created if missing).
    pub dir: PathBuf,
    /// Disk budget, bytes; the oldest segments are deleted beyond it.
    pub max_bytes: u64,
    /// Size of one segment file, bytes.
    pub segment_bytes: u64,
}

/// Capacity of a [`PageStore`].
#[derive(Clone, Debug)]
pub struct PageStoreConfig {
    /// RAM budget for page bytes; least recently used pages spill to disk (or are dropped
    /// without one) beyond it.
    pub ram_bytes: usize,
    /// The disk spill, if any.
    pub disk: Option<DiskConfig>,
    /// Write every page put to disk at once too (as well as to RAM), instead of only when
    /// it leaves RAM.
    pub disk_write_through: bool,
}

/// Counters of a [`PageStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Pages in RAM.
    pub ram_pages: usize,
    /// Bytes of pages in RAM.
    pub ram_bytes: usize,
    /// Pages on disk.
    pub disk_pages: usize,
    /// Bytes of disk segments in use.
    pub disk_bytes: u64,
    /// Pages found corrupted (on open or on read) and dropped.
    pub corrupted: u64,
    /// Page writes to disk that failed (a full or failing filesystem); the page then lives
    /// only in RAM, or nowhere.
    pub write_failures: u64,
    /// Segments dropped because their file shrank under the store.
    pub truncated_segments: u64,
    /// Pages served from RAM.
    pub ram_hits: u64,
    /// Pages served from disk.
    pub disk_hits: u64,
    /// Page bytes written to disk.
    pub disk_written_bytes: u64,
    /// Events dropped because nobody drained them in time.
    pub dropped_events: u64,
}

/// A change to the pages one tier of a [`PageStore`] holds (recorded only after
/// [`PageStore::record_events`]; the lower tiers' KV events).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    /// Pages the tier holds now.
    Stored {
        /// The tier.
        tier: Source,
        /// The pages, in the order they were stored.
        hashes: Vec<PageHash>,
    },
    /// Pages the tier no longer holds (spilled, evicted, dropped, cleared).
    Removed {
        /// The tier.
        tier: Source,
        /// The pages.
        hashes: Vec<PageHash>,
    },
}

/// Most page hashes recorded in events not yet drained; beyond it the oldest events go
/// (counted in [`StoreStats::dropped_events`]).
const MAX_EVENT_HASHES: usize = 1 << 20;

/// Which tier of a [`PageStore`] served a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The RAM tier.
    Ram,
    /// The disk tier.
    Disk,
}

struct MapSlice {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for MapSlice {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

struct Segment {
    path: PathBuf,
    file: File,
    map: Arc<Mmap>,
    /// Where the next record goes.
    end: u64,
    cap: u64,
}

impl Segment {
    fn map(file: &File) -> std::io::Result<Arc<Mmap>> {
        // SAFETY: the segment files belong to this store; nothing else is expected to write
        // them. If something does, reads still verify each page's checksum before serving it.
        Ok(Arc::new(unsafe { Mmap::map(file)? }))
    }

    fn create(path: PathBuf, cap: u64) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        file.set_len(cap)?;
        let map = Self::map(&file)?;
        Ok(Self {
            path,
            file,
            map,
            end: 0,
            cap,
        })
    }
}

#[derive(Clone, Copy, Debug)]
struct Loc {
    seg: u32,
    offset: u64,
    len: u32,
    checksum: u64,
}

struct Disk {
    cfg: DiskConfig,
    segments: BTreeMap<u32, Segment>,
    index: HashMap<PageHash, Loc>,
    bytes: u64,
    written: u64,
    truncated: u64,
    /// Pages that left the index since the store last looked (only while events are on).
    removed: Option<Vec<PageHash>>,
}

impl Disk {
    fn open(cfg: DiskConfig) -> std::io::Result<Self> {
        std::fs::create_dir_all(&cfg.dir)?;
        let mut ids: Vec<u32> = std::fs::read_dir(&cfg.dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("seg-")?
                    .strip_suffix(".kv")?
                    .parse()
                    .ok()
            })
            .collect();
        ids.sort();
        let mut disk = Disk {
            cfg,
            segments: BTreeMap::new(),
            index: HashMap::new(),
            bytes: 0,
            written: 0,
            truncated: 0,
            removed: None,
        };
        for id in ids {
            let path = disk.cfg.dir.join(format!("seg-{id:08}.kv"));
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            let cap = file.metadata()?.len();
            let map = Segment::map(&file)?;
            let mut off = 0usize;
            while off + HEADER <= map.len() && &map[off..off + 4] == MAGIC {
                let len = u32::from_le_bytes(map[off + 4..off + 8].try_into().unwrap_or_default())
                    as usize;
                let mut h = [0u8; 16];
                h.copy_from_slice(&map[off + 8..off + 24]);
                let checksum =
                    u64::from_le_bytes(map[off + 24..off + 32].try_into().unwrap_or_default());
                let data = off + HEADER;
                if data + len > map.len() {
                    break; // a torn record at the end
                }
                // Only the header is read here: a restart on a large disk tier must not read
                // it all. The data is verified against `checksum` on every read.
                let loc = Loc {
                    seg: id,
                    offset: data as u64,
                    len: len as u32,
                    checksum,
                };
                disk.index.insert(PageHash::from_bytes(h), loc);
                off = data + len;
            }
            let mut map = map;
            if (off as u64) < cap && map[off..].iter().any(|&b| b != 0) {
                // The scan stopped at bytes that are not a record (a torn write). New records
                // go here: zero the rest first, or the next scan would run on from the end of
                // a new record into these stale bytes and take them for records (a stale
                // one would shadow the newer page of its hash).
                drop(map);
                file.set_len(off as u64)?;
                file.set_len(cap)?;
                map = Segment::map(&file)?;
            }
            disk.bytes += cap;
            disk.segments.insert(
                id,
                Segment {
                    path,
                    file,
                    map,
                    end: off as u64,
                    cap,
                },
            );
        }
        Ok(disk)
    }

    fn append(&mut self, hash: PageHash, data: &[u8]) -> std::io::Result<()> {
        let need = (HEADER + data.len()) as u64;
        let fits = self
            .segments
            .values()
            .next_back()
            .is_some_and(|s| s.end + need <= s.cap);
        if !fits {
            let id = self.segments.keys().next_back().map_or(0, |i| i + 1);
            let cap = self.cfg.segment_bytes.max(need);
            let seg = Segment::create(self.cfg.dir.join(format!("seg-{id:08}.kv")), cap)?;
            self.bytes += cap;
            self.segments.insert(id, seg);
            self.evict_segments()?;
        }
        let Some((&id, seg)) = self.segments.iter_mut().next_back() else {
            return Err(std::io::Error::other("no segment to write"));
        };
        let checksum = page_checksum(data);
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(MAGIC);
        header[4..8].copy_from_slice(&(data.len() as u32).to_le_bytes());
        header[8..24].copy_from_slice(&hash.to_bytes());
        header[24..32].copy_from_slice(&checksum.to_le_bytes());
        // Data first, then the header that makes the record visible to a later scan.
        seg.file.write_all_at(data, seg.end + HEADER as u64)?;
        seg.file.write_all_at(&header, seg.end)?;
        let loc = Loc {
            seg: id,
            offset: seg.end + HEADER as u64,
            len: data.len() as u32,
            checksum,
        };
        seg.end += need;
        self.written += data.len() as u64;
        self.index.insert(hash, loc);
        Ok(())
    }

    /// Deletes the oldest segments (never the one being written) beyond the budget.
    fn evict_segments(&mut self) -> std::io::Result<()> {
        while self.bytes > self.cfg.max_bytes && self.segments.len() > 1 {
            let Some((&id, _)) = self.segments.iter().next() else {
                break;
            };
            if let Some(seg) = self.segments.remove(&id) {
                self.bytes -= seg.cap;
                self.forget_segment(id);
                std::fs::remove_file(&seg.path)?;
            }
        }
        Ok(())
    }

    /// Drops segment `id` (its file shrank): its pages are misses from now on.
    fn drop_segment(&mut self, id: u32) {
        if let Some(seg) = self.segments.remove(&id) {
            self.bytes -= seg.cap;
            self.forget_segment(id);
            self.truncated += 1;
        }
    }

    /// Drops segment `id`'s pages from the index, noting them for the events.
    fn forget_segment(&mut self, id: u32) {
        let removed = &mut self.removed;
        self.index.retain(|h, l| {
            let gone = l.seg == id;
            if gone {
                if let Some(r) = removed.as_mut() {
                    r.push(*h);
                }
            }
            !gone
        });
    }

    /// Deletes every segment file (the disk tier is emptied on request).
    fn clear(&mut self) -> std::io::Result<()> {
        let ids: Vec<u32> = self.segments.keys().copied().collect();
        for id in ids {
            if let Some(seg) = self.segments.remove(&id) {
                self.bytes -= seg.cap;
                std::fs::remove_file(&seg.path)?;
            }
        }
        if let Some(r) = self.removed.as_mut() {
            r.extend(self.index.keys().copied());
        }
        self.index.clear();
        Ok(())
    }

    /// Starts the kernel's readahead of page `hash`'s record (one request for the whole
    /// record instead of a fault per 4 KiB). Checks the file's length first, as `read` does.
    fn prefetch(&self, hash: &PageHash) {
        let Some(loc) = self.index.get(hash) else {
            return;
        };
        let Some(seg) = self.segments.get(&loc.seg) else {
            return;
        };
        let (start, len) = (loc.offset as usize, loc.len as usize);
        let fits = seg.file.metadata().is_ok_and(|m| m.len() >= seg.cap);
        if fits && start + len <= seg.map.len() {
            let _ = seg.map.advise_range(memmap2::Advice::WillNeed, start, len);
        }
    }

    /// The page, verified; `Err(())` when it is on disk but corrupted or its segment shrank.
    fn read(&mut self, hash: &PageHash) -> Option<Result<Bytes, ()>> {
        let loc = *self.index.get(hash)?;
        let seg = self.segments.get(&loc.seg)?;
        let (start, end) = (loc.offset as usize, loc.offset as usize + loc.len as usize);
        // Touching a mapped page past the end of the file raises SIGBUS: check the file's
        // length first.
        let len = seg.file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < seg.cap {
            self.drop_segment(loc.seg);
            return Some(Err(()));
        }
        if end > seg.map.len() {
            return Some(Err(()));
        }
        if page_checksum(&seg.map[start..end]) != loc.checksum {
            return Some(Err(()));
        }
        Some(Ok(Bytes::from_owner(MapSlice {
            map: seg.map.clone(),
            start,
            end,
        })))
    }

    fn sync(&self) -> std::io::Result<()> {
        for s in self.segments.values() {
            s.file.sync_data()?;
        }
        Ok(())
    }
}

struct Inner {
    ram_budget: usize,
    ram: HashMap<PageHash, (Bytes, u64)>,
    lru: BTreeMap<u64, PageHash>,
    tick: u64,
    ram_bytes: usize,
    disk: Option<Disk>,
    disk_write_through: bool,
    corrupted: u64,
    write_failures: u64,
    ram_hits: u64,
    disk_hits: u64,
    /// Recorded changes, while events are on.
    events: Option<Vec<StoreEvent>>,
    event_hashes: usize,
    dropped_events: u64,
}

impl Inner {
    /// Records that `hash` entered (`stored`) or left `tier`, merged into the last event
    /// when it is of the same kind and tier.
    fn note(&mut self, stored: bool, tier: Source, hash: PageHash) {
        let Some(ev) = self.events.as_mut() else {
            return;
        };
        match ev.last_mut() {
            Some(StoreEvent::Stored { tier: t, hashes }) if stored && *t == tier => {
                hashes.push(hash)
            }
            Some(StoreEvent::Removed { tier: t, hashes }) if !stored && *t == tier => {
                hashes.push(hash)
            }
            _ => {
                let hashes = vec![hash];
                ev.push(if stored {
                    StoreEvent::Stored { tier, hashes }
                } else {
                    StoreEvent::Removed { tier, hashes }
                });
            }
        }
        self.event_hashes += 1;
        while self.event_hashes > MAX_EVENT_HASHES && !ev.is_empty() {
            let first = ev.remove(0);
            let n = match &first {
                StoreEvent::Stored { hashes, .. } | StoreEvent::Removed { hashes, .. } => {
                    hashes.len()
                }
            };
            self.event_hashes -= n;
            self.dropped_events += 1;
        }
    }

    /// Moves the disk's removals into the events.
    fn note_disk_removals(&mut self) {
        let removed = match self.disk.as_mut().and_then(|d| d.removed.as_mut()) {
            Some(r) if !r.is_empty() => std::mem::take(r),
            _ => return,
        };
        for h in removed {
            self.note(false, Source::Disk, h);
        }
    }

    fn touch(&mut self, hash: PageHash) {
        self.tick += 1;
        let t = self.tick;
        if let Some((_, old)) = self.ram.get_mut(&hash) {
            self.lru.remove(old);
            *old = t;
            self.lru.insert(t, hash);
        }
    }

    fn contains(&self, hash: &PageHash) -> bool {
        self.ram.contains_key(hash)
            || self
                .disk
                .as_ref()
                .is_some_and(|d| d.index.contains_key(hash))
    }

    /// Moves least recently used pages out of RAM until it fits its budget.
    fn spill(&mut self, budget: usize) -> std::io::Result<()> {
        while self.ram_bytes > budget {
            let Some((_, hash)) = self.lru.pop_first() else {
                break;
            };
            let Some((data, _)) = self.ram.remove(&hash) else {
                continue;
            };
            self.ram_bytes -= data.len();
            self.note(false, Source::Ram, hash);
            self.write_to_disk(hash, &data);
        }
        Ok(())
    }

    /// Appends the page to the disk tier unless it is there; a failed write is counted and
    /// the page stays wherever else it is.
    fn write_to_disk(&mut self, hash: PageHash, data: &[u8]) {
        let Some(d) = &mut self.disk else { return };
        if d.index.contains_key(&hash) {
            return;
        }
        if d.append(hash, data).is_err() {
            self.write_failures += 1;
        } else {
            self.note_disk_removals();
            self.note(true, Source::Disk, hash);
        }
    }
}

/// Pages by hash in RAM (LRU) with a disk spill; see the module docs.
pub struct PageStore {
    inner: Mutex<Inner>,
}

impl PageStore {
    /// Opens the store, scanning and verifying the disk spill if there is one.
    pub fn open(cfg: PageStoreConfig) -> std::io::Result<Self> {
        let disk = cfg.disk.map(Disk::open).transpose()?;
        Ok(Self {
            inner: Mutex::new(Inner {
                ram_budget: cfg.ram_bytes,
                ram: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                ram_bytes: 0,
                disk,
                disk_write_through: cfg.disk_write_through,
                corrupted: 0,
                write_failures: 0,
                ram_hits: 0,
                disk_hits: 0,
                events: None,
                event_hashes: 0,
                dropped_events: 0,
            }),
        })
    }

    /// Starts recording [`StoreEvent`]s (for [`drain_events`](Self::drain_events)); the
    /// first ones announce what the store holds already (pages from an earlier run).
    pub fn record_events(&self) {
        let mut inner = self.lock();
        if inner.events.is_some() {
            return;
        }
        inner.events = Some(Vec::new());
        let ram: Vec<PageHash> = inner.lru.values().copied().collect();
        for h in ram {
            inner.note(true, Source::Ram, h);
        }
        let disk: Vec<PageHash> = match inner.disk.as_mut() {
            Some(d) => {
                d.removed = Some(Vec::new());
                d.index.keys().copied().collect()
            }
            None => Vec::new(),
        };
        for h in disk {
            inner.note(true, Source::Disk, h);
        }
    }

    /// The events recorded since the last call.
    pub fn drain_events(&self) -> Vec<StoreEvent> {
        let mut inner = self.lock();
        inner.note_disk_removals();
        inner.event_hashes = 0;
        inner
            .events
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many of `hashes`, from the first, are stored.
    pub fn exists(&self, hashes: &[PageHash]) -> usize {
        let inner = self.lock();
        hashes.iter().take_while(|h| inner.contains(h)).count()
    }

    /// Whether each of `hashes` is stored.
    pub fn contains_each(&self, hashes: &[PageHash]) -> Vec<bool> {
        let inner = self.lock();
        hashes.iter().map(|h| inner.contains(h)).collect()
    }

    /// Every page hash stored: those in RAM, then those only on disk in the order they lie
    /// there (segment, offset), which is the order a sequential read wants.
    pub fn stored_hashes(&self) -> Vec<PageHash> {
        let inner = self.lock();
        let mut out: Vec<PageHash> = inner.ram.keys().copied().collect();
        if let Some(d) = &inner.disk {
            let mut on_disk: Vec<(u32, u64, PageHash)> = d
                .index
                .iter()
                .filter(|(h, _)| !inner.ram.contains_key(h))
                .map(|(h, l)| (l.seg, l.offset, *h))
                .collect();
            on_disk.sort_unstable();
            out.extend(on_disk.into_iter().map(|(_, _, h)| h));
        }
        out
    }

    /// The pages, `None` for a miss or for a page whose bytes fail their checksum.
    pub fn get(&self, hashes: &[PageHash]) -> Vec<Option<Bytes>> {
        self.get_tiered(hashes)
            .into_iter()
            .map(|p| p.map(|(b, _)| b))
            .collect()
    }

    /// [`get`](Self::get), saying which tier served each page.
    pub fn get_tiered(&self, hashes: &[PageHash]) -> Vec<Option<(Bytes, Source)>> {
        let mut inner = self.lock();
        let mut out = Vec::with_capacity(hashes.len());
        if let Some(d) = &inner.disk {
            // Ask for every disk page's readahead first, so that reading one overlaps the
            // others' I/O.
            for h in hashes.iter().filter(|h| !inner.ram.contains_key(h)) {
                d.prefetch(h);
            }
        }
        for h in hashes {
            if let Some((data, _)) = inner.ram.get(h) {
                let data = data.clone();
                inner.touch(*h);
                inner.ram_hits += 1;
                out.push(Some((data, Source::Ram)));
                continue;
            }
            let read = inner.disk.as_mut().and_then(|d| d.read(h));
            out.push(match read {
                Some(Ok(b)) => {
                    inner.disk_hits += 1;
                    Some((b, Source::Disk))
                }
                Some(Err(())) => {
                    inner.corrupted += 1;
                    if let Some(d) = &mut inner.disk {
                        d.index.remove(h);
                    }
                    None
                }
                None => None,
            });
        }
        out
    }

    /// Stores pages; pages already present are left as they are. Returns how many of
    /// `pages` are now stored (new or already present).
    pub fn put(&self, pages: Vec<(PageHash, Bytes)>) -> std::io::Result<usize> {
        let mut inner = self.lock();
        let n = pages.len();
        for (h, data) in pages {
            if inner.contains(&h) {
                continue;
            }
            if inner.disk_write_through || inner.ram_budget == 0 {
                inner.write_to_disk(h, &data);
                if inner.ram_budget == 0 {
                    continue;
                }
            }
            inner.tick += 1;
            let t = inner.tick;
            inner.ram_bytes += data.len();
            inner.ram.insert(h, (data, t));
            inner.lru.insert(t, h);
            inner.note(true, Source::Ram, h);
        }
        let budget = inner.ram_budget;
        inner.spill(budget)?;
        Ok(n)
    }

    /// Spills every page in RAM to disk and syncs the segments, so a restart finds them
    /// (no-op without a disk).
    pub fn flush(&self) -> std::io::Result<()> {
        let mut inner = self.lock();
        if inner.disk.is_none() {
            return Ok(());
        }
        inner.spill(0)?;
        match &inner.disk {
            Some(d) => d.sync(),
            None => Ok(()),
        }
    }

    /// Empties the RAM tier. Pages not yet on disk are written there first (so a restart
    /// still finds them); without a disk they are dropped.
    pub fn clear_ram(&self) -> std::io::Result<()> {
        let mut inner = self.lock();
        inner.spill(0)
    }

    /// Deletes every page on disk (the segment files); RAM pages stay.
    pub fn clear_disk(&self) -> std::io::Result<()> {
        let mut inner = self.lock();
        let r = match &mut inner.disk {
            Some(d) => d.clear(),
            None => Ok(()),
        };
        inner.note_disk_removals();
        r
    }

    /// Whether the store has a disk tier.
    pub fn has_disk(&self) -> bool {
        self.lock().disk.is_some()
    }

    /// Current counters.
    pub fn stats(&self) -> StoreStats {
        let inner = self.lock();
        StoreStats {
            ram_pages: inner.ram.len(),
            ram_bytes: inner.ram_bytes,
            disk_pages: inner.disk.as_ref().map_or(0, |d| d.index.len()),
            disk_bytes: inner.disk.as_ref().map_or(0, |d| d.bytes),
            corrupted: inner.corrupted,
            write_failures: inner.write_failures,
            truncated_segments: inner.disk.as_ref().map_or(0, |d| d.truncated),
            ram_hits: inner.ram_hits,
            disk_hits: inner.disk_hits,
            disk_written_bytes: inner.disk.as_ref().map_or(0, |d| d.written),
            dropped_events: inner.dropped_events,
        }
    }

    /// The directory of the disk spill, if any.
    pub fn disk_dir(&self) -> Option<PathBuf> {
        self.lock().disk.as_ref().map(|d| d.cfg.dir.clone())
    }
}

impl Drop for PageStore {
    fn drop(&mut self) {
        // Best effort: a clean shutdown keeps the RAM tier too.
        let _ = self.flush();
    }
}

impl KvStore for PageStore {
    fn exists(&self, hashes: &[PageHash]) -> Result<usize, StoreError> {
        Ok(PageStore::exists(self, hashes))
    }
    fn get(&self, hashes: &[PageHash]) -> Result<Vec<Option<Bytes>>, StoreError> {
        Ok(PageStore::get(self, hashes))
    }
    fn put(&self, pages: &[(PageHash, Bytes)]) -> Result<(), StoreError> {
        PageStore::put(self, pages.to_vec())?;
        Ok(())
    }
}

/// Path of segment `id` under `dir` (for tests and tools).
pub fn segment_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("seg-{id:08}.kv"))
}

#[cfg(test)]
mod tests;
