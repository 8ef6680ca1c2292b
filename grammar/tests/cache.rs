//! The grammar cache: compiled grammars are reused, failed compiles are remembered for a
//! while (the same error, no second compile), then forgotten.

mod common;

use std::time::Duration;

use sglrs_grammar::{CacheConfig, CompileOptions, GrammarCache, GrammarSpec, HandleState};

fn cache(cfg: CacheConfig) -> GrammarCache {
    GrammarCache::new(common::byte_vocab(), cfg)
}

fn bad(i: usize) -> GrammarSpec {
    GrammarSpec::Regex(format!("bad{i}("))
}

#[test]
fn a_compiled_grammar_is_reused() {
    let c = cache(CacheConfig::default());
    let spec = GrammarSpec::Regex("[a-z]+".into());
    let g = c
        .get_or_compile(spec.clone(), CompileOptions::default())
        .wait()
        .unwrap();
    let again = c.get_or_compile(spec, CompileOptions::default());
    match again.poll() {
        HandleState::Ready(h) => assert!(std::sync::Arc::ptr_eq(&g, &h)),
        other => panic!("not ready at once: {other:?}"),
    }
    assert_eq!(c.compiles(), 1);
    assert_eq!(c.len(), 1);
}

#[test]
fn a_failed_compile_is_remembered() {
    let c = cache(CacheConfig::default());
    let e = c
        .get_or_compile(bad(0), CompileOptions::default())
        .wait()
        .unwrap_err();
    assert_eq!(c.compiles(), 1);
    // Asked again: the same error at once, without compiling.
    let again = c.get_or_compile(bad(0), CompileOptions::default());
    match again.poll() {
        HandleState::Failed(e2) => assert_eq!(e2, e),
        other => panic!("not failed at once: {other:?}"),
    }
    assert_eq!(c.compiles(), 1);
    assert_eq!(c.len(), 1);
    // Keyed like compiled grammars: other options are another compile.
    let flexible = c.get_or_compile(bad(0), CompileOptions::flexible());
    assert!(flexible.wait().is_err());
    assert_eq!(c.compiles(), 2);
}

#[test]
fn a_failure_is_forgotten_after_its_ttl() {
    let c = cache(CacheConfig {
        failure_ttl: Duration::from_millis(50),
        ..CacheConfig::default()
    });
    assert!(c
        .get_or_compile(bad(0), CompileOptions::default())
        .wait()
        .is_err());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(c.len(), 0, "an expired failure is not an entry");
    assert!(c
        .get_or_compile(bad(0), CompileOptions::default())
        .wait()
        .is_err());
    assert_eq!(c.compiles(), 2);
}

#[test]
fn failures_remembered_are_bounded() {
    let c = cache(CacheConfig {
        max_failures: 2,
        ..CacheConfig::default()
    });
    for i in 0..3 {
        assert!(c
            .get_or_compile(bad(i), CompileOptions::default())
            .wait()
            .is_err());
    }
    assert_eq!(c.compiles(), 3);
    // The two latest are remembered, the oldest was forgotten.
    for i in [1, 2] {
        let h = c.get_or_compile(bad(i), CompileOptions::default());
        assert!(matches!(h.poll(), HandleState::Failed(_)), "bad({i})");
    }
    assert_eq!(c.compiles(), 3);
    assert!(c
        .get_or_compile(bad(0), CompileOptions::default())
        .wait()
        .is_err());
    assert_eq!(c.compiles(), 4);
}

#[test]
fn failures_do_not_hold_entries_of_compiled_grammars() {
    let c = cache(CacheConfig {
        max_entries: 2,
        ..CacheConfig::default()
    });
    let good = |p: &str| GrammarSpec::Regex(p.into());
    let opts = CompileOptions::default;
    c.get_or_compile(good("a+"), opts()).wait().unwrap();
    assert!(c.get_or_compile(bad(0), opts()).wait().is_err());
    c.get_or_compile(good("b+"), opts()).wait().unwrap();
    // Both compiled grammars fit beside the failure: the first is still there.
    assert!(matches!(
        c.get_or_compile(good("a+"), opts()).poll(),
        HandleState::Ready(_)
    ));
    assert_eq!(c.compiles(), 3);
}
