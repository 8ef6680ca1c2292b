//! The figures of a phase, the follow-up turn's check, the goals, and the table; plus the
//! machine, date and command the run was on.

use serde_json::{json, Value};

use super::workload::{LoadRun, Streamed};
pub(super) use crate::common::{command_line, cpu_model, percentile};

/// Goals: the decode streams' ITL p99 under PD against the baseline, and a long prompt's
/// transfer against its TTFT.
pub(super) const PD_ITL_P99_GOAL: f64 = 1.5;
pub(super) const TRANSFER_VS_TTFT_GOAL: f64 = 0.10;

/// `x`, or null where it is not finite.
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// The figures every phase has: the streams' inter-token latency and the long prompts' TTFT.
pub(super) fn phase_json(run: &LoadRun) -> Value {
    let gaps: Vec<f64> = run.streams.iter().flat_map(Streamed::gaps).collect();
    let ttfts: Vec<f64> = run.long.iter().filter_map(Streamed::ttft).collect();
    let tokens: u64 = run.streams.iter().map(|s| s.completion_tokens).sum();
    let long_tokens: Vec<f64> = run.long.iter().map(|l| l.prompt_tokens as f64).collect();
    json!({
        "itl_p50_ms": num(percentile(&gaps, 50.0) * 1e3),
        "itl_p99_ms": num(percentile(&gaps, 99.0) * 1e3),
        "itl_max_ms": num(gaps.iter().copied().fold(f64::NAN, f64::max) * 1e3),
        "itl_samples": gaps.len(),
        "ttft_p50_s": num(percentile(&ttfts, 50.0)),
        "long_prompts": run.long.len(),
        "long_prompt_tokens_p50": num(percentile(&long_tokens, 50.0)),
        "stream_requests": run.streams.len(),
        "stream_tokens": tokens,
        "stream_tok_s": num(tokens as f64 / run.wall.max(1e-9)),
        "wall_s": run.wall,
    })
}

/// The PD phase's transfer figures, added to `v`: per long prompt its TTFT and
/// `meta_info.disaggregation`, and the p50s. A long prompt without one counts in
/// `long_prompts_without_transfer`.
pub(super) fn add_transfers(v: &mut Value, run: &LoadRun) {
    let mut per = Vec::new();
    let (mut ms, mut ratio, mut pages) = (Vec::new(), Vec::new(), Vec::new());
    for l in &run.long {
        let (Some(t), Some(ttft)) = (l.transfer, l.ttft()) else {
            continue;
        };
        ms.push(t.transfer_ms);
        pages.push(t.pages_received as f64);
        ratio.push(t.transfer_ms / (ttft * 1e3));
        per.push(json!({
            "ttft_s": ttft,
            "transfer_ms": num(t.transfer_ms),
            "wait_ms": num(t.wait_ms),
            "pages_received": t.pages_received,
            "pages_skipped": t.pages_skipped,
            "prompt_tokens": l.prompt_tokens,
        }));
    }
    v["transfer_ms_p50"] = num(percentile(&ms, 50.0));
    v["transfer_vs_ttft_p50"] = num(percentile(&ratio, 50.0));
    v["transfer_pct_of_ttft_p50"] = num(100.0 * percentile(&ratio, 50.0));
    v["pages_p50"] = num(percentile(&pages, 50.0));
    v["long_prompt_transfers"] = Value::Array(per);
    v["long_prompts_without_transfer"] = json!(run.long.len() - ms.len());
}

/// The follow-up turn: whether turn 2 moved only the pages past turn 1's prompt (some
/// skipped, and at most the pages its new tokens span plus one for the page turn 1's
/// prompt ends inside).
pub(super) fn follow_up_json(t1: &Streamed, t2: &Streamed, page_size: Option<u64>) -> Value {
    let (Some(a), Some(b)) = (t1.transfer, t2.transfer) else {
        return json!({"error": "a follow-up answer had no meta_info.disaggregation"});
    };
    let new_tokens = t2.prompt_tokens.saturating_sub(t1.prompt_tokens);
    let new_pages = page_size.map(|p| new_tokens.div_ceil(p.max(1)) + 1);
    let only_new = b.pages_skipped > 0
        && b.pages_received < a.pages_received
        && new_pages.is_none_or(|n| b.pages_received <= n);
    json!({
        "turn1_pages_received": a.pages_received,
        "turn2_pages_received": b.pages_received,
        "turn2_pages_skipped": b.pages_skipped,
        "turn1_prompt_tokens": t1.prompt_tokens,
        "turn2_prompt_tokens": t2.prompt_tokens,
        "page_size": page_size,
        "turn2_transfer_ms": num(b.transfer_ms),
        "moves_only_new_pages": only_new,
    })
}

/// `b / a` of two numbers in `out`, where both are present and `a` is not zero.
fn ratio(a: Option<f64>, b: Option<f64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if a != 0.0 => num(b / a),
        _ => Value::Null,
    }
}

/// The `goals` object of the phases in `out`.
pub(super) fn goals(out: &Value) -> Value {
    let f = |phase: &str, key: &str| out.get(phase).and_then(|p| p.get(key)?.as_f64());
    let base = f("baseline", "itl_p99_ms");
    json!({
        "pd_itl_p99_vs_baseline": ratio(base, f("pd", "itl_p99_ms")),
        "unified_itl_p99_vs_baseline": ratio(base, f("unified", "itl_p99_ms")),
        "pd_server_itl_p99_vs_baseline": ratio(
            f("baseline", "server_itl_p99_ms"),
            f("pd", "server_itl_p99_ms")
        ),
        "unified_server_itl_p99_vs_baseline": ratio(
            f("baseline", "server_itl_p99_ms"),
            f("unified", "server_itl_p99_ms")
        ),
        "transfer_vs_ttft": num(f("pd", "transfer_vs_ttft_p50").unwrap_or(f64::NAN)),
        "follow_up_moves_only_new_pages":
            out["pd"]["follow_up"]["moves_only_new_pages"].as_bool(),
    })
}

/// A number of `v` for the table, `-` where absent.
fn cell(v: &Value, key: &str, decimals: usize) -> String {
    v.get(key)
        .and_then(Value::as_f64)
        .map_or_else(|| "-".into(), |x| format!("{x:.decimals$}"))
}

/// Prints the phases of `out` and its goals.
pub(super) fn print_table(out: &Value) {
    println!();
    println!(
        "{:<9} {:>10} {:>10} {:>10} {:>15} {:>15} {:>9}",
        "phase",
        "ITL p50 ms",
        "ITL p99 ms",
        "TTFT p50 s",
        "transfer p50 ms",
        "transfer % TTFT",
        "pages p50"
    );
    for name in ["baseline", "unified", "pd"] {
        let Some(v) = out.get(name) else { continue };
        println!(
            "{name:<9} {:>10} {:>10} {:>10} {:>15} {:>15} {:>9}",
            cell(v, "itl_p50_ms", 1),
            cell(v, "itl_p99_ms", 1),
            cell(v, "ttft_p50_s", 3),
            cell(v, "transfer_ms_p50", 1),
            cell(v, "transfer_pct_of_ttft_p50", 1),
            cell(v, "pages_p50", 0),
        );
    }
    if let Some(f) = out.get("pd").and_then(|p| p.get("follow_up")) {
        println!(
            "follow-up: turn 1 received {} pages; turn 2 received {}, skipped {}",
            f["turn1_pages_received"], f["turn2_pages_received"], f["turn2_pages_skipped"]
        );
    }
    let g = &out["goals"];
    let verdict = |x: Option<f64>, goal: f64| match x {
        Some(x) if x <= goal => format!("{x:.3} (goal <= {goal}: met)"),
        Some(x) => format!("{x:.3} (goal <= {goal}: not met)"),
        None => "-".into(),
    };
    println!(
        "pd ITL p99 / baseline:      {} (the decode server's own: {})",
        verdict(g["pd_itl_p99_vs_baseline"].as_f64(), PD_ITL_P99_GOAL),
        cell(g, "pd_server_itl_p99_vs_baseline", 3)
    );
    println!(
        "unified ITL p99 / baseline: {}",
        cell(g, "unified_itl_p99_vs_baseline", 3)
    );
    println!(
        "transfer / TTFT (p50):      {}",
        verdict(g["transfer_vs_ttft"].as_f64(), TRANSFER_VS_TTFT_GOAL)
    );
    println!(
        "follow-up moves only new pages: {}",
        g["follow_up_moves_only_new_pages"]
    );
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC; the proleptic Gregorian
/// calendar, Hinnant's `civil_from_days`).
pub(crate) fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::super::workload::Transfer;
    use super::*;

    fn streamed(times: &[f64], prompt_tokens: u64, transfer: Option<Transfer>) -> Streamed {
        Streamed {
            token_times: times.to_vec(),
            prompt_tokens,
            completion_tokens: times.len() as u64,
            transfer,
            ..Default::default()
        }
    }

    fn transfer(received: u64, skipped: u64, ms: f64) -> Transfer {
        Transfer {
            pages_received: received,
            pages_skipped: skipped,
            transfer_ms: ms,
            wait_ms: 1.0,
        }
    }

    #[test]
    fn percentiles_and_dates() {
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), 2.5);
        let v: Vec<f64> = (1..=101).map(f64::from).collect();
        assert!((percentile(&v, 99.0) - 100.0).abs() < 1e-9);
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(utc_date(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_date(951_782_400 + 3661), "2000-02-29T01:01:01Z");
        assert_eq!(utc_date(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn phases_transfers_and_goals() {
        let run = LoadRun {
            streams: vec![
                streamed(&[0.1, 0.11, 0.13], 10, None),
                streamed(&[0.2, 0.21], 10, None),
            ],
            long: vec![
                streamed(&[1.0], 2000, Some(transfer(125, 0, 50.0))),
                streamed(&[2.0], 2000, Some(transfer(125, 0, 100.0))),
                streamed(&[3.0], 2000, None),
            ],
            wall: 2.0,
        };
        let mut v = phase_json(&run);
        assert_eq!(v["itl_samples"], 3);
        assert!((v["itl_p50_ms"].as_f64().expect("p50") - 10.0).abs() < 1e-9);
        assert_eq!(v["ttft_p50_s"], 2.0);
        assert_eq!(v["stream_tok_s"], 2.5);
        add_transfers(&mut v, &run);
        assert_eq!(v["transfer_ms_p50"], 75.0);
        assert_eq!(v["transfer_vs_ttft_p50"], 0.05);
        assert_eq!(v["pages_p50"], 125.0);
        assert_eq!(v["long_prompts_without_transfer"], 1);

        let t1 = streamed(&[1.0], 1000, Some(transfer(63, 0, 9.0)));
        let ok = streamed(&[0.1], 1040, Some(transfer(3, 62, 1.0)));
        let f = follow_up_json(&t1, &ok, Some(16));
        assert_eq!(f["moves_only_new_pages"], true);
        let all = streamed(&[0.1], 1040, Some(transfer(65, 0, 9.0)));
        assert_eq!(
            follow_up_json(&t1, &all, Some(16))["moves_only_new_pages"],
            false
        );
        assert!(follow_up_json(&t1, &streamed(&[0.1], 1040, None), Some(16))
            .get("error")
            .is_some());

        let out = json!({
            "baseline": {"itl_p99_ms": 20.0, "server_itl_p99_ms": 10.0},
            "unified": {"itl_p99_ms": 80.0, "server_itl_p99_ms": 60.0},
            "pd": {"itl_p99_ms": 25.0, "server_itl_p99_ms": 12.0, "transfer_vs_ttft_p50": 0.05,
                   "follow_up": f},
        });
        assert_eq!(
            goals(&out),
            json!({"pd_itl_p99_vs_baseline": 1.25, "unified_itl_p99_vs_baseline": 4.0,
                   "pd_server_itl_p99_vs_baseline": 1.2,
                   "unified_server_itl_p99_vs_baseline": 6.0,
                   "transfer_vs_ttft": 0.05, "follow_up_moves_only_new_pages": true})
        );
        let g = goals(&json!({"unified": {"itl_p99_ms": 1.0}}));
        assert_eq!(g["pd_itl_p99_vs_baseline"], Value::Null);
        assert_eq!(g["follow_up_moves_only_new_pages"], Value::Null);
    }
}
