//! `sglrs kv-store`: the shared KV store (the `sglrs-transfer` store server over a page store
//! in RAM with a disk spill) as a process, until ctrl-c or SIGTERM, which spills RAM to disk
//! so a restart serves every page.

use anyhow::Context;
use sglrs_server::engine::KvCacheDtype;
use sglrs_transfer::quic::QuicConfig;
use sglrs_transfer::store::{self, DiskConfig, PageStoreConfig, StoreConfig};
use sglrs_transfer::KvLayout;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Options of `sglrs kv-store`.
#[derive(clap::Args, Debug, Clone)]
pub struct KvStoreArgs {
    /// UDP address to serve on (QUIC).
    #[arg(long, default_value = "127.0.0.1:8999")]
    pub listen: SocketAddr,
    /// Folder of the disk spill (segment files; created if missing). Without it pages live
    /// in RAM only.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// RAM budget, GB.
    #[arg(long, default_value_t = 1.0)]
    pub ram_gb: f64,
    /// Disk budget, GB (the oldest segments go beyond it).
    #[arg(long, default_value_t = 16.0)]
    pub disk_gb: f64,
    /// Cluster identity folder (`sglrs cluster-identity --out DIR`); default:
    /// `SGLRS_CLUSTER_IDENTITY`.
    #[arg(long)]
    pub cluster_identity: Option<PathBuf>,
    /// The model whose pages are stored: the page layout (layers, KV heads, head size)
    /// every client must use comes from it (default: the bundled model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Tokens per KV page, as the servers use (`sglrs serve --page-size`).
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// KV element type, as the servers use (`sglrs serve --kv-cache-dtype`).
    #[arg(long, value_enum, default_value_t = KvCacheDtype::F16)]
    pub kv_cache_dtype: KvCacheDtype,
}

fn gb(v: f64) -> u64 {
    (v.max(0.0) * (1u64 << 30) as f64) as u64
}

/// Runs the store until ctrl-c or SIGTERM.
pub fn run(args: &KvStoreArgs) -> anyhow::Result<()> {
    let dir = args
        .cluster_identity
        .clone()
        .or_else(|| std::env::var_os("SGLRS_CLUSTER_IDENTITY").map(PathBuf::from))
        .context(
            "kv-store needs --cluster-identity DIR (or SGLRS_CLUSTER_IDENTITY): make one with \
             `sglrs cluster-identity --out DIR` and give every host the same",
        )?;
    let security = sglrs_server::pd::read_identity(&dir).map_err(anyhow::Error::msg)?;
    let path = args
        .model
        .clone()
        .unwrap_or_else(sglrs_model::default_model_path);
    let model = sglrs_model::load(&path, &sglrs_model::LoadOptions::default())
        .with_context(|| format!("reading the page layout from {}", path.display()))?;
    let layout = KvLayout {
        num_layers: model.config.num_layers,
        num_kv_heads: model.config.num_kv_heads,
        head_dim: model.config.head_dim,
        page_size: args.page_size,
        dtype: args.kv_cache_dtype.into(),
    };
    drop(model);
    let quic = if args.listen.ip().is_loopback() {
        QuicConfig::loopback()
    } else {
        QuicConfig::default()
    };
    let pages = PageStoreConfig {
        ram_bytes: gb(args.ram_gb) as usize,
        disk: args.dir.clone().map(|dir| DiskConfig {
            dir,
            max_bytes: gb(args.disk_gb),
            segment_bytes: (256u64 << 20).min(gb(args.disk_gb).max(1 << 20)),
        }),
        disk_write_through: false,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")?;
    rt.block_on(async {
        let handle = store::serve(StoreConfig {
            addr: args.listen,
            layout,
            security,
            quic,
            pages,
        })
        .with_context(|| format!("serving the KV store on UDP {}", args.listen))?;
        let st = handle.store().stats();
        eprintln!(
            "sglrs: KV store on udp://{} ({} pages of {} bytes in RAM, {} on disk{})",
            handle.local_addr().map_or(args.listen, |a| a),
            st.ram_pages,
            layout.page_bytes(),
            st.disk_pages,
            args.dir
                .as_ref()
                .map_or_else(String::new, |d| format!(" in {}", d.display()))
        );
        stop_signal().await;
        handle.shutdown().await.context("shutting the store down")
    })
}

/// Resolves on ctrl-c or SIGTERM.
async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match term.as_mut() {
                Some(t) => { t.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
}
