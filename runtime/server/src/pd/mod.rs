//! Prefill/decode disaggregation (`docs/pd.md`): the `--disaggregation-*` flags, the cluster
//! identity, and the two hosts' ends of a request's KV transfer.
//!
//! Whoever routes a request (SGLang's router in PD mode) sends the same body to a prefill and
//! a decode server with `bootstrap_host` / `bootstrap_port` / `bootstrap_room`.
//!
//! - **Prefill** ([`Pd::export`]): the request runs its prompt and samples its first token;
//!   the scheduler copies the prompt's pages out of the pool ([`SchedEvent::KvExport`]) and
//!   the request's task sends them, with the first token, its logprobs, the prompt's
//!   logprobs and the sampler position, to the decode host that registers the room
//!   ([`KvSender`], QUIC on `--disaggregation-bootstrap-port`). The HTTP answer comes once
//!   the decode host acknowledged the pages, or failed, naming why; a prefill that fails
//!   before it has pages tells the decode host so ([`KvSender::fail`]).
//! - **Decode** ([`Importer`]): the scheduler matches the prompt against its own radix
//!   cache, allocates pages for the rest and hands them here; the importer dials the
//!   prefill host, registers only those pages (a follow-up turn moves only its new pages),
//!   writes each page into the pool as it arrives ([`PageIo`]) and reports back, and the
//!   request decodes on from the prefill's first token. Every wait is bounded by
//!   `--disaggregation-timeout` (seconds); a failure ends that request only, with the
//!   reason.

#[cfg(feature = "pd")]
mod link;
#[cfg(feature = "pd")]
pub use link::{Importer, Pd};
#[cfg(feature = "pd")]
pub use sglrs_transfer::quic::{read_identity, write_identity};
#[cfg(not(feature = "pd"))]
mod off;
#[cfg(not(feature = "pd"))]
pub use off::{Pd, RemoteKv};
#[cfg(feature = "pd")]
mod remote;
#[cfg(feature = "pd")]
pub use remote::RemoteKv;

use crate::metrics::Histogram;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// SGLang's default bootstrap port.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// Transfer latency buckets, seconds.
const TRANSFER_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Where a request's KV comes from: SGLang's `bootstrap_host` / `bootstrap_port` /
/// `bootstrap_room`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// The prefill host (empty on the prefill host itself when the router sent none).
    pub host: String,
    /// Its KV transfer port (UDP).
    pub port: u16,
    /// The room.
    pub room: u64,
}

/// A server's part in prefill/decode disaggregation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DisaggMode {
    /// Unified: every request runs here whole (SGLang's `null`).
    #[default]
    Null,
    /// Computes prompts and sends their KV to decode servers.
    Prefill,
    /// Receives prompts' KV from prefill servers and decodes.
    Decode,
}

impl DisaggMode {
    /// The name `/get_server_info` and the metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            DisaggMode::Null => "null",
            DisaggMode::Prefill => "prefill",
            DisaggMode::Decode => "decode",
        }
    }
}

/// The `--disaggregation-*` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DisaggArgs {
    /// Prefill/decode disaggregation role: `null` (unified, the default), `prefill` or
    /// `decode`. Requests without `bootstrap_*` fields run whole on either role.
    #[arg(long, value_enum, default_value_t = DisaggMode::Null)]
    pub disaggregation_mode: DisaggMode,
    /// Prefill role: the UDP port of the KV transfer endpoint (QUIC), the number given
    /// after the prefill URL to sglang-router.
    #[arg(long, default_value_t = DEFAULT_BOOTSTRAP_PORT)]
    pub disaggregation_bootstrap_port: u16,
    /// Folder with the cluster identity (`cert.pem`, `key.pem`, `secret`; made by
    /// `sglrs cluster-identity --out DIR`), the same on every host. Default: the
    /// `SGLRS_CLUSTER_IDENTITY` environment variable. Required by both roles.
    #[arg(long)]
    pub cluster_identity: Option<PathBuf>,
    /// Longest wait, in seconds, for any step of a request's KV transfer (the decode host's
    /// registration, the pages, the acknowledgement).
    #[arg(long, default_value_t = 30)]
    pub disaggregation_timeout: u64,
    /// Decode role: write the pages it computes (prompt and output) through to the
    /// hierarchical cache's remote tier, so the next turn's prefill, on any prefill host
    /// sharing the store, starts from them. Needs `--hicache-storage-backend quic`.
    #[arg(long)]
    pub disaggregation_decode_enable_offload_kvcache: bool,
}

/// Counters of the transfers, for `/metrics` and `/get_server_info`.
#[derive(Debug)]
pub struct PdStats {
    /// Rooms in transfer now (prefill: sending; decode: receiving).
    pub rooms_open: AtomicU64,
    /// Transfers that completed.
    pub transfers: AtomicU64,
    /// Pages sent (prefill).
    pub pages_sent: AtomicU64,
    /// Pages received and written into the pool (decode).
    pub pages_received: AtomicU64,
    /// Pages not moved because the decode host had them cached (both roles count them).
    pub pages_skipped: AtomicU64,
    /// Failed transfers by cause.
    pub failures: Mutex<HashMap<&'static str, u64>>,
    /// Transfer time: prefill from handing the pages over to the acknowledgement; decode
    /// from the room's first message to its last page written.
    pub latency: Histogram,
}

impl Default for PdStats {
    fn default() -> Self {
        Self {
            rooms_open: AtomicU64::new(0),
            transfers: AtomicU64::new(0),
            pages_sent: AtomicU64::new(0),
            pages_received: AtomicU64::new(0),
            pages_skipped: AtomicU64::new(0),
            failures: Mutex::new(HashMap::new()),
            latency: Histogram::new(TRANSFER_BUCKETS),
        }
    }
}

impl PdStats {
    /// Counts a failed transfer by cause (the transfer build's only).
    #[cfg_attr(not(feature = "pd"), allow(dead_code))]
    pub(crate) fn fail(&self, message: &str) {
        let cause = failure_cause(message);
        if let Ok(mut f) = self.failures.lock() {
            *f.entry(cause).or_insert(0) += 1;
        }
    }

    /// The counters as JSON.
    pub fn json(&self) -> serde_json::Value {
        let failures = self.failures.lock().map(|f| f.clone()).unwrap_or_default();
        serde_json::json!({
            "rooms_open": self.rooms_open.load(Ordering::Relaxed),
            "transfers": self.transfers.load(Ordering::Relaxed),
            "pages_sent": self.pages_sent.load(Ordering::Relaxed),
            "pages_received": self.pages_received.load(Ordering::Relaxed),
            "pages_skipped": self.pages_skipped.load(Ordering::Relaxed),
            "failures": failures,
            "transfer_seconds_count": self.latency.count(),
        })
    }
}

impl PdStats {
    /// Appends the counters in the Prometheus text format, with the role as a label.
    pub fn render(&self, out: &mut String, mode: DisaggMode) {
        use std::fmt::Write as _;
        let role = mode.as_str();
        let _ = writeln!(
            out,
            "# HELP sglrs_pd_rooms_open KV transfers in flight.\n# TYPE sglrs_pd_rooms_open gauge\n\
             sglrs_pd_rooms_open{{role=\"{role}\"}} {}",
            self.rooms_open.load(Ordering::Relaxed)
        );
        for (name, help, v) in [
            (
                "sglrs_pd_transfers_total",
                "KV transfers completed.",
                &self.transfers,
            ),
            (
                "sglrs_pd_pages_sent_total",
                "KV pages sent to decode hosts.",
                &self.pages_sent,
            ),
            (
                "sglrs_pd_pages_received_total",
                "KV pages received from prefill hosts.",
                &self.pages_received,
            ),
            (
                "sglrs_pd_pages_skipped_total",
                "KV pages not moved: the decode host had them cached.",
                &self.pages_skipped,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{role=\"{role}\"}} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP sglrs_pd_transfer_failures_total Failed KV transfers by cause.\n\
             # TYPE sglrs_pd_transfer_failures_total counter"
        );
        if let Ok(f) = self.failures.lock() {
            let mut causes: Vec<_> = f.iter().collect();
            causes.sort();
            for (cause, n) in causes {
                let _ = writeln!(
                    out,
                    "sglrs_pd_transfer_failures_total{{role=\"{role}\",cause=\"{cause}\"}} {n}"
                );
            }
        }
        self.latency.render(
            out,
            "sglrs_pd_transfer_seconds",
            "KV transfer time per request (prefill: pages handed over to acknowledged; decode: \
             first message to last page written).",
        );
    }
}

/// The failure class of a transfer error's text (the metrics' `cause` label).
#[cfg_attr(not(feature = "pd"), allow(dead_code))]
fn failure_cause(message: &str) -> &'static str {
    let m = message.to_ascii_lowercase();
    if m.contains("timed out") || m.contains("timeout") || m.contains("silent") {
        "timeout"
    } else if m.contains("authentication") || m.contains("certificate") || m.contains("tls") {
        "identity"
    } else if m.contains("checksum") {
        "checksum"
    } else if m.contains("resolve") || m.contains("connect") || m.contains("unreachable") {
        "connect"
    } else if m.contains("connection lost") || m.contains("closed") || m.contains("reset") {
        "peer_lost"
    } else if m.contains("prefill failed") || m.contains("cancelled") {
        "remote_failed"
    } else {
        "other"
    }
}

/// A request's bootstrap fields, checked: `None` when it has none (it then runs whole
/// here, on any role).
pub fn bootstrap(
    role: Option<(DisaggMode, u16)>,
    host: Option<&serde_json::Value>,
    port: Option<&serde_json::Value>,
    room: Option<&serde_json::Value>,
    batch: usize,
    n: usize,
) -> Result<Option<Bootstrap>, crate::error::ApiError> {
    use crate::error::ApiError;
    use serde_json::Value;
    let given = |v: Option<&Value>| v.is_some_and(|v| !v.is_null());
    if !given(host) && !given(port) && !given(room) {
        return Ok(None);
    }
    let Some((mode, default_port)) = role else {
        let name = [
            ("bootstrap_host", host),
            ("bootstrap_port", port),
            ("bootstrap_room", room),
        ]
        .into_iter()
        .find(|(_, v)| given(*v))
        .map_or("bootstrap_room", |(n, _)| n);
        return Err(ApiError::bad(
            name,
            "this server is not in disaggregation mode (start it with \
             --disaggregation-mode prefill|decode)",
        ));
    };
    let one = |name: &'static str, v: Option<&Value>| -> Result<Option<Value>, ApiError> {
        match v {
            Some(Value::Array(_)) => Err(ApiError::bad(
                name,
                "a batch or n > 1 cannot be disaggregated: send one prompt and one sample \
                 per request",
            )),
            Some(Value::Null) | None => Ok(None),
            Some(v) => Ok(Some(v.clone())),
        }
    };
    let (h, p, r) = (
        one("bootstrap_host", host)?,
        one("bootstrap_port", port)?,
        one("bootstrap_room", room)?,
    );
    if batch > 1 || n > 1 {
        return Err(ApiError::bad(
            if n > 1 { "n" } else { "text" },
            "a batch or n > 1 cannot be disaggregated: send one prompt and one sample per request",
        ));
    }
    let room = r
        .as_ref()
        .and_then(Value::as_u64)
        .ok_or_else(|| ApiError::bad("bootstrap_room", "must be a non-negative integer"))?;
    let host = match h {
        Some(Value::String(s)) if !s.is_empty() => s,
        None if mode == DisaggMode::Prefill => String::new(),
        _ => {
            return Err(ApiError::bad(
                "bootstrap_host",
                "must be the prefill host's name",
            ))
        }
    };
    let port = match p {
        None => default_port.max(1),
        Some(v) => v
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p > 0)
            .ok_or_else(|| ApiError::bad("bootstrap_port", "must be a UDP port number"))?,
    };
    Ok(Some(Bootstrap { host, port, room }))
}
