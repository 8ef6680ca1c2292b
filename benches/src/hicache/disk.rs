//! The disk tier's read rate: dropping segment files from the page cache, reading every
//! page of a `PageStore` back, and `dd` of the largest segment for comparison.

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sglrs_radix_cache::store::{DiskConfig, PageStore, PageStoreConfig};

/// Bytes and seconds from `dd`'s summary (GNU: `N bytes (…) copied, S s, R MB/s`; busybox:
/// `N bytes (…) copied, S seconds, R/s`).
fn parse_dd(stderr: &str) -> Option<(u64, f64)> {
    let line = stderr.lines().rev().find(|l| l.contains(" copied"))?;
    let bytes = line.split_whitespace().next()?.parse().ok()?;
    let (_, after) = line.split_once(" copied, ")?;
    let secs = after.split_whitespace().next()?;
    Some((bytes, secs.parse().ok()?))
}

/// The segment files `seg-*.kv` of `dir`, sorted.
fn segments(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seg-") && n.ends_with(".kv"))
        })
        .collect();
    v.sort();
    Ok(v)
}

/// Drops `files` from the page cache; says which ways worked.
fn drop_caches(files: &[PathBuf]) -> String {
    let mut advised = 0;
    for p in files {
        let Ok(f) = std::fs::File::open(p) else {
            continue;
        };
        // Dirty pages are not dropped: write them back first.
        let _ = f.sync_all();
        // SAFETY: `f` is an open file for the whole call; the call takes no pointers.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc == 0 {
            advised += 1;
        }
    }
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let global = match std::fs::write("/proc/sys/vm/drop_caches", "1") {
        Ok(()) => "drop_caches written".to_string(),
        Err(e) => format!("drop_caches not writable ({e})"),
    };
    format!(
        "fadvise(DONTNEED) on {advised}/{} files, {global}",
        files.len()
    )
}

/// `dd` of the first `bytes` of `file` (`direct`: O_DIRECT); (bytes, seconds) or why not.
fn dd(file: &Path, bytes: u64, direct: bool) -> Result<(u64, f64), String> {
    const BS: u64 = 4 << 20;
    let mut cmd = Command::new("dd");
    cmd.env("LC_ALL", "C")
        .arg(format!("if={}", file.display()))
        .args(["of=/dev/null", "bs=4M"])
        .arg(format!("count={}", bytes.div_ceil(BS).max(1)));
    if direct {
        cmd.arg("iflag=direct");
    }
    let out = cmd.output().map_err(|e| format!("running dd: {e}"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(err.trim().to_string());
    }
    parse_dd(&err).ok_or_else(|| format!("unreadable dd output: {}", err.trim()))
}

/// The disk read rate of the store on `dir` against `dd` on its largest segment.
pub(super) fn disk_read(dir: &Path) -> anyhow::Result<Value> {
    println!("disk_read: {}", dir.display());
    let files = segments(dir)?;
    if files.is_empty() {
        bail!(
            "no seg-*.kv in {}: the restart servers left no disk tier",
            dir.display()
        );
    }
    let note_open = drop_caches(&files);
    let t0 = Instant::now();
    let store = PageStore::open(PageStoreConfig {
        ram_bytes: 0,
        disk: Some(DiskConfig {
            dir: dir.to_path_buf(),
            max_bytes: u64::MAX,
            segment_bytes: 64 << 20,
        }),
        disk_write_through: false,
    })
    .with_context(|| format!("opening the page store in {}", dir.display()))?;
    let hashes = store.stored_hashes();
    let open_s = t0.elapsed().as_secs_f64();
    let note_get = drop_caches(&files);
    let t0 = Instant::now();
    let pages = store.get(&hashes);
    let get_s = t0.elapsed().as_secs_f64();
    let bytes: u64 = pages.iter().flatten().map(|p| p.len() as u64).sum();
    let found = pages.iter().flatten().count();
    drop(pages);
    drop(store);
    if bytes == 0 {
        bail!("the page store in {} returned no pages", dir.display());
    }
    let gb_s = bytes as f64 / get_s.max(1e-9) / 1e9;
    println!(
        "  open {open_s:.3} s; get {found}/{} pages, {:.1} MB in {get_s:.3} s = {gb_s:.2} GB/s",
        hashes.len(),
        bytes as f64 / 1e6
    );
    println!("  page cache: {note_get}");

    // The largest segment by allocated bytes: records fill a preallocated (sparse) file
    // from its start, so that prefix is what was written.
    let (seg, used) = files
        .iter()
        .filter_map(|p| {
            let m = std::fs::metadata(p).ok()?;
            let alloc = m.blocks() * 512;
            Some((
                p.clone(),
                if alloc == 0 {
                    m.len()
                } else {
                    alloc.min(m.len())
                },
            ))
        })
        .max_by_key(|(_, n)| *n)
        .ok_or_else(|| anyhow!("no readable segment in {}", dir.display()))?;
    let note_dd = drop_caches(&files);
    let (dd_note, (dd_bytes, dd_s)) = match dd(&seg, used, true) {
        Ok(r) => ("O_DIRECT".to_string(), r),
        Err(why) => {
            let again = drop_caches(&files);
            let r = dd(&seg, used, false).map_err(|e| anyhow!("dd of {}: {e}", seg.display()))?;
            (
                format!("O_DIRECT refused ({why}); plain dd after dropping caches ({again})"),
                r,
            )
        }
    };
    let dd_gb_s = dd_bytes as f64 / dd_s.max(1e-9) / 1e9;
    println!(
        "  dd {}: {:.1} MB in {dd_s:.3} s = {dd_gb_s:.2} GB/s ({dd_note}; {note_dd})",
        seg.display(),
        dd_bytes as f64 / 1e6
    );
    Ok(json!({
        "disk_read_gb_s": gb_s,
        "dd_read_gb_s": dd_gb_s,
        "dd_note": dd_note,
        "disk_read_note": format!(
            "{found} pages, {bytes} bytes in {get_s:.3} s after open ({open_s:.3} s); page cache before open: {note_open}; before get: {note_get}"
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hicache::RunDir;
    use sglrs_radix_cache::PageHash;

    #[test]
    fn dd_output() {
        let gnu = "25+0 records in\n25+0 records out\n104857600 bytes (105 MB, 100 MiB) copied, 0.0523 s, 2.0 GB/s\n";
        assert_eq!(parse_dd(gnu), Some((104857600, 0.0523)));
        let gnu1 = "1+0 records in\n1+0 records out\n4194304 bytes (4.2 MB, 4.0 MiB) copied, 1 s, 4.2 MB/s";
        assert_eq!(parse_dd(gnu1), Some((4194304, 1.0)));
        let busybox = "25+0 records in\n25+0 records out\n104857600 bytes (100.0MB) copied, 0.061234 seconds, 1.6GB/s";
        assert_eq!(parse_dd(busybox), Some((104857600, 0.061234)));
        assert_eq!(parse_dd("dd: failed to open 'x': Invalid argument"), None);
    }

    #[test]
    fn segment_hashes_and_dd() {
        let tmp = RunDir::new(None).expect("temp folder");
        let dir = tmp.fresh("store").expect("store folder");
        let cfg = PageStoreConfig {
            ram_bytes: 0,
            disk: Some(DiskConfig {
                dir: dir.clone(),
                max_bytes: u64::MAX,
                segment_bytes: 1 << 20,
            }),
            disk_write_through: false,
        };
        let pages: Vec<(PageHash, bytes::Bytes)> = (0..40u8)
            .map(|i| (PageHash(u128::from(i) << 64 | 7), vec![i; 64 << 10].into()))
            .collect();
        let store = PageStore::open(cfg.clone()).expect("open");
        store.put(pages.clone()).expect("put");
        store.flush().expect("flush");
        drop(store);
        let files = segments(&dir).expect("segments");
        assert!(files.len() >= 2, "40 pages of 64 KiB span 1 MiB segments");
        let store = PageStore::open(cfg).expect("reopen");
        let mut hashes = store.stored_hashes();
        hashes.sort_by_key(|h| h.0);
        let want: Vec<PageHash> = pages.iter().map(|p| p.0).collect();
        assert_eq!(hashes, want);
        let got = store.get(&hashes);
        assert!(got
            .iter()
            .zip(&pages)
            .all(|(g, p)| g.as_ref() == Some(&p.1)));
        let (bytes, secs) = dd(&files[0], 1 << 20, false).expect("dd");
        assert_eq!(bytes, 1 << 20);
        assert!(secs >= 0.0);
    }
}
