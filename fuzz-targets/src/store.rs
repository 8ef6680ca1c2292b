//! The page store's disk segment files (`sglrs_radix_cache::store`).

use bytes::Bytes;
use sglrs_radix_cache::checksum::page_checksum;
use sglrs_radix_cache::store::{segment_path, DiskConfig, PageStore, PageStoreConfig};
use sglrs_radix_cache::PageHash;
use std::collections::HashMap;

use crate::input::Input;

/// Largest segment file tried.
const MAX_SEGMENT: usize = 64 << 10;

const MAGIC: &[u8; 4] = b"SGKV";
const HEADER: usize = 32;

/// The records a scan of `seg` finds, by the format `store.rs` documents
/// (`[b"SGKV"][u32 len][16-byte hash][u64 xxh3-64][data]`, up to the first bad magic or torn
/// record; a later record of a hash replaces an earlier one): hash → (checksum, data).
fn reference_scan(seg: &[u8]) -> HashMap<PageHash, (u64, &[u8])> {
    let mut out = HashMap::new();
    let mut off = 0;
    while off + HEADER <= seg.len() && &seg[off..off + 4] == MAGIC {
        let len = u32::from_le_bytes(seg[off + 4..off + 8].try_into().expect("4 bytes")) as usize;
        let hash = PageHash::from_bytes(seg[off + 8..off + 24].try_into().expect("16 bytes"));
        let sum = u64::from_le_bytes(seg[off + 24..off + 32].try_into().expect("8 bytes"));
        let data = off + HEADER;
        if data + len > seg.len() {
            break;
        }
        out.insert(hash, (sum, &seg[data..data + len]));
        off = data + len;
    }
    out
}

/// Writes the input as segment file 0 (optionally followed by a second segment cut from
/// the same bytes), opens a [`PageStore`] on it, and reads every page the store lists.
/// Asserts that the store serves exactly the records whose checksum holds, with their
/// bytes (a corrupted record is a miss, never served), and that pages put after it — in
/// the open segment's remaining space or in a new one — are served back, before and after
/// reopening the store.
pub fn store_segment(data: &[u8]) {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let seg = inp.rest();
    if seg.len() > MAX_SEGMENT {
        return;
    }
    let dir = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm"),
        false => tempfile::tempdir(),
    }
    .expect("a temporary directory");
    std::fs::write(segment_path(dir.path(), 0), seg).expect("write the segment");
    let mut expect = reference_scan(seg);
    if flags & 1 != 0 {
        // A second segment, newer: its records replace the first one's.
        let second = &seg[seg.len() / 2..];
        std::fs::write(segment_path(dir.path(), 1), second).expect("write the segment");
        expect.extend(reference_scan(second));
    }
    let cfg = PageStoreConfig {
        ram_bytes: if flags & 2 != 0 { 0 } else { 1 << 16 },
        disk: Some(DiskConfig {
            dir: dir.path().to_path_buf(),
            max_bytes: 1 << 20,
            segment_bytes: 4096,
        }),
        disk_write_through: flags & 4 != 0,
    };
    let store = PageStore::open(cfg.clone()).expect("the store opens on any segment bytes");
    let listed = store.stored_hashes();
    let mut want: Vec<PageHash> = expect.keys().copied().collect();
    want.sort_unstable_by_key(|h| h.0);
    let mut got_listed = listed.clone();
    got_listed.sort_unstable_by_key(|h| h.0);
    assert_eq!(
        got_listed, want,
        "listed pages differ from the segment's records"
    );
    let pages = store.get(&listed);
    for (h, p) in listed.iter().zip(&pages) {
        let (sum, bytes) = expect[h];
        let intact = page_checksum(bytes) == sum;
        match p {
            Some(p) => {
                assert!(intact, "served a page whose checksum fails");
                assert_eq!(&p[..], bytes, "served other bytes than the record's");
            }
            None => assert!(!intact, "an intact record was not served"),
        }
    }
    assert_eq!(store.exists(&[]), 0);

    // New pages after the fuzzed ones; hash 0 may already be there.
    let new: Vec<(PageHash, Bytes)> = (1..=3u8)
        .map(|i| {
            let len = usize::from(flags >> 4) * 100 + usize::from(i);
            (
                PageHash(u128::MAX - u128::from(i)),
                Bytes::from(vec![i; len]),
            )
        })
        .filter(|(h, _)| !expect.contains_key(h))
        .collect();
    let hashes: Vec<PageHash> = new.iter().map(|(h, _)| *h).collect();
    store.put(new.clone()).expect("put");
    if flags & 8 != 0 {
        store.flush().expect("flush");
    } else {
        store.clear_ram().expect("clear_ram");
    }
    let check = |store: &PageStore| {
        for ((_, want), got) in new.iter().zip(store.get(&hashes)) {
            assert_eq!(
                got.as_deref(),
                Some(&want[..]),
                "a page put was not served back"
            );
        }
    };
    check(&store);
    drop(store);
    let store = PageStore::open(cfg).expect("the store reopens");
    check(&store);
}
