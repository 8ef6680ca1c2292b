//! What can go wrong in the in-process engine.

/// Why the engine could not start or answer.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A setting is unknown or has a bad value.
    #[error("{0}")]
    Config(String),
    /// The model could not be loaded or the runtime could not start.
    #[error("{0}")]
    Start(String),
    /// The request was refused (the message is the server's 4xx error message).
    #[error("{0}")]
    BadRequest(String),
    /// The runtime failed while answering.
    #[error("{0}")]
    Internal(String),
    /// `shutdown()` was called.
    #[error("the engine has been shut down")]
    Shutdown,
}
