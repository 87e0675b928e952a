# syntax=docker/dockerfile:1
#
# Multi-stage build of Sluice's runtime images. One builder compiles every
# binary once; each final stage copies a single binary onto distroless/cc
# (glibc, libgcc, CA certificates, no shell, no package manager, no compiler)
# and runs it as the image's non-root user.
#
#   docker build --target control-plane -t sluice-cp .
#   docker build --target data-plane    -t sluice-dp .
#   docker build --target demo-upstream -t sluice-test-upstream .
#
# docker-compose.yml builds the same targets.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS builder
# aws-lc-sys (the TLS crypto provider) compiles C and wants cmake; sqlite is
# bundled by sqlx, protobuf is compiled in Rust (protox), so nothing else is needed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake make gcc g++ libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# .cargo/config.toml comes with the source: the release build compiles with
# the data plane's execution profile (data-plane/pgo/, README's "Benchmark").
# The caches keep the registry and target folder between builds; the binaries
# are copied out in the same step because a cache mount is gone afterwards.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace --bins \
    && mkdir -p /out/volume \
    && cp target/release/sluice-cp target/release/sluice-dp target/release/sluice-test-upstream /out/

# Control plane: admin REST API on 9080, snapshot sync (gRPC) on 9090.
# Configure with SLUICE_DATABASE_URL, SLUICE_ADMIN_TOKEN, SLUICE_CLUSTER_TOKEN
# and SLUICE_SECRET_KEY (see .env.example and docs/operations.md).
FROM gcr.io/distroless/cc-debian12:nonroot AS control-plane
COPY --from=builder /out/sluice-cp /usr/local/bin/sluice-cp
# Mount points of the certificate volumes (docker-compose.yml), owned by the
# runtime user so that `sluice-cp certs init` can write into fresh volumes.
COPY --from=builder --chown=65532:65532 /out/volume /certs
COPY --from=builder --chown=65532:65532 /out/volume /ca
USER 65532:65532
EXPOSE 9080 9090
ENTRYPOINT ["/usr/local/bin/sluice-cp"]
CMD ["--admin-addr", "0.0.0.0:9080", "--grpc-addr", "0.0.0.0:9090"]

# Data plane: proxy on 8080 (HTTP) and 8443 (TLS), ops (/healthz, /readyz,
# /metrics) on 9100. Stateless: needs only SLUICE_CONTROL_PLANE and
# SLUICE_CLUSTER_TOKEN. The binary is its own readiness probe, as the image
# carries no curl.
FROM gcr.io/distroless/cc-debian12:nonroot AS data-plane
COPY --from=builder /out/sluice-dp /usr/local/bin/sluice-dp
USER 65532:65532
ENV SLUICE_OPS_ADDR=0.0.0.0:9100
EXPOSE 8080 8443 9100
HEALTHCHECK --interval=5s --timeout=4s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/sluice-dp", "--check-ready"]
ENTRYPOINT ["/usr/local/bin/sluice-dp"]

# Demo upstream: an echo server that answers every request with JSON
# describing what it received.
FROM gcr.io/distroless/cc-debian12:nonroot AS demo-upstream
COPY --from=builder /out/sluice-test-upstream /usr/local/bin/sluice-test-upstream
USER 65532:65532
EXPOSE 9001
ENTRYPOINT ["/usr/local/bin/sluice-test-upstream"]
CMD ["--addr", "0.0.0.0:9001", "--name", "demo"]
