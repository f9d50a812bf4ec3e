//! A **stand-in for the Kubernetes API server**: plain HTTP on a loopback
//! port, answering `GET <path>` with the JSON a test put there (a
//! ResourceClaim as the scheduler leaves it) or 404 as the API server
//! does for an object that does not exist. It counts the requests.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic with a message when the loopback cannot be used"
)]

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Routes = Arc<Mutex<HashMap<String, String>>>;

/// The stand-in API server; stopped when dropped.
pub struct StandInApiServer {
    pub port: u16,
    routes: Routes,
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
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (routes, requests, stop) = (routes.clone(), requests.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            requests.fetch_add(1, Ordering::Relaxed);
                            serve_one(s, &routes);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Self {
            port,
            routes,
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
}

impl Drop for StandInApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_one(s: std::net::TcpStream, routes: &Routes) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut r = BufReader::new(&s);
    let mut first = String::new();
    if r.read_line(&mut first).is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {}
        }
    }
    let path = first.split_whitespace().nth(1).unwrap_or("").to_owned();
    let found = routes.lock().ok().and_then(|r| r.get(&path).cloned());
    let (status, body) = match found {
        Some(b) => ("200 OK", b),
        None => (
            "404 Not Found",
            format!(
                r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"{path} not found","reason":"NotFound","code":404}}"#
            ),
        ),
    };
    let mut w = &s;
    let _ = write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
