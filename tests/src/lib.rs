//! Helpers for vgpu's integration tests.
//!
//! The tests run against built artifacts (`cargo xtask build` puts them in
//! `target/dist/`): the hook, the loader and the simulated GPU driver.
//! `cargo xtask test` builds them first, then runs these tests as root.

pub mod aarch64;
pub mod admin_prog;
pub mod apiserver;
pub mod container;
pub mod daemon;
pub mod dist;
pub mod hook;
pub mod host;
pub mod http;
pub mod kubelet;
pub mod kubepod;
pub mod manifests;
pub mod planned;
pub mod sim;
pub mod wait;
