//! What an operator gets wrong or runs in a pipe: bounded numbers, listings
//! cut short by `head`, `vgpu top` on a terminal, JSON errors under
//! `--log-format json`, and `--version`, completions and man pages that
//! match the binary. Needs the built artifacts (`cargo xtask build`).

use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use vgpu_tests::dist::{dist_dir, vgpu_bin, workspace_root};

fn vgpu(args: &[&str]) -> Output {
    Command::new(vgpu_bin())
        .args(args)
        .output()
        .expect("run vgpu")
}

/// Runs vgpu for at most 10 s. A `daemon` or `trace` is confined to a
/// library path that does not exist (never the machine's processes), a
/// loopback port of its own and a scratch state directory, so that a guard
/// that fails lets nothing loose on the machine.
fn vgpu_confined(args: &[&str]) -> Output {
    let scratch = tempfile::tempdir().unwrap();
    let lib = scratch.path().join("no-libcuda.so.1");
    let mut c = Command::new(vgpu_bin());
    c.args(args);
    if args.contains(&"daemon") || args.contains(&"trace") {
        c.arg("--libcuda").arg(&lib);
    }
    if args.contains(&"daemon") {
        c.args(["--listen", "127.0.0.1:0", "--state-dir"])
            .arg(scratch.path());
    }
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vgpu");
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{args:?} ran on (accepted): {}", text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Numbers outside sane bounds are refused by the parser (exit 2, the
/// accepted range named) before anything starts: `--interval 0` would be a
/// busy loop.
#[test]
fn numbers_out_of_bounds_are_refused_with_the_range() {
    for (args, want) in [
        (vec!["daemon", "--interval", "0"], "from 0.05 to 3600"),
        (vec!["daemon", "--interval", "NaN"], "from 0.05 to 3600"),
        (vec!["daemon", "--interval=-1"], "from 0.05 to 3600"),
        (vec!["daemon", "--rescan", "0"], "from 0.5 to 3600"),
        (vec!["daemon", "--poll-ms", "0"], "10..=10000"),
        (vec!["daemon", "--scans", "0"], "1..=1000"),
        (
            vec!["daemon", "--untracked-percent", "150"],
            "from 0 to 100",
        ),
        (vec!["daemon", "--max-procs", "0"], "1..=1048576"),
        (vec!["top", "--interval", "0"], "from 0.1 to 3600"),
        (vec!["trace", "--interval", "0"], "from 0.1 to 3600"),
        (
            vec!["suspend", "/nonexistent", "--timeout", "inf"],
            "from 0 to 3600",
        ),
    ] {
        let out = vgpu_confined(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} accepted: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A listing whose reader has gone (`vgpu inspect … | head`) ends quietly
/// with status 0, not "Broken pipe" and exit 1.
#[test]
fn a_listing_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(
        state.join("findings.json"),
        r#"{"version":1,"findings":[{"kind":"no_region","message":"pid 1"}]}"#,
    )
    .unwrap();
    let st = state.to_str().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let empty = root.to_str().unwrap();
    for args in [
        vec!["inspect", "--root", empty],
        vec!["inspect", "--root", empty, "--json"],
        vec!["findings", "--state-dir", st],
        vec!["top", "--root", empty, "--count", "1"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(vgpu_bin())
            .args(&args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{args:?}: {:?} {}",
            out.status,
            text(&out.stderr)
        );
    }
}

/// A pseudo-terminal pair: (master, slave).
fn pty() -> (OwnedFd, OwnedFd) {
    // SAFETY: plain libc calls; each returned descriptor is checked and
    // owned exactly once.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(master >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let name = libc::ptsname(master);
        assert!(!name.is_null());
        let slave = libc::open(name, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(slave >= 0, "open the pty slave");
        (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave))
    }
}

/// `vgpu top` on a terminal quits on `q` and on Ctrl-C (read as a key,
/// so the terminal is restored), exit 0; the terminal's settings are as
/// before.
#[test]
fn top_on_a_terminal_quits_on_q_and_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    for key in [b"q", b"\x03"] {
        let (master, slave) = pty();
        // SAFETY: reading the settings of a terminal this test opened.
        let before = unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            assert_eq!(libc::tcgetattr(slave.as_raw_fd(), &mut t), 0);
            t
        };
        let mut child = Command::new(vgpu_bin())
            .args(["top", "--root", dir.path().to_str().unwrap()])
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave.try_clone().unwrap()))
            .spawn()
            .unwrap();
        let mut m = std::fs::File::from(master);
        // The first frame says top is running (and has set the terminal up).
        let mut seen = Vec::new();
        let t = Instant::now();
        while !text(&seen).contains("vgpu top:") {
            let mut buf = [0u8; 4096];
            let n = m.read(&mut buf).unwrap();
            seen.extend_from_slice(&buf[..n]);
            assert!(t.elapsed() < Duration::from_secs(10), "{}", text(&seen));
        }
        std::thread::sleep(Duration::from_millis(200));
        m.write_all(key).unwrap();
        let t = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > Duration::from_secs(5) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("vgpu top did not quit on {key:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{key:?}: {status:?}");
        // SAFETY: as above.
        let after = unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            assert_eq!(libc::tcgetattr(slave.as_raw_fd(), &mut t), 0);
            t
        };
        assert_eq!(before.c_lflag, after.c_lflag, "terminal restored");
    }
}

/// Under `--log-format json` an error is one JSON line on stderr, a usage
/// error included (exit 2) and a command's error (exit 1).
#[test]
fn errors_are_json_under_log_format_json() {
    for (args, code, want) in [
        (
            vec!["--log-format", "json", "daemon", "--interval", "0"],
            2,
            "--interval",
        ),
        (vec!["daemon", "--log-format=json", "--bogus"], 2, "--bogus"),
        (
            vec!["--log-format", "json", "inspect", "/nonexistent/region"],
            1,
            "/nonexistent/region",
        ),
    ] {
        let out = vgpu_confined(&args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        let v: serde_json::Value = serde_json::from_str(err.trim())
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {err}"));
        assert_eq!(v["level"], "ERROR", "{err}");
        let msg = v["fields"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{args:?}: {msg}");
    }
    // Help is not an error: clap's text on stdout, exit 0.
    let out = vgpu(&["--log-format", "json", "--help"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("Usage:"));
}

/// `vgpu --version` names the commit it was built from, one of this
/// repository's.
#[test]
fn version_names_the_commit() {
    let out = vgpu(&["--version"]);
    assert!(out.status.success());
    let said = text(&out.stdout);
    let rest = said
        .trim()
        .strip_prefix(&format!("vgpu {} (", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("no commit: {said}"));
    let commit = rest.strip_suffix(')').unwrap();
    assert!(
        commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "{said}"
    );
    let known = Command::new("git")
        .arg("-C")
        .arg(workspace_root())
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .status()
        .unwrap();
    assert!(known.success(), "{commit} is not a commit here");
}

/// The visible subcommands, from `vgpu --help`'s "Commands:" section.
fn subcommands() -> Vec<String> {
    let help = text(&vgpu(&["--help"]).stdout);
    let list = help
        .split("Commands:\n")
        .nth(1)
        .expect("a Commands: section")
        .split("\n\n")
        .next()
        .unwrap();
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_owned)
        .collect()
}

/// Every file under `dir`, relative, with its bytes.
fn tree(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// target/dist/share holds completions and man pages that are current (the
/// built binary writes the same again) and cover every subcommand; the
/// hidden generator is not offered.
#[test]
fn completions_and_man_pages_are_present_and_current() {
    let share = dist_dir().join("share");
    let shipped = tree(&share);
    let dir = tempfile::tempdir().unwrap();
    let out = vgpu(&["generate-assets", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let fresh = tree(dir.path());
    assert_eq!(
        shipped.keys().collect::<Vec<_>>(),
        fresh.keys().collect::<Vec<_>>(),
        "the files of {} (run cargo xtask build)",
        share.display()
    );
    for (name, bytes) in &fresh {
        assert!(
            shipped[name] == *bytes,
            "{name} is stale: run cargo xtask build"
        );
    }

    let subs = subcommands();
    assert!(subs.len() >= 13, "{subs:?}");
    assert!(!subs.iter().any(|s| s == "generate-assets"), "{subs:?}");
    let file = |rel: &str| text(&fresh[rel]);
    let bash = file("bash-completion/completions/vgpu");
    let zsh = file("zsh/site-functions/_vgpu");
    let fish = file("fish/vendor_completions.d/vgpu.fish");
    let main_page = file("man/man1/vgpu.1");
    for sub in &subs {
        assert!(bash.contains(sub.as_str()), "bash lacks {sub}");
        assert!(zsh.contains(&format!("'{sub}:")), "zsh lacks {sub}");
        assert!(fish.contains(&format!("-a \"{sub}\"")), "fish lacks {sub}");
        // roff escapes the hyphens of names.
        let roff = format!("vgpu\\-{}(1)", sub.replace('-', "\\-"));
        assert!(main_page.contains(&roff), "vgpu.1 lacks {roff}");
        let page = file(&format!("man/man1/vgpu-{sub}.1"));
        assert!(
            page.starts_with(".ie") || page.contains(".TH"),
            "{sub}: {page}"
        );
    }
    // An option of a subcommand completes too.
    assert!(bash.contains("--interval") && fish.contains("-l interval"));
    for sh in ["bash", "zsh", "fish"] {
        let Ok(st) = Command::new(sh)
            .arg("-n")
            .arg(dir.path().join(match sh {
                "bash" => "bash-completion/completions/vgpu",
                "zsh" => "zsh/site-functions/_vgpu",
                _ => "fish/vendor_completions.d/vgpu.fish",
            }))
            .status()
        else {
            continue; // that shell is not installed here
        };
        assert!(st.success(), "{sh} -n rejects its completion script");
    }
    let man = Command::new("man")
        .arg("-l")
        .arg(dir.path().join("man/man1/vgpu-set-mem-limit.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output();
    if let Ok(man) = man {
        assert!(man.status.success(), "{}", text(&man.stderr));
        assert!(text(&man.stdout).contains("none"), "{}", text(&man.stdout));
    }
}

/// `vgpu --help` lists each subcommand on one line with a summary of at
/// most 80 characters (the detail is in `vgpu <command> --help`).
#[test]
fn help_summaries_are_one_line_of_at_most_80_characters() {
    let help = text(&vgpu(&["--help"]).stdout);
    let list = help
        .split("Commands:\n")
        .nth(1)
        .expect("a Commands: section")
        .split("\n\n")
        .next()
        .unwrap();
    let mut long = Vec::new();
    for line in list.lines() {
        // "  name  summary": a line that does not start with a name continues
        // the summary above it.
        let entry = line
            .strip_prefix("  ")
            .filter(|l| !l.starts_with(' '))
            .unwrap_or_else(|| panic!("a summary on more than one line: {line:?}\n{help}"));
        let summary = entry.split_once(' ').map_or("", |(_, s)| s.trim());
        if summary.chars().count() > 80 {
            long.push(entry.to_owned());
        }
    }
    assert!(long.is_empty(), "summaries over 80 characters: {long:#?}");
}

/// Neither the completions nor the man pages offer the build's hidden
/// `generate-assets`.
#[test]
fn completions_and_man_pages_do_not_offer_the_generator() {
    let dir = tempfile::tempdir().unwrap();
    let out = vgpu(&["generate-assets", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let files = tree(dir.path());
    assert!(files.len() >= 10, "{:?}", files.keys());
    for (name, bytes) in &files {
        let body = text(bytes);
        assert!(
            !name.contains("generate") && !body.contains("generate") && !body.contains("assets"),
            "{name} offers the hidden generator"
        );
    }
}

/// `vgpu findings` exits 0 when no finding is open (resolved ones are still
/// listed), 3 when one is, 1 when the state file cannot be read: the codes
/// its --help and docs/daemon.md give.
#[test]
fn findings_exit_3_only_for_an_open_finding() {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().to_str().unwrap();
    let write = |findings: &str| {
        std::fs::write(
            dir.path().join("findings.json"),
            format!(r#"{{"version":1,"updated_unix_ms":1,"findings":[{findings}]}}"#),
        )
        .unwrap();
    };
    let resolved = r#"{"kind":"limit_tampered","message":"restored","resolved_unix_ms":1}"#;
    let open = r#"{"kind":"no_region","message":"pid 1"}"#;

    write("");
    let out = vgpu(&["findings", "--state-dir", st]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    write(resolved);
    let out = vgpu(&["findings", "--state-dir", st]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "only a resolved finding: {}",
        text(&out.stdout)
    );
    assert!(text(&out.stdout).contains("[resolved"), "{out:?}");

    write(&format!("{resolved},{open}"));
    for json in [false, true] {
        let mut args = vec!["findings", "--state-dir", st];
        if json {
            args.push("--json");
        }
        let out = vgpu(&args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {out:?}");
    }

    let missing = dir.path().join("nothing");
    let out = vgpu(&["findings", "--state-dir", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");

    let help = text(&vgpu(&["findings", "--help"]).stdout);
    assert!(help.contains("Exit status"), "{help}");
}
