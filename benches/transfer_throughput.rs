//! Criterion: KV pages over encrypted loopback QUIC, beside plain TCP moving the same bytes
//! (the ratio is the figure; see `sglrs bench transfer` for the full report).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sglrs_benches::transfer::{source_pages, QuicPair, TcpPair};
use sglrs_transfer::quic::QuicConfig;
use sglrs_transfer::KvLayout;

const PAGES: usize = 256;

fn transfer_throughput(c: &mut Criterion) {
    let layout = KvLayout::smollm2_135m();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let src = source_pages(&layout, PAGES);
    let mut pool = vec![0u8; PAGES * layout.page_bytes()];
    let mut g = c.benchmark_group("transfer_throughput");
    g.throughput(Throughput::Bytes((PAGES * layout.page_bytes()) as u64));
    g.sample_size(10);
    let mut quic = rt
        .block_on(async { QuicPair::new(layout, QuicConfig::loopback()) })
        .unwrap();
    g.bench_function("quic_256_pages", |b| {
        b.iter(|| rt.block_on(quic.transfer(&src, PAGES, &mut pool)).unwrap())
    });
    let mut tcp = rt.block_on(TcpPair::new()).unwrap();
    g.bench_function("tcp_256_pages", |b| {
        b.iter(|| rt.block_on(tcp.transfer(&src, PAGES, &mut pool)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, transfer_throughput);
criterion_main!(benches);
