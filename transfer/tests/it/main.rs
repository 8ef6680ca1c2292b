//! Integration tests of sglrs-transfer: QUIC on loopback and the KV store.

mod common;
mod faults;
mod quic;
mod store;
