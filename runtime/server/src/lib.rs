//! sglrs server: the engine builder and the HTTP APIs (axum on tokio).
//!
//! [`EngineConfig`] + [`Engine::start`] load the model, build the executor and start the
//! scheduler thread; the `sglrs serve` binary and the Python in-process `Engine` both start
//! this way. The routes speak SGLang's native API and OpenAI's.
//!
//! Routes: `POST /generate`, `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`, `GET /health`, `GET /health_generate`, `GET /model_info`,
//! `GET /get_model_info`, `GET /get_server_info`, `POST /flush_cache`,
//! `POST /abort_request`, `GET /metrics` ([`route_table`] lists them; with an API key all
//! but `/health` need it, [`auth`]). Request bodies are validated once
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

pub mod auth;
mod dispatch;
pub mod engine;
pub mod error;
pub mod hicache;
#[cfg(feature = "kv-events")]
pub mod kv_events;
pub mod metrics;
mod native;
mod openai;
pub mod pd;
pub mod rids;
mod routes;
mod sglang_metrics;
mod sse;
pub mod validate;

pub use dispatch::{apply as apply_event, GrammarCompiler, SampleResult, Timing};
pub use engine::{Engine, EngineConfig, EngineError, KvCacheDtype};
pub use error::ApiError;
pub use native::{check_generate_body, finish_json};
pub use openai::check_completion_body;

use crate::metrics::Metrics;
use auth::Auth;
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
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
    /// The API keys and their tenants, and the routes open without a key ([`auth`]).
    pub auth: Auth,
    /// Client-chosen `rid`s of requests in flight (for `/abort_request`), one live request
    /// per rid.
    pub rids: Arc<RidTable>,
    /// Prefill/decode disaggregation (`None`: unified).
    pub pd: Option<Arc<crate::pd::Pd>>,
    /// The hierarchical cache's remote tier (`None`: none).
    pub remote: Option<Arc<crate::pd::RemoteKv>>,
    /// The KV event publisher's state, for `/get_server_info` (`None`: no events).
    pub kv_events: Option<Arc<dyn Fn() -> serde_json::Value + Send + Sync>>,
    /// Whether tool calls are enforced by a grammar (`false` with `--disable-tool-grammar`:
    /// they are parsed out of unconstrained output, for comparison).
    pub tool_grammar: bool,
    /// How the model writes tool calls, read once from its chat template.
    pub(crate) tool_syntax: crate::openai::tools::ToolSyntax,
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
        auth: Auth,
    ) -> Self {
        let tool_syntax = crate::openai::tools::ToolSyntax::of_template(
            chat_template.as_deref().map(|t| t.source()),
        );
        Self {
            sched,
            tokenizer,
            chat_template,
            tool_syntax,
            grammars,
            metrics: Arc::new(Metrics::default()),
            info,
            auth,
            rids: Arc::new(RidTable::default()),
            pd: None,
            remote: None,
            kv_events: None,
            tool_grammar: true,
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

/// Refuses a request without a valid key (401) and hands the caller's [`auth::Tenant`] to
/// the handlers as a request extension.
async fn auth(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let Some(tenant) = state.auth.authenticate(req.uri().path(), req.headers()) else {
        state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
        return ApiError::Unauthorized.into_response();
    };
    req.extensions_mut().insert(tenant);
    let resp = next.run(req).await;
    if resp.status().is_client_error() {
        state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
    }
    resp
}

/// A panic while answering one request ends that request with a 500 (OpenAI's error shape),
/// not the connection's task or the server. The panic's message is in the answer (what a
/// bug report needs) and on stderr (the panic hook's report).
async fn catch_panic(req: Request, next: Next) -> Response {
    use futures_util::FutureExt;
    match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(resp) => resp,
        Err(payload) => ApiError::Internal(format!(
            "internal error while serving this request: {}",
            sglrs_scheduler::panic_message(payload.as_ref())
        ))
        .into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

/// The HTTP method of a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteMethod {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
}

impl RouteMethod {
    /// The method's name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteMethod::Get => "GET",
            RouteMethod::Post => "POST",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            RouteMethod::Get => MethodFilter::GET,
            RouteMethod::Post => MethodFilter::POST,
        }
    }
}

/// One entry of the route table: a method and a path that [`router`] serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    /// The method.
    pub method: RouteMethod,
    /// The path.
    pub path: &'static str,
}

fn at<H, T>(
    method: RouteMethod,
    path: &'static str,
    handler: H,
) -> (RouteInfo, MethodRouter<Arc<AppState>>)
where
    H: Handler<T, Arc<AppState>>,
    T: 'static,
{
    (RouteInfo { method, path }, on(method.filter(), handler))
}

/// Every route with its handler: the one table [`router`] and [`route_table`] read.
fn routes() -> Vec<(RouteInfo, MethodRouter<Arc<AppState>>)> {
    use RouteMethod::{Get, Post};
    vec![
        at(Post, "/generate", native::generate),
        at(Post, "/v1/completions", openai::completions),
        at(Post, "/v1/chat/completions", openai::chat_completions),
        at(Get, "/v1/models", routes::models),
        at(Get, "/health", routes::health),
        at(Get, "/health_generate", routes::health_generate),
        at(Get, "/model_info", routes::model_info),
        at(Get, "/get_model_info", routes::model_info),
        at(Get, "/get_server_info", routes::server_info),
        at(Get, "/server_info", routes::server_info),
        at(Get, "/get_load", routes::get_load),
        at(Post, "/flush_cache", routes::flush_cache),
        at(
            Post,
            "/clear_hicache_storage_backend",
            routes::clear_hicache_storage,
        ),
        at(
            Get,
            "/clear_hicache_storage_backend",
            routes::clear_hicache_storage,
        ),
        at(Get, "/flush_cache", routes::flush_cache),
        at(Post, "/abort_request", routes::abort_request),
        at(Get, "/metrics", routes::metrics),
    ]
}

/// Every method and path [`router`] serves (for tests that walk them all, e.g. the API
/// key check).
pub fn route_table() -> Vec<RouteInfo> {
    routes().into_iter().map(|(info, _)| info).collect()
}

/// The router with every route.
pub fn router(state: Arc<AppState>) -> Router {
    let mut r = Router::new();
    for (info, handler) in routes() {
        r = r.route(info.path, handler);
    }
    r.fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .layer(axum::middleware::from_fn(catch_panic))
        .with_state(state)
}

/// Serves until the listener fails, ctrl-c or SIGTERM; then finishes the cache copies in
/// flight and writes the host tier down to disk, so a restart on the same
/// `--hicache-storage-dir` serves every page.
pub async fn serve(state: Arc<AppState>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let served = axum::serve(listener, router(state.clone()))
        .with_graceful_shutdown(shutdown_signal())
        .await;
    if let Err(e) = state.sched.drain().await {
        eprintln!("sglrs: flushing the cache tiers at shutdown: {e}");
    }
    served
}

/// Resolves on ctrl-c or SIGTERM (what `kill`, systemd and Kubernetes send).
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_panicking_handler_answers_500_and_the_router_keeps_serving() {
        async fn boom() -> &'static str {
            panic!("boom in a handler")
        }
        let app = Router::new()
            .route("/boom", axum::routing::get(boom))
            .route("/ok", axum::routing::get(|| async { "fine" }))
            .layer(axum::middleware::from_fn(catch_panic));
        let get = |path: &str| {
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let r = app.clone().oneshot(get("/boom")).await.unwrap();
        assert_eq!(r.status(), 500);
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["type"], "server_error", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("boom in a handler")),
            "{v}"
        );
        let r = app.oneshot(get("/ok")).await.unwrap();
        assert_eq!(r.status(), 200);
    }
}
