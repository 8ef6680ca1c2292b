//! The API key: which routes need it, and a comparison whose time says nothing about it.
//!
//! With a key set, every route answers 401 without `Authorization: Bearer KEY` except the
//! open ones: `/health` (a liveness probe that does no work), and `/metrics` only when
//! `--metrics-open` asks for it. `/health_generate` is not open: it runs a generation at top
//! priority, ahead of every queued request. Unknown paths need the key too (their 404 would
//! otherwise map the route table for anyone).

use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

/// What the routes check a caller's key against.
#[derive(Clone, Default)]
pub struct Auth {
    key: Option<Vec<u8>>,
    metrics_open: bool,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("key", &self.key.as_ref().map(|_| "<set>"))
            .field("metrics_open", &self.metrics_open)
            .finish()
    }
}

impl Auth {
    /// Requires `key` (when set and not empty) on every route but the open ones;
    /// `metrics_open` adds `/metrics` to them.
    pub fn new(key: Option<String>, metrics_open: bool) -> Self {
        Self {
            key: key.filter(|k| !k.is_empty()).map(String::into_bytes),
            metrics_open,
        }
    }

    /// True when a key is required at all.
    pub fn required(&self) -> bool {
        self.key.is_some()
    }

    /// True for the routes that answer without the key.
    pub fn is_open(&self, path: &str) -> bool {
        path == "/health" || (self.metrics_open && path == "/metrics")
    }

    /// True when a request to `path` with these headers may proceed.
    pub fn allows(&self, path: &str, headers: &HeaderMap) -> bool {
        let Some(key) = &self.key else {
            return true;
        };
        if self.is_open(path) {
            return true;
        }
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()))
            .is_some_and(|presented| key_matches(presented, key))
    }
}

/// The credentials of `Bearer <token>` (the scheme is case-insensitive, RFC 9110 §11.1).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = &rest[1..];
    let start = token.iter().position(|&b| b != b' ')?;
    Some(&token[start..])
}

/// `presented == key` in time that depends only on `presented`'s length: the bytes are
/// compared against the key repeated to that length with `subtle` (no early exit), and the
/// lengths compared as numbers, so neither the key's bytes nor its length show in the
/// timing. `key` is not empty.
fn key_matches(presented: &[u8], key: &[u8]) -> bool {
    let expected: Vec<u8> = (0..presented.len()).map(|i| key[i % key.len()]).collect();
    let same_len = (presented.len() as u64).ct_eq(&(key.len() as u64));
    (presented.ct_eq(&expected) & same_len).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::AUTHORIZATION,
            HeaderValue::from_str(auth).unwrap(),
        );
        h
    }

    #[test]
    fn only_the_exact_key_passes() {
        assert!(key_matches(b"secret", b"secret"));
        for wrong in [
            &b""[..],
            b"s",
            b"secre",
            b"secreT",
            b"secrets",
            b"secretsecret",
        ] {
            assert!(!key_matches(wrong, b"secret"), "{wrong:?}");
        }
        let a = Auth::new(Some("secret".into()), false);
        assert!(a.allows("/generate", &headers("Bearer secret")));
        assert!(a.allows("/generate", &headers("bearer  secret")));
        for h in [
            "Bearer secre",
            "Bearer",
            "Bearer ",
            "Basic secret",
            "secret",
            "Bearersecret",
        ] {
            assert!(!a.allows("/generate", &headers(h)), "{h}");
        }
        assert!(!a.allows("/generate", &HeaderMap::new()));
    }

    #[test]
    fn open_routes() {
        let a = Auth::new(Some("k".into()), false);
        assert!(a.allows("/health", &HeaderMap::new()));
        for p in ["/health_generate", "/metrics", "/nope", "/"] {
            assert!(!a.allows(p, &HeaderMap::new()), "{p}");
        }
        let a = Auth::new(Some("k".into()), true);
        assert!(a.allows("/metrics", &HeaderMap::new()));
        assert!(!a.allows("/health_generate", &HeaderMap::new()));
        // No key (or an empty one): everything is open.
        assert!(Auth::new(None, false).allows("/generate", &HeaderMap::new()));
        assert!(!Auth::new(Some(String::new()), false).required());
    }
}
