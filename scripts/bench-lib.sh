# Shared by scripts/bench-http and scripts/bench-node: the same placement,
# process handling, wrk run, CPU and fsync counters and ledger check, so that
# the two measure the same way. Sourced after scripts/lib.sh, with BENCH_NAME
# set ("bench-http", ...), KEYS (the replay workload's keys) and LUA (the wrk
# script). A script that starts more than these helpers stop sets
# BENCH_CLEANUP to a function that stops the rest.
# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables set here are read by the scripts that source it

# CPU 0 for the service side, CPU 1 for the load; one CPU: both on CPU 0.
# The database (mariadbd, redis-server) is on the service CPU, as issue 8
# measured; ORPHEUS_BENCH_DB_CPU=1 moves it beside the load instead, the
# nearest this box gets to a database on its own host.
SERVICE_CPU=0 LOAD_CPU=1
if [ "$(nproc)" -lt 2 ]; then
  echo "== warning: one CPU only: wrk shares CPU 0 with the server; figures are not comparable"
  LOAD_CPU=0
fi
DB_CPU=${ORPHEUS_BENCH_DB_CPU:-$SERVICE_CPU}
case "$DB_CPU" in
0 | "$LOAD_CPU") ;;
*) echo "$BENCH_NAME: ORPHEUS_BENCH_DB_CPU must be 0 or $LOAD_CPU, not '$DB_CPU'" >&2; exit 2 ;;
esac

RUN=$(mktemp -d "/tmp/orpheus-$BENCH_NAME.XXXXXX")
pids=()
BENCH_CLEANUP=""
alive() {  # kill -0 succeeds on zombies: read the state instead
  [ -r "/proc/$1/status" ] && ! grep -qs '^State:.*Z' "/proc/$1/status"
}
# Stops one process we started: SIGTERM, then SIGKILL after 10 s.
stop_pid() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    alive "$pid" || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  forget "$pid"
}
forget() {
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  pids=(${keep[@]+"${keep[@]}"})
}
cleanup() {
  local rc=$?
  set +e
  local p
  for p in ${pids[@]+"${pids[@]}"}; do stop_pid "$p"; done
  [ -z "$BENCH_CLEANUP" ] || "$BENCH_CLEANUP"
  if [ "$rc" -eq 0 ]; then rm -rf "$RUN"; else echo "== logs kept in $RUN" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a program that prints "listening on PORT"; sets PORT and PID.
start() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  PID=$!
  pids+=("$PID")
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's/^listening on //p' "$log" 2>/dev/null || true)  # not created yet: wait
    [ -n "$PORT" ] && return 0
    alive "$PID" || break
    sleep 0.1
  done
  echo "$BENCH_NAME: $* did not start:" >&2
  cat "$log" >&2
  exit 1
}

# The body of GET http://127.0.0.1:PORT/PATH (no curl on a fresh machine).
http_get() {
  # shellcheck disable=SC2016  # $0 and $1 are the inner shell's
  timeout 10 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" "$1" >&3
    cat <&3' "$1" "$2" | sed '1,/^\r\{0,1\}$/d'
}
json_int() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" <<<"$2"; }

# utime + stime of every thread of PID, in clock ticks.
cpu_ticks() {
  [ -n "$1" ] || { echo 0; return; }
  local stat rest
  stat=$(<"/proc/$1/stat")
  rest=${stat##*) }
  # shellcheck disable=SC2086  # split the fields on purpose
  set -- $rest
  echo $((${12} + ${13}))
}
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# Context switches (voluntary + involuntary) of every live thread of PID.
ctx_switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '/^(non)?voluntary_ctxt_switches:/ { n += $2 } END { print n + 0 }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }

per_req_us() {  # ticks before, after, requests
  awk -v a="$1" -v b="$2" -v r="$3" -v t="$TICK_US" 'BEGIN { printf "%.0f", r ? (b - a) * t / r : 0 }'
}

# Runs wrk on the load CPU, bounded; LOG gets its output, and the
# "bench-http:" line of payments.lua becomes R_REQUESTS, R_P50_US, ...
run_wrk() {
  local log=$1 connections=$2 seconds=$3 url=$4 mode=$5 prefix=$6 line
  taskset -c "$LOAD_CPU" timeout $((seconds + 60)) \
    wrk -t1 -c"$connections" -d"${seconds}s" --latency -s "$LUA" "$url" -- "$mode" "$prefix" "$KEYS" \
    >"$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  local rc=0
  wait "$pid" || rc=$?
  forget "$pid"
  line=$(grep '^bench-http:' "$log" || true)
  if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
    echo "$BENCH_NAME: wrk failed ($rc):" >&2
    cat "$log" >&2
    exit 1
  fi
  for kv in ${line#bench-http: }; do
    case "$kv" in
    requests=*) R_REQUESTS=${kv#*=} ;;
    duration_us=*) R_DURATION_US=${kv#*=} ;;
    p50_us=*) R_P50_US=${kv#*=} ;;
    p99_us=*) R_P99_US=${kv#*=} ;;
    non2xx=*) R_NON2XX=${kv#*=} ;;
    errors=*) R_ERRORS=${kv#*=} ;;
    esac
  done
}

# The replay workload's first step: each of the KEYS keys POSTed once, one
# at a time, to URL; the bank's ledger (on LEDGER_PORT) must show KEYS
# charges. TAG names the logs and the keys.
prime_keys() {  # URL LEDGER_PORT TAG
  run_wrk "$RUN/$3-prime.log" 1 2 "$1" prime "$3"
  local primed
  primed=$(json_int charges "$(http_get "$2" /ledger)")
  if [ "$primed" != "$KEYS" ] || [ "$R_NON2XX" != 0 ]; then
    echo "$BENCH_NAME: priming $KEYS keys made ${primed:-?} charges, $R_NON2XX answers not 2xx" >&2
    cat "$RUN/$3-prime.log" >&2
    exit 1
  fi
}

# fsync + fdatasync calls over the timed run: the kernel's syscall
# tracepoints, counted in-kernel (no stop per call; threads created later
# inherit them). PERF_OK is 1 where perf can open them.
PERF_OK=0
if perf stat -x, -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync -- true >/dev/null 2>&1; then
  PERF_OK=1
fi
PERF_PID=""
perf_begin() {  # PIDS...
  local list
  list=$(IFS=,; echo "$*")
  perf stat -x, -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync -p "$list" \
    -o "$RUN/perf.out" >/dev/null 2>"$RUN/perf.err" &
  PERF_PID=$!
  pids+=("$PERF_PID")
  sleep 0.3  # attached
}
perf_end() {  # sets FSYNC_CALLS
  kill -INT "$PERF_PID" 2>/dev/null || true
  wait "$PERF_PID" || true
  forget "$PERF_PID"
  FSYNC_CALLS=$(awk -F, '/syscalls:sys_enter_f/ { n += $1 } END { print n + 0 }' "$RUN/perf.out")
  grep -q 'syscalls:sys_enter_fdatasync' "$RUN/perf.out" || {
    echo "$BENCH_NAME: perf counted nothing:" >&2; cat "$RUN/perf.err" "$RUN/perf.out" >&2; exit 1; }
}

# The bank's GET /ledger on PORT after a run of WORKLOAD: VERDICT is "ok",
# or says what is wrong: a reference charged twice, charges and references
# that differ, or (replay) a charge beyond the KEYS primed ones.
check_ledger() {  # PORT WORKLOAD
  local ledger charges refs doubles
  VERDICT=ok
  ledger=$(http_get "$1" /ledger)
  charges=$(json_int charges "$ledger") refs=$(json_int references "$ledger")
  doubles=$(json_int double_charges "$ledger")
  if [ -z "$charges" ] || [ "${doubles:-1}" != 0 ] || [ "$charges" != "$refs" ] ||
    { [ "$2" = replay ] && [ "$charges" != "$KEYS" ]; }; then
    VERDICT="DOUBLE CHARGES (ledger: $ledger)"
  fi
}
