//! What a platform team runs into operating `vgpu daemon` (root, simulated
//! GPU, the daemon probing each test's own libcuda copy): the `--listen`
//! forms.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use vgpu_tests::daemon::{Running, Workdir};
use vgpu_tests::dist;
use vgpu_tests::http::{free_port, get_on};
use vgpu_tests::sim::SimGpu;

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
    let t = Instant::now();
    loop {
        if connect().and_then(|s| get_on(s, "/readyz")).map(|(c, _)| c) == Some(200) {
            return;
        }
        d.assert_alive();
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "not ready: {}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
