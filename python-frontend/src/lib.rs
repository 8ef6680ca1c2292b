//! Python frontend for sglrs: the PyO3 module behind `import sglrs as sgl`.
//!
//! Owns the `sgl.function` language and its backends (`RuntimeEndpoint` over HTTP,
//! `Engine` in-process). Filled in by the python-frontend work (see `ARCHITECTURE.md`).
#![warn(missing_docs)]
