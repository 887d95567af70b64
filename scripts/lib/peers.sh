# shellcheck shell=bash
# `scripts/bench --peers`: idemgate beside Powertools for AWS Lambda (TypeScript) idempotency over
# Redis, on the same workload (bench/peers_gate.cpp and bench/peers/powertools.mjs), every server
# durable. Two peers: the fair one writes the business row idemgate writes, into the same
# PostgreSQL (node-postgres, autocommit); the effect-only one counts its side effect in memory. Sourced by scripts/bench, which sets root, build_dir, quick, results and started, and
# stops both servers on exit.
# shellcheck disable=SC2154 # root, build_dir, quick, results and started come from scripts/bench

# The peer's packages, pinned: the idempotency utility, the batch utility, the Redis client its
# CachePersistenceLayer takes (its peer dependency @redis/client ^6.2.1), and node-postgres for
# the fair peer's business write.
IDEMGATE_PEER_PACKAGES=(
  "@aws-lambda-powertools/idempotency@2.35.0"
  "@aws-lambda-powertools/batch@2.35.0"
  "@redis/client@6.3.1"
  "pg@8.13.1"
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

# Runs one side's round (gate, fair or peer); its lines go to all.tsv with the round prefixed.
peers_side() { # round side
  local round=$1 side=$2 out="$results/$2-$1"
  # A tag of its own per side and round: the peers share one Redis, where a record of the other
  # peer's would answer an event as a duplicate.
  local counts=(--events="$peer_events" --warm-up-events="$peer_warm_up" --tag="$side-r$round")
  # Its servers' CPU over the whole process (warm-up round, timed round and race).
  local pg redis pg_before redis_before
  pg=$(head -n1 "$IDEMGATE_PG_DIR/data/postmaster.pid")
  redis=$(cat "$IDEMGATE_REDIS_DIR/redis.pid")
  pg_before=$(peers_server_cpu "$pg")
  redis_before=$(peers_server_cpu "$redis")
  case $side in
    gate)
      "$build_dir/bench/peers_gate" --pg="$IDEMGATE_TEST_PG" "${counts[@]}" >"$out.tsv" 2>"$out.log" ||
        { cat "$out.log" >&2; return 1; } ;;
    fair)
      node "$root/bench/peers/powertools.mjs" --modules="$peer_modules" --redis="$IDEMGATE_TEST_REDIS" \
        --business="$IDEMGATE_TEST_PG" --side=fair "${counts[@]}" >"$out.tsv" 2>"$out.log" ||
        { cat "$out.log" >&2; return 1; } ;;
    peer)
      node "$root/bench/peers/powertools.mjs" --modules="$peer_modules" --redis="$IDEMGATE_TEST_REDIS" \
        --side=peer "${counts[@]}" >"$out.tsv" 2>"$out.log" || { cat "$out.log" >&2; return 1; } ;;
  esac
  # A side effect missing or repeated is printed by the driver; it shows in the counts too.
  [[ ! -s $out.log ]] || sed "s/^/  $side round $round: /" "$out.log" >&2
  # Each server's CPU, charged to the side that uses it (idemgate: PostgreSQL; the fair peer:
  # both; the effect-only peer: Redis).
  local used
  if [[ $side != peer ]]; then
    used=$(awk -v a="$pg_before" -v b="$(peers_server_cpu "$pg")" 'BEGIN { print b - a }')
    printf '%s/postgresql\tcpu_s\t%s\n' "$side" "$used" >>"$out.tsv"
  fi
  if [[ $side != gate ]]; then
    used=$(awk -v a="$redis_before" -v b="$(peers_server_cpu "$redis")" 'BEGIN { print b - a }')
    printf '%s/redis\tcpu_s\t%s\n' "$side" "$used" >>"$out.tsv"
  fi
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

  # Rounds take turns, idemgate, the fair peer, the effect-only peer, each side a fresh process
  # with its own untimed warm-up round of every mode before the timed one.
  local round
  for ((round = 1; round <= peer_rounds; round++)); do
    idemgate_log "round $round of $peer_rounds: idemgate (at $((SECONDS - started)) s)"
    peers_side "$round" gate
    idemgate_log "round $round of $peer_rounds: the fair peer (at $((SECONDS - started)) s)"
    peers_side "$round" fair
    idemgate_log "round $round of $peer_rounds: the effect-only peer (at $((SECONDS - started)) s)"
    peers_side "$round" peer
  done

  local mode="full run"
  ((quick)) && mode="--quick"
  peers_report "$results/all.tsv" "$mode, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; idemgate on PostgreSQL $pg_version (fsync on, synchronous_commit on), the peers on Redis $redis_version (appendonly, appendfsync always) under Node.js $node_version, the fair one writing its business rows into the same PostgreSQL; $peer_events deliveries per mode and round (3 % duplicates) after $peer_warm_up untimed ones; $peer_rounds rounds taking turns; ratios: median over rounds of the ratio within each round; figures: median over rounds; wall time $((SECONDS - started)) s"
}

# The table, the targets and the JSON line from the rounds' results; fails when a side effect or
# a business row of any side ran other than once for an event.
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
    # The ratio of the gate in mode m to side s in mode p, taken within each round (the sides of a
    # round ran one after the other, so a drift of the machine between rounds cancels), then the
    # median over rounds; `shown` gets the rounds ratios.
    function ratio_to(s, m, p,   list, r, n, i, each) {
      list = ""
      for (r = 1; r <= rounds; r++) if (at[s "/" p, r] > 0 && at["gate/" m, r] != "")
        list = list " " at["gate/" m, r] / at[s "/" p, r]
      n = split(list, each, " "); shown = ""
      for (i = 1; i <= n; i++) shown = shown sprintf(" %.2f", each[i])
      return median(list)
    }
    $3 == "events_per_s" { rate[$2] = rate[$2] " " $4; at[$2, $1] = $4 }
    $3 == "side_effects" && $2 !~ /race/ { effects[side($2)] += $4 }
    $3 == "distinct" { distinct[side($2)] += $4 }
    $3 == "cpu_s" { cpu[$2, $1] = $4 }
    $2 ~ /process$/ && $3 == "deliveries" { all[side($2), $1] = $4 }
    $3 == "business_rows" && $2 !~ /race/ { rows[side($2)] += $4 }
    $3 == "side_effects" && $2 ~ /race/ { race[side($2)] = race[side($2)] " " $4; if ($4 != 1) race_bad[side($2)] = 1 }
    $3 == "business_rows" && $2 ~ /race/ { if ($4 != 1) race_bad[side($2)] = 1 }
    END {
      json = "{\"mode\": \"peers\", \"rounds\": " rounds ", \"events_per_mode\": " events ", \"warm_up_events_per_mode\": " warm
      printf "%-14s %11s %11s %7s %11s %7s   %s\n", "mode", "idemgate/s", "fair/s", "ratio", "effect/s", "ratio", "per round (to the fair peer)"
      split("single coalesced batch10 once", kinds, " ")
      for (w = 4; w <= 16; w += 12) for (k = 1; k <= 4; k++) {
        m = kinds[k] "_" w
        # The peers have no group commit: their single-event handler is what group commit is
        # compared to.
        p = (kinds[k] == "batch10" ? "batch10" : "single") "_" w
        g = median(rate["gate/" m]); f = median(rate["fair/" p]); q = median(rate["peer/" p])
        to_effect[m] = ratio_to("peer", m, p)
        to_fair[m] = ratio_to("fair", m, p)
        printf "%-14s %11.0f %11.0f %7.2f %11.0f %7.2f  %s\n", m, g, f, to_fair[m], q, to_effect[m], shown
        json = json sprintf(", \"gate_%s_events_per_s\": %.1f", m, g)
        if (kinds[k] == "single" || kinds[k] == "batch10")
          json = json sprintf(", \"fair_%s_events_per_s\": %.1f, \"peer_%s_events_per_s\": %.1f", m, f, m, q)
        json = json sprintf(", \"ratio_fair_%s\": %.3f, \"ratio_%s\": %.3f", m, to_fair[m], m, to_effect[m])
      }
      # CPU per delivery over the whole process of each side (warm-up, timed round and race):
      # each server it uses, and its own process.
      split("gate/postgresql gate/process fair/postgresql fair/redis fair/process peer/redis peer/process", parts, " ")
      for (k = 1; k <= 7; k++) {
        list = ""
        for (r = 1; r <= rounds; r++) if (all[side(parts[k]), r] > 0 && (parts[k], r) in cpu)
          list = list " " cpu[parts[k], r] / all[side(parts[k]), r] * 1e6
        us[parts[k]] = median(list)
        name = parts[k]; sub("/", "_", name)
        json = json sprintf(", \"%s_cpu_us_per_delivery\": %.1f", name, us[parts[k]])
      }
      printf "CPU per delivery (all modes, warm-up included): idemgate %.0f us in PostgreSQL + %.0f us in its process; fair peer %.0f us in PostgreSQL + %.0f us in Redis + %.0f us in Node.js; effect-only peer %.0f us in Redis + %.0f us in Node.js\n",
        us["gate/postgresql"], us["gate/process"], us["fair/postgresql"], us["fair/redis"], us["fair/process"], us["peer/redis"], us["peer/process"]
      printf "side effects: idemgate %d for %d distinct events (%d business rows), fair peer %d (%d business rows), effect-only peer %d for %d\n",
        effects["gate"], distinct["gate"], rows["gate"], effects["fair"], rows["fair"], effects["peer"], distinct["peer"]
      printf "16-way race on one event id, side effects per round: idemgate%s, fair peer%s, effect-only peer%s\n", race["gate"], race["fair"], race["peer"]
      best4 = to_fair["single_4"] > to_fair["coalesced_4"] ? to_fair["single_4"] : to_fair["coalesced_4"]
      best16 = to_fair["single_16"] > to_fair["coalesced_16"] ? to_fair["single_16"] : to_fair["coalesced_16"]
      batch = to_fair["batch10_4"] < to_fair["batch10_16"] ? to_fair["batch10_4"] : to_fair["batch10_16"]
      met4 = best4 >= 1.5 ? "true" : "false"; met16 = best16 >= 1.5 ? "true" : "false"
      metb = batch >= 2.5 ? "true" : "false"
      once16 = to_fair["once_16"]; meto = once16 >= 2.0 ? "true" : "false"
      printf "target: single events beside the fair peer, 4 workers >= 1.50: %.2f %s\n", best4, met4 == "true" ? "met" : "MISSED"
      printf "target: single events beside the fair peer, 16 workers >= 1.50: %.2f %s\n", best16, met16 == "true" ? "met" : "MISSED"
      printf "target: batches of 10 beside the fair peer, 4 and 16 workers >= 2.50: %.2f %s\n", batch, metb == "true" ? "met" : "MISSED"
      printf "target: one transaction beside the fair peer, 16 workers >= 2.00: %.2f %s\n", once16, meto == "true" ? "met" : "MISSED"
      exact_gate = effects["gate"] == distinct["gate"] && rows["gate"] == distinct["gate"] && !race_bad["gate"]
      exact_fair = effects["fair"] == distinct["fair"] && rows["fair"] == distinct["fair"] && !race_bad["fair"]
      exact_peer = effects["peer"] == distinct["peer"] && !race_bad["peer"]
      json = json sprintf(", \"gate_side_effects\": %d, \"gate_distinct_events\": %d, \"gate_business_rows\": %d", effects["gate"], distinct["gate"], rows["gate"])
      json = json sprintf(", \"fair_side_effects\": %d, \"fair_distinct_events\": %d, \"fair_business_rows\": %d", effects["fair"], distinct["fair"], rows["fair"])
      json = json sprintf(", \"peer_side_effects\": %d, \"peer_distinct_events\": %d", effects["peer"], distinct["peer"])
      split("gate fair peer", sides, " ")
      for (k = 1; k <= 3; k++) {
        list = substr(race[sides[k]], 2); gsub(/ /, ", ", list)
        json = json ", \"" sides[k] "_race_side_effects\": [" list "]"
      }
      json = json sprintf(", \"gate_exactly_once\": %s, \"fair_exactly_once\": %s, \"peer_exactly_once\": %s", exact_gate ? "true" : "false", exact_fair ? "true" : "false", exact_peer ? "true" : "false")
      json = json sprintf(", \"target_fair_single_4_ge_1_5\": {\"value\": %.3f, \"met\": %s}", best4, met4)
      json = json sprintf(", \"target_fair_single_16_ge_1_5\": {\"value\": %.3f, \"met\": %s}", best16, met16)
      json = json sprintf(", \"target_fair_batch10_ge_2_5\": {\"value\": %.3f, \"met\": %s}", batch, metb)
      json = json sprintf(", \"target_fair_once_16_ge_2_0\": {\"value\": %.3f, \"met\": %s}", once16, meto)
      gsub(/"/, "\\\"", note)
      print json ", \"note\": \"" note "\"}"
      # Figures are only reported; a side effect or business row missing or repeated is a failure.
      if (!exact_gate || !exact_fair || !exact_peer) {
        print "a side effect or business row ran other than once for an event (counts above)" > "/dev/stderr"
        exit 3
      }
    }' "$1"
}
