//! KV page transfer for sglrs.
//!
//! Owns the sans-IO transfer and store protocols (`proto`), their QUIC driver (quinn), the
//! bootstrap registry and the KV store. Filled in by the transfer work (see `ARCHITECTURE.md`).
#![warn(missing_docs)]
