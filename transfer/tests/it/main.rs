//! Integration tests of sglrs-transfer: QUIC on loopback and the KV store.

mod common;
mod quic;
mod store;
