//! `sglrs bench grammar`: see the crate docs.
