//! Python frontend for sglrs: the PyO3 module `sglrs._native` behind `import sglrs as sgl`.
//!
//! The language (`sgl.function`, `gen`, `select`, `fork`, chat roles) and the HTTP backend
//! (`RuntimeEndpoint`) are pure Python under `python/sglrs/`. This crate is the compiled part:
//! [`PyEngine`] (`sglrs._native.Engine`) runs the sglrs runtime — model, scheduler thread,
//! radix cache, grammar engine — inside the Python process and answers SGLang-native
//! `/generate` request bodies through the server's own handlers, without a socket. The
//! Python class `sglrs.Engine` wraps it as a program backend.
//!
//! Key items: [`engine::start`] (load and start, as `sglrs serve` does without a listener),
//! [`engine::Running`] (answer requests), [`engine::parse_settings`] (engine settings are
//! `sglrs serve` options), [`VERSION`].
//!
//! ```
//! let empty = serde_json::Map::new();
//! let args = _native::engine::parse_settings(Some("model.gguf"), &empty).unwrap();
//! assert_eq!(args.page_size, 16);
//! assert!(!_native::VERSION.is_empty());
//! ```
#![warn(missing_docs)]

pub mod direct;
pub mod engine;
pub mod error;

use engine::{EngineError, Slot, StreamRx};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

/// The package version, shared by the crate and the Python module.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

fn py_err(e: EngineError) -> PyErr {
    match e {
        EngineError::Config(m) | EngineError::BadRequest(m) => PyValueError::new_err(m),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// `sglrs._native.Engine(model_path, config_json)`: the runtime in this process.
#[pyclass(name = "Engine", module = "sglrs._native", frozen)]
pub struct PyEngine {
    slot: Slot,
}

#[pymethods]
impl PyEngine {
    /// Loads the model and starts the scheduler (the GIL is released meanwhile).
    #[new]
    #[pyo3(signature = (model_path=None, config="{}"))]
    fn new(py: Python<'_>, model_path: Option<String>, config: &str) -> PyResult<Self> {
        let cfg: serde_json::Map<String, serde_json::Value> = serde_json::from_str(config)
            .map_err(|e| PyValueError::new_err(format!("engine config: {e}")))?;
        let args = engine::parse_settings(model_path.as_deref(), &cfg).map_err(py_err)?;
        let running = py.detach(move || engine::start(&args)).map_err(py_err)?;
        Ok(PyEngine {
            slot: Slot::new(running),
        })
    }

    /// Answers one `/generate` body (JSON text) with the response JSON text.
    fn generate(&self, py: Python<'_>, body: String) -> PyResult<String> {
        let eng = self.slot.get().map_err(py_err)?;
        py.detach(move || eng.generate(body.into_bytes()))
            .map_err(py_err)
    }

    /// Submits several `/generate` bodies at once; one handle per body, in order. The plain
    /// generations among them are admitted by the scheduler in the same step.
    fn submit_group(&self, py: Python<'_>, bodies: Vec<String>) -> PyResult<Vec<PyPending>> {
        let eng = self.slot.get().map_err(py_err)?;
        let e2 = eng.clone();
        let calls = py
            .detach(move || e2.submit_group(bodies.into_iter().map(String::into_bytes).collect()));
        Ok(calls
            .into_iter()
            .map(|c| PyPending {
                engine: eng.clone(),
                call: Mutex::new(Some(c)),
            })
            .collect())
    }

    /// Starts a streaming `/generate`; iterate for each event's JSON text.
    fn generate_stream(&self, py: Python<'_>, body: String) -> PyResult<PyStream> {
        let eng = self.slot.get().map_err(py_err)?;
        let rx = py
            .detach(move || eng.generate_stream(body.into_bytes()))
            .map_err(py_err)?;
        Ok(PyStream {
            rx: StreamRx(Mutex::new(rx)),
        })
    }

    /// Renders messages (a JSON list of `{"role", "content"}`) with the model's template,
    /// without the generation prompt; `None` if the model has no template.
    fn render_chat(&self, messages: &str) -> PyResult<Option<String>> {
        let eng = self.slot.get().map_err(py_err)?;
        let v: serde_json::Value = serde_json::from_str(messages)
            .map_err(|e| PyValueError::new_err(format!("messages: {e}")))?;
        eng.render_chat(&v).map_err(py_err)
    }

    /// The model path.
    fn model_path(&self) -> PyResult<String> {
        Ok(self.slot.get().map_err(py_err)?.model_path().to_string())
    }

    /// `/get_server_info` as JSON text.
    fn server_info(&self, py: Python<'_>) -> PyResult<String> {
        let eng = self.slot.get().map_err(py_err)?;
        py.detach(move || eng.get("/get_server_info"))
            .map_err(py_err)
    }

    /// Empties the prefix cache; `False` while requests are running.
    fn flush_cache(&self, py: Python<'_>) -> PyResult<bool> {
        let eng = self.slot.get().map_err(py_err)?;
        py.detach(move || eng.flush()).map_err(py_err)
    }

    /// Stops the engine; later calls raise `RuntimeError`.
    fn shutdown(&self, py: Python<'_>) {
        if let Some(eng) = self.slot.take() {
            py.detach(move || drop(eng));
        }
    }
}

/// A submitted `/generate` (from `Engine.submit_group`): `wait()` gives its response JSON.
#[pyclass(name = "PendingGenerate", module = "sglrs._native", frozen)]
pub struct PyPending {
    engine: Arc<engine::Running>,
    call: Mutex<Option<engine::Call>>,
}

#[pymethods]
impl PyPending {
    /// Waits (GIL released) for the response JSON text; raises the request's error. A
    /// second call raises `RuntimeError`.
    fn wait(&self, py: Python<'_>) -> PyResult<String> {
        let call = self
            .call
            .lock()
            .ok()
            .and_then(|mut c| c.take())
            .ok_or_else(|| PyRuntimeError::new_err("this request was already waited for"))?;
        let eng = self.engine.clone();
        py.detach(move || call.wait(&eng)).map_err(py_err)
    }
}

/// Iterator over a streaming `/generate`'s events (JSON text each).
#[pyclass(name = "GenerateStream", module = "sglrs._native", frozen)]
pub struct PyStream {
    rx: StreamRx,
}

#[pymethods]
impl PyStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let next = py.detach(|| match self.rx.0.lock() {
            Ok(rx) => rx.recv().ok(),
            Err(_) => None,
        });
        match next {
            None => Ok(None),
            Some(Ok(s)) => Ok(Some(s)),
            Some(Err(e)) => Err(py_err(e)),
        }
    }
}

/// The `sglrs._native` module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", VERSION)?;
    m.add_class::<PyEngine>()?;
    m.add_class::<PyStream>()?;
    m.add_class::<PyPending>()?;
    Ok(())
}
