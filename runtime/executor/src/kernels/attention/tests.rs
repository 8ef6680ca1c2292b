//! Tests of the attention kernels: against a naive f64 softmax, across page sizes, tile
//! shapes, the f32 copies and softmax chunks (bit-exactness), and the page writes.

use super::*;
use crate::kv::KvPool;
use crate::KvLayout;

fn vals(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// `attend` over one tile of the first `lens.len()` rows of `qs`, each row's output.
fn attend_rows(
    isa: Isa,
    qs: &[&[f32]],
    lens: &[usize],
    kv: &KvSource<'_>,
    scale: f32,
) -> Vec<Vec<f32>> {
    let mut outs = vec![vec![0.0f32; kv.head_dim()]; lens.len()];
    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    let tile = AttnTile {
        q: &qs[..lens.len()],
        lens,
    };
    attend(isa, &tile, kv, scale, &mut Vec::new(), &mut refs);
    outs
}

/// A pool of one layer, 2 KV heads of `hd`, holding `len` positions on reversed pages.
fn filled_pool(ps: usize, hd: usize, len: usize) -> (KvPool, Vec<u32>) {
    let layout = KvLayout {
        num_layers: 1,
        num_kv_heads: 2,
        head_dim: hd,
        page_size: ps,
        dtype: KvDtype::F16,
    };
    let np = len.div_ceil(ps);
    let mut pool = KvPool::new(layout, np + 1);
    let pages: Vec<u32> = (1..=np as u32).rev().collect();
    for p in 0..len {
        let k = vals(2 * hd, 1 + p as u32 * 7);
        let v = vals(2 * hd, 2 + p as u32 * 13);
        pool.write_token(0, pages[p / ps] as usize, p % ps, &k, &v);
    }
    (pool, pages)
}

#[test]
fn paged_attention_matches_naive_softmax_and_is_layout_independent() {
    let (hd, len) = (64, 70);
    let qs: Vec<Vec<f32>> = (0..8).map(|i| vals(hd, 10 + i)).collect();
    let qrefs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
    let lens = [70, 20, 1, 16, 33, 32, 5, 69];
    let scale = 0.125;
    for isa in Isa::all_supported() {
        // (page size, tile rows) -> outputs of every row, for the bit-exactness checks.
        let mut seen: Vec<Vec<Vec<f32>>> = Vec::new();
        for ps in [16usize, 1, 8, 64, 48] {
            let (pool, pages) = filled_pool(ps, hd, len);
            let kv = pool.head(0, &pages, 1);
            for nq in 1..=MAX_ROWS {
                let outs = attend_rows(isa, &qrefs, &lens[..nq], &KvSource::Paged(kv), scale);
                // The f32 copy of the task's range gives the same bits.
                let mut copy = KvF32::default();
                copy.fill(isa, &kv, lens[..nq].iter().copied().max().unwrap());
                let outs2 = attend_rows(isa, &qrefs, &lens[..nq], &KvSource::F32(&copy), scale);
                assert_eq!(outs2, outs, "{isa:?} ps{ps} nq{nq}: f32 copy");
                for i in 0..nq {
                    let s: Vec<f64> = (0..lens[i])
                        .map(|p| {
                            (0..hd).map(|d| (qs[i][d] * kv.k(p, d)) as f64).sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                    let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for d in 0..hd {
                        let want: f64 =
                            (0..lens[i]).map(|p| w[p] * kv.v(p, d) as f64).sum::<f64>() / z;
                        assert!(
                            (outs[i][d] as f64 - want).abs() < 1e-5,
                            "{isa:?} ps{ps} q{i} d{d}"
                        );
                    }
                }
                // A row's result depends neither on the page size nor on its tile-mates.
                for prev in &seen {
                    for i in 0..nq.min(prev.len()) {
                        assert_eq!(outs[i], prev[i], "{isa:?} ps{ps} nq{nq} row {i}");
                    }
                }
                seen.push(outs);
            }
        }
    }
}

/// Rows longer than a softmax chunk: the chunked result matches an f64 softmax, each
/// chunk computed by its own `attend_chunks` call and merged gives the bits of the row
/// computed whole, and a row's bits do not depend on its tile-mates or on the KV copy.
#[test]
fn long_rows_merge_chunks_to_the_same_bits() {
    let (hd, ps, len) = (64, 16, 2 * SOFTMAX_CHUNK + 300);
    let isa = Isa::detect();
    let (pool, pages) = filled_pool(ps, hd, len);
    let kv = pool.head(0, &pages, 0);
    if !chunks_supported(isa, &kv) {
        eprintln!("skipped: no AVX-512 chunked kernel on this CPU");
        return;
    }
    let qs: Vec<Vec<f32>> = (0..8).map(|i| vals(hd, 40 + i)).collect();
    let qrefs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
    let scale = 0.3;
    let whole = |lens: &[usize], src: &KvSource<'_>| attend_rows(isa, &qrefs, lens, src, scale);
    // Decode-like: three rows of the full length, whole vs one call per chunk.
    let lens3 = [len; 3];
    let a = whole(&lens3, &KvSource::Paged(kv));
    let nchunks = len.div_ceil(SOFTMAX_CHUNK);
    let w = chunk_partial_len(hd);
    let mut parts = vec![vec![0.0f32; nchunks * w]; 3];
    for c in 0..nchunks {
        let mut refs: Vec<&mut [f32]> = parts
            .iter_mut()
            .map(|p| &mut p[c * w..(c + 1) * w])
            .collect();
        let tile = AttnTile {
            q: &qrefs[..3],
            lens: &lens3,
        };
        attend_chunks(isa, &tile, &kv, scale, &mut Vec::new(), c..c + 1, &mut refs);
    }
    for i in 0..3 {
        let mut o = vec![0.0f32; hd];
        merge_chunks(&parts[i], hd, &mut o);
        assert_eq!(o, a[i], "row {i}: merged chunks");
        let s: Vec<f64> = (0..len)
            .map(|p| (0..hd).map(|d| (qs[i][d] * kv.k(p, d)) as f64).sum::<f64>() * scale as f64)
            .collect();
        let mx = s.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
        let z: f64 = e.iter().sum();
        for d in 0..hd {
            let want: f64 = (0..len).map(|p| e[p] * kv.v(p, d) as f64).sum::<f64>() / z;
            assert!((a[i][d] as f64 - want).abs() < 1e-5, "row {i} d{d}");
        }
    }
    // Prefill-like: eight rows whose lengths straddle chunk boundaries, against each
    // row alone and against the f32 copy.
    let lens8 = [
        len,
        SOFTMAX_CHUNK,
        SOFTMAX_CHUNK + 1,
        2 * SOFTMAX_CHUNK - 1,
        17,
        len - 1,
        SOFTMAX_CHUNK - 1,
        2 * SOFTMAX_CHUNK,
    ];
    let b = whole(&lens8, &KvSource::Paged(kv));
    let mut copy = KvF32::default();
    copy.fill(isa, &kv, len);
    assert_eq!(whole(&lens8, &KvSource::F32(&copy)), b, "f32 copy");
    for i in 0..8 {
        let alone = attend_rows(
            isa,
            &qrefs[i..i + 1],
            &lens8[i..i + 1],
            &KvSource::Paged(kv),
            scale,
        )
        .remove(0);
        assert_eq!(alone, b[i], "row {i} (length {}) alone", lens8[i]);
    }
    assert_eq!(b[0], a[0], "a full-length row in a prefill tile");
}

#[test]
fn reused_f32_copies_equal_fresh_ones() {
    let (hd, ps) = (64, 16);
    let mut pool = KvPool::new(
        KvLayout {
            num_layers: 1,
            num_kv_heads: 2,
            head_dim: hd,
            page_size: ps,
            dtype: KvDtype::F16,
        },
        12,
    );
    for page in 0..12 {
        for slot in 0..ps {
            let p = (page * ps + slot) as u32;
            pool.write_token(
                0,
                page,
                slot,
                &vals(2 * hd, 1 + p * 7),
                &vals(2 * hd, 2 + p * 13),
            );
        }
    }
    // Two sequences sharing their first 3 pages, then one sharing only 1 of them.
    let tables: [&[u32]; 4] = [&[0, 1, 2, 3, 4], &[0, 1, 2, 5, 6], &[0, 7, 8], &[9, 10, 11]];
    for isa in Isa::all_supported() {
        for head in 0..2 {
            let mut reused = KvF32::default();
            for (k, pages) in tables.iter().enumerate() {
                let kv = pool.head(0, pages, head);
                for len in [pages.len() * ps, pages.len() * ps - 5, 17] {
                    reused.fill_reusing(isa, &kv, len, 7);
                    let mut fresh = KvF32::default();
                    fresh.fill(isa, &kv, len);
                    let n = len.div_ceil(16) * hd * 16;
                    assert_eq!(reused.kt[..n], fresh.kt[..n], "{isa:?} {k} {len}");
                    assert_eq!(reused.v[..len * hd], fresh.v[..len * hd], "{isa:?} {k}");
                }
            }
        }
        // A new epoch converts again: a page rewritten in between is seen.
        let pages: &[u32] = &[0, 1];
        let mut reused = KvF32::default();
        reused.fill_reusing(isa, &pool.head(0, pages, 0), 32, 1);
        let before = reused.v[0];
        pool.write_token(0, 0, 0, &vals(2 * hd, 555), &vals(2 * hd, 556));
        reused.fill_reusing(isa, &pool.head(0, pages, 0), 32, 2);
        let mut fresh = KvF32::default();
        fresh.fill(isa, &pool.head(0, pages, 0), 32);
        assert_eq!(reused.v[..32 * hd], fresh.v[..32 * hd]);
        assert_eq!(reused.kt[..2 * hd * 16], fresh.kt[..2 * hd * 16]);
        assert_ne!(reused.v[0], before);
        // Restore page 0 for the next ISA.
        pool.write_token(0, 0, 0, &vals(2 * hd, 1), &vals(2 * hd, 2));
    }
}

#[test]
fn tokens_written_to_pages_read_back_in_place() {
    let (pool, pages) = filled_pool(16, 32, 40);
    let kv = pool.head(0, &pages, 1);
    for p in 0..40 {
        let k = vals(64, 1 + p as u32 * 7);
        let v = vals(64, 2 + p as u32 * 13);
        for d in 0..32 {
            assert_eq!(kv.k(p, d), f16::from_f32(k[32 + d]).to_f32());
            assert_eq!(kv.v(p, d), f16::from_f32(v[32 + d]).to_f32());
        }
    }
}

/// A measurement (`cargo test --release -p sglrs-executor --lib -- --ignored --nocapture
/// decode_attention_from_cache_and_from_memory`): one decode tile (3 rows, one KV head) over
/// 3,400 positions, its pages in L2 (the same pool each time) and in memory (100 pools in
/// turn, 170 MB). The gap is what a decode step over long contexts waits on memory.
#[test]
#[ignore = "a measurement"]
fn decode_attention_from_cache_and_from_memory() {
    let (hd, len, ps) = (64, 3400, 16);
    let qs: Vec<Vec<f32>> = (0..3).map(|i| vals(hd, 10 + i)).collect();
    let qrefs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
    let lens = [len; 3];
    let isa = Isa::detect();
    let pools: Vec<(KvPool, Vec<u32>)> = (0..100).map(|_| filled_pool(ps, hd, len)).collect();
    let run = |n: usize| {
        let t = std::time::Instant::now();
        for r in 0..300 {
            let (pool, pages) = &pools[r % n];
            let kv = KvSource::Paged(pool.head(0, pages, r % 2));
            std::hint::black_box(attend_rows(isa, &qrefs, &lens, &kv, 0.125));
        }
        t.elapsed().as_secs_f64() / 300.0 * 1e6
    };
    run(1);
    let (cached, memory) = (run(1), run(100));
    eprintln!("3 rows x {len} positions: {cached:.1} us from L2, {memory:.1} us from memory");
}
