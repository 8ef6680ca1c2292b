use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
use sglrs_radix_cache::{KvStore, PageHash};
use sglrs_transfer::quic::RemoteStore;
use sglrs_transfer::store::{
    segment_path, serve, DiskConfig, PageStore, PageStoreConfig, StoreConfig,
};

use crate::common::*;

const N: u64 = 100_000;

fn hash(i: u64) -> PageHash {
    PageHash(u128::from(i).wrapping_mul(0x2545_F491_4F6C_DD1D_0000_0001) + 17)
}

fn pages_cfg(dir: &Path) -> PageStoreConfig {
    PageStoreConfig {
        ram_bytes: 1 << 20,
        disk: Some(DiskConfig {
            dir: dir.to_path_buf(),
            max_bytes: 1 << 34,
            segment_bytes: 1 << 20,
        }),
        disk_write_through: false,
    }
}

fn page(i: u64) -> Bytes {
    page_bytes(small_layout().page_bytes(), i).into()
}

fn check_all(store: &PageStore) {
    let hashes: Vec<PageHash> = (0..N).map(hash).collect();
    assert_eq!(store.exists(&hashes), N as usize);
    for (c, chunk) in hashes.chunks(5000).enumerate() {
        for (j, p) in store.get(chunk).into_iter().enumerate() {
            let i = (c * 5000 + j) as u64;
            assert_eq!(p.as_ref(), Some(&page(i)), "page {i}");
        }
    }
}

/// Finds page `h`'s record in a segment file (format in the store module docs) and returns
/// the offset of its data.
fn find_record(path: &Path, h: PageHash) -> Option<u64> {
    let data = std::fs::read(path).ok()?;
    let mut off = 0;
    while off + 32 <= data.len() && &data[off..off + 4] == b"SGKV" {
        let len = u32::from_le_bytes(data[off + 4..off + 8].try_into().unwrap()) as usize;
        if data[off + 8..off + 24] == h.to_bytes() {
            return Some((off + 32) as u64);
        }
        off += 32 + len;
    }
    None
}

fn corrupt(dir: &Path, h: PageHash) {
    for id in 0.. {
        let path = segment_path(dir, id);
        if !path.exists() {
            panic!("record not found");
        }
        if let Some(off) = find_record(&path, h) {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, off + 5).unwrap();
            f.write_all_at(&[b[0] ^ 0xff], off + 5).unwrap();
            return;
        }
    }
}

#[test]
fn page_store_100k_pages_survive_a_restart_and_corruption_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = PageStore::open(pages_cfg(dir.path())).unwrap();
        for c in 0..N / 1000 {
            let batch = (c * 1000..(c + 1) * 1000)
                .map(|i| (hash(i), page(i)))
                .collect();
            assert_eq!(store.put(batch).unwrap(), 1000);
        }
        let s = store.stats();
        assert!(s.ram_bytes <= 1 << 20 && s.disk_pages > 0, "{s:?}");
        check_all(&store);
        // Putting a page again leaves it as it is.
        store.put(vec![(hash(3), page(4))]).unwrap();
        assert_eq!(store.get(&[hash(3)])[0], Some(page(3)));
    } // dropped: RAM spills to disk
    let store = PageStore::open(pages_cfg(dir.path())).unwrap();
    assert_eq!(store.stats().ram_pages, 0);
    check_all(&store);
    // Corruption while the store runs: found on read, reported as a miss, never served.
    corrupt(dir.path(), hash(500));
    assert_eq!(
        store.get(&[hash(499), hash(500), hash(501)]),
        vec![Some(page(499)), None, Some(page(501))]
    );
    assert_eq!(store.exists(&[hash(499), hash(500), hash(501)]), 1);
    assert_eq!(store.stats().corrupted, 1);
    drop(store);
    // Corruption while it is down: the scan reads only headers; the read finds it.
    corrupt(dir.path(), hash(90_000));
    let store = PageStore::open(pages_cfg(dir.path())).unwrap();
    assert_eq!(store.get(&[hash(90_000)]), vec![None]);
    assert_eq!(
        store.stats().corrupted,
        1,
        "found on read, dropped from the index"
    );
    assert_eq!(store.exists(&[hash(90_000)]), 0);
    assert_eq!(store.get(&[hash(89_999)]), vec![Some(page(89_999))]);
}

#[test]
fn disk_budget_drops_the_oldest_segments() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = PageStoreConfig {
        ram_bytes: 0,
        disk: Some(DiskConfig {
            dir: dir.path().into(),
            max_bytes: 4 << 20,
            segment_bytes: 1 << 20,
        }),
        disk_write_through: false,
    };
    let store = PageStore::open(cfg).unwrap();
    for i in 0..N {
        store.put(vec![(hash(i), page(i))]).unwrap();
    }
    let s = store.stats();
    assert!(s.disk_bytes <= 4 << 20, "{s:?}");
    assert!(store.get(&[hash(0)])[0].is_none(), "oldest pages are gone");
    assert_eq!(store.get(&[hash(N - 1)])[0], Some(page(N - 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_store_serves_100k_pages_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        addr: any_port(),
        layout: small_layout(),
        security: security(b"store secret"),
        quic: fast_config(),
        pages: pages_cfg(dir.path()),
    };
    let server = serve(cfg.clone()).unwrap();
    let addr = server.local_addr().unwrap();
    let client = RemoteStore::connect(
        any_port(),
        addr,
        small_layout(),
        &security(b"store secret"),
        fast_config(),
    )
    .await
    .unwrap();
    for c in 0..N / 2000 {
        let batch = (c * 2000..(c + 1) * 2000)
            .map(|i| (hash(i), page(i)))
            .collect();
        assert_eq!(client.put_async(batch).await.unwrap(), 2000);
    }
    let hashes: Vec<PageHash> = (0..N).map(hash).collect();
    assert_eq!(
        client.exists_async(hashes.clone()).await.unwrap(),
        N as usize
    );
    let mut miss = hashes[..10].to_vec();
    miss.insert(5, PageHash(1));
    assert_eq!(client.exists_async(miss.clone()).await.unwrap(), 5);
    for (c, chunk) in hashes.chunks(10_000).enumerate() {
        let got = client.get_async(chunk.to_vec()).await.unwrap();
        for (j, p) in got.into_iter().enumerate() {
            assert_eq!(p, Some(page((c * 10_000 + j) as u64)));
        }
    }
    let got = client.get_async(miss).await.unwrap();
    assert!(got[5].is_none() && got[4].is_some());
    drop(client);
    server.shutdown().await.unwrap();

    // Restart on the same directory: the spilled pages are served again.
    let server = serve(cfg.clone()).unwrap();
    let addr = server.local_addr().unwrap();
    assert_eq!(server.store().stats().disk_pages, N as usize);
    let client = RemoteStore::connect(
        any_port(),
        addr,
        small_layout(),
        &security(b"store secret"),
        fast_config(),
    )
    .await
    .unwrap();
    assert_eq!(
        client.exists_async(hashes.clone()).await.unwrap(),
        N as usize
    );
    let got = client.get_async(hashes[..1000].to_vec()).await.unwrap();
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, p)| p.as_ref() == Some(&page(i as u64))));
    // A corrupted page file is a miss, never served.
    corrupt(dir.path(), hash(7));
    let got = client
        .get_async(vec![hash(6), hash(7), hash(8)])
        .await
        .unwrap();
    assert_eq!(got, vec![Some(page(6)), None, Some(page(8))]);

    // The blocking KvStore face, as the runtime's cache I/O thread uses it.
    let sec = security(b"store secret");
    let blocking = std::thread::spawn(move || {
        let store =
            RemoteStore::connect_blocking(addr, small_layout(), &sec, fast_config()).unwrap();
        let kv: &dyn KvStore = &store;
        kv.put(&[(PageHash(u128::MAX), page(1))]).unwrap();
        assert_eq!(kv.exists(&[PageHash(u128::MAX), hash(0)]).unwrap(), 2);
        assert_eq!(kv.get(&[PageHash(u128::MAX)]).unwrap(), vec![Some(page(1))]);
    });
    blocking.join().unwrap();
    drop(client);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_store_refuses_a_wrong_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        addr: any_port(),
        layout: small_layout(),
        security: security(b"right"),
        quic: fast_config(),
        pages: pages_cfg(dir.path()),
    };
    let server = serve(cfg).unwrap();
    let client = RemoteStore::connect(
        any_port(),
        server.local_addr().unwrap(),
        small_layout(),
        &security(b"wrong"),
        fast_config(),
    )
    .await
    .unwrap();
    let err = client.exists_async(vec![hash(1)]).await.unwrap_err();
    assert!(err.to_string().contains("authentication failed"), "{err}");
    let kv: &dyn KvStore = &client;
    let _ = kv; // the trait object is usable from blocking threads only
}
