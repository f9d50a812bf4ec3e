//! A **stand-in for the Kubernetes API server**: plain HTTP on a loopback
//! port, answering `GET <path>` with the JSON a test put there (a
//! ResourceClaim as the scheduler leaves it) or 404 as the API server
//! does for an object that does not exist. `POST <collection>` creates
//! `<collection>/<metadata.name>` (409 if it exists) and `PUT <path>`
//! replaces it when the body's `metadata.resourceVersion` is the stored
//! one (409 otherwise), as the API server's optimistic concurrency does.
//! It logs each request's method and path.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic with a message when the loopback cannot be used"
)]

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Routes = Arc<Mutex<HashMap<String, String>>>;
type Log = Arc<Mutex<Vec<(String, String)>>>;

/// The stand-in API server; stopped when dropped.
pub struct StandInApiServer {
    pub port: u16,
    routes: Routes,
    log: Log,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The API path of a ResourceClaim.
pub fn claim_path(namespace: &str, name: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
}

impl StandInApiServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let routes: Routes = Arc::default();
        let log: Log = Arc::default();
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (routes, log, requests, stop) =
                (routes.clone(), log.clone(), requests.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            requests.fetch_add(1, Ordering::Relaxed);
                            serve_one(s, &routes, &log);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Self {
            port,
            routes,
            log,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Serves `body` at `path` from now on.
    pub fn put(&self, path: &str, body: &str) {
        self.routes
            .lock()
            .expect("routes")
            .insert(path.to_owned(), body.to_owned());
    }

    /// `path` answers 404 from now on.
    pub fn remove(&self, path: &str) {
        self.routes.lock().expect("routes").remove(path);
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    /// Requests with `method` to `path` so far.
    pub fn requests_to(&self, method: &str, path: &str) -> usize {
        self.log
            .lock()
            .expect("log")
            .iter()
            .filter(|(m, p)| m == method && p == path)
            .count()
    }

    /// Every request so far, (method, path), in order.
    pub fn request_log(&self) -> Vec<(String, String)> {
        self.log.lock().expect("log").clone()
    }

    /// The object at `path`, if one is there.
    pub fn object(&self, path: &str) -> Option<serde_json::Value> {
        let text = self.routes.lock().expect("routes").get(path).cloned()?;
        serde_json::from_str(&text).ok()
    }
}

impl Drop for StandInApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_one(s: std::net::TcpStream, routes: &Routes, log: &Log) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut r = BufReader::new(&s);
    let mut first = String::new();
    if r.read_line(&mut first).is_err() {
        return;
    }
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {
                if let Some((k, v)) = line.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    if r.read_exact(&mut body).is_err() {
        return;
    }
    let mut words = first.split_whitespace();
    let method = words.next().unwrap_or("").to_owned();
    let path = words.next().unwrap_or("").to_owned();
    if let Ok(mut l) = log.lock() {
        l.push((method.clone(), path.clone()));
    }
    let (status, answer) = match routes.lock() {
        Ok(mut routes) => handle(&mut routes, &method, &path, &body),
        Err(_) => ("500 Internal Server Error", String::new()),
    };
    let mut w = &s;
    let _ = write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

fn status(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "reason": reason, "code": code})
    .to_string()
}

fn handle(
    routes: &mut HashMap<String, String>,
    method: &str,
    path: &str,
    body: &[u8],
) -> (&'static str, String) {
    match method {
        "GET" => match routes.get(path) {
            Some(b) => ("200 OK", b.clone()),
            None => (
                "404 Not Found",
                status(404, "NotFound", &format!("{path} not found")),
            ),
        },
        "POST" | "PUT" => {
            let Ok(mut obj) = serde_json::from_slice::<serde_json::Value>(body) else {
                return ("400 Bad Request", status(400, "BadRequest", "not JSON"));
            };
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let target = if method == "POST" {
                format!("{path}/{name}")
            } else {
                path.to_owned()
            };
            let stored_rv = routes.get(&target).and_then(|t| {
                serde_json::from_str::<serde_json::Value>(t).ok()?["metadata"]["resourceVersion"]
                    .as_str()
                    .map(str::to_owned)
            });
            let conflict = match (method, &stored_rv) {
                ("POST", Some(_)) => true,
                ("PUT", None) => {
                    return (
                        "404 Not Found",
                        status(404, "NotFound", &format!("{path} not found")),
                    )
                }
                ("PUT", Some(rv)) => obj["metadata"]["resourceVersion"].as_str() != Some(rv),
                _ => false,
            };
            if conflict {
                return ("409 Conflict", status(409, "Conflict", "conflict"));
            }
            let next: u64 = stored_rv.and_then(|v| v.parse().ok()).unwrap_or(0) + 1;
            obj["metadata"]["resourceVersion"] = next.to_string().into();
            if obj["metadata"]["uid"].is_null() {
                obj["metadata"]["uid"] = format!("0a0b0c0d-0000-4000-8000-{next:012}").into();
            }
            let text = obj.to_string();
            routes.insert(target, text.clone());
            (
                if method == "POST" {
                    "201 Created"
                } else {
                    "200 OK"
                },
                text,
            )
        }
        _ => (
            "405 Method Not Allowed",
            status(405, "MethodNotAllowed", method),
        ),
    }
}
