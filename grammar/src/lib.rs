//! Structured generation for sglrs.
//!
//! Owns the token vocabulary and token trie, regex → DFA, JSON Schema and GBNF → grammar,
//! the immutable `CompiledGrammar` and the per-request `Matcher` that fills token masks.
//! Filled in by the grammar work (see `ARCHITECTURE.md`).
#![warn(missing_docs)]
