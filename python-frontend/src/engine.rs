//! The in-process engine: the runtime's model, scheduler thread and request handling, called
//! directly from Python.
//!
//! Requests are SGLang-native `/generate` bodies, answered by the runtime's own route handlers
//! (the server's [`router`](sglrs_server::router) called as a service, with no socket
//! and no HTTP connection), so the in-process answers are exactly the server's. Every call
//! releases the GIL while it waits, so Python threads (forked branches, `run_batch`) submit
//! concurrently and the scheduler batches them over one radix cache.

use crate::direct;
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use futures_util::StreamExt;
use sglrs_model::chat::{ChatTemplate, RenderOptions};
use sglrs_server::{self as server, AppState, EngineConfig};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use tower::ServiceExt;

pub use crate::error::EngineError;

/// Engine settings as `sglrs serve` options: parsed by the same definitions, same defaults.
#[derive(clap::Parser, Debug)]
#[command(name = "Engine", no_binary_name = true)]
struct Settings {
    #[command(flatten)]
    engine: EngineConfig,
}

/// Turns `{"page_size": 16, "disable_jump_forward": true}` into `serve` options.
pub fn parse_settings(
    model_path: Option<&str>,
    config: &serde_json::Map<String, serde_json::Value>,
) -> Result<EngineConfig, EngineError> {
    use clap::Parser;
    let mut argv: Vec<String> = Vec::new();
    if let Some(p) = model_path {
        argv.push("--model".into());
        argv.push(p.into());
    }
    for (k, v) in config {
        let flag = format!("--{}", k.replace('_', "-"));
        match v {
            serde_json::Value::Bool(true) => argv.push(flag),
            serde_json::Value::Bool(false) | serde_json::Value::Null => {}
            serde_json::Value::String(s) => {
                argv.push(flag);
                argv.push(s.clone());
            }
            serde_json::Value::Number(n) => {
                argv.push(flag);
                argv.push(n.to_string());
            }
            other => {
                return Err(EngineError::Config(format!(
                    "setting {k}: unsupported value {other}"
                )))
            }
        }
    }
    Settings::try_parse_from(argv)
        .map(|s| s.engine)
        .map_err(|e| EngineError::Config(e.render().to_string()))
}

/// A started engine: the tokio runtime that runs the route handlers, and the shared state.
pub struct Running {
    rt: tokio::runtime::Runtime,
    state: Arc<AppState>,
    router: axum::Router,
    chat_template: Option<Arc<ChatTemplate>>,
}

/// Loads the model and starts the scheduler thread, as `sglrs serve` does, without a listener.
pub fn start(cfg: &EngineConfig) -> Result<Running, EngineError> {
    let start_err =
        |what: &str, e: &dyn std::fmt::Display| EngineError::Start(format!("{what}: {e}"));
    let engine = sglrs_server::Engine::start(cfg).map_err(|e| EngineError::Start(e.to_string()))?;
    let (state, chat_template) = (engine.state, engine.chat_template);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sglrs-engine")
        .enable_all()
        .build()
        .map_err(|e| start_err("starting tokio", &e))?;
    let router = server::router(state.clone());
    Ok(Running {
        rt,
        state,
        router,
        chat_template,
    })
}

/// What one call answered: a status and a body.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}

fn to_result(a: Answer) -> Result<String, EngineError> {
    let text = String::from_utf8_lossy(&a.body).into_owned();
    if a.status.is_success() {
        Ok(text)
    } else if a.status.is_client_error() {
        Err(EngineError::BadRequest(error_message(&a.body)))
    } else {
        Err(EngineError::Internal(error_message(&a.body)))
    }
}

fn request(method: Method, path: &str, body: Vec<u8>) -> Result<Request<Body>, EngineError> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .map_err(|e| EngineError::Internal(format!("building the request: {e}")))
}

/// Answers one request through the router, as the HTTP server would.
async fn call_router(
    router: axum::Router,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> Result<Answer, EngineError> {
    let req = request(method, path, body)?;
    let resp = router
        .oneshot(req)
        .await
        .map_err(|e| EngineError::Internal(format!("route failed: {e}")))?;
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .map_err(|e| EngineError::Internal(format!("reading the answer: {e}")))?;
    Ok(Answer {
        status,
        body: bytes.to_vec(),
    })
}

/// One submitted `/generate`: wait for its JSON answer.
pub enum Call {
    /// On the direct path: the scheduler's events.
    Direct(direct::Pending),
    /// Through the router: the answer arrives on this channel.
    Routed(mpsc::Receiver<Result<String, EngineError>>),
    /// Refused before submission.
    Failed(EngineError),
}

impl Call {
    /// Blocks until the answer is complete: the response JSON text, or the error.
    pub fn wait(self, engine: &Running) -> Result<String, EngineError> {
        match self {
            Call::Direct(p) => p.wait(&engine.state),
            Call::Routed(rx) => rx
                .recv()
                .map_err(|_| EngineError::Internal("the request was dropped".into()))?,
            Call::Failed(e) => Err(e),
        }
    }
}

impl Running {
    async fn call(&self, method: Method, path: &str, body: Vec<u8>) -> Result<Answer, EngineError> {
        call_router(self.router.clone(), method, path, body).await
    }

    /// Answers one `/generate` body (blocking the calling thread): a plain generation takes
    /// the direct path to the scheduler, anything else goes through the router.
    pub fn generate(&self, body: Vec<u8>) -> Result<String, EngineError> {
        match self.submit_group(vec![body]).pop() {
            Some(call) => call.wait(self),
            None => Err(EngineError::Internal("no request was submitted".into())),
        }
    }

    /// Submits several `/generate` bodies at once, returning a handle per body (same order).
    /// The plain generations among them reach the scheduler in one message, so they are
    /// admitted in the same step and decode as one batch; the others go through the router
    /// concurrently. A body that fails validation gives a handle that returns its error.
    pub fn submit_group(&self, bodies: Vec<Vec<u8>>) -> Vec<Call> {
        let start = std::time::Instant::now();
        let mut calls: Vec<Option<Call>> = Vec::with_capacity(bodies.len());
        let mut direct_reqs = Vec::new();
        let mut direct_slots = Vec::new();
        for (i, body) in bodies.into_iter().enumerate() {
            match direct::parse(&body) {
                Some(d) => match direct::prepare(&self.state, &self.rt, d) {
                    Ok(req) => {
                        direct_reqs.push(req);
                        direct_slots.push(i);
                        calls.push(None);
                    }
                    Err(e) => calls.push(Some(Call::Failed(direct::api_error(&self.state, e)))),
                },
                None => calls.push(Some(self.spawn_routed(body))),
            }
        }
        if !direct_reqs.is_empty() {
            match direct::submit_group(&self.state, direct_reqs, start) {
                Ok(pendings) => {
                    for (slot, p) in direct_slots.into_iter().zip(pendings) {
                        calls[slot] = Some(Call::Direct(p));
                    }
                }
                Err(e) => {
                    for slot in direct_slots {
                        calls[slot] = Some(Call::Failed(EngineError::Internal(e.to_string())));
                    }
                }
            }
        }
        calls
            .into_iter()
            .map(|c| {
                c.unwrap_or_else(|| Call::Failed(EngineError::Internal("not submitted".into())))
            })
            .collect()
    }

    /// Runs a body through the router on the engine's tokio runtime.
    fn spawn_routed(&self, body: Vec<u8>) -> Call {
        let (tx, rx) = mpsc::channel();
        let router = self.router.clone();
        self.rt.spawn(async move {
            let answer = call_router(router, Method::POST, "/generate", body).await;
            let _ = tx.send(answer.and_then(to_result));
        });
        Call::Routed(rx)
    }

    /// Answers a GET route (`/get_server_info`, `/get_model_info`).
    pub fn get(&self, path: &str) -> Result<String, EngineError> {
        to_result(self.rt.block_on(self.call(Method::GET, path, Vec::new()))?)
    }

    /// Empties the prefix cache; `false` while requests are running.
    pub fn flush(&self) -> Result<bool, EngineError> {
        self.rt
            .block_on(self.state.sched.flush())
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    /// Starts a streaming `/generate`; each event's JSON text arrives on the receiver,
    /// then the channel closes. A failure arrives as one `Err`.
    pub fn generate_stream(
        &self,
        body: Vec<u8>,
    ) -> Result<mpsc::Receiver<Result<String, EngineError>>, EngineError> {
        let (tx, rx) = mpsc::channel();
        let req = request(Method::POST, "/generate", body)?;
        let router = self.router.clone();
        self.rt.spawn(async move {
            let resp = match router.oneshot(req).await {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(EngineError::Internal(format!("route failed: {e}"))));
                    return;
                }
            };
            let status = resp.status();
            if !status.is_success() {
                let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                    .await
                    .unwrap_or_default();
                let _ = tx.send(to_result(Answer {
                    status,
                    body: body.to_vec(),
                }));
                return;
            }
            let mut frames = resp.into_body().into_data_stream();
            let mut pending = String::new();
            while let Some(frame) = frames.next().await {
                let bytes = match frame {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(EngineError::Internal(format!("stream failed: {e}"))));
                        return;
                    }
                };
                pending.push_str(&String::from_utf8_lossy(&bytes));
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    let Some(data) = line.trim_end().strip_prefix("data:") else {
                        continue;
                    };
                    let data = data.trim();
                    if data == "[DONE]" {
                        return;
                    }
                    if tx.send(Ok(data.to_string())).is_err() {
                        return; // the Python side stopped reading: dropping the body aborts
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Renders a conversation with the model's chat template (no generation prompt).
    pub fn render_chat(&self, messages: &serde_json::Value) -> Result<Option<String>, EngineError> {
        match &self.chat_template {
            None => Ok(None),
            Some(t) => t
                .render(messages, &RenderOptions::default())
                .map(Some)
                .map_err(|e| EngineError::BadRequest(e.to_string())),
        }
    }

    /// The model path the engine serves.
    pub fn model_path(&self) -> &str {
        &self.state.info.model_path
    }
}

/// The engine behind the Python object: `None` once shut down.
#[derive(Default)]
pub struct Slot {
    inner: RwLock<Option<Arc<Running>>>,
}

impl Slot {
    /// Holds a started engine.
    pub fn new(r: Running) -> Self {
        Self {
            inner: RwLock::new(Some(Arc::new(r))),
        }
    }

    /// The running engine (shared, so calls from many threads run at once).
    pub fn get(&self) -> Result<Arc<Running>, EngineError> {
        let guard = self.inner.read().map_err(|_| EngineError::Shutdown)?;
        guard.clone().ok_or(EngineError::Shutdown)
    }

    /// Takes the engine out; it stops once in-flight calls return.
    pub fn take(&self) -> Option<Arc<Running>> {
        self.inner.write().ok().and_then(|mut g| g.take())
    }
}

/// A stream's receiving end, shareable between threads (Python may pass the iterator along).
pub struct StreamRx(pub Mutex<mpsc::Receiver<Result<String, EngineError>>>);
