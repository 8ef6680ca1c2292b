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

struct Rate {
    ops_s: f64,
    bytes_s: f64,
}

/// Inserts every key with its pages. The duplicates each insert hands back stay with the
/// caller (freeing them is the caller's next, separate step, not part of the insert).
fn time_inserts(
    cache: &mut RadixCache,
    keys: &[Vec<TokenId>],
    pages: &[Vec<PageId>],
) -> anyhow::Result<Rate> {
    let mut back = Vec::with_capacity(4096);
    let mut stored = 0usize;
    let t = Instant::now();
    for (k, p) in keys.iter().zip(pages) {
        back.clear();
        stored += cache
            .insert(Namespace::DEFAULT, k, p, &mut back)?
            .stored_len;
    }
    let s = t.elapsed().as_secs_f64();
    Ok(Rate {
        ops_s: keys.len() as f64 / s,
        bytes_s: (stored * 4) as f64 / s,
    })
}

/// Best of five passes of lookups over `keys`.
fn time_matches(cache: &mut RadixCache, keys: &[Vec<TokenId>]) -> Rate {
    let mut out = Vec::with_capacity(4096);
    let bytes: usize = keys.iter().map(|k| k.len() * 4).sum();
    let mut best = f64::INFINITY;
    let mut sink = 0usize;
    for _ in 0..5 {
        let t = Instant::now();
        for k in keys {
            out.clear();
            sink += cache.match_prefix(Namespace::DEFAULT, k, &mut out).len;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    Rate {
        ops_s: keys.len() as f64 / best,
        bytes_s: bytes as f64 / best,
    }
}

/// memcpy bandwidth: best of five copies of a 256 MiB buffer, bytes copied per second.
pub fn memcpy_bytes_s() -> f64 {
    let n = 256 << 20;
    let src = vec![7u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src); // fault the pages in
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    n as f64 / best
}

/// Times evicting everything; checks that nothing is left.
fn time_evict_all(cache: &mut RadixCache) -> anyhow::Result<f64> {
    let pages = cache.stats().tokens / cache.page_size();
    let t = Instant::now();
    let freed = cache.evict(usize::MAX);
    let s = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        freed == pages && cache.stats().tokens == 0,
        "evict left pages behind"
    );
    Ok(s)
}

/// The fewshot phases. Insert and evict-all run on three fresh trees (best of three: the
/// machine may be shared); the lookups run on the last tree, between its insert and its
/// evict, best of five passes each.
fn fewshot(
    ps: usize,
    requests: &[Vec<TokenId>],
    partial: &[Vec<TokenId>],
) -> anyhow::Result<Value> {
    let (mut ins, mut evict_s) = (
        Rate {
            ops_s: 0.0,
            bytes_s: 0.0,
        },
        f64::INFINITY,
    );
    for _ in 0..2 {
        let (mut cache, pages) = cache_with_pages(ps, requests)?;
        let r = time_inserts(&mut cache, requests, &pages)?;
        drop(pages);
        if r.ops_s > ins.ops_s {
            ins = r;
        }
        evict_s = evict_s.min(time_evict_all(&mut cache)?);
    }
    let (mut cache, pages) = cache_with_pages(ps, requests)?;
    let r = time_inserts(&mut cache, requests, &pages)?;
    drop(pages);
    if r.ops_s > ins.ops_s {
        ins = r;
    }
    let tokens = cache.stats().tokens;
    let full = time_matches(&mut cache, requests);
    let nodes = cache.stats().nodes;
    let part = time_matches(&mut cache, partial);
    let after = time_matches(&mut cache, requests);
    anyhow::ensure!(cache.stats().nodes == nodes, "a lookup changed the tree");
    evict_s = evict_s.min(time_evict_all(&mut cache)?);
    Ok(json!({
        "insert_ops_s": ins.ops_s,
        "match_full_ops_s": full.ops_s,
        "match_partial_ops_s": part.ops_s,
        "match_full_after_partial_ops_s": after.ops_s,
        "evict_all_s": evict_s,
        "insert_bytes_s": ins.bytes_s,
        "match_full_bytes_s": full.bytes_s,
        "match_partial_bytes_s": part.bytes_s,
        "tokens_in_tree": tokens,
        "nodes": nodes,
    }))
}

fn chat(ps: usize, keys: &[Vec<TokenId>]) -> anyhow::Result<Value> {
    let mut ins = Rate {
        ops_s: 0.0,
        bytes_s: 0.0,
    };
    for _ in 0..2 {
        let (mut cache, pages) = cache_with_pages(ps, keys)?;
        let r = time_inserts(&mut cache, keys, &pages)?;
        if r.ops_s > ins.ops_s {
            ins = r;
        }
    }
    let (mut cache, pages) = cache_with_pages(ps, keys)?;
    let r = time_inserts(&mut cache, keys, &pages)?;
    if r.ops_s > ins.ops_s {
        ins = r;
    }
    let m = time_matches(&mut cache, keys);
    Ok(json!({
        "insert_ops_s": ins.ops_s,
        "match_ops_s": m.ops_s,
        "insert_bytes_s": ins.bytes_s,
        "match_bytes_s": m.bytes_s,
    }))
}

/// Best of three lifecycle runs, each on a fresh cache.
fn lifecycle(ps: usize, pool_tokens: usize, requests: &[Vec<TokenId>]) -> anyhow::Result<Value> {
    let mut best = lifecycle_once(ps, pool_tokens, requests)?;
    for _ in 0..2 {
        let v = lifecycle_once(ps, pool_tokens, requests)?;
        if v["req_s"].as_f64() > best["req_s"].as_f64() {
            best = v;
        }
    }
    Ok(best)
}

fn lifecycle_once(
    ps: usize,
    pool_tokens: usize,
    requests: &[Vec<TokenId>],
) -> anyhow::Result<Value> {
    let cfg = CacheConfig::new(pool_tokens / ps, ps).with_policy(EvictionPolicy::Lru);
    let mut cache = RadixCache::new(cfg)?;
    let ns = Namespace::DEFAULT;
    let mut pages = Vec::with_capacity(4096);
    let mut back = Vec::new();
    let (mut hit, mut total) = (0usize, 0usize);
    let t = Instant::now();
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
    let s = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        cache.stats().held_locks == 0 && cache.pool().caller_pages() == 0,
        "leak"
    );
    Ok(json!({ "req_s": requests.len() as f64 / s, "hit_rate": hit as f64 / total as f64 }))
}

fn row(name: &str, ours: f64, sglang: f64, unit: &str, lower_is_better: bool) {
    let ratio = if lower_is_better {
        sglang / ours
    } else {
        ours / sglang
    };
    let d = if unit == "s" { 4 } else { 0 };
    println!("  {name:<28} {ours:>12.d$} {unit:<6} SGLang {sglang:>8.d$}  {ratio:>7.1}x");
}

/// Runs the workloads at page sizes 1 and 16, prints a table, returns the `--json` object.
pub fn run(args: &RadixArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.requests > 0 && args.conversations > 0,
        "need at least one request"
    );
    let memcpy = memcpy_bytes_s();
    println!(
        "radix cache bench: {} fewshot requests, {} chat conversations x 8 turns, seed {}",
        args.requests, args.conversations, args.seed
    );
    println!("memcpy: {:.2} GB/s (256 MiB copy, best of 5)", memcpy / 1e9);
    let requests = fewshot_requests(args.seed, args.requests);
    let partial = partial_lookups(args.seed, &requests);
    let chat_keys = chat_requests(args.seed, args.conversations);
    let mut out = serde_json::Map::new();
    for (ps, sg) in SGLANG {
        println!("page size {ps}:");
        let f = fewshot(ps, &requests, &partial)?;
        let get = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        row(
            "fewshot insert",
            get(&f, "insert_ops_s"),
            sg[0],
            "ops/s",
            false,
        );
        row(
            "fewshot full match",
            get(&f, "match_full_ops_s"),
            sg[1],
            "ops/s",
            false,
        );
        row(
            "fewshot partial match",
            get(&f, "match_partial_ops_s"),
            sg[2],
            "ops/s",
            false,
        );
        row(
            "fewshot full after partial",
            get(&f, "match_full_after_partial_ops_s"),
            sg[3],
            "ops/s",
            false,
        );
        row(
            "fewshot evict all",
            get(&f, "evict_all_s"),
            sg[4],
            "s",
            true,
        );
        println!(
            "  {:<28} insert {:.2} GB/s, full match {:.2} GB/s, partial {:.2} GB/s (memcpy {:.2}); after/before partial {:.2}",
            "bytes/s",
            get(&f, "insert_bytes_s") / 1e9,
            get(&f, "match_full_bytes_s") / 1e9,
            get(&f, "match_partial_bytes_s") / 1e9,
            memcpy / 1e9,
            get(&f, "match_full_after_partial_ops_s") / get(&f, "match_full_ops_s"),
        );
        let c = chat(ps, &chat_keys)?;
        row(
            "chat insert",
            get(&c, "insert_ops_s"),
            sg[5],
            "ops/s",
            false,
        );
        row("chat match", get(&c, "match_ops_s"), sg[6], "ops/s", false);
        let l = lifecycle(ps, args.pool_tokens, &requests)?;
        row("lifecycle", get(&l, "req_s"), sg[7], "req/s", false);
        println!(
            "  {:<28} {:>14.3}        SGLang {:>10.3}",
            "lifecycle hit rate",
            get(&l, "hit_rate"),
            0.39
        );
        out.insert(
            format!("page_size_{ps}"),
            json!({ "fewshot": f, "chat": c, "lifecycle": l }),
        );
    }
    out.insert("memcpy_bytes_s".into(), json!(memcpy));
    Ok(Value::Object(out))
}
