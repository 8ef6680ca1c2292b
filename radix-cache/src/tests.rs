//! Scenario tests of the tree; the randomized differential test is `tests/differential.rs`.

use crate::*;

const NS: Namespace = Namespace::DEFAULT;

fn cache(pages: usize, ps: usize) -> RadixCache {
    RadixCache::new(CacheConfig::new(pages, ps).with_page_tracking(true)).unwrap()
}

/// Allocates pages for `tokens` (full pages only), inserts, frees what comes back.
fn put(c: &mut RadixCache, ns: Namespace, tokens: &[u32]) -> Vec<PageId> {
    let mut pages = Vec::new();
    c.alloc(tokens.len() / c.page_size(), &mut pages).unwrap();
    let mut back = Vec::new();
    c.insert(ns, tokens, &pages, &mut back).unwrap();
    c.free(&back).unwrap();
    c.check_invariants().unwrap();
    pages
}

fn get(c: &mut RadixCache, ns: Namespace, tokens: &[u32]) -> (usize, Vec<PageId>) {
    let mut out = Vec::new();
    let m = c.match_prefix(ns, tokens, &mut out);
    assert_eq!(out.len() * c.page_size(), m.len);
    (m.len, out)
}

#[test]
fn split_inside_a_node() {
    let mut c = cache(64, 2);
    let a = put(&mut c, NS, &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(c.stats().nodes, 2);
    let b = put(&mut c, NS, &[1, 2, 3, 4, 9, 9]);
    // root, shared upper [1 2 3 4], two leaves
    assert_eq!(c.stats().nodes, 4);
    assert_eq!(get(&mut c, NS, &[1, 2, 3, 4, 5, 6, 7, 8]), (8, a.clone()));
    assert_eq!(
        get(&mut c, NS, &[1, 2, 3, 4, 9, 9, 1]),
        (6, vec![a[0], a[1], b[2]])
    );
    assert_eq!(c.stats().tokens, 10);
    assert_eq!(c.pool().caller_pages(), 0);
    assert_eq!(
        c.pool().tree_pages(),
        5,
        "the duplicate pages went back to the pool"
    );
}

#[test]
fn match_never_splits() {
    let mut c = cache(64, 1);
    put(&mut c, NS, &[1, 2, 3, 4, 5, 6]);
    let nodes = c.stats().nodes;
    for cut in 0..6 {
        let mut probe: Vec<u32> = (1..=cut).collect();
        probe.push(99);
        let mut out = Vec::new();
        let m = c.match_prefix(NS, &probe, &mut out);
        assert_eq!(m.len, cut as usize);
        if cut > 0 {
            assert_eq!(m.position.offset, cut as usize);
        }
    }
    assert_eq!(c.stats().nodes, nodes);
    c.check_invariants().unwrap();
}

#[test]
fn page_aligned_truncation() {
    let mut c = cache(64, 4);
    let tokens: Vec<u32> = (10..20).collect(); // 2 full pages + 2
    let mut pages = Vec::new();
    c.alloc(3, &mut pages).unwrap();
    let mut back = Vec::new();
    let r = c.insert(NS, &tokens, &pages, &mut back).unwrap();
    assert_eq!((r.prefix_len, r.stored_len), (0, 8));
    assert_eq!(back, vec![pages[2]]);
    c.free(&back).unwrap();
    assert_eq!(get(&mut c, NS, &tokens[..7]), (4, vec![pages[0]]));
    assert_eq!(get(&mut c, NS, &tokens), (8, pages[..2].to_vec()));
    // A key shorter than a page caches nothing.
    let r = c.insert(NS, &[1, 2, 3], &[], &mut back).unwrap();
    assert_eq!(r.stored_len, 0);
    // Page lists that do not cover the key are refused.
    let err = c.insert(NS, &tokens, &pages[..1], &mut back).unwrap_err();
    assert!(matches!(
        err,
        CacheError::PageCount {
            full: 2,
            pages: 1,
            ..
        }
    ));
    c.check_invariants().unwrap();
}

#[test]
fn duplicate_inserts_hand_back_the_callers_pages() {
    let mut c = cache(64, 2);
    let key = [1, 2, 3, 4, 5, 6];
    let first = put(&mut c, NS, &key);
    // The same key again with fresh pages: all of them come back.
    let mut fresh = Vec::new();
    c.alloc(3, &mut fresh).unwrap();
    let mut back = Vec::new();
    let r = c.insert(NS, &key, &fresh, &mut back).unwrap();
    assert_eq!((r.prefix_len, r.stored_len), (6, 0));
    assert_eq!(back, fresh);
    c.free(&back).unwrap();
    // The lifecycle form: the matched tree pages plus new ones; only new ones are taken.
    let (_, mut pages) = get(&mut c, NS, &key);
    c.alloc(1, &mut pages).unwrap();
    back.clear();
    let r = c
        .insert(NS, &[1, 2, 3, 4, 5, 6, 7, 8], &pages, &mut back)
        .unwrap();
    assert_eq!((r.prefix_len, r.stored_len), (6, 2));
    assert!(back.is_empty());
    assert_eq!(get(&mut c, NS, &[1, 2, 3, 4, 5, 6, 7, 8]).1[..3], first[..]);
    // Inserting a page the caller does not hold is refused and changes nothing.
    let err = c.insert(NS, &[9, 9], &[first[0]], &mut back).unwrap_err();
    assert!(matches!(err, CacheError::Pool(PoolError::NotHeld { .. })));
    assert!(back.is_empty());
    c.check_invariants().unwrap();
}

#[test]
fn locked_nodes_survive_evicting_everything() {
    let mut c = cache(64, 1);
    put(&mut c, NS, &[1, 2, 3, 4]);
    put(&mut c, NS, &[1, 2, 7, 8]);
    put(&mut c, NS, &[5, 6]);
    let mut out = Vec::new();
    let m = c.match_prefix(NS, &[1, 2, 7, 8], &mut out);
    let lock = c.lock(m.position.node).unwrap();
    assert_eq!(c.stats().protected_tokens, 4);
    c.check_invariants().unwrap();
    let freed = c.evict(usize::MAX);
    assert_eq!(freed, 4, "[3 4] and [5 6] go; [1 2] and [7 8] are locked");
    c.check_invariants().unwrap();
    assert_eq!(get(&mut c, NS, &[1, 2, 7, 8]), (4, out));
    assert_eq!(get(&mut c, NS, &[1, 2, 3, 4]).0, 2);
    assert!(matches!(c.reset(), Err(CacheError::Locked(1))));
    c.unlock(lock).unwrap();
    assert_eq!(c.stats().held_locks, 0);
    assert_eq!(c.evict(usize::MAX), 4);
    assert_eq!(c.stats().tokens, 0);
    assert_eq!(c.pool().free_pages(), 64);
    c.check_invariants().unwrap();
}

#[test]
fn namespaces_never_share() {
    let mut c = cache(64, 2);
    let a = Namespace::from_name("tenant-a");
    let b = Namespace::from_name("tenant-b");
    let pa = put(&mut c, a, &[1, 2, 3, 4]);
    assert_eq!(get(&mut c, b, &[1, 2, 3, 4]).0, 0);
    assert_eq!(get(&mut c, NS, &[1, 2, 3, 4]).0, 0);
    assert_eq!(c.stats().namespaces, 1, "lookups do not create namespaces");
    // A lock on a miss in an unknown namespace is valid and released like any other.
    let miss = c.match_prefix(Namespace(99), &[1, 2], &mut Vec::new());
    let h = c.lock(miss.position.node).unwrap();
    c.check_invariants().unwrap();
    c.unlock(h).unwrap();
    let pb = put(&mut c, b, &[1, 2, 3, 4]);
    assert_ne!(pa, pb);
    assert_eq!(get(&mut c, a, &[1, 2, 3, 4]).1, pa);
    assert_eq!(get(&mut c, b, &[1, 2, 3, 4]).1, pb);
    let mut ha = Vec::new();
    let mut hb = Vec::new();
    let pos_a = c.match_prefix(a, &[1, 2, 3, 4], &mut Vec::new()).position;
    let pos_b = c.match_prefix(b, &[1, 2, 3, 4], &mut Vec::new()).position;
    c.page_hashes(pos_a, &mut ha).unwrap();
    c.page_hashes(pos_b, &mut hb).unwrap();
    assert_ne!(ha, hb, "page names differ across namespaces");
    c.check_invariants().unwrap();
}

#[test]
fn page_hashes_chain_and_survive_splits() {
    let mut c = cache(64, 2);
    put(&mut c, NS, &[1, 2, 3, 4, 5, 6]);
    let pos = c
        .match_prefix(NS, &[1, 2, 3, 4, 5, 6], &mut Vec::new())
        .position;
    let mut h = Vec::new();
    c.page_hashes(pos, &mut h).unwrap();
    let h0 = page_hash(None, NS, &[1, 2]);
    let h1 = page_hash(Some(h0), NS, &[3, 4]);
    let h2 = page_hash(Some(h1), NS, &[5, 6]);
    assert_eq!(h, vec![h0, h1, h2]);
    put(&mut c, NS, &[1, 2, 3, 4, 7, 7]); // splits the hashed node
    c.check_invariants().unwrap();
    let pos = c
        .match_prefix(NS, &[1, 2, 3, 4, 7, 7], &mut Vec::new())
        .position;
    h.clear();
    c.page_hashes(pos, &mut h).unwrap();
    assert_eq!(h, vec![h0, h1, page_hash(Some(h1), NS, &[7, 7])]);
    c.check_invariants().unwrap();
}

#[test]
fn events_report_stores_removals_and_clears() {
    let mut c = RadixCache::new(
        CacheConfig::new(64, 2)
            .with_events(true)
            .with_page_tracking(true),
    )
    .unwrap();
    put(&mut c, NS, &[1, 2, 3, 4]);
    put(&mut c, NS, &[1, 2, 5, 6]);
    let ev: Vec<_> = c.drain_events().collect();
    let h0 = page_hash(None, NS, &[1, 2]);
    assert_eq!(
        ev,
        vec![
            KvEvent::Stored {
                namespace: NS,
                parent: None,
                hashes: vec![h0, page_hash(Some(h0), NS, &[3, 4])],
                tokens: vec![1, 2, 3, 4],
                page_size: 2,
            },
            KvEvent::Stored {
                namespace: NS,
                parent: Some(h0),
                hashes: vec![page_hash(Some(h0), NS, &[5, 6])],
                tokens: vec![5, 6],
                page_size: 2,
            },
        ]
    );
    assert_eq!(c.evict(1), 1);
    let ev: Vec<_> = c.drain_events().collect();
    assert_eq!(
        ev,
        vec![KvEvent::Removed {
            namespace: NS,
            hashes: vec![page_hash(Some(h0), NS, &[3, 4])]
        }]
    );
    c.reset().unwrap();
    assert_eq!(
        c.drain_events().collect::<Vec<_>>(),
        vec![KvEvent::AllCleared]
    );
    assert_eq!(c.pool().free_pages(), 64);
    c.check_invariants().unwrap();
}

/// Inserts three one-page leaves `[k]` under distinct first tokens.
fn three_leaves(policy: EvictionPolicy) -> RadixCache {
    let mut c = RadixCache::new(CacheConfig::new(16, 1).with_policy(policy)).unwrap();
    for k in [10, 20, 30] {
        let mut pages = Vec::new();
        c.alloc(1, &mut pages).unwrap();
        let prio = if k == 10 { 5 } else { 0 };
        c.insert_with_priority(NS, &[k], &pages, prio, &mut Vec::new())
            .unwrap();
    }
    c
}

/// Evicts one page; returns the keys still cached.
fn evict_one(c: &mut RadixCache) -> Vec<u32> {
    assert_eq!(c.evict(1), 1);
    c.check_invariants().unwrap();
    [10, 20, 30]
        .into_iter()
        .filter(|&k| c.match_prefix(NS, &[k], &mut Vec::new()).len == 1)
        .collect()
}

#[test]
fn eviction_policies_pick_the_least_valuable_leaf() {
    let mut lru = three_leaves(EvictionPolicy::Lru);
    lru.match_prefix(NS, &[10], &mut Vec::new());
    assert_eq!(lru.evict(1), 1);
    assert_eq!(
        get(&mut lru, NS, &[20]).0,
        0,
        "LRU: 20 is the least recently used"
    );

    let mut lfu = three_leaves(EvictionPolicy::Lfu);
    for _ in 0..3 {
        lfu.match_prefix(NS, &[10], &mut Vec::new());
        lfu.match_prefix(NS, &[20], &mut Vec::new());
    }
    lfu.match_prefix(NS, &[30], &mut Vec::new());
    assert_eq!(lfu.evict(1), 1);
    assert_eq!(
        get(&mut lfu, NS, &[30]).0,
        0,
        "LFU: 30 was used least often"
    );

    let mut fifo = three_leaves(EvictionPolicy::Fifo);
    fifo.match_prefix(NS, &[10], &mut Vec::new());
    assert_eq!(fifo.evict(1), 1);
    assert_eq!(
        get(&mut fifo, NS, &[10]).0,
        0,
        "FIFO: 10 was inserted first"
    );

    let mut prio = three_leaves(EvictionPolicy::Priority);
    assert_eq!(
        evict_one(&mut prio),
        vec![10, 30],
        "priority: 20 and 30 rank below 10, 20 is older"
    );
    assert_eq!(evict_one(&mut prio), vec![10]);
    assert_eq!(evict_one(&mut prio), Vec::<u32>::new());
}

#[test]
fn evict_trims_a_long_leaf_to_the_exact_count() {
    let mut c = cache(64, 2);
    let pages = put(&mut c, NS, &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(c.evict(1), 1);
    c.check_invariants().unwrap();
    assert_eq!(
        get(&mut c, NS, &[1, 2, 3, 4, 5, 6, 7, 8]),
        (6, pages[..3].to_vec())
    );
    assert_eq!(c.pool().free_pages(), 61);
}

#[test]
fn alloc_evicts_when_the_pool_is_short_and_fails_cleanly_when_all_is_locked() {
    let mut c = cache(4, 1);
    put(&mut c, NS, &[1, 2, 3]);
    let mut pages = Vec::new();
    c.alloc(2, &mut pages).unwrap();
    assert_eq!(c.stats().tokens, 2, "one page was evicted to make room");
    let m = c.match_prefix(NS, &[1, 2], &mut Vec::new());
    let lock = c.lock(m.position.node).unwrap();
    let err = c.alloc(1, &mut pages).unwrap_err();
    assert!(matches!(
        err,
        CacheError::Pool(PoolError::OutOfPages { .. })
    ));
    assert_eq!(pages.len(), 2);
    c.unlock(lock).unwrap();
    c.free(&pages).unwrap();
    c.check_invariants().unwrap();
}

#[test]
fn lock_handles_are_checked() {
    let mut a = cache(8, 1);
    let mut b = cache(8, 1);
    put(&mut a, NS, &[1]);
    let m = a.match_prefix(NS, &[1], &mut Vec::new());
    let h = a.lock(m.position.node).unwrap();
    assert_eq!(a.stats().held_locks, 1);
    assert_eq!(b.unlock(h), Err(CacheError::ForeignHandle));
    assert_eq!(
        a.stats().held_locks,
        1,
        "a lock given to the wrong cache stays held"
    );
    let h = a.lock(m.position.node).unwrap();
    a.unlock(h).unwrap();
    assert_eq!(a.stats().held_locks, 1);
    assert!(a.check_invariants().is_ok());
    assert!(matches!(
        a.lock(NodeId(1000, 0)),
        Err(CacheError::NoSuchNode(1000))
    ));
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "leaked radix cache lock")]
fn a_dropped_lock_panics_in_debug_builds() {
    let mut c = cache(8, 1);
    put(&mut c, NS, &[1]);
    let m = c.match_prefix(NS, &[1], &mut Vec::new());
    drop(c.lock(m.position.node).unwrap());
}

#[test]
fn full_match_after_partial_lookups_keeps_the_tree_shape() {
    let mut c = cache(4096, 1);
    let base: Vec<u32> = (0..1000).collect();
    put(&mut c, NS, &base);
    let nodes = c.stats().nodes;
    for cut in (1..1000).step_by(7) {
        let mut probe = base[..cut].to_vec();
        probe.push(5000);
        assert_eq!(get(&mut c, NS, &probe).0, cut);
    }
    assert_eq!(c.stats().nodes, nodes);
    assert_eq!(get(&mut c, NS, &base).0, 1000);
}

#[test]
fn tier_bits_are_recorded_and_survive_a_split() {
    let mut c = cache(64, 1);
    put(&mut c, NS, &[1, 2, 3, 4]);
    let pos = c.match_prefix(NS, &[1, 2, 3, 4], &mut Vec::new()).position;
    assert_eq!(c.tiers(pos.node), Some(TierSet::DEVICE));
    c.set_tiers(pos.node, TierSet::HOST.with(TierSet::STORED))
        .unwrap();
    let t = c.tiers(pos.node).unwrap();
    assert!(
        t.contains(TierSet::DEVICE) && t.contains(TierSet::HOST) && t.contains(TierSet::STORED)
    );
    put(&mut c, NS, &[1, 2, 9]);
    let upper = c.match_prefix(NS, &[1, 2], &mut Vec::new()).position.node;
    assert_eq!(
        c.tiers(upper),
        Some(t),
        "both halves of a split keep the tiers"
    );
    assert!(c.set_tiers(NodeId(999, 0), TierSet::HOST).is_err());
    c.check_invariants().unwrap();
}

#[test]
fn a_stale_node_id_names_nothing_after_its_slot_is_reused() {
    let mut c = cache(64, 1);
    put(&mut c, NS, &[1, 2]);
    let old = c.match_prefix(NS, &[1, 2], &mut Vec::new()).position.node;
    assert_eq!(c.evict(usize::MAX), 2);
    put(&mut c, NS, &[3, 4]);
    let new = c.match_prefix(NS, &[3, 4], &mut Vec::new()).position.node;
    assert_eq!(old.raw(), new.raw(), "the arena slot was reused");
    assert!(matches!(c.lock(old), Err(CacheError::NoSuchNode(_))));
    c.reset().unwrap();
    assert!(
        matches!(c.lock(new), Err(CacheError::NoSuchNode(_))),
        "ids do not survive a reset"
    );
    c.check_invariants().unwrap();
}

/// A cache built from `cfg` holding `tokens` (all full pages) as one edge: the cache, its
/// pages and the pages' hashes.
fn cached_edge(cfg: CacheConfig, tokens: &[u32]) -> (RadixCache, Vec<PageId>, Vec<PageHash>) {
    let mut c = RadixCache::new(cfg).unwrap();
    let n = tokens.len() / c.page_size();
    let mut pages = Vec::new();
    c.alloc(n, &mut pages).unwrap();
    let mut back = Vec::new();
    c.insert(Namespace::DEFAULT, tokens, &pages, &mut back)
        .unwrap();
    let mut got = Vec::new();
    let m = c.match_prefix(Namespace::DEFAULT, tokens, &mut got);
    let mut hashes = Vec::new();
    c.page_hashes(m.position, &mut hashes).unwrap();
    c.check_invariants().unwrap();
    (c, pages, hashes)
}

#[test]
fn the_root_hash_renames_every_page_and_nothing_else() {
    let tokens: Vec<u32> = (0..12).collect();
    let names = |cfg: CacheConfig| cached_edge(cfg, &tokens).2;
    let bare = names(CacheConfig::new(8, 4));
    let a = names(CacheConfig::new(8, 4).with_root_hash(PageHash(1)));
    let b = names(CacheConfig::new(8, 4).with_root_hash(PageHash(2)));
    assert_eq!(bare[0], page_hash(None, Namespace::DEFAULT, &tokens[..4]));
    assert_eq!(
        a[0],
        page_hash(Some(PageHash(1)), Namespace::DEFAULT, &tokens[..4])
    );
    assert_eq!(
        a[1],
        page_hash(Some(a[0]), Namespace::DEFAULT, &tokens[4..8])
    );
    assert!(a.iter().all(|h| !b.contains(h) && !bare.contains(h)));
}

#[test]
fn demoted_pages_come_with_the_hashes_they_had_in_the_tree() {
    let tokens: Vec<u32> = (0..6).collect();
    let (mut c, pages, hashes) = cached_edge(CacheConfig::new(4, 2).with_demote(true), &tokens);
    // Two more pages than are free: the leaf's last two pages go, tail first.
    let mut more = Vec::new();
    c.alloc(3, &mut more).unwrap();
    let mut demoted = c.drain_demoted();
    demoted.sort_by_key(|(_, p)| p.0);
    let mut want: Vec<(PageHash, PageId)> = hashes[1..]
        .iter()
        .copied()
        .zip(pages[1..].iter().copied())
        .collect();
    want.sort_by_key(|(_, p)| p.0);
    assert_eq!(demoted, want);
    assert!(c.drain_demoted().is_empty());
    c.check_invariants().unwrap();
}
