//! Server metrics in the Prometheus text format: queue lengths, running requests, cache hit
//! rate, throughput, and TTFT / inter-token / end-to-end latency histograms.

use sglrs_scheduler::DriverStats;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
    10.0, 20.0, 40.0,
];

/// Inter-token latency buckets: finer where decode steps are (milliseconds), so a p99 can
/// be read off them.
const ITL_BUCKETS: &[f64] = &[
    0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0,
];

/// A fixed-bucket histogram with lock-free updates.
#[derive(Debug)]
pub struct Histogram {
    buckets: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// An empty histogram over these bucket bounds (seconds).
    pub fn new(buckets: &'static [f64]) -> Self {
        Self {
            buckets,
            counts: buckets.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation in seconds.
    pub fn observe(&self, seconds: f64) {
        if let Some(i) = self.buckets.iter().position(|&b| seconds <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Appends the histogram in the Prometheus text format.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        self.render_labeled(out, name, help, "");
    }

    /// [`Histogram::render`] with `labels` (`k="v",…`, may be empty) on every sample.
    pub fn render_labeled(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        let braced = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let mut cum = 0;
        for (b, c) in self.buckets.iter().zip(&self.counts) {
            cum += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum{braced} {}",
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{braced} {count}");
    }
}

/// Everything `/metrics` reports that the server (not the scheduler) measures.
#[derive(Debug)]
pub struct Metrics {
    /// Time to first token.
    pub ttft: Histogram,
    /// Time between output deltas.
    pub itl: Histogram,
    /// Request latency.
    pub e2e: Histogram,
    /// Requests received.
    pub requests: AtomicU64,
    /// Requests rejected with 4xx.
    pub rejected: AtomicU64,
    last_scrape: Mutex<(Instant, u64)>,
    /// The output rate computed at the last scrape (f64 bits), for the SGLang-named copy.
    last_tps: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(LATENCY_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
            requests: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            last_scrape: Mutex::new((Instant::now(), 0)),
            last_tps: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition of these metrics and the scheduler snapshot.
    pub fn render(&self, s: &DriverStats) -> String {
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let counter = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        gauge(
            &mut out,
            "sglrs_num_running_reqs",
            "Sequences running.",
            s.running as f64,
        );
        gauge(
            &mut out,
            "sglrs_num_queue_reqs",
            "Sequences waiting.",
            s.waiting as f64,
        );
        let hit = if s.core.prompt_tokens == 0 {
            0.0
        } else {
            s.core.cached_tokens as f64 / s.core.prompt_tokens as f64
        };
        gauge(
            &mut out,
            "sglrs_cache_hit_rate",
            "Prompt tokens served from the prefix cache / prompt tokens.",
            hit,
        );
        let now = Instant::now();
        let gen = s.core.generated_tokens;
        let tps = match self.last_scrape.lock() {
            Ok(mut last) => {
                let dt = now.duration_since(last.0).as_secs_f64();
                let v = if dt > 0.0 {
                    gen.saturating_sub(last.1) as f64 / dt
                } else {
                    0.0
                };
                *last = (now, gen);
                v
            }
            Err(_) => 0.0,
        };
        self.last_tps.store(tps.to_bits(), Ordering::Relaxed);
        gauge(
            &mut out,
            "sglrs_gen_throughput",
            "Output tokens per second since the previous scrape.",
            tps,
        );
        gauge(
            &mut out,
            "sglrs_kv_total_pages",
            "Pages in the KV pool.",
            s.cache.total_pages as f64,
        );
        gauge(
            &mut out,
            "sglrs_kv_free_pages",
            "Pages on the free list.",
            s.cache.free_pages as f64,
        );
        gauge(
            &mut out,
            "sglrs_kv_tree_pages",
            "Pages owned by the radix cache.",
            s.cache.tree_pages as f64,
        );
        gauge(
            &mut out,
            "sglrs_kv_running_pages",
            "Pages held by running sequences.",
            s.cache.running_pages as f64,
        );
        counter(
            &mut out,
            "sglrs_prompt_tokens_total",
            "Prompt tokens admitted.",
            s.core.prompt_tokens as f64,
        );
        counter(
            &mut out,
            "sglrs_cached_tokens_total",
            "Prompt tokens served from the cache.",
            s.core.cached_tokens as f64,
        );
        let by_source = [
            (
                "device",
                s.core.cached_tokens
                    - s.core.cached_host_tokens
                    - s.core.cached_disk_tokens
                    - s.core.cached_remote_tokens,
            ),
            ("host", s.core.cached_host_tokens),
            ("disk", s.core.cached_disk_tokens),
            ("remote", s.core.cached_remote_tokens),
        ];
        let _ = writeln!(
            out,
            "# HELP sglrs_cached_tokens_by_source_total Prompt tokens served from each cache tier.\n# TYPE sglrs_cached_tokens_by_source_total counter"
        );
        for (src, v) in by_source {
            let _ = writeln!(
                out,
                "sglrs_cached_tokens_by_source_total{{source=\"{src}\"}} {v}"
            );
        }
        if let Some(st) = &s.store {
            gauge(
                &mut out,
                "sglrs_hicache_host_pages",
                "Pages in the host tier.",
                st.ram_pages as f64,
            );
            gauge(
                &mut out,
                "sglrs_hicache_host_bytes",
                "Bytes of pages in the host tier.",
                st.ram_bytes as f64,
            );
            gauge(
                &mut out,
                "sglrs_hicache_disk_pages",
                "Pages in the disk tier.",
                st.disk_pages as f64,
            );
            gauge(
                &mut out,
                "sglrs_hicache_disk_bytes",
                "Bytes of disk tier segment files.",
                st.disk_bytes as f64,
            );
            counter(
                &mut out,
                "sglrs_hicache_corrupted_pages_total",
                "Lower-tier pages that failed their checksum (served as misses).",
                st.corrupted as f64,
            );
            counter(
                &mut out,
                "sglrs_hicache_failed_writes_total",
                "Page writes to the disk tier that failed.",
                st.write_failures as f64,
            );
        }
        if let Some(t) = &s.tiers {
            counter(
                &mut out,
                "sglrs_hicache_loaded_bytes_total",
                "Bytes loaded from lower tiers into the device pool.",
                t.loaded_bytes as f64,
            );
            counter(
                &mut out,
                "sglrs_hicache_written_bytes_total",
                "Bytes copied from the device pool into lower tiers.",
                t.written_bytes as f64,
            );
            let name = "sglrs_hicache_load_seconds";
            let _ = writeln!(out, "# HELP {name} Time to load a request's pages from lower tiers.\n# TYPE {name} histogram");
            let mut cum = 0u64;
            for (i, b) in sglrs_scheduler::hicache::LOAD_BUCKETS.iter().enumerate() {
                cum += t.load_seconds_counts.get(i).copied().unwrap_or(0);
                let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
            }
            cum += t.load_seconds_counts.last().copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"+Inf\"}} {cum}\n{name}_sum {}\n{name}_count {cum}",
                t.load_seconds_sum
            );
        }
        counter(
            &mut out,
            "sglrs_generation_tokens_total",
            "Output tokens produced.",
            gen as f64,
        );
        counter(
            &mut out,
            "sglrs_jump_forward_tokens_total",
            "Output tokens forced by jump-forward.",
            s.core.jump_forward_tokens as f64,
        );
        counter(
            &mut out,
            "sglrs_spec_draft_tokens_total",
            "Tokens drafted by n-gram lookup and verified in a forward pass.",
            s.core.spec_draft_tokens as f64,
        );
        counter(
            &mut out,
            "sglrs_spec_accepted_tokens_total",
            "Drafted tokens the model chose (each one a decode step saved).",
            s.core.spec_accepted_tokens as f64,
        );
        counter(
            &mut out,
            "sglrs_retractions_total",
            "Sequences retracted (under memory pressure, or preempted for priority).",
            s.core.retractions as f64,
        );
        counter(
            &mut out,
            "sglrs_priority_preemptions_total",
            "Running sequences retracted for a waiting one of higher priority.",
            s.core.preemptions as f64,
        );
        counter(
            &mut out,
            "sglrs_interrupted_passes_total",
            "Forward passes stopped between layers for a request of much higher priority.",
            s.interrupted_passes as f64,
        );
        counter(
            &mut out,
            "sglrs_scheduler_restarts_total",
            "Recoveries of the scheduler from a panic outside one request's work.",
            s.scheduler_restarts as f64,
        );
        counter(
            &mut out,
            "sglrs_forward_passes_total",
            "Forward passes run.",
            s.steps as f64,
        );
        counter(
            &mut out,
            "sglrs_requests_total",
            "Requests received.",
            self.requests.load(Ordering::Relaxed) as f64,
        );
        counter(
            &mut out,
            "sglrs_rejected_requests_total",
            "Requests rejected as invalid.",
            self.rejected.load(Ordering::Relaxed) as f64,
        );
        self.ttft.render(
            &mut out,
            "sglrs_time_to_first_token_seconds",
            "Time to first token.",
        );
        self.itl.render(
            &mut out,
            "sglrs_inter_token_latency_seconds",
            "Time between output deltas.",
        );
        self.e2e.render(
            &mut out,
            "sglrs_e2e_request_latency_seconds",
            "Request latency.",
        );
        out
    }
}

impl Metrics {
    /// The output rate the last [`Metrics::render`] computed, tokens per second.
    pub fn last_gen_throughput(&self) -> f64 {
        f64::from_bits(self.last_tps.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.ttft.observe(0.02);
        m.ttft.observe(3.0);
        let text = m.render(&DriverStats::default());
        assert!(text.contains("sglrs_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"));
        assert!(text.contains("sglrs_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("sglrs_num_queue_reqs 0"));
    }
}
