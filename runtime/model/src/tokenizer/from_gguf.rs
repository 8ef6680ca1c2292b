//! Building a tokenizer from GGUF metadata (`tokenizer.ggml.*`), reproducing llama.cpp.
//!
//! - `gpt2` vocabularies: byte-level BPE from `tokens` + `merges`, split first by the regexes
//!   llama.cpp uses for the file's `tokenizer.ggml.pre` (a chain of isolating splits), then
//!   mapped to GPT-2 byte chars.
//! - `llama` vocabularies (SentencePiece): BPE over `▁`-joined text whose merges are ranked by
//!   the merged piece's score (llama.cpp's SPM merge order), with `<0xAB>` byte fallback.
//!
//! Control and unknown tokens become special added tokens (matched only when special tokens
//! are parsed); user-defined tokens are always matched, as in llama.cpp.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::{added_token, TokenEncoding, Tokenizer, TokenizerError};
use crate::meta::{value_as_f32, value_as_i64, GgufMeta};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// The GPT-2 split, shared by most pre-tokenizer types.
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's split (llama.cpp's case-insensitive-contraction spelling).
const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: as Llama 3's but single digits.
const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A family of pre-tokenizer regexes, as named by `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// llama.cpp's default BPE split (punctuation runs, GPT-2 split, numbers, 3-digit groups).
    Default,
    /// Single digits, then the GPT-2 split (smollm, starcoder, refact, command-r, ...).
    DigitsGpt2,
    /// The GPT-2 split alone (gpt-2, mpt, olmo, jais).
    Gpt2,
    /// Llama 3 (`llama-bpe`): merges are skipped for words already in the vocabulary.
    Llama3,
    /// Qwen2 / StableLM2.
    Qwen2,
}

impl PreTokenizerKind {
    /// The kind llama.cpp uses for a `tokenizer.ggml.pre` value.
    pub fn from_gguf_name(name: &str) -> Result<Self, TokenizerError> {
        Ok(match name {
            "default" => PreTokenizerKind::Default,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => PreTokenizerKind::DigitsGpt2,
            "gpt-2" | "mpt" | "olmo" | "jais" => PreTokenizerKind::Gpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => PreTokenizerKind::Llama3,
            "qwen2" | "qwen2.5" | "qwen-2.5" | "deepseek-r1-qwen" | "stablelm2" => {
                PreTokenizerKind::Qwen2
            }
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        })
    }

    /// The regexes, applied in order, each splitting the pieces of the previous.
    pub fn regexes(self) -> &'static [&'static str] {
        match self {
            PreTokenizerKind::Default => &[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_RE,
                r"\p{N}+",
                r"[0-9][0-9][0-9]",
            ],
            PreTokenizerKind::DigitsGpt2 => &[r"\p{N}", GPT2_RE],
            PreTokenizerKind::Gpt2 => &[GPT2_RE],
            PreTokenizerKind::Llama3 => &[LLAMA3_RE],
            PreTokenizerKind::Qwen2 => &[QWEN2_RE],
        }
    }

    /// The `tokenizers` pre-tokenizer: isolating regex splits, then byte-level mapping.
    pub fn pre_tokenizer(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let mut seq: Vec<PreTokenizerWrapper> = Vec::new();
        for re in self.regexes() {
            let split = Split::new(
                SplitPattern::Regex((*re).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(TokenizerError::tk)?;
            seq.push(split.into());
        }
        seq.push(ByteLevel::new(false, false, false).into());
        Ok(PreSequence::new(seq).into())
    }
}

fn strings(f: GgufMeta<'_>, key: &str) -> Result<Vec<String>, TokenizerError> {
    let arr = f
        .get_array(key)
        .ok_or_else(|| TokenizerError::Metadata(key.to_string()))?;
    arr.iter()
        .map(|v| match v {
            candle_core::quantized::gguf_file::Value::String(s) => Ok(s.clone()),
            _ => Err(TokenizerError::Metadata(key.to_string())),
        })
        .collect()
}

fn token_id(f: GgufMeta<'_>, key: &str, n: usize) -> Option<u32> {
    let id = f.get(key).and_then(value_as_i64)?;
    (id >= 0 && (id as usize) < n).then_some(id as u32)
}

/// Builds the tokenizer of a GGUF file.
pub(crate) fn build(f: GgufMeta<'_>) -> Result<Tokenizer, TokenizerError> {
    let model = f
        .get_str("tokenizer.ggml.model")
        .ok_or_else(|| TokenizerError::Metadata("tokenizer.ggml.model".into()))?;
    let tokens = strings(f, "tokenizer.ggml.tokens")?;
    let n = tokens.len();
    let types: Vec<i64> = match f.get_array("tokenizer.ggml.token_type") {
        Some(a) if a.len() == n => a
            .iter()
            .map(|v| value_as_i64(v).unwrap_or(TYPE_NORMAL))
            .collect(),
        _ => vec![TYPE_NORMAL; n],
    };
    let bos = token_id(f, "tokenizer.ggml.bos_token_id", n);
    let eos = token_id(f, "tokenizer.ggml.eos_token_id", n);
    let (mut tk, encoding, default_add_bos) = match model {
        "gpt2" => (build_bpe(f, &tokens)?, TokenEncoding::ByteLevel, false),
        "llama" => (
            build_spm(f, &tokens, &types)?,
            TokenEncoding::SentencePiece,
            true,
        ),
        other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
    };
    let added: Vec<_> = tokens
        .iter()
        .zip(&types)
        .filter_map(|(t, &ty)| match ty {
            TYPE_CONTROL | TYPE_UNKNOWN => Some(added_token(t, true)),
            TYPE_USER_DEFINED => Some(added_token(t, false)),
            _ => None,
        })
        .collect();
    tk.add_special_tokens(&added);
    let add_bos = f
        .get_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(default_add_bos);
    if let (true, Some(b)) = (add_bos, bos) {
        let text = tokens[b as usize].clone();
        let post = TemplateProcessing::builder()
            .try_single(format!("{text} $A"))
            .and_then(|t| t.try_pair(format!("{text} $A {text} $B")))
            .map_err(TokenizerError::tk)?
            .special_tokens(vec![(text, b)])
            .build()
            .map_err(TokenizerError::tk)?;
        tk.with_post_processor(Some(post));
    }
    Tokenizer::from_tokenizers(tk, bos, eos, encoding)
}

/// Byte-level BPE (`tokenizer.ggml.model = gpt2`).
fn build_bpe(f: GgufMeta<'_>, tokens: &[String]) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges = strings(f, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            // llama.cpp splits at the first space after the first byte.
            let space = m.bytes().skip(1).position(|b| b == b' ').map(|i| i + 1);
            match space {
                Some(i) => Ok((m[..i].to_string(), m[i + 1..].to_string())),
                None => Err(TokenizerError::Metadata(format!(
                    "tokenizer.ggml.merges entry `{m}`"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pre_name = f.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let pre = PreTokenizerKind::from_gguf_name(pre_name)?;
    let vocab: Vocab = vocab_map(tokens);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre == PreTokenizerKind::Llama3)
        .build()
        .map_err(TokenizerError::tk)?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(pre.pre_tokenizer()?));
    tk.with_decoder(Some(ByteLevel::new(false, false, false)));
    Ok(tk)
}

/// Token string → id, the last id winning for duplicated strings (as llama.cpp's map does).
fn vocab_map(tokens: &[String]) -> Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect()
}

/// SentencePiece vocabularies (`tokenizer.ggml.model = llama`).
fn build_spm(
    f: GgufMeta<'_>,
    tokens: &[String],
    types: &[i64],
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let scores: Vec<f32> = match f.get_array("tokenizer.ggml.scores") {
        Some(a) if a.len() == tokens.len() => {
            a.iter().map(|v| value_as_f32(v).unwrap_or(0.0)).collect()
        }
        _ => return Err(TokenizerError::Metadata("tokenizer.ggml.scores".into())),
    };
    let merges = spm_merges(tokens, types, &scores);
    let unk = f
        .get("tokenizer.ggml.unknown_token_id")
        .and_then(value_as_i64)
        .and_then(|i| tokens.get(i as usize))
        .cloned();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab_map(tokens), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk {
        builder = builder.unk_token(u);
    }
    let bpe = builder.build().map_err(TokenizerError::tk)?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    let add_space_prefix = f
        .get_bool("tokenizer.ggml.add_space_prefix")
        .unwrap_or(true);
    let replace = Replace::new(" ", "\u{2581}").map_err(TokenizerError::tk)?;
    let mut norms: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        norms.push(Prepend::new("\u{2581}".into()).into());
    }
    norms.push(replace.into());
    tk.with_normalizer(Some(tokenizers::normalizers::Sequence::new(norms)));
    let mut decs: Vec<DecoderWrapper> = vec![
        Replace::new("\u{2581}", " ")
            .map_err(TokenizerError::tk)?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decs.push(Strip::new(' ', 1, 0).into());
    }
    tk.with_decoder(Some(DecoderSequence::new(decs)));
    Ok(tk)
}

/// Merges for SentencePiece BPE: every split of a normal piece into two pieces of the
/// vocabulary, ranked by the merged piece's score (highest first), then by its id.
fn spm_merges(tokens: &[String], types: &[i64], scores: &[f32]) -> Vec<(String, String)> {
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut ranked: Vec<(f32, usize, usize, String, String)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        if types[id] != TYPE_NORMAL && types[id] != TYPE_USER_DEFINED {
            continue;
        }
        for (split, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(split);
            if let (Some(_), Some(&ri)) = (ids.get(l), ids.get(r)) {
                ranked.push((scores[id], id, ri, l.to_string(), r.to_string()));
            }
        }
    }
    ranked.sort_by(|a, b| {
        b.0.partial_cmp(&a.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
    });
    ranked.into_iter().map(|(_, _, _, l, r)| (l, r)).collect()
}
