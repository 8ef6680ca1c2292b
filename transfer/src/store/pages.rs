//! Pages by hash: an LRU-bounded RAM tier over an on-disk spill of memory-mapped segment
//! files that survives restarts.
//!
//! Disk format: segment files `seg-NNNNNNNN.kv`, each preallocated to the segment size and
//! filled with records `[b"SGKV"][u32 len][16-byte hash][u64 xxh3-64 of data][data]`
//! (little endian). Records are written with `pwrite` and read through a shared read-only
//! mapping of the file (`memmap2`); served pages are slices of that mapping, not copies. On
//! open, every segment is scanned and every record verified; a record whose data fails its
//! checksum is skipped and counted. Reads verify again, so a page corrupted later is
//! reported as a miss, never served. When the disk budget is exceeded the oldest segment is
//! deleted whole.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use memmap2::Mmap;
use sglrs_radix_cache::{KvStore, PageHash, StoreError};

use crate::proto::page_checksum;

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
}

impl Disk {
    fn open(cfg: DiskConfig, corrupted: &mut u64) -> std::io::Result<Self> {
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
                if page_checksum(&map[data..data + len]) == checksum {
                    let loc = Loc {
                        seg: id,
                        offset: data as u64,
                        len: len as u32,
                        checksum,
                    };
                    disk.index.insert(PageHash::from_bytes(h), loc);
                } else {
                    *corrupted += 1;
                }
                off = data + len;
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
                self.index.retain(|_, l| l.seg != id);
                std::fs::remove_file(&seg.path)?;
            }
        }
        Ok(())
    }

    /// The page, verified; `Err(())` when it is on disk but corrupted.
    fn read(&self, hash: &PageHash) -> Option<Result<Bytes, ()>> {
        let loc = self.index.get(hash)?;
        let seg = self.segments.get(&loc.seg)?;
        let (start, end) = (loc.offset as usize, loc.offset as usize + loc.len as usize);
        if end > seg.map.len() || page_checksum(&seg.map[start..end]) != loc.checksum {
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
    corrupted: u64,
}

impl Inner {
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
            if let Some(d) = &mut self.disk {
                if !d.index.contains_key(&hash) {
                    d.append(hash, &data)?;
                }
            }
        }
        Ok(())
    }
}

/// Pages by hash in RAM (LRU) with a disk spill; see the module docs.
pub struct PageStore {
    inner: Mutex<Inner>,
}

impl PageStore {
    /// Opens the store, scanning and verifying the disk spill if there is one.
    pub fn open(cfg: PageStoreConfig) -> std::io::Result<Self> {
        let mut corrupted = 0;
        let disk = cfg
            .disk
            .map(|d| Disk::open(d, &mut corrupted))
            .transpose()?;
        Ok(Self {
            inner: Mutex::new(Inner {
                ram_budget: cfg.ram_bytes,
                ram: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                ram_bytes: 0,
                disk,
                corrupted,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many of `hashes`, from the first, are stored.
    pub fn exists(&self, hashes: &[PageHash]) -> usize {
        let inner = self.lock();
        hashes.iter().take_while(|h| inner.contains(h)).count()
    }

    /// The pages, `None` for a miss or for a page whose bytes fail their checksum.
    pub fn get(&self, hashes: &[PageHash]) -> Vec<Option<Bytes>> {
        let mut inner = self.lock();
        let mut out = Vec::with_capacity(hashes.len());
        for h in hashes {
            if let Some((data, _)) = inner.ram.get(h) {
                let data = data.clone();
                inner.touch(*h);
                out.push(Some(data));
                continue;
            }
            let read = inner.disk.as_ref().and_then(|d| d.read(h));
            out.push(match read {
                Some(Ok(b)) => Some(b),
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
            inner.tick += 1;
            let t = inner.tick;
            inner.ram_bytes += data.len();
            inner.ram.insert(h, (data, t));
            inner.lru.insert(t, h);
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

    /// Current counters.
    pub fn stats(&self) -> StoreStats {
        let inner = self.lock();
        StoreStats {
            ram_pages: inner.ram.len(),
            ram_bytes: inner.ram_bytes,
            disk_pages: inner.disk.as_ref().map_or(0, |d| d.index.len()),
            disk_bytes: inner.disk.as_ref().map_or(0, |d| d.bytes),
            corrupted: inner.corrupted,
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
