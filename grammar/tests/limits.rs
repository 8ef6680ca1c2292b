//! Hostile inputs: deep nesting and huge grammars are refused with an error naming the
//! limit (or compiled), never a stack overflow, and compiles stay within their deadline.
//!
//! Every compile here runs on a thread with a 2 MiB stack (what a server's blocking pool
//! gives its threads): a recursion that is not bounded overflows it and aborts the test
//! binary, so these tests fail loudly instead of passing by luck on a larger stack.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sglrs_grammar::{CompileError, CompileOptions, CompiledGrammar, GrammarSpec, Matcher};

/// A normal thread stack: 2 MiB.
const STACK: usize = 2 << 20;

/// Compiles `spec` over the byte vocabulary with `opts` on a 2 MiB-stack thread.
fn compile_on_small_stack(
    spec: GrammarSpec,
    opts: CompileOptions,
) -> Result<Arc<CompiledGrammar>, CompileError> {
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || CompiledGrammar::compile(&spec, common::byte_vocab(), &opts))
        .expect("spawn")
        .join()
        .expect("the compile thread panicked")
}

fn compile_small(spec: GrammarSpec) -> Result<Arc<CompiledGrammar>, CompileError> {
    compile_on_small_stack(spec, CompileOptions::default())
}

fn accepts(g: &Arc<CompiledGrammar>, text: &str) -> bool {
    common::accepts_text(g, text)
}

fn nested_gbnf(depth: usize) -> String {
    format!("root ::= {}\"a\"{}\n", "(".repeat(depth), ")".repeat(depth))
}

#[test]
fn gbnf_ten_thousand_nested_groups_are_refused() {
    let t = Instant::now();
    let e = compile_small(GrammarSpec::Ebnf(nested_gbnf(10_000))).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, CompileError::LimitExceeded { .. }),
        "unexpected error {msg}"
    );
    assert!(msg.contains("nesting") && msg.contains("128"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[test]
fn gbnf_nesting_at_the_limit_compiles_on_a_small_stack() {
    let g = compile_small(GrammarSpec::Ebnf(nested_gbnf(128))).unwrap();
    assert!(accepts(&g, "a"));
    assert!(!accepts(&g, "aa"));
    let e = compile_small(GrammarSpec::Ebnf(nested_gbnf(129))).unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 128, .. }),
        "{e}"
    );
}

#[test]
fn gbnf_deep_nesting_with_repetitions_compiles_on_a_small_stack() {
    // Every level a repeated group with alternatives: the frames of the repetition and
    // alternative code are on the stack at every level.
    let depth = 128;
    let g = format!(
        "root ::= {}\"a\"{}\n",
        "(\"x\" | ".repeat(depth),
        ")?".repeat(depth)
    );
    let g = compile_small(GrammarSpec::Ebnf(g)).unwrap();
    assert!(accepts(&g, "a"));
    assert!(accepts(&g, "x"));
    assert!(!accepts(&g, "xa"));
}

#[test]
fn gbnf_classes_cut_off_anywhere_are_refused() {
    // Found by the `grammar` fuzz target under AddressSanitizer: a range with no upper end
    // at the end of the grammar read past it.
    for g in [
        "root ::= [a-",
        "root ::= [a",
        "root ::= [",
        "root ::= [^",
        "root ::= [\\",
    ] {
        let e = compile_small(GrammarSpec::Ebnf(g.into())).unwrap_err();
        assert!(
            e.to_string().contains("class") || e.to_string().contains("escape"),
            "{g}: {e}"
        );
    }
}

#[test]
fn gbnf_size_limits_name_the_limit() {
    // Too many rules.
    let mut g = String::from("root ::= r0\n");
    for i in 0..10_000 {
        g.push_str(&format!("r{i} ::= \"a\"\n"));
    }
    let e = compile_small(GrammarSpec::Ebnf(g)).unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 10_000, .. })
            && e.to_string().contains("rules"),
        "{e}"
    );
    // Too long.
    let g = format!("root ::= \"{}\"\n", "a".repeat(600_000));
    let e = compile_small(GrammarSpec::Ebnf(g)).unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 524_288, .. })
            && e.to_string().contains("bytes"),
        "{e}"
    );
    // Too many alternatives.
    let g = format!("root ::= \"a\"{}\n", " | \"a\"".repeat(70_000));
    let e = compile_small(GrammarSpec::Ebnf(g)).unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 65_536, .. })
            && e.to_string().contains("alternatives"),
        "{e}"
    );
    // A repetition count past the limit.
    let e = compile_small(GrammarSpec::Ebnf("root ::= \"a\"{0,10001}\n".into())).unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 10_000, .. })
            && e.to_string().contains("repetition"),
        "{e}"
    );
    // Just inside the limits these compile.
    let g = compile_small(GrammarSpec::Ebnf("root ::= \"a\"{2,10000}\n".into())).unwrap();
    assert!(accepts(&g, "aa"));
    assert!(!accepts(&g, "a"));
}

#[test]
fn gbnf_repeated_empty_strings_cost_nothing() {
    // The empty string repeated any number of times is the empty string: built once, not
    // ten thousand times inside a group repeated ten thousand times.
    let t = Instant::now();
    let g = compile_small(GrammarSpec::Ebnf(
        "root ::= (\"\"{10000}){10000} \"b\"\n".into(),
    ))
    .unwrap();
    assert!(accepts(&g, "b"));
    assert!(!accepts(&g, ""));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // Repeated groups multiply: refused by the state limit, quickly.
    let t = Instant::now();
    let e = compile_small(GrammarSpec::Ebnf(
        "root ::= ((\"\"{10000}){10000}){10000} \"b\"\n".into(),
    ))
    .unwrap_err();
    assert!(matches!(e, CompileError::TooLarge { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

fn rule_chain(n: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..n - 1 {
        g.push_str(&format!("r{i} ::= \"a\" r{}\n", i + 1));
    }
    g.push_str(&format!("r{} ::= \"a\"\n", n - 1));
    g
}

#[test]
fn gbnf_fifty_thousand_rule_chain_answers_within_the_deadline() {
    let t = Instant::now();
    let e = compile_small(GrammarSpec::Ebnf(rule_chain(50_000))).unwrap_err();
    assert!(matches!(e, CompileError::LimitExceeded { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn gbnf_rule_chain_under_the_limits_compiles_within_the_deadline() {
    let t = Instant::now();
    // The matcher follows calls 256 deep, so no text of this one could be completed: the
    // compile says so by that limit, within the deadline.
    let e = compile_small(GrammarSpec::Ebnf(rule_chain(9_999))).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 256, .. }),
        "{e}"
    );
    // A chain the matcher can follow to its end is exact.
    let g = compile_small(GrammarSpec::Ebnf(rule_chain(200))).unwrap();
    assert!(accepts(&g, &"a".repeat(200)));
    assert!(!accepts(&g, &"a".repeat(199)));
    assert!(!accepts(&g, &"a".repeat(201)));
}

#[test]
fn gbnf_deadline_holds_for_a_grammar_under_the_size_limits() {
    // 2.5 million character classes (millions of NFA states), inside every size limit: with
    // the state limit lifted, only the deadline can stop it.
    let g = "root ::= ((([a-z] [0-9]){100}){100}){125}\n";
    let opts = CompileOptions {
        max_states: usize::MAX,
        timeout: Some(Duration::from_millis(200)),
        ..CompileOptions::default()
    };
    let t = Instant::now();
    let r = compile_on_small_stack(GrammarSpec::Ebnf(g.into()), opts);
    let took = t.elapsed();
    assert!(took < Duration::from_millis(1_000), "{took:?}");
    match r {
        Err(CompileError::Timeout) => {}
        Ok(_) => panic!("built a large grammar in {took:?}; make the test grammar larger"),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn gbnf_deadline_of_one_second_holds() {
    let g = "root ::= ((([a-z] [0-9]){100}){100}){125}\n";
    let opts = CompileOptions {
        max_states: usize::MAX,
        ..CompileOptions::default()
    };
    let t = Instant::now();
    let r = compile_on_small_stack(GrammarSpec::Ebnf(g.into()), opts);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(
        matches!(r, Ok(_) | Err(CompileError::Timeout)),
        "unexpected {:?}",
        r.err()
    );
}

#[test]
fn regex_ten_thousand_nested_groups_are_refused() {
    let p = format!("{}a{}", "(".repeat(10_000), ")".repeat(10_000));
    let e = compile_small(GrammarSpec::Regex(p)).unwrap_err();
    assert!(matches!(e, CompileError::Regex { .. }), "{e}");
    assert!(e.to_string().contains("nest"), "{e}");
    // Non-capturing groups and classes inside groups likewise.
    let p = format!("{}[a-z]{}", "(?:".repeat(10_000), ")*".repeat(10_000));
    let e = compile_small(GrammarSpec::Regex(p)).unwrap_err();
    assert!(matches!(e, CompileError::Regex { .. }), "{e}");
}

#[test]
fn regex_nesting_just_inside_the_parser_limit_compiles_on_a_small_stack() {
    let p = format!("{}a{}", "(".repeat(120), ")".repeat(120));
    let g = compile_small(GrammarSpec::Regex(p)).unwrap();
    assert!(accepts(&g, "a"));
    // Each level is a group, an alternation and a repetition to the parser.
    let p = format!("{}a{}", "(?:b|".repeat(80), ")+".repeat(80));
    let g = compile_small(GrammarSpec::Regex(p)).unwrap();
    assert!(accepts(&g, "a"));
    assert!(accepts(&g, "bb"));
}

#[test]
fn regex_exploding_repetitions_are_refused_quickly() {
    // A billion states once expanded.
    let t = Instant::now();
    let e = compile_small(GrammarSpec::Regex("((a{1000}){1000}){1000}".into())).unwrap_err();
    assert!(
        matches!(
            e,
            CompileError::Regex { .. } | CompileError::TooLarge { .. }
        ),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// `wrap` applied `depth` times around `leaf`.
fn nest(depth: usize, leaf: Value, wrap: impl Fn(Value) -> Value) -> Value {
    (0..depth).fold(leaf, |v, _| wrap(v))
}

/// Wraps a schema one level deeper.
type Wrap = fn(Value) -> Value;

/// Schema shapes that nest.
fn wrappers() -> Vec<(&'static str, Wrap)> {
    vec![
        (
            "properties",
            |v| json!({"type": "object", "properties": {"a": v}, "required": ["a"]}),
        ),
        ("items", |v| json!({"type": "array", "items": v})),
        ("anyOf", |v| json!({"anyOf": [v, {"type": "null"}]})),
        ("allOf", |v| json!({"allOf": [v, {}]})),
        ("oneOf", |v| json!({"oneOf": [v, {"type": "null"}]})),
        ("not", |v| json!({"not": v})),
        (
            "additionalProperties",
            |v| json!({"type": "object", "additionalProperties": v}),
        ),
        ("prefixItems", |v| json!({"prefixItems": [v]})),
        ("if", |v| json!({"if": v, "then": {"type": "string"}})),
        (
            "then",
            |v| json!({"if": {"type": "object"}, "then": v, "else": {"type": "null"}}),
        ),
        ("mixed", |v| {
            json!({"type": "object", "properties": {"a": {"anyOf": [
                {"allOf": [{"not": {"not": {"if": {"type": "array"}, "then": {"items": v}}}},
                    {"type": ["object", "array"]}]},
                {"type": "null"}
            ]}}})
        }),
    ]
}

#[test]
fn json_ten_thousand_nested_objects_are_refused() {
    let leaf = json!({"type": "string"});
    for (name, wrap) in wrappers() {
        let text = nest(1, leaf.clone(), wrap).to_string();
        // Splice the wrapper textually 10,000 times (a `Value` that deep cannot even be
        // dropped on a small stack).
        let (open, close) = text.split_at(text.find(&leaf.to_string()).unwrap());
        let close = &close[leaf.to_string().len()..];
        let deep = format!("{}{}{}", open.repeat(10_000), leaf, close.repeat(10_000));
        let e = compile_small(GrammarSpec::JsonSchema(deep)).unwrap_err();
        assert!(matches!(e, CompileError::Json(_)), "{name}: {e}");
    }
}

#[test]
fn json_nesting_as_deep_as_json_allows_does_not_overflow() {
    // serde_json parses up to 128 levels; each wrapper takes one or two of them.
    let leaf = json!({"type": "string"});
    for (name, wrap) in wrappers() {
        for depth in [10, 40, 60, 120] {
            let v = nest(depth, leaf.clone(), wrap);
            let text = v.to_string();
            if serde_json::from_str::<Value>(&text).is_err() {
                continue;
            }
            // Compiles or names what it refuses; what matters is that it answers.
            let r = compile_small(GrammarSpec::JsonSchema(text));
            if let Err(e) = &r {
                assert!(
                    !matches!(e, CompileError::Json(_)),
                    "{name} at {depth}: {e}"
                );
            }
        }
    }
    // A deep object schema compiles exactly.
    let v = nest(60, leaf, wrappers()[0].1);
    let g = compile_small(GrammarSpec::JsonSchema(v.to_string())).unwrap();
    let text = format!("{}\"x\"{}", "{\"a\":".repeat(60), "}".repeat(60));
    assert!(accepts(&g, &text));
    assert!(!accepts(&g, &text[5..]));
}

#[test]
fn json_schema_value_deeper_than_json_text_allows_is_refused() {
    // Built in code, a value can nest deeper than any parsed one.
    let v = nest(
        1_000,
        json!({"type": "string"}),
        |v| json!({"type": "array", "items": v}),
    );
    let v = Arc::new(v);
    let v2 = v.clone();
    let r = std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            CompiledGrammar::json_schema_value(&v2, common::byte_vocab(), &Default::default())
                .map(|_| ())
        })
        .unwrap()
        .join()
        .expect("the compile thread panicked");
    let e = r.unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 128, .. }),
        "{e}"
    );
    // Dropping a value this deep recurses too: leave it to the process.
    std::mem::forget(v);
}

/// A schema whose `$defs` chain `d0 → d1 → … → d{n-1}`, each link wrapped by `wrap`.
fn ref_chain(n: usize, wrap: Wrap) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n - 1 {
        defs.insert(
            format!("d{i}"),
            wrap(json!({"$ref": format!("#/$defs/d{}", i + 1)})),
        );
    }
    defs.insert(format!("d{}", n - 1), json!({"type": "string"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

#[test]
fn json_long_ref_chains_do_not_overflow() {
    let mut shapes = wrappers();
    shapes.push(("bare", |v| v));
    for (name, wrap) in shapes {
        let t = Instant::now();
        let v = ref_chain(10_000, wrap);
        let r = compile_small(GrammarSpec::JsonSchema(v.to_string()));
        if let Err(e) = &r {
            assert!(!matches!(e, CompileError::Json(_)), "{name}: {e}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{name}: {:?}",
            t.elapsed()
        );
        // Under `not` too (the complement follows the references).
        let v = json!({"$defs": v["$defs"], "not": {"$ref": "#/$defs/d0"}});
        let r = compile_small(GrammarSpec::JsonSchema(v.to_string()));
        if let Err(e) = &r {
            assert!(!matches!(e, CompileError::Json(_)), "not {name}: {e}");
        }
    }
}

#[test]
fn json_bare_ref_chain_compiles_exactly() {
    let v = ref_chain(10_000, |v| v);
    let g = compile_small(GrammarSpec::JsonSchema(v.to_string())).unwrap();
    assert!(accepts(&g, "\"x\""));
    assert!(!accepts(&g, "1"));
}

/// A chain longer than the matcher's call depth (a call every 48 inlined links) is refused
/// by that limit's name, not as a grammar that "accepts no text" (it accepts strings).
#[test]
fn json_ref_chain_past_the_call_depth_names_the_limit() {
    let v = ref_chain(20_000, |v| v);
    let e = compile_small(GrammarSpec::JsonSchema(v.to_string())).unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 256, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("rule-call nesting"), "{e}");
}

/// Rules that each wrap the next in parentheses, 300 deep: every complete text nests 300
/// calls, past the matcher's depth. The compile says so by the limit's name; it used to
/// compile and then answer every request that the shortest output had no spelling. The
/// same chain within the depth compiles and matches.
#[test]
fn gbnf_nesting_past_the_call_depth_names_the_limit() {
    let chain = |n: usize| {
        let mut g = String::from("root ::= r0\n");
        for i in 0..n {
            g.push_str(&format!("r{i} ::= \"(\" r{} \")\"\n", i + 1));
        }
        g.push_str(&format!("r{n} ::= \"a\"\n"));
        g
    };
    let e = compile_small(GrammarSpec::Ebnf(chain(300))).unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { max: 256, .. }),
        "{e}"
    );
    let g = compile_small(GrammarSpec::Ebnf(chain(200))).unwrap();
    let text = format!("{}a{}", "(".repeat(200), ")".repeat(200));
    assert!(accepts(&g, &text));
    assert!(!accepts(&g, &text[1..]));
}

/// Schemas built around value lists of tens of thousands of entries: each list is checked
/// through a set, so the compile answers (compiled, too large, or past the deadline) within
/// about its 1 s deadline. Before, every value was looked up in the list by a walk (and no
/// state is built meanwhile, so the deadline was never looked at): 30 s for the first shape,
/// 69 s for `uniqueItems` over such items, 4 s for a `oneOf` of 5,000 `const`s.
#[test]
fn json_long_value_lists_answer_within_the_deadline() {
    let n = 100_000;
    let strs = |lo: usize, hi: usize| -> Vec<Value> {
        (lo..hi).map(|i| Value::String(i.to_string())).collect()
    };
    let shapes: Vec<(&str, Value)> = vec![
        ("enum", json!({"enum": strs(0, n)})),
        (
            "enum and pattern",
            json!({"type": "string", "pattern": "^[0-9]+$", "enum": strs(0, n)}),
        ),
        (
            "not enum",
            json!({"type": "string", "not": {"enum": strs(0, n)}}),
        ),
        (
            "allOf of enums",
            json!({"allOf": [{"enum": strs(0, n)}, {"enum": strs(n / 2, n + n / 2)}]}),
        ),
        (
            "oneOf of enums",
            json!({"oneOf": [{"enum": strs(0, n)}, {"enum": strs(n, 2 * n)}]}),
        ),
        (
            "unique enum items",
            json!({"type": "array", "uniqueItems": true, "items": {"enum": strs(0, n)}}),
        ),
        (
            "oneOf of consts",
            json!({"oneOf": strs(0, 5_000).into_iter().map(|c| json!({"const": c})).collect::<Vec<_>>()}),
        ),
        (
            "object enum",
            json!({"type": "object", "enum": (0..50_000).map(|i| json!({"a": i})).collect::<Vec<_>>()}),
        ),
    ];
    for (name, v) in shapes {
        let t = Instant::now();
        let r = compile_small(GrammarSpec::JsonSchema(v.to_string()));
        let took = t.elapsed();
        assert!(took < Duration::from_secs(5), "{name}: {took:?}");
        match r {
            Ok(_) | Err(CompileError::Timeout | CompileError::TooLarge { .. }) => {}
            Err(e) => panic!("{name}: unexpected error {e}"),
        }
    }
}

/// The set-based checks keep the language: an `enum` of 3,000 values beside a `pattern`,
/// a `not: {enum}` and an `allOf` intersection accepts exactly the values left.
#[test]
fn json_value_lists_checked_through_sets_keep_the_language() {
    let strs = |lo: usize, hi: usize| -> Vec<Value> {
        (lo..hi).map(|i| Value::String(format!("v{i}"))).collect()
    };
    let v = json!({"allOf": [
        {"enum": strs(0, 3_000), "pattern": "^v[0-9]*[02468]$"},
        {"enum": strs(1_000, 4_000)},
        {"not": {"enum": strs(2_000, 2_500)}},
    ]});
    let g = compile_small(GrammarSpec::JsonSchema(v.to_string())).unwrap();
    for i in [
        0, 998, 999, 1_000, 1_001, 1_998, 2_000, 2_498, 2_500, 2_998, 2_999, 3_000,
    ] {
        let want = (1_000..3_000).contains(&i) && !(2_000..2_500).contains(&i) && i % 2 == 0;
        assert_eq!(accepts(&g, &format!("\"v{i}\"")), want, "v{i}");
    }
    // Numbers by value: `1.0` in the list matches the integer spelling, not a string.
    let g = compile_small(GrammarSpec::JsonSchema(
        json!({"enum": (0..100).map(|i| json!(i as f64 + 0.5)).chain([json!(1.0)]).collect::<Vec<_>>(),
               "not": {"enum": [2.5, 3.5]}})
        .to_string(),
    ))
    .unwrap();
    assert!(accepts(&g, "1") && accepts(&g, "1.5") && accepts(&g, "4.5"));
    assert!(!accepts(&g, "2.5") && !accepts(&g, "3.5") && !accepts(&g, "\"1\""));
}

/// Grammars whose recursion parses the same text in exponentially many ways: each parse is
/// a call stack, and following them all filled the host's memory within a few dozen bytes
/// (`x ::= "a" x | "a" x "b" | ""` doubled its stacks per `a`: 17 s for the 21st byte,
/// then 2.4 GB for one hash table; the left-recursive one at the second byte). Now the
/// matcher stops at its thread limits with `MatchError::TooAmbiguous`, within a fraction
/// of a second per step, and every later matcher of the grammar reports it too; grammars
/// ambiguous from their first byte are refused at compile time.
#[test]
fn ambiguous_recursions_end_in_an_error_not_a_runaway() {
    use sglrs_grammar::MatchError;
    let mask_words = common::byte_vocab().mask_words();
    for g in [
        "root ::= x\nx ::= \"a\" x | \"a\" x \"b\" | \"\"\n",
        "root ::= x+\nx ::= \"a\" | \"a\" x | x \"a\" | \"b\"\n",
    ] {
        let t = Instant::now();
        let cg = compile_small(GrammarSpec::Ebnf(g.into())).unwrap();
        let mut m = Matcher::new(cg.clone());
        let mut mask = vec![0u32; mask_words];
        let mut failed = None;
        for i in 0..64 {
            let step = Instant::now();
            let r = m.fill_mask(&mut mask);
            let ok = m.try_advance_bytes(b"a");
            assert!(
                step.elapsed() < Duration::from_secs(3),
                "{g:?} byte {i}: {:?}",
                step.elapsed()
            );
            if r.is_err() || !ok {
                failed = Some((i, r.err().or(m.error().cloned())));
                break;
            }
        }
        let (at, err) = failed.unwrap_or_else(|| panic!("{g:?}: 64 bytes followed"));
        assert!(
            matches!(err, Some(MatchError::TooAmbiguous { .. })),
            "{g:?} at byte {at}: {err:?}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{g:?}: {:?}",
            t.elapsed()
        );
        // What the automaton holds is counted, so the grammar cache's byte limit sees it.
        assert!(
            cg.heap_bytes() > 1 << 20,
            "{g:?}: {} bytes",
            cg.heap_bytes()
        );
        // Sticky for the grammar: a new matcher reports it at once.
        let fresh = Matcher::new(cg);
        assert!(matches!(
            fresh.fill_mask(&mut mask),
            Err(MatchError::TooAmbiguous { .. })
        ));
    }
    // Ambiguous from the start: refused by the compile, naming the limit.
    let e = compile_small(GrammarSpec::Ebnf(
        "root ::= e\ne ::= e \"+\" e | e \"*\" e | \"(\" e \")\" | [a-z]+ | e e\n".into(),
    ))
    .unwrap_err();
    assert!(
        matches!(e, CompileError::LimitExceeded { .. }) && e.to_string().contains("ambiguous"),
        "{e}"
    );
}

/// Recursions that are not ambiguous keep working up to the stack depth: `a^n b^n` with
/// n = 200, and left recursion (`root ::= root "a" | "b"`).
#[test]
fn unambiguous_recursions_still_match_deep() {
    let g = compile_small(GrammarSpec::Ebnf(
        "root ::= x\nx ::= \"a\" x \"b\" | \"\"\n".into(),
    ))
    .unwrap();
    let text = format!("{}{}", "a".repeat(200), "b".repeat(200));
    assert!(accepts(&g, &text));
    assert!(!accepts(
        &g,
        &format!("{}{}", "a".repeat(200), "b".repeat(199))
    ));
    let g = compile_small(GrammarSpec::Ebnf("root ::= root \"a\" | \"b\"\n".into())).unwrap();
    assert!(accepts(&g, &format!("b{}", "a".repeat(100))));
    assert!(!accepts(&g, "ab"));
}

/// Equal branches of an `anyOf` are one branch: under a recursive `$ref` two equal ones
/// doubled the matcher's threads per level, and nesting 17 deep ran past the thread limit.
#[test]
fn equal_any_of_branches_do_not_multiply_parses() {
    let v = json!({"anyOf": [
        {"type": "array", "items": {"$ref": "#"}},
        {"type": "array", "items": {"$ref": "#"}},
    ]});
    let g = compile_small(GrammarSpec::JsonSchema(v.to_string())).unwrap();
    let deep = format!("{}{}", "[".repeat(60), "]".repeat(60));
    assert!(accepts(&g, &deep));
    assert!(!accepts(&g, "[[]"));
}

/// Where declared properties in any order make a schema too large, it compiles in schema
/// order (stricter, never looser) instead of being refused.
#[test]
fn any_order_too_large_falls_back_to_schema_order() {
    let props: serde_json::Map<String, Value> = (0..8)
        .map(|i| (format!("key{i}"), json!({"type": "integer"})))
        .collect();
    let schema = json!({"type": "object", "properties": props, "additionalProperties": false});
    let states = |any: bool, max_states: usize| {
        let opts = CompileOptions {
            any_property_order: any,
            max_states,
            ..CompileOptions::default()
        };
        CompiledGrammar::json_schema_value(&schema, common::byte_vocab(), &opts)
    };
    let in_order = states(false, usize::MAX).unwrap().num_states();
    let any = states(true, usize::MAX).unwrap();
    assert!(
        any.num_states() > 4 * in_order,
        "{} vs {in_order}",
        any.num_states()
    );
    assert!(common::accepts_text(&any, r#"{"key7":1,"key0":2}"#));
    // Room for schema order only: the any-order compile runs out of states and retries.
    let limit = 2 * in_order;
    assert!(matches!(
        states(false, limit / 3),
        Err(CompileError::TooLarge { .. })
    ));
    let g = states(true, limit).unwrap();
    assert!(g.num_states() <= limit);
    assert!(common::accepts_text(&g, r#"{"key0":2,"key7":1}"#));
    assert!(!common::accepts_text(&g, r#"{"key7":1,"key0":2}"#));
    assert!(!common::accepts_text(&g, r#"{"key0":2,"key0":1}"#));
}
