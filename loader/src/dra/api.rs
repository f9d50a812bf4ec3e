//! Reading a ResourceClaim from the API server:
//! `GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>`,
//! with the pod's service-account token when there is one.
//!
//! This first version speaks plain HTTP (a `kubectl proxy` on the node, or
//! a test's stand-in API server); HTTPS to the API server directly is to
//! come.

use std::path::PathBuf;

use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::claim::ResourceClaim;

/// The largest claim read; a claim is a few KiB.
const MAX_BODY: usize = 4 << 20;

/// Where the API server is.
#[derive(Clone, Debug)]
pub struct ApiServer {
    /// `host:port`.
    authority: String,
    /// Read before each request, so a rotated token is picked up.
    token_file: Option<PathBuf>,
}

/// Why a claim could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("API server URL {url:?}: only http://host:port is supported so far")]
    Url { url: String },
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
    #[error("GET {path} from the API server")]
    Http {
        path: String,
        #[source]
        source: hyper::Error,
    },
    #[error("GET {path}: building the request")]
    Request {
        path: String,
        #[source]
        source: hyper::http::Error,
    },
    #[error("ResourceClaim {namespace}/{name} does not exist")]
    NotFound { namespace: String, name: String },
    #[error("GET {path}: the API server answered {status}: {body}")]
    Status {
        path: String,
        status: u16,
        body: String,
    },
    #[error("GET {path}: the answer is larger than {MAX_BODY} bytes")]
    TooLarge { path: String },
    #[error("GET {path}: the answer is not a ResourceClaim")]
    Decode {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ApiServer {
    /// `url` is `http://host:port`.
    pub fn new(url: &str, token_file: Option<PathBuf>) -> Result<Self, ApiError> {
        let authority = url
            .strip_prefix("http://")
            .map(|a| a.trim_end_matches('/'))
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .ok_or_else(|| ApiError::Url {
                url: url.to_owned(),
            })?;
        Ok(Self {
            authority: authority.to_owned(),
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
        let (status, body) = self.get(&path).await?;
        match status {
            200 => {
                serde_json::from_slice(&body).map_err(|source| ApiError::Decode { path, source })
            }
            404 => Err(ApiError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            status => Err(ApiError::Status {
                path,
                status,
                body: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
            }),
        }
    }

    async fn get(&self, path: &str) -> Result<(u16, Bytes), ApiError> {
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
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|source| ApiError::Connect {
                authority: self.authority.clone(),
                source,
            })?;
        let http = |source| ApiError::Http {
            path: path.to_owned(),
            source,
        };
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("API server connection: {e}");
            }
        });
        let mut req = hyper::Request::get(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(t) = token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Empty::<Bytes>::new())
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
