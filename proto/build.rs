//! Generates the `flopwatch.v1` Rust code with a vendored `protoc`, so
//! building flopwatch never asks users to install protobuf tools.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Edition 2021 build script, single-threaded: setting PROTOC is the
    // documented way to point prost-build at a protoc binary.
    std::env::set_var("PROTOC", protoc);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("flopwatch_v1_descriptor.bin"))
        .compile_protos(&["flopwatch/v1/flopwatch.proto"], &["."])?;
    println!("cargo:rerun-if-changed=flopwatch/v1/flopwatch.proto");
    Ok(())
}
