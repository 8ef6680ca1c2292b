//! `sglrs kv-store` as a process: pages put over QUIC come back byte for byte, survive a
//! restart on the same folder (SIGTERM spills RAM to disk first), and a client with another
//! cluster identity is refused at the handshake.

use bytes::Bytes;
use sglrs_radix_cache::{KvDtype, KvLayout, KvStore, PageHash};
use sglrs_tests::{default_model, sglrs_bin};
use sglrs_transfer::quic::{QuicConfig, RemoteStore};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bundled model's page layout at the server's defaults (16 tokens, f16).
fn layout() -> KvLayout {
    KvLayout {
        dtype: KvDtype::F16,
        ..KvLayout::smollm2_135m()
    }
}

/// A free UDP port on loopback that this process was not given before: the OS may hand a
/// just-released port out again, and two stores listed on one address do not start.
fn free_udp() -> SocketAddr {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..100 {
        let a = UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("a free UDP port");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&a.port()) {
            given.push(a.port());
            return a;
        }
    }
    panic!("no UDP port not given before in 100 tries")
}

fn identity(dir: &Path) {
    let out = Command::new(sglrs_bin())
        .args(["cluster-identity", "--out"])
        .arg(dir)
        .output()
        .expect("sglrs cluster-identity");
    assert!(out.status.success(), "{out:?}");
}

/// A running `sglrs kv-store`, SIGTERMed (then killed) on drop.
struct Store(Child);

impl Store {
    fn start(addr: SocketAddr, dir: &Path, id: &Path) -> Store {
        let mut child = Command::new(sglrs_bin())
            .args([
                "kv-store",
                "--listen",
                &addr.to_string(),
                "--ram-gb",
                "0.01",
            ])
            .arg("--dir")
            .arg(dir)
            .arg("--cluster-identity")
            .arg(id)
            .arg("--model")
            .arg(default_model())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting sglrs kv-store");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("KV store on") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the store announces itself within a minute");
        Store(child)
    }

    /// SIGTERM and wait (bounded): the store spills RAM to disk and exits 0.
    fn stop(mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(status)) = self.0.try_wait() {
                assert!(status.success(), "kv-store exited with {status}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("kv-store did not stop within 30 s of SIGTERM");
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pages(n: u64) -> Vec<(PageHash, Bytes)> {
    let pb = layout().page_bytes();
    (0..n)
        .map(|i| {
            let mut v = vec![0u8; pb];
            let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for c in v.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
            }
            (PageHash(u128::from(i) * 7919 + 1), Bytes::from(v))
        })
        .collect()
}

#[test]
fn pages_come_back_across_a_restart_and_a_foreign_identity_is_refused() {
    let tmp = std::env::temp_dir().join(format!("sglrs-kv-store-{}", std::process::id()));
    let (data, id, other) = (tmp.join("data"), tmp.join("id"), tmp.join("other"));
    std::fs::create_dir_all(&tmp).unwrap();
    identity(&id);
    identity(&other);
    let security = sglrs_server::pd::read_identity(&id).unwrap();
    let addr = free_udp();
    let want = pages(200); // 74 MB: most of it beyond the 10 MiB RAM budget, on disk
    let hashes: Vec<PageHash> = want.iter().map(|(h, _)| *h).collect();

    let store = Store::start(addr, &data, &id);
    let client = RemoteStore::connect_blocking(addr, layout(), &security, QuicConfig::loopback())
        .expect("connecting to the store");
    client.put(&want).expect("put");
    assert_eq!(client.exists(&hashes).unwrap(), want.len());
    let got = client.get(&hashes).expect("get");
    for ((h, page), g) in want.iter().zip(&got) {
        assert_eq!(g.as_deref(), Some(&page[..]), "page {h:?}");
    }
    drop(client);
    store.stop();

    // A restart on the same folder serves every page.
    let store = Store::start(addr, &data, &id);
    let client = RemoteStore::connect_blocking(addr, layout(), &security, QuicConfig::loopback())
        .expect("reconnecting to the restarted store");
    let got = client.get(&hashes).expect("get after the restart");
    assert!(
        want.iter()
            .zip(&got)
            .all(|((_, p), g)| g.as_deref() == Some(&p[..])),
        "every page back after the restart"
    );
    drop(client);

    // Another cluster's certificate is refused by TLS, fast.
    let foreign = sglrs_server::pd::read_identity(&other).unwrap();
    let t0 = Instant::now();
    let served = RemoteStore::connect_blocking(addr, layout(), &foreign, QuicConfig::loopback())
        .map(|c| c.exists(&hashes[..1]).is_ok())
        .unwrap_or(false);
    assert!(!served, "a foreign identity was served");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    store.stop();
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Two stores as one remote tier (`StoreSet`): pages spread over both by page hash and come
/// back byte for byte; a killed store's pages are misses within the read timeout, never an
/// error or a hang; the store restarted is redialed and serves again; a store of another
/// cluster is reported down and never read.
#[test]
fn a_store_set_spreads_pages_survives_a_dead_store_and_redials_a_restarted_one() {
    use sglrs_transfer::quic::{StoreSet, StoreSetConfig};
    let tmp = std::env::temp_dir().join(format!("sglrs-kv-set-{}", std::process::id()));
    let (id, other) = (tmp.join("id"), tmp.join("other"));
    std::fs::create_dir_all(&tmp).unwrap();
    identity(&id);
    identity(&other);
    let security = sglrs_server::pd::read_identity(&id).unwrap();
    let (a, b, c) = (free_udp(), free_udp(), free_udp());
    let sa = Store::start(a, &tmp.join("a"), &id);
    let sb = Store::start(b, &tmp.join("b"), &id);
    let _foreign = Store::start(c, &tmp.join("c"), &other);
    let read_timeout = Duration::from_millis(500);
    let set = StoreSet::start(StoreSetConfig {
        addrs: vec![a.to_string(), b.to_string(), c.to_string()],
        layout: layout(),
        security,
        quic: QuicConfig::loopback(),
        read_timeout,
        write_timeout: Duration::from_secs(10),
        max_write_bytes: 256 << 20,
        connect_grace: Duration::from_secs(5),
    })
    .expect("starting the store set");
    let st = set.stats();
    assert_eq!(st.stores[0].state, "connected", "{st:?}");
    assert_eq!(st.stores[1].state, "connected", "{st:?}");
    assert_eq!(
        st.stores[2].state, "down",
        "another cluster's store: {st:?}"
    );

    let want = pages(60);
    let hashes: Vec<PageHash> = want.iter().map(|(h, _)| *h).collect();
    set.write(want.clone());
    let t0 = Instant::now();
    while set.writes_pending() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = set.stats();
    let on_c = hashes.iter().filter(|h| set.owner(h) == 2).count() as u64;
    assert!(
        on_c > 0 && on_c < 60,
        "the pages spread over all three: {on_c}"
    );
    assert_eq!(st.written_pages, 60 - on_c, "{st:?}");
    assert_eq!(
        st.dropped_pages, on_c,
        "the foreign store's share is dropped: {st:?}"
    );
    let got = set.get(&hashes);
    for ((h, page), g) in want.iter().zip(&got) {
        if set.owner(h) == 2 {
            assert!(g.is_none());
        } else {
            assert_eq!(g.as_deref(), Some(&page[..]), "page {h:?}");
        }
    }
    // Written again: the stores hold them, nothing is sent.
    set.write(want.clone());
    while set.writes_pending() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(set.stats().written_pages, 60 - on_c);

    // Store a killed: its pages are misses, within the read timeout.
    drop(sa);
    let t = Instant::now();
    let got = set.get(&hashes);
    assert!(
        t.elapsed() < read_timeout + Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
    for (h, g) in hashes.iter().zip(&got) {
        assert_eq!(g.is_some(), set.owner(h) == 1, "page {h:?}");
    }
    // Restarted (SIGKILL lost what was in its RAM): redialed, written again (only its own
    // pages are sent), and every page is a hit again.
    let _sa = Store::start(a, &tmp.join("a"), &id);
    let t = Instant::now();
    while set.stats().stores[0].connects < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no redial: {:?}",
            set.stats()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    set.write(want.clone());
    loop {
        let got = set.get(&hashes);
        let hits = got.iter().filter(|g| g.is_some()).count() as u64;
        if hits == 60 - on_c {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no redial: {:?}",
            set.stats()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(set.stats().stores[0].connects >= 2);
    drop(set);
    drop(sb);
    let _ = std::fs::remove_dir_all(&tmp);
}
