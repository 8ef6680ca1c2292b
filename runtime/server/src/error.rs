//! API errors and their one mapping to HTTP status and the OpenAI error shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Why a request failed, as the client sees it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something this server does not do (HTTP 400).
    #[error("{message}")]
    BadRequest {
        /// What is wrong, naming the field.
        message: String,
        /// The offending field, when one is to blame.
        param: Option<String>,
    },
    /// Missing or wrong API key (HTTP 401).
    #[error("invalid or missing API key")]
    Unauthorized,
    /// No such model or route (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The server is shutting down, or its scheduler has stopped (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// The waiting queue is full; the request was not queued (HTTP 503 with `Retry-After`).
    #[error("{message}")]
    Overloaded {
        /// What is full.
        message: String,
        /// When to try again, in whole seconds (`Retry-After`; the body also says
        /// `retry_after_ms`).
        retry_after_s: u64,
    },
    /// A failure on our side (HTTP 500).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> Self {
        let param = param.into();
        let message = message.into();
        ApiError::BadRequest {
            message: format!("{param}: {message}"),
            param: Some(param),
        }
    }

    /// A 400 without a single field to blame.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            param: None,
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unavailable(_) | ApiError::Overloaded { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error object `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        let kind = match self {
            ApiError::BadRequest { .. } => "invalid_request_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::NotFound(_) => "not_found_error",
            ApiError::Unavailable(_) | ApiError::Internal(_) => "server_error",
            ApiError::Overloaded { .. } => "overloaded_error",
        };
        let param = match self {
            ApiError::BadRequest { param, .. } => param.clone(),
            _ => None,
        };
        let mut v = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": kind,
                "param": param,
                "code": self.status().as_u16(),
            }
        });
        if let ApiError::Overloaded { retry_after_s, .. } = self {
            v["error"]["retry_after_ms"] = serde_json::json!(retry_after_s * 1000);
        }
        v
    }
}

/// `Retry-After` of a refusal for a full queue. A fixed second: long enough for a
/// few decode steps to free places, short enough that a client backing off exponentially
/// from here does not leave the server idle.
pub const RETRY_AFTER_S: u64 = 1;

impl From<sglrs_scheduler::SchedError> for ApiError {
    fn from(e: sglrs_scheduler::SchedError) -> Self {
        match e {
            sglrs_scheduler::SchedError::Overloaded { .. }
            | sglrs_scheduler::SchedError::TenantOverloaded { .. } => ApiError::Overloaded {
                message: e.to_string(),
                retry_after_s: RETRY_AFTER_S,
            },
            _ => ApiError::Unavailable(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = axum::Json(self.body());
        match self {
            ApiError::Overloaded { retry_after_s, .. } => (
                status,
                [(axum::http::header::RETRY_AFTER, retry_after_s.to_string())],
                body,
            )
                .into_response(),
            _ => (status, body).into_response(),
        }
    }
}

/// Parses a JSON body, turning serde's message (which names unknown fields and bad types)
/// into a 400.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let msg = e.to_string();
        let param = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
            .map(str::to_string);
        ApiError::BadRequest {
            message: format!("invalid request body: {msg}"),
            param,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct T {
        a: u32,
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = parse_json::<T>(br#"{"a": 1, "bogus": 2}"#).unwrap_err();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert!(e.to_string().contains("bogus"), "{e}");
        assert_eq!(e.body()["error"]["param"], "bogus");
        let e = parse_json::<T>(b"{not json").unwrap_err();
        assert!(e.to_string().contains("invalid request body"));
        assert_eq!(
            ApiError::bad("top_p", "must be in (0, 1]").body()["error"]["code"],
            400
        );
    }

    #[test]
    fn a_full_queue_is_503_with_retry_after() {
        let e = ApiError::from(sglrs_scheduler::SchedError::Overloaded { limit: 2 });
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.body()["error"]["retry_after_ms"], RETRY_AFTER_S * 1000);
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            r.headers()[axum::http::header::RETRY_AFTER],
            RETRY_AFTER_S.to_string().as_str()
        );
        // A stopped scheduler is 503 without a promise of when to come back.
        let r = ApiError::from(sglrs_scheduler::SchedError::Shutdown).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().get(axum::http::header::RETRY_AFTER).is_none());
    }
}
