//! The serving process's own inter-token latency: its `sglrs_inter_token_latency_seconds`
//! histogram (`/metrics`) read before and after a phase. Unlike the clients' figure it
//! leaves out the router and the clients themselves, which on a machine whose every core
//! serves a role wait for CPU behind the servers.

use anyhow::Context;

/// The histogram's cumulative counts by upper bound (seconds), `+Inf` last.
pub(super) type Buckets = Vec<(f64, u64)>;

const METRIC: &str = "sglrs_inter_token_latency_seconds_bucket{le=\"";

/// Reads the ITL histogram of the server at `base`.
pub(super) fn read(agent: &ureq::Agent, base: &str) -> anyhow::Result<Buckets> {
    let text = agent
        .get(&format!("{base}/metrics"))
        .call()
        .with_context(|| format!("GET {base}/metrics"))?
        .into_string()?;
    Ok(parse(&text))
}

fn parse(text: &str) -> Buckets {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(METRIC)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The `p`-th percentile (0–100) of the observations between two readings, in seconds,
/// interpolated linearly inside its bucket; `None` without observations, or when it falls
/// in the `+Inf` bucket.
pub(super) fn percentile(before: &Buckets, after: &Buckets, p: f64) -> Option<f64> {
    let delta: Vec<(f64, u64)> = after
        .iter()
        .map(|&(le, n)| {
            let was = before.iter().find(|(b, _)| *b == le).map_or(0, |x| x.1);
            (le, n.saturating_sub(was))
        })
        .collect();
    let total = delta.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = p / 100.0 * total as f64;
    let mut lower = (0.0, 0u64);
    for &(le, cum) in &delta {
        if cum as f64 >= rank {
            if !le.is_finite() {
                return None;
            }
            let in_bucket = (cum - lower.1) as f64;
            let frac = if in_bucket > 0.0 {
                (rank - lower.1 as f64) / in_bucket
            } else {
                1.0
            };
            return Some(lower.0 + frac.clamp(0.0, 1.0) * (le - lower.0));
        }
        lower = (le, cum);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_the_difference_interpolate_inside_buckets() {
        let before = parse(
            "sglrs_inter_token_latency_seconds_bucket{le=\"0.01\"} 5\n\
             sglrs_inter_token_latency_seconds_bucket{le=\"0.02\"} 5\n\
             sglrs_inter_token_latency_seconds_bucket{le=\"+Inf\"} 5\n",
        );
        let after = parse(
            "sglrs_inter_token_latency_seconds_bucket{le=\"0.01\"} 55\n\
             sglrs_inter_token_latency_seconds_bucket{le=\"0.02\"} 105\n\
             sglrs_inter_token_latency_seconds_bucket{le=\"+Inf\"} 105\n",
        );
        assert_eq!(after.len(), 3);
        // 100 new observations: 50 up to 10 ms, 50 in (10, 20] ms.
        let p50 = percentile(&before, &after, 50.0).unwrap();
        assert!((p50 - 0.01).abs() < 1e-12, "{p50}");
        let p99 = percentile(&before, &after, 99.0).unwrap();
        assert!((p99 - 0.0198).abs() < 1e-9, "{p99}");
        assert_eq!(percentile(&after, &after, 50.0), None);
    }
}
