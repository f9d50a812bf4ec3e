//! The eBPF programs live in the `vgpu-ebpf` binary (src/main.rs), built for
//! bpfel-unknown-none by loader/build.rs. This empty library only exists so
//! the loader can name the crate as a build-dependency, which makes cargo
//! rebuild the loader when these sources change.
#![no_std]
