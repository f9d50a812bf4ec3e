//! The daemon's HTTP endpoint: metrics, readiness, health and findings,
//! served from what the last scan published (a request never touches the
//! probes or the regions).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use vgpu_common::paths::{HEALTH_PATH, METRICS_PATH, READY_PATH};

/// Path of the findings JSON.
pub const FINDINGS_PATH: &str = "/findings";
/// `/healthz` fails when the poll loop has not run for this long.
const STALE: Duration = Duration::from_secs(10);

/// What the loops publish for the endpoint.
#[derive(Debug)]
pub struct Published {
    pub metrics: String,
    pub findings: String,
    /// Probes attached and the first scan done.
    pub ready: bool,
    pub last_poll: Instant,
}

impl Default for Published {
    fn default() -> Self {
        Self {
            metrics: String::new(),
            findings: "{\"version\":1,\"findings\":[]}\n".to_owned(),
            ready: false,
            last_poll: Instant::now(),
        }
    }
}

/// Shared between the loop and the server.
pub type Shared = Arc<Mutex<Published>>;

/// Binding the listen address failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

/// Binds `addr` (so a taken port is an error at startup, not later).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, shared: Shared) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(respond(&req, &shared)) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!("http connection: {e}");
            }
        });
    }
}

fn respond(req: &Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let Ok(p) = shared.lock() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "state lock poisoned\n".into(),
            "text/plain",
        );
    };
    match req.uri().path() {
        METRICS_PATH => text(
            StatusCode::OK,
            p.metrics.clone(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        READY_PATH if p.ready => text(StatusCode::OK, "ready\n".into(), "text/plain"),
        READY_PATH => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting\n".into(),
            "text/plain",
        ),
        HEALTH_PATH if p.last_poll.elapsed() < STALE => {
            text(StatusCode::OK, "ok\n".into(), "text/plain")
        }
        HEALTH_PATH => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "poll loop stalled\n".into(),
            "text/plain",
        ),
        FINDINGS_PATH => text(StatusCode::OK, p.findings.clone(), "application/json"),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
    }
}

fn text(status: StatusCode, body: String, ctype: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    r
}
