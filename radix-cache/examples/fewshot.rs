//! A quick profiling driver for the fewshot workload of `sglrs bench radix`, with no
//! dependencies beyond this crate (the full bench with its table and JSON lives in
//! `sglrs-benches`; this one is for `perf record` and quick before/after checks).
//!
//! `cargo run --release -p sglrs-radix-cache --example fewshot -- [page_size] [rounds]
//! [insert|lifecycle]`
//! prints the thread CPU time per insert, full match, partial match and evict-all.
//! The token stream has the bench's shape (8 shared 1,000-token prefixes, lengths uniform in
//! [1024, 4096], vocab 32,000) from a simple generator, not the bench's exact tokens.

use sglrs_radix_cache::{CacheConfig, Namespace, PageId, RadixCache, TokenId};

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn tokens(&mut self, n: usize, out: &mut Vec<TokenId>) {
        out.extend((0..n).map(|_| self.below(32_000) as TokenId));
    }
}

/// This thread's CPU time in seconds (Linux; the wall clock elsewhere).
fn cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or_else(
            || {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64())
            },
            |ns| ns as f64 * 1e-9,
        )
}

/// Minor page faults of this thread so far (Linux; 0 elsewhere).
fn minflt() -> u64 {
    std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 2..];
            rest.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let ps: usize = args.get(1).map_or(Ok(1), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(3), |s| s.parse())?;
    // `insert` as the third argument skips the lookups (for profiling inserts alone).
    let only_insert = args.get(3).is_some_and(|a| a == "insert");
    let mut rng = SplitMix(42);
    let prefixes: Vec<Vec<TokenId>> = (0..8)
        .map(|_| {
            let mut p = Vec::new();
            rng.tokens(1000, &mut p);
            p
        })
        .collect();
    let reqs: Vec<Vec<TokenId>> = (0..10_000)
        .map(|_| {
            let len = 1024 + rng.below(4096 - 1024 + 1) as usize;
            let mut r = prefixes[rng.below(8) as usize].clone();
            rng.tokens(len - 1000, &mut r);
            r
        })
        .collect();
    let partial: Vec<Vec<TokenId>> = reqs
        .iter()
        .map(|r| {
            let mut q = r[..r.len() / 2].to_vec();
            rng.tokens(64, &mut q);
            q
        })
        .collect();
    let n = reqs.len() as f64;
    if args.get(3).is_some_and(|a| a == "lifecycle") {
        // match → lock → alloc the rest → insert → free what comes back → unlock, in a pool
        // of 2,000,000 tokens (the bench's lifecycle).
        let mut t = 0.0;
        let (mut hit, mut total) = (0usize, 0usize);
        for _ in 0..rounds {
            let mut cache = RadixCache::new(CacheConfig::new(2_000_000 / ps, ps))?;
            let (mut pages, mut back) = (Vec::with_capacity(4096), Vec::new());
            let t0 = cpu_s();
            for r in &reqs {
                pages.clear();
                back.clear();
                let m = cache.match_prefix(Namespace::DEFAULT, r, &mut pages);
                let lock = cache.lock(m.position.node)?;
                cache.alloc(r.len().div_ceil(ps) - pages.len(), &mut pages)?;
                cache.insert(Namespace::DEFAULT, r, &pages, &mut back)?;
                cache.free(&back)?;
                cache.unlock(lock)?;
                hit += m.len;
                total += r.len();
            }
            t += cpu_s() - t0;
        }
        println!(
            "page {ps}: lifecycle {:.0} req/s, hit rate {:.3} (cpu time, mean of {rounds})",
            n * rounds as f64 / t,
            hit as f64 / total as f64
        );
        return Ok(());
    }
    let total: usize = reqs.iter().map(|k| k.len() / ps).sum();
    let (mut ins, mut full, mut part, mut evict) = (0.0, 0.0, 0.0, 0.0);
    let mut faults = 0;
    let mut best_ins = f64::INFINITY;
    let mut out = Vec::with_capacity(4096);
    let mut back = Vec::with_capacity(4096);
    for _ in 0..rounds {
        let mut cache = RadixCache::new(CacheConfig::new(total, ps))?;
        let mut pages = Vec::with_capacity(reqs.len());
        for k in &reqs {
            let mut p: Vec<PageId> = Vec::with_capacity(k.len() / ps);
            cache.alloc(k.len() / ps, &mut p)?;
            pages.push(p);
        }
        let (t, f) = (cpu_s(), minflt());
        for (k, p) in reqs.iter().zip(&pages) {
            back.clear();
            cache.insert(Namespace::DEFAULT, k, p, &mut back)?;
        }
        ins += cpu_s() - t;
        best_ins = best_ins.min(cpu_s() - t);
        faults += minflt() - f;
        drop(pages);
        for (keys, acc) in [(&reqs, &mut full), (&partial, &mut part)] {
            if only_insert {
                break;
            }
            let t = cpu_s();
            for _ in 0..3 {
                for k in keys {
                    out.clear();
                    std::hint::black_box(cache.match_prefix(Namespace::DEFAULT, k, &mut out));
                }
            }
            *acc += (cpu_s() - t) / 3.0;
        }
        let t = cpu_s();
        cache.evict(usize::MAX);
        evict += cpu_s() - t;
    }
    let r = rounds as f64;
    println!(
        "page {ps}: insert {:.0} ops/s (best round {:.0}; {:.2} page faults an insert), full match {:.0} ops/s, partial {:.0} ops/s, evict all {:.4} s (cpu time, mean of {rounds})",
        n * r / ins,
        n / best_ins,
        faults as f64 / (n * r),
        n * r / full,
        n * r / part,
        evict / r
    );
    Ok(())
}
