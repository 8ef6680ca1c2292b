//! Python frontend for sglrs: the PyO3 module `sglrs._native` behind `import sglrs as sgl`.
//!
//! The language (`sgl.function`, `gen`, `select`, `fork`, chat roles) and the HTTP backend
//! (`RuntimeEndpoint`) are pure Python under `python/sglrs/`; this crate is the compiled part
//! of the package that maturin builds (`pip install ./python-frontend`).
//!
//! Key items: [`VERSION`], the package version the module reports as `sglrs.__version__`.
//!
//! ```
//! assert!(!_native::VERSION.is_empty());
//! ```
#![warn(missing_docs)]

use pyo3::prelude::*;

/// The package version, shared by the crate and the Python module.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The `sglrs._native` module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", VERSION)?;
    Ok(())
}
