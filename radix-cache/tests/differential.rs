//! Seeded differential test: long random sequences of insert / match / lock / unlock / evict /
//! reset against a small, obviously-correct model, with every result and every invariant
//! checked after every step. proptest shrinks a failure to a minimal sequence.
//!
//! The model maps each cached page-aligned prefix `(namespace, tokens[..k * page_size])` to
//! the page holding its last page. Eviction order is the cache's own business; the model
//! checks what any correct eviction must do: free exactly as many pages as asked (or all
//! that are unlocked), keep every locked prefix, keep the cache prefix-closed.
//!
//! Every operation runs on two caches at once, with and without per-page owner tracking,
//! which must give the same answers, stats and events.

use std::collections::HashMap;

use proptest::prelude::*;
use sglrs_radix_cache::{
    CacheConfig, CacheError, CacheStats, EvictionPolicy, InsertResult, InvariantViolation,
    LockHandle, MatchResult, Namespace, NodeId, PageId, PagePool, PageState, PoolError, RadixCache,
};

/// Two caches fed the same operations, one tracking every page's owner (what the model
/// reads), one not (the release default): every answer of the two must agree.
struct Twin {
    a: RadixCache,
    b: RadixCache,
}

struct TwinLock(LockHandle, LockHandle);

impl Twin {
    fn new(cfg: CacheConfig) -> Result<Twin, CacheError> {
        Ok(Twin {
            a: RadixCache::new(cfg.clone().with_page_tracking(true))?,
            b: RadixCache::new(cfg.with_page_tracking(false))?,
        })
    }

    fn pool(&self) -> &PagePool {
        self.a.pool()
    }

    fn stats(&self) -> CacheStats {
        let s = self.a.stats();
        assert_eq!(s, self.b.stats(), "tracked and untracked caches disagree");
        s
    }

    fn match_prefix(&mut self, ns: Namespace, key: &[u32], out: &mut Vec<PageId>) -> MatchResult {
        let mut out_b = out.clone();
        let r = self.a.match_prefix(ns, key, out);
        assert_eq!(r, self.b.match_prefix(ns, key, &mut out_b));
        assert_eq!(*out, out_b);
        r
    }

    fn lock(&mut self, node: NodeId) -> Result<TwinLock, CacheError> {
        let a = self.a.lock(node)?;
        let b = self
            .b
            .lock(node)
            .expect("the untracked twin refused a lock");
        Ok(TwinLock(a, b))
    }

    fn unlock(&mut self, l: TwinLock) -> Result<(), CacheError> {
        let r = self.a.unlock(l.0);
        assert_eq!(r, self.b.unlock(l.1));
        r
    }

    fn alloc(&mut self, n: usize, out: &mut Vec<PageId>) -> Result<(), CacheError> {
        let mut out_b = out.clone();
        let r = self.a.alloc(n, out);
        assert_eq!(r, self.b.alloc(n, &mut out_b));
        assert_eq!(*out, out_b);
        r
    }

    fn insert(
        &mut self,
        ns: Namespace,
        key: &[u32],
        pages: &[PageId],
        back: &mut Vec<PageId>,
    ) -> Result<InsertResult, CacheError> {
        let mut back_b = back.clone();
        let r = self.a.insert(ns, key, pages, back);
        assert_eq!(r, self.b.insert(ns, key, pages, &mut back_b));
        assert_eq!(*back, back_b);
        r
    }

    fn free(&mut self, pages: &[PageId]) -> Result<(), CacheError> {
        let r = self.a.free(pages);
        assert_eq!(r, self.b.free(pages));
        r
    }

    fn evict(&mut self, n: usize) -> usize {
        let r = self.a.evict(n);
        assert_eq!(r, self.b.evict(n));
        assert_eq!(
            self.a.drain_events().collect::<Vec<_>>(),
            self.b.drain_events().collect::<Vec<_>>()
        );
        r
    }

    fn reset(&mut self) -> Result<(), CacheError> {
        let r = self.a.reset();
        assert_eq!(r, self.b.reset());
        r
    }

    fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.a.check_invariants()?;
        self.b.check_invariants()?;
        self.stats();
        Ok(())
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Insert `key`; with `reuse` the request first matches and reuses the tree's pages.
    Insert {
        ns: u8,
        key: Vec<u32>,
        reuse: bool,
        tail: bool,
    },
    Match {
        ns: u8,
        key: Vec<u32>,
    },
    Lock {
        ns: u8,
        key: Vec<u32>,
    },
    Unlock {
        which: usize,
    },
    Evict {
        pages: usize,
    },
    Reset,
}

fn key() -> impl Strategy<Value = Vec<u32>> {
    // A tiny alphabet so that prefixes are shared, split and diverge often; one token above
    // 16 bits so that edges are stored both narrow and wide.
    prop::collection::vec(
        (0u32..3).prop_map(|t| if t == 2 { 65_536 } else { t }),
        0..14,
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..2, key(), any::<bool>(), any::<bool>())
            .prop_map(|(ns, key, reuse, tail)| Op::Insert { ns, key, reuse, tail }),
        4 => (0u8..2, key()).prop_map(|(ns, key)| Op::Match { ns, key }),
        2 => (0u8..2, key()).prop_map(|(ns, key)| Op::Lock { ns, key }),
        2 => any::<usize>().prop_map(|which| Op::Unlock { which }),
        2 => (0usize..8).prop_map(|pages| Op::Evict { pages }),
        1 => Just(Op::Insert { ns: 0, key: vec![], reuse: false, tail: false }),
        1 => prop::bool::weighted(0.1).prop_map(|_| Op::Reset),
    ]
}

/// The reference: every cached page-aligned prefix and its page.
#[derive(Default)]
struct Model {
    pages: HashMap<(u8, Vec<u32>), PageId>,
}

impl Model {
    fn matched(&self, ns: u8, key: &[u32], ps: usize) -> Vec<PageId> {
        let mut out = Vec::new();
        for k in 1..=key.len() / ps {
            match self.pages.get(&(ns, key[..k * ps].to_vec())) {
                Some(p) => out.push(*p),
                None => break,
            }
        }
        out
    }

    /// Records an insert; returns the caller's pages the cache must hand back.
    fn insert(&mut self, ns: u8, key: &[u32], pages: &[PageId], ps: usize) -> Vec<PageId> {
        let mut back = Vec::new();
        for k in 1..=key.len() / ps {
            let mine = pages[k - 1];
            match self.pages.get(&(ns, key[..k * ps].to_vec())) {
                Some(&theirs) if theirs != mine => back.push(mine),
                Some(_) => {}
                None => {
                    self.pages.insert((ns, key[..k * ps].to_vec()), mine);
                }
            }
        }
        back
    }

    /// Drops prefixes whose page the pool says is free; returns how many.
    fn sync_evicted(&mut self, cache: &Twin) -> usize {
        let before = self.pages.len();
        self.pages
            .retain(|_, p| cache.pool().state(*p) == Some(PageState::Tree));
        before - self.pages.len()
    }

    fn prefix_closed(&self, ps: usize) -> bool {
        self.pages.keys().all(|(ns, k)| {
            k.len() == ps || self.pages.contains_key(&(*ns, k[..k.len() - ps].to_vec()))
        })
    }
}

struct Locked {
    handle: TwinLock,
    ns: u8,
    key: Vec<u32>,
}

fn namespace(ns: u8) -> Namespace {
    Namespace(u64::from(ns) * 7919)
}

fn run(
    ps: usize,
    pool_pages: usize,
    policy: EvictionPolicy,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut cache = Twin::new(
        CacheConfig::new(pool_pages, ps)
            .with_policy(policy)
            .with_events(ps == 2),
    )
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut model = Model::default();
    let mut locks: Vec<Locked> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Insert {
                ns,
                key,
                reuse,
                tail,
            } => {
                let full = key.len() / ps;
                let mut pages = Vec::new();
                let mut lock = None;
                if *reuse {
                    // The lifecycle: match, lock what matched, allocate the rest.
                    let m = cache.match_prefix(namespace(*ns), key, &mut pages);
                    prop_assert_eq!(m.len, pages.len() * ps);
                    lock = Some(
                        cache
                            .lock(m.position.node)
                            .map_err(|e| TestCaseError::fail(e.to_string()))?,
                    );
                }
                let tail_page = *tail && key.len() % ps != 0;
                let need = full - pages.len() + usize::from(tail_page);
                let evictable_before = cache.stats().evictable_tokens / ps;
                let free_before = cache.pool().free_pages();
                let alloc = cache.alloc(need, &mut pages);
                model.sync_evicted(&cache);
                match alloc {
                    Ok(()) => {}
                    Err(CacheError::Pool(PoolError::OutOfPages { .. })) => {
                        prop_assert!(
                            free_before + evictable_before < need,
                            "alloc failed with room"
                        );
                        if let Some(l) = lock {
                            cache
                                .unlock(l)
                                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        }
                        continue;
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
                }
                let mut want_back = model.insert(*ns, key, &pages, ps);
                if tail_page {
                    want_back.push(*pages.last().unwrap_or(&PageId(u32::MAX)));
                }
                let mut back = Vec::new();
                let r = cache
                    .insert(namespace(*ns), key, &pages, &mut back)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: insert: {e}")))?;
                prop_assert_eq!(&back, &want_back, "step {}: pages handed back", step);
                prop_assert_eq!(r.prefix_len + r.stored_len, full * ps);
                cache
                    .free(&back)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Some(l) = lock {
                    cache
                        .unlock(l)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
                let mut got = Vec::new();
                cache.match_prefix(namespace(*ns), key, &mut got);
                prop_assert_eq!(
                    got,
                    model.matched(*ns, key, ps),
                    "step {}: match after insert",
                    step
                );
            }
            Op::Match { ns, key } => {
                let mut got = vec![PageId(12345)]; // match appends
                let m = cache.match_prefix(namespace(*ns), key, &mut got);
                let want = model.matched(*ns, key, ps);
                prop_assert_eq!(m.len, want.len() * ps);
                prop_assert_eq!(&got[1..], &want[..], "step {}: match", step);
            }
            Op::Lock { ns, key } => {
                let m = cache.match_prefix(namespace(*ns), key, &mut Vec::new());
                let handle = cache
                    .lock(m.position.node)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                locks.push(Locked {
                    handle,
                    ns: *ns,
                    key: key[..m.len].to_vec(),
                });
            }
            Op::Unlock { which } => {
                if !locks.is_empty() {
                    let l = locks.swap_remove(which % locks.len());
                    cache
                        .unlock(l.handle)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            Op::Evict { pages } => {
                let evictable = cache.stats().evictable_tokens / ps;
                let freed = cache.evict(*pages);
                prop_assert_eq!(freed, (*pages).min(evictable), "step {}: evict count", step);
                let gone = model.sync_evicted(&cache);
                prop_assert_eq!(gone, freed);
                prop_assert!(
                    model.prefix_closed(ps),
                    "step {}: eviction left a hole",
                    step
                );
            }
            Op::Reset => {
                if locks.is_empty() {
                    cache
                        .reset()
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    model.pages.clear();
                } else {
                    prop_assert_eq!(cache.reset(), Err(CacheError::Locked(locks.len())));
                }
            }
        }
        cache
            .check_invariants()
            .map_err(|e| TestCaseError::fail(format!("step {step} {op:?}: {e}")))?;
        prop_assert_eq!(
            cache.pool().tree_pages(),
            model.pages.len(),
            "step {}: tree pages",
            step
        );
        prop_assert_eq!(cache.pool().caller_pages(), 0);
        prop_assert_eq!(cache.stats().held_locks, locks.len());
        for l in &locks {
            let got = model.matched(l.ns, &l.key, ps);
            prop_assert_eq!(
                got.len() * ps,
                l.key.len(),
                "step {}: a locked prefix was evicted",
                step
            );
        }
    }
    for l in locks.drain(..) {
        cache
            .unlock(l.handle)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    prop_assert_eq!(cache.evict(usize::MAX), model.pages.len());
    prop_assert_eq!(cache.pool().free_pages(), pool_pages);
    cache
        .check_invariants()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    Ok(())
}

fn policy() -> impl Strategy<Value = EvictionPolicy> {
    prop_oneof![
        Just(EvictionPolicy::Lru),
        Just(EvictionPolicy::Lfu),
        Just(EvictionPolicy::Fifo),
        Just(EvictionPolicy::Priority),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        rng_seed: prop::test_runner::RngSeed::Fixed(0x5eed_2ad1),
        ..ProptestConfig::default()
    })]

    #[test]
    fn cache_matches_the_model(
        ps in 1usize..4,
        pool_pages in 6usize..40,
        policy in policy(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        run(ps, pool_pages, policy, &ops)?;
    }
}
