//! The lower cache tiers under the toy executor: `toy_io` runs the core's copy jobs at once
//! against the toy KV slots, as the cache I/O thread would against the pool.

use super::*;

use std::cell::RefCell;
use std::collections::HashSet;

thread_local! {
    /// Pages this thread's toy prefetches took from a remote tier (for the load's counts).
    static FROM_REMOTE: RefCell<HashSet<sglrs_radix_cache::PageHash>> = RefCell::default();
}

/// A remote tier over a page store that answers at once (the store other cores write to).
pub(super) struct ToyRemote(pub Arc<sglrs_radix_cache::store::PageStore>);

impl hicache::RemoteTier for ToyRemote {
    fn fetch(
        &self,
        hashes: Vec<sglrs_radix_cache::PageHash>,
        done: Box<dyn FnOnce(Vec<Option<bytes::Bytes>>) + Send>,
    ) {
        done(self.0.get(&hashes));
    }
    fn write(&self, pages: Vec<(sglrs_radix_cache::PageHash, bytes::Bytes)>) {
        self.0.put(pages).unwrap();
    }
}

/// Runs the core's cache copies at once against `exec`'s slots, as the I/O thread would: a
/// page's bytes are its slots' tokens (`u32` LE, token + 1, 0 for an unwritten slot).
pub(super) fn toy_io(core: &mut SchedulerCore, exec: &mut ToyExec) {
    let Some(store) = core.hicache().map(|h| h.store.clone()) else {
        return;
    };
    let remote = core
        .hicache()
        .and_then(|h| h.remote.clone().filter(|_| h.remote_write));
    let fetcher = core.hicache().and_then(|h| h.remote.clone());
    let ps = exec.page_size;
    let slots = |exec: &ToyExec, p: u32| -> bytes::Bytes {
        exec.kv[p as usize * ps..(p as usize + 1) * ps]
            .iter()
            .flat_map(|t| t.map_or(0, |t| t + 1).to_le_bytes())
            .collect::<Vec<u8>>()
            .into()
    };
    // Write-back: copy what the planning evicted before the pass overwrites it.
    let evicted = core.take_demoted();
    let copies = evicted.iter().map(|&(h, p)| (h, slots(exec, p))).collect();
    core.store_copies(copies);
    while let Some(job) = core.poll_io() {
        let done = match job {
            hicache::IoJob::Write { pin, pages, hashes } => {
                let out: Vec<_> = pages
                    .iter()
                    .zip(&hashes)
                    .map(|(&p, &h)| (h, slots(exec, p)))
                    .collect();
                let written = out.len();
                if let Some(r) = &remote {
                    r.write(out.clone());
                }
                store.put(out).unwrap();
                hicache::IoDone::Written { pin, written }
            }
            hicache::IoJob::Load { key, pages, hashes } => {
                let (mut loaded, mut from_remote) = (0, 0);
                for ((&p, got), h) in pages.iter().zip(store.get(&hashes)).zip(&hashes) {
                    let Some(b) = got else { break };
                    if FROM_REMOTE.with(|f| f.borrow_mut().remove(h)) {
                        from_remote += 1;
                    }
                    for (slot, c) in b.chunks_exact(4).enumerate() {
                        let v = u32::from_le_bytes(c.try_into().unwrap());
                        exec.kv[p as usize * ps + slot] = v.checked_sub(1);
                    }
                    loaded += 1;
                }
                hicache::IoDone::Loaded {
                    key,
                    loaded,
                    host: loaded - from_remote,
                    disk: 0,
                    remote: from_remote,
                    seconds: 0.0,
                }
            }
            hicache::IoJob::Prefetch { id, remote, .. } => {
                let mut got = Vec::new();
                if let Some(r) = fetcher.as_ref().filter(|_| !remote.is_empty()) {
                    let (tx, rx) = std::sync::mpsc::channel();
                    r.fetch(
                        remote.clone(),
                        Box::new(move |p| {
                            tx.send(p).unwrap();
                        }),
                    );
                    got = rx.recv().unwrap();
                }
                let pages: Vec<_> = remote
                    .iter()
                    .zip(got)
                    .map_while(|(h, p)| Some((*h, p?)))
                    .collect();
                let n = pages.len();
                FROM_REMOTE.with(|f| f.borrow_mut().extend(pages.iter().map(|(h, _)| *h)));
                store.put(pages).unwrap();
                hicache::IoDone::Prefetched { id, remote: n }
            }
            hicache::IoJob::Store { pages } => {
                let written = pages.len();
                store.put(pages).unwrap();
                hicache::IoDone::Stored { written }
            }
        };
        core.handle_io_done(done);
    }
}

/// Lower tiers for a test core: a RAM-only page store, `policy`, pages of `page_size` toy
/// slots.
pub(super) fn tier_config(
    policy: hicache::WritePolicy,
    page_size: usize,
) -> hicache::HiCacheConfig {
    let store =
        sglrs_radix_cache::store::PageStore::open(sglrs_radix_cache::store::PageStoreConfig {
            ram_bytes: 1 << 30,
            disk: None,
            disk_write_through: false,
        })
        .unwrap();
    hicache::HiCacheConfig {
        store: Arc::new(store),
        write_policy: policy,
        prefetch_policy: hicache::PrefetchPolicy::WaitComplete,
        prefetch_timeout: std::time::Duration::from_millis(100),
        root_hash: sglrs_radix_cache::PageHash(0x5eed),
        page_bytes: 4 * page_size,
        remote: None,
        remote_write: false,
    }
}

fn tiered_core(num_pages: usize, page_size: usize, policy: hicache::WritePolicy) -> SchedulerCore {
    let mut cfg = config(num_pages, page_size);
    cfg.hicache = Some(tier_config(policy, page_size));
    SchedulerCore::new(cfg, Arc::new(ToyTok)).unwrap()
}

fn distinct_prompt(i: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|j| (i * 7 + j * 3) % 37 + 1).collect()
}

#[test]
fn a_conversation_evicted_from_the_device_comes_back_from_the_host_tier() {
    // 40 pages of 4 tokens; six 41-token prompts (10 full pages each) push each other out.
    let mut c = tiered_core(40, 4, hicache::WritePolicy::WriteThrough);
    let mut e = ToyExec::new(40, 4);
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| distinct_prompt(i, 41)).collect();
    for (i, p) in prompts.iter().enumerate() {
        c.handle_request(request(i as u64, p.clone(), 4), Instant::now());
        let outs = run(&mut c, &mut e, &[]);
        assert_eq!(outs[&(i as u64, 0)].tokens, reference(p, 4));
    }
    assert!(c.cache_stats().evicted_pages > 0);
    // Prompt 0 again: its pages are gone from the device but in the host tier.
    c.handle_request(request(10, prompts[0].clone(), 4), Instant::now());
    let outs = run(&mut c, &mut e, &[]);
    let o = &outs[&(10, 0)];
    assert_eq!(
        o.tokens,
        reference(&prompts[0], 4),
        "loaded pages give the same output"
    );
    assert_eq!(o.details.device + o.details.host, 40, "{:?}", o.details);
    assert!(o.details.host > 0, "{:?}", o.details);
    assert_eq!(c.stats().cached_host_tokens, o.details.host as u64);
    assert!(!c.io_pending());
    assert_no_leaks(&c);
    c.check_cache_invariants();
}

#[test]
fn a_prompt_another_core_computed_is_fetched_from_the_shared_remote_tier() {
    let shared = tier_config(hicache::WritePolicy::WriteThrough, 4).store;
    let core_with_remote = |write: bool| {
        let mut cfg = config(40, 4);
        let mut h = tier_config(hicache::WritePolicy::WriteThrough, 4);
        h.remote = Some(Arc::new(ToyRemote(shared.clone())));
        h.remote_write = write;
        cfg.hicache = Some(h);
        SchedulerCore::new(cfg, Arc::new(ToyTok)).unwrap()
    };
    let p = distinct_prompt(3, 41);
    // Core A computes the prompt and writes its 10 full pages through to the shared tier.
    let mut a = core_with_remote(true);
    let mut ea = ToyExec::new(40, 4);
    a.handle_request(request(1, p.clone(), 4), Instant::now());
    let first = run(&mut a, &mut ea, &[]);
    assert_eq!(first[&(1, 0)].details.total(), 0);
    assert_eq!(shared.stats().ram_pages, 11, "prompt and output, 45 tokens");
    // Core B (empty device and host tiers, never writing) asks the remote tier on arrival.
    let mut b = core_with_remote(false);
    let mut eb = ToyExec::new(40, 4);
    let now = Instant::now();
    b.handle_request(request(2, p.clone(), 4), now);
    let Some(hicache::IoJob::Prefetch { id, hashes, remote }) = b.poll_io() else {
        panic!("a prefetch on arrival")
    };
    assert!(hashes.is_empty(), "nothing local");
    assert_eq!(
        remote.len(),
        10,
        "every full page but the one left to compute"
    );
    // That job was taken out for a look: abort the request and send the prompt again for
    // the toy I/O to serve.
    b.handle_abort(2, AbortReason::Requested);
    while b.poll_event().is_some() {}
    b.handle_io_done(hicache::IoDone::Prefetched { id, remote: 0 });
    b.handle_request(request(3, p.clone(), 4), now);
    let outs = run(&mut b, &mut eb, &[]);
    let o = &outs[&(3, 0)];
    assert_eq!(
        o.tokens,
        first[&(1, 0)].tokens,
        "the same output from fetched pages"
    );
    assert_eq!(o.details.remote, 40, "{:?}", o.details);
    assert_eq!(b.stats().cached_remote_tokens, 40);
    assert_eq!(b.tier_stats().unwrap().fetched_remote_pages, 10);
    assert_eq!(shared.stats().ram_pages, 11, "B wrote nothing");
    assert!(!b.io_pending());
    assert_no_leaks(&b);
}

#[test]
fn a_request_aborted_while_loading_frees_its_pages_when_the_load_ends() {
    let mut c = tiered_core(40, 4, hicache::WritePolicy::WriteThrough);
    let mut e = ToyExec::new(40, 4);
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| distinct_prompt(i, 41)).collect();
    for (i, p) in prompts.iter().enumerate() {
        c.handle_request(request(i as u64, p.clone(), 2), Instant::now());
        run(&mut c, &mut e, &[]);
    }
    let now = Instant::now();
    c.handle_request(request(10, prompts[0].clone(), 4), now);
    // Queued with its pages below the device: a prefetch first, which admission waits for.
    let Some(hicache::IoJob::Prefetch { id, .. }) = c.poll_io() else {
        panic!("a prefetch on arrival")
    };
    assert!(
        c.poll_batch(now).is_none(),
        "admission waits for the prefetch"
    );
    c.handle_io_done(hicache::IoDone::Prefetched { id, remote: 0 });
    assert!(c.poll_batch(now).is_none(), "it waits for its load");
    let load = std::iter::from_fn(|| c.poll_io())
        .filter(|j| matches!(j, hicache::IoJob::Load { .. }))
        .count();
    assert_eq!(load, 1);
    c.handle_abort(10, AbortReason::Requested);
    assert!(c.io_pending(), "the load still owns its pages");
    // The load job was taken above without running; report it as done with nothing.
    c.handle_io_done(hicache::IoDone::Loaded {
        key: (10, 0),
        loaded: 0,
        host: 0,
        disk: 0,
        remote: 0,
        seconds: 0.0,
    });
    while c.poll_event().is_some() {}
    assert!(!c.io_pending());
    assert_no_leaks(&c);
}

#[test]
fn write_back_stores_pages_only_when_they_are_evicted_and_serves_them_back() {
    let mut c = tiered_core(40, 4, hicache::WritePolicy::WriteBack);
    let mut e = ToyExec::new(40, 4);
    let store = c.hicache().unwrap().store.clone();
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| distinct_prompt(i, 41)).collect();
    c.handle_request(request(0, prompts[0].clone(), 4), Instant::now());
    run(&mut c, &mut e, &[]);
    assert_eq!(
        store.stats().ram_pages,
        0,
        "nothing evicted yet: nothing written"
    );
    for (i, p) in prompts.iter().enumerate().skip(1) {
        c.handle_request(request(i as u64, p.clone(), 4), Instant::now());
        run(&mut c, &mut e, &[]);
    }
    assert!(
        store.stats().ram_pages > 0,
        "evicted pages were written back"
    );
    c.handle_request(request(10, prompts[0].clone(), 4), Instant::now());
    let outs = run(&mut c, &mut e, &[]);
    let o = &outs[&(10, 0)];
    assert_eq!(o.tokens, reference(&prompts[0], 4));
    assert!(o.details.host > 0, "{:?}", o.details);
    assert_no_leaks(&c);
}

#[test]
fn selective_write_through_writes_only_prefixes_hit_on_the_device() {
    let mut c = tiered_core(64, 4, hicache::WritePolicy::WriteThroughSelective);
    let mut e = ToyExec::new(64, 4);
    let store = c.hicache().unwrap().store.clone();
    let p = distinct_prompt(1, 41);
    c.handle_request(request(0, p.clone(), 2), Instant::now());
    run(&mut c, &mut e, &[]);
    assert_eq!(store.stats().ram_pages, 0, "computed once: not written");
    c.handle_request(request(1, p.clone(), 2), Instant::now());
    run(&mut c, &mut e, &[]);
    assert_eq!(store.stats().ram_pages, 10, "hit on the device: written");
    assert_no_leaks(&c);
}
