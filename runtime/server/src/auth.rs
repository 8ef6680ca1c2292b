//! API keys and tenants: which routes need a key, a comparison whose time says nothing about
//! the keys, and who the caller is.
//!
//! With a key set, every route answers 401 without `Authorization: Bearer KEY` except the
//! open ones: `/health` (a liveness probe that does no work), and `/metrics` only when
//! `--metrics-open` asks for it. `/health_generate` is not open: it runs a generation at top
//! priority, ahead of every queued request. Unknown paths need the key too (their 404 would
//! otherwise map the route table for anyone).
//!
//! Keys come from `--api-key` (one key, tenant `default`) and `--api-keys-file` (one
//! `KEY TENANT` pair per line, [`parse_keys_file`]). A presented key is compared with every
//! configured key, all of them, so the time does not show which one (or whether one)
//! matched. The caller's [`Tenant`] goes to the handlers as a request extension: it names
//! the request's cache namespace ([`Tenant::namespace`]) and its share of the scheduler's
//! queue ([`Tenant::id`]).

use axum::http::HeaderMap;
use sglrs_radix_cache::Namespace;
use std::path::Path;
use std::sync::Arc;
use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

/// Who sent a request, as its key says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    name: Arc<str>,
    id: u64,
}

impl Default for Tenant {
    /// No tenant: a server without keys, or with one server-wide `--api-key` (every caller
    /// is then the same tenant, `default`).
    fn default() -> Self {
        Self {
            name: Arc::from("default"),
            id: 0,
        }
    }
}

impl Tenant {
    /// A tenant of a keys file, named `name`.
    pub fn named(name: &str) -> Self {
        // 0 means "no tenant" to the scheduler.
        let id = xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), TENANT_SEED).max(1);
        Self {
            name: Arc::from(name),
            id,
        }
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The scheduler's id of the tenant ([`sglrs_scheduler::SchedRequest::tenant`]); 0 for
    /// no tenant.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The cache namespace of this tenant's requests that name `ns` (`extra_key`,
    /// `cache_salt`, or none): a hash of the tenant and `ns`, so two tenants never share
    /// a cached page whatever they send, while one tenant's requests in one namespace do.
    /// No tenant keeps `ns`.
    pub fn namespace(&self, ns: Namespace) -> Namespace {
        if self.id == 0 {
            return ns;
        }
        let mut bytes = Vec::with_capacity(self.name.len() + 9);
        bytes.extend_from_slice(self.name.as_bytes());
        bytes.push(0xff); // not in UTF-8: the name ends here
        bytes.extend_from_slice(&ns.0.to_le_bytes());
        Namespace(xxhash_rust::xxh3::xxh3_64_with_seed(
            &bytes,
            sglrs_radix_cache::hash::NAMESPACE_SEED,
        ))
    }
}

/// Seed of the tenant ids (`"sglrs-tn"` as a little-endian `u64`).
const TENANT_SEED: u64 = u64::from_le_bytes(*b"sglrs-tn");

/// Why a keys file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeysFileError {
    /// The file could not be read.
    #[error("--api-keys-file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The file names no key: serving with it would need none.
    #[error("--api-keys-file {path}: no `KEY TENANT` line")]
    Empty {
        /// The file.
        path: String,
    },
    /// A line is not `KEY TENANT`.
    #[error("--api-keys-file {path}, line {line}: {reason}")]
    Line {
        /// The file.
        path: String,
        /// The line's number (from 1).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// Reads `KEY TENANT` pairs, one per line, separated by whitespace; `#` starts a comment
/// and blank lines are skipped. A line with one field (an empty tenant) or more than two, a
/// key that appears twice (also as `also`, the `--api-key`) is an error naming the line; so
/// are a file that cannot be read and one without a key (it would leave the server open).
pub fn parse_keys_file(
    path: &Path,
    also: Option<&str>,
) -> Result<Vec<(String, Tenant)>, KeysFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| KeysFileError::Read {
        path: shown.clone(),
        source,
    })?;
    let mut out: Vec<(String, Tenant)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let bad = |reason: String| KeysFileError::Line {
            path: shown.clone(),
            line: i + 1,
            reason,
        };
        let line = raw.split('#').next().unwrap_or("");
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields[..] {
            [] => continue,
            [_] => return Err(bad("a key without a tenant (want `KEY TENANT`)".into())),
            [key, tenant] => {
                if out.iter().any(|(k, _)| k == key) || also == Some(key) {
                    return Err(bad("this key is given twice".into()));
                }
                out.push((key.to_string(), Tenant::named(tenant)));
            }
            _ => return Err(bad(format!("{} fields (want `KEY TENANT`)", fields.len()))),
        }
    }
    if out.is_empty() {
        return Err(KeysFileError::Empty { path: shown });
    }
    Ok(out)
}

/// What the routes check a caller's key against.
#[derive(Clone, Default)]
pub struct Auth {
    keys: Vec<(Vec<u8>, Tenant)>,
    metrics_open: bool,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("keys", &self.keys.len())
            .field("metrics_open", &self.metrics_open)
            .finish()
    }
}

impl Auth {
    /// Requires `key` (when set and not empty) on every route but the open ones;
    /// `metrics_open` adds `/metrics` to them. Every caller is the same tenant.
    pub fn new(key: Option<String>, metrics_open: bool) -> Self {
        Self::with_tenants(key, Vec::new(), metrics_open)
    }

    /// Requires one of `tenants`' keys or `key` (tenant `default`). With `tenants` empty
    /// this is [`Auth::new`]: `key`'s callers are no tenant in particular.
    pub fn with_tenants(
        key: Option<String>,
        tenants: Vec<(String, Tenant)>,
        metrics_open: bool,
    ) -> Self {
        let key = key.filter(|k| !k.is_empty());
        let default = if tenants.is_empty() {
            Tenant::default()
        } else {
            Tenant::named("default")
        };
        let mut keys: Vec<(Vec<u8>, Tenant)> =
            key.map(|k| (k.into_bytes(), default)).into_iter().collect();
        keys.extend(
            tenants
                .into_iter()
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, t)| (k.into_bytes(), t)),
        );
        Self { keys, metrics_open }
    }

    /// True when a key is required at all.
    pub fn required(&self) -> bool {
        !self.keys.is_empty()
    }

    /// True for the routes that answer without the key.
    pub fn is_open(&self, path: &str) -> bool {
        path == "/health" || (self.metrics_open && path == "/metrics")
    }

    /// True when a request to `path` with these headers may proceed.
    pub fn allows(&self, path: &str, headers: &HeaderMap) -> bool {
        self.authenticate(path, headers).is_some()
    }

    /// The caller's tenant when a request to `path` with these headers may proceed (no
    /// tenant on a server without keys and on the open routes); `None`: 401.
    pub fn authenticate(&self, path: &str, headers: &HeaderMap) -> Option<Tenant> {
        if self.keys.is_empty() || self.is_open(path) {
            return Some(Tenant::default());
        }
        let presented = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()))?;
        self.find(presented).map(|i| self.keys[i].1.clone())
    }

    /// The index of the key equal to `presented`, comparing it with every key (no early
    /// exit, the index chosen with `subtle`), so the time depends on the number of keys and
    /// on `presented`, not on which key matched.
    fn find(&self, presented: &[u8]) -> Option<usize> {
        let mut found = Choice::from(0);
        let mut index = 0u64;
        for (i, (key, _)) in self.keys.iter().enumerate() {
            let m = key_matches(presented, key);
            index = u64::conditional_select(&index, &(i as u64), m);
            found |= m;
        }
        bool::from(found).then_some(index as usize)
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
fn key_matches(presented: &[u8], key: &[u8]) -> Choice {
    let expected: Vec<u8> = (0..presented.len()).map(|i| key[i % key.len()]).collect();
    let same_len = (presented.len() as u64).ct_eq(&(key.len() as u64));
    presented.ct_eq(&expected) & same_len
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
        assert!(bool::from(key_matches(b"secret", b"secret")));
        for wrong in [
            &b""[..],
            b"s",
            b"secre",
            b"secreT",
            b"secrets",
            b"secretsecret",
        ] {
            assert!(!bool::from(key_matches(wrong, b"secret")), "{wrong:?}");
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

    #[test]
    fn a_keys_file_names_each_keys_tenant_and_refuses_bad_lines() {
        let dir = std::env::temp_dir().join(format!("sglrs-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let good = file("good", "# keys\nka alice\n\n  kb\tbob  # second\n");
        let keys = parse_keys_file(&good, Some("kd")).unwrap();
        assert_eq!(keys.len(), 2);
        let a = Auth::with_tenants(Some("kd".into()), keys, false);
        let who = |key: &str| a.authenticate("/generate", &headers(&format!("Bearer {key}")));
        assert_eq!(who("ka").unwrap().name(), "alice");
        assert_eq!(who("kb").unwrap().name(), "bob");
        assert_eq!(who("kd").unwrap(), Tenant::named("default"));
        for wrong in ["k", "kc", "kaa", "alice"] {
            assert_eq!(who(wrong), None, "{wrong}");
        }
        assert_eq!(
            a.authenticate("/health", &HeaderMap::new()),
            Some(Tenant::default())
        );
        for (text, line) in [
            ("ka alice\nkb\n", 2),
            ("ka alice\nka bob\n", 2),
            ("\n\nka alice extra\n", 3),
            ("kd alice\n", 1),
        ] {
            let err = parse_keys_file(&file("bad", text), Some("kd")).unwrap_err();
            assert!(
                matches!(err, KeysFileError::Line { line: l, .. } if l == line),
                "{text:?}: {err}"
            );
            assert!(err.to_string().contains(&format!("line {line}")), "{err}");
        }
        assert!(matches!(
            parse_keys_file(&dir.join("missing"), None),
            Err(KeysFileError::Read { .. })
        ));
        assert!(matches!(
            parse_keys_file(&file("empty", "# nobody yet\n\n"), None),
            Err(KeysFileError::Empty { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tenants_get_their_own_namespaces() {
        let (a, b) = (Tenant::named("alice"), Tenant::named("bob"));
        let salt = Namespace::from_name("s");
        assert_ne!(a.namespace(salt), b.namespace(salt));
        assert_ne!(
            a.namespace(Namespace::DEFAULT),
            b.namespace(Namespace::DEFAULT)
        );
        assert_ne!(a.namespace(salt), a.namespace(Namespace::DEFAULT));
        assert_eq!(a.namespace(salt), Tenant::named("alice").namespace(salt));
        assert_eq!(Tenant::default().namespace(salt), salt);
        assert_eq!(Tenant::default().id(), 0);
        assert_ne!(a.id(), 0);
    }
}
