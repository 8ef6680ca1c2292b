//! Token sampling: penalties, logit bias, grammar mask, temperature, top-k / top-p / min-p,
//! a seeded per-request RNG, and log-probabilities.
//!
//! The sampler is a pure function of (logits row, [`SamplingConfig`], [`SamplerState`],
//! optional grammar bitmask). Each request owns one [`SamplerState`]: its RNG (ChaCha8, seeded
//! from `sampling_seed` when given, so the same seed gives the same tokens on every run and in
//! every batch composition) and the counts of tokens it has produced (for the penalties).
//!
//! Order of operations, as in SGLang and vLLM: penalties → logit bias → grammar mask →
//! (greedy if temperature is 0) → temperature → top-k → softmax → top-p → min-p → draw.
//! Log-probabilities are taken from the model's raw distribution (log-softmax of the logits
//! before any of the above), which is what SGLang's `select` scoring expects.

mod logprobs;
mod penalties;

pub use logprobs::{log_softmax_at, top_logprobs, LogSoftmax};
pub use penalties::apply_penalties;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// Checked sampling parameters of one request (one sample of it).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingConfig {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability sums to `top_p`.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens (`None` = all).
    pub top_k: Option<usize>,
    /// Drop tokens whose probability is below `min_p` times the top token's.
    pub min_p: f32,
    /// Subtract `frequency_penalty * count` from each produced token's logit.
    pub frequency_penalty: f32,
    /// Subtract `presence_penalty` from each produced token's logit.
    pub presence_penalty: f32,
    /// Divide positive (multiply negative) logits of tokens seen in the prompt or output.
    pub repetition_penalty: f32,
    /// Added to the logits of these tokens.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the request's RNG (`None`: drawn from the OS).
    pub seed: Option<u64>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingConfig {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// True when sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == Some(1)
    }

    fn has_penalties(&self) -> bool {
        self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
            || self.repetition_penalty != 1.0
    }
}

/// Per-request sampling state: the RNG and the tokens seen so far.
#[derive(Clone, Debug)]
pub struct SamplerState {
    rng: ChaCha8Rng,
    /// Output token counts (frequency / presence penalties, repetition penalty).
    output_counts: HashMap<u32, u32>,
    /// Tokens of the prompt (repetition penalty only).
    prompt_tokens: std::collections::HashSet<u32>,
}

impl SamplerState {
    /// A fresh state for a request with this config, this prompt and `sample_index` (the
    /// index among the request's `n` samples, so that seeded samples differ from each other).
    pub fn new(config: &SamplingConfig, prompt: &[u32], sample_index: u64) -> Self {
        let rng = match config.seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(
                seed.wrapping_add(sample_index.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            ),
            None => ChaCha8Rng::from_os_rng(),
        };
        let prompt_tokens = if config.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            Default::default()
        };
        Self {
            rng,
            output_counts: HashMap::new(),
            prompt_tokens,
        }
    }

    /// Records a produced token (call for every token appended to the output, sampled or forced).
    pub fn observe(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
    }

    /// Where the random stream is (words drawn so far): a decode host continuing a request
    /// sampled by a prefill host sets it with [`SamplerState::set_rng_position`].
    pub fn rng_position(&self) -> u128 {
        self.rng.get_word_pos()
    }

    /// Moves the random stream to `pos` (see [`SamplerState::rng_position`]).
    pub fn set_rng_position(&mut self, pos: u128) {
        self.rng.set_word_pos(pos);
    }
}

/// The outcome of one sampling step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The chosen token.
    pub token: u32,
    /// Its log-probability under the model's raw distribution.
    pub logprob: f32,
}

/// Why a sampling step could not choose a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    /// The grammar mask (with the other filters) leaves no token allowed.
    #[error("no token is allowed at this step (grammar mask is empty)")]
    NothingAllowed,
    /// The logits row contains NaN values.
    #[error("the logits contain NaN")]
    NanLogits,
}

/// True when bit `token` of the 32-bit-word bitmask is set.
#[inline]
pub fn mask_allows(mask: &[u32], token: u32) -> bool {
    let w = (token / 32) as usize;
    w < mask.len() && (mask[w] >> (token % 32)) & 1 == 1
}

/// Sets every logit whose bit is clear in `mask` to minus infinity.
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = mask.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (i, l) in chunk.iter_mut().enumerate() {
            if (bits >> i) & 1 == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Samples one token from `logits` (modified in place: penalties, bias, mask, temperature).
///
/// `raw` is the log-softmax of the unmodified row when the caller wants the chosen token's
/// logprob under the model's distribution; pass `None` to get the logprob under the
/// processed distribution instead (cheaper, used when logprobs are not returned).
pub fn sample(
    logits: &mut [f32],
    config: &SamplingConfig,
    state: &mut SamplerState,
    mask: Option<&[u32]>,
    raw: Option<&LogSoftmax>,
) -> Result<Sampled, SampleError> {
    let token = sample_token(logits, config, state, mask)?;
    let logprob = match raw {
        Some(ls) => ls.logprob(token),
        None => log_softmax_at(logits, token),
    };
    Ok(Sampled { token, logprob })
}

/// [`sample`] without the log-probability (one pass over the vocabulary less, for the
/// requests that do not ask for logprobs).
pub fn sample_token(
    logits: &mut [f32],
    config: &SamplingConfig,
    state: &mut SamplerState,
    mask: Option<&[u32]>,
) -> Result<u32, SampleError> {
    if config.has_penalties() {
        apply_penalties(logits, config, &state.output_counts, &state.prompt_tokens);
    }
    for &(tok, bias) in &config.logit_bias {
        if let Some(l) = logits.get_mut(tok as usize) {
            *l += bias;
        }
    }
    if let Some(mask) = mask {
        apply_mask(logits, mask);
    }
    if config.is_greedy() {
        argmax(logits)
    } else {
        draw(logits, config, &mut state.rng)
    }
}

/// Index of the largest finite logit (the lowest index on ties).
fn argmax(logits: &[f32]) -> Result<u32, SampleError> {
    let mut best = None::<(usize, f32)>;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            return Err(SampleError::NanLogits);
        }
        if l == f32::NEG_INFINITY {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
        .ok_or(SampleError::NothingAllowed)
}

/// Temperature, top-k, top-p, min-p and a draw from the RNG.
fn draw(logits: &[f32], config: &SamplingConfig, rng: &mut ChaCha8Rng) -> Result<u32, SampleError> {
    let inv_t = 1.0 / config.temperature;
    let mut cand: Vec<(u32, f32)> = Vec::with_capacity(256);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            return Err(SampleError::NanLogits);
        }
        if l > f32::NEG_INFINITY {
            cand.push((i as u32, l * inv_t));
        }
    }
    if cand.is_empty() {
        return Err(SampleError::NothingAllowed);
    }
    let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if let Some(k) = config.top_k {
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, by_logit_desc);
            cand.truncate(k);
        }
    }
    let needs_sort = config.top_p < 1.0 || config.min_p > 0.0;
    if needs_sort {
        cand.sort_unstable_by(by_logit_desc);
    }
    // Softmax over the candidates.
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for c in cand.iter_mut() {
        c.1 = (c.1 - max).exp();
        sum += c.1 as f64;
    }
    let sum = sum as f32;
    for c in cand.iter_mut() {
        c.1 /= sum;
    }
    if config.top_p < 1.0 {
        let mut acc = 0.0f32;
        let mut keep = cand.len();
        for (i, c) in cand.iter().enumerate() {
            acc += c.1;
            if acc >= config.top_p {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep);
    }
    if config.min_p > 0.0 {
        let threshold = cand[0].1 * config.min_p;
        let keep = cand.iter().take_while(|c| c.1 >= threshold).count().max(1);
        cand.truncate(keep);
    }
    let total: f32 = cand.iter().map(|c| c.1).sum();
    let mut u = rng.random::<f32>() * total;
    for c in &cand {
        if u < c.1 {
            return Ok(c.0);
        }
        u -= c.1;
    }
    Ok(cand[cand.len() - 1].0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, -1.0, 2.9]
    }

    #[test]
    fn greedy_picks_argmax() {
        let cfg = SamplingConfig::greedy();
        let mut st = SamplerState::new(&cfg, &[], 0);
        let s = sample(&mut row(), &cfg, &mut st, None, None).unwrap();
        assert_eq!(s.token, 1);
        assert!(s.logprob < 0.0);
        assert_eq!(sample_token(&mut row(), &cfg, &mut st, None), Ok(1));
    }

    #[test]
    fn mask_restricts_choice() {
        let cfg = SamplingConfig::greedy();
        let mut st = SamplerState::new(&cfg, &[], 0);
        // allow tokens 2 and 4 only
        let mask = [0b10100u32];
        let s = sample(&mut row(), &cfg, &mut st, Some(&mask), None).unwrap();
        assert_eq!(s.token, 2);
        let empty = [0u32];
        assert_eq!(
            sample(&mut row(), &cfg, &mut st, Some(&empty), None),
            Err(SampleError::NothingAllowed)
        );
    }

    #[test]
    fn seed_is_deterministic_and_samples_differ() {
        let cfg = SamplingConfig {
            temperature: 1.5,
            seed: Some(42),
            ..Default::default()
        };
        let run = |idx| {
            let mut st = SamplerState::new(&cfg, &[], idx);
            (0..64)
                .map(|_| sample(&mut row(), &cfg, &mut st, None, None).unwrap().token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(0), run(0));
        assert_ne!(run(0), run(1));
    }

    #[test]
    fn top_k_one_and_top_p_small_are_greedy() {
        for cfg in [
            SamplingConfig {
                top_k: Some(1),
                seed: Some(1),
                ..Default::default()
            },
            SamplingConfig {
                top_p: 0.01,
                seed: Some(1),
                ..Default::default()
            },
            SamplingConfig {
                min_p: 0.99,
                seed: Some(1),
                ..Default::default()
            },
        ] {
            let mut st = SamplerState::new(&cfg, &[], 0);
            for _ in 0..50 {
                assert_eq!(
                    sample(&mut row(), &cfg, &mut st, None, None).unwrap().token,
                    1,
                    "{cfg:?}"
                );
            }
        }
    }

    #[test]
    fn top_k_two_draws_only_from_the_top_two() {
        let cfg = SamplingConfig {
            top_k: Some(2),
            temperature: 5.0,
            seed: Some(7),
            ..Default::default()
        };
        let mut st = SamplerState::new(&cfg, &[], 0);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            seen.insert(sample(&mut row(), &cfg, &mut st, None, None).unwrap().token);
        }
        assert_eq!(seen, [1u32, 5].into_iter().collect());
    }

    #[test]
    fn sampling_frequencies_follow_softmax() {
        let cfg = SamplingConfig {
            seed: Some(3),
            ..Default::default()
        };
        let mut st = SamplerState::new(&cfg, &[], 0);
        let logits = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let n = 20_000;
        let ones = (0..n)
            .filter(|_| {
                sample(&mut logits.to_vec(), &cfg, &mut st, None, None)
                    .unwrap()
                    .token
                    == 1
            })
            .count();
        let f = ones as f64 / n as f64;
        assert!((f - 0.75).abs() < 0.02, "{f}");
    }

    #[test]
    fn logit_bias_and_presence_penalty_move_the_argmax() {
        let cfg = SamplingConfig {
            temperature: 0.0,
            logit_bias: vec![(4, 10.0)],
            ..Default::default()
        };
        let mut st = SamplerState::new(&cfg, &[], 0);
        assert_eq!(
            sample(&mut row(), &cfg, &mut st, None, None).unwrap().token,
            4
        );

        let cfg = SamplingConfig {
            temperature: 0.0,
            presence_penalty: 0.5,
            ..Default::default()
        };
        let mut st = SamplerState::new(&cfg, &[], 0);
        st.observe(1);
        assert_eq!(
            sample(&mut row(), &cfg, &mut st, None, None).unwrap().token,
            5
        );
    }

    #[test]
    fn raw_logprob_ignores_processing() {
        let cfg = SamplingConfig {
            temperature: 0.0,
            logit_bias: vec![(4, 10.0)],
            ..Default::default()
        };
        let mut st = SamplerState::new(&cfg, &[], 0);
        let r = row();
        let ls = LogSoftmax::new(&r);
        let s = sample(&mut r.clone(), &cfg, &mut st, None, Some(&ls)).unwrap();
        assert_eq!(s.token, 4);
        assert!((s.logprob - ls.logprob(4)).abs() < 1e-6);
        assert!(s.logprob < -4.0);
    }

    #[test]
    fn nan_is_an_error() {
        let cfg = SamplingConfig::greedy();
        let mut st = SamplerState::new(&cfg, &[], 0);
        assert_eq!(
            sample(&mut [0.0, f32::NAN], &cfg, &mut st, None, None),
            Err(SampleError::NanLogits)
        );
    }
}
