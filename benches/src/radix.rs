//! `sglrs bench radix`: the radix cache on SGLang's prefix-cache workloads.
//!
//! Three seeded workloads (vocab 32,000), each run at page sizes 1 and 16:
//!
//! - **fewshot**: `requests` requests, each one of 8 shared 1,000-token prefixes plus a
//!   unique suffix, total length uniform in [1024, 4096]. Insert all; full-match all;
//!   `requests` partial lookups (the first half of a request plus 64 new tokens, never
//!   inserted); full-match all again; evict everything.
//! - **chat**: `conversations` conversations × 8 turns, a shared 100-token system prompt,
//!   150 tokens added per turn, turns interleaved turn-major; insert all, then match all.
//! - **lifecycle**: the fewshot stream through match → lock → allocate the rest → insert →
//!   unlock, in a pool of 2,000,000 tokens with LRU eviction; requests/s and hit rate.
//!
//! Matches are also reported as bytes/s of request tokens read and inserts as bytes/s of new
//! tokens stored, beside a memcpy bandwidth measured in the same run (the bound both
//! approach). SGLang's `radix_cache.py` figures on the same workloads and machine (from the
//! issue that set the goals) are printed for the ratio; they are constants, not re-measured.
//!
//! Every phase is timed by the wall clock (the `*_ops_s` keys) and, on Linux, also by the
//! thread's CPU time from `/proc/thread-self/schedstat` (the `*_cpu_*` keys): on a shared
//! machine the wall clock also counts the time other processes held the core.

use std::time::Instant;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sglrs_radix_cache::{CacheConfig, EvictionPolicy, Namespace, PageId, RadixCache, TokenId};

/// Vocabulary size of the generated token ids.
pub const VOCAB: u32 = 32_000;

/// Knobs of `sglrs bench radix` (`--json` is the CLI's).
#[derive(clap::Args, Debug, Clone)]
pub struct RadixArgs {
    /// Fewshot and lifecycle requests.
    #[arg(long, default_value_t = 10_000)]
    pub requests: usize,
    /// Chat conversations (8 turns each).
    #[arg(long, default_value_t = 500)]
    pub conversations: usize,
    /// Lifecycle pool size in tokens.
    #[arg(long, default_value_t = 2_000_000)]
    pub pool_tokens: usize,
    /// Seed of the generated workloads.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

impl Default for RadixArgs {
    fn default() -> Self {
        RadixArgs {
            requests: 10_000,
            conversations: 500,
            pool_tokens: 2_000_000,
            seed: 42,
        }
    }
}

/// SGLang's `radix_cache.py` on these workloads on the reference machine, per page size:
/// (insert, full match, partial match, full after partial, evict-all seconds, chat insert,
/// chat match, lifecycle req/s).
const SGLANG: [(usize, [f64; 8]); 2] = [
    (
        1,
        [
            11_400.0, 8_200.0, 1_500.0, 585.0, 0.23, 16_100.0, 16_900.0, 3_100.0,
        ],
    ),
    (
        16,
        [
            17_000.0, 6_500.0, 6_000.0, 4_300.0, 0.30, 12_900.0, 17_400.0, 2_900.0,
        ],
    ),
];

fn rand_tokens(rng: &mut StdRng, n: usize, out: &mut Vec<TokenId>) {
    out.extend((0..n).map(|_| rng.random_range(0..VOCAB)));
}

/// The fewshot stream: `n` requests over 8 shared 1,000-token prefixes, lengths uniform in
/// [1024, 4096].
pub fn fewshot_requests(seed: u64, n: usize) -> Vec<Vec<TokenId>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let prefixes: Vec<Vec<TokenId>> = (0..8)
        .map(|_| {
            let mut p = Vec::with_capacity(1000);
            rand_tokens(&mut rng, 1000, &mut p);
            p
        })
        .collect();
    (0..n)
        .map(|_| {
            let len = rng.random_range(1024..=4096);
            let mut r = Vec::with_capacity(len);
            r.extend_from_slice(&prefixes[rng.random_range(0..8)]);
            rand_tokens(&mut rng, len - 1000, &mut r);
            r
        })
        .collect()
}

/// Partial lookups: the first half of each request plus 64 tokens never inserted.
pub fn partial_lookups(seed: u64, requests: &[Vec<TokenId>]) -> Vec<Vec<TokenId>> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9a27);
    requests
        .iter()
        .map(|r| {
            let mut q = r[..r.len() / 2].to_vec();
            rand_tokens(&mut rng, 64, &mut q);
            q
        })
        .collect()
}

/// Chat keys in turn-major order: `conversations` × 8 turns, a shared 100-token system
/// prompt, 150 tokens added per turn.
pub fn chat_requests(seed: u64, conversations: usize) -> Vec<Vec<TokenId>> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc4a7);
    let mut system = Vec::new();
    rand_tokens(&mut rng, 100, &mut system);
    let convs: Vec<Vec<TokenId>> = (0..conversations)
        .map(|_| {
            let mut c = system.clone();
            rand_tokens(&mut rng, 150 * 8, &mut c);
            c
        })
        .collect();
    (1..=8)
        .flat_map(|turn| convs.iter().map(move |c| c[..100 + 150 * turn].to_vec()))
        .collect()
}

/// A cache big enough for every page of `keys` allocated separately, and those pages.
fn cache_with_pages(
    ps: usize,
    keys: &[Vec<TokenId>],
) -> anyhow::Result<(RadixCache, Vec<Vec<PageId>>)> {
    let total: usize = keys.iter().map(|k| k.len() / ps).sum();
    let mut cache = RadixCache::new(CacheConfig::new(total, ps))?;
    let mut pages = Vec::with_capacity(keys.len());
    for k in keys {
        let mut p = Vec::with_capacity(k.len() / ps);
        cache.alloc(k.len() / ps, &mut p)?;
        pages.push(p);
    }
    Ok((cache, pages))
}

/// This thread's CPU time in seconds (Linux), `None` where it cannot be read.
fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// Timed runs of one phase: the best wall-clock time, and the mean CPU time (the CPU clock
/// advances in scheduler ticks, so single short runs can read zero).
#[derive(Clone, Copy)]
struct Span {
    wall: f64,
    cpu_sum: f64,
    runs: u32,
}

impl Span {
    const NONE: Span = Span {
        wall: f64::INFINITY,
        cpu_sum: 0.0,
        runs: 0,
    };

    fn best(self, other: Span) -> Span {
        Span {
            wall: self.wall.min(other.wall),
            cpu_sum: self.cpu_sum + other.cpu_sum,
            runs: self.runs + other.runs,
        }
    }

    fn cpu(self) -> f64 {
        if self.runs == 0 || self.cpu_sum <= 0.0 {
            self.wall
        } else {
            self.cpu_sum / f64::from(self.runs)
        }
    }
}

/// Times `f`, returning its result and the span.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Span) {
    let cpu0 = thread_cpu_s();
    let t = Instant::now();
    let v = f();
    let wall = t.elapsed().as_secs_f64();
    let cpu = match (cpu0, thread_cpu_s()) {
        (Some(a), Some(b)) => (b - a).max(0.0),
        _ => wall,
    };
    (
        v,
        Span {
            wall,
            cpu_sum: cpu,
            runs: 1,
        },
    )
}

/// A phase's rates: `ops` operations moving `bytes` token bytes over the best span.
struct Rate {
    ops_s: f64,
    bytes_s: f64,
    cpu_ops_s: f64,
    cpu_bytes_s: f64,
}

impl Rate {
    fn of(ops: usize, bytes: usize, span: Span) -> Rate {
        Rate {
            ops_s: ops as f64 / span.wall,
            bytes_s: bytes as f64 / span.wall,
            cpu_ops_s: ops as f64 / span.cpu(),
            cpu_bytes_s: bytes as f64 / span.cpu(),
        }
    }
}

/// Inserts every key with its pages; returns the span and the tokens stored. The duplicates
/// each insert hands back stay with the caller (freeing them is the caller's next, separate
/// step, not part of the insert).
fn time_inserts(
    cache: &mut RadixCache,
    keys: &[Vec<TokenId>],
    pages: &[Vec<PageId>],
) -> anyhow::Result<(Span, usize)> {
    let mut back = Vec::with_capacity(4096);
    let (stored, span) = timed(|| -> anyhow::Result<usize> {
        let mut stored = 0;
        for (k, p) in keys.iter().zip(pages) {
            back.clear();
            stored += cache
                .insert(Namespace::DEFAULT, k, p, &mut back)?
                .stored_len;
        }
        Ok(stored)
    });
    Ok((span, stored?))
}

/// Best of `rounds` inserts of `keys`, each into a fresh tree; returns the rate and the last
/// tree (still full).
fn best_inserts(
    ps: usize,
    keys: &[Vec<TokenId>],
    rounds: usize,
) -> anyhow::Result<(Rate, RadixCache, Span)> {
    let mut best = Span::NONE;
    let mut evict = Span::NONE;
    let mut stored = 0;
    for round in 0..rounds {
        let (mut cache, pages) = cache_with_pages(ps, keys)?;
        let (span, s) = time_inserts(&mut cache, keys, &pages)?;
        drop(pages);
        best = best.best(span);
        stored = s;
        if round + 1 == rounds {
            return Ok((Rate::of(keys.len(), stored * 4, best), cache, evict));
        }
        evict = evict.best(time_evict_all(&mut cache)?);
    }
    anyhow::bail!("best_inserts needs at least one round (stored {stored})")
}

/// Passes of lookups over `keys`: at least five and at least 0.3 s; the best pass by the wall
/// clock, the mean pass by CPU time (the CPU clock advances in scheduler ticks, so it needs
/// the longer span).
fn time_matches(cache: &mut RadixCache, keys: &[Vec<TokenId>]) -> Rate {
    let mut out = Vec::with_capacity(4096);
    let bytes: usize = keys.iter().map(|k| k.len() * 4).sum();
    let mut best = Span::NONE;
    let (mut passes, mut wall) = (0, 0.0);
    while passes < 5 || wall < 0.3 {
        let (sink, span) = timed(|| {
            let mut sink = 0usize;
            for k in keys {
                out.clear();
                sink += cache.match_prefix(Namespace::DEFAULT, k, &mut out).len;
            }
            sink
        });
        std::hint::black_box(sink);
        best = best.best(span);
        passes += 1;
        wall += span.wall;
    }
    Rate::of(keys.len(), bytes, best)
}

/// memcpy bandwidth: best of five copies of a 256 MiB buffer, bytes copied per second
/// (wall clock, CPU time).
pub fn memcpy_bytes_s() -> (f64, f64) {
    let n = 256 << 20;
    let src = vec![7u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src); // fault the pages in
    let mut best = Span::NONE;
    for _ in 0..5 {
        let ((), span) = timed(|| {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        });
        best = best.best(span);
    }
    (n as f64 / best.wall, n as f64 / best.cpu())
}

/// Times evicting everything; checks that nothing is left.
fn time_evict_all(cache: &mut RadixCache) -> anyhow::Result<Span> {
    let pages = cache.stats().tokens / cache.page_size();
    let (freed, span) = timed(|| cache.evict(usize::MAX));
    anyhow::ensure!(
        freed == pages && cache.stats().tokens == 0,
        "evict left pages behind"
    );
    Ok(span)
}

/// The fewshot phases. Insert and evict-all run on three fresh trees (best of three: the
/// machine may be shared); the lookups run on the last tree, between its insert and its
/// evict, best of five passes each.
fn fewshot(
    ps: usize,
    requests: &[Vec<TokenId>],
    partial: &[Vec<TokenId>],
) -> anyhow::Result<Value> {
    let (ins, mut cache, evict) = best_inserts(ps, requests, 3)?;
    let tokens = cache.stats().tokens;
    let full = time_matches(&mut cache, requests);
    let nodes = cache.stats().nodes;
    let part = time_matches(&mut cache, partial);
    let after = time_matches(&mut cache, requests);
    anyhow::ensure!(cache.stats().nodes == nodes, "a lookup changed the tree");
    let evict = evict.best(time_evict_all(&mut cache)?);
    Ok(json!({
        "insert_ops_s": ins.ops_s,
        "match_full_ops_s": full.ops_s,
        "match_partial_ops_s": part.ops_s,
        "match_full_after_partial_ops_s": after.ops_s,
        "evict_all_s": evict.wall,
        "insert_bytes_s": ins.bytes_s,
        "match_full_bytes_s": full.bytes_s,
        "match_partial_bytes_s": part.bytes_s,
        "insert_cpu_ops_s": ins.cpu_ops_s,
        "match_full_cpu_ops_s": full.cpu_ops_s,
        "match_partial_cpu_ops_s": part.cpu_ops_s,
        "match_full_after_partial_cpu_ops_s": after.cpu_ops_s,
        "evict_all_cpu_s": evict.cpu(),
        "insert_cpu_bytes_s": ins.cpu_bytes_s,
        "match_full_cpu_bytes_s": full.cpu_bytes_s,
        "tokens_in_tree": tokens,
        "nodes": nodes,
    }))
}

fn chat(ps: usize, keys: &[Vec<TokenId>]) -> anyhow::Result<Value> {
    let (ins, mut cache, _) = best_inserts(ps, keys, 3)?;
    let m = time_matches(&mut cache, keys);
    Ok(json!({
        "insert_ops_s": ins.ops_s,
        "match_ops_s": m.ops_s,
        "insert_bytes_s": ins.bytes_s,
        "match_bytes_s": m.bytes_s,
        "insert_cpu_ops_s": ins.cpu_ops_s,
        "match_cpu_ops_s": m.cpu_ops_s,
    }))
}

/// Best of three lifecycle runs, each on a fresh cache.
fn lifecycle(ps: usize, pool_tokens: usize, requests: &[Vec<TokenId>]) -> anyhow::Result<Value> {
    let mut best = Span::NONE;
    let mut hit_rate = 0.0;
    for _ in 0..3 {
        let (hr, span) = lifecycle_once(ps, pool_tokens, requests)?;
        best = best.best(span);
        hit_rate = hr;
    }
    let n = requests.len() as f64;
    Ok(json!({ "req_s": n / best.wall, "hit_rate": hit_rate, "cpu_req_s": n / best.cpu() }))
}

/// One pass of match → lock → alloc → insert → free → unlock; returns the hit rate.
fn lifecycle_once(
    ps: usize,
    pool_tokens: usize,
    requests: &[Vec<TokenId>],
) -> anyhow::Result<(f64, Span)> {
    let cfg = CacheConfig::new(pool_tokens / ps, ps).with_policy(EvictionPolicy::Lru);
    let mut cache = RadixCache::new(cfg)?;
    let ns = Namespace::DEFAULT;
    let mut pages = Vec::with_capacity(4096);
    let mut back = Vec::new();
    let (counts, span) = timed(|| -> anyhow::Result<(usize, usize)> {
        let (mut hit, mut total) = (0usize, 0usize);
        for r in requests {
            pages.clear();
            back.clear();
            let m = cache.match_prefix(ns, r, &mut pages);
            let lock = cache.lock(m.position.node)?;
            cache
                .alloc(r.len().div_ceil(ps) - pages.len(), &mut pages)
                .context("lifecycle alloc")?;
            cache.insert(ns, r, &pages, &mut back)?;
            cache.free(&back)?;
            cache.unlock(lock)?;
            hit += m.len;
            total += r.len();
        }
        Ok((hit, total))
    });
    let (hit, total) = counts?;
    anyhow::ensure!(
        cache.stats().held_locks == 0 && cache.pool().caller_pages() == 0,
        "leak"
    );
    Ok((hit as f64 / total as f64, span))
}

/// One table row: ours by wall clock and by CPU time, SGLang's, and both ratios.
fn row(name: &str, v: &Value, key: &str, cpu_key: &str, sglang: f64, unit: &str) {
    let ours = v[key].as_f64().unwrap_or(f64::NAN);
    let cpu = v[cpu_key].as_f64().unwrap_or(f64::NAN);
    let lower_is_better = unit == "s";
    let ratio = |x: f64| {
        if lower_is_better {
            sglang / x
        } else {
            x / sglang
        }
    };
    let d = if lower_is_better { 4 } else { 0 };
    println!(
        "  {name:<27} {ours:>10.d$} {unit:<5} ({:>6.1}x)   cpu {cpu:>10.d$} ({:>6.1}x)   SGLang {sglang:>7.d$}",
        ratio(ours),
        ratio(cpu),
    );
}

/// Runs the workloads at page sizes 1 and 16, prints a table, returns the `--json` object.
pub fn run(args: &RadixArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.requests > 0 && args.conversations > 0,
        "need at least one request"
    );
    let (memcpy, memcpy_cpu) = memcpy_bytes_s();
    println!(
        "radix cache bench: {} fewshot requests, {} chat conversations x 8 turns, seed {}",
        args.requests, args.conversations, args.seed
    );
    println!(
        "memcpy: {:.2} GB/s wall, {:.2} GB/s cpu (256 MiB copy, best of 5); ratios are against SGLang",
        memcpy / 1e9,
        memcpy_cpu / 1e9
    );
    let requests = fewshot_requests(args.seed, args.requests);
    let partial = partial_lookups(args.seed, &requests);
    let chat_keys = chat_requests(args.seed, args.conversations);
    let mut out = serde_json::Map::new();
    for (ps, sg) in SGLANG {
        println!("page size {ps}:");
        let f = fewshot(ps, &requests, &partial)?;
        row(
            "fewshot insert",
            &f,
            "insert_ops_s",
            "insert_cpu_ops_s",
            sg[0],
            "ops/s",
        );
        row(
            "fewshot full match",
            &f,
            "match_full_ops_s",
            "match_full_cpu_ops_s",
            sg[1],
            "ops/s",
        );
        row(
            "fewshot partial match",
            &f,
            "match_partial_ops_s",
            "match_partial_cpu_ops_s",
            sg[2],
            "ops/s",
        );
        row(
            "fewshot full after partial",
            &f,
            "match_full_after_partial_ops_s",
            "match_full_after_partial_cpu_ops_s",
            sg[3],
            "ops/s",
        );
        row(
            "fewshot evict all",
            &f,
            "evict_all_s",
            "evict_all_cpu_s",
            sg[4],
            "s",
        );
        let get = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "  bytes/s: insert {:.2} GB/s, full match {:.2} GB/s, partial {:.2} GB/s (memcpy {:.2}); full match after/before partial {:.2}",
            get(&f, "insert_bytes_s") / 1e9,
            get(&f, "match_full_bytes_s") / 1e9,
            get(&f, "match_partial_bytes_s") / 1e9,
            memcpy / 1e9,
            get(&f, "match_full_after_partial_ops_s") / get(&f, "match_full_ops_s"),
        );
        println!(
            "  by cpu time: full match after/before partial {:.2}",
            get(&f, "match_full_after_partial_cpu_ops_s") / get(&f, "match_full_cpu_ops_s"),
        );
        let c = chat(ps, &chat_keys)?;
        row(
            "chat insert",
            &c,
            "insert_ops_s",
            "insert_cpu_ops_s",
            sg[5],
            "ops/s",
        );
        row(
            "chat match",
            &c,
            "match_ops_s",
            "match_cpu_ops_s",
            sg[6],
            "ops/s",
        );
        let l = lifecycle(ps, args.pool_tokens, &requests)?;
        row("lifecycle", &l, "req_s", "cpu_req_s", sg[7], "req/s");
        println!(
            "  lifecycle hit rate {:.3} (SGLang 0.39)",
            get(&l, "hit_rate")
        );
        out.insert(
            format!("page_size_{ps}"),
            json!({ "fewshot": f, "chat": c, "lifecycle": l }),
        );
    }
    out.insert("memcpy_bytes_s".into(), json!(memcpy));
    out.insert("memcpy_cpu_bytes_s".into(), json!(memcpy_cpu));
    Ok(Value::Object(out))
}
