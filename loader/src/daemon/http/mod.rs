//! The daemon's HTTP endpoint: metrics, readiness, health and findings,
//! served from what the last scan published (a request never touches the
//! probes or the regions).
//!
//! The port is reachable from every pod of the node (Prometheus scrapes the
//! pod IP), so a tenant can connect to it. It runs on its own thread (a long
//! scan never delays an answer) and bounds what a client can hold: a
//! request's headers must arrive within [`HEADER_TIMEOUT`], a connection
//! lives at most [`CONN_TIMEOUT`] and serves one request, a request is at
//! most [`MAX_BUF`] bytes, and at most [`MAX_CONNS`] connections are open,
//! [`MAX_PER_PEER`] from one address; beyond that a new connection is
//! closed at once. Responses share the published bytes, never copy them.
//!
//! With `--tls-cert`/`--tls-key` every connection is TLS ([`tls`]): the
//! handshake must end within [`HEADER_TIMEOUT`], inside the same caps, and a
//! plain HTTP request fails it and is closed unanswered.
//!
//! [`listen`] binds the sockets it serves on.

pub mod listen;
pub mod tls;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use vgpu_common::paths::{HEALTH_PATH, METRICS_PATH, READY_PATH};

use crate::daemon::publish::exposition::{self, Chunks, Exposition};
use crate::daemon::publish::self_metrics;

/// Path of the findings JSON.
pub const FINDINGS_PATH: &str = "/findings";
/// `/`: what a person opening the port in a browser finds.
const LANDING: &[u8] = b"<!DOCTYPE html>
<html><head><meta charset=\"utf-8\"><title>vgpu daemon</title></head>
<body><h1>vgpu daemon</h1><ul>
<li><a href=\"/metrics\">/metrics</a>: Prometheus metrics</li>
<li><a href=\"/healthz\">/healthz</a>: liveness</li>
<li><a href=\"/readyz\">/readyz</a>: readiness</li>
<li><a href=\"/findings\">/findings</a>: what the daemon found, as JSON</li>
</ul></body></html>
";
/// `/healthz` fails when the poll loop has not run for this long.
const STALE: Duration = Duration::from_secs(10);
/// A request's headers must be complete this soon after it starts.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// A connection is closed this long after it was accepted, whatever it
/// does (a client that never reads its response included).
pub const CONN_TIMEOUT: Duration = Duration::from_secs(10);
/// Read buffer of a connection: the largest request head accepted.
pub const MAX_BUF: usize = 16 * 1024;
/// Header lines accepted in one request.
const MAX_HEADERS: usize = 32;
/// Open connections at once.
pub const MAX_CONNS: usize = 256;
/// Open connections from one address (one pod), so that a tenant flooding
/// the port starves only itself.
pub const MAX_PER_PEER: usize = 16;

/// What the loops publish for the endpoint.
#[derive(Debug)]
pub struct Published {
    /// `/metrics` in both formats (the request's `Accept` picks one).
    pub metrics: Exposition,
    pub findings: Bytes,
    /// Probes loaded and the first scan done (a libcuda found or not: the
    /// daemon is ready on a node without GPU workloads).
    pub ready: bool,
    /// Why the daemon cannot do its job whatever it attaches (`/readyz`
    /// answers 503 with this body).
    pub not_ready: Option<Bytes>,
    pub last_poll: Instant,
}

impl Default for Published {
    fn default() -> Self {
        Self {
            metrics: Exposition::default(),
            findings: Bytes::from_static(b"{\"version\":1,\"findings\":[]}\n"),
            ready: false,
            not_ready: None,
            last_poll: Instant::now(),
        }
    }
}

/// Shared between the loop and the server.
pub type Shared = Arc<Mutex<Published>>;

/// Starting the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot start the HTTP thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Serves `listeners` (bound by [`crate::daemon::http::listen::Listen::bind`]) on a
/// thread of its own, with its own runtime, until the process exits; with
/// `tls`, HTTPS only.
pub fn spawn(
    listeners: Vec<std::net::TcpListener>,
    shared: Shared,
    tls: Option<TlsAcceptor>,
) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Thread)?;
    std::thread::Builder::new()
        .name("vgpu-http".into())
        .spawn(move || {
            rt.block_on(async move {
                let limits = Limits {
                    tls,
                    ..Limits::default()
                };
                let mut tasks = tokio::task::JoinSet::new();
                for l in listeners {
                    match TcpListener::from_std(l) {
                        Ok(l) => {
                            tasks.spawn(serve(l, shared.clone(), limits.clone()));
                        }
                        Err(e) => tracing::error!("http listener: {e}"),
                    }
                }
                while tasks.join_next().await.is_some() {}
            })
        })
        .map_err(ServeError::Thread)?;
    Ok(())
}

/// The connection caps, shared by every listening socket (`:PORT` serves
/// IPv4 and IPv6 from two).
#[derive(Clone)]
pub struct Limits {
    open: Arc<Semaphore>,
    peers: Arc<Peers>,
    /// TLS on every connection (`--tls-cert`), inside the same caps.
    tls: Option<TlsAcceptor>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            open: Arc::new(Semaphore::new(MAX_CONNS)),
            peers: Arc::new(Peers::default()),
            tls: None,
        }
    }
}

/// Open connections per peer address.
#[derive(Debug, Default)]
struct Peers(Mutex<HashMap<IpAddr, usize>>);

/// One connection counted for its peer, uncounted on drop.
struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let mut m = self.0.lock().ok()?;
        let n = m.entry(ip).or_insert(0);
        if *n >= MAX_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.peers.0.lock() {
            if let Some(n) = m.get_mut(&self.ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&self.ip);
                }
            }
        }
    }
}

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, shared: Shared, limits: Limits) {
    let Limits { open, peers, tls } = limits;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over a cap: close at once (dropping the stream), costing nothing.
        let Ok(permit) = open.clone().try_acquire_owned() else {
            continue;
        };
        let Some(slot) = peers.take(peer.ip()) else {
            continue;
        };
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _held = (permit, slot);
            // The handshake counts against the connection's time, and must
            // end as soon as a request's headers must.
            let conn = async {
                match tls {
                    None => connection(stream, shared).await,
                    Some(tls) => match tokio::time::timeout(HEADER_TIMEOUT, tls.accept(stream))
                        .await
                    {
                        Ok(Ok(s)) => connection(s, shared).await,
                        Ok(Err(e)) => Err(format!("TLS handshake: {e}")),
                        Err(_) => Err(format!("TLS handshake not done after {HEADER_TIMEOUT:?}")),
                    },
                }
            };
            match tokio::time::timeout(CONN_TIMEOUT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("http connection from {peer}: {e}"),
                Err(_) => {
                    tracing::debug!("http connection from {peer}: closed after {CONN_TIMEOUT:?}")
                }
            }
        });
    }
}

/// One request on `io`, plain or TLS, within the server's bounds.
async fn connection<I>(io: I, shared: Shared) -> Result<(), String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(respond(&req, &shared)) }
    });
    http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BUF)
        .max_headers(MAX_HEADERS)
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), svc)
        .await
        .map_err(|e| e.to_string())
}

fn respond(req: &Request<Incoming>, shared: &Shared) -> Response<Chunks> {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            Bytes::from_static(b"GET only\n"),
            "text/plain",
        );
    }
    let Ok(p) = shared.lock() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            Bytes::from_static(b"state lock poisoned\n"),
            "text/plain",
        );
    };
    let plain = |code, body: &'static [u8]| text(code, Bytes::from_static(body), "text/plain");
    match req.uri().path() {
        METRICS_PATH => {
            let accept = req.headers().get(hyper::header::ACCEPT);
            let format = exposition::negotiate(accept.and_then(|v| v.to_str().ok()));
            // The process's own series are read now, not at the last scan.
            let (body, ctype) = p.metrics.body_with(format, &self_metrics::render_now());
            let mut r = text(StatusCode::OK, body, ctype);
            r.headers_mut().insert(
                hyper::header::VARY,
                hyper::header::HeaderValue::from_static("Accept"),
            );
            r
        }
        READY_PATH if p.not_ready.is_some() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            p.not_ready.clone().unwrap_or_default(),
            "text/plain",
        ),
        READY_PATH if p.ready => plain(StatusCode::OK, b"ready\n"),
        READY_PATH => plain(StatusCode::SERVICE_UNAVAILABLE, b"starting\n"),
        HEALTH_PATH if p.last_poll.elapsed() < STALE => plain(StatusCode::OK, b"ok\n"),
        HEALTH_PATH => plain(StatusCode::SERVICE_UNAVAILABLE, b"poll loop stalled\n"),
        FINDINGS_PATH => text(StatusCode::OK, p.findings.clone(), "application/json"),
        "/" => text(
            StatusCode::OK,
            Bytes::from_static(LANDING),
            "text/html; charset=utf-8",
        ),
        _ => plain(StatusCode::NOT_FOUND, b"not found\n"),
    }
}

fn text(status: StatusCode, body: impl Into<Chunks>, ctype: &'static str) -> Response<Chunks> {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_at_most_its_share() {
        let peers = Arc::new(Peers::default());
        let ip: IpAddr = [10, 0, 0, 7].into();
        let held: Vec<PeerSlot> = (0..MAX_PER_PEER).filter_map(|_| peers.take(ip)).collect();
        assert_eq!(held.len(), MAX_PER_PEER);
        assert!(peers.take(ip).is_none());
        assert!(
            peers.take([10, 0, 0, 8].into()).is_some(),
            "another peer is served"
        );
        drop(held);
        assert!(peers.take(ip).is_some());
        assert_eq!(
            peers.0.lock().unwrap().len(),
            0,
            "dropped slots leave nothing"
        );
    }
}
