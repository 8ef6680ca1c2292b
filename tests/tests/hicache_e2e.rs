//! End-to-end tests of the hierarchical cache: conversations evicted from the device pool
//! come back from the host and disk tiers with the same tokens and logprobs as a fresh
//! server computes, a restart serves the disk tier, damaged segment files are misses (never
//! wrong output, never a crash), a full filesystem is survived, and `/flush_cache` leaves
//! nothing behind. Real binary, real model, 127.0.0.1 only; one server at a time.

use serde_json::{json, Value};
use sglrs_tests::Server;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A device pool of 182 pages (2,912 tokens): eight ~600-token prompts overflow it.
const SMALL_POOL: &[&str] = &["--kv-memory-mb", "64", "--context-length", "2048"];

fn lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn start(tiers: &[&str]) -> Server {
    let mut args: Vec<&str> = SMALL_POOL.to_vec();
    args.extend_from_slice(tiers);
    Server::start(&args)
}

fn disk_flags(dir: &Path) -> Vec<String> {
    [
        "--enable-hierarchical-cache",
        "--hicache-ratio",
        "0",
        "--hicache-storage-backend",
        "file",
        "--hicache-storage-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([dir.display().to_string()])
    .collect()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Deterministic prose of `words` words, different for every `seed`.
fn prose(seed: u64, words: usize) -> String {
    const W: &[&str] = &[
        "river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "engine", "orchard",
        "signal", "winter", "canvas", "falcon", "marble", "thunder", "garden",
    ];
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..words)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            W[(x >> 33) as usize % W.len()]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Greedy answer with output logprobs (top 5), as the acceptance asks.
fn ask(s: &Server, text: &str) -> Value {
    let (status, v) = s.post(
        "/generate",
        &json!({"text": text,
                "sampling_params": {"max_new_tokens": 8, "temperature": 0},
                "return_logprob": true, "top_logprobs_num": 5}),
    );
    assert_eq!(status, 200, "{v}");
    v
}

fn details(v: &Value) -> (u64, u64, u64) {
    let d = &v["meta_info"]["cached_tokens_details"];
    let n = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    (n("device"), n("host"), n("disk"))
}

/// What must be bit-identical between two answers to the same request.
fn answer(v: &Value) -> Value {
    json!([
        v["text"],
        v["meta_info"]["output_token_logprobs"],
        v["meta_info"]["output_top_logprobs"]
    ])
}

fn internal(s: &Server) -> Value {
    s.server_info()["internal_states"][0].clone()
}

/// Polls until nothing runs, waits or is being copied (at most 60 s).
fn wait_idle(s: &Server) -> Value {
    let t = Instant::now();
    loop {
        let st = internal(s);
        let c = &st["cache"];
        if st["num_running_reqs"] == 0
            && st["num_waiting_reqs"] == 0
            && c["running_pages"] == 0
            && c["held_locks"] == 0
        {
            return st;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "not idle: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asks prompt 0, then seven others that push it out of the device pool, then prompt 0
/// again; returns the first and the last answer.
fn evict_and_return(s: &Server) -> (Value, Value) {
    let first = ask(s, &prose(0, 600));
    for i in 1..8 {
        ask(s, &prose(i, 600));
    }
    wait_idle(s);
    (first, ask(s, &prose(0, 600)))
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sglrs-hicache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "kv"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_tier_serves_the_tokens_and_logprobs_a_fresh_server_computes() {
    let _g = lock();
    let reference = {
        let s = start(&[]);
        let r = ask(&s, &prose(0, 600));
        assert_eq!(details(&r), (0, 0, 0));
        answer(&r)
    };

    // Host tier.
    let s = start(&["--enable-hierarchical-cache", "--hicache-size", "1"]);
    let (first, again) = evict_and_return(&s);
    assert_eq!(answer(&first), reference);
    let (device, host, disk) = details(&again);
    assert!(host > 0 && disk == 0, "{}", again["meta_info"]);
    assert!(device + host >= 576, "{}", again["meta_info"]);
    assert_eq!(answer(&again), reference, "served from the host tier");
    let st = internal(&s);
    assert!(st["cached_tokens_by_source"]["host"].as_u64().unwrap() >= host);
    drop(s);

    // Disk tier, then a clean restart on the same directory.
    let dir = tempdir("tiers");
    let flags = disk_flags(&dir);
    let s = start(&refs(&flags));
    let (_, again) = evict_and_return(&s);
    let (_, host, disk) = details(&again);
    assert!(disk > 0 && host == 0, "{}", again["meta_info"]);
    assert_eq!(answer(&again), reference, "served from the disk tier");
    assert!(s.terminate(), "a clean shutdown exits with status 0");
    let s = start(&refs(&flags));
    let warm = ask(&s, &prose(0, 600));
    let (device, _, disk) = details(&warm);
    assert_eq!(device, 0);
    assert!(disk >= 576, "{}", warm["meta_info"]);
    assert_eq!(answer(&warm), reference, "served after a restart");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_segments_are_misses_and_the_output_stays_right() {
    let _g = lock();
    let dir = tempdir("damage");
    let flags = disk_flags(&dir);
    let s = start(&refs(&flags));
    let reference = answer(&ask(&s, &prose(0, 600)));
    let other = answer(&ask(&s, &prose(1, 600)));
    wait_idle(&s);
    drop(s); // kill -9: what was written through is on disk

    // Flip bytes inside every record's data while the server is down.
    let segs = segments(&dir);
    assert!(!segs.is_empty());
    for seg in &segs {
        let mut b = std::fs::read(seg).unwrap();
        let mut off = 0usize;
        while off + 32 <= b.len() && &b[off..off + 4] == b"SGKV" {
            let len = u32::from_le_bytes(b[off + 4..off + 8].try_into().unwrap()) as usize;
            if (off / 32).is_multiple_of(3) {
                b[off + 32 + len / 2] ^= 0x5a;
            }
            off += 32 + len;
        }
        std::fs::write(seg, b).unwrap();
    }
    let s = start(&refs(&flags));
    let r = ask(&s, &prose(0, 600));
    let st = internal(&s);
    assert!(
        st["hicache_store"]["corrupted_pages"].as_u64().unwrap() > 0,
        "reads verified the flipped records: {st}"
    );
    let (_, _, disk) = details(&r);
    assert!(
        disk < 592,
        "a corrupted page ends the hit: {}",
        r["meta_info"]
    );
    assert_eq!(answer(&r), reference, "misses are recomputed");

    // Truncate every segment while the server runs, then ask for prompt 1 (on disk, not
    // on the device: pushed out by others).
    for i in 2..8 {
        ask(&s, &prose(i, 600));
    }
    wait_idle(&s);
    for seg in segments(&dir) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(4096)
            .unwrap();
    }
    let r = ask(&s, &prose(1, 600));
    assert_eq!(
        answer(&r),
        other,
        "a truncated segment is a miss, not a SIGBUS"
    );
    let st = internal(&s);
    assert!(
        st["hicache_store"]["truncated_segments"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert_eq!(s.get("/health").0, 200);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_filesystem_counts_failed_writes_and_keeps_serving() {
    let _g = lock();
    let dir = tempdir("full");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a small tmpfs here (needs root)");
        return;
    }
    let flags = disk_flags(&dir);
    let s = start(&refs(&flags));
    for i in 0..4 {
        let r = ask(&s, &prose(i, 600));
        assert!(r["text"].is_string());
    }
    let st = wait_idle(&s);
    assert!(
        st["hicache_store"]["failed_writes"].as_u64().unwrap() > 0,
        "2 MB cannot hold ~2,400 tokens of KV: {st}"
    );
    assert_eq!(s.get("/health").0, 200);
    drop(s);
    let _ = std::process::Command::new("umount").arg(&dir).status();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flush_cache_returns_pages_and_locks_to_baseline_and_keeps_the_disk_tier() {
    let _g = lock();
    let dir = tempdir("flush");
    let mut flags = disk_flags(&dir);
    flags[2] = "1".into(); // --hicache-ratio 1: a host tier as well
    let s = start(&refs(&flags));
    let base = wait_idle(&s)["cache"].clone();
    std::thread::scope(|sc| {
        let s = &s;
        let hs: Vec<_> = (0..6)
            .map(|i| sc.spawn(move || ask(s, &prose(i, 400))))
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    wait_idle(&s);
    let (status, body) = s.post("/flush_cache", &json!({}));
    assert_eq!(status, 200, "{body}");
    let st = internal(&s);
    assert_eq!(st["cache"]["free_pages"], base["free_pages"], "{st}");
    assert_eq!(st["cache"]["tree_pages"], 0, "{st}");
    assert_eq!(st["cache"]["running_pages"], 0, "{st}");
    assert_eq!(st["cache"]["held_locks"], 0, "{st}");
    assert_eq!(st["hicache_store"]["host_pages"], 0, "{st}");
    let on_disk = st["hicache_store"]["disk_pages"].as_u64().unwrap();
    assert!(on_disk > 0, "a flush keeps the disk tier: {st}");
    // The flushed prompts come back from disk.
    let r = ask(&s, &prose(0, 400));
    assert!(details(&r).2 > 0, "{}", r["meta_info"]);
    let (status, _) = s.post("/clear_hicache_storage_backend", &json!({}));
    assert_eq!(status, 200);
    assert_eq!(internal(&s)["hicache_store"]["disk_pages"], 0);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn write_back_stores_evicted_pages_and_serves_them_with_the_same_answer() {
    let _g = lock();
    let dir = tempdir("write-back");
    let mut flags = disk_flags(&dir);
    flags.extend(["--hicache-write-policy".into(), "write_back".into()]);
    let s = start(&refs(&flags));
    let (first, again) = evict_and_return(&s);
    let (_, _, disk) = details(&again);
    assert!(disk > 0, "{}", again["meta_info"]);
    assert_eq!(answer(&again), answer(&first));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
