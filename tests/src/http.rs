//! Talking to `vgpu daemon` in tests: a free port, a minimal HTTP GET, the
//! wall clock the test programs stamp their marks with.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic with a message when the test machine cannot provide a port"
)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A minimal HTTP/1.1 GET of `path` on 127.0.0.1:`port`: (status, body).
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    get_on(s, path)
}

/// The same GET over a connection the caller made (from another loopback
/// source address, say).
pub fn get_on(mut s: TcpStream, path: &str) -> Option<(u16, String)> {
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The loopback address of the daemon's port.
pub fn loopback(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

/// Wall-clock ns, as the test programs print them in their marks.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
