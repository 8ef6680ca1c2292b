//! The result object: figures of a `/get_server_info` answer, the memcpy baseline, the
//! ratios between the parts that ran, and the machine and command they ran on.

pub(super) use crate::common::{command_line, cpu_model};
use serde_json::{json, Map, Value};
use std::time::Instant;

/// Bytes of each buffer of the memcpy baseline.
pub(super) const MEMCPY_BYTES: usize = 256 << 20;
/// Copies of the memcpy baseline; the fastest counts.
pub(super) const MEMCPY_REPS: usize = 5;

/// `bytes` in `seconds` as GB/s (10^9 bytes per second), where `seconds` is positive and
/// finite.
pub(super) fn gb_s(bytes: u64, seconds: f64) -> Option<f64> {
    (seconds > 0.0 && seconds.is_finite()).then(|| bytes as f64 / seconds / 1e9)
}

/// The fastest of `reps` copies of one `bytes`-long buffer into another, GB/s (each byte
/// counted once). Both buffers are written first, so no copy pays for page faults.
pub(super) fn memcpy_gb_s(bytes: usize, reps: usize) -> Option<f64> {
    let mut src = vec![0u8; bytes];
    let mut dst = vec![0u8; bytes];
    src.fill(0x5a);
    dst.fill(0xa5);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    gb_s(bytes as u64, best)
}

/// The host tier's loads in a `/get_server_info` answer: `loaded_bytes` (bytes copied into
/// the device pool from the lower tiers) and `load_seconds_sum` of
/// `internal_states[0].hicache`, `host_hits` of `internal_states[0].hicache_store`, and
/// `host_load_gb_s` (bytes / seconds / 10^9). A key whose input the answer lacks is left
/// out, and `host_load_gb_s` too when no load took time.
pub(super) fn host_loads(info: &Value) -> Map<String, Value> {
    let state = &info["internal_states"][0];
    let bytes = state["hicache"]["loaded_bytes"].as_u64();
    let seconds = state["hicache"]["load_seconds_sum"].as_f64();
    let hits = state["hicache_store"]["host_hits"].as_u64();
    let mut m = Map::new();
    if let Some(b) = bytes {
        m.insert("loaded_bytes".into(), json!(b));
    }
    if let Some(s) = seconds {
        m.insert("load_seconds_sum".into(), json!(s));
    }
    if let Some(h) = hits {
        m.insert("host_hits".into(), json!(h));
    }
    if let Some(r) = bytes.zip(seconds).and_then(|(b, s)| gb_s(b, s)) {
        m.insert("host_load_gb_s".into(), json!(r));
    }
    m
}

/// `b / a`, where both are present and `a` is not zero.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a != 0.0 => Some(b / a),
        _ => None,
    }
}

/// The ratios of `out` that its keys allow: `x_vs_y` is x / y.
fn ratios(out: &Value) -> Value {
    let f = |part: &str, key: &str| out.get(part).and_then(|p| p.get(key)?.as_f64());
    let top = |key: &str| out.get(key).and_then(Value::as_f64);
    let mut r = Map::new();
    let mut put = |k: &str, v: Option<f64>| {
        if let Some(v) = v {
            r.insert(k.into(), json!(v));
        }
    };
    let off_tput = f("off", "throughput_req_s");
    put(
        "disk_throughput_vs_off",
        ratio(off_tput, f("disk", "throughput_req_s")),
    );
    put(
        "disk_ttft_p50_vs_off",
        ratio(f("off", "ttft_p50_s"), f("disk", "ttft_p50_s")),
    );
    put(
        "host_disk_throughput_vs_off",
        ratio(off_tput, f("host_disk", "throughput_req_s")),
    );
    put(
        "restart_warm_vs_cold",
        ratio(f("restart", "cold_ttft_s"), f("restart", "warm_ttft_s")),
    );
    put(
        "disk_read_vs_dd",
        ratio(top("dd_read_gb_s"), top("disk_read_gb_s")),
    );
    put(
        "host_load_vs_memcpy",
        ratio(top("memcpy_gb_s"), f("host", "host_load_gb_s")),
    );
    Value::Object(r)
}

/// Adds `cpu`, `ratios` and `command` to the parts that ran.
pub(super) fn assemble(mut out: Value, cpu: &str, command: &str) -> Value {
    out["cpu"] = json!(cpu);
    out["ratios"] = ratios(&out);
    out["command"] = json!(command);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_with_missing_parts() {
        let c = |tput: f64, p50: f64| json!({"throughput_req_s": tput, "ttft_p50_s": p50});
        let out = assemble(
            json!({"off": c(2.0, 0.4), "disk": c(3.0, 0.1)}),
            "cpu x",
            "sglrs bench hicache --only off,disk",
        );
        assert_eq!(out["cpu"], "cpu x");
        assert_eq!(out["command"], "sglrs bench hicache --only off,disk");
        let r = out["ratios"].as_object().expect("ratios");
        let keys: Vec<&str> = r.keys().map(String::as_str).collect();
        assert_eq!(keys, ["disk_throughput_vs_off", "disk_ttft_p50_vs_off"]);
        assert_eq!(r["disk_throughput_vs_off"], 1.5);
        assert_eq!(r["disk_ttft_p50_vs_off"], 0.25);
        assert!(out.get("host").is_none() && out.get("restart").is_none());

        let out = assemble(
            json!({"restart": {"cold_ttft_s": 2.0, "warm_ttft_s": 0.5},
                   "disk_read_gb_s": 1.0, "dd_read_gb_s": 2.0}),
            "c",
            "x",
        );
        assert_eq!(out["ratios"]["restart_warm_vs_cold"], 0.25);
        assert_eq!(out["ratios"]["disk_read_vs_dd"], 0.5);
        assert!(out["ratios"].get("disk_throughput_vs_off").is_none());
        assert_eq!(assemble(json!({}), "c", "x")["ratios"], json!({}));
    }

    #[test]
    fn gb_per_second() {
        assert_eq!(gb_s(3_000_000_000, 1.5), Some(2.0));
        assert_eq!(gb_s(1 << 30, 0.5), Some(2.147483648));
        assert_eq!(gb_s(0, 1.0), Some(0.0));
        assert_eq!(gb_s(100, 0.0), None);
        assert_eq!(gb_s(100, -1.0), None);
        assert_eq!(gb_s(100, f64::INFINITY), None);
        assert_eq!(gb_s(100, f64::NAN), None);
        // A copy that takes time gives a finite, positive rate.
        let m = memcpy_gb_s(1 << 20, 2).expect("a 1 MiB copy takes time");
        assert!(m.is_finite() && m > 0.0);
    }

    #[test]
    fn host_loads_with_missing_fields() {
        let info = json!({"internal_states": [{
            "hicache": {"loaded_bytes": 4_000_000_000u64, "load_seconds_sum": 2.0, "loads": 9},
            "hicache_store": {"host_hits": 120, "disk_hits": 0},
        }]});
        let m = Value::Object(host_loads(&info));
        assert_eq!(
            m,
            json!({"loaded_bytes": 4_000_000_000u64, "load_seconds_sum": 2.0,
                   "host_hits": 120, "host_load_gb_s": 2.0})
        );
        // No load took time: the inputs, no rate.
        let idle = json!({"internal_states": [{
            "hicache": {"loaded_bytes": 0, "load_seconds_sum": 0.0},
            "hicache_store": null,
        }]});
        assert_eq!(
            Value::Object(host_loads(&idle)),
            json!({"loaded_bytes": 0, "load_seconds_sum": 0.0})
        );
        // A server without a hierarchical cache, or no answer worth the name.
        let off = json!({"internal_states": [{"hicache": null, "hicache_store": null}]});
        assert!(host_loads(&off).is_empty());
        assert!(host_loads(&json!({})).is_empty());
        assert!(host_loads(&json!({"internal_states": []})).is_empty());
    }

    #[test]
    fn host_load_ratio_needs_both_rates() {
        let host = |v: Value| json!({"host": v, "memcpy_gb_s": 8.0});
        let out = assemble(
            host(json!({"throughput_req_s": 1.0, "host_load_gb_s": 6.0})),
            "c",
            "x",
        );
        assert_eq!(out["ratios"], json!({"host_load_vs_memcpy": 0.75}));
        assert_eq!(out["memcpy_gb_s"], 8.0);
        // The host server reported no load rate.
        let out = assemble(host(json!({"throughput_req_s": 1.0})), "c", "x");
        assert_eq!(out["ratios"], json!({}));
        // The host configuration did not run: no memcpy, no ratio.
        let out = assemble(json!({"off": {"throughput_req_s": 1.0}}), "c", "x");
        assert!(out.get("memcpy_gb_s").is_none());
        assert!(out["ratios"].get("host_load_vs_memcpy").is_none());
        // A zero memcpy rate gives no ratio rather than infinity.
        let out = assemble(
            json!({"host": {"host_load_gb_s": 6.0}, "memcpy_gb_s": 0.0}),
            "c",
            "x",
        );
        assert_eq!(out["ratios"], json!({}));
    }
}
