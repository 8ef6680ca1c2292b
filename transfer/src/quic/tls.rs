//! TLS for the cluster: one certificate shared by every host (self-signed, made by rcgen, or
//! loaded from PEM files). Servers present it and require clients to present it too (mutual
//! TLS), so no host without the cluster key can open a connection; the shared secret in the
//! protocol's hello is a second, independent check.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The DNS name in the cluster certificate; clients verify the server against it whatever
/// address they dial.
pub const CLUSTER_NAME: &str = "sglrs-cluster";

/// Why TLS material could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating the self-signed certificate failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A PEM file could not be read or parsed.
    #[error("cannot load {path}: {reason}")]
    Load {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the configuration (e.g. the key does not match the certificate).
    #[error("TLS configuration rejected: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client verifier: {0}")]
    Verifier(String),
}

/// The cluster certificate chain and its private key.
#[derive(Debug)]
pub struct ClusterIdentity {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for ClusterIdentity {
    fn clone(&self) -> Self {
        Self {
            certs: self.certs.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl ClusterIdentity {
    /// A fresh self-signed cluster certificate for [`CLUSTER_NAME`]. Write it out with
    /// [`to_pem`](Self::to_pem) and give the same files to every host.
    pub fn generate() -> Result<Self, TlsError> {
        let ck = rcgen::generate_simple_self_signed(vec![CLUSTER_NAME.to_string()])?;
        let key = PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
        Ok(Self {
            certs: vec![ck.cert.der().clone()],
            key,
        })
    }

    /// The certificate chain and key as PEM text `(cert, key)`.
    pub fn to_pem(&self) -> (String, String) {
        let mut cert = String::new();
        for c in &self.certs {
            cert.push_str(&pem_block("CERTIFICATE", c.as_ref()));
        }
        let label = match &self.key {
            PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
            PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
            _ => "PRIVATE KEY",
        };
        (cert, pem_block(label, self.key.secret_der()))
    }

    /// Loads the certificate chain and key from PEM files.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let load = |p: &Path, e: &dyn std::fmt::Display| TlsError::Load {
            path: p.display().to_string(),
            reason: e.to_string(),
        };
        let certs = CertificateDer::pem_file_iter(cert)
            .map_err(|e| load(cert, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| load(cert, &e))?;
        if certs.is_empty() {
            return Err(load(cert, &"no certificate in the file"));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| load(key, &e))?;
        Ok(Self { certs, key })
    }

    /// Parses the certificate chain and key from PEM text.
    pub fn from_pem(cert: &str, key: &str) -> Result<Self, TlsError> {
        let load = |what: &str, e: &dyn std::fmt::Display| TlsError::Load {
            path: what.to_string(),
            reason: e.to_string(),
        };
        let certs = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| load("certificate PEM", &e))?;
        if certs.is_empty() {
            return Err(load("certificate PEM", &"no certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| load("key PEM", &e))?;
        Ok(Self { certs, key })
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in &self.certs {
            roots.add(c.clone())?;
        }
        Ok(Arc::new(roots))
    }

    /// rustls server configuration: presents the cluster certificate and requires clients
    /// to present one that chains to it.
    pub(crate) fn server_config(&self, alpn: &[u8]) -> Result<rustls::ServerConfig, TlsError> {
        let provider = crypto_provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots()?,
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Verifier(e.to_string()))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.certs.clone(), self.key.clone_key())?;
        cfg.alpn_protocols = vec![alpn.to_vec()];
        cfg.max_early_data_size = 0;
        Ok(cfg)
    }

    /// rustls client configuration: trusts only the cluster certificate and presents it.
    pub(crate) fn client_config(&self, alpn: &[u8]) -> Result<rustls::ClientConfig, TlsError> {
        let provider = crypto_provider();
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.certs.clone(), self.key.clone_key())?;
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Ok(cfg)
    }
}

/// The crypto provider of both ends: ring with the TLS 1.3 suites only, AES-128-GCM first
/// (ring's default order puts AES-256-GCM first; AES-128 runs 10 AES rounds instead of 14
/// over every byte of page data, and is what QUIC's own Initial packets use).
fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

fn pem_block(label: &str, der: &[u8]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::with_capacity(der.len() * 4 / 3 + 4);
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_roundtrip() {
        let id = ClusterIdentity::generate().unwrap();
        let (cert, key) = id.to_pem();
        let back = ClusterIdentity::from_pem(&cert, &key).unwrap();
        assert_eq!(back.certs, id.certs);
        assert_eq!(back.key.secret_der(), id.key.secret_der());
        assert!(back.server_config(b"x").is_ok());
        assert!(back.client_config(b"x").is_ok());
        assert!(ClusterIdentity::from_pem("garbage", &key).is_err());
    }
}
