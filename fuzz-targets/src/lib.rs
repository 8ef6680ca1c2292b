//! The bodies of sglrs' fuzz targets, in ordinary (stable) Rust.
//!
//! Each target is one `pub fn(data: &[u8])` that feeds arbitrary bytes to a parser or a
//! state machine of the real crates through their public API and asserts what must hold
//! for every input: no panic, and where it is cheap a real property (a round trip, an
//! agreement between two ways of asking the same question). Inputs are bounded inside each
//! target so that one runs in milliseconds.
//!
//! Two drivers run them: the cargo-fuzz project in `fuzz/` (nightly, `make fuzz`), one
//! `fuzz_target!` per function here, and `tests/replay.rs`, which replays every file of
//! `fuzz/corpus/<target>/` through the same function in `make test`. A crash found by
//! fuzzing is fixed where it lives and its input is kept in the corpus.
//!
//! | target | what it feeds |
//! |---|---|
//! | [`wire::wire_decode`] | a transfer/store protocol frame to the wire decoder |
//! | [`proto::transfer_proto`] | messages, timeouts and local calls to the four protocol ends |
//! | [`store::store_segment`] | a disk segment file to the page store's scan and reads |
//! | [`grammar::grammar`] | a regex / JSON Schema / GBNF to the compiler, then tokens to a matcher |
//! | [`request::request`] | a `/generate` or `/v1/completions` body to the server's checks |
//! | [`gguf::gguf`] | a GGUF file to the model loader |
//! | [`chat::chat_template`] | a chat template and messages to the renderer |
//!
//! ```
//! sglrs_fuzz_targets::wire::wire_decode(b"\x07\x00\x00");
//! sglrs_fuzz_targets::TARGETS.iter().for_each(|(_, f)| f(b""));
//! ```
#![warn(missing_docs)]

pub mod chat;
pub mod gguf;
pub mod grammar;
pub mod proto;
pub mod request;
pub mod store;
pub mod wire;

mod input;

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// Every target by its cargo-fuzz name (the name of its corpus folder).
pub const TARGETS: &[(&str, Target)] = &[
    ("wire_decode", wire::wire_decode),
    ("transfer_proto", proto::transfer_proto),
    ("store_segment", store::store_segment),
    ("grammar", grammar::grammar),
    ("request", request::request),
    ("gguf", gguf::gguf),
    ("chat_template", chat::chat_template),
];
