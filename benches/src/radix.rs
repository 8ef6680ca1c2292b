//! `sglrs bench radix`: see the crate docs.
