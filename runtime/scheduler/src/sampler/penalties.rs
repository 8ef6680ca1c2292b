//! Frequency, presence and repetition penalties.

use super::SamplingConfig;
use std::collections::{HashMap, HashSet};

/// Applies the config's penalties to `logits` in place.
///
/// - frequency: `logit -= frequency_penalty * count(token in output)`;
/// - presence: `logit -= presence_penalty` once a token appeared in the output;
/// - repetition (HF / vLLM form): for a token in the prompt or the output, a positive logit
///   is divided by `repetition_penalty` and a negative one multiplied by it.
pub fn apply_penalties(
    logits: &mut [f32],
    config: &SamplingConfig,
    output_counts: &HashMap<u32, u32>,
    prompt_tokens: &HashSet<u32>,
) {
    for (&tok, &count) in output_counts {
        let Some(l) = logits.get_mut(tok as usize) else {
            continue;
        };
        *l -= config.frequency_penalty * count as f32 + config.presence_penalty;
    }
    let rp = config.repetition_penalty;
    if rp != 1.0 {
        let mut penalize = |tok: u32| {
            if let Some(l) = logits.get_mut(tok as usize) {
                *l = if *l > 0.0 { *l / rp } else { *l * rp };
            }
        };
        for &tok in prompt_tokens {
            penalize(tok);
        }
        for &tok in output_counts.keys() {
            if !prompt_tokens.contains(&tok) {
                penalize(tok);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_follow_the_formulas() {
        let cfg = SamplingConfig {
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut logits = vec![4.0, -4.0, 1.0, 1.0];
        let counts: HashMap<u32, u32> = [(0, 2)].into_iter().collect();
        let prompt: HashSet<u32> = [1].into_iter().collect();
        apply_penalties(&mut logits, &cfg, &counts, &prompt);
        // token 0: 4 - 0.5*2 - 0.25 = 2.75, then / 2
        assert!((logits[0] - 1.375).abs() < 1e-6);
        // token 1: prompt only, negative: * 2
        assert!((logits[1] + 8.0).abs() < 1e-6);
        assert_eq!(&logits[2..], &[1.0, 1.0]);
    }
}
