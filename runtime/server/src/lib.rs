//! sglrs server: the engine builder and the HTTP APIs (axum on tokio).
//!
//! [`EngineConfig`] + [`Engine::start`] load the model, build the executor and start the
//! scheduler thread; the `sglrs serve` binary and the Python in-process `Engine` both start
//! this way. The routes speak SGLang's native API and OpenAI's.
//!
//! Routes: `POST /generate`, `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`, `GET /health`, `GET /health_generate`, `GET /model_info`,
//! `GET /get_model_info`, `GET /get_server_info`, `POST /flush_cache`,
//! `POST /abort_request`, `GET /metrics`. Request bodies are validated once
//! ([`validate`]) into the scheduler's types; errors map to HTTP status in
//! [`ApiError::status`] and use OpenAI's error shape.
//!
//! # Key types and modules
//!
//! - [`Engine`], [`EngineConfig`], [`EngineError`]: starting an engine.
//! - [`AppState`]: what every route shares (scheduler handle, tokenizer, template, grammar
//!   compiler, [`metrics`]).
//! - [`validate`]: raw JSON → checked request types, a 400 naming the field otherwise.
//! - [`router`] / [`serve`]: the routes, with or without a socket.
//!
//! # Example
//!
//! ```no_run
//! use clap::Parser;
//! use sglrs_server::{Engine, EngineConfig};
//!
//! #[derive(Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     engine: EngineConfig,
//! }
//!
//! let mut cfg = Args::parse_from(["serve", "--page-size", "16"]).engine;
//! cfg.listen = Some(("127.0.0.1".into(), 30000));
//! let engine = Engine::start(&cfg)?;
//! let rt = tokio::runtime::Runtime::new()?;
//! rt.block_on(async {
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:30000").await?;
//!     engine.serve(listener).await
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod dispatch;
pub mod engine;
pub mod error;
pub mod metrics;
mod native;
mod openai;
pub mod rids;
mod routes;
mod sse;
pub mod validate;

pub use dispatch::{apply as apply_event, GrammarCompiler, SampleResult, Timing};
pub use engine::{Engine, EngineConfig, EngineError, KvCacheDtype};
pub use error::ApiError;
pub use native::finish_json;

use crate::metrics::Metrics;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use rids::RidTable;
use sglrs_model::chat::ChatTemplate;
use sglrs_model::tokenizer::Tokenizer;
use sglrs_scheduler::SchedulerHandle;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use validate::Limits;

/// What the server reports about itself and checks requests against.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServerInfo {
    /// Path of the model file or folder.
    pub model_path: String,
    /// Name under `/v1/models` (and the accepted `model` field).
    pub served_model_name: String,
    /// Context length.
    pub max_context: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// The server's arguments, as `/get_server_info` shows them.
    pub args: serde_json::Value,
}

/// Shared state of the routes.
pub struct AppState {
    /// The scheduler thread.
    pub sched: SchedulerHandle,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Grammar compilation and cache.
    pub grammars: Arc<GrammarCompiler>,
    /// Latency histograms and counters.
    pub metrics: Arc<Metrics>,
    /// Self description.
    pub info: ServerInfo,
    /// Bearer token required on every route but `/health` (if set).
    pub api_key: Option<String>,
    /// Client-chosen `rid`s of requests in flight (for `/abort_request`), one live request
    /// per rid.
    pub rids: Arc<RidTable>,
    next_id: AtomicU64,
}

impl AppState {
    /// Builds the state.
    pub fn new(
        sched: SchedulerHandle,
        tokenizer: Arc<Tokenizer>,
        chat_template: Option<Arc<ChatTemplate>>,
        grammars: Arc<GrammarCompiler>,
        info: ServerInfo,
        api_key: Option<String>,
    ) -> Self {
        Self {
            sched,
            tokenizer,
            chat_template,
            grammars,
            metrics: Arc::new(Metrics::default()),
            info,
            api_key,
            rids: Arc::new(RidTable::default()),
            next_id: AtomicU64::new(1),
        }
    }

    /// A fresh scheduler request id.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Limits for validation.
    pub fn limits(&self) -> Limits {
        Limits {
            max_context: self.info.max_context,
            vocab_size: self.info.vocab_size,
        }
    }

    /// Tokenizes a prompt (special-token texts such as `<|im_start|>` become their ids).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenizer
            .encode(text, true)
            .map_err(|e| ApiError::invalid(format!("cannot tokenize the prompt: {e}")))
    }

    /// Text of one token (for logprob entries).
    pub fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}

async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let path = req.uri().path();
        let open = path == "/health" || path == "/health_generate" || path == "/metrics";
        let ok = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|v| v == key);
        if !open && !ok {
            return ApiError::Unauthorized.into_response();
        }
    }
    let resp = next.run(req).await;
    if resp.status().is_client_error() {
        state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
    }
    resp
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

/// The router with every route.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/generate", post(native::generate))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(routes::models))
        .route("/health", get(routes::health))
        .route("/health_generate", get(routes::health_generate))
        .route("/model_info", get(routes::model_info))
        .route("/get_model_info", get(routes::model_info))
        .route("/get_server_info", get(routes::server_info))
        .route(
            "/flush_cache",
            post(routes::flush_cache).get(routes::flush_cache),
        )
        .route("/abort_request", post(routes::abort_request))
        .route("/metrics", get(routes::metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state(state)
}

/// Serves until the listener fails or ctrl-c.
pub async fn serve(state: Arc<AppState>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}
