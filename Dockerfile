# flopwatch's container images, built from the repository root:
#
#   docker build -t ghcr.io/flopwatch/flopwatch:0.1.0 .
#   docker build --target agent -t ghcr.io/flopwatch/flopwatch-agent:0.1.0 .
#
# The first (the default target, `full`) has every subcommand, the
# collector's RocksDB included: the collector StatefulSet runs it
# (deploy/k8s/collector-statefulset.yaml). The second is the agent-only
# build (`agent` and `query`, no RocksDB): what the agent DaemonSet runs on
# every GPU node (deploy/k8s/agent-daemonset.yaml). Both run as the
# unprivileged user 65532; the DaemonSet runs the agent as root without
# capabilities, for the kubelet's pod-resources socket. libnvidia-ml is not
# in the image: the nvidia container runtime injects the host driver's.

ARG RUST_VERSION=1.88
ARG DEBIAN_RELEASE=bookworm

# Rust and libclang: RocksDB's bindings are generated with bindgen, and
# RocksDB itself is compiled with the image's C++ compiler.
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS toolchain
# Versions come with the Debian release the base image pins.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libclang-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .

FROM toolchain AS build-agent
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo build --release --locked -p flopwatch-cli --no-default-features --features agent \
    && install -D target/release/flopwatch /out/flopwatch

FROM toolchain AS build-full
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo build --release --locked -p flopwatch-cli \
    && install -D target/release/flopwatch /out/flopwatch

# glibc and libstdc++ for the binary, CA certificates for TLS to
# collectors and remote-write endpoints, and ldconfig, which the nvidia
# container runtime runs to make the injected libnvidia-ml loadable.
FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/flopwatch"]
CMD ["--help"]

FROM runtime AS agent
COPY --from=build-agent /out/flopwatch /usr/local/bin/flopwatch
# /metrics, /healthz, /readyz
EXPOSE 9401

FROM runtime AS full
COPY --from=build-full /out/flopwatch /usr/local/bin/flopwatch
# gRPC (TLS), plaintext gRPC health, /metrics
EXPOSE 7070 7071 9400
