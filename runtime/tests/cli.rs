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
