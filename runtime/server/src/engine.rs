//! The engine builder: model, executor, scheduler thread and the state the routes share.
//!
//! [`EngineConfig`] holds every setting of an engine (the `sglrs serve` flags are its fields;
//! the Python `Engine` parses the same definitions), and [`Engine::start`] loads the model,
//! builds the CPU executor, starts the scheduler thread and returns the routes' state. The
//! binary then listens ([`Engine::serve`]); the in-process Python engine calls the same
//! [`Engine::router`] without a socket.

use crate::auth::Auth;
use crate::{AppState, GrammarCompiler, ServerInfo};
use sglrs_executor::{BuildError, CpuExecutor, ExecConfig, Executor, KvCapacity, KvDtype};
use sglrs_model::chat::ChatTemplate;
use sglrs_model::{LoadError, LoadOptions, Quantize};
use sglrs_scheduler::{SchedError, SchedulePolicy, SchedulerConfig, SchedulerCore};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Element type of the KV cache, as `--kv-cache-dtype` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtype {
    /// IEEE half precision (llama.cpp's default).
    F16,
    /// bfloat16.
    Bf16,
    /// 32-bit float: half as many tokens in the same memory, no conversion when read.
    F32,
}

impl From<KvCacheDtype> for KvDtype {
    fn from(d: KvCacheDtype) -> Self {
        match d {
            KvCacheDtype::F16 => KvDtype::F16,
            KvCacheDtype::Bf16 => KvDtype::Bf16,
            KvCacheDtype::F32 => KvDtype::F32,
        }
    }
}

/// Every setting of an engine. Its fields are the `sglrs serve` flags (`--page-size` for
/// `page_size`, …) with the same defaults, so the binary and the Python `Engine` parse one
/// definition.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineConfig {
    /// Model: a `.gguf` file or an HF folder (default: the bundled SmolLM2-135M-Instruct).
    #[arg(long, alias = "model-path")]
    pub model: Option<PathBuf>,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// KV cache memory in MiB.
    #[arg(long, default_value_t = 1024)]
    pub kv_memory_mb: usize,
    /// Element type of the KV cache: f16, bf16 or f32 (f32 holds half as many tokens in the
    /// same memory but skips the conversion when attention reads the cache).
    #[arg(long, value_enum, default_value_t = KvCacheDtype::F16)]
    pub kv_cache_dtype: KvCacheDtype,
    /// Waiting-queue order: lpm, fcfs or dfs-weight.
    #[arg(long, default_value = "lpm")]
    pub schedule_policy: SchedulePolicy,
    /// Most prompt tokens one request prefills per step.
    #[arg(long, default_value_t = 512)]
    pub chunked_prefill_size: usize,
    /// Token budget of one forward pass (decode tokens plus prefill chunks).
    #[arg(long, default_value_t = 576)]
    pub max_batch_tokens: usize,
    /// Most requests running at once.
    #[arg(long, default_value_t = 32)]
    pub max_running_requests: usize,
    /// Most requests waiting for admission (submitted, not yet running); more are refused at
    /// once with HTTP 503 and `Retry-After` instead of being queued. The default, 256, is
    /// as many waiting requests as one admission step orders by policy (the scheduler looks
    /// at the first 256 waiting sequences), and at 32 running it is 8 rounds of requests:
    /// tens of seconds of waiting on a small CPU, about what a client's timeout tolerates.
    /// Must be at least 1.
    #[arg(long, default_value_t = 256)]
    pub max_queued_requests: usize,
    /// Most of those waiting places one tenant of `--api-keys-file` may hold (default: half
    /// of `--max-queued-requests`, at least 1), so a tenant flooding the server leaves room
    /// for the others; beyond it that tenant's requests get 503 and `Retry-After`. Callers
    /// of the one `--api-key` without a keys file, and servers without keys, have only the
    /// total bound.
    #[arg(long)]
    pub max_queued_requests_per_tenant: Option<usize>,
    /// Priority preemption (SGLang's flag): when every running place is taken, a waiting
    /// request whose `priority` exceeds a running request's (of the same tenant) by more
    /// than this pauses it and runs first; the paused request keeps its output and its KV
    /// (in the radix cache) and resumes where it stopped. With the queue full, a request of
    /// higher priority also takes the place of the lowest-priority waiting request of its
    /// tenant, which gets 503 and `Retry-After`. Higher `priority` values go first.
    /// Must be at least 0 (below it, requests of equal priority would pause each other).
    #[arg(
        long,
        default_value_t = 10,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i64).range(0..)
    )]
    pub priority_scheduling_preemption_threshold: i64,
    /// Never pause a running request for a waiting one of higher priority (the waiting
    /// queue is still ordered by priority, and a full queue still takes requests of higher
    /// priority in place of lower ones).
    #[arg(long)]
    pub disable_priority_preemption: bool,
    /// Most grammar compiles (`json_schema`, `regex`, `ebnf`, tools) running at once; more
    /// are answered 503 with `Retry-After` instead of queueing for blocking-pool threads.
    /// Compiled grammars are cached, so this bounds only new ones.
    #[arg(long, default_value_t = 8)]
    pub max_concurrent_grammar_compiles: usize,
    /// Kernel threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Model name reported by `/v1/models` (default: the model file's stem).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Cap the context length below the model's.
    #[arg(long)]
    pub context_length: Option<usize>,
    /// Turn off jump-forward over grammar-forced text.
    #[arg(long)]
    pub disable_jump_forward: bool,
    /// Most tokens a greedy request drafts per step by looking up its last tokens earlier
    /// in its own context (prompt-lookup speculative decoding), checked by the model in the
    /// same pass: the output is the same token for token. 0 turns drafting off.
    #[arg(long, default_value_t = 4)]
    pub speculative_ngram_tokens: usize,
    /// Do not enforce tool calls with a grammar: the tools still go into the prompt, and
    /// calls are parsed out of the model's free output when they parse (what engines
    /// without constrained tool calling do; for comparison, e.g. `sglrs bench agents`).
    #[arg(long)]
    pub disable_tool_grammar: bool,
    /// Re-encode float weights (an HF folder's f32/f16/bf16) at load: `q8_0` or `q4_1`
    /// (llama.cpp's encodings; q4_1 keeps the embedding and output head at q8_0) run them on
    /// the quantized kernels. Weights already quantized (GGUF) are kept.
    #[arg(long)]
    pub quantize: Option<Quantize>,
    /// Longest wait, in ms, for the followers of requests that finished in the same step
    /// (clients sending their next request), so that their prefills run as one pass; 0 never
    /// waits. The wait happens only while nothing else is running.
    #[arg(long, default_value_t = 15)]
    pub admission_hold_ms: u64,
    /// Require `Authorization: Bearer KEY` on every route but `/health` (the binary also
    /// reads `SGLRS_API_KEY`); compared in constant time. `/health_generate` needs it too
    /// (it runs a generation at top priority), and so does `/metrics` unless
    /// `--metrics-open`. Must not be empty. Ignored in process, where there is no listener.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Tenants: a file of `KEY TENANT` pairs, one per line (whitespace between, `#` starts a
    /// comment; the binary also reads `SGLRS_API_KEYS_FILE`). Every route but the open ones
    /// then needs one of these keys (or `--api-key`, tenant `default`); each tenant's
    /// requests have their own cache namespaces, admission takes tenants in turn and the
    /// queue holds at most `--max-queued-requests-per-tenant` of one tenant's requests.
    /// Duplicate keys, a key without a tenant, a file without keys or an unreadable one refuse
    /// to start.
    /// Ignored in process, where there is no listener.
    #[arg(long)]
    pub api_keys_file: Option<PathBuf>,
    /// With `--api-key`: serve `/metrics` without the key, for a Prometheus scraper on a
    /// trusted network. Off by default: the metrics show the server's load and traffic.
    #[arg(long)]
    pub metrics_open: bool,
    /// Lower tiers of the KV cache (host RAM, disk).
    #[command(flatten)]
    pub hicache: crate::hicache::HiCacheArgs,
    /// Prefill/decode disaggregation.
    #[command(flatten)]
    pub disagg: crate::pd::DisaggArgs,
    /// Publish KV cache events for cache-aware routers (llm-d), as vLLM and SGLang do:
    /// JSON with `publisher` (`zmq`), `endpoint` (`tcp://*:5557`), `replay_endpoint`,
    /// `topic`, `buffer_steps`, `hwm`, `max_queue_size` (docs/scale-out.md).
    #[arg(long)]
    pub kv_events_config: Option<String>,
    /// Where the server listens (`host:port`), as `/get_server_info` reports it; `None` for
    /// an in-process engine. Set by the caller, not a flag.
    #[arg(skip)]
    pub listen: Option<(String, u16)>,
}

/// Why an engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model could not be loaded.
    #[error("loading {path}: {source}")]
    Load {
        /// The model file or folder.
        path: PathBuf,
        /// What went wrong.
        source: LoadError,
    },
    /// The executor could not be built from the model's weights.
    #[error("building the CPU executor: {0}")]
    Executor(#[from] BuildError),
    /// The scheduler could not be configured or started.
    #[error("starting the scheduler: {0}")]
    Scheduler(#[from] SchedError),
    /// The grammar engine could not read the tokenizer's vocabulary.
    #[error("building the grammar vocabulary: {0}")]
    Vocab(String),
    /// A setting cannot work (e.g. an empty API key).
    #[error("configuration: {0}")]
    Config(String),
}

/// A started engine: the scheduler thread with the model's executor, and the routes' state.
pub struct Engine {
    /// State shared by the routes.
    pub state: Arc<AppState>,
    /// The model's chat template, if it has one.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// The model file or folder that was loaded.
    pub path: PathBuf,
    /// KV pages in the pool.
    pub num_pages: usize,
    /// Tokens per KV page.
    pub page_size: usize,
    /// Longest sequence served.
    pub max_context: usize,
}

impl Engine {
    /// Loads the model, builds the executor and starts the scheduler thread.
    pub fn start(cfg: &EngineConfig) -> Result<Self, EngineError> {
        if cfg.api_key.as_deref() == Some("") {
            return Err(EngineError::Config(
                "--api-key is empty: give a key, or leave the flag out to serve without one".into(),
            ));
        }
        let tenants = match (&cfg.api_keys_file, &cfg.listen) {
            (Some(file), Some(_)) => crate::auth::parse_keys_file(file, cfg.api_key.as_deref())
                .map_err(|e| EngineError::Config(e.to_string()))?,
            _ => Vec::new(),
        };
        let per_tenant = cfg
            .max_queued_requests_per_tenant
            .unwrap_or(cfg.max_queued_requests / 2)
            .max(1);
        let path = cfg
            .model
            .clone()
            .unwrap_or_else(sglrs_model::default_model_path);
        let opts = LoadOptions {
            quantize: cfg.quantize,
            ..LoadOptions::default()
        };
        let loaded = sglrs_model::load(&path, &opts).map_err(|source| EngineError::Load {
            path: path.clone(),
            source,
        })?;
        let threads = cfg
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let exec = CpuExecutor::new(
            &loaded.config,
            &loaded.weights,
            &ExecConfig {
                page_size: cfg.page_size,
                kv: KvCapacity::Bytes(cfg.kv_memory_mb << 20),
                kv_dtype: cfg.kv_cache_dtype.into(),
                threads,
            },
        )?;
        let max_context = cfg
            .context_length
            .map_or(exec.max_context(), |c| c.min(exec.max_context()));
        let vocab_size = exec.vocab_size();
        let tokenizer = Arc::new(loaded.tokenizer);
        let mut eos: Vec<u32> = tokenizer.eog_ids().to_vec();
        if let Some(e) = tokenizer.eos_id() {
            if !eos.contains(&e) {
                eos.push(e);
            }
        }
        let layout = exec.kv_layout();
        let device_bytes = exec.num_pages() * layout.page_bytes();
        let quantize = cfg.quantize.map(|q| format!("{q:?}")).unwrap_or_default();
        cfg.hicache.validate().map_err(EngineError::Config)?;
        let offload = cfg.disagg.disaggregation_decode_enable_offload_kvcache;
        if offload && cfg.disagg.disaggregation_mode != crate::pd::DisaggMode::Decode {
            return Err(EngineError::Config(
                "--disaggregation-decode-enable-offload-kvcache needs --disaggregation-mode decode"
                    .into(),
            ));
        }
        if offload && !cfg.hicache.remote_enabled() {
            return Err(EngineError::Config(
                "--disaggregation-decode-enable-offload-kvcache needs a remote tier to offload \
                 to (--enable-hierarchical-cache --hicache-storage-backend quic \
                 --hicache-storage-addr HOST:PORT)"
                    .into(),
            ));
        }
        let remote = crate::pd::RemoteKv::start(&cfg.hicache, &cfg.disagg, layout)
            .map_err(EngineError::Config)?;
        // A decode server writes to the shared store only when asked to: its pages are the
        // prefill's plus its output, worth sharing only for multi-turn traffic.
        let remote_write =
            cfg.disagg.disaggregation_mode != crate::pd::DisaggMode::Decode || offload;
        let hicache = cfg
            .hicache
            .build(
                &path,
                &quantize,
                layout,
                device_bytes,
                remote
                    .clone()
                    .map(|r| r as Arc<dyn sglrs_scheduler::hicache::RemoteTier>),
                remote_write,
            )
            .map_err(EngineError::Config)?;
        let hicache_info = crate::hicache::info_json(&cfg.hicache, hicache.as_ref(), device_bytes);
        let (kv_events, kv_events_info) = start_kv_events(
            cfg.kv_events_config.as_deref(),
            hicache.as_ref().map(|h| h.root_hash),
            &path,
            &quantize,
            layout,
        )?;
        let sched_cfg = SchedulerConfig {
            page_size: cfg.page_size,
            num_pages: exec.num_pages(),
            max_running: cfg.max_running_requests,
            max_batch_tokens: cfg.max_batch_tokens.max(cfg.max_running_requests),
            chunked_prefill_size: cfg.chunked_prefill_size,
            policy: cfg.schedule_policy,
            eos_tokens: eos.clone(),
            max_context,
            vocab_size,
            jump_forward: !cfg.disable_jump_forward,
            speculative_ngram: cfg.speculative_ngram_tokens,
            admission_hold: Duration::from_millis(cfg.admission_hold_ms),
            max_queued: cfg.max_queued_requests,
            max_queued_per_tenant: per_tenant,
            priority_preemption: (!cfg.disable_priority_preemption)
                .then_some(cfg.priority_scheduling_preemption_threshold),
            hicache,
            kv_events,
        };
        let num_pages = sched_cfg.num_pages;
        let core = SchedulerCore::new(sched_cfg, tokenizer.clone())?;
        let pd = crate::pd::Pd::start(
            &cfg.disagg,
            cfg.listen.as_ref().map(|l| l.0.as_str()),
            layout,
            exec.page_io(),
        )
        .map_err(EngineError::Config)?;
        #[cfg(feature = "pd")]
        let importer = pd
            .as_ref()
            .filter(|p| p.mode() == crate::pd::DisaggMode::Decode)
            .map(|p| {
                Arc::new(crate::pd::Importer(p.clone())) as Arc<dyn sglrs_scheduler::KvImporter>
            });
        #[cfg(not(feature = "pd"))]
        let importer = None;
        let (handle, _join) = sglrs_scheduler::spawn_with(core, Box::new(exec), importer)?;
        if let Some(p) = &pd {
            p.set_scheduler(handle.clone());
        }
        let vocab = sglrs_grammar::TokenVocab::from_tokenizer(tokenizer.inner(), &eos)
            .map_err(|e| EngineError::Vocab(e.to_string()))?;
        let grammars = Arc::new(GrammarCompiler::new(
            Arc::new(vocab),
            cfg.max_concurrent_grammar_compiles,
        ));
        let info = ServerInfo {
            model_path: path.display().to_string(),
            served_model_name: cfg.served_model_name.clone().unwrap_or_else(|| {
                path.file_stem().map_or_else(
                    || "default".to_string(),
                    |s| s.to_string_lossy().into_owned(),
                )
            }),
            max_context,
            vocab_size,
            args: {
                let mut a = server_args(cfg, num_pages, threads);
                a["hicache"] = hicache_info;
                a
            },
        };
        let chat_template = loaded.chat_template.map(Arc::new);
        let auth = Auth::with_tenants(
            cfg.listen.as_ref().and(cfg.api_key.clone()),
            tenants,
            cfg.metrics_open,
        );
        let mut state = AppState::new(
            handle,
            tokenizer,
            chat_template.clone(),
            grammars,
            info,
            auth,
        );
        state.info.args["disaggregation_mode"] = cfg.disagg.disaggregation_mode.as_str().into();
        state.info.args["disaggregation_bootstrap_port"] =
            cfg.disagg.disaggregation_bootstrap_port.into();
        state.pd = pd;
        state.remote = remote;
        state.kv_events = kv_events_info;
        state.tool_grammar = !cfg.disable_tool_grammar;
        let state = Arc::new(state);
        Ok(Self {
            state,
            chat_template,
            path,
            num_pages,
            page_size: cfg.page_size,
            max_context,
        })
    }

    /// The router with every route, over this engine's state.
    pub fn router(&self) -> axum::Router {
        crate::router(self.state.clone())
    }

    /// Serves on `listener` until it fails, ctrl-c or SIGTERM, then flushes the cache tiers.
    pub async fn serve(&self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        crate::serve(self.state.clone(), listener).await
    }
}

/// The state a KV event publisher shows in `/get_server_info`.
type KvEventsInfo = Option<Arc<dyn Fn() -> serde_json::Value + Send + Sync>>;

/// Starts the KV event publisher of `--kv-events-config` (nothing for none or the `null`
/// publisher). Page hashes chain on the hierarchical cache's root when it is on, else on the
/// model fingerprint computed here.
#[cfg(feature = "kv-events")]
fn start_kv_events(
    config: Option<&str>,
    root: Option<sglrs_radix_cache::PageHash>,
    path: &std::path::Path,
    quantize: &str,
    layout: sglrs_radix_cache::KvLayout,
) -> Result<
    (
        Option<sglrs_scheduler::kv_events::KvEventsConfig>,
        KvEventsInfo,
    ),
    EngineError,
> {
    let Some(spec) = config
        .map(crate::kv_events::KvEventsSpec::parse)
        .transpose()
        .map_err(EngineError::Config)?
        .flatten()
    else {
        return Ok((None, None));
    };
    let root_hash = match root {
        Some(r) => r,
        None => crate::hicache::model_fingerprint(path, quantize, layout).map_err(|e| {
            EngineError::Config(format!("fingerprinting the model for KV events: {e}"))
        })?,
    };
    let publisher = crate::kv_events::KvEventPublisher::start(spec).map_err(EngineError::Config)?;
    let p = publisher.clone();
    Ok((
        Some(sglrs_scheduler::kv_events::KvEventsConfig {
            sink: publisher,
            root_hash,
        }),
        Some(Arc::new(move || p.info_json())),
    ))
}

/// A build without the ZMQ publisher (the Python extension) refuses `--kv-events-config`.
#[cfg(not(feature = "kv-events"))]
fn start_kv_events(
    config: Option<&str>,
    _root: Option<sglrs_radix_cache::PageHash>,
    _path: &std::path::Path,
    _quantize: &str,
    _layout: sglrs_radix_cache::KvLayout,
) -> Result<
    (
        Option<sglrs_scheduler::kv_events::KvEventsConfig>,
        KvEventsInfo,
    ),
    EngineError,
> {
    match config {
        None => Ok((None, None)),
        Some(_) => Err(EngineError::Config(
            "--kv-events-config needs the ZMQ publisher, which this build (the Python \
             extension) lacks: run `sglrs serve` instead"
                .into(),
        )),
    }
}

/// The engine's arguments as `/get_server_info` shows them.
fn server_args(cfg: &EngineConfig, num_pages: usize, threads: usize) -> serde_json::Value {
    let in_process = cfg.listen.is_none();
    serde_json::json!({
        "in_process": in_process,
        "host": cfg.listen.as_ref().map(|l| &l.0),
        "port": cfg.listen.as_ref().map(|l| l.1),
        "page_size": cfg.page_size,
        "kv_memory_mb": cfg.kv_memory_mb,
        "kv_cache_dtype": format!("{:?}", cfg.kv_cache_dtype).to_lowercase(),
        "num_pages": num_pages,
        "schedule_policy": cfg.schedule_policy.to_string(),
        "chunked_prefill_size": cfg.chunked_prefill_size,
        "max_batch_tokens": cfg.max_batch_tokens,
        "max_running_requests": cfg.max_running_requests,
        "max_queued_requests": cfg.max_queued_requests,
        "max_queued_requests_per_tenant": cfg
            .max_queued_requests_per_tenant
            .unwrap_or(cfg.max_queued_requests / 2)
            .max(1),
        "max_concurrent_grammar_compiles": cfg.max_concurrent_grammar_compiles,
        "priority_scheduling_preemption_threshold": cfg.priority_scheduling_preemption_threshold,
        "disable_priority_preemption": cfg.disable_priority_preemption,
        "threads": threads,
        "api_key_required": !in_process && (cfg.api_key.is_some() || cfg.api_keys_file.is_some()),
        "tenants": !in_process && cfg.api_keys_file.is_some(),
        "metrics_open": !in_process
            && (cfg.api_key.is_some() || cfg.api_keys_file.is_some())
            && cfg.metrics_open,
        "jump_forward": !cfg.disable_jump_forward,
        "speculative_ngram_tokens": cfg.speculative_ngram_tokens,
        "tool_grammar": !cfg.disable_tool_grammar,
    })
}

#[cfg(test)]
mod tests {
    use super::EngineConfig;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        e: EngineConfig,
    }

    #[test]
    fn a_negative_preemption_threshold_is_refused_by_name() {
        let parse = |v: &str| {
            P::try_parse_from(["x", "--priority-scheduling-preemption-threshold", v]).map(|p| p.e)
        };
        let err = match parse("-1") {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a negative threshold was accepted"),
        };
        assert!(
            err.contains("--priority-scheduling-preemption-threshold"),
            "{err}"
        );
        assert_eq!(
            parse("0").unwrap().priority_scheduling_preemption_threshold,
            0
        );
        assert_eq!(
            P::try_parse_from(["x"])
                .unwrap()
                .e
                .priority_scheduling_preemption_threshold,
            10
        );
    }
}
