//! The radix tree: configuration, prefix match, insert with split, locks.

use crate::prefetch::{prefetch, prefetch_head};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::events::KvEvent;
use crate::hash::{child_key, page_hash_with, KeyBuild};
use crate::node::{Children, Node, TierSet};
use crate::pages::Pages;
use crate::pool::{PagePool, PoolError};
use crate::tier::PageHash;
use crate::tokens::Tokens;
use crate::types::{Namespace, NodeId, PageId, TokenId};

/// Which unlocked leaves [`RadixCache::evict`] frees first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Least recently matched or inserted first.
    #[default]
    Lru,
    /// Least frequently used first (ties: least recently used).
    Lfu,
    /// Oldest inserted first.
    Fifo,
    /// Lowest priority first (ties: least recently used); see
    /// [`RadixCache::insert_with_priority`].
    Priority,
}

/// How to build a [`RadixCache`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Pages in the KV pool.
    pub num_pages: usize,
    /// Tokens per page; only whole pages are cached.
    pub page_size: usize,
    /// Eviction order.
    pub policy: EvictionPolicy,
    /// Emit [`KvEvent`]s (and compute page hashes eagerly on insert to fill them).
    pub events: bool,
    /// Record every page's owner in the pool, so that misuse (a double free, inserting a
    /// page the caller does not hold) is an error instead of corruption. Default: on in
    /// debug builds, off in release builds, where it costs a byte write per page moved.
    pub track_pages: bool,
    /// The parent hash of every sequence's first page: the model's fingerprint (weights,
    /// quantization, KV layout and dtype), so that two models sharing a disk tier or a store
    /// never read each other's pages. `None`: 16 zero bytes, as in the bare format.
    pub root_hash: Option<PageHash>,
    /// Record every evicted page with its hash ([`RadixCache::drain_demoted`]), so that a
    /// write-back cache tier can copy it down before the page is reused.
    pub demote: bool,
}

impl CacheConfig {
    /// `num_pages` pages of `page_size` tokens, LRU, no events.
    pub fn new(num_pages: usize, page_size: usize) -> CacheConfig {
        CacheConfig {
            num_pages,
            page_size,
            policy: EvictionPolicy::Lru,
            events: false,
            track_pages: cfg!(debug_assertions),
            root_hash: None,
            demote: false,
        }
    }

    /// The same config with evicted pages recorded for a write-back tier (see
    /// [`CacheConfig::demote`]).
    pub fn with_demote(mut self, demote: bool) -> CacheConfig {
        self.demote = demote;
        self
    }

    /// The same config with the first page of every sequence chained on `root` (see
    /// [`CacheConfig::root_hash`]).
    pub fn with_root_hash(mut self, root: PageHash) -> CacheConfig {
        self.root_hash = Some(root);
        self
    }

    /// The same config with another eviction policy.
    pub fn with_policy(mut self, policy: EvictionPolicy) -> CacheConfig {
        self.policy = policy;
        self
    }

    /// The same config with per-page owner tracking on or off.
    pub fn with_page_tracking(mut self, track: bool) -> CacheConfig {
        self.track_pages = track;
        self
    }

    /// The same config with KV events on or off.
    pub fn with_events(mut self, events: bool) -> CacheConfig {
        self.events = events;
        self
    }
}

/// Why a cache operation failed. A failed operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// A page pool error (out of pages, a page not held by the caller, bad geometry).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// `insert` got a page list that does not cover the key's pages.
    #[error("{tokens} tokens at page size {page_size} need {full} pages (or {full}+1 with the partial tail page), got {pages}")]
    PageCount {
        /// Tokens in the key.
        tokens: usize,
        /// Tokens per page.
        page_size: usize,
        /// Full pages in the key.
        full: usize,
        /// Pages given.
        pages: usize,
    },
    /// The node id does not name a live node.
    #[error("node {0} does not exist")]
    NoSuchNode(u32),
    /// The lock handle belongs to another cache.
    #[error("lock handle belongs to another cache")]
    ForeignHandle,
    /// `reset` while requests hold locks.
    #[error("cannot reset the cache while {0} locks are held")]
    Locked(usize),
}

/// A place in the tree: `offset` tokens into `node`'s edge (`offset == 0` only at a root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// The node the match ended in.
    pub node: NodeId,
    /// Tokens of that node's edge that matched (a multiple of the page size).
    pub offset: usize,
}

/// What [`RadixCache::match_prefix`] found. The page ids were appended to the caller's vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatchResult {
    /// Matched tokens (a multiple of the page size).
    pub len: usize,
    /// Where the match ended; lock `position.node` to keep the matched pages.
    pub position: Position,
}

/// What [`RadixCache::insert`] did. Pages it did not take were appended to the caller's vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InsertResult {
    /// Tokens of the key that were already cached before this insert.
    pub prefix_len: usize,
    /// Tokens newly stored by this insert.
    pub stored_len: usize,
    /// Where the cached part of the key ends now.
    pub position: Position,
}

/// Counters and sizes of a [`RadixCache`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Live nodes, roots included.
    pub nodes: usize,
    /// Namespaces with a root.
    pub namespaces: usize,
    /// Tokens in the tree.
    pub tokens: usize,
    /// Tokens in unlocked nodes (evictable now or once their children go).
    pub evictable_tokens: usize,
    /// Tokens in locked nodes.
    pub protected_tokens: usize,
    /// Lock handles outstanding.
    pub held_locks: usize,
    /// Free pages in the pool.
    pub free_pages: usize,
    /// Pages held by callers.
    pub caller_pages: usize,
    /// `match_prefix` calls.
    pub match_calls: u64,
    /// Tokens asked for by `match_prefix`.
    pub queried_tokens: u64,
    /// Tokens `match_prefix` found cached (hit tokens).
    pub hit_tokens: u64,
    /// Tokens stored by `insert`.
    pub inserted_tokens: u64,
    /// Pages freed by eviction.
    pub evicted_pages: u64,
}

static NEXT_CACHE_ID: AtomicU32 = AtomicU32::new(1);

/// The RadixAttention index: a radix tree per namespace over token ids, whose edges are
/// whole KV pages owned by the tree. See the crate docs for the usage loop.
#[derive(Debug)]
pub struct RadixCache {
    pub(crate) cfg: CacheConfig,
    pub(crate) pool: PagePool,
    pub(crate) nodes: Vec<Node>,
    pub(crate) free_nodes: Vec<NodeId>,
    pub(crate) roots: HashMap<Namespace, NodeId, KeyBuild>,
    /// Unlocked non-root leaves ordered by the policy's key: `(key0, key1, node)`.
    pub(crate) evictable: BTreeSet<(u64, u64, u32)>,
    pub(crate) evictable_tokens: usize,
    pub(crate) protected_tokens: usize,
    pub(crate) tree_tokens: usize,
    pub(crate) held_locks: usize,
    pub(crate) tick: u64,
    pub(crate) events: Vec<KvEvent>,
    /// Pages evicted since the last [`RadixCache::drain_demoted`] (with `demote` on).
    pub(crate) demoted: Vec<(PageHash, PageId)>,
    pub(crate) stats: CacheStats,
    pub(crate) id: u32,
    /// The root that positions of namespaces without a tree point at (no tokens, no
    /// children, in no namespace): a lookup never creates a namespace.
    pub(crate) void: Option<NodeId>,
    scratch: Vec<u8>,
    path: Vec<NodeId>,
}

impl RadixCache {
    /// Assuming the whole edge of `c` matches (the usual case), finds the node the walk
    /// visits next (the child of `c` under the key's page at `next`) and starts loading its
    /// first tokens, so that those memory misses overlap the comparison of `c`'s edge instead
    /// of following it.
    ///
    /// An insert passes its page ids as `pages` (a match passes none): if `c` has no such
    /// child, the insert's new part starts at `next`, and the first lines of its tokens and
    /// page ids start loading too.
    #[inline]
    fn prefetch_next(&self, c: &Node, key: &[TokenId], next: usize, pages: &[PageId]) {
        let ps = self.cfg.page_size;
        if next + ps > key.len() {
            return;
        }
        if let Some(g) = c.children.get(child_key(&key[next..next + ps])) {
            let t = self.nodes[g.idx()].tokens.as_ptr();
            for line in 0..4 {
                prefetch(t.wrapping_add(64 * line));
            }
        } else if !pages.is_empty() {
            prefetch_head(&key[next..]);
            prefetch_head(&pages[next / ps..]);
        }
    }

    /// How many tokens of `c`'s edge match `key[pos..]`. On a long edge the first `HEAD`
    /// tokens are compared first; the next node is looked up after them (its key token has
    /// arrived by then), so that its memory misses overlap the rest of the comparison.
    /// `pages`: an insert's page ids, see [`RadixCache::prefetch_next`].
    #[inline]
    fn match_edge(&self, c: &Node, key: &[TokenId], pos: usize, pages: &[PageId]) -> usize {
        const HEAD: usize = 256;
        let rest = &key[pos..];
        let next = pos + c.tokens.len();
        if c.tokens.len() <= HEAD || next >= key.len() {
            self.prefetch_next(c, key, next, pages);
            return c.tokens.common_prefix(rest);
        }
        prefetch(key[next..].as_ptr());
        let head = c.tokens.common_prefix(&rest[..HEAD]);
        if head < HEAD {
            return head;
        }
        self.prefetch_next(c, key, next, pages);
        HEAD + c.tokens.common_prefix_from(HEAD, &rest[HEAD..])
    }
}

/// Starts loading the first lines of a request's tokens (their first miss then overlaps the
/// next ones instead of preceding them).
#[inline]
fn prefetch_key(key: &[TokenId]) {
    for t in (0..key.len().min(256)).step_by(16) {
        prefetch(key[t..].as_ptr());
    }
}

/// Length of the common prefix of `a` and `b`: equal blocks are skipped with the C library's
/// vectorised `memcmp`, the block that differs is searched 16 tokens at a time.
#[inline]
pub(crate) fn common_prefix(a: &[TokenId], b: &[TokenId]) -> usize {
    const BLOCK: usize = 256;
    const W: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    while i + BLOCK <= n && a[i..i + BLOCK] == b[i..i + BLOCK] {
        i += BLOCK;
    }
    for (ca, cb) in a[i..].chunks_exact(W).zip(b[i..].chunks_exact(W)) {
        let mut d = 0;
        for j in 0..W {
            d |= ca[j] ^ cb[j];
        }
        if d != 0 {
            break;
        }
        i += W;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

impl RadixCache {
    /// An empty cache over a fresh pool.
    pub fn new(cfg: CacheConfig) -> Result<RadixCache, CacheError> {
        let pool = PagePool::with_tracking(cfg.num_pages, cfg.page_size, cfg.track_pages)?;
        Ok(RadixCache {
            cfg,
            pool,
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            roots: HashMap::default(),
            evictable: BTreeSet::new(),
            evictable_tokens: 0,
            protected_tokens: 0,
            tree_tokens: 0,
            held_locks: 0,
            tick: 0,
            events: Vec::new(),
            demoted: Vec::new(),
            stats: CacheStats::default(),
            id: NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed),
            void: None,
            scratch: Vec::new(),
            path: Vec::new(),
        })
    }

    /// The configuration the cache was built with.
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.cfg.page_size
    }

    /// The page pool (counts and page states).
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }

    /// Appends `n` pages to `out` for the caller, evicting unlocked leaves first if the pool
    /// is short; all or nothing.
    pub fn alloc(&mut self, n: usize, out: &mut Vec<PageId>) -> Result<(), CacheError> {
        let free = self.pool.free_pages();
        if n > free {
            self.evict(n - free);
        }
        Ok(self.pool.alloc(n, out)?)
    }

    /// Returns pages the caller holds (duplicates handed back by `insert`, an aborted
    /// request's pages) to the pool; all or nothing.
    pub fn free(&mut self, pages: &[PageId]) -> Result<(), CacheError> {
        Ok(self.pool.free(pages)?)
    }

    /// Sizes and counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            nodes: self.nodes.len() - self.free_nodes.len(),
            namespaces: self.roots.len(),
            tokens: self.tree_tokens,
            evictable_tokens: self.evictable_tokens,
            protected_tokens: self.protected_tokens,
            held_locks: self.held_locks,
            free_pages: self.pool.free_pages(),
            caller_pages: self.pool.caller_pages(),
            ..self.stats.clone()
        }
    }

    /// Takes the pages evicted since the last call, each with its hash (none unless
    /// [`CacheConfig::demote`] is on). Their bytes are intact until someone writes them: the
    /// caller of the `alloc` that evicted them (which may have received some of them) must
    /// copy them down before it runs anything over those pages.
    pub fn drain_demoted(&mut self) -> Vec<(PageHash, PageId)> {
        std::mem::take(&mut self.demoted)
    }

    /// Takes the KV events recorded since the last call (none unless
    /// [`CacheConfig::events`] is on).
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, KvEvent> {
        self.events.drain(..)
    }

    /// The tiers holding `node`'s pages.
    pub fn tiers(&self, node: NodeId) -> Option<TierSet> {
        self.live(node).map(|n| n.tiers)
    }

    /// Records that copies of `node`'s pages now exist in (or left) the host and stored tiers,
    /// as the HiCache write-back reports them. The device tier is the tree's own business
    /// (a node in the tree has its device pages), so `DEVICE` in `tiers` is ignored.
    pub fn set_tiers(&mut self, node: NodeId, tiers: TierSet) -> Result<(), CacheError> {
        if self.live(node).is_none() {
            return Err(CacheError::NoSuchNode(node.0));
        }
        let n = &mut self.nodes[node.idx()];
        n.tiers = tiers.without(TierSet::DEVICE).with(TierSet::DEVICE);
        Ok(())
    }

    /// Live node by id.
    pub(crate) fn live(&self, node: NodeId) -> Option<&Node> {
        self.nodes
            .get(node.idx())
            .filter(|n| n.alive && n.gen == node.1)
    }

    fn root_of(&mut self, ns: Namespace) -> NodeId {
        if let Some(&r) = self.roots.get(&ns) {
            return r;
        }
        let id = self.new_node_id();
        let node = Node::new_root(id, ns, self.tick);
        self.put_node(id, node);
        self.roots.insert(ns, id);
        id
    }

    fn void_root(&mut self) -> NodeId {
        if let Some(v) = self.void {
            return v;
        }
        let id = self.new_node_id();
        let node = Node::new_root(id, Namespace(u64::MAX), self.tick);
        self.put_node(id, node);
        self.void = Some(id);
        id
    }

    fn new_node_id(&mut self) -> NodeId {
        match self.free_nodes.pop() {
            Some(id) => NodeId(id.0, id.1.wrapping_add(1)),
            None => NodeId(self.nodes.len() as u32, 0),
        }
    }

    fn put_node(&mut self, id: NodeId, node: Node) {
        if id.idx() == self.nodes.len() {
            self.nodes.push(node);
        } else {
            self.nodes[id.idx()] = node;
        }
    }

    /// The eviction-order key of a node under the configured policy.
    fn policy_key(&self, n: &Node) -> (u64, u64) {
        match self.cfg.policy {
            EvictionPolicy::Lru => (n.last_access, n.created),
            EvictionPolicy::Lfu => (n.hits, n.last_access),
            EvictionPolicy::Fifo => (n.created, 0),
            EvictionPolicy::Priority => (
                (i64::from(n.priority) - i64::from(i32::MIN)) as u64,
                n.last_access,
            ),
        }
    }

    /// Puts the node into or out of the evictable set as it is or is not an unlocked leaf.
    ///
    /// A listed node's key is not updated when it is used: every policy's key only grows, so
    /// a stale entry sorts too early, and `evict` re-files it under its current key when it
    /// reaches the front. Lookups therefore never touch the set.
    pub(crate) fn refresh(&mut self, id: NodeId) {
        let n = &self.nodes[id.idx()];
        let want = !n.is_root && n.alive && n.lock == 0 && n.is_leaf();
        match (want, n.evict_key) {
            (true, None) => {
                let (a, b) = self.policy_key(n);
                self.evictable.insert((a, b, id.0));
                self.nodes[id.idx()].evict_key = Some((a, b));
            }
            (false, Some((a, b))) => {
                self.evictable.remove(&(a, b, id.0));
                self.nodes[id.idx()].evict_key = None;
            }
            _ => {}
        }
    }

    /// The node's current eviction key (its listed key may be older and smaller).
    pub(crate) fn current_key(&self, id: NodeId) -> (u64, u64) {
        self.policy_key(&self.nodes[id.idx()])
    }

    #[inline]
    fn touch(&mut self, id: NodeId) {
        let n = &mut self.nodes[id.idx()];
        n.last_access = self.tick;
        n.hits += 1;
    }

    /// Finds the longest cached page-aligned prefix of `tokens` in namespace `ns`, appends its
    /// page ids to `out` and marks the path as used. Never restructures the tree.
    pub fn match_prefix(
        &mut self,
        ns: Namespace,
        tokens: &[TokenId],
        out: &mut Vec<PageId>,
    ) -> MatchResult {
        self.tick += 1;
        self.stats.match_calls += 1;
        self.stats.queried_tokens += tokens.len() as u64;
        let ps = self.cfg.page_size;
        let key = &tokens[..tokens.len() / ps * ps];
        prefetch_key(key);
        let Some(&root) = self.roots.get(&ns) else {
            let node = self.void_root();
            return MatchResult {
                len: 0,
                position: Position { node, offset: 0 },
            };
        };
        self.touch(root);
        let mut node = root;
        let mut offset = 0;
        let mut pos = 0;
        while pos < key.len() {
            let Some(child) = self.nodes[node.idx()]
                .children
                .get(child_key(&key[pos..pos + ps]))
            else {
                break;
            };
            let c = &self.nodes[child.idx()];
            let m = self.match_edge(c, key, pos, &[]) / ps * ps;
            if m == 0 {
                break;
            }
            c.pages.extend_prefix(m / ps, out);
            let whole = m == c.tokens.len();
            pos += m;
            self.touch(child);
            node = child;
            offset = m;
            if !whole {
                break;
            }
        }
        self.stats.hit_tokens += pos as u64;
        MatchResult {
            len: pos,
            position: Position { node, offset },
        }
    }

    /// [`RadixCache::insert_with_priority`] with priority 0.
    pub fn insert(
        &mut self,
        ns: Namespace,
        tokens: &[TokenId],
        pages: &[PageId],
        returned: &mut Vec<PageId>,
    ) -> Result<InsertResult, CacheError> {
        self.insert_with_priority(ns, tokens, pages, 0, returned)
    }

    /// Caches the full pages of `tokens` in namespace `ns`, with `pages[i]` holding tokens
    /// `i*page_size..(i+1)*page_size`. `pages` has one id per full page, plus optionally the
    /// partial tail page. Where a prefix is already cached, the tree keeps its own pages and
    /// the caller's differing pages for it are appended to `returned`, as is the tail page;
    /// the caller frees those. Splits the node where the new key leaves it. Nodes on the path
    /// get at least `priority` (used by [`EvictionPolicy::Priority`]).
    pub fn insert_with_priority(
        &mut self,
        ns: Namespace,
        tokens: &[TokenId],
        pages: &[PageId],
        priority: i32,
        returned: &mut Vec<PageId>,
    ) -> Result<InsertResult, CacheError> {
        let ps = self.cfg.page_size;
        let full = tokens.len() / ps;
        let has_tail = !tokens.len().is_multiple_of(ps);
        if pages.len() != full && !(has_tail && pages.len() == full + 1) {
            return Err(CacheError::PageCount {
                tokens: tokens.len(),
                page_size: ps,
                full,
                pages: pages.len(),
            });
        }
        let key = &tokens[..full * ps];
        prefetch_key(key);
        let (kpages, tail) = pages.split_at(full);
        prefetch_head(kpages);
        self.tick += 1;
        let root = self.root_of(ns);

        // Read-only walk: how much is cached, which of the caller's pages duplicate it.
        let start = returned.len();
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        path.push(root);
        let mut node = root;
        let mut offset = 0;
        let mut pos = 0;
        let mut blocked = false;
        while pos < key.len() {
            let Some(child) = self.nodes[node.idx()]
                .children
                .get(child_key(&key[pos..pos + ps]))
            else {
                break;
            };
            let c = &self.nodes[child.idx()];
            let m = self.match_edge(c, key, pos, kpages) / ps * ps;
            if m == 0 {
                // A child-key collision: another edge owns this key; leave the rest uncached.
                blocked = true;
                break;
            }
            c.pages
                .hand_back(&kpages[pos / ps..(pos + m) / ps], returned);
            pos += m;
            path.push(child);
            node = child;
            offset = m;
            if m < c.tokens.len() {
                break;
            }
        }
        let new_pages = if blocked {
            &[][..]
        } else {
            &kpages[pos / ps..]
        };
        if blocked {
            returned.extend_from_slice(&kpages[pos / ps..]);
        }
        returned.extend_from_slice(tail);
        // The new edge's tokens and pages in the tree's form, in one pass over both.
        let (edge_tokens, edge_pages) = if new_pages.is_empty() {
            (Tokens::default(), Pages::EMPTY)
        } else {
            Tokens::with_pages(&key[pos..], new_pages)
        };
        // Validates every page and moves the new ones to the tree.
        let new_pages = match self
            .pool
            .take_for_tree(new_pages, edge_pages, &returned[start..])
        {
            Ok(p) => p,
            Err(e) => {
                returned.truncate(start);
                self.path = path;
                return Err(e.into());
            }
        };

        // Mutate: split where the key leaves an edge, hang the rest below.
        let mut end = Position { node, offset };
        if !new_pages.is_empty() {
            if node != root && offset < self.nodes[node.idx()].tokens.len() {
                let upper = self.split(node, offset);
                let last = path.len() - 1;
                path[last] = upper;
                node = upper;
            }
            let leaf = self.add_leaf(node, ns, edge_tokens, new_pages, priority);
            end = Position {
                node: leaf,
                offset: key.len() - pos,
            };
        }
        for &id in &path {
            let n = &mut self.nodes[id.idx()];
            n.priority = n.priority.max(priority);
            self.touch(id);
        }
        self.path = path;
        let stored = if blocked { 0 } else { key.len() - pos };
        self.stats.inserted_tokens += stored as u64;
        self.debug_check_counts();
        Ok(InsertResult {
            prefix_len: pos,
            stored_len: stored,
            position: end,
        })
    }

    /// Splits `id` after `at` tokens; returns the new upper node (which takes `id`'s place
    /// under its parent). Locks, recency and tiers carry over to both halves.
    fn split(&mut self, id: NodeId, at: usize) -> NodeId {
        let ps = self.cfg.page_size;
        let upper_id = self.new_node_id();
        let n = &mut self.nodes[id.idx()];
        let key = n.tokens.first_key(ps);
        let tail_tokens = n.tokens.split_off(at);
        let lower_key = tail_tokens.first_key(ps);
        let tail_pages = n.pages.split_off(at / ps);
        let tail_hashes = if n.hashes.is_empty() {
            Vec::new()
        } else {
            n.hashes.split_off(at / ps)
        };
        let upper = Node {
            tokens: std::mem::replace(&mut n.tokens, tail_tokens),
            pages: std::mem::replace(&mut n.pages, tail_pages),
            hashes: std::mem::replace(&mut n.hashes, tail_hashes),
            children: Children::Few(vec![(lower_key, id)]),
            parent: n.parent,
            namespace: n.namespace,
            lock: n.lock,
            last_access: n.last_access,
            created: n.created,
            hits: n.hits,
            priority: n.priority,
            evict_key: None,
            tiers: n.tiers,
            alive: true,
            is_root: false,
            gen: upper_id.1,
        };
        let parent = n.parent;
        n.parent = upper_id;
        self.put_node(upper_id, upper);
        self.nodes[parent.idx()].children.insert(key, upper_id);
        upper_id
    }

    fn add_leaf(
        &mut self,
        parent: NodeId,
        ns: Namespace,
        tokens: Tokens,
        pages: Pages,
        priority: i32,
    ) -> NodeId {
        let ps = self.cfg.page_size;
        let id = self.new_node_id();
        let key = tokens.first_key(ps);
        let len = tokens.len();
        let node = Node {
            tokens,
            pages,
            hashes: Vec::new(),
            children: Children::None,
            parent,
            namespace: ns,
            lock: 0,
            last_access: self.tick,
            created: self.tick,
            hits: 0,
            priority,
            evict_key: None,
            tiers: TierSet::DEVICE,
            alive: true,
            is_root: false,
            gen: id.1,
        };
        self.put_node(id, node);
        self.nodes[parent.idx()].children.insert(key, id);
        self.evictable_tokens += len;
        self.tree_tokens += len;
        self.refresh(parent);
        self.refresh(id);
        if self.cfg.events {
            self.ensure_hashes(id);
            let n = &self.nodes[id.idx()];
            // Routers see `None` at the start of a sequence, whatever the root hash.
            let parent_hash = self.nodes[parent.idx()].hashes.last().copied();
            self.events.push(KvEvent::Stored {
                namespace: ns,
                parent: parent_hash,
                hashes: n.hashes.clone(),
                tokens: n.tokens.to_vec(),
                page_size: ps,
            });
        }
        id
    }

    /// The hash a child of `parent` chains its first page on: the parent's last page, or at
    /// a root the configured [`CacheConfig::root_hash`].
    pub(crate) fn parent_hash(&self, parent: NodeId) -> Option<PageHash> {
        let p = &self.nodes[parent.idx()];
        if p.is_root {
            self.cfg.root_hash
        } else {
            p.hashes.last().copied()
        }
    }

    /// Computes missing page hashes on the path from the root to `id`.
    pub(crate) fn ensure_hashes(&mut self, id: NodeId) {
        let mut todo = std::mem::take(&mut self.path);
        let keep = todo.len();
        let mut cur = id;
        loop {
            let n = &self.nodes[cur.idx()];
            if n.is_root || n.hashes.len() == n.pages.len() {
                break;
            }
            todo.push(cur);
            cur = n.parent;
        }
        let ps = self.cfg.page_size;
        for i in (keep..todo.len()).rev() {
            let id = todo[i];
            let parent = self.nodes[id.idx()].parent;
            let mut prev = self.parent_hash(parent);
            let mut hashes = Vec::with_capacity(self.nodes[id.idx()].pages.len());
            let n = &self.nodes[id.idx()];
            let mut page = Vec::with_capacity(ps);
            for i in 0..n.pages.len() {
                page.clear();
                n.tokens.extend_range(i * ps..(i + 1) * ps, &mut page);
                let h = page_hash_with(&mut self.scratch, prev, n.namespace, &page);
                hashes.push(h);
                prev = Some(h);
            }
            self.nodes[id.idx()].hashes = hashes;
        }
        todo.truncate(keep);
        self.path = todo;
    }

    /// Appends the hashes of the pages from the root to `pos` (the first `pos.offset` tokens
    /// of its node) to `out`, computing any that are missing. This names the pages in the
    /// lower tiers and on the wire.
    pub fn page_hashes(
        &mut self,
        pos: Position,
        out: &mut Vec<PageHash>,
    ) -> Result<(), CacheError> {
        let n = self
            .live(pos.node)
            .ok_or(CacheError::NoSuchNode(pos.node.0))?;
        let offset = pos.offset.min(n.tokens.len());
        self.ensure_hashes(pos.node);
        let start = out.len();
        let mut cur = pos.node;
        let mut take = offset / self.cfg.page_size;
        while !self.nodes[cur.idx()].is_root {
            let n = &self.nodes[cur.idx()];
            out.extend(n.hashes[..take].iter().rev());
            cur = n.parent;
            take = self.nodes[cur.idx()].hashes.len();
        }
        out[start..].reverse();
        Ok(())
    }

    #[inline]
    pub(crate) fn debug_check_counts(&self) {
        debug_assert_eq!(
            self.evictable_tokens + self.protected_tokens,
            self.tree_tokens
        );
        debug_assert_eq!(
            self.pool.tree_pages() * self.cfg.page_size,
            self.tree_tokens
        );
    }
}
