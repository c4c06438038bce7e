//! Generates the kubelet pod-resources client (and the server half, which
//! the tests mount as a fake kubelet) with a vendored `protoc`, so building
//! the agent never asks users to install protobuf tools.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Edition 2021 build script, single-threaded: setting PROTOC is the
    // documented way to point prost-build at a protoc binary.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        .compile_protos(&["proto/kubelet/podresources/v1/api.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/kubelet/podresources/v1/api.proto");
    Ok(())
}
