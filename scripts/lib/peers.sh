# shellcheck shell=bash
# `scripts/bench --peers`: idemgate beside Powertools for AWS Lambda (TypeScript) idempotency over
# Redis, on the same workload (bench/peers_gate.cpp and bench/peers/powertools.mjs), both servers
# durable. Sourced by scripts/bench, which sets root, build_dir, quick, results and started, and
# stops both servers on exit.
# shellcheck disable=SC2154 # root, build_dir, quick, results and started come from scripts/bench

# The peer's packages, pinned: the idempotency utility, the batch utility, and the Redis client
# its CachePersistenceLayer takes (its peer dependency @redis/client ^6.2.1).
IDEMGATE_PEER_PACKAGES=(
  "@aws-lambda-powertools/idempotency@2.35.0"
  "@aws-lambda-powertools/batch@2.35.0"
  "@redis/client@6.3.1"
)

# Installs Node.js and npm from Debian when missing (Debian 12 has Node.js 18; @redis/client 6
# declares Node.js >= 20 and is checked by running it), and the peer's packages into
# $build_dir/peers-node, never into the repository. Sets peer_modules.
peers_install_node() {
  local extra=(redis-server) major spec name version installed
  command -v node >/dev/null || extra+=(nodejs)
  command -v npm >/dev/null || extra+=(npm)
  idemgate_ensure_packages "${extra[@]}"
  major=$(node -p 'process.versions.node.split(".")[0]')
  if ((major < 18)); then
    echo "node $(node --version) is too old for the peer (18 or newer)" >&2
    return 1
  fi
  ((major >= 20)) || idemgate_log "node $(node --version): @redis/client declares >= 20; trying it"
  peer_modules="$build_dir/peers-node"
  mkdir -p "$peer_modules"
  [[ -f $peer_modules/package.json ]] || echo '{ "private": true }' >"$peer_modules/package.json"
  local missing=()
  for spec in "${IDEMGATE_PEER_PACKAGES[@]}"; do
    name=${spec%@*}
    version=${spec##*@}
    installed=$(node -p "try { require('$peer_modules/node_modules/$name/package.json').version }
      catch { '' }")
    [[ $installed == "$version" ]] || missing+=("$spec")
  done
  if ((${#missing[@]} > 0)); then
    idemgate_log "installing ${missing[*]} into $peer_modules"
    local attempt
    for attempt in 1 2 3; do
      npm install --prefix "$peer_modules" --save-exact --no-audit --no-fund --no-update-notifier \
        --loglevel=error "${IDEMGATE_PEER_PACKAGES[@]}" >&2 && return 0
      ((attempt < 3)) || { echo "npm install failed three times (above)" >&2; return 1; }
      idemgate_log "npm install failed (attempt $attempt of 3); trying again in $((attempt * 10)) s"
      sleep $((attempt * 10))
    done
  fi
}

# Prints the durability settings of both servers and fails unless every write is flushed before
# it is acknowledged.
peers_check_durability() {
  local fsync sync method aof policy
  fsync=$(peers_sql -At -c 'SHOW fsync')
  sync=$(peers_sql -At -c 'SHOW synchronous_commit')
  method=$(peers_sql -At -c 'SHOW wal_sync_method')
  echo "PostgreSQL: fsync=$fsync synchronous_commit=$sync wal_sync_method=$method"
  [[ $fsync == on && $sync == on ]] || { echo "PostgreSQL is not durable" >&2; return 1; }
  aof=$(redis-cli -h 127.0.0.1 -p "${IDEMGATE_TEST_REDIS##*:}" config get appendonly | tail -n1)
  policy=$(redis-cli -h 127.0.0.1 -p "${IDEMGATE_TEST_REDIS##*:}" config get appendfsync | tail -n1)
  echo "Redis $(redis-server --version | awk '{ print $3 }' | sed 's/v=//'): appendonly=$aof appendfsync=$policy"
  [[ $aof == yes && $policy == always ]] || { echo "Redis is not durable" >&2; return 1; }
}

peers_sql() {
  "$IDEMGATE_PG_BIN/psql" -q -X -v ON_ERROR_STOP=1 "$@" "$IDEMGATE_TEST_PG"
}

# CPU seconds a server has used so far: its own, its live children's, and its exited children's
# (PostgreSQL's backends are the postmaster's children, reaped by it).
peers_server_cpu() { # pid
  local pid=$1 child ticks
  ticks=$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pid/stat")
  for child in $(ps -o pid= --ppid "$pid"); do
    ticks=$((ticks + $(awk '{ print $14 + $15 }' "/proc/$child/stat" 2>/dev/null || echo 0)))
  done
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f\n", t / hz }'
}

# Runs one side's round; its lines go to all.tsv with the round prefixed.
peers_side() { # round side
  local round=$1 side=$2 out="$results/$2-$1"
  local counts=(--events="$peer_events" --warm-up-events="$peer_warm_up" --tag="r$round")
  # Its server's CPU over the whole process (warm-up round, timed round and race).
  local server server_before
  if [[ $side == gate ]]; then
    server=$(head -n1 "$IDEMGATE_PG_DIR/data/postmaster.pid")
  else
    server=$(cat "$IDEMGATE_REDIS_DIR/redis.pid")
  fi
  server_before=$(peers_server_cpu "$server")
  if [[ $side == gate ]]; then
    "$build_dir/bench/peers_gate" --pg="$IDEMGATE_TEST_PG" "${counts[@]}" >"$out.tsv" 2>"$out.log" ||
      { cat "$out.log" >&2; return 1; }
  else
    node "$root/bench/peers/powertools.mjs" --modules="$peer_modules" --redis="$IDEMGATE_TEST_REDIS" \
      "${counts[@]}" >"$out.tsv" 2>"$out.log" || { cat "$out.log" >&2; return 1; }
  fi
  # A side effect missing or repeated is printed by the driver; it shows in the counts too.
  [[ ! -s $out.log ]] || sed "s/^/  $side round $round: /" "$out.log" >&2
  printf '%s/server\tcpu_s\t%s\n' "$side" \
    "$(awk -v a="$server_before" -v b="$(peers_server_cpu "$server")" 'BEGIN { print b - a }')" \
    >>"$out.tsv"
  awk -v round="$round" '{ print round "\t" $0 }' "$out.tsv" >>"$results/all.tsv"
}

idemgate_bench_peers() {
  if ((quick)); then
    peer_events=400 peer_warm_up=200 peer_rounds=2
  else
    peer_events=4000 peer_warm_up=3000 peer_rounds=5
  fi
  peers_install_node
  idemgate_log "building peers_gate (Release) in $build_dir"
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DIDEMGATE_BUILD_TESTS=OFF \
    -DIDEMGATE_BUILD_EXAMPLES=OFF -DIDEMGATE_BUILD_BENCH=ON >/dev/null
  cmake --build "$build_dir" -j2 --target peers_gate >/dev/null
  rm -rf "$results"
  mkdir -p "$results"
  : >"$results/all.tsv"

  idemgate_start_postgres -c fsync=on -c synchronous_commit=on
  idemgate_start_redis
  peers_check_durability | tee "$results/durability.txt"
  local pg_version node_version redis_version
  pg_version=$("$IDEMGATE_PG_BIN/postgres" --version | sed 's/.*) //')
  node_version=$(node --version)
  redis_version=$(redis-server --version | awk '{ print $3 }' | sed 's/v=//')

  # Rounds take turns, idemgate then the peer, each side a fresh process with its own untimed
  # warm-up round of every mode before the timed one.
  local round
  for ((round = 1; round <= peer_rounds; round++)); do
    idemgate_log "round $round of $peer_rounds: idemgate (at $((SECONDS - started)) s)"
    peers_side "$round" gate
    idemgate_log "round $round of $peer_rounds: the peer (at $((SECONDS - started)) s)"
    peers_side "$round" peer
  done

  local mode="full run"
  ((quick)) && mode="--quick"
  peers_report "$results/all.tsv" "$mode, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; idemgate on PostgreSQL $pg_version (fsync on, synchronous_commit on), the peer on Redis $redis_version (appendonly, appendfsync always) under Node.js $node_version; $peer_events deliveries per mode and round (3 % duplicates) after $peer_warm_up untimed ones; $peer_rounds rounds taking turns; ratios: median over rounds of the ratio within each round; figures: median over rounds; wall time $((SECONDS - started)) s"
}

# The table, the targets and the JSON line from the rounds' results; fails when a side effect of
# either side ran other than once for an event.
peers_report() { # all.tsv note
  awk -F'\t' -v rounds="$peer_rounds" -v events="$peer_events" -v warm="$peer_warm_up" \
    -v note="$2" '
    function median(list,   n, i, j, t, a) {
      n = split(list, a, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      if (n == 0) return 0
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function side(name) { return substr(name, 1, index(name, "/") - 1) }
    $3 == "events_per_s" { rate[$2] = rate[$2] " " $4; at[$2, $1] = $4 }
    $3 == "side_effects" && $2 !~ /race/ { effects[side($2)] += $4 }
    $3 == "distinct" { distinct[side($2)] += $4 }
    $3 == "cpu_s" { cpu[$2, $1] = $4 }
    $2 ~ /process$/ && $3 == "deliveries" { all[side($2), $1] = $4 }
    $3 == "business_rows" && $2 !~ /race/ { rows += $4 }
    $3 == "side_effects" && $2 ~ /race/ { race[side($2)] = race[side($2)] " " $4; if ($4 != 1) race_bad[side($2)] = 1 }
    END {
      json = "{\"mode\": \"peers\", \"rounds\": " rounds ", \"events_per_mode\": " events ", \"warm_up_events_per_mode\": " warm
      printf "%-14s %12s %12s %8s   %s\n", "mode", "idemgate/s", "peer/s", "ratio", "per round"
      split("single coalesced batch10", kinds, " ")
      for (w = 4; w <= 16; w += 12) for (k = 1; k <= 3; k++) {
        m = kinds[k] "_" w
        # The peer has no group commit: its single-event handler is what group commit is compared to.
        p = (kinds[k] == "batch10" ? "batch10" : "single") "_" w
        g = median(rate["gate/" m]); q = median(rate["peer/" p])
        # The two sides of a round ran one after the other: the ratio is taken within each round,
        # then the median over rounds, so that a drift of the machine between rounds cancels.
        list = ""
        for (r = 1; r <= rounds; r++) if (at["peer/" p, r] > 0 && at["gate/" m, r] != "")
          list = list " " at["gate/" m, r] / at["peer/" p, r]
        ratio[m] = median(list)
        n = split(list, each, " "); shown = ""
        for (i = 1; i <= n; i++) shown = shown sprintf(" %.2f", each[i])
        printf "%-14s %12.0f %12.0f %8.2f  %s\n", m, g, q, ratio[m], shown
        json = json sprintf(", \"gate_%s_events_per_s\": %.1f", m, g)
        if (kinds[k] != "coalesced") json = json sprintf(", \"peer_%s_events_per_s\": %.1f", m, q)
        json = json sprintf(", \"ratio_%s\": %.3f", m, ratio[m])
      }
      # CPU per delivery over the whole process of each side (warm-up, timed round and race): the
      # the driver itself, and its server.
      split("gate peer", sides, " ")
      for (k = 1; k <= 2; k++) for (part = 1; part <= 2; part++) {
        what = part == 1 ? "server" : "process"
        list = ""
        for (r = 1; r <= rounds; r++) if (all[sides[k], r] > 0 && (sides[k] "/" what, r) in cpu)
          list = list " " cpu[sides[k] "/" what, r] / all[sides[k], r] * 1e6
        cpu_us[sides[k], what] = median(list)
        json = json sprintf(", \"%s_%s_cpu_us_per_delivery\": %.1f", sides[k], what == "server" ? "server" : "client", cpu_us[sides[k], what])
      }
      best16 = ratio["single_16"] > ratio["coalesced_16"] ? ratio["single_16"] : ratio["coalesced_16"]
      batch = ratio["batch10_4"] < ratio["batch10_16"] ? ratio["batch10_4"] : ratio["batch10_16"]
      met1 = best16 >= 1.0 ? "true" : "false"; met2 = batch >= 2.0 ? "true" : "false"
      printf "CPU per delivery (all modes, warm-up included): idemgate %.0f us in PostgreSQL, %.0f us in its process; peer %.0f us in Redis, %.0f us in Node.js\n",
        cpu_us["gate", "server"], cpu_us["gate", "process"], cpu_us["peer", "server"], cpu_us["peer", "process"]
      printf "side effects: idemgate %d for %d distinct events (%d business rows), peer %d for %d\n",
        effects["gate"], distinct["gate"], rows, effects["peer"], distinct["peer"]
      printf "16-way race on one event id, side effects per round: idemgate%s, peer%s\n", race["gate"], race["peer"]
      printf "target: best single-event mode, 16 workers >= 1.00: %.2f %s\n", best16, met1 == "true" ? "met" : "MISSED"
      printf "target: batches of 10, 4 and 16 workers >= 2.00: %.2f %s\n", batch, met2 == "true" ? "met" : "MISSED"
      exact_gate = effects["gate"] == distinct["gate"] && rows == distinct["gate"] && !race_bad["gate"]
      exact_peer = effects["peer"] == distinct["peer"] && !race_bad["peer"]
      json = json sprintf(", \"gate_side_effects\": %d, \"gate_distinct_events\": %d, \"gate_business_rows\": %d", effects["gate"], distinct["gate"], rows)
      json = json sprintf(", \"peer_side_effects\": %d, \"peer_distinct_events\": %d", effects["peer"], distinct["peer"])
      gate_race = substr(race["gate"], 2); gsub(/ /, ", ", gate_race)
      peer_race = substr(race["peer"], 2); gsub(/ /, ", ", peer_race)
      json = json ", \"gate_race_side_effects\": [" gate_race "], \"peer_race_side_effects\": [" peer_race "]"
      json = json sprintf(", \"gate_exactly_once\": %s, \"peer_exactly_once\": %s", exact_gate ? "true" : "false", exact_peer ? "true" : "false")
      json = json sprintf(", \"target_best_single_16_ge_1\": {\"value\": %.3f, \"met\": %s}", best16, met1)
      json = json sprintf(", \"target_batch10_ge_2\": {\"value\": %.3f, \"met\": %s}", batch, met2)
      gsub(/"/, "\\\"", note)
      print json ", \"note\": \"" note "\"}"
      # Figures are only reported; a side effect missing or repeated is a failure.
      if (!exact_gate || !exact_peer) {
        print "a side effect ran other than once for an event (counts above)" > "/dev/stderr"
        exit 3
      }
    }' "$1"
}
