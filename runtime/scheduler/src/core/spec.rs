//! Speculative decoding by n-gram lookup over the sequence itself (prompt lookup).
//!
//! Agent loops and tool calls copy text that is already in the context (file names, ids,
//! arguments of earlier calls, the call syntax itself), and a small model that repeats
//! itself repeats exactly. So after a sampled token, the scheduler looks for the latest
//! earlier occurrence of the sequence's last few tokens and drafts the tokens that followed
//! it; the drafts ride in the same chunk as the sampled token, with a logits row for each.
//! The rows are then consumed one by one exactly as decode steps would consume them (mask,
//! penalties, sampler, stop conditions, jump-forward): a row is used only while every token
//! before it is the one the model chose, so the output is the same token for token as
//! without drafts. What that needs of the executor, and holds for the CPU one, is that a
//! row's logits do not depend on how many rows its chunk has (`executor_paged.rs`).
//!
//! Only greedy sequences draft (a sampled token rarely matches a draft, and each drafted
//! row costs attention over the whole context), only past the prompt, and only into pages
//! that are free: a draft never evicts cached pages nor retracts another sequence. A draft
//! stops at the first token the grammar (if any) would refuse, at a stop token, and before
//! the sequence's token or context limit.

use super::{SchedulerCore, SeqKey};
use crate::request::Disagg;

/// Longest suffix looked up (tokens); shorter ones are tried down to [`MIN_NGRAM`].
const MAX_NGRAM: usize = 4;

/// Shortest suffix looked up: a lone token predicts its follower too rarely to pay for the
/// rows.
const MIN_NGRAM: usize = 2;

/// Most decode steps a sequence goes without drafting after drafts that failed.
const MAX_SKIP: u32 = 16;

/// How far back the lookup scans (tokens), so that a draft costs a bounded time per step.
const LOOKUP_WINDOW: usize = 16_384;

/// The tokens that followed the latest earlier occurrence of the longest suffix of `tokens`
/// (from [`MAX_NGRAM`] down to [`MIN_NGRAM`] tokens) that occurs earlier, at most `k` of
/// them, into `out` (cleared first; empty when no suffix recurs). A continuation that runs
/// into the end of `tokens` goes on with the drafted tokens themselves, so a repeating run
/// drafts its next `k` tokens, not only what is left of its last period.
pub(crate) fn ngram_draft(tokens: &[u32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    let len = tokens.len();
    if k == 0 || len < MIN_NGRAM + 1 {
        return;
    }
    let last = tokens[len - 1];
    let lo = len.saturating_sub(LOOKUP_WINDOW);
    // (suffix length matched, index of the match's last token)
    let mut best: Option<(usize, usize)> = None;
    for i in (lo..len - 1).rev() {
        if tokens[i] != last {
            continue;
        }
        let mut m = 1;
        while m < MAX_NGRAM && m <= i && tokens[i - m] == tokens[len - 1 - m] {
            m += 1;
        }
        if m >= MIN_NGRAM && best.is_none_or(|(b, _)| m > b) {
            best = Some((m, i));
            if m == MAX_NGRAM {
                break;
            }
        }
    }
    let Some((_, i)) = best else {
        return;
    };
    for j in i + 1..i + 1 + k {
        let t = if j < len { tokens[j] } else { out[j - len] };
        out.push(t);
    }
}

impl SchedulerCore {
    /// Draft tokens for a running sequence whose pending tokens (`pending`, all of them
    /// planned in this chunk) end with a sampled token, at most `room` of them (what the
    /// pass's token budget leaves). Extends the sequence's pages to cover them from the free
    /// pages only; empty when it should not draft.
    pub(super) fn draft_for(&mut self, key: SeqKey, pending: usize, room: usize) -> Vec<u32> {
        let ps = self.cfg.page_size;
        let s = self.seqs.get_mut(&key).expect("running key");
        if s.spec_skip > 0 {
            s.spec_skip -= 1;
            return Vec::new();
        }
        let s = &self.seqs[&key];
        let most = match s.spec_k {
            0 => self.cfg.speculative_ngram,
            k => k.min(self.cfg.speculative_ngram),
        };
        let mut k = most
            .min(room)
            .min(self.cfg.chunked_prefill_size.saturating_sub(pending));
        if k == 0
            || !s.shared.sampling.is_greedy()
            || s.computed < s.shared.prompt_len
            || s.shared.disagg == Some(Disagg::Export)
            || s.awaiting_kv
        {
            return Vec::new();
        }
        // Every drafted token is an output token the sequence could still take: leave the
        // last place below the token and context limits to the token sampled after them.
        let stop = &s.shared.stop;
        let out_room = stop
            .max_new_tokens
            .saturating_sub(s.output_len() + 1)
            .min(self.cfg.max_context.saturating_sub(s.tokens.len() + 1));
        k = k.min(out_room);
        if k == 0 {
            return Vec::new();
        }
        let mut draft = Vec::new();
        ngram_draft(&s.tokens, k, &mut draft);
        let stops = |t: u32| {
            (!stop.ignore_eos && self.cfg.eos_tokens.contains(&t))
                || stop.stop_token_ids.contains(&t)
        };
        if let Some(cut) = draft.iter().position(|&t| stops(t)) {
            draft.truncate(cut);
        }
        if let (Some(m), false) = (s.matcher.as_ref(), draft.is_empty()) {
            let mut probe = m.clone();
            let fits = draft
                .iter()
                .take_while(|&&t| probe.is_allowed(t) && probe.accept_token(t).is_ok())
                .count();
            draft.truncate(fits);
        }
        if draft.is_empty() {
            return draft;
        }
        // Pages for the drafted positions, from the free ones only.
        let end = s.computed + pending + draft.len();
        let need = end.div_ceil(ps).saturating_sub(s.pages.len());
        if need > 0 {
            let got = (self.cache.free_pages() >= need)
                .then(|| self.cache.alloc(need))
                .flatten();
            match got {
                Some(pages) => self
                    .seqs
                    .get_mut(&key)
                    .expect("running key")
                    .pages
                    .extend(pages),
                None => {
                    // What the pages already held cover.
                    let s = &self.seqs[&key];
                    let fit = (s.pages.len() * ps).saturating_sub(s.computed + pending);
                    draft.truncate(fit);
                }
            }
        }
        draft
    }

    /// Adapts the next draft to how this one went: a wholly accepted draft lets the next
    /// one be twice as long (up to the configured most), a partly accepted one sets it to
    /// one more than was accepted, and after `m` wholly refused drafts in a row the sequence
    /// drafts nothing for `2^m - 1` steps (at most [`MAX_SKIP`]) and then one token.
    pub(super) fn note_draft(&mut self, key: SeqKey, drafted: usize, accepted: usize) {
        let Some(s) = self.seqs.get_mut(&key) else {
            return;
        };
        if accepted == 0 {
            s.spec_misses = (s.spec_misses + 1).min(8);
            s.spec_skip = ((1u32 << s.spec_misses) - 1).min(MAX_SKIP);
            s.spec_k = 1;
            return;
        }
        s.spec_misses = 0;
        s.spec_k = if accepted == drafted {
            (2 * drafted).min(self.cfg.speculative_ngram)
        } else {
            accepted + 1
        };
    }
}

#[cfg(test)]
mod tests {
    use super::ngram_draft;

    fn draft(tokens: &[u32], k: usize) -> Vec<u32> {
        let mut out = vec![99];
        ngram_draft(tokens, k, &mut out);
        out
    }

    #[test]
    fn drafts_what_followed_the_latest_occurrence_of_the_longest_suffix() {
        // "1 2 3" occurs at 0 (followed by 4 5) and at 5 (followed by 9): the latest wins.
        assert_eq!(
            draft(&[1, 2, 3, 4, 5, 1, 2, 3, 9, 7, 1, 2, 3], 2),
            vec![9, 7]
        );
        // A 4-token match beats a later 2-token one.
        assert_eq!(
            draft(&[5, 6, 7, 8, 1, 0, 7, 8, 2, 5, 6, 7, 8], 3),
            vec![1, 0, 7]
        );
        // A repeating run drafts its own continuation, past the end of what it has.
        assert_eq!(draft(&[3, 4, 3, 4], 5), vec![3, 4, 3, 4, 3]);
        assert_eq!(draft(&[1, 7, 8, 7, 8, 7, 8], 3), vec![7, 8, 7]);
        assert_eq!(draft(&[5, 5, 5], 2), vec![5, 5]);
    }

    #[test]
    fn no_draft_without_a_recurring_suffix() {
        assert!(draft(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(draft(&[1, 2, 1, 3], 4).is_empty()); // one token recurs: too short
        assert!(draft(&[], 4).is_empty());
        assert!(draft(&[1], 4).is_empty());
        assert!(draft(&[1, 2, 1, 2], 0).is_empty());
    }
}
