# Shared by the scripts: package installation and a throwaway PostgreSQL on loopback.
# Source it; it defines functions only.

# The Debian packages a full build, test and benchmark run needs.
IDEMGATE_PACKAGES=(
  g++ cmake make pkg-config
  libssl-dev libpqxx-dev libsqlite3-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev
  postgresql postgresql-contrib
  clang libclang-rt-14-dev
  clang-16 libc++-16-dev libc++abi-16-dev
  prometheus doxygen
  spin patch
)

idemgate_log() { printf '==> %s\n' "$*" >&2; }

# Installs the missing packages when root; otherwise prints the apt-get line and fails.
idemgate_ensure_packages() {
  local missing=() pkg
  for pkg in "${IDEMGATE_PACKAGES[@]}" "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ $(id -u) -ne 0 ]]; then
    echo "Missing packages. Install them, then run this again:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    return 1
  fi
  idemgate_log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Debian's postgresql package would start a system cluster; the tests never use it.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    IDEMGATE_REMOVE_POLICY_RC=1
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ -n ${IDEMGATE_REMOVE_POLICY_RC:-} ]]; then rm -f /usr/sbin/policy-rc.d; fi
}

# The newest installed PostgreSQL server binaries.
idemgate_pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  if [[ -z $dir || ! -x $dir/initdb ]]; then
    echo "PostgreSQL server binaries not found under /usr/lib/postgresql; install 'postgresql'" >&2
    return 1
  fi
  echo "$dir"
}

# A TCP port on 127.0.0.1 that nothing listens on.
idemgate_free_port() {
  local port
  for _ in $(seq 1 200); do
    # Below the kernel's ephemeral range (32768 and up), where client sockets take their ports.
    port=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "no free port found on 127.0.0.1" >&2
  return 1
}

# Runs a command as the postgres user when root (the server refuses to run as root).
idemgate_as_pg() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# Starts a throwaway PostgreSQL in a temp dir on a free loopback port.
# Sets IDEMGATE_PG_DIR, IDEMGATE_PG_PORT and exports IDEMGATE_TEST_PG (its URI).
# Extra server settings may be passed as arguments ("-c name=value" pairs).
idemgate_start_postgres() {
  local bin
  bin=$(idemgate_pg_bin)
  IDEMGATE_PG_DIR=$(mktemp -d /tmp/idemgate-pg.XXXXXX)
  chmod 755 "$IDEMGATE_PG_DIR"
  if [[ $(id -u) -eq 0 ]]; then chown postgres:postgres "$IDEMGATE_PG_DIR"; fi
  idemgate_as_pg "$bin/initdb" -D "$IDEMGATE_PG_DIR/data" -U postgres -A trust -E UTF8 \
    --no-sync >"$IDEMGATE_PG_DIR/initdb.log" 2>&1 || {
    cat "$IDEMGATE_PG_DIR/initdb.log" >&2
    return 1
  }
  # A port that looked free can be taken before the server binds it: try another one.
  local try
  for try in 1 2 3 4 5; do
    IDEMGATE_PG_PORT=$(idemgate_free_port)
    if idemgate_as_pg "$bin/pg_ctl" -D "$IDEMGATE_PG_DIR/data" -l "$IDEMGATE_PG_DIR/server.log" \
      -w -t 60 -o "-p $IDEMGATE_PG_PORT -k $IDEMGATE_PG_DIR -c listen_addresses=127.0.0.1 \
-c max_connections=300 -c shared_preload_libraries=pg_stat_statements $*" start >/dev/null; then
      break
    fi
    if [[ $try -eq 5 ]]; then
      cat "$IDEMGATE_PG_DIR/server.log" >&2
      return 1
    fi
  done
  export IDEMGATE_TEST_PG="postgresql://postgres@127.0.0.1:$IDEMGATE_PG_PORT/postgres"
  export IDEMGATE_PG_BIN="$bin"
  idemgate_log "PostgreSQL on 127.0.0.1:$IDEMGATE_PG_PORT (data in $IDEMGATE_PG_DIR)"
}

# Stops the server started by idemgate_start_postgres and removes its files.
idemgate_stop_postgres() {
  [[ -n ${IDEMGATE_PG_DIR:-} && -d $IDEMGATE_PG_DIR ]] || return 0
  idemgate_as_pg "$(idemgate_pg_bin)/pg_ctl" -D "$IDEMGATE_PG_DIR/data" -m immediate -w stop \
    >/dev/null 2>&1 || true
  rm -rf "$IDEMGATE_PG_DIR"
  IDEMGATE_PG_DIR=
}
