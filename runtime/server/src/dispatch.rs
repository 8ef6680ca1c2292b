//! What every route shares: grammar compilation off the async threads, submission to the
//! scheduler, and collecting a request's events into results.

use super::auth::Tenant;
use super::error::ApiError;
use super::validate::{GrammarSpec, ValidParams};
use super::AppState;
use sglrs_grammar::{CompileOptions, CompiledGrammar, TokenVocab};
use sglrs_radix_cache::Namespace;
use sglrs_scheduler::{
    AbortReason, FinishReason, LogprobConfig, RequestId, SchedEvent, SchedRequest, TokenLogprob,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most compiled grammars kept.
const GRAMMAR_CACHE_ENTRIES: usize = 256;

/// How long a grammar that failed to compile is answered from memory: a client retrying
/// the same bad (or deadline-exceeding) grammar costs no second compile.
const FAILURE_TTL: Duration = Duration::from_secs(60);

/// Most failed grammars remembered.
const FAILURE_ENTRIES: usize = 256;

/// Compiles grammars on the blocking pool (never on the scheduler or async threads) and
/// keeps the compiled ones by spec, and the failed ones for [`FAILURE_TTL`].
pub struct GrammarCompiler {
    vocab: Arc<TokenVocab>,
    opts: CompileOptions,
    cache: Mutex<HashMap<GrammarSpec, Arc<CompiledGrammar>>>,
    failures: Mutex<HashMap<GrammarSpec, (ApiError, Instant)>>,
    compiles: AtomicU64,
    /// Compiles running on the blocking pool now, and the most allowed at once.
    running: Arc<AtomicUsize>,
    max_running: usize,
}

/// Gives back a compile's place when the compile ends (it runs on in the blocking pool even
/// if its request is gone, so the place follows the compile, not the request).
struct CompileSlot(Arc<AtomicUsize>);

impl Drop for CompileSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl GrammarCompiler {
    /// A compiler for this vocabulary running at most `max_running` compiles at once; more
    /// are refused with 503 and `Retry-After` (a compile holds a blocking-pool thread for up to
    /// its deadline).
    pub fn new(vocab: Arc<TokenVocab>, max_running: usize) -> Self {
        Self {
            vocab,
            // Only declared properties, in schema order: stricter than the schema, never
            // looser. A small model finishes an object instead of inventing keys; keys come
            // in the order the client listed them (a `reasoning` key stays before `answer`,
            // as OpenAI's structured outputs keep it); jump-forward writes required keys.
            opts: CompileOptions {
                allow_undeclared_properties: false,
                any_property_order: false,
                ..CompileOptions::default()
            },
            cache: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            compiles: AtomicU64::new(0),
            running: Arc::new(AtomicUsize::new(0)),
            max_running: max_running.max(1),
        }
    }

    /// Compiles run so far (successful or not); a remembered answer runs none.
    pub fn compiles(&self) -> u64 {
        self.compiles.load(Ordering::Relaxed)
    }

    /// The compiled grammar for `spec`; a spec that does not compile is a 400 naming it.
    pub async fn get(
        self: &Arc<Self>,
        spec: &GrammarSpec,
    ) -> Result<Arc<CompiledGrammar>, ApiError> {
        if let Some(g) = self.cache.lock().ok().and_then(|c| c.get(spec).cloned()) {
            return Ok(g);
        }
        if let Some(e) = self.remembered_failure(spec) {
            return Err(e);
        }
        let limit = self.max_running;
        if self
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r < limit).then_some(r + 1)
            })
            .is_err()
        {
            return Err(ApiError::Overloaded {
                message: format!(
                    "{limit} grammar compiles are running (--max-concurrent-grammar-compiles); \
                     retry later"
                ),
                retry_after_s: crate::error::RETRY_AFTER_S,
            });
        }
        let slot = CompileSlot(self.running.clone());
        let this = self.clone();
        let s = spec.clone();
        self.compiles.fetch_add(1, Ordering::Relaxed);
        let compiled = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            this.compile(&s)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("grammar compilation panicked: {e}")))?;
        let compiled = match compiled {
            Ok(g) => g,
            Err(e) => {
                self.remember_failure(spec, &e);
                return Err(e);
            }
        };
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= GRAMMAR_CACHE_ENTRIES {
                c.clear();
            }
            c.insert(spec.clone(), compiled.clone());
        }
        Ok(compiled)
    }

    fn remembered_failure(&self, spec: &GrammarSpec) -> Option<ApiError> {
        let mut f = self.failures.lock().ok()?;
        match f.get(spec) {
            Some((e, at)) if at.elapsed() < FAILURE_TTL => Some(e.clone()),
            Some(_) => {
                f.remove(spec);
                None
            }
            None => None,
        }
    }

    fn remember_failure(&self, spec: &GrammarSpec, e: &ApiError) {
        let Ok(mut f) = self.failures.lock() else {
            return;
        };
        if f.len() >= FAILURE_ENTRIES {
            f.retain(|_, (_, at)| at.elapsed() < FAILURE_TTL);
            if f.len() >= FAILURE_ENTRIES {
                f.clear();
            }
        }
        f.insert(spec.clone(), (e.clone(), Instant::now()));
    }

    fn compile(&self, spec: &GrammarSpec) -> Result<Arc<CompiledGrammar>, ApiError> {
        let (param, g) = match spec {
            GrammarSpec::Regex(r) => ("regex", sglrs_grammar::GrammarSpec::Regex(r.clone())),
            GrammarSpec::JsonSchema(s) => (
                "json_schema",
                sglrs_grammar::GrammarSpec::JsonSchema(s.clone()),
            ),
            GrammarSpec::JsonObject => (
                "response_format",
                sglrs_grammar::GrammarSpec::JsonSchema(r#"{"type":"object"}"#.to_string()),
            ),
            GrammarSpec::Ebnf(e) => ("ebnf", sglrs_grammar::GrammarSpec::Ebnf(e.clone())),
            GrammarSpec::Tagged(t) => ("tools", sglrs_grammar::GrammarSpec::Tagged(t.clone())),
        };
        CompiledGrammar::compile(&g, self.vocab.clone(), &self.opts)
            .map_err(|e| ApiError::bad(param, e.to_string()))
    }
}

/// One prompt ready to submit.
#[derive(Clone, Debug)]
pub struct Job {
    /// Prompt tokens.
    pub input_ids: Vec<u32>,
    /// Checked parameters.
    pub params: ValidParams,
    /// Logprobs wanted.
    pub logprobs: Option<LogprobConfig>,
    /// Priority.
    pub priority: i64,
    /// Cache namespace.
    pub namespace: Namespace,
    /// Prefill/decode disaggregation: where the KV goes to or comes from (`None`: the
    /// request runs whole here).
    pub bootstrap: Option<crate::pd::Bootstrap>,
}

/// A submitted job: its id and event stream.
pub struct Running {
    /// Scheduler id.
    pub id: RequestId,
    /// Events until every sample finished.
    pub rx: mpsc::UnboundedReceiver<SchedEvent>,
    /// Samples.
    pub n: usize,
    /// Prompt tokens (reported from the first streamed chunk on, as SGLang does).
    pub prompt_tokens: usize,
}

impl Running {
    /// One empty result per sample, with the prompt's token count already known.
    pub fn results(&self) -> Vec<SampleResult> {
        let fresh = SampleResult {
            prompt_tokens: self.prompt_tokens,
            ..SampleResult::default()
        };
        vec![fresh; self.n]
    }
}

/// Compiles the job's grammar (if any) and submits it.
pub async fn submit(state: &AppState, tenant: &Tenant, job: Job) -> Result<Running, ApiError> {
    let mut all = submit_all(state, tenant, vec![job]).await?;
    all.pop()
        .ok_or_else(|| ApiError::Internal("no request was submitted".into()))
}

/// Compiles every job's grammar, then submits them all in one scheduler message: all or
/// nothing, so a full queue refuses a batch whole instead of running part of it. The jobs
/// run as `tenant`'s: in its cache namespaces ([`Tenant::namespace`]) and its queue share.
pub async fn submit_all(
    state: &AppState,
    tenant: &Tenant,
    jobs: Vec<Job>,
) -> Result<Vec<Running>, ApiError> {
    let mut reqs = Vec::with_capacity(jobs.len());
    let mut rooms = Vec::with_capacity(jobs.len());
    for job in jobs {
        let grammar = match &job.params.grammar {
            Some(spec) => Some(state.grammars.get(spec).await?),
            None => None,
        };
        if let Some(g) = &grammar {
            super::validate::check_budget(&job.params, g.min_output_tokens())?;
        }
        if job.bootstrap.is_some() && job.params.stop.max_new_tokens == 0 {
            return Err(ApiError::bad(
                "max_new_tokens",
                "0 cannot be disaggregated (the decode server continues from the prefill's \
                 first token): send a prefill-only request without bootstrap fields",
            ));
        }
        let id = state.next_id();
        let disagg = match (&job.bootstrap, &state.pd) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(ApiError::bad(
                    "bootstrap_room",
                    "this server is not in disaggregation mode",
                ))
            }
            (Some(b), Some(pd)) => match pd.mode() {
                crate::pd::DisaggMode::Prefill => Some(sglrs_scheduler::Disagg::Export),
                crate::pd::DisaggMode::Decode => {
                    pd.expect(id, b);
                    Some(sglrs_scheduler::Disagg::Import)
                }
                crate::pd::DisaggMode::Null => None,
            },
        };
        rooms.push(match (&job.bootstrap, disagg) {
            (Some(b), Some(sglrs_scheduler::Disagg::Export)) => Some(Ok(b.room)),
            (Some(_), Some(sglrs_scheduler::Disagg::Import)) => Some(Err(id)),
            _ => None,
        });
        reqs.push(SchedRequest {
            id,
            input_ids: job.input_ids,
            namespace: tenant.namespace(job.namespace),
            sampling: job.params.sampling,
            stop: job.params.stop,
            n: job.params.n,
            grammar,
            logprobs: job.logprobs,
            priority: job.priority,
            tenant: tenant.id(),
            disagg,
        });
    }
    let forget = |ids: &[RequestId]| {
        if let Some(pd) = &state.pd {
            for &id in ids {
                pd.forget(id);
            }
        }
    };
    let heads: Vec<(RequestId, usize, usize)> = reqs
        .iter()
        .map(|r| (r.id, r.n, r.input_ids.len()))
        .collect();
    let ids: Vec<RequestId> = reqs.iter().map(|r| r.id).collect();
    let rxs = if reqs.len() == 1 {
        let req = reqs.pop().expect("one request");
        state.sched.submit(req).map(|rx| vec![rx])
    } else {
        state.sched.submit_group(reqs)
    };
    let rxs = match rxs {
        Ok(r) => r,
        Err(e) => {
            forget(&ids);
            return Err(e.into());
        }
    };
    Ok(heads
        .into_iter()
        .zip(rxs)
        .zip(rooms)
        .map(|(((id, n, prompt_tokens), rx), room)| {
            let rx = match (room, &state.pd) {
                (Some(Ok(room)), Some(pd)) => pd.export(room, rx),
                (Some(Err(id)), Some(pd)) => pd.track_import(id, rx),
                _ => rx,
            };
            Running {
                id,
                rx,
                n,
                prompt_tokens,
            }
        })
        .collect())
}

/// A request that lost its place in the full waiting queue to one of higher priority (or
/// found none to take) is refused as a full queue is at submit: 503 with `Retry-After`.
pub fn refused_in_queue(all: &[Vec<SampleResult>]) -> Result<(), ApiError> {
    for r in all.iter().flatten() {
        if let Some(FinishReason::Abort(AbortReason::Overloaded(m))) = &r.finish {
            return Err(ApiError::Overloaded {
                message: m.clone(),
                retry_after_s: super::error::RETRY_AFTER_S,
            });
        }
    }
    Ok(())
}

/// Everything one sample produced.
#[derive(Clone, Debug, Default)]
pub struct SampleResult {
    /// Output token ids.
    pub tokens: Vec<u32>,
    /// Output text.
    pub text: String,
    /// Logprobs of the output tokens (when asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// Logprobs of the prompt (when asked for).
    pub input_logprobs: Vec<TokenLogprob>,
    /// Why it ended (`None` while running).
    pub finish: Option<FinishReason>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Output tokens.
    pub completion_tokens: usize,
    /// Prompt tokens from the cache.
    pub cached_tokens: usize,
    /// Of those, per tier.
    pub cached: sglrs_scheduler::CachedTokens,
}

/// Latency bookkeeping of one request (TTFT and inter-token metrics).
pub struct Timing {
    start: Instant,
    last: Option<Instant>,
}

impl Timing {
    /// Starts the clock.
    pub fn new(start: Instant) -> Self {
        Self { start, last: None }
    }

    /// Records a delta carrying tokens.
    pub fn on_tokens(&mut self, state: &AppState) {
        let now = Instant::now();
        match self.last {
            None => state
                .metrics
                .ttft
                .observe(now.duration_since(self.start).as_secs_f64()),
            Some(l) => state
                .metrics
                .itl
                .observe(now.duration_since(l).as_secs_f64()),
        }
        self.last = Some(now);
    }

    /// Seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

/// Applies one event to the per-sample results; returns the index it touched.
pub fn apply(results: &mut [SampleResult], ev: SchedEvent) -> Option<usize> {
    match ev {
        SchedEvent::Delta {
            sample,
            tokens,
            text,
            logprobs,
            ..
        } => {
            let r = results.get_mut(sample)?;
            r.tokens.extend(tokens);
            r.text.push_str(&text);
            r.logprobs.extend(logprobs);
            // Streamed answers report the count so far; `Finished` sets the final one.
            r.completion_tokens = r.tokens.len();
            Some(sample)
        }
        SchedEvent::InputLogprobs {
            sample, logprobs, ..
        } => {
            results.get_mut(sample)?.input_logprobs = logprobs;
            Some(sample)
        }
        SchedEvent::Finished {
            sample,
            reason,
            prompt_tokens,
            completion_tokens,
            cached,
            ..
        } => {
            let r = results.get_mut(sample)?;
            r.finish = Some(reason);
            r.prompt_tokens = prompt_tokens;
            r.completion_tokens = completion_tokens;
            r.cached_tokens = cached.total();
            r.cached = cached;
            Some(sample)
        }
        // Taken by the prefill host's transfer task before the routes see the events.
        SchedEvent::KvExport { .. } => None,
    }
}

/// Waits for every sample of every running job; results in job order, then sample order.
pub async fn collect_all(
    state: &AppState,
    jobs: Vec<Running>,
    start: Instant,
) -> Vec<Vec<SampleResult>> {
    let mut out = Vec::with_capacity(jobs.len());
    // Jobs run concurrently in the scheduler; reading them one after another only orders
    // the reading.
    for mut job in jobs {
        let mut results = job.results();
        let mut timing = Timing::new(start);
        while results.iter().any(|r| r.finish.is_none()) {
            let Some(ev) = job.rx.recv().await else {
                for r in results.iter_mut().filter(|r| r.finish.is_none()) {
                    r.finish = Some(FinishReason::Abort(AbortReason::Shutdown));
                }
                break;
            };
            if matches!(&ev, SchedEvent::Delta { tokens, .. } if !tokens.is_empty()) {
                timing.on_tokens(state);
            }
            apply(&mut results, ev);
        }
        state.metrics.e2e.observe(timing.elapsed());
        out.push(results);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiler(limit: usize) -> Arc<GrammarCompiler> {
        let toks = ["a", "b", "ab", "</s>"]
            .iter()
            .map(|t| t.as_bytes().to_vec())
            .collect();
        let vocab = TokenVocab::new(toks, &[], &[3]).unwrap();
        Arc::new(GrammarCompiler::new(Arc::new(vocab), limit))
    }

    #[test]
    fn compiles_beyond_the_limit_are_refused_with_retry_after_and_places_come_back() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let c = compiler(1);
        // One compile running (its place taken), as a slow grammar would hold it.
        c.running.fetch_add(1, Ordering::AcqRel);
        let busy = rt.block_on(c.get(&GrammarSpec::Regex("a+".into())));
        match busy {
            Err(ApiError::Overloaded { retry_after_s, .. }) => assert!(retry_after_s > 0),
            Err(e) => panic!("expected a 503, got {e}"),
            Ok(_) => panic!("expected a 503, got a grammar"),
        }
        assert_eq!(c.compiles(), 0, "a refused compile does not run");
        c.running.fetch_sub(1, Ordering::AcqRel);
        assert!(rt.block_on(c.get(&GrammarSpec::Regex("a+".into()))).is_ok());
        assert_eq!(c.running.load(Ordering::Acquire), 0, "the place came back");
        // A cached grammar needs no place.
        c.running.fetch_add(1, Ordering::AcqRel);
        assert!(rt.block_on(c.get(&GrammarSpec::Regex("a+".into()))).is_ok());
    }

    /// The server generates declared properties only, in schema order (the engine's
    /// default takes undeclared ones and any order): the first key is forced and the
    /// other order is refused.
    #[test]
    fn schemas_compile_to_declared_properties_in_schema_order() {
        let toks = (0u8..=255).map(|b| vec![b]).chain([b"</s>".to_vec()]);
        let vocab = TokenVocab::new(toks.collect(), &[], &[256]).unwrap();
        let c = Arc::new(GrammarCompiler::new(Arc::new(vocab), 1));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let schema = r#"{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"integer"}},"required":["b","a"]}"#;
        let g = rt
            .block_on(c.get(&GrammarSpec::JsonSchema(schema.into())))
            .unwrap();
        let m = sglrs_grammar::Matcher::new(g.clone());
        assert_eq!(m.forced_bytes(), br#"{"b":"#.to_vec());
        for (text, ok) in [
            (r#"{"b":1,"a":2}"#, true),
            (r#"{"a":2,"b":1}"#, false),
            (r#"{"b":1,"a":2,"c":3}"#, false),
        ] {
            let mut m = sglrs_grammar::Matcher::new(g.clone());
            assert_eq!(
                m.try_advance_bytes(text.as_bytes()) && m.is_accepting(),
                ok,
                "{text}"
            );
        }
    }
}
