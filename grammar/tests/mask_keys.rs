//! Masks at key positions of objects that allow undeclared keys are exact.
//!
//! There the "other key" rule's thread takes its mask in shared parts from the first key
//! position on (`lazy/threads.rs`): the mask under sentinel frames, plus the few tokens that
//! leave the rule (finish the key, the colon and a whole value) and go on, each with every
//! position at which a prefix of it can leave the rule, checked against where the real
//! frames return to. A small vocabulary of the 256 bytes plus tokens made to cross that
//! return in every way (`":12,"` leaves the rule after `1` and after `12`; only the second
//! goes on) is checked token by token against feeding the bytes one at a time, at every
//! position of valid texts and on random walks; so is Llama-3's vocabulary.

mod common;

use std::sync::Arc;

use sglrs_grammar::{CompileOptions, CompiledGrammar, TokenVocab};

/// Tokens that cross the end of an undeclared property (or stop just before or at it).
const CROSSING: &[&str] = &[
    "\":",
    "\":\"",
    "\":\"\"",
    "\":\"\",",
    "\":\"\",\"",
    "\":\"\"}",
    "\":1",
    "\":1,",
    "\":1,\"",
    "\":12,\"",
    "\":123}",
    "\":1}",
    "\":1}}",
    "\":1},\"",
    "\":[],\"",
    "\":[1],\"al",
    "\":{}}",
    "\":{},\"",
    "\":null,\"a",
    "\":true}",
    "\":-1.5e3,\"",
    "\":\"ab",
    "\":\"ac",
    "\":[1",
    "\":[[",
    "1,\"",
    "12,\"be",
    "2}",
    "x\":1,\"",
    "x\":12}",
    ":1,\"",
    "\":\"v\",\"alpha\":\"",
    "\": 1, \"",
    "\" : 1 ,\n \"",
    ",\"",
    ",\n  \"",
    "\"x",
    "\"x_",
    "x_",
    "al",
    "alp",
    "alpha",
    "\"alpha\"",
    "alpha\":",
    "alpha\":\"",
    "be",
    "beta",
    "beta\":1,\"",
    "gam",
    "gamma\":true}",
    "k1\":1,\"",
    "\"}",
    "\"},{\"",
    "}]",
    "\",\"",
    "\\u00",
    "é",
];

/// Objects whose key positions mix declared keys (in any order for small objects, in
/// schema order for larger ones) with undeclared ones: values of every kind, nested,
/// in arrays (the same parts under other stacks), counted, and with key patterns.
const SCHEMAS: &[&str] = &[
    r#"{"type":"object","properties":{"alpha":{"type":"string"},"beta":{"type":"integer"}},"required":["alpha"]}"#,
    r#"{"type":"object","properties":{"alpha":{"type":"string"},"beta":{"type":"integer"},"gamma":{"type":"boolean"}},"additionalProperties":{"type":"integer"}}"#,
    r#"{"type":"array","items":{"type":"object","properties":{"alpha":{"type":"string"},"beta":{"type":"integer"},"k1":{"type":"integer"}},"additionalProperties":true}}"#,
    r#"{"type":"object","properties":{"alpha":{"type":"object","properties":{"beta":{"type":"integer"},"gamma":{"type":"boolean"}}},"k1":{"type":"integer"}},"maxProperties":4}"#,
    r#"{"type":"object","properties":{"alpha":{"type":"string"},"beta":{"type":"integer"}},"patternProperties":{"^x_":{"type":"integer"}},"additionalProperties":false}"#,
    r#"{"type":"object","properties":{"k1":{"type":"integer"},"k2":{"type":"string"},"k3":{"type":"boolean"},"k4":{"type":"integer"},"k5":{"type":"null"},"k6":{"type":"string"},"k7":{"type":"integer"},"k8":{"type":"string"},"k9":{"type":"integer"},"alpha":{"type":"string"},"beta":{"type":"integer"},"gamma":{"type":"boolean"}}}"#,
];

/// A valid text per schema (compact), through declared and undeclared keys (declared ones
/// in schema order: not every object here is compiled with its keys in any order).
const TEXTS: &[&str] = &[
    r#"{"x":12,"alpha":"v","y":"","beta":1,"z":[1],"w":{},"v":null}"#,
    r#"{"alpha":"","x":1,"beta":12,"gamma":true,"y":123}"#,
    r#"[{"alpha":"v","x":1},{"x":"","beta":12,"y":{"a":[]}},{"alpha":"","z":true,"k1":1}]"#,
    r#"{"x":1,"alpha":{"beta":12,"y":"","gamma":false},"z":-1.5e3}"#,
    r#"{"x_a":12,"alpha":"v","x_":1,"beta":2}"#,
    r#"{"k1":1,"x":12,"k2":"","k4":4,"y":"","k7":1,"alpha":"v","z":1,"gamma":true}"#,
];

/// The 256 single bytes, EOS (id 0) and the [`CROSSING`] tokens.
fn crossing_vocab() -> Arc<TokenVocab> {
    let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
    toks.extend((0u8..=255).map(|b| vec![b]));
    toks.extend(CROSSING.iter().map(|t| t.as_bytes().to_vec()));
    Arc::new(TokenVocab::new(toks, &[], &[0]).unwrap())
}

/// Greedy longest-match tokenization of `text`, cut before its last `cut` bytes (the
/// random walk goes on from there).
fn prefix_ids(vocab: &TokenVocab, text: &str, cut: usize) -> Vec<u32> {
    vocab
        .greedy_tokenize(&text.as_bytes()[..text.len() - cut])
        .expect("every byte has a token")
}

#[test]
fn masks_exact_at_key_positions_with_crossing_tokens() {
    let vocab = crossing_vocab();
    for opts in [CompileOptions::default(), CompileOptions::flexible()] {
        for (i, (schema, text)) in SCHEMAS.iter().zip(TEXTS).enumerate() {
            let g = CompiledGrammar::json_schema(schema, vocab.clone(), &opts).unwrap();
            // The whole text, then prefixes ending at several key positions with random
            // walks from there (fresh grammars: the parts are built at different gaps).
            common::check_path(&vocab, &g, &prefix_ids(&vocab, text, 0), 0, 0);
            for (k, cut) in [text.len() / 3, text.len() / 2, 2].into_iter().enumerate() {
                let g = CompiledGrammar::json_schema(schema, vocab.clone(), &opts).unwrap();
                common::check_path(
                    &vocab,
                    &g,
                    &prefix_ids(&vocab, text, cut),
                    (i * 7 + k) as u64,
                    25,
                );
            }
        }
    }
}

#[test]
fn masks_exact_at_key_positions_llama3() {
    let Some(tok) = common::llama3() else { return };
    let vocab = &tok.vocab;
    for (i, (schema, text)) in SCHEMAS.iter().zip(TEXTS).enumerate() {
        let g = CompiledGrammar::json_schema(schema, vocab.clone(), &CompileOptions::default())
            .unwrap();
        common::check_path(vocab, &g, &tok.tokenize(text), 0, 0);
        let g = CompiledGrammar::json_schema(schema, vocab.clone(), &CompileOptions::default())
            .unwrap();
        common::check_path(
            vocab,
            &g,
            &tok.tokenize(&text[..text.len() / 2]),
            i as u64,
            20,
        );
    }
}

/// Sibling objects at one depth, each with its own key automaton: the "any other key"
/// states past their declared names take the same mask when their undeclared values
/// have the same schema (the donor mask is shared, `Lazy::equivalent_mask`) and must not
/// when they differ (integer, string, any value, boolean, nested object; the same shapes
/// with other bytes, `"ab"` and `"ac"`; calls of two different recursive rules).
const SIBLINGS: &str = r##"{"type":"object","properties":{
  "a":{"type":"object","properties":{"k":{"type":"integer"}},"additionalProperties":{"type":"integer"}},
  "b":{"type":"object","properties":{"m":{"type":"string"}},"additionalProperties":{"type":"string"}},
  "c":{"type":"object","properties":{"k":{"type":"integer"}}},
  "d":{"type":"object","properties":{"n":{"type":"boolean"}}},
  "e":{"type":"object","properties":{"p":{"type":"integer"}},"additionalProperties":{"type":"integer"}},
  "f":{"type":"object","properties":{"q":{"type":"integer"}},"additionalProperties":{"type":"boolean"}},
  "g":{"type":"object","properties":{"r":{"type":"integer"}},"additionalProperties":{"type":"object","properties":{"s":{"type":"integer"}},"additionalProperties":false}},
  "h":{"type":"object","properties":{"k":{"type":"string"}},"additionalProperties":{"type":"string"}},
  "i":{"type":"object","properties":{"k":{"type":"string"}},"additionalProperties":{"const":"ab"}},
  "j":{"type":"object","properties":{"k":{"type":"string"}},"additionalProperties":{"const":"ac"}},
  "k":{"type":"object","properties":{"k":{"type":"string"}},"additionalProperties":{"$ref":"#/$defs/T"}},
  "l":{"type":"object","properties":{"k":{"type":"string"}},"additionalProperties":{"$ref":"#/$defs/U"}}},
  "required":["a","b","c","d","e","f","g","h","i","j","k","l"],
  "$defs":{"T":{"type":"array","items":{"$ref":"#/$defs/T"}},
    "U":{"type":"array","items":{"anyOf":[{"$ref":"#/$defs/U"},{"type":"integer"}]}}}}"##;

/// A valid text for [`SIBLINGS`], with an undeclared key in every object.
const SIBLINGS_TEXT: &str = r#"{"a":{"x":12},"b":{"al":"s"},"c":{"z":[1]},"d":{"w":{}},"e":{"alpha":2},"f":{"x_":true},"g":{"x":{"s":1}},"h":{"x":""},"i":{"x":"ab"},"j":{"x":"ac"},"k":{"x":[[]]},"l":{"x":[1,[2]]}}"#;

#[test]
fn masks_exact_at_sibling_key_automata() {
    let vocab = crossing_vocab();
    for opts in [CompileOptions::default(), CompileOptions::flexible()] {
        // The whole text.
        let g = CompiledGrammar::json_schema(SIBLINGS, vocab.clone(), &opts).unwrap();
        common::check_path(&vocab, &g, &prefix_ids(&vocab, SIBLINGS_TEXT, 0), 0, 0);
        // Prefixes ending at every object's first key position (`{"`: the donor of the
        // key automaton's start is the "any other key" state), then random walks.
        let starts: Vec<usize> = SIBLINGS_TEXT
            .match_indices("{\"")
            .map(|(i, _)| i + 2)
            .collect();
        // One grammar: each object's key start comes after the earlier objects' ones,
        // whose donors are there to be shared.
        let g = CompiledGrammar::json_schema(SIBLINGS, vocab.clone(), &opts).unwrap();
        for (k, end) in starts.into_iter().enumerate() {
            let cut = SIBLINGS_TEXT.len() - end;
            common::check_path(
                &vocab,
                &g,
                &prefix_ids(&vocab, SIBLINGS_TEXT, cut),
                k as u64,
                25,
            );
        }
    }
    if let Some(tok) = common::llama3() {
        let g =
            CompiledGrammar::json_schema(SIBLINGS, tok.vocab.clone(), &CompileOptions::default())
                .unwrap();
        common::check_path(&tok.vocab, &g, &tok.tokenize(SIBLINGS_TEXT), 0, 0);
    }
}

/// Objects whose declared names may also be written with a language suffix
/// (`patternProperties` `^name_…$`, as OCDS schemas have for every translatable field).
/// Right after a complete declared name the "other key" thread of each object is at a state
/// of its own automaton; where two such states have the same futures (`p`'s `name` and
/// `q`'s `title`: the same suffix pattern, the same value schema) the second takes the
/// first's mask (`Lazy::equivalent_mask`), and where they differ it must not: another
/// suffix pattern (`r`), another value schema for the suffixed key (`s`), undeclared keys
/// refused (`t`).
const TRANSLATED: &str = r##"{"type":"object","properties":{
  "p":{"type":"object","properties":{"name":{"type":"string"}},"patternProperties":{"^(name_[a-z]{2})$":{"type":"string"}}},
  "q":{"type":"object","properties":{"title":{"type":"string"}},"patternProperties":{"^(title_[a-z]{2})$":{"type":"string"}}},
  "r":{"type":"object","properties":{"label":{"type":"string"}},"patternProperties":{"^(label_[a-z]{3})$":{"type":"string"}}},
  "s":{"type":"object","properties":{"desc":{"type":"string"}},"patternProperties":{"^(desc_[a-z]{2})$":{"type":"integer"}}},
  "t":{"type":"object","properties":{"note":{"type":"string"}},"patternProperties":{"^(note_[a-z]{2})$":{"type":"string"}},"additionalProperties":false}},
  "required":["p","q","r","s","t"]}"##;

/// A valid text for [`TRANSLATED`].
const TRANSLATED_TEXT: &str = r#"{"p":{"name":"a","name_en":"b","x":1},"q":{"title":"a","title_fr":"b"},"r":{"label":"a","label_eng":"c"},"s":{"desc":"a","desc_de":3},"t":{"note":"a","note_it":"d"}}"#;

#[test]
fn masks_exact_after_translatable_names() {
    let vocab = crossing_vocab();
    // Prefixes ending right after every declared name (before its closing quote), in one
    // grammar so that later objects find the earlier ones' masks; random walks from each.
    let ends: Vec<usize> = ["\"name", "\"title", "\"label", "\"desc", "\"note"]
        .iter()
        .map(|k| TRANSLATED_TEXT.find(k).unwrap() + k.len())
        .collect();
    for opts in [CompileOptions::default(), CompileOptions::flexible()] {
        let g = CompiledGrammar::json_schema(TRANSLATED, vocab.clone(), &opts).unwrap();
        common::check_path(&vocab, &g, &prefix_ids(&vocab, TRANSLATED_TEXT, 0), 0, 0);
        let g = CompiledGrammar::json_schema(TRANSLATED, vocab.clone(), &opts).unwrap();
        for (k, &end) in ends.iter().enumerate() {
            let cut = TRANSLATED_TEXT.len() - end;
            let ids = prefix_ids(&vocab, TRANSLATED_TEXT, cut);
            common::check_path(&vocab, &g, &ids, k as u64, 30);
        }
    }
    if let Some(tok) = common::llama3() {
        let g =
            CompiledGrammar::json_schema(TRANSLATED, tok.vocab.clone(), &CompileOptions::default())
                .unwrap();
        for &end in &ends {
            let ids = tok.tokenize(&TRANSLATED_TEXT[..end]);
            common::check_path(&tok.vocab, &g, &ids, 0, 0);
        }
    }
}
