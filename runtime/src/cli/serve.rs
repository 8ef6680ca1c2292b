//! `sglrs serve`: start an [`Engine`] and serve its routes over HTTP.

use anyhow::Context;
use sglrs_server::{Engine, EngineConfig};

/// Options of `sglrs serve`: where to listen, and the engine's settings.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// The engine's settings.
    #[command(flatten)]
    pub engine: EngineConfig,
}

/// `sglrs serve`: [`Engine::start`], then the HTTP server on `--host`:`--port` until ctrl-c or
/// SIGTERM (then the cache tiers are flushed).
pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let mut cfg = args.engine.clone();
    cfg.listen = Some((args.host.clone(), args.port));
    if cfg.api_key.is_none() {
        cfg.api_key = std::env::var("SGLRS_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
    }
    if cfg.api_keys_file.is_none() {
        cfg.api_keys_file = std::env::var_os("SGLRS_API_KEYS_FILE")
            .filter(|f| !f.is_empty())
            .map(std::path::PathBuf::from);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")?;
    // Inside the runtime: a prefill/decode role binds its KV transfer endpoint on it.
    let engine = {
        let _rt = rt.enter();
        Engine::start(&cfg)?
    };
    rt.block_on(async {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        eprintln!(
            "sglrs: serving {} on http://{} ({} KV pages of {} tokens, context {})",
            engine.path.display(),
            listener
                .local_addr()
                .map_or(addr.clone(), |a| a.to_string()),
            engine.num_pages,
            engine.page_size,
            engine.max_context
        );
        engine.serve(listener).await.context("serving")
    })
}
