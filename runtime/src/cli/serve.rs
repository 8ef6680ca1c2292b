//! `sglrs serve`: load a model, start the scheduler thread and the HTTP server.

use crate::chat::ChatTemplate;
use crate::executor::cpu::{CpuExecutor, ExecConfig, KvCapacity};
use crate::executor::{Executor, KvDtype};
use crate::model::{self, LoadOptions, Quantize};
use crate::scheduler::{self, SchedulePolicy, SchedulerConfig, SchedulerCore};
use crate::server::{self, AppState, GrammarCompiler, ServerInfo};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;

/// Options of `sglrs serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Model: a `.gguf` file or an HF folder (default: the bundled SmolLM2-135M-Instruct).
    #[arg(long, alias = "model-path")]
    pub model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// KV cache memory in MiB.
    #[arg(long, default_value_t = 1024)]
    pub kv_memory_mb: usize,
    /// Element type of the KV cache: f16, bf16 or f32 (f32 holds half as many tokens in the
    /// same memory but skips the conversion when attention reads the cache).
    #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
    pub kv_cache_dtype: String,
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
    /// Require `Authorization: Bearer KEY` (also read from `SGLRS_API_KEY`).
    #[arg(long)]
    pub api_key: Option<String>,
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
}

/// Runs the server until ctrl-c.
/// Everything `sglrs serve` runs, short of the listener: the scheduler thread with the model's
/// executor, and the state the HTTP routes share. The in-process Python `Engine` starts the
/// same way and answers through [`crate::server::router`] without a socket.
pub struct Started {
    /// State shared by the routes.
    pub state: Arc<AppState>,
    /// The model's chat template, if it has one.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// The model file or folder that was loaded.
    pub path: PathBuf,
    /// KV pages in the pool.
    pub num_pages: usize,
    /// Longest sequence served.
    pub max_context: usize,
}

/// Loads the model and starts the scheduler as `sglrs serve` does, without listening.
/// `in_process` marks the server info of an embedded engine (no host, port or API key).
pub fn build_state(args: &ServeArgs, in_process: bool) -> anyhow::Result<Started> {
    let path = args.model.clone().unwrap_or_else(model::default_model_path);
    let opts = LoadOptions {
        quantize: args.quantize,
        ..LoadOptions::default()
    };
    let loaded =
        model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let exec = CpuExecutor::new(
        &loaded.config,
        &loaded.weights,
        &ExecConfig {
            page_size: args.page_size,
            kv: KvCapacity::Bytes(args.kv_memory_mb << 20),
            kv_dtype: match args.kv_cache_dtype.as_str() {
                "f32" => KvDtype::F32,
                "bf16" => KvDtype::Bf16,
                _ => KvDtype::F16,
            },
            threads,
        },
    )
    .context("building the CPU executor")?;
    let max_context = args
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
    let cfg = SchedulerConfig {
        page_size: args.page_size,
        num_pages: exec.num_pages(),
        max_running: args.max_running_requests,
        max_batch_tokens: args.max_batch_tokens.max(args.max_running_requests),
        chunked_prefill_size: args.chunked_prefill_size,
        policy: args.schedule_policy,
        eos_tokens: eos.clone(),
        max_context,
        vocab_size,
        jump_forward: !args.disable_jump_forward,
        admission_hold: std::time::Duration::from_millis(args.admission_hold_ms),
    };
    let num_pages = cfg.num_pages;
    let core = SchedulerCore::new(cfg, tokenizer.clone()).context("configuring the scheduler")?;
    let (handle, _join) =
        scheduler::spawn(core, Box::new(exec)).context("starting the scheduler")?;
    let vocab = sglrs_grammar::TokenVocab::from_tokenizer(tokenizer.inner(), &eos)
        .map_err(|e| anyhow::anyhow!("building the grammar vocabulary: {e}"))?;
    let grammars = Arc::new(GrammarCompiler::new(Arc::new(vocab)));
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        path.file_stem().map_or_else(
            || "default".to_string(),
            |s| s.to_string_lossy().into_owned(),
        )
    });
    let info = ServerInfo {
        model_path: path.display().to_string(),
        served_model_name: name,
        max_context,
        vocab_size,
        args: serde_json::json!({
            "in_process": in_process,
            "host": (!in_process).then_some(&args.host),
            "port": (!in_process).then_some(args.port),
            "page_size": args.page_size,
            "kv_memory_mb": args.kv_memory_mb,
            "num_pages": num_pages,
            "schedule_policy": args.schedule_policy.to_string(),
            "chunked_prefill_size": args.chunked_prefill_size,
            "max_batch_tokens": args.max_batch_tokens,
            "max_running_requests": args.max_running_requests,
            "threads": threads,
            "api_key_required": args.api_key.is_some(),
            "jump_forward": !args.disable_jump_forward,
        }),
    };
    let chat_template = loaded.chat_template.map(Arc::new);
    let api_key = if in_process {
        None
    } else {
        args.api_key.clone().or_else(|| {
            std::env::var("SGLRS_API_KEY")
                .ok()
                .filter(|k| !k.is_empty())
        })
    };
    let state = Arc::new(AppState::new(
        handle,
        tokenizer,
        chat_template.clone(),
        grammars,
        info,
        api_key,
    ));
    Ok(Started {
        state,
        chat_template,
        path,
        num_pages,
        max_context,
    })
}

/// `sglrs serve`: [`build_state`], then the HTTP server on `--host`:`--port`.
pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let Started {
        state,
        path,
        num_pages,
        max_context,
        ..
    } = build_state(args, false)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")?;
    rt.block_on(async {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        eprintln!(
            "sglrs: serving {} on http://{} ({} KV pages of {} tokens, context {})",
            path.display(),
            listener
                .local_addr()
                .map_or(addr.clone(), |a| a.to_string()),
            num_pages,
            args.page_size,
            max_context
        );
        server::serve(state, listener).await.context("serving")
    })
}
