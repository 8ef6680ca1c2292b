//! Rotary position embedding in GGUF's adjacent-pair order.

use sglrs_model::{ModelConfig, RopeScaling};

/// Per-pair inverse frequencies of a model (scaling applied).
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f64>,
    pos_scale: f64,
}

impl Rope {
    /// Frequencies for `cfg`: `theta^(-2i / head_dim)`, with linear or Llama 3 scaling.
    pub fn new(cfg: &ModelConfig) -> Rope {
        let hd = cfg.head_dim;
        let theta = cfg.rope_theta as f64;
        let mut inv_freq: Vec<f64> = (0..hd / 2)
            .map(|i| theta.powf(-2.0 * i as f64 / hd as f64))
            .collect();
        let mut pos_scale = 1.0;
        match cfg.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => pos_scale = 1.0 / factor as f64,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let (f, lo, hi) = (
                    factor as f64,
                    low_freq_factor as f64,
                    high_freq_factor as f64,
                );
                let orig = original_max_position_embeddings as f64;
                let (lo_wl, hi_wl) = (orig / lo, orig / hi);
                for fr in inv_freq.iter_mut() {
                    let wl = 2.0 * std::f64::consts::PI / *fr;
                    if wl > lo_wl {
                        *fr /= f;
                    } else if wl >= hi_wl {
                        let smooth = (orig / wl - lo) / (hi - lo);
                        *fr = (1.0 - smooth) * *fr / f + smooth * *fr;
                    }
                }
            }
        }
        Rope {
            inv_freq,
            pos_scale,
        }
    }

    /// Appends `(cos, sin)` of every pair at `pos` to `out` (`head_dim / 2` entries).
    pub fn push_table(&self, pos: usize, out: &mut Vec<(f32, f32)>) {
        let p = pos as f64 * self.pos_scale;
        out.extend(self.inv_freq.iter().map(|f| {
            let (s, c) = (p * f).sin_cos();
            (c as f32, s as f32)
        }));
    }

    /// Rotates every head of `x` (heads × head_dim) by one position's table.
    pub fn apply(table: &[(f32, f32)], x: &mut [f32]) {
        let half = table.len();
        for head in x.chunks_exact_mut(2 * half) {
            for (pair, &(c, s)) in head.chunks_exact_mut(2).zip(table) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }
}
