//! HTTPS on the daemon's port (`--tls-cert`, `--tls-key`): a certificate
//! chain and its private key as PEM files, typically a Kubernetes TLS
//! Secret's `tls.crt` and `tls.key` (deploy/components/tls). They are read
//! once, at startup: a rotated Secret takes effect when the daemon restarts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::{self, PemObject as _};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// The certificate or key cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--tls-cert {}: {source}", path.display())]
    Cert {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("--tls-cert {}: no PEM CERTIFICATE in it", path.display())]
    NoCert { path: PathBuf },
    #[error("--tls-key {}: {source}", path.display())]
    Key {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("--tls-cert and --tls-key do not make a TLS server: {0}")]
    Config(#[source] rustls::Error),
}

/// An acceptor serving the chain in `cert` with the key in `key` (PEM;
/// the key PKCS#8, PKCS#1 or SEC1), announcing HTTP/1.1 only, which is all
/// the server speaks.
///
/// # Errors
///
/// A file missing or unreadable, no certificate or key in it, or a key that
/// does not match the certificate.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Cert {
            path: cert.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCert {
            path: cert.to_owned(),
        });
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Key {
        path: key.to_owned(),
        source,
    })?;
    // The provider is named, not taken from a process default: the daemon
    // links only ring, and a default picked at run time could differ.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_empty_or_keyless_files_are_errors_that_name_them() {
        let d = tempfile::tempdir().unwrap();
        let empty = d.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = acceptor(&empty, &empty).err().unwrap();
        assert!(matches!(e, TlsError::NoCert { .. }), "{e}");
        assert!(e.to_string().contains("empty.pem"), "{e}");
        let e = acceptor(&d.path().join("none"), &empty).err().unwrap();
        assert!(matches!(e, TlsError::Cert { .. }), "{e}");
        assert!(e.to_string().contains("none"), "{e}");
    }
}
