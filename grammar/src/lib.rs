//! Structured generation for sglrs: regex, JSON Schema, GBNF and choice lists compiled to
//! automata that produce exact token masks.
//!
//! # Key types
//! - [`TokenVocab`]: token id → bytes (byte-level BPE and SentencePiece byte-fallback are
//!   decoded by [`TokenVocab::from_tokenizer`]), special tokens, EOS, and a token trie.
//! - [`CompiledGrammar`]: immutable, `Arc`-shared. Built by [`CompiledGrammar::regex`],
//!   [`CompiledGrammar::json_schema`], [`CompiledGrammar::ebnf`],
//!   [`CompiledGrammar::choices`] (or [`CompiledGrammar::compile`] with a [`GrammarSpec`])
//!   under [`CompileOptions`].
//! - [`Matcher`]: per request. [`Matcher::fill_mask`], [`Matcher::accept_token`],
//!   [`Matcher::rollback`], [`Matcher::forced_bytes`] (jump-forward),
//!   [`Matcher::is_accepting`], [`Matcher::is_finished`], [`Matcher::min_tokens_to_accept`]
//!   [`Matcher::closing_bytes`] (the cheapest valid close), [`Matcher::closing_tokens`] and
//!   [`Matcher::restrict_mask_to_budget`] (keep that close within the tokens left).
//!   Errors are sticky.
//! - [`GrammarCache`]: compiles in the background (std threads) with time, state and memory
//!   limits; [`GrammarCache::get_or_compile`] returns a [`Handle`] to `poll`/`try_get`/`wait`.
//!
//! # How it works
//! Every input compiles to one byte-level NFA whose states may *call* rules (a recursive
//! transition network; recursion only where the input recurses, e.g. `$ref` cycles). The
//! matcher's state is a configuration — the set of `(call stack, NFA state)` threads — and
//! configurations are interned in a lazily built DFA shared by all matchers of a grammar, so a
//! byte step is one table lookup and a token mask, a function of the configuration alone, is
//! computed once by walking the token trie (pruning dead subtrees) and then cached. States
//! that cannot reach the end are trimmed at compile time, so "alive" always means "can still
//! complete": a mask allows a token iff its bytes keep the text completable.
//!
//! # Usage loop
//! ```
//! use std::sync::Arc;
//! use sglrs_grammar::{CompileOptions, CompiledGrammar, Matcher, TokenVocab};
//!
//! // A toy vocabulary: single bytes plus one multi-byte token; token 0 is EOS.
//! let mut tokens: Vec<Vec<u8>> = vec![Vec::new()];
//! tokens.extend((0x20u8..0x7f).map(|b| vec![b]));
//! tokens.push(b"\"name\":".to_vec());
//! let vocab = Arc::new(TokenVocab::new(tokens, &[], &[0]).unwrap());
//!
//! let schema = r#"{"type":"object","properties":{"name":{"type":"string"}},"required":["name"],
//!                  "additionalProperties":false}"#;
//! let g = CompiledGrammar::json_schema(schema, vocab.clone(), &CompileOptions::default()).unwrap();
//! let mut m = Matcher::new(g);
//! assert_eq!(m.forced_bytes(), b"{\"name\":\"");
//! let mut mask = vec![0u32; vocab.mask_words()];
//! for &b in br#"{"name":"Al"}"# {
//!     m.fill_mask(&mut mask).unwrap();
//!     let id = (b - 0x20 + 1) as u32;
//!     assert!(mask[(id / 32) as usize] & (1 << (id % 32)) != 0);
//!     m.accept_token(id).unwrap();
//! }
//! assert!(m.is_accepting());
//! m.accept_token(0).unwrap(); // EOS
//! assert!(m.is_finished());
//! ```
#![warn(missing_docs)]

mod cache;
mod canon;
mod gbnf;
mod json;
mod lazy;
mod length;
mod matcher;
mod nfa;
mod regex;
mod tagged;
mod unique;
mod vocab;

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use cache::{CacheConfig, GrammarCache, Handle, HandleState};
pub use matcher::Matcher;
pub use tagged::{Tag, TaggedSpec, MAX_TAGS, MAX_TAG_LITERAL};
pub use vocab::{TokenEncoding, TokenVocab, MAX_TOKEN_BYTES};

use lazy::{ConfigId, Lazy};
use nfa::{Budget, Builder, Nfa};

/// Most characters of user input (a pattern, a rule name, a schema fragment) an error
/// message quotes.
pub(crate) const EXCERPT_CHARS: usize = 80;

/// `s` as an error message quotes it: at most [`EXCERPT_CHARS`] characters, then `…` when
/// cut (a request's input can be megabytes; its error should not be).
pub(crate) fn excerpt(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(EXCERPT_CHARS) {
        None => std::borrow::Cow::Borrowed(s),
        Some((i, _)) => std::borrow::Cow::Owned(format!("{}…", &s[..i])),
    }
}

/// Errors while building a [`TokenVocab`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum VocabError {
    /// A special or EOS id is outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    BadTokenId {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// No EOS token was given.
    #[error("at least one EOS token id is needed")]
    NoEos,
    /// The tokenizer could not be read.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// Errors while compiling a grammar. They name what could not be honoured.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CompileError {
    /// The grammar text is not valid JSON (JSON Schema input).
    #[error("invalid JSON: {0}")]
    Json(String),
    /// A keyword that cannot be enforced exactly (lenient mode ignores it instead).
    #[error("unsupported `{keyword}` at {pointer}: {reason}")]
    Unsupported {
        /// The keyword.
        keyword: String,
        /// JSON pointer of the schema holding it.
        pointer: String,
        /// Why.
        reason: String,
    },
    /// A malformed schema.
    #[error("invalid schema at {pointer}: {reason}")]
    InvalidSchema {
        /// JSON pointer.
        pointer: String,
        /// What is wrong.
        reason: String,
    },
    /// A regex that does not parse or uses unsupported features.
    #[error("regex {pattern:?}: {reason}")]
    Regex {
        /// The pattern (its first 80 characters, then `…`, when longer).
        pattern: String,
        /// Why.
        reason: String,
    },
    /// A GBNF grammar error.
    #[error("GBNF line {line}: {message}")]
    Gbnf {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The automaton, or one built for a part of it (a regex product), exceeds its state
    /// limit.
    // Emitters that report errors as text are matched on "too many states" (`json/types.rs`).
    #[error("grammar too large: too many states in an automaton of the grammar")]
    TooLarge {
        /// States of the grammar's automaton when the limit hit (for a part's own automaton,
        /// those built before it).
        states: usize,
    },
    /// The input is past one of the compiler's size or nesting limits (checked before
    /// the work they bound).
    #[error("{limit} exceeds the limit of {max}")]
    LimitExceeded {
        /// What is limited, e.g. `GBNF group nesting`.
        limit: &'static str,
        /// The limit.
        max: usize,
    },
    /// Compilation ran past its deadline.
    #[error("compilation ran past its deadline")]
    Timeout,
    /// The grammar accepts no text at all.
    #[error("the grammar accepts no text")]
    Empty,
}

/// Errors while matching tokens. Sticky: once a matcher fails it keeps failing.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum MatchError {
    /// The token cannot continue the text.
    #[error("token {token} rejected at position {position}")]
    Rejected {
        /// Token id.
        token: u32,
        /// Index of the token in the accepted sequence.
        position: usize,
    },
    /// A token after EOS.
    #[error("token {token} after end of sequence")]
    AfterEnd {
        /// Token id.
        token: u32,
    },
    /// The caller's mask buffer is too short.
    #[error("mask has {got} words, need {need}")]
    MaskTooShort {
        /// Words given.
        got: usize,
        /// Words needed.
        need: usize,
    },
    /// Rollback past the start.
    #[error("cannot roll back {requested} tokens, only {available} accepted")]
    RollbackTooFar {
        /// Tokens requested.
        requested: usize,
        /// Tokens available.
        available: usize,
    },
    /// Following the text needs more parse threads than the matcher keeps (an ambiguous
    /// recursion: one per way to parse the text so far); the grammar stays unusable.
    #[error(
        "the grammar is too ambiguous to follow: a step needs more parse threads than the \
         matcher keeps ({max} per closure, 16 times that per step; a recursion that can parse \
         the same text in many ways, e.g. `x ::= \"a\" x | \"a\" x \"b\" | \"\"`)"
    )]
    TooAmbiguous {
        /// The limit on the threads of one closure.
        max: usize,
    },
}

/// Whitespace policy for JSON output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Whitespace {
    /// No whitespace at all (what a small model needs to terminate).
    #[default]
    Compact,
    /// Any run of JSON whitespace between tokens (covers `json.dumps`' `", "` / `": "` and
    /// indented output).
    Flexible,
}

/// Options for compiling. Part of the cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// JSON whitespace policy.
    pub whitespace: Whitespace,
    /// Lenient mode: ignore JSON Schema keywords that cannot be enforced exactly instead of
    /// failing (the result may then accept text the schema rejects).
    pub lenient: bool,
    /// When a schema does not say `additionalProperties`, allow undeclared properties (any
    /// value, between the declared ones) as JSON Schema does. Default `true`; `false` is a
    /// strict mode producing only declared properties (stricter than the schema, never
    /// looser).
    pub allow_undeclared_properties: bool,
    /// Accept declared properties in any order (exact JSON Schema semantics: each key at
    /// most once, required keys before `}`) in objects small enough for the any-order
    /// automaton (≤ 16 declared keys, a state budget); larger objects keep schema order.
    /// Default `true`, as JSON Schema validates. `false` is schema order: stricter than the
    /// schema, never looser, and what generation wants — the server compiles with `false`,
    /// so a model writes keys in the order the schema lists them (a `reasoning` key before
    /// an `answer` key stays first) and jump-forward writes every required key.
    pub any_property_order: bool,
    /// Most NFA states a grammar may have.
    pub max_states: usize,
    /// Compile deadline.
    pub timeout: Option<Duration>,
    /// Bytes of cached token masks per grammar.
    pub mask_cache_bytes: usize,
    /// Configurations whose transitions are remembered per grammar.
    pub max_configs: usize,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            whitespace: Whitespace::Compact,
            lenient: false,
            allow_undeclared_properties: true,
            any_property_order: true,
            max_states: 2_000_000,
            timeout: Some(Duration::from_secs(1)),
            mask_cache_bytes: 64 << 20,
            max_configs: 200_000,
        }
    }
}

impl CompileOptions {
    /// Default options with the flexible whitespace policy.
    pub fn flexible() -> Self {
        CompileOptions {
            whitespace: Whitespace::Flexible,
            ..Self::default()
        }
    }
}

/// What to compile.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GrammarSpec {
    /// A regex (Rust syntax) the whole output must match.
    Regex(String),
    /// A JSON Schema (JSON text).
    JsonSchema(String),
    /// A llama.cpp GBNF grammar; the start rule is `root`.
    Ebnf(String),
    /// Exactly one of these strings.
    Choices(Vec<String>),
    /// JSON values framed by literal text, optionally after free text: tool calls.
    Tagged(TaggedSpec),
}

/// An immutable compiled grammar bound to a vocabulary; share it with `Arc`.
#[derive(Debug)]
pub struct CompiledGrammar {
    nfa: Nfa,
    vocab: Arc<TokenVocab>,
    lazy: Mutex<Lazy>,
    /// The automaton ran past its thread limits ([`lazy::MAX_CLOSURE_VISITS`]).
    poisoned: std::sync::atomic::AtomicBool,
    start: ConfigId,
}

impl CompiledGrammar {
    /// Compiles any [`GrammarSpec`].
    pub fn compile(
        spec: &GrammarSpec,
        vocab: Arc<TokenVocab>,
        opts: &CompileOptions,
    ) -> Result<Arc<Self>, CompileError> {
        match spec {
            GrammarSpec::Regex(p) => Self::regex(p, vocab, opts),
            GrammarSpec::JsonSchema(s) => Self::json_schema(s, vocab, opts),
            GrammarSpec::Ebnf(g) => Self::ebnf(g, vocab, opts),
            GrammarSpec::Choices(c) => Self::choices(c, vocab, opts),
            GrammarSpec::Tagged(t) => Self::tagged(t, vocab, opts),
        }
    }

    fn builder(opts: &CompileOptions) -> Builder {
        Builder::new(Budget {
            max_states: opts.max_states,
            deadline: opts.timeout.map(|t| std::time::Instant::now() + t),
        })
    }

    /// A builder for grammars of JSON values: schemas past `json::MAX_JSON_STATES` are
    /// refused anyway, so building stops there (sooner, and less to free).
    fn json_builder(opts: &CompileOptions) -> Builder {
        Builder::new(Budget {
            max_states: opts.max_states.min(json::MAX_JSON_STATES + 1),
            deadline: opts.timeout.map(|t| std::time::Instant::now() + t),
        })
    }

    fn finish(
        b: Builder,
        vocab: Arc<TokenVocab>,
        opts: &CompileOptions,
    ) -> Result<Arc<Self>, CompileError> {
        let deadline = b.budget.deadline;
        // An empty grammar built through a subset of a complement may come from a schema
        // that accepts values: what is left out is the engine's doing, and the error says so.
        let empty = match b.approximated.clone() {
            Some((keyword, pointer)) => CompileError::Unsupported {
                keyword,
                pointer,
                reason: "a complement there has no exact form, and the subset enforced in \
                         its place (stricter) leaves the grammar no text"
                    .into(),
            },
            None => CompileError::Empty,
        };
        let nfa = match b.finish() {
            Err(CompileError::Empty) => return Err(empty),
            r => r?,
        };
        let mut lazy = Lazy::new(&nfa, opts.mask_cache_bytes, opts.max_configs);
        lazy.share_chain_masks(&nfa, vocab.max_token_len());
        lazy.mark_key_calls(&nfa);
        if !nfa.key_loops.is_empty() {
            // The key-loop checks' token lists (built once per vocabulary, ~10 ms on a
            // 128k one): here rather than inside the first mask.
            vocab.warm_key_opening_tokens();
        }
        let start = lazy.start(&nfa);
        if lazy.poisoned {
            return Err(CompileError::LimitExceeded {
                limit: "parse threads at the start of an ambiguous recursion",
                max: lazy::MAX_CLOSURE_VISITS,
            });
        }
        // Every text nests calls deeper than the matcher follows (a long chain of `$ref`s
        // or rules): say so, rather than that nothing is accepted or, at the first request,
        // that the shortest output has no spelling. The close plan is what every request
        // asks first (`min_output_tokens`), so planning it here costs nothing extra.
        let too_deep = CompileError::LimitExceeded {
            limit: "rule-call nesting that every complete text needs",
            max: lazy::MAX_STACK_DEPTH as usize,
        };
        if start == lazy::DEAD {
            return Err(if lazy.depth_capped { too_deep } else { empty });
        }
        lazy.depth_capped = false;
        if lazy.close_cost(&nfa, &vocab, start) == u32::MAX && lazy.depth_capped {
            return Err(too_deep);
        }
        // The builder checks the deadline between steps; a compile that finished past it
        // is refused all the same, so that none takes longer than the limit.
        if deadline.is_some_and(|d| std::time::Instant::now() > d) {
            return Err(CompileError::Timeout);
        }
        Ok(Arc::new(CompiledGrammar {
            nfa,
            vocab,
            lazy: Mutex::new(lazy),
            poisoned: Default::default(),
            start,
        }))
    }

    /// A regex the whole output must match (Rust `regex` syntax).
    pub fn regex(
        pattern: &str,
        vocab: Arc<TokenVocab>,
        opts: &CompileOptions,
    ) -> Result<Arc<Self>, CompileError> {
        let mut b = Self::builder(opts);
        let r = b.new_rule()?;
        let nfa::Rule { start, end } = b.rules[r as usize];
        let e = regex::emit_pattern(
            &mut b,
            start,
            pattern,
            regex::Flavor::FullMatch,
            regex::Escape::Raw,
        )?;
        b.eps(e, end);
        Self::finish(b, vocab, opts)
    }

    /// A JSON Schema given as JSON text.
    pub fn json_schema(
        schema: &str,
        vocab: Arc<TokenVocab>,
        opts: &CompileOptions,
    ) -> Result<Arc<Self>, CompileError> {
        let v: serde_json::Value =
            serde_json::from_str(schema).map_err(|e| CompileError::Json(e.to_string()))?;
        Self::json_schema_value(&v, vocab, opts)
    }

    /// A JSON Schema given as a parsed value.
    pub fn json_schema_value(
        schema: &serde_json::Value,
        vocab: Arc<TokenVocab>,
        opts: &CompileOptions,
    ) -> Result<Arc<Self>, CompileError> {
        let mut b = Self::json_builder(opts);
        match json::compile(&mut b, schema, opts) {
            // Any order takes a state per set of keys written; where that makes the grammar
            // too large, schema order (stricter, never looser) may still fit, within the
            // same deadline.
            Err(CompileError::TooLarge { .. }) if opts.any_property_order => {
                let deadline = b.budget.deadline;
                drop(b);
                let opts = CompileOptions {
                    any_property_order: false,
                    ..opts.clone()
                };
                let mut b = Self::json_builder(&opts);
                b.budget.deadline = deadline;
                json::compile(&mut b, schema, &opts)?;
                Self::finish(b, vocab, &opts)
            }
            r => {
                r?;
                Self::finish(b, vocab, opts)
            }
        }
    }

    /// JSON values framed by literal text ([`TaggedSpec`]): a model's tool-call syntax.
    pub fn tagged(
        spec: &TaggedSpec,
        vocab: Arc<TokenVocab>,
        opts: &CompileOptions,
    ) -> Result<Arc<Self>, CompileError> {
        let mut b = Self::json_builder(opts);
        tagged::compile(&mut b, spec, opts)?;
        Self::finish(b, vocab, opts)
    }

    /// A llama.cpp GBNF grammar (start rule `root`).
    pub fn ebnf(
        grammar: &str,
        vocab: Arc<TokenVocab>,
        opts: &CompileOptions,
    ) -> Result<Arc<Self>, CompileError> {
        let mut b = Self::builder(opts);
        gbnf::compile(&mut b, grammar)?;
        Self::finish(b, vocab, opts)
    }

    /// Exactly one of `choices`.
    pub fn choices(
        choices: &[String],
        vocab: Arc<TokenVocab>,
        opts: &CompileOptions,
    ) -> Result<Arc<Self>, CompileError> {
        let mut b = Self::builder(opts);
        let r = b.new_rule()?;
        let nfa::Rule { start, end } = b.rules[r as usize];
        for c in choices {
            let e = b.lit(start, c.as_bytes())?;
            b.eps(e, end);
        }
        Self::finish(b, vocab, opts)
    }

    /// The vocabulary masks are computed over.
    pub fn vocab(&self) -> &Arc<TokenVocab> {
        &self.vocab
    }

    /// NFA states (a size measure).
    pub fn num_states(&self) -> usize {
        self.nfa.states.len()
    }

    /// Approximate heap bytes: the NFA plus the lazily grown automaton and mask cache.
    pub fn heap_bytes(&self) -> usize {
        let nfa: usize = self
            .nfa
            .states
            .iter()
            .map(|s| 64 + s.bytes.len() * 8 + s.eps.len() * 4 + s.calls.len() * 8)
            .sum();
        nfa + self.with_lazy(|_, l| l.heap_bytes())
    }

    /// Tokens of the planned close from the start ([`Matcher::closing_tokens`]): the
    /// fewest tokens in which the engine can guarantee a complete output. A request whose
    /// token limit is below it cannot be promised valid output (`usize::MAX`: no plan).
    pub fn min_output_tokens(&self) -> usize {
        let k = self.with_lazy(|nfa, l| l.close_cost(nfa, &self.vocab, self.start));
        if k == u32::MAX {
            usize::MAX
        } else {
            k as usize
        }
    }

    /// Configurations interned so far (the size of the lazily built automaton).
    pub fn num_configs(&self) -> usize {
        self.with_lazy(|_, l| l.configs.len())
    }

    pub(crate) fn start_config(&self) -> ConfigId {
        self.start
    }

    /// True when matching must enforce `uniqueItems` (`unique.rs`).
    pub(crate) fn has_unique(&self) -> bool {
        self.nfa.has_unique()
    }

    /// True when matching must compare whole item values (`unique.rs`, object items).
    pub(crate) fn has_unique_values(&self) -> bool {
        !self.nfa.unique_after.is_empty()
    }

    /// True when matching must count the characters of long strings (`length.rs`).
    pub(crate) fn has_long_strings(&self) -> bool {
        !self.nfa.long_strings.is_empty()
    }

    /// Runs `f` on the automaton as one call (its closures share one visit budget).
    pub(crate) fn with_lazy<R>(&self, f: impl FnOnce(&Nfa, &mut Lazy) -> R) -> R {
        let mut guard = self.lazy.lock().unwrap_or_else(|e| e.into_inner());
        guard.begin_call();
        let r = f(&self.nfa, &mut guard);
        if guard.poisoned {
            self.poisoned
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// The error every matcher of this grammar reports once its automaton ran past the
    /// thread limits (see [`MatchError::TooAmbiguous`]).
    pub(crate) fn poison_error(&self) -> Option<MatchError> {
        self.poisoned
            .load(std::sync::atomic::Ordering::Relaxed)
            .then_some(MatchError::TooAmbiguous {
                max: lazy::MAX_CLOSURE_VISITS,
            })
    }

    /// A matcher at the start of this grammar.
    pub fn matcher(self: &Arc<Self>) -> Matcher {
        Matcher::new(self.clone())
    }
}
