//! The hierarchical cache's remote tier (`--hicache-storage-backend quic`): the KV stores
//! (`sglrs kv-store`) named by `--hicache-storage-addr`, as one [`StoreSet`], behind the
//! scheduler's [`RemoteTier`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sglrs_radix_cache::{KvLayout, PageHash};
use sglrs_scheduler::hicache::RemoteTier;
use sglrs_transfer::quic::{QuicConfig, StoreSet, StoreSetConfig};

use super::{read_identity, DisaggArgs};
use crate::hicache::HiCacheArgs;

/// Bytes of remote writes in flight at most; writes beyond it are dropped and counted.
const MAX_WRITE_BYTES: usize = 256 << 20;
/// The longest a remote write waits for its answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long start-up waits for the first connections.
const CONNECT_GRACE: Duration = Duration::from_secs(2);

/// The remote tier of this server.
pub struct RemoteKv {
    set: Option<StoreSet>,
}

impl RemoteKv {
    /// Connects to the stores when `--hicache-storage-backend quic` is set (`None`
    /// otherwise). A store that cannot be reached yet is not an error: it is retried in
    /// the background and its pages are misses meanwhile.
    pub fn start(
        hicache: &HiCacheArgs,
        disagg: &DisaggArgs,
        layout: KvLayout,
    ) -> Result<Option<Arc<RemoteKv>>, String> {
        if !hicache.remote_enabled() {
            return Ok(None);
        }
        let dir = disagg
            .cluster_identity
            .clone()
            .or_else(|| {
                std::env::var_os("SGLRS_CLUSTER_IDENTITY")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .ok_or_else(|| {
                "--hicache-storage-backend quic needs --cluster-identity DIR (or \
                 SGLRS_CLUSTER_IDENTITY), the same as the stores'"
                    .to_string()
            })?;
        let security = read_identity(&dir)?;
        let addrs = hicache.hicache_storage_addr.clone();
        let loopback = addrs.iter().all(|a| {
            a.parse::<std::net::SocketAddr>()
                .is_ok_and(|s| s.ip().is_loopback())
                || a.starts_with("localhost:")
        });
        let quic = if loopback {
            QuicConfig::loopback()
        } else {
            QuicConfig::default()
        };
        let set = StoreSet::start(StoreSetConfig {
            addrs,
            layout,
            security,
            quic,
            read_timeout: hicache.remote_read_timeout(),
            write_timeout: WRITE_TIMEOUT,
            max_write_bytes: MAX_WRITE_BYTES,
            connect_grace: CONNECT_GRACE,
        })
        .map_err(|e| format!("--hicache-storage-addr: {e}"))?;
        Ok(Some(Arc::new(RemoteKv { set: Some(set) })))
    }

    fn set(&self) -> &StoreSet {
        self.set.as_ref().expect("set until drop")
    }

    /// The stores and the counters, for `/get_server_info`.
    pub fn info_json(&self) -> serde_json::Value {
        let st = self.set().stats();
        serde_json::json!({
            "stores": st.stores.iter().map(|s| serde_json::json!({
                "addr": s.addr,
                "state": s.state,
                "reason": s.reason,
                "connects": s.connects,
            })).collect::<Vec<_>>(),
            "read_pages": st.read_pages,
            "hit_pages": st.hit_pages,
            "read_timeouts": st.read_timeouts,
            "read_errors": st.read_errors,
            "written_pages": st.written_pages,
            "skipped_pages": st.skipped_pages,
            "dropped_pages": st.dropped_pages,
            "read_bytes": st.read_bytes,
            "written_bytes": st.written_bytes,
            "read_seconds": st.read_micros as f64 / 1e6,
            "writes_pending": self.set().writes_pending(),
        })
    }

    /// The remote tier's Prometheus samples.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let st = self.set().stats();
        for (name, help, v) in [
            (
                "read_pages",
                "Pages asked of the remote tier.",
                st.read_pages,
            ),
            ("hit_pages", "Pages the remote tier supplied.", st.hit_pages),
            (
                "read_timeouts",
                "Remote reads that ran past the timeout (misses).",
                st.read_timeouts,
            ),
            (
                "read_errors",
                "Remote reads that failed or found the store down (misses).",
                st.read_errors,
            ),
            (
                "written_pages",
                "Pages written to the remote tier.",
                st.written_pages,
            ),
            (
                "skipped_pages",
                "Pages not written because the store held them.",
                st.skipped_pages,
            ),
            (
                "dropped_pages",
                "Pages not written: the store was down or slow, or too much was in flight.",
                st.dropped_pages,
            ),
            (
                "read_bytes",
                "Bytes read from the remote tier.",
                st.read_bytes,
            ),
            (
                "written_bytes",
                "Bytes written to the remote tier.",
                st.written_bytes,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP sglrs_hicache_remote_{name}_total {help}\n# TYPE sglrs_hicache_remote_{name}_total counter\nsglrs_hicache_remote_{name}_total {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP sglrs_hicache_remote_store_up Whether the server is connected to the store.\n# TYPE sglrs_hicache_remote_store_up gauge"
        );
        for s in &st.stores {
            let up = u8::from(s.state == "connected");
            let _ = writeln!(
                out,
                "sglrs_hicache_remote_store_up{{store=\"{}\"}} {up}",
                s.addr.replace(['\\', '"', '\n'], "_")
            );
        }
    }
}

impl RemoteTier for RemoteKv {
    fn fetch(&self, hashes: Vec<PageHash>, done: Box<dyn FnOnce(Vec<Option<Bytes>>) + Send>) {
        self.set().fetch(hashes, done);
    }

    fn write(&self, pages: Vec<(PageHash, Bytes)>) {
        self.set().write(pages);
    }
}

impl Drop for RemoteKv {
    fn drop(&mut self) {
        // The set's runtime blocks while it shuts down, which an async context forbids.
        if let Some(set) = self.set.take() {
            let _ = std::thread::Builder::new()
                .name("sglrs-kv-remote-stop".into())
                .spawn(move || drop(set));
        }
    }
}
