//! KV page transfer for sglrs.
#![warn(missing_docs)]

pub mod bootstrap;
pub mod layout;
pub mod proto;
pub mod quic;
pub mod store;

pub use layout::{KvDtype, KvLayout};
