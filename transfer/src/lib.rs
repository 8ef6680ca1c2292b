//! KV page transfer for sglrs.
#![warn(missing_docs)]

pub mod layout;
pub mod proto;

pub use layout::{KvDtype, KvLayout};
