//! `sglrs bench transfer`: see the crate docs.
