//! The page-id allocator.
//!
//! A [`PagePool`] hands out ids of KV pages (`page_size` token slots each) and takes them
//! back. Every page is in exactly one state — free, held by a caller, or owned by the tree —
//! and the pool records that state per page, so a double free, a free of a tree page or an
//! insert of a page the caller does not hold is an error, not silent corruption.
//!
//! The per-page state costs a byte write per page on every alloc, free, insert and eviction
//! (at page size 1 that is most of the cost of evicting millions of tokens), so it is on by
//! default in debug builds and a choice in release builds ([`PagePool::with_tracking`],
//! [`crate::CacheConfig::track_pages`]); without it the pool still checks ids and counts.
//!
//! Free pages are kept as a stack of chunks, each a run of consecutive ids or a list:
//! eviction hands a node's pages over without copying them, and never-used ids are handed out
//! from a counter, so a pool of millions of pages costs nothing until it is used. Allocations
//! come from the top chunk, so a request's pages are usually one run, which the tree stores
//! as `(start, len)`.

use crate::pages::Pages;
use crate::types::PageId;

/// Why a pool operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The pool was created with a page size of zero or more pages than a `u32` can name.
    #[error("invalid pool geometry: {0}")]
    InvalidConfig(String),
    /// Fewer free pages than asked for; nothing was allocated.
    #[error("out of pages: asked for {requested}, {available} free")]
    OutOfPages {
        /// Pages requested.
        requested: usize,
        /// Pages free at the time.
        available: usize,
    },
    /// A page id outside the pool.
    #[error("page {0} is not in the pool")]
    UnknownPage(u32),
    /// More pages given back than callers hold (found without per-page tracking).
    #[error("{given} pages given back, but callers hold only {held}")]
    TooMany {
        /// Pages given.
        given: usize,
        /// Pages callers hold.
        held: usize,
    },
    /// A page the caller does not hold (it is free, or owned by the tree, or listed twice).
    #[error("page {page} is not held by the caller (it is {state})")]
    NotHeld {
        /// The page id.
        page: u32,
        /// Where the page actually is.
        state: &'static str,
    },
}

/// Who owns a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PageState {
    /// On the free list.
    Free = 0,
    /// Allocated to a caller (a running request).
    Caller = 1,
    /// Owned by the radix tree.
    Tree = 2,
}

impl PageState {
    fn name(self) -> &'static str {
        match self {
            PageState::Free => "free",
            PageState::Caller => "held by a caller",
            PageState::Tree => "owned by the tree",
        }
    }

    fn from_u8(v: u8) -> PageState {
        match v {
            0 => PageState::Free,
            1 => PageState::Caller,
            _ => PageState::Tree,
        }
    }
}

/// The page-id allocator: a free list over `num_pages` ids of `page_size` tokens each.
#[derive(Debug)]
pub struct PagePool {
    page_size: usize,
    num_pages: u32,
    /// Ids `next_fresh..num_pages` were never handed out.
    next_fresh: u32,
    /// Returned ids, as a stack of chunks (a chunk is often an evicted node's pages).
    chunks: Vec<Pages>,
    /// Pages in `chunks` plus never-used ids.
    free: usize,
    /// Pages held by callers.
    caller: usize,
    /// Per-page [`PageState`] as `u8`; empty when tracking is off.
    state: Vec<u8>,
    track: bool,
}

impl PagePool {
    /// A pool of `num_pages` pages of `page_size` tokens each, tracking every page's owner in
    /// debug builds.
    pub fn new(num_pages: usize, page_size: usize) -> Result<PagePool, PoolError> {
        PagePool::with_tracking(num_pages, page_size, cfg!(debug_assertions))
    }

    /// A pool that tracks every page's owner (`track`), so that a double free or an insert
    /// of a page the caller does not hold is an error, or only checks ids and counts.
    pub fn with_tracking(
        num_pages: usize,
        page_size: usize,
        track: bool,
    ) -> Result<PagePool, PoolError> {
        if page_size == 0 {
            return Err(PoolError::InvalidConfig(
                "page_size must be at least 1".into(),
            ));
        }
        let n = u32::try_from(num_pages).map_err(|_| {
            PoolError::InvalidConfig(format!("{num_pages} pages do not fit u32 page ids"))
        })?;
        Ok(PagePool {
            page_size,
            num_pages: n,
            next_fresh: 0,
            chunks: Vec::new(),
            free: num_pages,
            caller: 0,
            state: if track {
                vec![PageState::Free as u8; num_pages]
            } else {
                Vec::new()
            },
            track,
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages in the pool.
    pub fn total_pages(&self) -> usize {
        self.num_pages as usize
    }

    /// Pages on the free list.
    pub fn free_pages(&self) -> usize {
        self.free
    }

    /// Pages held by callers (allocated and not yet freed or inserted into the tree).
    pub fn caller_pages(&self) -> usize {
        self.caller
    }

    /// Pages owned by the tree.
    pub fn tree_pages(&self) -> usize {
        self.num_pages as usize - self.free - self.caller
    }

    /// Whether the pool records every page's owner.
    pub fn tracks_pages(&self) -> bool {
        self.track
    }

    /// Who owns `page`, or `None` for an id outside the pool or when tracking is off.
    pub fn state(&self, page: PageId) -> Option<PageState> {
        self.state.get(page.index()).map(|&s| PageState::from_u8(s))
    }

    /// Appends `n` free pages to `out`, now held by the caller; all or nothing.
    pub fn alloc(&mut self, n: usize, out: &mut Vec<PageId>) -> Result<(), PoolError> {
        if n > self.free {
            return Err(PoolError::OutOfPages {
                requested: n,
                available: self.free,
            });
        }
        let start = out.len();
        let mut need = n;
        while need > 0 {
            let Some(chunk) = self.chunks.last_mut() else {
                break;
            };
            let k = need.min(chunk.len());
            chunk.extend_suffix(k, out);
            chunk.truncate_by(k);
            if chunk.is_empty() {
                self.chunks.pop();
            }
            need -= k;
        }
        if need > 0 {
            // `need <= free - chunk pages = num_pages - next_fresh`, so this cannot overflow.
            let first = self.next_fresh;
            self.next_fresh += need as u32;
            out.extend((first..self.next_fresh).map(PageId));
        }
        if self.track {
            for p in &out[start..] {
                self.state[p.index()] = PageState::Caller as u8;
            }
        }
        self.free -= n;
        self.caller += n;
        Ok(())
    }

    /// Returns pages the caller holds to the free list; all or nothing.
    pub fn free(&mut self, pages: &[PageId]) -> Result<(), PoolError> {
        self.check_held(pages)?;
        if self.track {
            for p in pages {
                self.state[p.index()] = PageState::Free as u8;
            }
        }
        match self.chunks.last_mut() {
            Some(Pages::List(last)) if last.len() < 4096 => last.extend_from_slice(pages),
            _ if !pages.is_empty() => self.chunks.push(Pages::from_slice(pages)),
            _ => {}
        }
        self.free += pages.len();
        self.caller -= pages.len();
        Ok(())
    }

    /// Checks that every page in `pages` is held by the caller, once (without tracking: that
    /// the ids are in the pool and no more than callers hold); changes nothing.
    pub fn check_held(&mut self, pages: &[PageId]) -> Result<(), PoolError> {
        self.check_held_lists(&[pages])
    }

    /// [`PagePool::check_held`] over several lists at once: an id in two lists is an error.
    pub(crate) fn check_held_lists(&mut self, lists: &[&[PageId]]) -> Result<(), PoolError> {
        if !self.track {
            return self.check_counts(lists.iter().map(|l| l.len()).sum(), lists);
        }
        // Mark as we go to catch ids listed twice, then restore.
        let mut bad = None;
        let mut marked = 0;
        for p in lists.iter().flat_map(|l| l.iter()) {
            match self.state.get(p.index()) {
                None => {
                    bad = Some(PoolError::UnknownPage(p.0));
                    break;
                }
                Some(&s) if s != PageState::Caller as u8 => {
                    let state = if s == MARK {
                        "listed twice"
                    } else {
                        PageState::from_u8(s).name()
                    };
                    bad = Some(PoolError::NotHeld { page: p.0, state });
                    break;
                }
                Some(_) => {
                    self.state[p.index()] = MARK;
                    marked += 1;
                }
            }
        }
        for p in lists.iter().flat_map(|l| l.iter()).take(marked) {
            self.state[p.index()] = PageState::Caller as u8;
        }
        bad.map_or(Ok(()), Err)
    }

    /// Moves `new` (caller-held) into the tree after checking that `also` (pages about to be
    /// handed back) are caller-held too and that no id appears twice in either list; `pages`
    /// is `new` in the tree's form, returned on success. On error nothing changes.
    pub(crate) fn take_for_tree(
        &mut self,
        new: &[PageId],
        pages: Pages,
        also: &[PageId],
    ) -> Result<Pages, PoolError> {
        debug_assert_eq!(pages.len(), new.len());
        if !self.track {
            if let Some(m) = pages.max().filter(|&m| m >= self.num_pages) {
                let bad = new
                    .iter()
                    .find(|p| p.0 >= self.num_pages)
                    .map_or(m, |p| p.0);
                return Err(PoolError::UnknownPage(bad));
            }
            self.check_counts(new.len() + also.len(), &[also])?;
            self.caller -= new.len();
            return Ok(pages);
        }
        let mut taken = 0;
        let mut bad = None;
        for p in new {
            match self.state.get(p.index()) {
                Some(&s) if s == PageState::Caller as u8 => {
                    self.state[p.index()] = PageState::Tree as u8;
                    taken += 1;
                }
                Some(&s) => {
                    // A page already marked `Tree` by this loop is listed twice.
                    let listed_twice = new[..taken].contains(p);
                    let state = if listed_twice {
                        "listed twice"
                    } else {
                        PageState::from_u8(s).name()
                    };
                    bad = Some(PoolError::NotHeld { page: p.0, state });
                    break;
                }
                None => {
                    bad = Some(PoolError::UnknownPage(p.0));
                    break;
                }
            }
        }
        if bad.is_none() {
            if let Err(e) = self.check_held_lists(&[also]) {
                bad = Some(match e {
                    // A handed-back page that is also a new one shows up as a tree page.
                    PoolError::NotHeld { page, .. } if new.contains(&PageId(page)) => {
                        PoolError::NotHeld {
                            page,
                            state: "listed twice",
                        }
                    }
                    e => e,
                });
            }
        }
        if let Some(e) = bad {
            for p in &new[..taken] {
                self.state[p.index()] = PageState::Caller as u8;
            }
            return Err(e);
        }
        self.caller -= new.len();
        Ok(pages)
    }

    /// The checks possible without tracking: ids in range, no more pages than callers hold.
    fn check_counts(&self, given: usize, lists: &[&[PageId]]) -> Result<(), PoolError> {
        let n = self.num_pages;
        for l in lists {
            // A test without early exit vectorises; the error path finds the culprit.
            if l.iter().fold(false, |out, p| out | (p.0 >= n)) {
                let bad = l.iter().find(|p| p.0 >= n).map_or(n, |p| p.0);
                return Err(PoolError::UnknownPage(bad));
            }
        }
        if given > self.caller {
            return Err(PoolError::TooMany {
                given,
                held: self.caller,
            });
        }
        Ok(())
    }

    /// Takes a removed node's pages back onto the free list without copying them.
    pub(crate) fn release_from_tree(&mut self, pages: Pages) {
        if self.track {
            for p in pages.iter() {
                debug_assert_eq!(self.state[p.index()], PageState::Tree as u8);
                self.state[p.index()] = PageState::Free as u8;
            }
        }
        self.free += pages.len();
        if !pages.is_empty() {
            self.chunks.push(pages);
        }
    }

    /// Every free page id (never-used ids included), for invariant checks.
    pub(crate) fn for_each_free(&self, mut f: impl FnMut(PageId)) {
        for c in &self.chunks {
            c.iter().for_each(&mut f);
        }
        (self.next_fresh..self.num_pages).map(PageId).for_each(f);
    }
}

/// Temporary state while checking a list for repeated ids.
const MARK: u8 = 0xff;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_round_trip_and_double_free() {
        let mut pool = PagePool::with_tracking(8, 4, true).unwrap();
        let mut got = Vec::new();
        pool.alloc(5, &mut got).unwrap();
        assert_eq!(got.len(), 5);
        assert_eq!((pool.free_pages(), pool.caller_pages()), (3, 5));
        assert!(matches!(
            pool.alloc(4, &mut got),
            Err(PoolError::OutOfPages { .. })
        ));
        assert_eq!(got.len(), 5, "a failed alloc appends nothing");
        pool.free(&got[..2]).unwrap();
        assert!(matches!(
            pool.free(&got[..1]),
            Err(PoolError::NotHeld { .. })
        ));
        assert!(matches!(
            pool.free(&[got[3], got[3]]),
            Err(PoolError::NotHeld { .. })
        ));
        assert_eq!(
            pool.state(got[3]),
            Some(PageState::Caller),
            "failed free restores state"
        );
        assert!(matches!(
            pool.free(&[PageId(99)]),
            Err(PoolError::UnknownPage(99))
        ));
        let mut more = Vec::new();
        pool.alloc(5, &mut more).unwrap();
        let mut all: Vec<_> = got[2..].iter().chain(&more).map(|p| p.0).collect();
        all.sort_unstable();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        assert_eq!(pool.free_pages(), 0);
    }

    #[test]
    fn untracked_pool_still_checks_ids_and_counts() {
        let mut pool = PagePool::with_tracking(8, 1, false).unwrap();
        let mut got = Vec::new();
        pool.alloc(2, &mut got).unwrap();
        assert_eq!(pool.state(got[0]), None);
        assert!(matches!(
            pool.free(&[PageId(8)]),
            Err(PoolError::UnknownPage(8))
        ));
        assert!(matches!(
            pool.free(&[got[0], got[1], got[0]]),
            Err(PoolError::TooMany { given: 3, held: 2 })
        ));
        pool.free(&got).unwrap();
        assert_eq!(pool.free_pages(), 8);
    }

    #[test]
    fn bad_geometry_is_an_error() {
        assert!(PagePool::new(4, 0).is_err());
    }
}
