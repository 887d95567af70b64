# Shared by the scripts: package installation and a throwaway PostgreSQL on loopback.
# Source it; it defines functions only.

# The Debian packages a full build, test and benchmark run needs.
IDEMGATE_PACKAGES=(
  g++ cmake make pkg-config
  libssl-dev libpqxx-dev libsqlite3-dev libcpp-httplib-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev
  postgresql postgresql-contrib pgbouncer
  clang libclang-rt-14-dev
  clang-16 libc++-16-dev libc++abi-16-dev
  prometheus prometheus-cpp-dev doxygen
  spin patch
  rabbitmq-server librabbitmq-dev
  chromium chromium-driver python3-selenium
  curl python3-requests libboost-dev
  redis-server libhiredis-dev
  nats-server libnats-dev
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
  # Debian's postgresql, rabbitmq-server and redis-server packages would start system services;
  # the tests never use them.
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
# Extra server settings may be passed as arguments ("-c name=value" pairs). Environment
# variables for the server only ("NAME=value" words, e.g. an LD_PRELOAD) may be set in the array
# IDEMGATE_PG_SERVER_ENV; the caller's own environment stays as it is.
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
    if idemgate_as_pg env "${IDEMGATE_PG_SERVER_ENV[@]}" "$bin/pg_ctl" -D "$IDEMGATE_PG_DIR/data" \
      -l "$IDEMGATE_PG_DIR/server.log" -w -t 60 -o "-p $IDEMGATE_PG_PORT -k $IDEMGATE_PG_DIR -c listen_addresses=127.0.0.1 \
-c max_connections=300 -c max_prepared_transactions=8 -c shared_preload_libraries=pg_stat_statements $*" start >/dev/null; then
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

# Starts PgBouncer in transaction pooling mode on a free loopback port, in front of the server
# of idemgate_start_postgres (call that first). Every database name goes to the same database on
# that server (pool of 20 server connections per database); two more, idemgate_pool1 and
# idemgate_pool2, go to its database "postgres" over pools of exactly one and two server
# connections, for tests that need to know which connection a transaction gets; and
# idemgate_session goes there in pool_mode = session, for comparisons (bench_pooling). Config, auth
# file, pid file and log live in a temp dir; it runs as postgres when root (it refuses root).
# Sets IDEMGATE_PGBOUNCER_DIR and exports IDEMGATE_TEST_PGBOUNCER (its URI, database postgres).
idemgate_start_pgbouncer() {
  if [[ -z ${IDEMGATE_PG_PORT:-} ]]; then
    echo "idemgate_start_pgbouncer: start PostgreSQL first (idemgate_start_postgres)" >&2
    return 1
  fi
  if ! command -v pgbouncer >/dev/null && [[ ! -x /usr/sbin/pgbouncer ]]; then
    echo "pgbouncer not found; install the Debian package pgbouncer" >&2
    return 1
  fi
  local exe dir port try
  exe=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  dir=$(mktemp -d /tmp/idemgate-pgbouncer.XXXXXX)
  IDEMGATE_PGBOUNCER_DIR=$dir
  chmod 755 "$dir"
  printf '"postgres" ""\n' >"$dir/users.txt"
  for try in 1 2 3 4 5; do
    port=$(idemgate_free_port)
    local server="host=127.0.0.1 port=$IDEMGATE_PG_PORT"
    cat >"$dir/pgbouncer.ini" <<INI
[databases]
idemgate_pool1 = $server dbname=postgres pool_size=1
idemgate_pool2 = $server dbname=postgres pool_size=2
idemgate_session = $server dbname=postgres pool_mode=session
* = $server
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir = $dir
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
server_round_robin = 0
server_check_delay = 3600
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    if [[ $(id -u) -eq 0 ]]; then chown -R postgres:postgres "$dir"; fi
    if idemgate_as_pg "$exe" -d -q "$dir/pgbouncer.ini" 2>>"$dir/start.log"; then
      for _ in $(seq 1 100); do
        # Its own process listens (not another one that took the port meanwhile).
        if [[ -s $dir/pgbouncer.pid ]] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null &&
          (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
          export IDEMGATE_TEST_PGBOUNCER="postgresql://postgres@127.0.0.1:$port/postgres"
          idemgate_log "PgBouncer (transaction pooling) on 127.0.0.1:$port (files in $dir)"
          return 0
        fi
        sleep 0.05
      done
    fi
    idemgate_stop_pgbouncer_process
  done
  cat "$dir/start.log" "$dir/pgbouncer.log" >&2 2>/dev/null
  return 1
}

# Ends the PgBouncer process of idemgate_start_pgbouncer, if one runs (its pid file's).
idemgate_stop_pgbouncer_process() {
  local pidfile="$IDEMGATE_PGBOUNCER_DIR/pgbouncer.pid" pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if [[ -n $pid ]] && kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
  fi
  rm -f "$pidfile"
}

# Stops the PgBouncer of idemgate_start_pgbouncer and removes its files.
idemgate_stop_pgbouncer() {
  [[ -n ${IDEMGATE_PGBOUNCER_DIR:-} && -d $IDEMGATE_PGBOUNCER_DIR ]] || return 0
  idemgate_stop_pgbouncer_process
  rm -rf "$IDEMGATE_PGBOUNCER_DIR"
  IDEMGATE_PGBOUNCER_DIR=
}

# Starts a throwaway RabbitMQ node on loopback: its own node name, AMQP port, Erlang distribution
# port and epmd port, and every file (database, logs, cookie) in a temp dir. Never a system
# service. Sets IDEMGATE_RABBIT_DIR, IDEMGATE_RABBIT_NODE, IDEMGATE_RABBIT_EPMD_PORT and exports
# IDEMGATE_TEST_AMQP ("127.0.0.1:<port>"), which the RabbitMQ tests and scripts/chaos read, and
# IDEMGATE_TEST_AMQP_RESTART: a script that stops the node and starts it again on the same port
# and files (what was durable comes back), for the tests that restart the broker.
idemgate_start_rabbitmq() {
  local server=/usr/lib/rabbitmq/bin/rabbitmq-server ctl=/usr/lib/rabbitmq/bin/rabbitmqctl
  if [[ ! -x $server ]]; then
    echo "rabbitmq-server not found under /usr/lib/rabbitmq/bin; install 'rabbitmq-server'" >&2
    return 1
  fi
  IDEMGATE_RABBIT_DIR=$(mktemp -d /tmp/idemgate-rabbit.XXXXXX)
  chmod 700 "$IDEMGATE_RABBIT_DIR"
  IDEMGATE_RABBIT_NODE="idemgate-$$-$RANDOM@localhost"
  local port dist epmd
  port=$(idemgate_free_port)
  dist=$(idemgate_free_port)
  epmd=$(idemgate_free_port)
  IDEMGATE_RABBIT_EPMD_PORT=$epmd
  printf '[].\n' >"$IDEMGATE_RABBIT_DIR/enabled_plugins"
  printf 'loopback_users.guest = true\nlisteners.tcp.default = 127.0.0.1:%s\n' "$port" \
    >"$IDEMGATE_RABBIT_DIR/rabbitmq.conf"
  # The node's environment, shared by the server and rabbitmqctl (which must find the same
  # cookie in HOME and the same epmd).
  IDEMGATE_RABBIT_ENV=(
    HOME="$IDEMGATE_RABBIT_DIR"
    RABBITMQ_NODENAME="$IDEMGATE_RABBIT_NODE"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    RABBITMQ_NODE_PORT="$port"
    RABBITMQ_DIST_PORT="$dist"
    ERL_EPMD_PORT="$epmd"
    ERL_EPMD_ADDRESS=127.0.0.1
    RABBITMQ_MNESIA_BASE="$IDEMGATE_RABBIT_DIR/mnesia"
    RABBITMQ_LOG_BASE="$IDEMGATE_RABBIT_DIR/log"
    RABBITMQ_PID_FILE="$IDEMGATE_RABBIT_DIR/rabbit.pid"
    RABBITMQ_CONFIG_FILE="$IDEMGATE_RABBIT_DIR/rabbitmq.conf"
    RABBITMQ_ADVANCED_CONFIG_FILE="$IDEMGATE_RABBIT_DIR/advanced.config"
    RABBITMQ_ENABLED_PLUGINS_FILE="$IDEMGATE_RABBIT_DIR/enabled_plugins"
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  )
  # The node's start (and, for the restart script, its stop first): the server in its own
  # session, then await_startup, which fails at once while the node is not yet registered, asked
  # again until it answers (at most 120 s).
  {
    printf '#!/usr/bin/env bash\n# Restarts the throwaway RabbitMQ node of idemgate_start_rabbitmq.\n'
    printf 'cd %q || exit 1\n' "$IDEMGATE_RABBIT_DIR"
    printf 'if [[ ${1:-} == --restart ]]; then\n'
    printf '  env %s timeout 60 %q -n %q stop %q >/dev/null 2>&1 || exit 1\n' \
      "$(printf '%q ' "${IDEMGATE_RABBIT_ENV[@]}")" "$ctl" "$IDEMGATE_RABBIT_NODE" \
      "$IDEMGATE_RABBIT_DIR/rabbit.pid"
    printf 'fi\n'
    printf '(exec setsid env %s %q >>server.out 2>&1 </dev/null) &\n' \
      "$(printf '%q ' "${IDEMGATE_RABBIT_ENV[@]}")" "$server"
    printf 'for _ in $(seq 1 120); do\n'
    printf '  env %s %q -n %q await_startup >/dev/null 2>&1 && exit 0\n' \
      "$(printf '%q ' "${IDEMGATE_RABBIT_ENV[@]}")" "$ctl" "$IDEMGATE_RABBIT_NODE"
    printf '  sleep 1\ndone\nexit 1\n'
  } >"$IDEMGATE_RABBIT_DIR/start"
  chmod 700 "$IDEMGATE_RABBIT_DIR/start"
  printf '#!/bin/sh\nexec %q --restart\n' "$IDEMGATE_RABBIT_DIR/start" >"$IDEMGATE_RABBIT_DIR/restart"
  chmod 700 "$IDEMGATE_RABBIT_DIR/restart"
  local started=$SECONDS up=
  if "$IDEMGATE_RABBIT_DIR/start"; then up=1; fi
  if [[ -z $up ]]; then
    echo "RabbitMQ did not start; its output:" >&2
    cat "$IDEMGATE_RABBIT_DIR/server.out" >&2
    idemgate_stop_rabbitmq
    return 1
  fi
  export IDEMGATE_TEST_AMQP="127.0.0.1:$port"
  export IDEMGATE_TEST_AMQP_RESTART="$IDEMGATE_RABBIT_DIR/restart"
  idemgate_log "RabbitMQ on $IDEMGATE_TEST_AMQP (node $IDEMGATE_RABBIT_NODE, started in" \
    "$((SECONDS - started)) s, files in $IDEMGATE_RABBIT_DIR)"
}

# Stops the node started by idemgate_start_rabbitmq and its epmd, and removes its files.
idemgate_stop_rabbitmq() {
  [[ -n ${IDEMGATE_RABBIT_DIR:-} && -d $IDEMGATE_RABBIT_DIR ]] || return 0
  env "${IDEMGATE_RABBIT_ENV[@]}" timeout 60 /usr/lib/rabbitmq/bin/rabbitmqctl \
    -n "$IDEMGATE_RABBIT_NODE" stop "$IDEMGATE_RABBIT_DIR/rabbit.pid" >/dev/null 2>&1 || {
    local pid
    pid=$(cat "$IDEMGATE_RABBIT_DIR/rabbit.pid" 2>/dev/null) && kill -9 "$pid" 2>/dev/null
  }
  # The node's own epmd outlives it; it listens only on its own port.
  env "${IDEMGATE_RABBIT_ENV[@]}" epmd -port "$IDEMGATE_RABBIT_EPMD_PORT" -kill \
    >/dev/null 2>&1 || true
  rm -rf "$IDEMGATE_RABBIT_DIR"
  IDEMGATE_RABBIT_DIR=
  unset IDEMGATE_TEST_AMQP IDEMGATE_TEST_AMQP_RESTART
}

# Starts a throwaway Redis on a free loopback port, every file (config, append-only log, pid,
# log) in a temp dir. Never a system service. The append-only file is written with
# `appendfsync always`, so a restart (the tests restart it) loses nothing that was acknowledged.
# Sets IDEMGATE_REDIS_DIR and exports IDEMGATE_TEST_REDIS ("127.0.0.1:<port>"), which the Redis
# Streams tests read, and IDEMGATE_TEST_REDIS_RESTART: a script that shuts the server down
# (SHUTDOWN, after a last fsync) and starts it again on the same port and files.
idemgate_start_redis() {
  local server redis_cli
  server=$(command -v redis-server || true)
  redis_cli=$(command -v redis-cli || true)
  if [[ -z $server || -z $redis_cli ]]; then
    echo "redis-server or redis-cli not found; install 'redis-server'" >&2
    return 1
  fi
  IDEMGATE_REDIS_DIR=$(mktemp -d /tmp/idemgate-redis.XXXXXX)
  chmod 700 "$IDEMGATE_REDIS_DIR"
  local try port
  for try in 1 2 3 4 5; do
    port=$(idemgate_free_port)
    cat >"$IDEMGATE_REDIS_DIR/redis.conf" <<CONF
bind 127.0.0.1
port $port
dir $IDEMGATE_REDIS_DIR
daemonize yes
pidfile $IDEMGATE_REDIS_DIR/redis.pid
logfile $IDEMGATE_REDIS_DIR/redis.log
appendonly yes
appendfsync always
save ""
CONF
    {
      printf '#!/bin/sh\n# Restarts the throwaway Redis of idemgate_start_redis.\n'
      printf '%q -h 127.0.0.1 -p %s shutdown >/dev/null 2>&1\n' "$redis_cli" "$port"
      printf 'while [ -s %q ] && kill -0 "$(cat %q)" 2>/dev/null; do sleep 0.05; done\n' \
        "$IDEMGATE_REDIS_DIR/redis.pid" "$IDEMGATE_REDIS_DIR/redis.pid"
      printf '%q %q || exit 1\n' "$server" "$IDEMGATE_REDIS_DIR/redis.conf"
      printf 'for _ in $(seq 1 200); do\n'
      printf '  [ "$(%q -h 127.0.0.1 -p %s ping 2>/dev/null)" = PONG ] && exit 0\n' \
        "$redis_cli" "$port"
      printf '  sleep 0.05\ndone\nexit 1\n'
    } >"$IDEMGATE_REDIS_DIR/restart"
    chmod 700 "$IDEMGATE_REDIS_DIR/restart"
    if "$server" "$IDEMGATE_REDIS_DIR/redis.conf" >/dev/null 2>&1; then
      for _ in $(seq 1 200); do
        if [[ $("$redis_cli" -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; then
          export IDEMGATE_TEST_REDIS="127.0.0.1:$port"
          export IDEMGATE_TEST_REDIS_RESTART="$IDEMGATE_REDIS_DIR/restart"
          idemgate_log "Redis on $IDEMGATE_TEST_REDIS (files in $IDEMGATE_REDIS_DIR)"
          return 0
        fi
        sleep 0.05
      done
    fi
    idemgate_stop_redis_process
  done
  cat "$IDEMGATE_REDIS_DIR/redis.log" >&2 2>/dev/null
  idemgate_stop_redis
  return 1
}

# Ends the process named by PIDFILE, if one runs: SIGTERM, up to SECONDS for it to exit, then
# SIGKILL; removes the pid file.
idemgate_stop_pidfile() {
  local pidfile=$1 seconds=$2 pid
  [[ -s $pidfile ]] || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  if [[ -n $pid ]] && kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 $((seconds * 20))); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

# Ends the server of idemgate_start_redis, if one runs (its pid file's).
idemgate_stop_redis_process() { idemgate_stop_pidfile "$IDEMGATE_REDIS_DIR/redis.pid" 5; }

# Stops the Redis of idemgate_start_redis and removes its files.
idemgate_stop_redis() {
  [[ -n ${IDEMGATE_REDIS_DIR:-} && -d $IDEMGATE_REDIS_DIR ]] || return 0
  idemgate_stop_redis_process
  rm -rf "$IDEMGATE_REDIS_DIR"
  IDEMGATE_REDIS_DIR=
  unset IDEMGATE_TEST_REDIS IDEMGATE_TEST_REDIS_RESTART
}

# Starts a throwaway NATS server with JetStream on loopback: its own client port, its JetStream
# store and every other file (config, pid file, log) in a temp dir. Never a system service.
# Sets IDEMGATE_NATS_DIR and exports IDEMGATE_TEST_NATS ("nats://127.0.0.1:<port>") and
# IDEMGATE_TEST_NATS_CONFIG (its config file, which names its pid file and store: the NATS
# consumer's tests restart the server from it, its JetStream store kept).
idemgate_start_nats() {
  local server
  server=$(command -v nats-server || echo /usr/bin/nats-server)
  if [[ ! -x $server ]]; then
    echo "nats-server not found; install the Debian package nats-server" >&2
    return 1
  fi
  IDEMGATE_NATS_DIR=$(mktemp -d /tmp/idemgate-nats.XXXXXX)
  chmod 700 "$IDEMGATE_NATS_DIR"
  local dir=$IDEMGATE_NATS_DIR port try
  for try in 1 2 3 4 5; do
    port=$(idemgate_free_port)
    cat >"$dir/nats.conf" <<CONF
server_name: idemgate-test
listen: 127.0.0.1:$port
pid_file: "$dir/nats.pid"
log_file: "$dir/nats.log"
jetstream {
  store_dir: "$dir/jetstream"
  max_memory_store: 256MB
  max_file_store: 2GB
}
CONF
    (cd "$dir" && exec setsid "$server" -c "$dir/nats.conf" >>"$dir/server.out" 2>&1 </dev/null) &
    for _ in $(seq 1 100); do
      # Its own process listens (not another one that took the port meanwhile).
      if [[ -s $dir/nats.pid ]] && kill -0 "$(cat "$dir/nats.pid")" 2>/dev/null &&
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        export IDEMGATE_TEST_NATS="nats://127.0.0.1:$port"
        export IDEMGATE_TEST_NATS_CONFIG="$dir/nats.conf"
        idemgate_log "NATS with JetStream on 127.0.0.1:$port (files in $dir)"
        return 0
      fi
      sleep 0.05
    done
    idemgate_stop_nats_process
  done
  echo "nats-server did not start; its output:" >&2
  cat "$dir/server.out" "$dir/nats.log" >&2 2>/dev/null
  idemgate_stop_nats
  return 1
}

# Ends the server of idemgate_start_nats, if one runs (its pid file's), and waits for it.
idemgate_stop_nats_process() { idemgate_stop_pidfile "$IDEMGATE_NATS_DIR/nats.pid" 10; }

# Stops the server started by idemgate_start_nats and removes its files.
idemgate_stop_nats() {
  [[ -n ${IDEMGATE_NATS_DIR:-} && -d $IDEMGATE_NATS_DIR ]] || return 0
  idemgate_stop_nats_process
  rm -rf "$IDEMGATE_NATS_DIR"
  IDEMGATE_NATS_DIR=
  unset IDEMGATE_TEST_NATS IDEMGATE_TEST_NATS_CONFIG
}
