//! criterion: `RadixCache::match_prefix` on the fewshot workload (full and partial lookups),
//! page sizes 1 and 16.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sglrs_benches::radix::{fewshot_requests, partial_lookups};
use sglrs_radix_cache::{CacheConfig, Namespace, RadixCache};

fn bench(c: &mut Criterion) {
    let requests = fewshot_requests(7, 2000);
    let partial = partial_lookups(7, &requests);
    for ps in [1usize, 16] {
        let total: usize = requests.iter().map(|r| r.len() / ps).sum();
        let mut cache = RadixCache::new(CacheConfig::new(total, ps)).unwrap();
        let mut back = Vec::new();
        for r in &requests {
            let mut pages = Vec::new();
            cache.alloc(r.len() / ps, &mut pages).unwrap();
            cache
                .insert(Namespace::DEFAULT, r, &pages, &mut back)
                .unwrap();
        }
        let mut g = c.benchmark_group(format!("radix_match_prefix/page_{ps}"));
        let mut out = Vec::with_capacity(4096);
        for (name, keys) in [("full", &requests), ("partial", &partial)] {
            let bytes: usize = keys.iter().map(|k| k.len() * 4).sum();
            g.throughput(Throughput::Bytes((bytes / keys.len()) as u64));
            let mut i = 0;
            g.bench_function(name, |b| {
                b.iter(|| {
                    i = (i + 1) % keys.len();
                    out.clear();
                    cache
                        .match_prefix(Namespace::DEFAULT, &keys[i], &mut out)
                        .len
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
