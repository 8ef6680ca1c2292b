//! Tree nodes, their child maps and their tier state.

use std::collections::HashMap;

use crate::hash::KeyBuild;
use crate::pages::Pages;
use crate::tier::PageHash;
use crate::tokens::Tokens;
use crate::types::{Namespace, NodeId};

/// Where a node's pages live in the hierarchical cache, as a caller records it
/// ([`crate::RadixCache::set_tiers`]).
///
/// The tree itself sets only [`TierSet::DEVICE`] (a node in the tree has its pages in the
/// executor's KV pool). The runtime's lower tiers (host RAM, disk) are indexed by
/// [`crate::PageHash`] in a [`crate::store::PageStore`], not by tree nodes: a node evicted from
/// the device leaves the tree while its lower copies stay, and a match is continued by hash
/// below the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TierSet(pub u8);

impl TierSet {
    /// The node's pages are in the device KV pool (its `pages` are valid page ids).
    pub const DEVICE: TierSet = TierSet(1);
    /// A copy of the node's pages is in host memory.
    pub const HOST: TierSet = TierSet(2);
    /// A copy of the node's pages is in a lower tier (disk or remote store), named by hash.
    pub const STORED: TierSet = TierSet(4);

    /// Whether every tier in `other` is in `self`.
    pub fn contains(self, other: TierSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the tiers of `other` added.
    pub fn with(self, other: TierSet) -> TierSet {
        TierSet(self.0 | other.0)
    }

    /// `self` with the tiers of `other` removed.
    pub fn without(self, other: TierSet) -> TierSet {
        TierSet(self.0 & !other.0)
    }
}

/// Children of a node keyed by their first page: a short vector searched linearly while
/// small, a hash map once a node fans out.
#[derive(Debug, Default)]
pub(crate) enum Children {
    #[default]
    None,
    Few(Vec<(u64, NodeId)>),
    Many(HashMap<u64, NodeId, KeyBuild>),
}

/// Above this many children a node switches to a hash map.
const FEW_MAX: usize = 8;

impl Children {
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<NodeId> {
        match self {
            Children::None => None,
            Children::Few(v) => v.iter().find(|(k, _)| *k == key).map(|&(_, n)| n),
            Children::Many(m) => m.get(&key).copied(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Children::None => 0,
            Children::Few(v) => v.len(),
            Children::Many(m) => m.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Inserts or replaces the child under `key`.
    pub(crate) fn insert(&mut self, key: u64, node: NodeId) {
        match self {
            Children::None => *self = Children::Few(vec![(key, node)]),
            Children::Few(v) => {
                if let Some(slot) = v.iter_mut().find(|(k, _)| *k == key) {
                    slot.1 = node;
                } else if v.len() < FEW_MAX {
                    v.push((key, node));
                } else {
                    let mut m: HashMap<u64, NodeId, KeyBuild> =
                        HashMap::with_capacity_and_hasher(2 * FEW_MAX, KeyBuild::default());
                    m.extend(v.iter().copied());
                    m.insert(key, node);
                    *self = Children::Many(m);
                }
            }
            Children::Many(m) => {
                m.insert(key, node);
            }
        }
    }

    pub(crate) fn remove(&mut self, key: u64) -> Option<NodeId> {
        match self {
            Children::None => None,
            Children::Few(v) => {
                let i = v.iter().position(|(k, _)| *k == key)?;
                let (_, n) = v.swap_remove(i);
                if v.is_empty() {
                    *self = Children::None;
                }
                Some(n)
            }
            Children::Many(m) => m.remove(&key),
        }
    }

    pub(crate) fn for_each(&self, mut f: impl FnMut(u64, NodeId)) {
        match self {
            Children::None => {}
            Children::Few(v) => v.iter().for_each(|&(k, n)| f(k, n)),
            Children::Many(m) => m.iter().for_each(|(&k, &n)| f(k, n)),
        }
    }
}

/// One node: an edge of whole pages below its parent.
#[derive(Debug)]
pub(crate) struct Node {
    /// The edge's token ids; a multiple of `page_size` long (empty only for a root).
    pub(crate) tokens: Tokens,
    /// One page id per `page_size` tokens of the edge (a run when consecutive).
    pub(crate) pages: Pages,
    /// Hashes of the edge's pages: empty until computed, then one per page.
    pub(crate) hashes: Vec<PageHash>,
    pub(crate) children: Children,
    /// Parent node; a root points at itself.
    pub(crate) parent: NodeId,
    pub(crate) namespace: Namespace,
    /// Locks held on this node or below it.
    pub(crate) lock: u32,
    /// Logical time of the last match or insert through this node.
    pub(crate) last_access: u64,
    /// Logical time the node was created.
    pub(crate) created: u64,
    /// Matches and inserts through this node.
    pub(crate) hits: u64,
    /// Eviction priority (higher survives longer under the priority policy).
    pub(crate) priority: i32,
    /// The key under which the node sits in the evictable set, if it is there.
    pub(crate) evict_key: Option<(u64, u64)>,
    pub(crate) tiers: TierSet,
    pub(crate) alive: bool,
    pub(crate) is_root: bool,
    /// Generation of this arena slot (see [`NodeId`]).
    pub(crate) gen: u32,
}

impl Node {
    pub(crate) fn new_root(id: NodeId, namespace: Namespace, now: u64) -> Node {
        Node {
            tokens: Tokens::default(),
            pages: Pages::EMPTY,
            hashes: Vec::new(),
            children: Children::None,
            parent: id,
            namespace,
            lock: 0,
            last_access: now,
            created: now,
            hits: 0,
            priority: 0,
            evict_key: None,
            tiers: TierSet::DEVICE,
            alive: true,
            is_root: true,
            gen: id.1,
        }
    }

    #[inline]
    pub(crate) fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }
}
