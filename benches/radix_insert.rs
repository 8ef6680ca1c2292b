//! criterion: `RadixCache::insert` of 500 fewshot requests into an empty tree, page sizes 1
//! and 16 (the tree and the requests' pages are set up outside the timing).
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use sglrs_benches::radix::fewshot_requests;
use sglrs_radix_cache::{CacheConfig, Namespace, PageId, RadixCache};

fn bench(c: &mut Criterion) {
    let requests = fewshot_requests(11, 500);
    for ps in [1usize, 16] {
        let total: usize = requests.iter().map(|r| r.len() / ps).sum();
        let mut g = c.benchmark_group(format!("radix_insert/page_{ps}"));
        g.throughput(Throughput::Elements(requests.len() as u64));
        g.sample_size(20);
        g.bench_function("fewshot_500", |b| {
            b.iter_batched(
                || {
                    let mut cache = RadixCache::new(CacheConfig::new(total, ps)).unwrap();
                    let pages: Vec<Vec<PageId>> = requests
                        .iter()
                        .map(|r| {
                            let mut p = Vec::new();
                            cache.alloc(r.len() / ps, &mut p).unwrap();
                            p
                        })
                        .collect();
                    (cache, pages, Vec::with_capacity(1 << 20))
                },
                |(mut cache, pages, mut back)| {
                    for (r, p) in requests.iter().zip(&pages) {
                        cache.insert(Namespace::DEFAULT, r, p, &mut back).unwrap();
                    }
                    (cache, pages, back)
                },
                BatchSize::LargeInput,
            )
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
