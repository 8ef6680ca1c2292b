//! The page store's tests: segment files, tiers, restarts, damage, events.

use super::*;

fn cfg(dir: &Path, ram_bytes: usize, write_through: bool) -> PageStoreConfig {
    PageStoreConfig {
        ram_bytes,
        disk: Some(DiskConfig {
            dir: dir.to_path_buf(),
            max_bytes: 1 << 30,
            segment_bytes: 1 << 16,
        }),
        disk_write_through: write_through,
    }
}

fn page(i: u64) -> Bytes {
    (0..4096u64)
        .map(|j| (i * 31 + j) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn put_n(store: &PageStore, n: u64) {
    let pages = (0..n)
        .map(|i| (PageHash(u128::from(i) + 1), page(i)))
        .collect();
    store.put(pages).unwrap();
}

fn hashes(n: u64) -> Vec<PageHash> {
    (0..n).map(|i| PageHash(u128::from(i) + 1)).collect()
}

/// Per tier, the pages an event stream says are held.
fn replay(events: &[StoreEvent]) -> (Vec<PageHash>, Vec<PageHash>) {
    let (mut ram, mut disk) = (Vec::new(), Vec::new());
    for e in events {
        let (stored, tier, hashes) = match e {
            StoreEvent::Stored { tier, hashes } => (true, tier, hashes),
            StoreEvent::Removed { tier, hashes } => (false, tier, hashes),
        };
        let set = if *tier == Source::Ram {
            &mut ram
        } else {
            &mut disk
        };
        for h in hashes {
            if stored {
                assert!(!set.contains(h), "stored twice: {h:?}");
                set.push(*h);
            } else {
                let i = set.iter().position(|x| x == h).expect("removed unheld");
                set.remove(i);
            }
        }
    }
    ram.sort();
    disk.sort();
    (ram, disk)
}

#[test]
fn events_follow_every_page_through_ram_spill_eviction_and_clear() {
    let dir = tempfile::tempdir().unwrap();
    // RAM for 4 pages; 16 pages of disk segments (64 KiB each holds 15 records) at most.
    let mut c = cfg(dir.path(), 4 * 4096, false);
    c.disk.as_mut().unwrap().max_bytes = 3 << 16;
    let store = PageStore::open(c.clone()).unwrap();
    put_n(&store, 2);
    store.record_events();
    let mut events = store.drain_events();
    assert_eq!(
        events,
        vec![StoreEvent::Stored {
            tier: Source::Ram,
            hashes: hashes(2)
        }],
        "recording starts with what is held"
    );
    put_n(&store, 60); // spills to disk, which evicts its oldest segments
    events.extend(store.drain_events());
    let held = |s: &PageStore| {
        let inner = s.lock();
        let mut ram: Vec<_> = inner.ram.keys().copied().collect();
        let mut disk: Vec<_> = inner.disk.as_ref().unwrap().index.keys().copied().collect();
        ram.sort();
        disk.sort();
        (ram, disk)
    };
    assert_eq!(replay(&events), held(&store));
    assert!(events.iter().any(|e| matches!(
        e,
        StoreEvent::Removed {
            tier: Source::Disk,
            ..
        }
    )));
    store.clear_ram().unwrap(); // spills RAM to disk
    store.clear_disk().unwrap();
    events.extend(store.drain_events());
    assert_eq!(replay(&events), (Vec::new(), Vec::new()));
    assert_eq!(store.drain_events(), Vec::new());
    // A restarted store announces the pages it finds on disk.
    put_n(&store, 3);
    store.flush().unwrap();
    drop(store);
    let again = PageStore::open(c).unwrap();
    again.record_events();
    assert_eq!(replay(&again.drain_events()), (Vec::new(), hashes(3)));
}

#[test]
fn pages_appended_after_a_torn_tail_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    put_n(&PageStore::open(cfg(dir.path(), 0, true)).unwrap(), 1);
    // The segment: one record, then a torn write, then — where a page of 4096 bytes
    // appended at the torn write would end — a stale record of that page's hash whose
    // checksum fails.
    let seg = segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&seg).unwrap();
    let off = HEADER + 4096;
    bytes[off..off + 8].copy_from_slice(b"torn....");
    let stale = off + HEADER + 4096;
    bytes[stale..stale + 4].copy_from_slice(MAGIC);
    bytes[stale + 4..stale + 8].copy_from_slice(&16u32.to_le_bytes());
    bytes[stale + 8..stale + 24].copy_from_slice(&PageHash(7).to_bytes());
    std::fs::write(&seg, &bytes).unwrap();
    let store = PageStore::open(cfg(dir.path(), 0, true)).unwrap();
    assert_eq!(store.stats().disk_pages, 1);
    store.put(vec![(PageHash(7), page(7))]).unwrap();
    drop(store);
    let store = PageStore::open(cfg(dir.path(), 0, true)).unwrap();
    assert_eq!(
        store.get(&[PageHash(1), PageHash(7)]),
        vec![Some(page(0)), Some(page(7))]
    );
    assert_eq!(store.stats().corrupted, 0);
}

#[test]
fn write_through_pages_survive_without_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let store = PageStore::open(cfg(dir.path(), 1 << 30, true)).unwrap();
    put_n(&store, 40);
    // A kill -9: no flush, no drop.
    std::mem::forget(store);
    let store = PageStore::open(cfg(dir.path(), 1 << 30, true)).unwrap();
    let got = store.get_tiered(&hashes(40));
    for (i, p) in got.into_iter().enumerate() {
        let (b, src) = p.expect("page survives");
        assert_eq!(b, page(i as u64));
        assert_eq!(src, Source::Disk);
    }
}

#[test]
fn ram_hits_and_disk_hits_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    // RAM for 10 of the 40 pages: the oldest 30 spill to disk.
    let store = PageStore::open(cfg(dir.path(), 10 * 4096, false)).unwrap();
    put_n(&store, 40);
    let got = store.get_tiered(&hashes(40));
    let disk = got
        .iter()
        .filter(|p| p.as_ref().unwrap().1 == Source::Disk)
        .count();
    assert_eq!(disk, 30);
    let s = store.stats();
    assert_eq!((s.ram_hits, s.disk_hits), (10, 30));
}

#[test]
fn clear_ram_keeps_pages_on_disk_and_clear_disk_removes_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = PageStore::open(cfg(dir.path(), 1 << 30, false)).unwrap();
    put_n(&store, 20);
    assert_eq!(store.stats().disk_pages, 0);
    store.clear_ram().unwrap();
    let s = store.stats();
    assert_eq!((s.ram_pages, s.disk_pages), (0, 20));
    assert_eq!(store.exists(&hashes(20)), 20);
    store.clear_disk().unwrap();
    assert_eq!(store.exists(&hashes(20)), 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // Still usable afterwards.
    put_n(&store, 3);
    assert_eq!(store.exists(&hashes(3)), 3);
}

#[test]
fn a_segment_truncated_under_the_store_is_a_miss_not_a_sigbus() {
    let dir = tempfile::tempdir().unwrap();
    let store = PageStore::open(cfg(dir.path(), 0, true)).unwrap();
    put_n(&store, 40); // 40 pages of 4 KiB over 64 KiB segments: several segments
    let first = segment_path(dir.path(), 0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap()
        .set_len(100)
        .unwrap();
    let got = store.get(&hashes(40));
    let misses = got.iter().filter(|p| p.is_none()).count();
    assert!(misses > 0 && misses < 40, "{misses} misses");
    for (i, p) in got.iter().enumerate() {
        if let Some(b) = p {
            assert_eq!(*b, page(i as u64));
        }
    }
    assert_eq!(store.stats().truncated_segments, 1);
    // Reopening skips the torn segment's records.
    drop(store);
    let store = PageStore::open(cfg(dir.path(), 0, true)).unwrap();
    let again = store.get(&hashes(40));
    assert_eq!(again.iter().filter(|p| p.is_none()).count(), misses);
}

#[test]
fn failed_disk_writes_are_counted_and_the_store_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let store = PageStore::open(cfg(dir.path(), 1 << 30, true)).unwrap();
    put_n(&store, 2);
    // Pull the directory away: new segments cannot be created.
    let seg_dir = dir.path().to_path_buf();
    std::fs::remove_dir_all(&seg_dir).unwrap();
    let pages = (100..140u64)
        .map(|i| (PageHash(u128::from(i)), page(i)))
        .collect();
    store.put(pages).unwrap();
    let s = store.stats();
    assert!(s.write_failures > 0, "{s:?}");
    // RAM still has them.
    let hs: Vec<PageHash> = (100..140u64).map(|i| PageHash(u128::from(i))).collect();
    assert_eq!(store.exists(&hs), 40);
}
