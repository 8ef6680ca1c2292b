//! Admission hold: lets the followers of requests that just finished join one prefill pass.
//!
//! Clients in a closed loop (a chat front end, a benchmark with a fixed number of clients)
//! send their next request as soon as the last one finishes. When several requests finish
//! in the same step, their followers arrive a few milliseconds apart; admitted as they come,
//! they are prefilled in two or three passes instead of one, and their decodes then stay a
//! step or more apart for good (each extra prefill pass of a few tokens costs several decode
//! steps here). Two bounded rules, both off with a hold of zero:
//!
//! - **Nothing running**: after a step in which `k` requests finished, waiting sequences are
//!   not admitted until `k` requests have arrived since that step or the hold has passed
//!   since it (`SchedulerConfig::admission_hold`, `--admission-hold-ms` in `sglrs serve`);
//!   the executor would be idle either way, so the only cost is that wait, once per such
//!   step. Followers still expected from an earlier step whose hold has not run out are
//!   added to `k`.
//! - **Everything running ends with its next token** (a decode whose next token reaches
//!   `max_new_tokens` or the context length): newcomers are admitted in the step after
//!   that, together with the followers of the ending requests, instead of joining the last
//!   decode step alone. This delays them by at most one decode step.
//!
//! Nothing is dropped or reordered: held sequences stay in the waiting queue in policy order.

use super::SchedulerCore;
use crate::seq::Phase;
use std::time::Instant;

/// Followers expected after recent finishes.
#[derive(Clone, Copy, Debug)]
pub(super) struct FinishBurst {
    /// When the last step with finished requests was handled: the hold runs from here.
    pub at: Instant,
    /// Requests that finished (aborts not counted) minus requests that arrived since,
    /// accumulated over steps while the hold has not run out.
    pub expected: usize,
}

impl SchedulerCore {
    /// True when admission waits this step (see the module docs).
    pub(super) fn hold_admission(&self, now: Instant) -> bool {
        if self.cfg.admission_hold.is_zero() || self.waiting.is_empty() {
            return false;
        }
        if !self.running.is_empty() {
            return self.running.iter().all(|k| {
                let s = &self.seqs[k];
                s.phase == Phase::Running
                    && s.pending() == 1
                    && !s.in_prompt()
                    && (s.output_len() + 1 >= s.shared.stop.max_new_tokens
                        || s.tokens.len() + 1 >= self.cfg.max_context)
            });
        }
        self.admission_deadline(now).is_some()
    }

    /// While admission waits for the followers of finished requests with nothing running:
    /// the moment the wait ends (the caller may sleep until then or until a request comes).
    pub fn admission_deadline(&self, now: Instant) -> Option<Instant> {
        if self.cfg.admission_hold.is_zero() || self.waiting.is_empty() || !self.running.is_empty()
        {
            return None;
        }
        let b = self.burst?;
        let deadline = b.at + self.cfg.admission_hold;
        (b.expected > 0 && now < deadline).then_some(deadline)
    }

    /// Notes a request's arrival for the hold.
    pub(super) fn note_arrival(&mut self) {
        if let Some(b) = self.burst.as_mut() {
            b.expected = b.expected.saturating_sub(1);
        }
    }

    /// After a step's results: requests that finished in it add to the followers expected
    /// (on top of those still expected from a step whose hold has not run out).
    pub(super) fn note_step_end(&mut self, now: Instant) {
        let n = std::mem::take(&mut self.finished_in_step);
        if n == 0 {
            return;
        }
        let still = self
            .burst
            .filter(|b| now < b.at + self.cfg.admission_hold)
            .map_or(0, |b| b.expected);
        self.burst = Some(FinishBurst {
            at: now,
            expected: still + n,
        });
    }
}
