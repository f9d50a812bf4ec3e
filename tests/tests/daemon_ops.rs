//! What a platform team runs into operating `vgpu daemon` (root, simulated
//! GPU, the daemon probing each test's own libcuda copy): the `--listen`
//! forms, HTTPS with `--tls-cert`/`--tls-key`, the standard series and
//! landing page every exporter has, and (not met yet) a prompt exit on
//! SIGTERM with probes attached.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::dist;
use vgpu_tests::http::{free_port, get, get_on};
use vgpu_tests::sim::SimGpu;
use vgpu_tests::wait::poll_until;

fn workdir() -> Workdir {
    Workdir::new("vgpu-ops-", &["state", "regions"])
}

/// A daemon on `listen` (as the flag is written), its stderr in `name`.
fn spawn_on(wd: &Workdir, gpu: &SimGpu, listen: &str, port: u16, name: &str) -> Running {
    let cmd = wd.daemon_command(
        gpu,
        &wd.path("state"),
        &wd.path("regions"),
        listen,
        &["--no-nvml"],
    );
    Running::spawn(cmd, port, wd.path(name))
}

/// `/readyz` over a connection `connect` makes answers 200 within 30 s;
/// panics with the log otherwise.
fn wait_ready(d: &mut Running, connect: impl Fn() -> Option<TcpStream>) {
    let ready = poll_until(Duration::from_secs(30), || {
        let up = connect().and_then(|s| get_on(s, "/readyz")).map(|(c, _)| c) == Some(200);
        if !up {
            d.assert_alive();
        }
        up
    });
    assert!(ready.is_some(), "not ready within 30 s: {}", d.log_text());
}

fn v4(port: u16) -> Option<TcpStream> {
    TcpStream::connect(("127.0.0.1", port)).ok()
}

fn v6(port: u16) -> Option<TcpStream> {
    TcpStream::connect(("::1", port)).ok()
}

/// Whether this machine has IPv6 loopback at all.
fn has_ipv6() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

/// `--listen :PORT` serves on every interface (IPv4 and, where the machine
/// has it, IPv6), `--listen localhost:PORT` resolves the name, and
/// `--listen [::1]:PORT` is IPv6; `--help` names the three forms.
#[test]
fn listen_takes_a_bare_port_a_host_name_or_an_ipv6_address() {
    let help = Command::new(dist::vgpu_bin())
        .args(["daemon", "--help"])
        .output()
        .expect("vgpu daemon --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for form in [":PORT", "HOST:PORT", "[::1]:"] {
        assert!(help.contains(form), "--help does not name {form}: {help}");
    }

    let gpu = SimGpu::new();
    let wd = workdir();

    let port = free_port();
    let mut d = spawn_on(&wd, &gpu, &format!(":{port}"), port, "bare.log");
    wait_ready(&mut d, || v4(port));
    if has_ipv6() {
        wait_ready(&mut d, || v6(port));
    }
    d.stop();

    let port = free_port();
    let mut d = spawn_on(&wd, &gpu, &format!("localhost:{port}"), port, "name.log");
    wait_ready(&mut d, || v4(port));
    d.stop();

    if has_ipv6() {
        let port = free_port();
        let mut d = spawn_on(&wd, &gpu, &format!("[::1]:{port}"), port, "v6.log");
        wait_ready(&mut d, || v6(port));
        assert!(v4(port).is_none(), "[::1] must not listen on IPv4");
        d.stop();
    }
}

/// SIGTERM with probes attached: the daemon detaches them and exits 0
/// within a second (a rollout or a node drain waits for it).
///
/// The kernel releases perf-event uprobes one at a time, about 0.1 s each
/// (3.3-3.4 s for this test's libcuda with them); on Linux 6.6 and later
/// the daemon attaches uprobe_multi links instead, one per program and
/// file, released with one grace period. docs/benchmarks.md has the
/// figures.
#[test]
fn sigterm_with_probes_attached_exits_within_a_second() {
    let gpu = SimGpu::new();
    let wd = workdir();
    let mut d = wd.start_daemon(&gpu, &wd.path("state"), &wd.path("regions"), &[]);
    assert!(d.log_text().contains("probing"), "{}", d.log_text());
    assert!(
        d.log_text().contains("uprobe_multi links"),
        "{}",
        d.log_text()
    );
    // Let a scan and a rescan start, as on a node that has run a while.
    std::thread::sleep(Duration::from_secs(1));
    d.assert_serving();
    let t = Instant::now();
    // SAFETY: signalling the daemon this test started (its child).
    unsafe { libc::kill(d.pid() as libc::pid_t, libc::SIGTERM) };
    let status = loop {
        if let Some(st) = d.child.try_wait().expect("wait daemon") {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no exit: {}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = t.elapsed();
    let log = d.log_text();
    eprintln!("exit {took:?} after SIGTERM");
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("probes detached"), "{log}");
    assert!(
        took <= Duration::from_secs(1),
        "exit took {took:?} after SIGTERM: {log}"
    );
}

/// A GET with an `Accept` header: (status, headers, body).
fn get_accept(port: u16, path: &str, accept: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, head.to_owned(), body.to_owned())
}

/// The value of the unlabelled sample `name`.
fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} sample:\n{text}"))
}

/// `/metrics` carries `vgpu_build_info` (version, commit, rustc) and the
/// standard `process_*` series of the daemon itself, in both formats;
/// `/` is a page linking the endpoints.
#[test]
fn metrics_carry_build_info_and_process_series_and_the_root_links_the_endpoints() {
    let gpu = SimGpu::new();
    let wd = workdir();
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let d = wd.start_daemon(&gpu, &wd.path("state"), &wd.path("regions"), &["--no-nvml"]);
    let m = d.metrics();

    let version = Command::new(dist::vgpu_bin())
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let commit = version
        .trim()
        .rsplit_once('(')
        .and_then(|(_, c)| c.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no commit in {version}"));
    let build = m
        .lines()
        .find(|l| l.starts_with("vgpu_build_info{"))
        .unwrap_or_else(|| panic!("no vgpu_build_info:\n{m}"));
    assert!(build.ends_with("} 1"), "{build}");
    assert!(
        build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && build.contains(&format!("commit=\"{commit}\""))
            && build.contains("rustc=\"1."),
        "{build}"
    );
    assert!(m.contains("# TYPE vgpu_build_info gauge"), "{m}");

    let rss = value(&m, "process_resident_memory_bytes");
    assert!(rss > f64::from(1u32 << 20), "{rss}");
    assert!(value(&m, "process_virtual_memory_bytes") > rss);
    assert!(value(&m, "process_cpu_seconds_total") >= 0.0);
    assert!(
        m.contains("# TYPE process_cpu_seconds_total counter"),
        "{m}"
    );
    let fds = value(&m, "process_open_fds");
    let actual = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .unwrap()
        .count() as f64;
    assert!(
        (fds - actual).abs() <= 8.0,
        "{fds} open fds, /proc says {actual}"
    );
    assert!(value(&m, "process_max_fds") >= fds);
    let start = value(&m, "process_start_time_seconds");
    assert!(
        (started - 5.0..=started + 60.0).contains(&start),
        "started at {start}, the test at {started}"
    );

    // OpenMetrics: one `# EOF`, at the end, after the added families.
    let (code, head, om) = get_accept(d.port, "/metrics", "application/openmetrics-text");
    assert_eq!(code, 200);
    assert!(head.contains("openmetrics-text"), "{head}");
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert_eq!(om.matches("# EOF").count(), 1, "{om}");
    assert!(om.contains("# TYPE vgpu_build info"), "{om}");
    assert!(om.contains("process_cpu_seconds_total "), "{om}");

    let (code, head, page) = get_accept(d.port, "/", "text/html");
    assert_eq!(code, 200, "{page}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/html"),
        "{head}"
    );
    for path in ["/metrics", "/healthz", "/readyz", "/findings"] {
        assert!(page.contains(&format!("href=\"{path}\"")), "{path}: {page}");
    }
    assert_eq!(get(d.port, "/nothing").map(|r| r.0), Some(404));
    d.stop();
}

/// A self-signed certificate for 127.0.0.1 and its key, as PEM files in
/// `wd` (what a TLS Secret's `tls.crt`/`tls.key` hold), and the
/// certificate as the HTTPS client's only trust anchor.
fn self_signed(wd: &Workdir) -> (PathBuf, PathBuf, rustls::pki_types::CertificateDer<'static>) {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let (cert, key) = (wd.path("tls.crt"), wd.path("tls.key"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    (cert, key, made.cert.der().clone())
}

/// A GET of `path` over TLS to 127.0.0.1:`port`, trusting only `anchor`:
/// (status, body), or the error of the first step that failed.
fn get_https(
    port: u16,
    path: &str,
    anchor: &rustls::pki_types::CertificateDer<'static>,
) -> Result<(u16, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(anchor.clone()).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("request: {e}"))?;
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        // A server closing without close_notify after a complete answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(format!("response: {e}")),
    }
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status")?;
    Ok((code, body.to_owned()))
}

/// With `--tls-cert` and `--tls-key` (a self-signed pair, as a TLS Secret
/// holds), `/metrics` is served over HTTPS to a client that verifies the
/// certificate, and a plain HTTP request on the same port gets no answer.
/// One flag without the other is refused before anything starts, saying
/// which is missing; `--help` explains both.
#[test]
fn tls_serves_metrics_over_https_and_nothing_over_plain_http() {
    let help = Command::new(dist::vgpu_bin())
        .args(["daemon", "--help"])
        .output()
        .expect("vgpu daemon --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--tls-cert <FILE>", "--tls-key <FILE>", "HTTPS", "PEM"] {
        assert!(help.contains(flag), "--help does not name {flag}: {help}");
    }

    let gpu = SimGpu::new();
    let wd = workdir();
    let (cert, key, anchor) = self_signed(&wd);
    for (given, missing) in [("--tls-cert", "--tls-key"), ("--tls-key", "--tls-cert")] {
        let file = if given == "--tls-cert" { &cert } else { &key };
        let out = wd
            .daemon_command(
                &gpu,
                &wd.path("state"),
                &wd.path("regions"),
                &format!("127.0.0.1:{}", free_port()),
                &["--no-nvml", given, file.to_str().unwrap()],
            )
            .output()
            .expect("vgpu daemon");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{given} alone: {err}");
        assert!(err.contains(missing), "{given} alone: {err}");
    }

    let port = free_port();
    let cmd = wd.daemon_command(
        &gpu,
        &wd.path("state"),
        &wd.path("regions"),
        &format!("127.0.0.1:{port}"),
        &[
            "--no-nvml",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let mut d = Running::spawn(cmd, port, wd.path("tls.log"));
    let ready = poll_until(Duration::from_secs(30), || {
        let r = get_https(port, "/readyz", &anchor);
        if r.is_err() {
            d.assert_alive();
        }
        r.ok().filter(|(code, _)| *code == 200)
    });
    assert!(ready.is_some(), "no HTTPS /readyz: {}", d.log_text());
    let (code, m) = get_https(port, "/metrics", &anchor).unwrap();
    assert_eq!(code, 200, "{m}");
    assert!(m.contains("vgpu_build_info{"), "{m}");
    assert!(
        d.log_text().contains(&format!("https://127.0.0.1:{port}")),
        "{}",
        d.log_text()
    );
    // Plain HTTP on the TLS port: the handshake fails, nothing is served.
    assert_eq!(get(port, "/metrics"), None, "plain HTTP answered");
    d.assert_alive();
    // Still serving HTTPS after the failed handshake.
    assert_eq!(get_https(port, "/healthz", &anchor).map(|r| r.0), Ok(200));
    d.stop();
}
