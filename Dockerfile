# Sluice container image: build in the official Rust image, run in slim Debian as a
# non-root user. Configured entirely by SLUICE_* environment variables (every config
# key is one: SLUICE_<SECTION>_<KEY>), or by a mounted config file:
#   docker run -v $PWD/config.toml:/etc/sluice/config.toml -e SLUICE_CONFIG=/etc/sluice/config.toml sluice
#
#   docker build -t sluice .                  the whole build (pulls rust and debian images)
#   scripts/image [TAG]                       podman, offline: a binary built on the host
#                                             copied into the same runtime (stage runtime-prebuilt)
#
# BASE_IMAGE names the runtime's base; scripts/image points it at a Debian bookworm it
# makes with debootstrap where debian:bookworm-slim cannot be pulled. See docs/deploy.md.
ARG BASE_IMAGE=debian:bookworm-slim

# --- build ---------------------------------------------------------------------------
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Profile `image` (Cargo.toml): release without debug info and symbols.
RUN cargo build --profile image --locked --bin sluice \
    && cp target/image/sluice /usr/local/bin/sluice

# --- runtime: everything of the image but its binary ---------------------------------
FROM ${BASE_IMAGE} AS runtime-base
# A base that has ca-certificates already (scripts/image's offline one) needs no
# package index.
RUN if ! dpkg-query -W -f '${Status}' ca-certificates 2>/dev/null | grep -q 'ok installed'; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 sluice \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin sluice

# Listen on every interface inside the container. Without SLUICE_ADMIN_TOKEN the admin
# endpoint binds to loopback only (health checks from inside still work); set it for
# probes and scrapes from outside.
ENV SLUICE_API_LISTEN=0.0.0.0:8080 \
    SLUICE_ADMIN_LISTEN=0.0.0.0:9090 \
    SLUICE_LOG_FORMAT=json
EXPOSE 8080 9090

USER 10001:10001
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["sluice", "healthcheck"]
ENTRYPOINT ["sluice"]
CMD ["run"]

# --- the runtime with a binary built on the host -------------------------------------
# `cargo build --profile image --locked --bin sluice` first; scripts/image does both
# (`--target runtime-prebuilt`). Builders skip this stage unless it is the target.
FROM runtime-base AS runtime-prebuilt
COPY target/image/sluice /usr/local/bin/sluice

# --- the runtime, built here (the default target) ------------------------------------
FROM runtime-base AS runtime
COPY --from=build /usr/local/bin/sluice /usr/local/bin/sluice
