//! Log-probabilities of a logits row: the chosen token's, the top `n`, chosen ids'.

/// The log-softmax normaliser of one logits row, so that any token's logprob is one
/// subtraction.
#[derive(Clone, Debug)]
pub struct LogSoftmax<'a> {
    logits: &'a [f32],
    /// `max + ln(sum(exp(l - max)))`.
    log_z: f32,
}

impl<'a> LogSoftmax<'a> {
    /// Computes the normaliser of `logits` (one pass for the max, one for the sum).
    pub fn new(logits: &'a [f32]) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        Self {
            logits,
            log_z: max + sum.ln() as f32,
        }
    }

    /// Logprob of `token` (minus infinity for an id outside the row).
    pub fn logprob(&self, token: u32) -> f32 {
        self.logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| l - self.log_z)
    }

    /// The `n` most likely tokens with their logprobs, most likely first.
    pub fn top(&self, n: usize) -> Vec<(u32, f32)> {
        top_logprobs(self.logits, n)
            .into_iter()
            .map(|(t, l)| (t, l - self.log_z))
            .collect()
    }
}

/// The `n` largest entries of `logits` as `(token, logit)`, largest first (lowest id on ties).
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let mut all: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let cmp = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if n < all.len() {
        all.select_nth_unstable_by(n - 1, cmp);
        all.truncate(n);
    }
    all.sort_unstable_by(cmp);
    all
}

/// Logprob of `token` under softmax of `logits` (a single pass helper).
pub fn log_softmax_at(logits: &[f32], token: u32) -> f32 {
    LogSoftmax::new(logits).logprob(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_normalise() {
        let row = [1.0f32, 2.0, 3.0];
        let ls = LogSoftmax::new(&row);
        let total: f32 = (0..3).map(|t| ls.logprob(t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        let top = ls.top(2);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!((top[0].1 - ls.logprob(2)).abs() < 1e-6);
        assert_eq!(ls.logprob(9), f32::NEG_INFINITY);
    }
}
