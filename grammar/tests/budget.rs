//! Closing within a token budget: an adversarial generator that takes, among the tokens
//! the budget-restricted mask allows, the one that opens the most nesting (or the longest,
//! or a random one), never EOS while anything else is allowed, must end with a complete
//! text that parses and validates — or the start must be refused because the planned
//! close from the start ([`CompiledGrammar::min_output_tokens`]) exceeds the budget.
//!
//! Schemas: a recursive tree node (the case of issue #22), and JSONSchemaBench schemas
//! picked for `$ref` cycles, deep nesting and counted arrays. Outputs are validated by
//! Python's `jsonschema` (the reference validator; `python3 -m pip install jsonschema`).

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher, TokenVocab};

/// JSONSchemaBench schemas with `$ref` cycles.
const RECURSIVE: &[&str] = &[
    "Github_easy---o58637.json",
    "Github_easy---o42304.json",
    "Github_easy---o35906.json",
    "Github_medium---o6020.json",
    "Github_medium---o83086.json",
    "Github_medium---o13135.json",
    "Github_hard---o79664.json",
    "Github_medium---o34351.json",
    "JsonSchemaStore---resjson.json",
    "JsonSchemaStore---jsone.json",
    "JsonSchemaStore---bigquery-table.json",
    "Handwritten---mod306.json",
];

/// JSONSchemaBench schemas nested 14 levels or more.
const DEEP: &[&str] = &[
    "Github_easy---o42289.json",
    "Github_medium---o85211.json",
    "Github_medium---o15178.json",
    "Handwritten---mod301.json",
    "Github_hard---o35767.json",
    "Github_hard---o9830.json",
];

/// JSONSchemaBench schemas with counted arrays (`minItems` / `maxItems`).
const ARRAYS: &[&str] = &[
    "Github_trivial---o66644.json",
    "Github_trivial---o78110.json",
    "Github_easy---o81593.json",
    "Github_easy---o10030.json",
    "Handwritten---pnmp2.json",
    "Handwritten---key5.json",
    "Snowplow---sp_262_Normalized.json",
];

const BUDGETS: &[usize] = &[20, 50, 200];

fn tree(closed: bool) -> Value {
    let mut s = json!({
        "type": "object",
        "properties": {
            "label": {"type": "string", "maxLength": 20},
            "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#"}}
        },
        "required": ["label", "children"]
    });
    if closed {
        s["additionalProperties"] = json!(false);
    }
    s
}

#[derive(Clone, Copy, Debug)]
enum Policy {
    /// Most `{`/`[` over `}`/`]`, then the longest.
    Deepest,
    /// The longest token.
    Longest,
    /// A seeded random one.
    Random(u64),
}

/// Per token: (nesting it opens, its length).
fn scores(vocab: &TokenVocab) -> Vec<(i32, usize)> {
    (0..vocab.len() as u32)
        .map(|id| {
            let b = vocab.token_bytes(id).unwrap_or(&[]);
            let open = b.iter().filter(|&&c| c == b'{' || c == b'[').count() as i32;
            let close = b.iter().filter(|&&c| c == b'}' || c == b']').count() as i32;
            (open - close, b.len())
        })
        .collect()
}

enum Outcome {
    /// Refused up front: the planned close from the start exceeds the budget.
    Refused,
    /// The text produced.
    Text(String),
}

/// Runs the generator; panics when it ends on an incomplete text.
fn generate(
    g: &Arc<CompiledGrammar>,
    score: &[(i32, usize)],
    budget: usize,
    policy: Policy,
    name: &str,
) -> Outcome {
    let vocab = g.vocab().clone();
    if g.min_output_tokens() > budget {
        return Outcome::Refused;
    }
    let mut m = Matcher::new(g.clone());
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut rng = match policy {
        Policy::Random(s) => rand::rngs::StdRng::seed_from_u64(s),
        _ => rand::rngs::StdRng::seed_from_u64(0),
    };
    let eos = vocab.eos()[0];
    let mut text = Vec::new();
    for used in 0..budget {
        if m.is_finished() {
            break;
        }
        m.fill_mask(&mut mask).unwrap();
        m.restrict_mask_to_budget(&mut mask, budget - used);
        let mut allowed = Vec::new();
        for (w, &bits) in mask.iter().enumerate() {
            let mut bits = bits;
            while bits != 0 {
                let t = w as u32 * 32 + bits.trailing_zeros();
                bits &= bits - 1;
                if t != eos {
                    allowed.push(t);
                }
            }
        }
        if allowed.is_empty() {
            assert!(
                m.is_accepting(),
                "{name} {policy:?} budget {budget}: nothing allowed after {:?}",
                String::from_utf8_lossy(&text)
            );
            break;
        }
        let pick = match policy {
            Policy::Deepest => *allowed
                .iter()
                .max_by_key(|&&t| score[t as usize])
                .expect("non-empty"),
            Policy::Longest => *allowed
                .iter()
                .max_by_key(|&&t| score[t as usize].1)
                .expect("non-empty"),
            Policy::Random(_) => allowed[rng.random_range(0..allowed.len())],
        };
        m.accept_token(pick).unwrap();
        text.extend_from_slice(vocab.token_bytes(pick).unwrap());
    }
    assert!(
        m.is_accepting(),
        "{name} {policy:?} budget {budget}: cut off after {} tokens: {:?}",
        m.num_tokens(),
        String::from_utf8_lossy(&text)
    );
    assert!(m.num_tokens() <= budget);
    Outcome::Text(String::from_utf8(text).expect("UTF-8 output"))
}

/// Parses each `(name, schema, text)` case's text as JSON and validates it with Python's
/// `jsonschema` (Python's parser takes numbers of any size); returns the failures.
fn validate_all(cases: &[(String, Value, String)]) -> Vec<String> {
    let script = r#"
import json, sys
import jsonschema
bad = []
for line in sys.stdin:
    c = json.loads(line)
    try:
        instance = json.loads(c["text"])
    except ValueError as e:
        bad.append(c["name"] + ": not JSON (" + str(e) + "): " + c["text"])
        continue
    try:
        cls = jsonschema.validators.validator_for(c["schema"])
        cls(c["schema"]).validate(instance)
    except jsonschema.ValidationError as e:
        bad.append(c["name"] + ": " + e.message[:200] + ": " + c["text"])
print(json.dumps(bad))
"#;
    let mut child = match Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("python3 is needed to validate the outputs: {e}"),
    };
    {
        let mut stdin = child.stdin.take().expect("stdin");
        for (name, schema, text) in cases {
            let line = json!({"name": name, "schema": schema, "text": text});
            writeln!(stdin, "{line}").expect("write");
        }
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    let status = child.wait().expect("wait");
    assert!(
        status.success(),
        "the validator failed (is `jsonschema` installed?)"
    );
    serde_json::from_str(out.trim()).expect("validator output")
}

fn schemas() -> Vec<(String, Value)> {
    let mut out = vec![
        ("tree".to_string(), tree(false)),
        ("tree-closed".to_string(), tree(true)),
    ];
    let Some(dir) = common::shared_path(common::shared_dir().join("jsonschemabench/public")) else {
        return out;
    };
    let want: Vec<&str> = RECURSIVE
        .iter()
        .chain(DEEP)
        .chain(ARRAYS)
        .copied()
        .collect();
    let mut subsets: Vec<&str> = want
        .iter()
        .map(|n| n.split("---").next().expect("subset"))
        .collect();
    subsets.sort_unstable();
    subsets.dedup();
    for subset in subsets {
        let f = std::fs::File::open(dir.join(format!("{subset}.tar.gz"))).expect("subset");
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
        for e in ar.entries().expect("entries") {
            let mut e = e.expect("entry");
            let path = e.path().expect("path").to_string_lossy().into_owned();
            let Some(name) = path.rsplit('/').next().map(str::to_string) else {
                continue;
            };
            if !want.contains(&name.as_str()) {
                continue;
            }
            let mut s = String::new();
            e.read_to_string(&mut s).expect("read");
            let v: Value = serde_json::from_str(&s).expect("json");
            out.push((name, v["schema"].clone()));
        }
    }
    out
}

#[test]
fn adversarial_generators_close_within_the_budget() {
    let Some(tok) = common::llama3() else { return };
    let score = scores(&tok.vocab);
    let mut cases = Vec::new();
    let (mut compiled, mut refused, mut texts) = (0, 0, 0);
    for (name, schema) in schemas() {
        let g = match CompiledGrammar::json_schema_value(
            &schema,
            tok.vocab.clone(),
            &CompileOptions::default(),
        ) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("{name}: not compiled ({e})");
                continue;
            }
        };
        compiled += 1;
        for &budget in BUDGETS {
            for policy in [
                Policy::Deepest,
                Policy::Longest,
                Policy::Random(budget as u64),
            ] {
                match generate(&g, &score, budget, policy, &name) {
                    Outcome::Refused => refused += 1,
                    Outcome::Text(t) => {
                        texts += 1;
                        cases.push((format!("{name} {policy:?} {budget}"), schema.clone(), t));
                    }
                }
            }
        }
    }
    eprintln!("{compiled} schemas compiled, {texts} outputs, {refused} refused");
    assert!(compiled >= 20, "only {compiled} schemas compiled");
    let bad = validate_all(&cases);
    assert!(
        bad.is_empty(),
        "{} outputs fail validation:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The tree node of issue #22 under the user's budget of 200 tokens: the deepest generator
/// nests as far as it can and still closes every open object and array.
#[test]
fn recursive_tree_closes_every_level_at_200_tokens() {
    let Some(tok) = common::llama3() else { return };
    let score = scores(&tok.vocab);
    for closed in [true, false] {
        let g = CompiledGrammar::json_schema_value(
            &tree(closed),
            tok.vocab.clone(),
            &CompileOptions::default(),
        )
        .unwrap();
        let Outcome::Text(t) = generate(&g, &score, 200, Policy::Deepest, "tree") else {
            panic!("a tree fits in 200 tokens");
        };
        let v: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}"));
        let mut depth = 0;
        let mut node = &v;
        while let Some(c) = node["children"].as_array().and_then(|a| a.first()) {
            depth += 1;
            node = c;
        }
        // Without `additionalProperties: false` it spends its tokens on undeclared keys.
        if closed {
            assert!(
                depth >= 5,
                "the deepest generator nested only {depth} levels: {t}"
            );
        }
        eprintln!("closed {closed}: {depth} levels: {t}");
        let bad = validate_all(&[("tree".into(), tree(closed), t)]);
        assert!(bad.is_empty(), "{bad:?}");
    }
}

/// The planned close from the start is the refusal threshold: at that many tokens the
/// generator completes; the plan's count is a real spelling of the shortest output.
#[test]
fn min_output_tokens_is_a_budget_that_suffices() {
    let Some(tok) = common::llama3() else { return };
    let score = scores(&tok.vocab);
    let g = CompiledGrammar::json_schema_value(
        &tree(true),
        tok.vocab.clone(),
        &CompileOptions::default(),
    )
    .unwrap();
    let k = g.min_output_tokens();
    assert!((2..=12).contains(&k), "tree needs {k} tokens");
    let m = Matcher::new(g.clone());
    assert_eq!(m.closing_tokens(), k);
    // The shortest tree, its two keys in either order (declared properties may come in any).
    let closing = m.closing_bytes();
    assert_eq!(
        serde_json::from_slice::<Value>(&closing).unwrap(),
        json!({"label": "", "children": []}),
        "{}",
        String::from_utf8_lossy(&closing)
    );
    assert_eq!(closing.len(), br#"{"label":"","children":[]}"#.len());
    for policy in [Policy::Deepest, Policy::Longest] {
        assert!(matches!(
            generate(&g, &score, k, policy, "tree"),
            Outcome::Text(_)
        ));
        assert!(matches!(
            generate(&g, &score, k - 1, policy, "tree"),
            Outcome::Refused
        ));
    }
}
