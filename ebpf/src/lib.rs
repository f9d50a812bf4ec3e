//! eBPF programs; built for bpfel-unknown-none by loader/build.rs.
