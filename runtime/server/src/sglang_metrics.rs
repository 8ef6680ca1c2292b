//! The metrics under SGLang's names (`sglang:*`, labelled `model_name` and `engine_type`),
//! beside the `sglrs_*` ones, so that llm-d's inference scheduler and SGLang dashboards read
//! sglrs as they read SGLang: queue and running counts, KV token usage, hit rate, token
//! counters and the latency histograms.

use crate::metrics::Metrics;
use sglrs_scheduler::DriverStats;
use std::fmt::Write as _;

/// What the exposition needs beside the scheduler snapshot.
pub struct Context<'a> {
    /// The served model name (`model_name` label).
    pub model_name: &'a str,
    /// `unified`, `prefill` or `decode` (`engine_type` label).
    pub engine_type: &'a str,
    /// Tokens per KV page.
    pub page_size: usize,
}

/// Appends the `sglang:*` metrics to `out` (after [`Metrics::render`], whose output rate
/// they reuse).
pub fn render(out: &mut String, m: &Metrics, s: &DriverStats, cx: &Context<'_>) {
    let labels = format!(
        "model_name=\"{}\",engine_type=\"{}\"",
        escape(cx.model_name),
        cx.engine_type
    );
    let sample = |out: &mut String, kind: &str, name: &str, help: &str, v: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {v}"
        );
    };
    let ps = cx.page_size.max(1);
    let total_tokens = s.cache.total_pages * ps;
    // Held by running requests or locked in the tree: what eviction cannot give back.
    let free_tokens = s.cache.free_pages * ps + s.cache.evictable_tokens;
    let used_tokens = total_tokens.saturating_sub(free_tokens);
    let usage = if total_tokens == 0 {
        0.0
    } else {
        used_tokens as f64 / total_tokens as f64
    };
    let hit = if s.core.prompt_tokens == 0 {
        0.0
    } else {
        s.core.cached_tokens as f64 / s.core.prompt_tokens as f64
    };
    for (kind, name, help, v) in [
        (
            "gauge",
            "sglang:num_running_reqs",
            "The number of running requests.",
            s.running as f64,
        ),
        (
            "gauge",
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            s.waiting as f64,
        ),
        (
            "gauge",
            "sglang:num_used_tokens",
            "The number of used tokens.",
            used_tokens as f64,
        ),
        (
            "gauge",
            "sglang:max_total_num_tokens",
            "The KV pool's capacity in tokens.",
            total_tokens as f64,
        ),
        ("gauge", "sglang:token_usage", "The token usage.", usage),
        (
            "gauge",
            "sglang:cache_hit_rate",
            "The prefix cache hit rate.",
            hit,
        ),
        (
            "gauge",
            "sglang:gen_throughput",
            "The generation throughput (token/s).",
            m.last_gen_throughput(),
        ),
        (
            "counter",
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            s.core.prompt_tokens as f64,
        ),
        (
            "counter",
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            s.core.generated_tokens as f64,
        ),
        (
            "counter",
            "sglang:num_requests_total",
            "Number of requests processed.",
            s.core.finished_requests as f64,
        ),
    ] {
        sample(out, kind, name, help, v);
    }
    let device = s.core.cached_tokens.saturating_sub(
        s.core.cached_host_tokens + s.core.cached_disk_tokens + s.core.cached_remote_tokens,
    );
    let _ = writeln!(
        out,
        "# HELP sglang:cached_tokens_total Prompt tokens served from a cache, by source.\n\
         # TYPE sglang:cached_tokens_total counter"
    );
    for (source, v) in [
        ("device", device),
        ("host", s.core.cached_host_tokens),
        ("disk", s.core.cached_disk_tokens),
        ("remote", s.core.cached_remote_tokens),
    ] {
        let _ = writeln!(
            out,
            "sglang:cached_tokens_total{{{labels},cache_source=\"{source}\"}} {v}"
        );
    }
    m.ttft.render_labeled(
        out,
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &labels,
    );
    m.itl.render_labeled(
        out,
        "sglang:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &labels,
    );
    m.e2e.render_labeled(
        out,
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        &labels,
    );
}

/// A label value with `\`, `"` and newlines escaped (the text format's rule).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sglang_names_carry_the_labels_and_the_token_usage() {
        let m = Metrics::default();
        m.ttft.observe(0.2);
        let mut s = DriverStats {
            running: 2,
            waiting: 3,
            ..Default::default()
        };
        s.cache.total_pages = 10;
        s.cache.free_pages = 4;
        s.cache.evictable_tokens = 16;
        s.core.prompt_tokens = 100;
        s.core.cached_tokens = 25;
        s.core.cached_host_tokens = 5;
        let mut out = String::new();
        let cx = Context {
            model_name: "m\"x",
            engine_type: "decode",
            page_size: 16,
        };
        render(&mut out, &m, &s, &cx);
        let l = "model_name=\"m\\\"x\",engine_type=\"decode\"";
        for line in [
            format!("sglang:num_running_reqs{{{l}}} 2"),
            format!("sglang:num_queue_reqs{{{l}}} 3"),
            // 160 tokens, 64 free and 16 evictable: 80 used.
            format!("sglang:num_used_tokens{{{l}}} 80"),
            format!("sglang:token_usage{{{l}}} 0.5"),
            format!("sglang:cache_hit_rate{{{l}}} 0.25"),
            format!("sglang:cached_tokens_total{{{l},cache_source=\"device\"}} 20"),
            format!("sglang:cached_tokens_total{{{l},cache_source=\"host\"}} 5"),
            format!("sglang:time_to_first_token_seconds_count{{{l}}} 1"),
            format!("sglang:time_to_first_token_seconds_bucket{{{l},le=\"+Inf\"}} 1"),
        ] {
            assert!(out.lines().any(|x| x == line), "missing {line}\n{out}");
        }
    }
}
