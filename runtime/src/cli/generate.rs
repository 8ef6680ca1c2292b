//! `sglrs generate`: run one prompt through the CPU executor and print the continuation.

use anyhow::Context;
use sglrs_executor::{
    Batch, CpuExecutor, ExecConfig, Executor, KvCapacity, LogitsWanted, SeqChunk,
};
use sglrs_model::chat::{Message, RenderOptions};
use sglrs_model::{LoadOptions, Quantize};
use sglrs_scheduler::sampler::{sample, SamplerState, SamplingConfig};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `sglrs generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    /// The prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed of the sampler (random when absent).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Model: a `.gguf` file or an HF folder (default: `$SGLRS_MODEL` or the bundled model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Kernel threads (default: available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Re-encode float weights at load (`q8_0`, `q4_1`); see `sglrs serve --help`.
    #[arg(long)]
    pub quantize: Option<Quantize>,
}

/// Entry point of `sglrs generate`: prints the continuation as it is produced, then the
/// prefill and decode speed on stderr.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let path = args
        .model
        .clone()
        .unwrap_or_else(sglrs_model::default_model_path);
    let opts = LoadOptions {
        quantize: args.quantize,
        ..LoadOptions::default()
    };
    let loaded =
        sglrs_model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
    let text = if args.chat {
        let tmpl = loaded
            .chat_template
            .as_ref()
            .context("the model has no chat template; drop --chat")?;
        let opts = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        tmpl.render(&[Message::new("user", args.prompt.clone())], &opts)?
    } else {
        args.prompt.clone()
    };
    let tok = &loaded.tokenizer;
    let prompt = tok.encode(&text, args.chat)?;
    anyhow::ensure!(!prompt.is_empty(), "the prompt has no tokens");
    let total = prompt.len() + args.max_tokens;
    let mut cfg = ExecConfig::default();
    if let Some(t) = args.threads {
        cfg.threads = t;
    }
    let pages_needed = total.div_ceil(cfg.page_size);
    cfg.kv = KvCapacity::Pages(pages_needed);
    let mut exec = CpuExecutor::new(&loaded.config, &loaded.weights, &cfg)?;
    anyhow::ensure!(
        total <= exec.max_context(),
        "prompt + max tokens exceed the context length {}",
        exec.max_context()
    );
    let pages: Vec<u32> = (0..pages_needed as u32).collect();
    let sampling = SamplingConfig {
        temperature: args.temperature,
        seed: args.seed,
        ..SamplingConfig::default()
    };
    let mut state = SamplerState::new(&sampling, &prompt, 0);

    let mut ids = prompt.clone();
    let mut out_ids: Vec<u32> = Vec::new();
    let mut printed = String::new();
    let stdout = std::io::stdout();
    let t0 = Instant::now();
    let mut prefill_s = 0.0;
    for step in 0..args.max_tokens {
        let (chunk, start) = if step == 0 {
            (&ids[..], 0)
        } else {
            (&ids[ids.len() - 1..], ids.len() - 1)
        };
        let batch = Batch {
            seqs: vec![SeqChunk {
                tokens: chunk,
                start_pos: start,
                pages: &pages,
                logits: LogitsWanted::Last,
            }],
        };
        let mut logits = exec.forward(&batch)?;
        if step == 0 {
            prefill_s = t0.elapsed().as_secs_f64();
        }
        let next = sample(&mut logits.data, &sampling, &mut state, None, None)?.token;
        state.observe(next);
        if tok.eog_ids().contains(&next) {
            break;
        }
        ids.push(next);
        out_ids.push(next);
        let text = tok.decode(&out_ids, true)?;
        // Print only complete characters that were not printed yet.
        if text.len() > printed.len() && text.starts_with(&printed) && !text.ends_with('\u{FFFD}') {
            let mut lock = stdout.lock();
            write!(lock, "{}", &text[printed.len()..])?;
            lock.flush()?;
            printed = text;
        }
    }
    println!();
    let total_s = t0.elapsed().as_secs_f64();
    let decoded = out_ids.len().saturating_sub(1);
    eprintln!(
        "prompt {} tokens in {:.3} s ({:.1} tok/s); generated {} tokens, decode {:.1} tok/s ({} threads, {:?} kernels)",
        prompt.len(),
        prefill_s,
        prompt.len() as f64 / prefill_s.max(1e-9),
        out_ids.len(),
        decoded as f64 / (total_s - prefill_s).max(1e-9),
        exec.threads(),
        exec.isa()
    );
    Ok(())
}
