//! Tokenizers: a [`Tokenizer`] wraps a `tokenizers::Tokenizer` built from a GGUF vocabulary
//! (the same ids llama.cpp produces) or loaded from an HF `tokenizer.json`.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use sglrs_model::{default_model_path, load, LoadOptions};
//! let m = load(&default_model_path(), &LoadOptions::default())?;
//! let ids = m.tokenizer.encode("<|im_start|>user\nhi<|im_end|>", true)?;
//! assert_eq!(m.tokenizer.decode(&ids, false)?, "<|im_start|>user\nhi<|im_end|>");
//! # Ok(()) }
//! ```

mod bytelevel;
mod from_gguf;
mod from_hf;

use tokenizers::AddedToken;

pub use from_gguf::PreTokenizerKind;

/// Why a tokenizer could not be built, or a text could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key the tokenizer needs is missing or has the wrong type.
    #[error("missing or malformed tokenizer metadata `{0}`")]
    Metadata(String),
    /// The vocabulary model (`tokenizer.ggml.model`) is not one sglrs can build.
    #[error("unsupported tokenizer model `{0}` (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// The pre-tokenizer type (`tokenizer.ggml.pre`) is not one sglrs knows.
    #[error(
        "unsupported pre-tokenizer `{0}` (supported: default, smollm, starcoder, gpt-2, \
         llama-bpe, qwen2)"
    )]
    UnsupportedPreTokenizer(String),
    /// The `tokenizers` library refused to build, load, encode or decode.
    #[error("{0}")]
    Tokenizers(String),
    /// A tokenizer file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl TokenizerError {
    fn tk(e: impl std::fmt::Display) -> Self {
        TokenizerError::Tokenizers(e.to_string())
    }
}

/// How the model's token strings map to bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenEncoding {
    /// GPT-2 byte-level: each byte is one printable char (`Ġ` is a space).
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xAB>` tokens are raw bytes.
    SentencePiece,
    /// Token strings are the text itself.
    Raw,
}

/// A tokenizer with the model's special-token ids.
///
/// Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Clone)]
pub struct Tokenizer {
    /// Parses special tokens in the input text.
    inner: tokenizers::Tokenizer,
    /// Treats special tokens in the input as plain text.
    plain: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eog_ids: Vec<u32>,
    add_bos: bool,
    encoding: TokenEncoding,
    /// The bytes of every token id (`token_bytes[id]`).
    token_bytes: Vec<Vec<u8>>,
    /// Ids of special (control) tokens.
    special: Vec<bool>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("add_bos", &self.add_bos)
            .field("encoding", &self.encoding)
            .finish()
    }
}

/// Texts of end-of-turn tokens that end generation whenever the vocabulary has them as
/// special tokens (llama.cpp's end-of-generation set does the same).
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
];

impl Tokenizer {
    /// Wraps a `tokenizers::Tokenizer`. `add_bos` is detected from its post-processor; the
    /// token byte table from `encoding`.
    pub fn from_tokenizers(
        inner: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        encoding: TokenEncoding,
    ) -> Result<Self, TokenizerError> {
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        let mut inner = inner;
        inner.set_encode_special_tokens(false);
        let n = inner.get_vocab_size(true);
        let added = inner.get_added_tokens_decoder();
        let n = added.keys().map(|&k| k as usize + 1).fold(n, usize::max);
        let mut token_bytes = Vec::with_capacity(n);
        let mut special = vec![false; n];
        for id in 0..n as u32 {
            let bytes = match added.get(&id) {
                Some(t) => {
                    special[id as usize] = t.special;
                    t.content.as_bytes().to_vec()
                }
                None => match inner.id_to_token(id) {
                    Some(s) => bytelevel::token_to_bytes(&s, encoding),
                    None => Vec::new(),
                },
            };
            token_bytes.push(bytes);
        }
        let add_bos = match bos_id {
            Some(b) => {
                inner
                    .encode_fast("", true)
                    .map_err(TokenizerError::tk)?
                    .get_ids()
                    .first()
                    == Some(&b)
            }
            None => false,
        };
        let mut eog_ids: Vec<u32> = eos_id.into_iter().collect();
        for text in END_OF_TURN_TEXTS {
            if let Some(id) = inner.token_to_id(text) {
                if special.get(id as usize) == Some(&true) && !eog_ids.contains(&id) {
                    eog_ids.push(id);
                }
            }
        }
        Ok(Tokenizer {
            inner,
            plain,
            bos_id,
            eos_id,
            eog_ids,
            add_bos,
            encoding,
            token_bytes,
            special,
        })
    }

    /// Builds the tokenizer a GGUF file describes (`tokenizer.ggml.*`), as llama.cpp does.
    pub fn from_gguf(meta: crate::meta::GgufMeta<'_>) -> Result<Self, TokenizerError> {
        from_gguf::build(meta)
    }

    /// The underlying `tokenizers::Tokenizer` (special tokens in input are parsed).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Encodes `text`. With `parse_special`, special-token texts in the input (e.g.
    /// `<|im_start|>`) become their ids; without, they are tokenized as plain text. A BOS is
    /// prepended only when the model asks for one ([`Tokenizer::add_bos`]).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let t = if parse_special {
            &self.inner
        } else {
            &self.plain
        };
        let enc = t.encode_fast(text, true).map_err(TokenizerError::tk)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text; `skip_special` drops special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(TokenizerError::tk)
    }

    /// Beginning-of-sequence token, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// End-of-sequence token, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Every token that ends generation: EOS plus end-of-turn special tokens.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog_ids
    }

    /// Whether [`Tokenizer::encode`] prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// How token strings map to bytes.
    pub fn token_encoding(&self) -> TokenEncoding {
        self.encoding
    }

    /// Number of token ids (including added tokens).
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The bytes token `id` stands for (special tokens: their text), or `None` if out of range.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).map(Vec::as_slice)
    }

    /// The token's string as the vocabulary stores it (e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary string (e.g. `<|im_end|>`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Text of the BOS token, for chat templates.
    pub fn bos_token(&self) -> Option<String> {
        self.bos_id.and_then(|id| self.token_text(id))
    }

    /// Text of the EOS token, for chat templates.
    pub fn eos_token(&self) -> Option<String> {
        self.eos_id.and_then(|id| self.token_text(id))
    }

    fn token_text(&self, id: u32) -> Option<String> {
        self.token_bytes(id)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

/// An added token as llama.cpp treats it: matched verbatim, no stripping.
fn added_token(content: &str, special: bool) -> AddedToken {
    AddedToken::from(content.to_string(), special)
        .single_word(false)
        .lstrip(false)
        .rstrip(false)
        .normalized(false)
}
