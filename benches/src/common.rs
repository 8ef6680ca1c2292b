//! Shared by the benchmarks that start their own servers (`hicache`, `pd`): seeded text,
//! percentiles, the CPU's name and the events of a streamed answer.

use std::io::BufRead;

/// Common English words, separated by spaces; with SmolLM2's tokenizer each is one token
/// after a space.
pub(crate) const WORDS: &str = "\
    the of and to in is was for on that with as by at from his her they this which or had \
    are but not have one were all there when can said who more been if will out so about \
    what up their would them into has some time could other than then its two may only now \
    like first over new years also after made most many way down did people three such \
    where before well back through much any even good year same long work day own world \
    part under last because while just place little still life both between great found \
    here state those never being old high each small house water thought room another \
    around night point story river city town field light voice road stone green black \
    white north south early late open close hand face eye door table window garden morning \
    evening market school letter paper music bread winter summer spring autumn mountain \
    island forest valley bridge tower church train ship horse bird tree flower fire wind \
    rain snow cloud sun moon star sea";

/// SplitMix64: a fixed, dependency-free generator, so the text never changes with a crate.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Words for ~`tokens` tokens: SmolLM2 counts 1.087 tokens per word of this text (277 words
/// are 301 tokens, 2,300 are 2,501), so 12 words per 13 tokens.
fn words_for(tokens: usize) -> usize {
    (tokens * 12).div_ceil(13)
}

/// Seeded lowercase sentences of [`WORDS`], 8–14 words each, ~`tokens` tokens in all.
pub(crate) fn words_text(seed: u64, tokens: usize) -> String {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut rng = Rng(seed);
    let mut out = String::new();
    let mut left = 8 + rng.below(7);
    for i in 0..words_for(tokens) {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(words[rng.below(words.len())]);
        left -= 1;
        if left == 0 {
            out.push('.');
            left = 8 + rng.below(7);
        }
    }
    out
}

/// Percentile `p` (0–100) of `v`, interpolated linearly between ranks (numpy's default).
pub(crate) fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = p / 100.0 * (s.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (rank - lo as f64)
}

/// The first "model name" of `/proc/cpuinfo` ("unknown" where there is none).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The kernel switches set in this process's environment (the servers it starts inherit
/// them), so that figures taken with and without them can be told apart.
pub(crate) fn kernel_env() -> serde_json::Value {
    let set: serde_json::Map<String, serde_json::Value> =
        ["SGLRS_AMX", "SGLRS_AMX_ATTENTION", "SGLRS_ISA"]
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v.into())))
            .collect();
    set.into()
}

/// `sglrs` and this process's arguments, quoted for a POSIX shell.
pub(crate) fn command_line() -> String {
    let quote = |a: String| {
        let plain = !a.is_empty()
            && a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./=,:+@".contains(&b));
        if plain {
            a
        } else {
            format!("'{}'", a.replace('\'', r"'\''"))
        }
    };
    std::iter::once("sglrs".to_string())
        .chain(std::env::args().skip(1).map(quote))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The JSON events of a streamed `POST /generate` answer, up to `[DONE]`; an `error` event
/// is an error.
pub(crate) fn sse_events(
    resp: ureq::Response,
) -> impl Iterator<Item = anyhow::Result<serde_json::Value>> {
    let mut lines = std::io::BufReader::new(resp.into_reader()).lines();
    std::iter::from_fn(move || loop {
        let line = match lines.next()? {
            Ok(l) => l,
            Err(e) => {
                return Some(Err(
                    anyhow::Error::from(e).context("reading the event stream")
                ))
            }
        };
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            return None;
        }
        let v: serde_json::Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                return Some(Err(
                    anyhow::Error::from(e).context(format!("event {data:?}"))
                ))
            }
        };
        if let Some(e) = v.get("error") {
            return Some(Err(anyhow::anyhow!("POST /generate: error event {e}")));
        }
        return Some(Ok(v));
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), 2.5);
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!((percentile(&v, 90.0) - 9.1).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 10.0);
        assert_eq!(percentile(&[5.0], 90.0), 5.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
