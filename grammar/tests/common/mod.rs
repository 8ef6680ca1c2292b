//! Helpers shared by the integration tests: shared data paths, tokenizers, serialisation.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use sglrs_grammar::TokenVocab;

/// `$SGLRS_SHARED` or `<workspace>/../shared`.
pub fn shared_dir() -> PathBuf {
    if let Ok(p) = std::env::var("SGLRS_SHARED") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared")
}

/// Set to `1` to let the tests that need the shared data (tokenizers, the benchmark) skip
/// when it is missing. Without it a missing file fails the test: the shared data is always
/// there in CI, and a test that passes without running proves nothing.
pub const ALLOW_MISSING: &str = "SGLRS_ALLOW_MISSING_SHARED";

/// `path` (under [`shared_dir`]) when it exists. When it does not: a panic naming it, or
/// `None` (the caller skips, saying so) under `SGLRS_ALLOW_MISSING_SHARED=1`.
pub fn shared_path(path: PathBuf) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    if std::env::var(ALLOW_MISSING).is_ok_and(|v| v == "1") {
        eprintln!("SKIP: {} not found ({ALLOW_MISSING}=1)", path.display());
        return None;
    }
    panic!(
        "{} not found: this test needs the shared data (point SGLRS_SHARED at it, or set \
         {ALLOW_MISSING}=1 to skip the tests that need it)",
        path.display()
    );
}

/// A loaded tokenizer and its vocabulary.
pub struct Tok {
    pub tokenizer: tokenizers::Tokenizer,
    pub vocab: Arc<TokenVocab>,
}

/// Loads the tokenizer at `file`, its `tokenizer_config.json` beside it naming EOS.
fn load(file: &Path) -> Tok {
    let tokenizer = tokenizers::Tokenizer::from_file(file).expect("tokenizer loads");
    let config = file.with_file_name("tokenizer_config.json");
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(config).expect("config")).expect("json");
    let eos_str = match &cfg["eos_token"] {
        Value::String(s) => s.clone(),
        v => v["content"].as_str().expect("eos content").to_string(),
    };
    let eos = tokenizer.token_to_id(&eos_str).expect("eos id");
    let vocab = Arc::new(TokenVocab::from_tokenizer(&tokenizer, &[eos]).expect("vocab"));
    Tok { tokenizer, vocab }
}

/// The shared tokenizer `name`, loaded once; `None` (each time, saying so) only when it is
/// missing and allowed to be (see [`shared_path`]).
fn tokenizer(cell: &'static OnceLock<Tok>, name: &str) -> Option<&'static Tok> {
    if let Some(t) = cell.get() {
        return Some(t);
    }
    let file = shared_path(
        shared_dir()
            .join("tokenizers")
            .join(name)
            .join("tokenizer.json"),
    )?;
    Some(cell.get_or_init(|| load(&file)))
}

/// The vocabulary of the `tokenizer.json` at `path`, its end-of-text token (found by the
/// usual names) as EOS; for the examples that take any tokenizer file.
pub fn vocab_from_file(
    path: &str,
) -> Result<Arc<TokenVocab>, Box<dyn std::error::Error + Send + Sync>> {
    let tok = tokenizers::Tokenizer::from_file(path)?;
    let eos = ["<|end_of_text|>", "</s>", "<|endoftext|>"]
        .iter()
        .find_map(|n| tok.token_to_id(n))
        .ok_or("no end-of-text token")?;
    Ok(Arc::new(TokenVocab::from_tokenizer(&tok, &[eos])?))
}

/// The Llama-3 128k tokenizer (byte-level BPE); `None` only when missing and allowed to be
/// (see [`shared_path`]).
pub fn llama3() -> Option<&'static Tok> {
    static T: OnceLock<Tok> = OnceLock::new();
    tokenizer(&T, "llama3-128k")
}

/// The Mistral 32k tokenizer (byte-fallback); `None` only when missing and allowed to be
/// (see [`shared_path`]).
pub fn mistral() -> Option<&'static Tok> {
    static T: OnceLock<Tok> = OnceLock::new();
    tokenizer(&T, "mistral-32k")
}

impl Tok {
    /// Token ids whose bytes concatenate to `text`: the tokenizer's own encoding when it
    /// round-trips (no added leading `▁`), else greedy longest match.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        if let Ok(enc) = self.tokenizer.encode(text, false) {
            let ids = enc.get_ids().to_vec();
            let mut bytes = Vec::new();
            for &id in &ids {
                bytes.extend_from_slice(self.vocab.token_bytes(id).unwrap_or(&[]));
            }
            if bytes == text.as_bytes() && ids.iter().all(|&i| self.vocab.is_usable(i)) {
                return ids;
            }
        }
        self.vocab
            .greedy_tokenize(text.as_bytes())
            .expect("every byte has a token")
    }
}

/// Compact JSON (serde's escaping, keys in document order).
pub fn compact(v: &Value) -> String {
    serde_json::to_string(v).expect("serialise")
}

/// JSON as Python's `json.dumps(v, ensure_ascii=False)`: `", "` and `": "`.
pub fn dumps(v: &Value) -> String {
    let mut s = String::new();
    dumps_into(v, &mut s);
    s
}

fn dumps_into(v: &Value, out: &mut String) {
    match v {
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dumps_into(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::to_string(k).expect("key"));
                out.push_str(": ");
                dumps_into(x, out);
            }
            out.push('}');
        }
        other => out.push_str(&serde_json::to_string(other).expect("scalar")),
    }
}

/// A vocabulary of the 256 single bytes (plus the EOS token 0): acceptance then does not
/// depend on tokenization.
pub fn byte_vocab() -> Arc<TokenVocab> {
    let mut toks: Vec<Vec<u8>> = vec![Vec::new()];
    toks.extend((0u8..=255).map(|b| vec![b]));
    Arc::new(TokenVocab::new(toks, &[], &[0]).unwrap())
}

/// [`compile_bytes`] of a schema given as text, which must compile.
pub fn g_bytes(schema: &str) -> Arc<sglrs_grammar::CompiledGrammar> {
    compile_bytes(&serde_json::from_str(schema).unwrap()).unwrap()
}

/// The grammar of `schema` over Llama-3 (default options), `None` when the tokenizer is
/// missing and allowed to be.
pub fn llama3_grammar(schema: &str) -> Option<Arc<sglrs_grammar::CompiledGrammar>> {
    let tok = llama3()?;
    Some(
        sglrs_grammar::CompiledGrammar::json_schema(
            schema,
            tok.vocab.clone(),
            &sglrs_grammar::CompileOptions::default(),
        )
        .unwrap(),
    )
}

/// The server's generation policy for objects: declared properties in schema order
/// (`any_property_order: false`; the engine's default takes them in any order).
pub fn schema_order() -> sglrs_grammar::CompileOptions {
    sglrs_grammar::CompileOptions {
        any_property_order: false,
        ..sglrs_grammar::CompileOptions::default()
    }
}

/// `schema` compiled over [`byte_vocab`] with the default options.
pub fn compile_bytes(
    schema: &Value,
) -> Result<Arc<sglrs_grammar::CompiledGrammar>, sglrs_grammar::CompileError> {
    compile_bytes_with(schema, &sglrs_grammar::CompileOptions::default())
}

/// `schema` compiled over [`byte_vocab`] with `opts`.
pub fn compile_bytes_with(
    schema: &Value,
    opts: &sglrs_grammar::CompileOptions,
) -> Result<Arc<sglrs_grammar::CompiledGrammar>, sglrs_grammar::CompileError> {
    sglrs_grammar::CompiledGrammar::json_schema_value(schema, byte_vocab(), opts)
}

/// Whether `text`, fed byte by byte, leaves `g` in an accepting state.
pub fn accepts_text(g: &Arc<sglrs_grammar::CompiledGrammar>, text: &str) -> bool {
    let mut m = sglrs_grammar::Matcher::new(g.clone());
    m.try_advance_bytes(text.as_bytes()) && m.is_accepting()
}

/// Compiles `schema` (it must compile) and checks that every `valid` text is accepted and
/// every `invalid` one rejected — under the default options and in schema order (so the
/// `valid` texts list keys in schema order; [`check_opts`] for one policy).
pub fn check(schema: Value, valid: &[&str], invalid: &[&str]) {
    for opts in [sglrs_grammar::CompileOptions::default(), schema_order()] {
        check_opts(&schema, &opts, valid, invalid);
    }
}

/// [`check`] under `opts` only.
pub fn check_opts(
    schema: &Value,
    opts: &sglrs_grammar::CompileOptions,
    valid: &[&str],
    invalid: &[&str],
) {
    let order = if opts.any_property_order {
        "any"
    } else {
        "schema"
    };
    let g = compile_bytes_with(schema, opts)
        .unwrap_or_else(|e| panic!("{schema} ({order} order): {e}"));
    for v in valid {
        assert!(
            accepts_text(&g, v),
            "{schema} ({order} order): valid {v} rejected"
        );
    }
    for v in invalid {
        assert!(
            !accepts_text(&g, v),
            "{schema} ({order} order): invalid {v} accepted"
        );
    }
}

/// Checks every token's mask bit at `m` against feeding its bytes one at a time (the slow
/// reference); returns the allowed tokens (EOS included when allowed). `at` names the
/// position in a failure message.
pub fn check_mask(
    vocab: &TokenVocab,
    m: &sglrs_grammar::Matcher,
    mask: &mut [u32],
    at: &[u8],
) -> Vec<u32> {
    m.fill_mask(mask).unwrap();
    let mut allowed = Vec::new();
    for id in 0..vocab.len() as u32 {
        let bit = mask[(id / 32) as usize] >> (id % 32) & 1 == 1;
        let want = if vocab.eos().contains(&id) {
            m.is_accepting()
        } else if !vocab.is_usable(id) {
            false
        } else {
            let mut r = m.clone();
            vocab
                .token_bytes(id)
                .unwrap()
                .iter()
                .all(|&b| r.try_advance_bytes(&[b]))
        };
        assert_eq!(
            bit,
            want,
            "token {id} {:?} after {:?}",
            String::from_utf8_lossy(vocab.token_bytes(id).unwrap()),
            String::from_utf8_lossy(at)
        );
        if bit {
            allowed.push(id);
        }
    }
    allowed
}

/// Follows `ids` from a fresh matcher, checking the whole mask at every position, then
/// takes random allowed tokens for `extra` more steps.
pub fn check_path(
    vocab: &TokenVocab,
    g: &Arc<sglrs_grammar::CompiledGrammar>,
    ids: &[u32],
    seed: u64,
    extra: usize,
) {
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let mut m = sglrs_grammar::Matcher::new(g.clone());
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut text: Vec<u8> = Vec::new();
    for &id in ids {
        let allowed = check_mask(vocab, &m, &mut mask, &text);
        assert!(
            allowed.contains(&id),
            "valid token {:?} allowed after {:?}",
            String::from_utf8_lossy(vocab.token_bytes(id).unwrap()),
            String::from_utf8_lossy(&text)
        );
        m.accept_token(id).unwrap();
        text.extend_from_slice(vocab.token_bytes(id).unwrap());
    }
    for _ in 0..extra {
        let allowed = check_mask(vocab, &m, &mut mask, &text);
        if m.is_finished() || allowed.is_empty() {
            break;
        }
        let id = allowed[rand::Rng::random_range(&mut rng, 0..allowed.len())];
        m.accept_token(id).unwrap();
        text.extend_from_slice(vocab.token_bytes(id).unwrap_or(&[]));
    }
}

/// Random walks over Llama-3 (nothing without the tokenizer): each walk `w` starts after the
/// bytes `start(w)`, and at every step each mask bit is checked against following the token
/// byte by byte ([`check_mask`], which refuses dead ends too) and the planned close must give
/// a text `ok` accepts; the next token is drawn among the allowed ones `prefer` picks with
/// probability `p`, else among all.
#[allow(clippy::too_many_arguments)]
pub fn random_walks(
    g: &Arc<sglrs_grammar::CompiledGrammar>,
    seed: u64,
    walks: usize,
    steps: usize,
    start: &dyn Fn(usize) -> Vec<u8>,
    prefer: &dyn Fn(&[u8]) -> bool,
    p: f64,
    ok: &dyn Fn(&[u8]) -> bool,
) {
    use rand::{Rng, SeedableRng};
    let Some(tok) = llama3() else { return };
    let vocab = &tok.vocab;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut mask = vec![0u32; vocab.mask_words()];
    for w in 0..walks {
        let mut m = sglrs_grammar::Matcher::new(g.clone());
        let text0 = start(w);
        assert!(
            m.try_advance_bytes(&text0),
            "{}",
            String::from_utf8_lossy(&text0)
        );
        let mut text = text0;
        for _ in 0..steps {
            let allowed: Vec<u32> = check_mask(vocab, &m, &mut mask, &text)
                .into_iter()
                .filter(|t| !vocab.eos().contains(t))
                .collect();
            let close = m.closing_bytes();
            let mut c = m.clone();
            assert!(c.try_advance_bytes(&close) && c.is_accepting(), "{close:?}");
            let full = [text.as_slice(), close.as_slice()].concat();
            assert!(ok(&full), "{}", String::from_utf8_lossy(&full));
            if allowed.is_empty() {
                break;
            }
            let preferred: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|&t| vocab.token_bytes(t).is_some_and(prefer))
                .collect();
            let pool = if !preferred.is_empty() && rng.random_bool(p) {
                &preferred
            } else {
                &allowed
            };
            let next = pool[rng.random_range(0..pool.len())];
            m.accept_token(next).unwrap();
            text.extend_from_slice(vocab.token_bytes(next).unwrap());
        }
    }
}

/// JSON equality with numbers by value (small numbers only: f64 is exact on them): the
/// independent check of the `uniqueItems` tests.
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}
