//! Compiles the plugin's protos (`loader/proto/`) into gRPC clients for the
//! stand-in kubelet of `tests/tests/dra_plugin.rs` (src/kubelet.rs), with
//! protox: no protoc needed.

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let files = [
        "../loader/proto/dra_v1.proto",
        "../loader/proto/pluginregistration_v1.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["../loader/proto"]).context("compiling loader/proto/")?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)
        .context("generating the gRPC clients of loader/proto/")
}
