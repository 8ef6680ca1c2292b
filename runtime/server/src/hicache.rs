//! The hierarchical cache's settings (`--enable-hierarchical-cache`, `--hicache-*`, SGLang's
//! flag names) and the model fingerprint that names pages in its lower tiers.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sglrs_radix_cache::store::{DiskConfig, PageStore, PageStoreConfig};
use sglrs_radix_cache::{KvLayout, PageHash};
use sglrs_scheduler::hicache::{HiCacheConfig, PrefetchPolicy, RemoteTier, WritePolicy};

/// Write policy names as `--hicache-write-policy` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum WritePolicyArg {
    /// Every full page is written down as soon as it is in the radix tree.
    WriteThrough,
    /// Only prefixes hit at least once on the device are written down.
    WriteThroughSelective,
    /// Pages are copied down only when evicted from the device (on the scheduler thread,
    /// before the pages are reused).
    WriteBack,
}

/// Prefetch policy names as `--hicache-storage-prefetch-policy` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum PrefetchPolicyArg {
    /// Admission never waits for a queued request's prefetch.
    BestEffort,
    /// A request is admitted only once its prefetch is done.
    WaitComplete,
    /// Admission waits for the prefetch at most `--hicache-storage-prefetch-timeout-ms`.
    Timeout,
}

/// Lower tiers of the KV cache: host RAM and disk.
#[derive(clap::Args, Debug, Clone)]
pub struct HiCacheArgs {
    /// Keep KV pages evicted from the device pool in lower tiers (host RAM, disk) and load
    /// them back on a hit instead of recomputing them.
    #[arg(long)]
    pub enable_hierarchical_cache: bool,
    /// Host tier size as a multiple of the device KV pool (`--kv-memory-mb`); 0: no host
    /// tier. `--hicache-size` takes precedence when positive.
    #[arg(long, default_value_t = 2.0)]
    pub hicache_ratio: f64,
    /// Host tier size in GB (overrides `--hicache-ratio` when positive).
    #[arg(long, default_value_t = 0.0)]
    pub hicache_size: f64,
    /// When pages are copied down from the device tier.
    #[arg(long, value_enum, default_value_t = WritePolicyArg::WriteThrough)]
    pub hicache_write_policy: WritePolicyArg,
    /// The storage tier below host RAM: `file` (a disk tier of memory-mapped segment files
    /// in `--hicache-storage-dir`) or `quic` (a remote tier: the KV stores of
    /// `--hicache-storage-addr`, shared by every server that names them; a
    /// `--hicache-storage-dir` then adds a local disk tier above it).
    #[arg(long)]
    pub hicache_storage_backend: Option<String>,
    /// Directory of the disk tier; pages found there from an earlier run are served (warm
    /// restart).
    #[arg(long)]
    pub hicache_storage_dir: Option<PathBuf>,
    /// The remote tier's stores (`sglrs kv-store`), `HOST:PORT[,HOST:PORT…]`: pages are
    /// spread over them by page hash. Needs `--hicache-storage-backend quic` and the
    /// stores' `--cluster-identity`.
    #[arg(long, value_delimiter = ',')]
    pub hicache_storage_addr: Vec<String>,
    /// Disk tier budget in GB; the oldest segment files are deleted beyond it.
    #[arg(long, default_value_t = 16.0)]
    pub hicache_storage_size: f64,
    /// How long admission waits for a queued request's prefetch from the lower tiers
    /// (default: `timeout` with a remote tier, so its pages can arrive; `best_effort`
    /// otherwise).
    #[arg(long, value_enum)]
    pub hicache_storage_prefetch_policy: Option<PrefetchPolicyArg>,
    /// The `timeout` prefetch policy's bound, milliseconds; also the longest a remote read
    /// waits for a store (after it the pages are misses and are recomputed).
    #[arg(long, default_value_t = 500)]
    pub hicache_storage_prefetch_timeout_ms: u64,
}

/// Size of one disk segment file.
const SEGMENT_BYTES: u64 = 64 << 20;

const GB: f64 = (1u64 << 30) as f64;

fn config_err(msg: impl Into<String>) -> String {
    msg.into()
}

/// At most 64 characters of a flag's value, for an error message.
fn excerpt(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl HiCacheArgs {
    /// Checks the flags against each other: flags of the hierarchical cache without
    /// `--enable-hierarchical-cache`, or a configuration without any lower tier, are
    /// refused by name.
    pub fn validate(&self) -> Result<(), String> {
        if !self.enable_hierarchical_cache {
            let set = [
                (
                    "--hicache-storage-backend",
                    self.hicache_storage_backend.is_some(),
                ),
                ("--hicache-storage-dir", self.hicache_storage_dir.is_some()),
                ("--hicache-size", self.hicache_size != 0.0),
            ];
            if let Some((name, _)) = set.iter().find(|(_, on)| *on) {
                return Err(config_err(format!(
                    "{name} needs --enable-hierarchical-cache"
                )));
            }
            return Ok(());
        }
        for (name, v) in [
            ("--hicache-ratio", self.hicache_ratio),
            ("--hicache-size", self.hicache_size),
            ("--hicache-storage-size", self.hicache_storage_size),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(config_err(format!("{name} must be a non-negative number")));
            }
        }
        match self.hicache_storage_backend.as_deref() {
            None if self.hicache_storage_dir.is_some() => {
                return Err(config_err(
                    "--hicache-storage-dir needs --hicache-storage-backend file",
                ))
            }
            None => {}
            Some("file") if self.hicache_storage_dir.is_none() => {
                return Err(config_err(
                    "--hicache-storage-backend file needs --hicache-storage-dir DIR",
                ))
            }
            Some("file") => {}
            Some("quic") if self.hicache_storage_addr.is_empty() => {
                return Err(config_err(
                    "--hicache-storage-backend quic needs --hicache-storage-addr HOST:PORT[,…]",
                ))
            }
            Some("quic") => {}
            Some(other) => {
                return Err(config_err(format!(
                "--hicache-storage-backend {:?} is not supported here; use \"file\" or \"quic\"",
                excerpt(other)
            )))
            }
        }
        if !self.hicache_storage_addr.is_empty() && !self.remote_enabled() {
            return Err(config_err(
                "--hicache-storage-addr needs --hicache-storage-backend quic",
            ));
        }
        if let Some(a) = self.hicache_storage_addr.iter().find(|a| {
            a.rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        }) {
            return Err(config_err(format!(
                "--hicache-storage-addr {:?} is not HOST:PORT",
                excerpt(a)
            )));
        }
        if self.hicache_storage_prefetch_timeout_ms == 0 && self.remote_enabled() {
            return Err(config_err(
                "--hicache-storage-prefetch-timeout-ms must be above 0 with a remote tier",
            ));
        }
        Ok(())
    }

    /// Whether the remote tier is configured (`--hicache-storage-backend quic`).
    pub fn remote_enabled(&self) -> bool {
        self.enable_hierarchical_cache && self.hicache_storage_backend.as_deref() == Some("quic")
    }

    /// The longest a remote read waits: the prefetch timeout.
    pub fn remote_read_timeout(&self) -> Duration {
        Duration::from_millis(self.hicache_storage_prefetch_timeout_ms.max(1))
    }

    /// The prefetch policy in force.
    fn prefetch_policy(&self) -> PrefetchPolicy {
        match self.hicache_storage_prefetch_policy {
            Some(PrefetchPolicyArg::BestEffort) => PrefetchPolicy::BestEffort,
            Some(PrefetchPolicyArg::WaitComplete) => PrefetchPolicy::WaitComplete,
            Some(PrefetchPolicyArg::Timeout) => PrefetchPolicy::Timeout,
            None if self.remote_enabled() => PrefetchPolicy::Timeout,
            None => PrefetchPolicy::BestEffort,
        }
    }

    /// Bytes of the host tier for a device pool of `device_bytes`.
    pub fn host_bytes(&self, device_bytes: usize) -> usize {
        if self.hicache_size > 0.0 {
            (self.hicache_size * GB) as usize
        } else {
            (self.hicache_ratio * device_bytes as f64) as usize
        }
    }

    /// Opens the lower tiers, or `None` when the hierarchical cache is off. `remote` is the
    /// remote tier (when [`remote_enabled`](Self::remote_enabled)), written to when
    /// `remote_write`.
    pub fn build(
        &self,
        model_path: &Path,
        fingerprint_extra: &str,
        layout: KvLayout,
        device_bytes: usize,
        remote: Option<Arc<dyn RemoteTier>>,
        remote_write: bool,
    ) -> Result<Option<HiCacheConfig>, String> {
        self.validate()?;
        if !self.enable_hierarchical_cache {
            return Ok(None);
        }
        let host = self.host_bytes(device_bytes);
        let disk = self.hicache_storage_dir.as_ref().map(|dir| DiskConfig {
            dir: dir.clone(),
            max_bytes: (self.hicache_storage_size * GB) as u64,
            segment_bytes: SEGMENT_BYTES,
        });
        if host == 0 && disk.is_none() {
            return Err(config_err(
                "--enable-hierarchical-cache with neither a host tier (--hicache-ratio or \
                 --hicache-size above 0) nor a disk tier (--hicache-storage-dir); a remote \
                 tier needs one of them to hold the pages it fetches",
            ));
        }
        let store = PageStore::open(PageStoreConfig {
            ram_bytes: host,
            disk,
            // Pages reach the disk as soon as they are written down, so a kill loses none.
            disk_write_through: true,
        })
        .map_err(|e| config_err(format!("opening --hicache-storage-dir: {e}")))?;
        let root_hash = model_fingerprint(model_path, fingerprint_extra, layout)
            .map_err(|e| config_err(format!("fingerprinting the model for the cache: {e}")))?;
        Ok(Some(HiCacheConfig {
            store: Arc::new(store),
            write_policy: match self.hicache_write_policy {
                WritePolicyArg::WriteThrough => WritePolicy::WriteThrough,
                WritePolicyArg::WriteThroughSelective => WritePolicy::WriteThroughSelective,
                WritePolicyArg::WriteBack => WritePolicy::WriteBack,
            },
            prefetch_policy: self.prefetch_policy(),
            prefetch_timeout: Duration::from_millis(self.hicache_storage_prefetch_timeout_ms),
            root_hash,
            page_bytes: layout.page_bytes(),
            remote_write: remote_write && remote.is_some(),
            remote,
        }))
    }
}

/// The tier configuration as `/get_server_info` shows it (`null` when off).
pub fn info_json(
    args: &HiCacheArgs,
    cfg: Option<&HiCacheConfig>,
    device_bytes: usize,
) -> serde_json::Value {
    let Some(cfg) = cfg else {
        return serde_json::Value::Null;
    };
    serde_json::json!({
        "device_bytes": device_bytes,
        "host_bytes": args.host_bytes(device_bytes),
        "storage_backend": args.hicache_storage_backend,
        "storage_dir": args.hicache_storage_dir.as_ref().map(|d| d.display().to_string()),
        "storage_addr": args.hicache_storage_addr,
        "remote_write": cfg.remote_write,
        "storage_bytes": args.hicache_storage_dir.as_ref().map(|_| (args.hicache_storage_size * GB) as u64),
        "write_policy": cfg.write_policy.name(),
        "prefetch_policy": cfg.prefetch_policy.name(),
        "prefetch_timeout_ms": args.hicache_storage_prefetch_timeout_ms,
        "model_fingerprint": format!("{:032x}", cfg.root_hash.0),
    })
}

/// The hash every sequence's first page chains on in the lower tiers: xxh3-128 over a
/// version tag, every byte of the model's weight files (a `.gguf` file, or an HF folder's
/// `*.safetensors` in name order), `extra` (the load options that change the weights, e.g.
/// `--quantize`) and the KV layout and dtype. Two models, two quantizations or two KV dtypes
/// never share a page name.
pub fn model_fingerprint(path: &Path, extra: &str, layout: KvLayout) -> std::io::Result<PageHash> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(b"sglrs-model-fingerprint-v1\0");
    let mut files: Vec<PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    files.sort();
    let mut buf = vec![0u8; 1 << 20];
    for f in &files {
        let mut file = std::fs::File::open(f)?;
        h.update(&file.metadata()?.len().to_le_bytes());
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    h.update(extra.as_bytes());
    h.update(&[0]);
    for v in [
        layout.num_layers,
        layout.num_kv_heads,
        layout.head_dim,
        layout.page_size,
    ] {
        h.update(&(v as u64).to_le_bytes());
    }
    h.update(format!("{:?}", layout.dtype).as_bytes());
    Ok(PageHash(h.digest128()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sglrs_radix_cache::KvDtype;

    fn layout(dtype: KvDtype) -> KvLayout {
        KvLayout {
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 8,
            page_size: 16,
            dtype,
        }
    }

    #[test]
    fn the_fingerprint_covers_weights_options_and_layout() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.gguf");
        let b = dir.path().join("b.gguf");
        std::fs::write(&a, b"weights one").unwrap();
        std::fs::write(&b, b"weights two").unwrap();
        let f = |p: &Path, extra: &str, d: KvDtype| model_fingerprint(p, extra, layout(d)).unwrap();
        let base = f(&a, "", KvDtype::F16);
        assert_eq!(base, f(&a, "", KvDtype::F16));
        assert_ne!(base, f(&b, "", KvDtype::F16));
        assert_ne!(base, f(&a, "q8_0", KvDtype::F16));
        assert_ne!(base, f(&a, "", KvDtype::Bf16));
    }

    fn args(extra: &[&str]) -> Result<HiCacheArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            h: HiCacheArgs,
        }
        let mut v = vec!["x"];
        v.extend_from_slice(extra);
        <P as clap::Parser>::try_parse_from(v).map(|p| p.h)
    }

    #[test]
    fn flags_that_cannot_work_are_refused_by_name() {
        let err = |a: &[&str]| args(a).unwrap().validate().unwrap_err().to_string();
        assert!(err(&["--hicache-storage-dir", "/tmp/x"]).contains("--enable-hierarchical-cache"));
        assert!(err(&[
            "--enable-hierarchical-cache",
            "--hicache-storage-backend",
            "mooncake"
        ])
        .contains("mooncake"));
        assert!(err(&[
            "--enable-hierarchical-cache",
            "--hicache-storage-backend",
            "file"
        ])
        .contains("--hicache-storage-dir"));
        assert!(
            err(&["--enable-hierarchical-cache", "--hicache-ratio=-1"]).contains("--hicache-ratio")
        );
        assert!(args(&["--enable-hierarchical-cache"])
            .unwrap()
            .validate()
            .is_ok());
        assert!(args(&["--hicache-write-policy", "bogus"]).is_err());
        let on = |extra: &[&str]| {
            let mut v = vec!["--enable-hierarchical-cache"];
            v.extend_from_slice(extra);
            args(&v).unwrap()
        };
        assert!(on(&["--hicache-storage-backend", "quic"])
            .validate()
            .unwrap_err()
            .contains("--hicache-storage-addr"));
        assert!(on(&["--hicache-storage-addr", "a:1"])
            .validate()
            .unwrap_err()
            .contains("--hicache-storage-backend quic"));
        assert!(on(&[
            "--hicache-storage-backend",
            "quic",
            "--hicache-storage-addr",
            "a:1,nope"
        ])
        .validate()
        .unwrap_err()
        .contains("\"nope\" is not HOST:PORT"));
        let quic = on(&[
            "--hicache-storage-backend",
            "quic",
            "--hicache-storage-addr",
            "a:1,b:2",
        ]);
        assert!(quic.validate().is_ok());
        assert_eq!(quic.hicache_storage_addr, ["a:1", "b:2"]);
        assert!(quic.remote_enabled());
        assert_eq!(
            quic.prefetch_policy(),
            PrefetchPolicy::Timeout,
            "waits for the remote"
        );
        assert_eq!(on(&[]).prefetch_policy(), PrefetchPolicy::BestEffort);
    }
}
