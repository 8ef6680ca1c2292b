//! Small routes: health, model and server info, cache flush, abort, metrics, models.

use super::dispatch::{self, Job};
use super::error::{parse_json, ApiError};
use super::validate::{self, RawSamplingParams};
use super::AppState;
use crate::auth::Tenant;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;
use serde_json::{json, Value};
use sglrs_scheduler::FinishReason;
use std::sync::Arc;
use std::time::Instant;

/// `GET /health`: 200 while the scheduler thread runs, 503 once it has stopped (so that a
/// supervisor replaces the process instead of sending it work that cannot run).
pub async fn health(State(state): State<Arc<AppState>>) -> Result<&'static str, ApiError> {
    if state.sched.is_alive() {
        Ok("")
    } else {
        Err(ApiError::Unavailable("the scheduler has stopped".into()))
    }
}

/// `GET /get_load`: one entry per data-parallel rank (sglrs has one), in SGLang's shape.
/// sglang-router 0.3.2 reads `dp_rank` and `num_tokens` of each entry (its `power_of_two`
/// policy and its own `/get_loads`); an object instead of an array reads as load -1.
/// `num_tokens` is the KV tokens held by running requests (what eviction cannot give back;
/// SGLang adds the waiting prompts' tokens); `load` (running + waiting) stays for older clients.
pub async fn get_load(State(state): State<Arc<AppState>>) -> Json<Value> {
    let s = state.sched.stats();
    let ps = state.info.args["page_size"].as_u64().unwrap_or(1).max(1) as usize;
    let total = s.cache.total_pages * ps;
    let used = total.saturating_sub(s.cache.free_pages * ps + s.cache.evictable_tokens);
    Json(json!([{
        "dp_rank": 0,
        "load": s.running + s.waiting,
        "num_reqs": s.running + s.waiting,
        "num_waiting_reqs": s.waiting,
        "num_tokens": used,
    }]))
}

/// `GET /health_generate`: runs one token through the model.
pub async fn health_generate(
    State(state): State<Arc<AppState>>,
    tenant: Option<Extension<Tenant>>,
) -> Result<&'static str, ApiError> {
    let raw = RawSamplingParams {
        max_new_tokens: Some(1),
        temperature: Some(0.0),
        ..Default::default()
    };
    let input_ids = state.encode("Hello")?;
    let params = validate::check_params(&raw, input_ids.len(), state.limits(), "max_new_tokens")?;
    let job = Job {
        input_ids,
        params,
        logprobs: None,
        priority: i64::MAX,
        namespace: validate::namespace(None),
        bootstrap: None,
    };
    let running = dispatch::submit(&state, &tenant.unwrap_or_default().0, job).await?;
    let results = dispatch::collect_all(&state, vec![running], Instant::now()).await;
    match results
        .first()
        .and_then(|r| r.first())
        .and_then(|r| r.finish.clone())
    {
        Some(FinishReason::Abort(m)) => {
            Err(ApiError::Unavailable(format!("generation failed: {m}")))
        }
        Some(_) => Ok(""),
        None => Err(ApiError::Unavailable("generation did not finish".into())),
    }
}

/// `GET /model_info` and `/get_model_info`.
pub async fn model_info(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "model_path": state.info.model_path,
        "tokenizer_path": state.info.model_path,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "llama",
        "architectures": null,
    }))
}

/// `GET /get_server_info`: arguments, limits and live page accounting.
pub async fn server_info(State(state): State<Arc<AppState>>) -> Json<Value> {
    let s = state.sched.stats();
    let mut v = state.info.args.clone();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("model_path".into(), json!(state.info.model_path));
        obj.insert(
            "served_model_name".into(),
            json!(state.info.served_model_name),
        );
        obj.insert("context_length".into(), json!(state.info.max_context));
        obj.insert("vocab_size".into(), json!(state.info.vocab_size));
        obj.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
        obj.insert(
            "internal_states".into(),
            json!([{
                "num_running_reqs": s.running,
                "num_waiting_reqs": s.waiting,
                "queued_requests": state.sched.queued(),
                "rids_in_flight": state.rids.len(),
                "cache": s.cache,
                "prompt_tokens": s.core.prompt_tokens,
                "cached_tokens": s.core.cached_tokens,
                "generated_tokens": s.core.generated_tokens,
                "retractions": s.core.retractions,
                "priority_preemptions": s.core.preemptions,
                "urgent_passes": s.core.urgent_passes,
                "interrupted_passes": s.interrupted_passes,
                "scheduler_restarts": s.scheduler_restarts,
                "jump_forward_tokens": s.core.jump_forward_tokens,
                "spec_draft_tokens": s.core.spec_draft_tokens,
                "spec_accepted_tokens": s.core.spec_accepted_tokens,
                "forward_passes": s.steps,
                "forward_tokens": s.forward_tokens,
                "forward_seconds": s.forward_seconds,
                "grammar_compiles": state.grammars.compiles(),
                "cached_tokens_by_source": {
                    "device": s.core.cached_tokens
                    - s.core.cached_host_tokens
                    - s.core.cached_disk_tokens
                    - s.core.cached_remote_tokens,
                    "host": s.core.cached_host_tokens,
                    "disk": s.core.cached_disk_tokens,
                    "remote": s.core.cached_remote_tokens,
                },
                "hicache": s.tiers,
                "hicache_store": s.store.map(|st| json!({
                    "host_pages": st.ram_pages,
                    "host_bytes": st.ram_bytes,
                    "disk_pages": st.disk_pages,
                    "disk_bytes": st.disk_bytes,
                    "corrupted_pages": st.corrupted,
                    "failed_writes": st.write_failures,
                    "truncated_segments": st.truncated_segments,
                    "host_hits": st.ram_hits,
                    "disk_hits": st.disk_hits,
                    "disk_written_bytes": st.disk_written_bytes,
                })),
                "hicache_remote": state.remote.as_ref().map(|r| r.info_json()),
                "kv_events": state.kv_events.as_ref().map(|f| f()),
                "disaggregation": state.pd.as_ref().map(|pd| {
                    let mut d = pd.info_json();
                    d["scheduler"] = json!({
                        "exported_requests": s.disagg.exported_requests,
                        "imports_started": s.disagg.import_started,
                        "imported_requests": s.disagg.imported_requests,
                        "import_failures": s.disagg.import_failures,
                        "imported_pages": s.disagg.imported_pages,
                        "local_pages": s.disagg.local_pages,
                    });
                    d
                }),
            }]),
        );
    }
    Json(v)
}

/// `POST /clear_hicache_storage_backend`: deletes the disk tier's pages (a `/flush_cache`
/// keeps them, so that a restart still serves them).
pub async fn clear_hicache_storage(
    State(state): State<Arc<AppState>>,
) -> Result<impl IntoResponse, ApiError> {
    if state.sched.clear_storage().await? {
        Ok((
            axum::http::StatusCode::OK,
            "Hierarchical cache storage backend cleared.\n",
        ))
    } else {
        Ok((
            axum::http::StatusCode::BAD_REQUEST,
            "No hierarchical cache storage backend is configured.\n",
        ))
    }
}

/// `POST /flush_cache`: drops every cached page when idle.
pub async fn flush_cache(
    State(state): State<Arc<AppState>>,
) -> Result<impl IntoResponse, ApiError> {
    if state.sched.flush().await? {
        Ok((axum::http::StatusCode::OK, "Cache flushed.\n"))
    } else {
        Ok((
            axum::http::StatusCode::BAD_REQUEST,
            "Cache not flushed: requests are running or waiting.\n",
        ))
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AbortBody {
    rid: Option<String>,
    #[serde(default)]
    abort_all: bool,
}

/// `POST /abort_request` with `{"rid": ...}` or `{"abort_all": true}`.
pub async fn abort_request(
    State(state): State<Arc<AppState>>,
    tenant: Option<axum::Extension<crate::auth::Tenant>>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let b: AbortBody = parse_json(&body)?;
    let rid = if b.abort_all {
        None
    } else {
        Some(
            b.rid
                .ok_or_else(|| ApiError::bad("rid", "missing (or set abort_all)"))?,
        )
    };
    // A tenant aborts only its own requests (`abort_all` too).
    let tenant = tenant.map(|t| t.0.id()).unwrap_or_default();
    let n = state.rids.abort(&state.sched, tenant, rid.as_deref())?;
    Ok(Json(json!({"aborted": n})))
}

/// `GET /metrics` (Prometheus text).
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let stats = state.sched.stats();
    let mut text = state.metrics.render(&stats);
    if let Some(pd) = &state.pd {
        pd.stats().render(&mut text, pd.mode());
    }
    if let Some(r) = &state.remote {
        r.render(&mut text);
    }
    let engine_type = match state.pd.as_ref().map(|p| p.mode()) {
        Some(crate::pd::DisaggMode::Prefill) => "prefill",
        Some(crate::pd::DisaggMode::Decode) => "decode",
        _ => "unified",
    };
    let page_size = state.info.args["page_size"].as_u64().unwrap_or(1) as usize;
    crate::sglang_metrics::render(
        &mut text,
        &state.metrics,
        &stats,
        &crate::sglang_metrics::Context {
            model_name: &state.info.served_model_name,
            engine_type,
            page_size,
        },
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// `GET /v1/models`.
pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.info.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "sglrs",
            "root": state.info.served_model_name,
            "max_model_len": state.info.max_context,
        }]
    }))
}
