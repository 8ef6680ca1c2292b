//! A node's page ids (and a free chunk of the pool): a run of consecutive ids when they are
//! consecutive, an explicit list otherwise.
//!
//! A request's pages usually come from the pool in one piece (fresh ids, or the tail of a
//! freed run), so they are consecutive. Storing such an edge as `(start, len)` instead of one
//! `u32` per page removes a quarter of a page-size-1 match's memory traffic (the page ids it
//! would read), the page vector's allocation and first-touch page faults on insert, and makes
//! splitting, trimming and freeing an edge's pages O(1).

use std::ops::Range;

use crate::prefetch::{prefetch_ahead, prefetch_head};
use crate::types::PageId;

/// Page ids in order: `start..start + len`, or any list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pages {
    /// `len` consecutive ids from `start` (`start + len` fits a `u32`).
    Run { start: u32, len: u32 },
    /// Ids that are not one run.
    List(Vec<PageId>),
}

impl Default for Pages {
    fn default() -> Pages {
        Pages::EMPTY
    }
}

/// Lanes compared at once (one AVX-512 register of `u32`s).
const W: usize = 16;

/// Whether a run starting at `first` with `len` ids fits a `u32` (a run cannot pass
/// `u32::MAX`; checked apart so that the lanes below cannot wrap).
fn run_fits(first: u32, len: usize) -> bool {
    len == 0
        || u32::try_from(len - 1)
            .ok()
            .and_then(|n| first.checked_add(n))
            .is_some()
}

/// The bits in which `p` differs from `base, base + 1, …` (zero when it is that run), without
/// an early exit so that it compiles to whole-register compares.
#[inline]
fn run_gaps(p: &[PageId], base: u32) -> u32 {
    p.iter()
        .enumerate()
        .fold(0, |d, (j, x)| d | (x.0 ^ base.wrapping_add(j as u32)))
}

/// Whether `p` is `p[0], p[0] + 1, …`, 16 ids at a time.
fn is_run(p: &[PageId]) -> bool {
    let Some(first) = p.first() else {
        return true;
    };
    let first = first.0;
    if !run_fits(first, p.len()) {
        return false;
    }
    let mut base = first;
    let mut chunks = p.chunks_exact(W);
    prefetch_head(p);
    for (k, c) in (&mut chunks).enumerate() {
        prefetch_ahead(p, k * W);
        if run_gaps(c, base) != 0 {
            return false;
        }
        base = base.wrapping_add(W as u32);
    }
    run_gaps(chunks.remainder(), base) == 0
}

/// The ids of `c` that differ from `base, base + 1, …`.
fn differ(base: u32, c: &[PageId]) -> impl Iterator<Item = PageId> + '_ {
    c.iter()
        .enumerate()
        .filter(move |&(j, x)| x.0 != base.wrapping_add(j as u32))
        .map(|(_, x)| *x)
}

/// [`Pages::from_slice`] fed piece by piece (for a pass that reads the pages along with
/// something else): the pieces are the slice in order.
pub(crate) struct RunCheck {
    first: u32,
    next: u32,
    gaps: u32,
}

impl RunCheck {
    /// A check of the slice that starts with `first` (any value for an empty slice).
    pub(crate) fn new(first: Option<PageId>) -> RunCheck {
        let first = first.map_or(0, |p| p.0);
        RunCheck {
            first,
            next: first,
            gaps: 0,
        }
    }

    /// Checks the next piece of the slice.
    #[inline]
    pub(crate) fn feed(&mut self, piece: &[PageId]) {
        self.gaps |= run_gaps(piece, self.next);
        self.next = self.next.wrapping_add(piece.len() as u32);
    }

    /// The whole slice (`all`, every piece fed) in the tree's form.
    pub(crate) fn finish(self, all: &[PageId]) -> Pages {
        if self.gaps == 0 && run_fits(self.first, all.len()) {
            Pages::Run {
                start: self.first,
                len: all.len() as u32,
            }
        } else {
            Pages::List(all.to_vec())
        }
    }
}

impl Pages {
    /// No pages.
    pub(crate) const EMPTY: Pages = Pages::Run { start: 0, len: 0 };

    /// `p` as a run when it is one, else as a list.
    pub(crate) fn from_slice(p: &[PageId]) -> Pages {
        if is_run(p) {
            Pages::Run {
                start: p.first().map_or(0, |x| x.0),
                len: p.len() as u32,
            }
        } else {
            Pages::List(p.to_vec())
        }
    }

    /// `v` as a run when it is one, else as the list itself (no copy).
    pub(crate) fn from_vec(v: Vec<PageId>) -> Pages {
        if is_run(&v) {
            Pages::Run {
                start: v.first().map_or(0, |x| x.0),
                len: v.len() as u32,
            }
        } else {
            Pages::List(v)
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        match self {
            Pages::Run { len, .. } => *len as usize,
            Pages::List(v) => v.len(),
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the first `n` ids to `out`.
    #[inline]
    pub(crate) fn extend_prefix(&self, n: usize, out: &mut Vec<PageId>) {
        match self {
            Pages::Run { start, .. } => extend_run(*start, n, out),
            Pages::List(v) => out.extend_from_slice(&v[..n]),
        }
    }

    /// Appends the last `n` ids to `out`.
    pub(crate) fn extend_suffix(&self, n: usize, out: &mut Vec<PageId>) {
        match self {
            Pages::Run { start, len } => extend_run(start + len - n as u32, n, out),
            Pages::List(v) => out.extend_from_slice(&v[v.len() - n..]),
        }
    }

    /// Splits off the ids from `at` on, keeping `..at`.
    pub(crate) fn split_off(&mut self, at: usize) -> Pages {
        match self {
            Pages::Run { start, len } => {
                let at = at as u32;
                let tail = Pages::Run {
                    start: *start + at,
                    len: *len - at,
                };
                *len = at;
                tail
            }
            Pages::List(v) => Pages::from_vec(v.split_off(at)),
        }
    }

    /// Drops the last `n` ids.
    pub(crate) fn truncate_by(&mut self, n: usize) {
        match self {
            Pages::Run { len, .. } => *len -= n as u32,
            Pages::List(v) => v.truncate(v.len() - n),
        }
    }

    /// The ids in order.
    pub(crate) fn iter(&self) -> Iter<'_> {
        match self {
            Pages::Run { start, len } => Iter::Run(*start..*start + *len),
            Pages::List(v) => Iter::List(v.iter()),
        }
    }

    /// Appends to `returned` the ids of `mine` that differ from the same places of `self`
    /// (`mine` is no longer than `self`), 16 at a time.
    pub(crate) fn hand_back(&self, mine: &[PageId], returned: &mut Vec<PageId>) {
        match self {
            Pages::List(theirs) => {
                let theirs = &theirs[..mine.len()];
                if theirs == mine {
                    return;
                }
                for (t, c) in theirs.chunks(W).zip(mine.chunks(W)) {
                    let same = t.iter().zip(c).filter(|(a, b)| a == b).count();
                    if same == 0 {
                        returned.extend_from_slice(c);
                    } else if same < c.len() {
                        returned.extend(t.iter().zip(c).filter(|(a, b)| a != b).map(|(_, b)| *b));
                    }
                }
            }
            Pages::Run { start, .. } => {
                // Whole steps of `W` ids: the usual step (all of the caller's ids differ)
                // is one compare and one register-sized copy.
                returned.reserve(mine.len());
                let mut base = *start;
                let (chunks, rest) = mine.as_chunks::<W>();
                for (k, c) in chunks.iter().enumerate() {
                    prefetch_ahead(mine, k * W);
                    let mut same = false;
                    for (j, x) in c.iter().enumerate() {
                        same |= x.0 == base.wrapping_add(j as u32);
                    }
                    if same {
                        returned.extend(differ(base, c));
                    } else {
                        returned.extend_from_slice(c);
                    }
                    base = base.wrapping_add(W as u32);
                }
                returned.extend(differ(base, rest));
            }
        }
    }

    /// The largest id, if any.
    pub(crate) fn max(&self) -> Option<u32> {
        match self {
            Pages::Run { start, len } => (*len > 0).then(|| start + len - 1),
            Pages::List(v) => v.iter().map(|p| p.0).max(),
        }
    }
}

/// The iterator of [`Pages::iter`].
pub(crate) enum Iter<'a> {
    Run(Range<u32>),
    List(std::slice::Iter<'a, PageId>),
}

impl Iterator for Iter<'_> {
    type Item = PageId;

    #[inline]
    fn next(&mut self) -> Option<PageId> {
        match self {
            Iter::Run(r) => r.next().map(PageId),
            Iter::List(it) => it.next().copied(),
        }
    }
}

/// Appends `start..start + n` to `out`.
#[inline]
fn extend_run(start: u32, n: usize, out: &mut Vec<PageId>) {
    out.extend((start..start + n as u32).map(PageId));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<PageId> {
        v.iter().map(|&p| PageId(p)).collect()
    }

    #[test]
    fn runs_are_found_and_lists_kept() {
        let run: Vec<u32> = (7..60).collect();
        assert_eq!(
            Pages::from_slice(&ids(&run)),
            Pages::Run { start: 7, len: 53 }
        );
        let mut broken = run.clone();
        broken[40] = 3;
        assert!(matches!(Pages::from_slice(&ids(&broken)), Pages::List(_)));
        broken[40] = 47;
        broken[52] = 0;
        assert!(matches!(Pages::from_slice(&ids(&broken)), Pages::List(_)));
        assert_eq!(Pages::from_slice(&[]), Pages::EMPTY);
        // A run may end at u32::MAX but not wrap past it.
        assert!(matches!(
            Pages::from_slice(&ids(&[u32::MAX - 1, u32::MAX])),
            Pages::Run { .. }
        ));
        assert!(matches!(
            Pages::from_slice(&ids(&[u32::MAX, 0])),
            Pages::List(_)
        ));
    }

    #[test]
    fn run_and_list_agree() {
        let v: Vec<u32> = (100..140).collect();
        let run = Pages::from_slice(&ids(&v));
        let list = Pages::List(ids(&v));
        for p in [&run, &list] {
            let mut out = Vec::new();
            p.extend_prefix(5, &mut out);
            p.extend_suffix(3, &mut out);
            assert_eq!(out, ids(&[100, 101, 102, 103, 104, 137, 138, 139]));
            assert_eq!(p.max(), Some(139));
            let mut mine = ids(&v[..35]);
            mine[3] = PageId(7);
            mine[20] = PageId(9);
            let mut back = Vec::new();
            p.hand_back(&mine, &mut back);
            assert_eq!(back, ids(&[7, 9]));
            let mut q = p.clone();
            let tail = q.split_off(10);
            assert_eq!((q.len(), tail.len()), (10, 30));
            let all: Vec<PageId> = q.iter().chain(tail.iter()).collect();
            assert_eq!(all, ids(&v));
            q.truncate_by(4);
            assert_eq!(q.len(), 6);
        }
    }
}
