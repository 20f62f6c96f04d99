# Sluice container image: build in the official Rust image, run in slim Debian as a
# non-root user. Configured entirely by SLUICE_* environment variables (every config
# key is one: SLUICE_<SECTION>_<KEY>), or by a mounted config file:
#   docker run -v $PWD/config.toml:/etc/sluice/config.toml -e SLUICE_CONFIG=/etc/sluice/config.toml sluice
# See docs/deploy.md.

# --- build ---------------------------------------------------------------------------
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin sluice \
    && cp target/release/sluice /usr/local/bin/sluice

# --- run -----------------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin sluice
COPY --from=build /usr/local/bin/sluice /usr/local/bin/sluice

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
