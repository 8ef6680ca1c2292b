//! criterion: `RadixCache::evict` of everything after 1,000 fewshot inserts, and eviction in
//! small steps (LRU), page sizes 1 and 16.
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use sglrs_benches::radix::fewshot_requests;
use sglrs_radix_cache::{CacheConfig, Namespace, RadixCache};

fn filled(requests: &[Vec<u32>], ps: usize) -> RadixCache {
    let total: usize = requests.iter().map(|r| r.len() / ps).sum();
    let mut cache = RadixCache::new(CacheConfig::new(total, ps)).unwrap();
    let mut back = Vec::new();
    for r in requests {
        let mut pages = Vec::new();
        cache.alloc(r.len() / ps, &mut pages).unwrap();
        cache
            .insert(Namespace::DEFAULT, r, &pages, &mut back)
            .unwrap();
    }
    cache.free(&back).unwrap();
    cache
}

fn bench(c: &mut Criterion) {
    let requests = fewshot_requests(13, 1000);
    for ps in [1usize, 16] {
        let mut g = c.benchmark_group(format!("radix_evict/page_{ps}"));
        g.sample_size(20);
        g.bench_function("evict_all", |b| {
            b.iter_batched(
                || filled(&requests, ps),
                |mut cache| {
                    cache.evict(usize::MAX);
                    cache
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_function("evict_in_steps_of_256_pages", |b| {
            b.iter_batched(
                || filled(&requests, ps),
                |mut cache| {
                    while cache.evict(256) > 0 {}
                    cache
                },
                BatchSize::LargeInput,
            )
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
