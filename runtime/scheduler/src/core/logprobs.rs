//! Logits and logprobs of a chunk: which rows the executor returns, and the prompt's input
//! logprobs gathered from them.

use super::{PlanItem, SchedulerCore, SeqKey};
use crate::request::{LogprobConfig, SchedEvent, TokenLogprob};
use crate::sampler::LogSoftmax;
use crate::seq::Seq;
use sglrs_executor::{Logits, LogitsWanted};

/// `token`'s entry as a request's logprob settings ask for it: its logprob, the top
/// `top_n`, and the requested ids'.
pub(super) fn entry(ls: &LogSoftmax, token: u32, lp: &LogprobConfig) -> TokenLogprob {
    TokenLogprob {
        token,
        logprob: Some(ls.logprob(token)),
        top: ls.top(lp.top_n),
        chosen: lp
            .token_ids
            .iter()
            .map(|&id| (id, ls.logprob(id)))
            .collect(),
    }
}

impl SchedulerCore {
    /// Logits rows a chunk needs: the last (to sample) and, while in the prompt, the
    /// positions whose next token's input logprob was asked for.
    pub(super) fn logits_wanted(
        &self,
        s: &Seq,
        start: usize,
        n: usize,
        sample_after: bool,
    ) -> LogitsWanted {
        let input_start = s.shared.logprobs.as_ref().and_then(|l| l.input_start);
        if let Some(first) = input_start.filter(|_| start < s.shared.prompt_len) {
            // Row at position p scores token p + 1; input logprobs cover tokens first.. .
            let offs: Vec<usize> = (0..n)
                .filter(|&o| {
                    let p = start + o;
                    (p + 1 >= first.max(1) && p + 1 < s.shared.prompt_len)
                        || (sample_after && o == n - 1)
                })
                .collect();
            return if offs.len() == n {
                LogitsWanted::All
            } else if offs.is_empty() {
                LogitsWanted::None
            } else {
                LogitsWanted::Offsets(offs)
            };
        }
        if sample_after {
            LogitsWanted::Last
        } else {
            LogitsWanted::None
        }
    }

    pub(super) fn collect_input_logprobs(
        &mut self,
        key: SeqKey,
        item: &PlanItem,
        rows: &[(usize, usize)],
        logits: &Logits,
    ) {
        let s = self.seqs.get_mut(&key).expect("live key");
        let Some(lp) = s.shared.logprobs.clone() else {
            return;
        };
        let Some(first) = lp.input_start else {
            return;
        };
        if s.input_logprobs_sent {
            return;
        }
        let prompt_len = s.shared.prompt_len;
        if first == 0 && item.start_pos == 0 && s.input_logprobs.is_empty() {
            s.input_logprobs.push(TokenLogprob {
                token: s.tokens[0],
                logprob: None,
                top: vec![],
                chosen: vec![],
            });
        }
        for &(r, off) in rows {
            let p = item.start_pos + off;
            let t = p + 1;
            if t < first.max(1) || t >= prompt_len {
                continue;
            }
            let row = logits.row(r);
            let ls = LogSoftmax::new(row);
            let token = s.tokens[t];
            s.input_logprobs.push(entry(&ls, token, &lp));
        }
        if !s.in_prompt() {
            s.input_logprobs_sent = true;
            self.events.push_back(SchedEvent::InputLogprobs {
                id: key.0,
                sample: key.1,
                logprobs: std::mem::take(&mut s.input_logprobs),
            });
        }
    }
}
