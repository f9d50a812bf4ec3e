//! `tests/c/admin_prog.c` driven over stdin: one command a line, one answer
//! line back. Shared by the `vgpu inspect` and admin-command suites.
#![expect(
    clippy::expect_used,
    reason = "test helpers panic on a broken setup (tests panic rather than return errors)"
)]

use std::io::Write as _;
use std::path::Path;
use std::process::Command;

use crate::hook::{HookEnv, Running};

/// A running `admin_prog` and its pid.
pub struct Prog {
    pub run: Running,
    pub pid: i32,
}

impl Prog {
    /// Started under the hook, with a context on device 0.
    pub fn start(env: &HookEnv, exe: &Path) -> Prog {
        Self::start_cmd(env.hooked(exe, &[]), true)
    }

    /// Started without the hook and without CUDA (a plain process).
    pub fn start_plain(env: &HookEnv, exe: &Path) -> Prog {
        Self::start_cmd(env.unhooked(exe, &[]), false)
    }

    /// Started from `c`; with `ctx`, it creates its context on device 0.
    pub fn start_cmd(c: Command, ctx: bool) -> Prog {
        let mut p = Prog {
            run: Running::start(c),
            pid: 0,
        };
        let pid = p.cmd("pid");
        p.pid = pid.trim_start_matches("pid ").parse().expect("pid");
        if ctx {
            assert_eq!(p.cmd("ctx"), "ctx 0");
        }
        p
    }

    /// Sends one command line; returns the answer line.
    pub fn cmd(&mut self, line: &str) -> String {
        let stdin = self.run.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write command");
        stdin.flush().expect("flush");
        self.run.line()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.run.child.try_wait(), Ok(None))
    }
}
