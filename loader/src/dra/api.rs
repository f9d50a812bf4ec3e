//! The API server, as far as the plugin uses it: reading a ResourceClaim
//! (`GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>`),
//! the node, and creating or replacing the node's ResourceSlice; with the
//! pod's service-account token when there is one.
//!
//! HTTPS to the API server, trusting only the CA given (in a pod, the
//! service account's `ca.crt`), or plain HTTP to a `kubectl proxy` (or a
//! test's stand-in API server). One connection per request: a claim is
//! read once per prepare.

use std::path::PathBuf;
use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::{self, PemObject as _};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::TlsConnector;

use super::claim::ResourceClaim;

/// The largest claim read; a claim is a few KiB.
const MAX_BODY: usize = 4 << 20;

/// Where the API server is.
#[derive(Clone)]
pub struct ApiServer {
    /// `host:port`.
    authority: String,
    /// HTTPS: the connector trusting the CA, and the name the server's
    /// certificate must carry.
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// Read before each request, so a rotated token is picked up.
    token_file: Option<PathBuf>,
}

/// Why a claim could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("API server URL {url:?}: not http://host:port or https://host:port")]
    Url { url: String },
    #[error("API server URL {url:?} is HTTPS: give the CA that signed its certificate")]
    NoCa { url: String },
    #[error("reading the API server's CA {path}")]
    Ca {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("the API server's CA {path}: no usable CERTIFICATE in it")]
    NoCaCert { path: PathBuf },
    #[error("the TLS client for the API server")]
    TlsConfig(#[source] rustls::Error),
    #[error("TLS with the API server at {authority}")]
    Tls {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the service-account token {path}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to the API server at {authority}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} on the API server")]
    Http {
        path: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{path}: building the request")]
    Request {
        path: String,
        #[source]
        source: hyper::http::Error,
    },
    #[error("ResourceClaim {namespace}/{name} does not exist")]
    NotFound { namespace: String, name: String },
    #[error("{path}: the API server answered {status}: {body}")]
    Status {
        path: String,
        status: u16,
        body: String,
    },
    #[error("{path}: the answer is larger than {MAX_BODY} bytes")]
    TooLarge { path: String },
    #[error("{path}: not the JSON expected")]
    Decode {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ApiServer {
    /// `url` is `http://host:port` or `https://host:port` (then `ca_file`
    /// is the CA its certificate must chain to).
    pub fn new(
        url: &str,
        token_file: Option<PathBuf>,
        ca_file: Option<PathBuf>,
    ) -> Result<Self, ApiError> {
        let bad = || ApiError::Url {
            url: url.to_owned(),
        };
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad());
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(bad());
        }
        let tls = if https {
            let ca = ca_file.ok_or_else(|| ApiError::NoCa {
                url: url.to_owned(),
            })?;
            let host = host_of(authority).ok_or_else(bad)?;
            let name = ServerName::try_from(host.to_owned()).map_err(|_| bad())?;
            Some((connector(&ca)?, name))
        } else {
            None
        };
        Ok(Self {
            authority: authority.to_owned(),
            tls,
            token_file,
        })
    }

    /// The claim `namespace/name`.
    pub async fn resource_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ResourceClaim, ApiError> {
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}");
        let (status, body) = self.call(hyper::Method::GET, &path, None).await?;
        match status {
            200 => {
                serde_json::from_slice(&body).map_err(|source| ApiError::Decode { path, source })
            }
            404 => Err(ApiError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            status => Err(status_error(&path, status, &body)),
        }
    }

    /// A JSON object at `path`: `None` when the API server has none (404).
    pub async fn get_json(&self, path: &str) -> Result<Option<serde_json::Value>, ApiError> {
        let (status, body) = self.call(hyper::Method::GET, path, None).await?;
        match status {
            200 => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|source| ApiError::Decode {
                    path: path.to_owned(),
                    source,
                }),
            404 => Ok(None),
            status => Err(status_error(path, status, &body)),
        }
    }

    /// Sends `object` to `path` with `method` (POST to create, PUT to
    /// replace); the API server's 200 or 201 is success.
    pub async fn send_json(
        &self,
        method: hyper::Method,
        path: &str,
        object: &serde_json::Value,
    ) -> Result<(), ApiError> {
        let body = serde_json::to_vec(object).map_err(|source| ApiError::Decode {
            path: path.to_owned(),
            source,
        })?;
        let (status, answer) = self.call(method, path, Some(body)).await?;
        match status {
            200 | 201 => Ok(()),
            status => Err(status_error(path, status, &answer)),
        }
    }

    async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), ApiError> {
        let token = match &self.token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|source| ApiError::Token {
                        path: p.clone(),
                        source,
                    })?
                    .trim()
                    .to_owned(),
            ),
            None => None,
        };
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|source| ApiError::Connect {
                authority: self.authority.clone(),
                source,
            })?;
        match &self.tls {
            None => self.request(tcp, method, path, body, token).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|source| ApiError::Tls {
                        authority: self.authority.clone(),
                        source,
                    })?;
                self.request(tls, method, path, body, token).await
            }
        }
    }

    /// One request over `io`.
    async fn request<S>(
        &self,
        io: S,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
        token: Option<String>,
    ) -> Result<(u16, Bytes), ApiError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let http = |source| ApiError::Http {
            path: path.to_owned(),
            source,
        };
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(http)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("API server connection: {e}");
            }
        });
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, "application/json");
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Some(t) = token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|source| ApiError::Request {
                path: path.to_owned(),
                source,
            })?;
        let resp = send.send_request(req).await.map_err(http)?;
        let status = resp.status().as_u16();
        let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|_| ApiError::TooLarge {
                path: path.to_owned(),
            })?
            .to_bytes();
        Ok((status, body))
    }
}

fn status_error(path: &str, status: u16, body: &[u8]) -> ApiError {
    ApiError::Status {
        path: path.to_owned(),
        status,
        body: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
    }
}

/// The host of `host:port` or `[v6]:port`.
fn host_of(authority: &str) -> Option<&str> {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split_once(']').map(|(h, _)| h);
    }
    authority
        .rsplit_once(':')
        .map_or(Some(authority), |(h, _)| Some(h))
}

/// A TLS client trusting only the certificates in `ca` (PEM).
fn connector(ca: &std::path::Path) -> Result<TlsConnector, ApiError> {
    let certs = CertificateDer::pem_file_iter(ca)
        .and_then(|c| c.collect::<Result<Vec<_>, _>>())
        .map_err(|source| ApiError::Ca {
            path: ca.to_owned(),
            source,
        })?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(ApiError::NoCaCert {
            path: ca.to_owned(),
        });
    }
    // The provider is named, as the daemon's: only ring is linked.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ApiError::TlsConfig)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_or_refused() {
        assert_eq!(host_of("10.96.0.1:443"), Some("10.96.0.1"));
        assert_eq!(host_of("[fd00::1]:443"), Some("fd00::1"));
        assert_eq!(host_of("api.example"), Some("api.example"));
        assert!(ApiServer::new("http://127.0.0.1:8001", None, None).is_ok());
        assert!(matches!(
            ApiServer::new("https://127.0.0.1:6443", None, None),
            Err(ApiError::NoCa { .. })
        ));
        for bad in ["ftp://x:1", "http://", "http://h:1/api", "127.0.0.1:8001"] {
            assert!(
                matches!(ApiServer::new(bad, None, None), Err(ApiError::Url { .. })),
                "{bad}"
            );
        }
    }
}
