//! The `sglrs` command line: every engine setting is a `serve` flag, and bad flags are
//! refused by name before anything loads.

use std::process::Command;

fn sglrs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sglrs"))
        .args(args)
        .output()
        .expect("running the sglrs binary")
}

#[test]
fn serve_help_lists_the_engine_settings() {
    let out = sglrs(&["serve", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--host",
        "--port",
        "--model",
        "--page-size",
        "--kv-memory-mb",
        "--kv-cache-dtype",
        "--schedule-policy",
        "--chunked-prefill-size",
        "--max-batch-tokens",
        "--max-running-requests",
        "--threads",
        "--served-model-name",
        "--context-length",
        "--disable-jump-forward",
        "--quantize",
        "--admission-hold-ms",
        "--api-key",
    ] {
        assert!(
            help.contains(flag),
            "`sglrs serve --help` lacks {flag}:\n{help}"
        );
    }
}

#[test]
fn unknown_and_bad_flags_are_refused_by_name() {
    let out = sglrs(&["serve", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));

    let out = sglrs(&["serve", "--kv-cache-dtype", "f8"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("f8") && err.contains("--kv-cache-dtype"),
        "{err}"
    );
}

#[test]
fn a_missing_model_is_an_error_naming_it() {
    let out = sglrs(&["serve", "--model", "/nonexistent/model.gguf", "--port", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}

/// `sglrs bench executor --json`: one object on the last line, saying what ran (the page
/// order and the tokens per step included), with a decode figure for the batch asked for.
#[test]
fn bench_executor_json_names_what_ran() {
    let out = sglrs(&[
        "bench",
        "executor",
        "--threads",
        "1",
        "--prefill-tokens",
        "32",
        "--decode-prompt",
        "48",
        "--decode-steps",
        "2",
        "--batch",
        "2",
        "--repeat",
        "1",
        "--scatter-pages",
        "--step-tokens",
        "3",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("output");
    let v: serde_json::Value = serde_json::from_str(last).expect("JSON on the last line");
    assert_eq!(v["scatter_pages"], true);
    assert_eq!(v["step_tokens"], 3);
    assert_eq!(v["threads"], 1);
    assert!(v["prefill_tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["decode_tok_s"]["2"].as_f64().unwrap() > 0.0, "{v}");
}
