//! Loading an HF tokenizer: `tokenizer.json` plus the special tokens named in
//! `tokenizer_config.json` (and `generation_config.json`'s EOS ids as a fallback).

use std::path::Path;

use serde_json::Value;

use super::{TokenEncoding, Tokenizer, TokenizerError};

/// The text of a special token entry in `tokenizer_config.json`: a string or
/// `{"content": "..."}`.
pub(crate) fn special_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
        _ => None,
    }
}

/// How a `tokenizers` tokenizer's token strings map to bytes, judged from its decoder.
fn detect_encoding(tk: &tokenizers::Tokenizer) -> TokenEncoding {
    let dec = tk
        .get_decoder()
        .and_then(|d| serde_json::to_string(d).ok())
        .unwrap_or_default();
    if dec.contains("ByteLevel") {
        TokenEncoding::ByteLevel
    } else if dec.contains("ByteFallback") || dec.contains("Metaspace") || dec.contains('\u{2581}')
    {
        TokenEncoding::SentencePiece
    } else {
        TokenEncoding::Raw
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`; BOS/EOS come from `tokenizer_config` (the parsed
    /// `tokenizer_config.json`, if any), else from `generation_config`'s token ids.
    pub fn from_hf_files(
        tokenizer_json: &Path,
        tokenizer_config: Option<&Value>,
        generation_config: Option<&Value>,
    ) -> Result<Self, TokenizerError> {
        if !tokenizer_json.exists() {
            return Err(TokenizerError::Io {
                path: tokenizer_json.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
            });
        }
        let tk = tokenizers::Tokenizer::from_file(tokenizer_json).map_err(|e| {
            TokenizerError::Tokenizers(format!("{}: {e}", tokenizer_json.display()))
        })?;
        let lookup = |key: &str| {
            special_text(tokenizer_config.and_then(|c| c.get(key))).and_then(|t| tk.token_to_id(&t))
        };
        let gen_id = |key: &str| {
            generation_config
                .and_then(|g| g.get(key))
                .and_then(|v| match v {
                    Value::Array(a) => a.first().and_then(Value::as_u64),
                    other => other.as_u64(),
                })
                .map(|v| v as u32)
        };
        let bos = lookup("bos_token").or_else(|| gen_id("bos_token_id"));
        let eos = lookup("eos_token").or_else(|| gen_id("eos_token_id"));
        let encoding = detect_encoding(&tk);
        Tokenizer::from_tokenizers(tk, bos, eos, encoding)
    }
}
