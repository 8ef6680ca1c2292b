//! A node's edge tokens: two bytes a token when every token of the edge fits (vocabularies
//! up to 65,536 entries: Llama 2, Mistral, GPT-2, SmolLM2, …), four otherwise.
//!
//! A full match reads the request's tokens and the tree's; halving the tree's side removes a
//! quarter of the bytes a page-size-1 match moves, and an insert writes (and faults in) half
//! as much new memory. The choice is per edge and invisible outside this module: every
//! comparison, key and hash sees the same `u32` values either way.

use crate::pages::{Pages, RunCheck};
use crate::prefetch::{prefetch, prefetch_ahead, prefetch_write};
use crate::types::{PageId, TokenId};

/// The token ids of one edge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tokens {
    /// Every token is below 65,536.
    Narrow(Vec<u16>),
    /// Some token needs more than 16 bits.
    Wide(Vec<TokenId>),
}

impl Default for Tokens {
    fn default() -> Tokens {
        Tokens::Narrow(Vec::new())
    }
}

/// Tokens compared per step of the narrow comparison.
const W: usize = 32;

/// Tokens narrowed per step of [`Tokens::with_pages`] (1 KiB read, 512 bytes written).
const BLOCK: usize = 256;

/// How far ahead of the narrowing copy (in tokens) its destination is prefetched for writing.
const WRITE_AHEAD: usize = 2 * BLOCK;

/// How far ahead of the comparison (in tokens) lines are prefetched.
const AHEAD: usize = 1024;

impl Tokens {
    /// `t` in the narrowest form that holds it.
    #[cfg(test)]
    pub(crate) fn from_slice(t: &[TokenId]) -> Tokens {
        Tokens::with_pages(t, &[]).0
    }

    /// `t` in the narrowest form that holds it, and `pages` (the ids of `t`'s pages) in the
    /// tree's form, in one pass over both: a new edge's tokens and page ids are in main
    /// memory (the caller wrote them a while ago), and reading the two streams side by side
    /// overlaps their misses.
    ///
    /// One block of `BLOCK` tokens at a time: gather the bits above 16 (a wide token, rare,
    /// makes the narrow copy moot), then narrow the block; both loops compile to whole-register
    /// operations. The lines ahead of both reads, and of the writes into the new buffer, are
    /// prefetched.
    pub(crate) fn with_pages(t: &[TokenId], pages: &[PageId]) -> (Tokens, Pages) {
        let mut v: Vec<u16> = Vec::with_capacity(t.len());
        let mut high = 0;
        let mut run = RunCheck::new(pages.first().copied());
        // Pages per block: `pages` holds one id per page of `t` (or none).
        let per_block = if t.is_empty() {
            pages.len().max(1)
        } else {
            (BLOCK * pages.len()).div_ceil(t.len()).max(1)
        };
        let mut page_blocks = pages.chunks(per_block);
        for (k, block) in t.chunks(BLOCK).enumerate() {
            let at = k * BLOCK;
            for off in (0..block.len()).step_by(16) {
                prefetch_ahead(t, at + off);
            }
            if let Some(p) = page_blocks.next() {
                for off in (0..p.len()).step_by(16) {
                    prefetch_ahead(pages, k * per_block + off);
                }
                run.feed(p);
            }
            if at + WRITE_AHEAD < t.len() {
                let dst = v.as_ptr().wrapping_add(at + WRITE_AHEAD).cast::<u8>();
                for line in 0..(2 * BLOCK).div_ceil(64) {
                    prefetch_write(dst.wrapping_add(64 * line));
                }
            }
            high |= block.iter().fold(0, |a, &x| a | x);
            v.extend(block.iter().map(|&x| x as u16));
        }
        for p in page_blocks {
            run.feed(p);
        }
        let tokens = if high >> 16 == 0 {
            Tokens::Narrow(v)
        } else {
            Tokens::Wide(t.to_vec())
        };
        (tokens, run.finish(pages))
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        match self {
            Tokens::Narrow(v) => v.len(),
            Tokens::Wide(v) => v.len(),
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address of the first token (for prefetching).
    #[inline]
    pub(crate) fn as_ptr(&self) -> *const u8 {
        match self {
            Tokens::Narrow(v) => v.as_ptr().cast(),
            Tokens::Wide(v) => v.as_ptr().cast(),
        }
    }

    /// The child key of the edge's first page (see [`crate::hash::child_key`]); the edge
    /// holds at least `page_size` tokens.
    #[inline]
    pub(crate) fn first_key(&self, page_size: usize) -> u64 {
        match self {
            Tokens::Narrow(v) => crate::hash::child_key(&v[..page_size]),
            Tokens::Wide(v) => crate::hash::child_key(&v[..page_size]),
        }
    }

    /// Length of the common prefix of the edge and `key`.
    #[inline]
    pub(crate) fn common_prefix(&self, key: &[TokenId]) -> usize {
        match self {
            Tokens::Narrow(v) => common_prefix_narrow(v, key),
            Tokens::Wide(v) => crate::cache::common_prefix(v, key),
        }
    }

    /// Length of the common prefix of the edge from token `start` on and `key`.
    #[inline]
    pub(crate) fn common_prefix_from(&self, start: usize, key: &[TokenId]) -> usize {
        match self {
            Tokens::Narrow(v) => common_prefix_narrow(&v[start..], key),
            Tokens::Wide(v) => crate::cache::common_prefix(&v[start..], key),
        }
    }

    /// Splits off the tokens from `at` on, keeping `..at`.
    pub(crate) fn split_off(&mut self, at: usize) -> Tokens {
        match self {
            Tokens::Narrow(v) => Tokens::Narrow(v.split_off(at)),
            Tokens::Wide(v) => Tokens::Wide(v.split_off(at)),
        }
    }

    /// Keeps the first `n` tokens.
    pub(crate) fn truncate(&mut self, n: usize) {
        match self {
            Tokens::Narrow(v) => v.truncate(n),
            Tokens::Wide(v) => v.truncate(n),
        }
    }

    /// Tokens `range` as `u32`s, appended to `out`.
    pub(crate) fn extend_range(&self, range: std::ops::Range<usize>, out: &mut Vec<TokenId>) {
        match self {
            Tokens::Narrow(v) => out.extend(v[range].iter().map(|&x| u32::from(x))),
            Tokens::Wide(v) => out.extend_from_slice(&v[range]),
        }
    }

    /// All tokens as `u32`s.
    pub(crate) fn to_vec(&self) -> Vec<TokenId> {
        let mut out = Vec::with_capacity(self.len());
        self.extend_range(0..self.len(), &mut out);
        out
    }
}

/// Length of the common prefix of a narrow edge and a key, 32 tokens a step (the widening
/// compare vectorises), then token by token inside the step that differs.
///
/// Both sides are usually in main memory (the request is new, the tree is large), and the
/// hardware prefetcher stops at every 4 KiB page and restarts slowly, so the loop asks for
/// the lines `AHEAD` tokens on itself, and for the first `AHEAD` tokens up front.
#[inline]
fn common_prefix_narrow(a: &[u16], b: &[TokenId]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    for t in (0..n.min(AHEAD)).step_by(32) {
        prefetch(b[t..].as_ptr());
        prefetch(b[t..].as_ptr().wrapping_add(16));
        prefetch(a[t..].as_ptr());
    }
    let mut i = 0;
    for (ca, cb) in a.chunks_exact(W).zip(b.chunks_exact(W)) {
        if i + AHEAD < n {
            prefetch(b[i + AHEAD..].as_ptr());
            prefetch(b[i + AHEAD..].as_ptr().wrapping_add(16));
            prefetch(a[i + AHEAD..].as_ptr());
        }
        let mut d = 0;
        for j in 0..W {
            d |= u32::from(ca[j]) ^ cb[j];
        }
        if d != 0 {
            break;
        }
        i += W;
    }
    while i < n && u32::from(a[i]) == b[i] {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_pages_agrees_with_separate_passes() {
        let ids = |v: Vec<u32>| v.into_iter().map(PageId).collect::<Vec<_>>();
        for ps in [1, 2, 3, 16, 300] {
            for n in [0, 1, 5, 85, 86, 257, 1000] {
                let t: Vec<u32> = (0..n * ps).map(|i| (i as u32 * 7919) % 65_536).collect();
                let mut wide = t.clone();
                if let Some(x) = wide.last_mut() {
                    *x = 70_000;
                }
                let run: Vec<u32> = (0..n as u32).map(|i| 1_000 + i).collect();
                let mut cases = vec![run.clone()];
                for at in [0, 1, 84, 85, 86, 255, 256, 999] {
                    if at < n {
                        let mut broken = run.clone();
                        broken[at] += 1;
                        cases.push(broken);
                    }
                }
                // A run up to u32::MAX is one; one that would wrap is not.
                cases.push(
                    (0..n as u32)
                        .map(|i| u32::MAX - (n as u32 - 1) + i)
                        .collect(),
                );
                if n > 1 {
                    cases.push(
                        (0..n as u32)
                            .map(|i| (u32::MAX - 1).wrapping_add(i))
                            .collect(),
                    );
                }
                for p in cases {
                    let p = ids(p);
                    for tokens in [&t, &wide] {
                        let (tk, pg) = Tokens::with_pages(tokens, &p);
                        assert_eq!(tk.to_vec(), *tokens, "ps {ps} n {n}");
                        assert_eq!(
                            matches!(tk, Tokens::Wide(_)),
                            tokens.iter().any(|&x| x > 65_535)
                        );
                        assert_eq!(pg, Pages::from_slice(&p), "ps {ps} n {n} {p:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn narrow_and_wide_agree() {
        let small: Vec<u32> = (0..200).map(|i| (i * 7919) % 65_536).collect();
        let mut big = small.clone();
        big[150] = 70_000;
        let n = Tokens::from_slice(&small);
        let w = Tokens::from_slice(&big);
        assert!(matches!(n, Tokens::Narrow(_)));
        assert!(matches!(w, Tokens::Wide(_)));
        assert_eq!(n.to_vec(), small);
        assert_eq!(w.to_vec(), big);
        // Keys that differ at every place, both ways, including past 16 bits.
        for at in [0, 1, 31, 32, 33, 100, 149, 150, 199] {
            let mut k = small.clone();
            k[at] += 65_536;
            assert_eq!(n.common_prefix(&k), at);
            let mut k = small.clone();
            k[at] ^= 1;
            assert_eq!(n.common_prefix(&k), at);
            assert_eq!(w.common_prefix(&k), at.min(150));
        }
        assert_eq!(n.common_prefix(&small), 200);
        assert_eq!(n.common_prefix_from(40, &small[40..]), 160);
        assert_eq!(w.common_prefix_from(40, &small[40..]), 110);
        assert_eq!(n.common_prefix(&small[..77]), 77);
        assert_eq!(w.common_prefix(&big), 200);
        for ps in [1, 2, 3, 16] {
            assert_eq!(n.first_key(ps), crate::hash::child_key(&small[..ps]));
        }
        let mut m = n.clone();
        let tail = m.split_off(64);
        m.truncate(60);
        let mut all = Vec::new();
        m.extend_range(0..60, &mut all);
        tail.extend_range(0..tail.len(), &mut all);
        assert_eq!(all[..60], small[..60]);
        assert_eq!(all[60..], small[64..]);
    }
}
