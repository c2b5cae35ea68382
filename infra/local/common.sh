# shellcheck shell=bash
# Shared helpers for the local server scripts (seaweedfs.sh, ceph.sh, moto.sh, prefect.sh, worker.sh, dask.sh) and for
# up.sh, down.sh and instances.sh, which drive them.
# Sourced, not run. The caller sets `set -euo pipefail` and SERVER (its name, used in messages).
#
# Conventions every server script follows, so that tests/servers.py and .ci/run can drive any of them:
#   - everything an instance owns lives in its STATE_DIR (pid files, logs, data, config.env);
#   - a server is started in its own session (setsid) so a Ctrl-C aimed at whoever called `up`
#     (make demo, pytest) does not kill a store that is meant to outlive that command;
#   - its stdin/stdout/stderr never point at the caller's pipes: a caller that captures our output
#     (subprocess.run(capture_output=True)) would otherwise wait for EOF until the server exits;
#   - the ports and keys an instance was created with are recorded in STATE_DIR/config.env and reused,
#     because some servers bake them into their data (Ceph's monmap, SeaweedFS's m<port> dir).

COMMON_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export REPO_ROOT=${REPO_ROOT:-$COMMON_ROOT}

# Exit codes the Python side tells apart: 3 means "a port we need is taken", worth retrying elsewhere.
readonly EXIT_PORT_BUSY=3

say() { printf '%s: %s\n' "$SERVER" "$*" >&2; }
die() {
  say "error: $*"
  exit "${DIE_CODE:-1}"
}

# Print the last lines of each given log file to stderr (the reason a start failed is almost always there).
log_tail() {
  local n=${LOG_TAIL_LINES:-40} f
  for f in "$@"; do
    [[ -s $f ]] || continue
    printf -- '--- last %s lines of %s ---\n' "$n" "$f" >&2
    tail -n "$n" "$f" >&2
  done
}

# A binary from the repo's venv first (that is where pip puts weed / moto_server), else from PATH.
find_bin() {
  local name=$1
  if [[ -x $REPO_ROOT/.venv/bin/$name ]]; then
    printf '%s\n' "$REPO_ROOT/.venv/bin/$name"
  elif command -v "$name" >/dev/null 2>&1; then
    command -v "$name"
  else
    return 1
  fi
}

# pid_alive PIDFILE PATTERN: the recorded process exists AND its command line contains PATTERN.
# The pattern check guards against a PID reused by an unrelated process after a reboot or a crash.
pid_alive() {
  local pidfile=$1 pattern=$2 pid cmd
  [[ -s $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # /proc/PID/cmdline is NUL-separated; make it one line to grep.
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmd == *"$pattern"* ]]
}

# stop_pid PIDFILE PATTERN [TIMEOUT]: SIGTERM, wait up to TIMEOUT s (default STOP_TIMEOUT or 5),
# then SIGKILL. SeaweedFS has been seen ignoring SIGTERM for seconds, hence the escalation.
stop_pid() {
  local pidfile=$1 pattern=$2 timeout=${3:-${STOP_TIMEOUT:-5}} pid deadline
  if ! pid_alive "$pidfile" "$pattern"; then
    rm -f "$pidfile"
    return 0
  fi
  pid=$(<"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + timeout))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    say "pid $pid ($pattern) did not exit within ${timeout}s of SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    # SIGKILL cannot be ignored, but the kernel may take a moment to reap a process in D state.
    deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      say "pid $pid still present 10 s after SIGKILL"
      return 1
    fi
  fi
  rm -f "$pidfile"
}

# start_bg PIDFILE LOGFILE CMD...: run CMD detached (own session, no inherited stdio) and record its PID.
# `setsid` without -f execs in place here (a background job of a non-interactive shell is not a
# process-group leader), so $! is the server's own PID, not a wrapper's.
start_bg() {
  local pidfile=$1 logfile=$2
  shift 2
  if command -v setsid >/dev/null 2>&1; then
    setsid "$@" </dev/null >>"$logfile" 2>&1 &
  else
    "$@" </dev/null >>"$logfile" 2>&1 &
  fi
  echo $! >"$pidfile"
}

# http_ready URL: the server answers HTTP with a status below 500. An S3 server answers an anonymous
# GET / with 200 or 403 as soon as its S3 front end is serving; 5xx means "up but not ready".
http_ready() {
  local url=$1 code
  if command -v curl >/dev/null 2>&1; then
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" 2>/dev/null) || return 1
    [[ $code =~ ^[1-4][0-9][0-9]$ ]]
  else
    # Fresh machines may lack curl (install-ceph.sh installs it); python3 is always there for us.
    python3 - "$url" <<'PY'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError as e:
    sys.exit(0 if e.code < 500 else 1)
except Exception:
    sys.exit(1)
PY
  fi
}

# port_in_use PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# port_holder PORT: " by NAME (pid N)" for the process listening on 127.0.0.1:PORT, when `ss` can tell.
port_holder() {
  local line
  command -v ss >/dev/null 2>&1 || return 0
  line=$(ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:(("[^"]*",pid=[0-9]*' | head -n 1) || true
  [[ $line =~ \(\(\"([^\"]*)\",pid=([0-9]+) ]] && printf ' by %s (pid %s)' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
  return 0
}

# require_ports_free PORT...: fail fast (exit 3) instead of letting a server die on bind later.
# PORT_HINT (set by a caller that chooses the ports, such as up.sh or the demo) says what to change there:
# a caller that sets PORT itself would make "set PORT" a hint that does not work.
require_ports_free() {
  local p
  for p in "$@"; do
    if port_in_use "$p"; then
      DIE_CODE=$EXIT_PORT_BUSY die "port $p on 127.0.0.1 is already in use$(port_holder "$p"); ${PORT_HINT:-another instance? set PORT (and STATE_DIR) to start one on other ports}"
    fi
  done
}

# port_block KIND PORT: the ports an instance of KIND with S3 (or API) port PORT opens by default
# (seaweedfs.sh's header: S3 PORT, master/volume/filer/admin PORT+1..4, each gRPC +10000; ceph.sh's:
# RGW PORT, mon v2/v1 PORT+1/+2, OSDs in a shared range that is not counted here).
port_block() {
  local kind=$1 port=$2
  case $kind in
    seaweedfs) echo "$port $((port + 1)) $((port + 2)) $((port + 3)) $((port + 4))" \
      "$((port + 10000)) $((port + 10001)) $((port + 10002)) $((port + 10003)) $((port + 10004))" ;;
    ceph) echo "$port $((port + 1)) $((port + 2))" ;;
    *) echo "$port" ;;
  esac
}

# free_port_near KIND PORT: a port P near PORT (PORT+100, +200, ...) whose whole block is free: a
# suggestion for a hint, not a reservation.
free_port_near() {
  local kind=$1 port=$2 i p q busy
  for ((i = 1; i <= 40; i++)); do
    p=$((port + 100 * i))
    busy=0
    for q in $(port_block "$kind" "$p"); do
      if ((q > 65535)) || port_in_use "$q"; then
        busy=1
        break
      fi
    done
    if ((busy == 0)); then
      echo "$p"
      return 0
    fi
  done
  echo "<a free port>"
}

# wait_until DEADLINE WHAT CHECK_CMD [ALIVE_CMD]: poll CHECK_CMD every 0.2 s until it succeeds or
# SECONDS reaches DEADLINE (an absolute value of bash's SECONDS). If ALIVE_CMD is given and fails,
# give up at once: waiting 180 s on a process that died at second 1 helps nobody.
wait_until() {
  local deadline=$1 what=$2 check=$3 alive=${4:-}
  while ((SECONDS < deadline)); do
    if eval "$check" >/dev/null 2>&1; then return 0; fi
    if [[ -n $alive ]] && ! eval "$alive" >/dev/null 2>&1; then
      say "$what: the process exited while we were waiting"
      return 1
    fi
    sleep 0.2
  done
  say "$what: not ready before the time limit"
  return 1
}

# Recorded configuration. config_load reads STATE_DIR/config.env (if any) and refuses an explicit
# environment value that contradicts it; config_save writes the effective values.
# Usage: config_load VAR...   (call before applying defaults, so "explicitly set" is detectable)
config_load() {
  local file=$STATE_DIR/config.env var recorded line
  [[ -f $file ]] || return 0
  for var in "$@"; do
    line=$(grep -E "^${var}=" "$file" | tail -n 1) || continue
    recorded=${line#*=}
    if [[ -n ${!var:-} && ${!var} != "$recorded" ]]; then
      die "$var=${!var} but $STATE_DIR was created with $var=$recorded; unset it, or use another STATE_DIR (or '$0 clean' first)"
    fi
    printf -v "$var" '%s' "$recorded"
  done
}

config_save() {
  local file=$STATE_DIR/config.env var
  {
    echo "# written by infra/local/$SERVER.sh; the values this instance was created with"
    echo "SERVER=$SERVER"
    for var in "$@"; do printf '%s=%s\n' "$var" "${!var}"; done
  } >"$file.tmp"
  chmod 600 "$file.tmp"
  mv "$file.tmp" "$file"
}

ready_line() { echo "S3 ready at http://127.0.0.1:$1"; }

usage_exit() {
  echo "usage: $0 up|down|status|clean   (env: STATE_DIR PORT ACCESS_KEY SECRET_KEY ...; see infra/local/README.md)" >&2
  exit 2
}

# ---- This checkout's instances: for up.sh, down.sh, instances.sh and `make demo` ----
# An instance is a directory with a `server` file (its script writes it on `up`): the demo's under DEMO_DIR
# (default .demo, where ckptvault_cli/demo.py puts its store), `make up`'s and hand-started ones under
# STATE_ROOT (default .state; a test session's is .state/test-<kind>-<pytest pid>).
LOCAL_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEMO_DIR=$(realpath -m "${DEMO_DIR:-$REPO_ROOT/.demo}")
STATE_ROOT=$(realpath -m "${STATE_ROOT:-$REPO_ROOT/.state}")
KINDS=(seaweedfs ceph moto prefect worker dask trainer)
# What a server script reads from its environment and records in config.env: a value left in the caller's
# shell (`export PORT=3000`) must not move, or be refused by, an instance we drive by its STATE_DIR.
SCRIPT_ENV_UNSET=()
for _v in STATE_DIR PORT ACCESS_KEY SECRET_KEY READY_TIMEOUT PORT_HINT POOL WORK_QUEUE MASTER_PORT VOLUME_PORT \
  FILER_PORT ADMIN_PORT S3_GRPC_PORT MASTER_GRPC_PORT VOLUME_GRPC_PORT FILER_GRPC_PORT ADMIN_GRPC_PORT \
  MON_V2_PORT MON_V1_PORT OSD_PORT_MIN OSD_PORT_MAX STORE_BYTES OBJECTSTORE LC_DEBUG_INTERVAL WORKERS THREADS \
  HOT EVERY KEEP SIZE_MIB; do
  SCRIPT_ENV_UNSET+=(-u "$_v")
done
unset _v

rel_path() { printf '%s\n' "${1#"$REPO_ROOT"/}"; }

# instance_list: the state dir of every instance of this checkout, one per line (demo's first).
instance_list() {
  local root d
  for root in "$DEMO_DIR" "$STATE_ROOT"; do
    if [[ -f $root/server ]]; then printf '%s\n' "$root"; fi # a state dir used as a root (older demos)
    for d in "$root"/*/; do
      if [[ -f $d/server ]]; then printf '%s\n' "${d%/}"; fi
    done
  done
}

# instance_kind DIR: seaweedfs|ceph|moto|prefect|worker|dask (what its `server` file says), or fail.
instance_kind() {
  local kind k
  kind=$(head -n 1 "$1/server" 2>/dev/null) || return 1
  for k in "${KINDS[@]}"; do
    if [[ $kind == "$k" ]]; then
      echo "$kind"
      return 0
    fi
  done
  return 1
}

# instance_conf DIR VAR: the value VAR was recorded with in DIR/config.env (empty if none).
instance_conf() {
  local line
  line=$(grep -E "^$2=" "$1/config.env" 2>/dev/null | tail -n 1) || return 0
  printf '%s\n' "${line#*=}"
}

# instance_ports DIR: the ports recorded for DIR (S3 or API port first), space-separated.
instance_ports() {
  local ports
  ports=$(grep -E '^[A-Z0-9_]*PORT=[0-9]+$' "$1/config.env" 2>/dev/null | grep -vE '^OSD_PORT_(MIN|MAX)=' |
    cut -d= -f2 | tr '\n' ' ') || true
  echo "${ports% }"
}

# live_test_session DIR: DIR is a test session's (test-<kind>-<pid>) and that pytest still runs.
live_test_session() {
  [[ $(basename "$1") =~ test-[a-z]+-([0-9]+)$ ]] && kill -0 "${BASH_REMATCH[1]}" 2>/dev/null
}

# run_at KIND DIR ACTION [VAR=VALUE...]: KIND's script on STATE_DIR=DIR, the caller's environment cleared
# of every variable the script would read as a setting; VAR=VALUE pairs are the only ones it gets.
run_at() {
  local kind=$1 dir=$2 action=$3
  shift 3
  env "${SCRIPT_ENV_UNSET[@]}" STATE_DIR="$dir" "$@" bash "$LOCAL_DIR/$kind.sh" "$action"
}

# run_instance DIR ACTION [VAR=VALUE...]: run_at for an existing instance (its kind from its `server` file).
run_instance() {
  local dir=$1 action=$2 kind
  shift 2
  kind=$(instance_kind "$dir") || return 2
  run_at "$kind" "$dir" "$action" "$@"
}

# instance_created KIND DIR: DIR holds an instance that was created (it has recorded ports and keys that
# later starts reuse; for Ceph, a bootstrap that completed).
instance_created() {
  [[ -f $2/config.env ]] && { [[ $1 != ceph ]] || [[ -f $2/.created ]]; }
}

# instance_running DIR: a process of the instance is alive (its `status` says anything but "not running").
instance_running() {
  local rc=0
  run_instance "$1" status >/dev/null 2>&1 || rc=$?
  ((rc != 3))
}

# port_ranges PORT...: "8333-8337, 18333-18337" (sorted, consecutive ports joined).
port_ranges() {
  local out="" start="" prev="" p
  for p in $(printf '%s\n' "$@" | sort -n -u); do
    if [[ -n $prev ]] && ((p == prev + 1)); then
      prev=$p
      continue
    fi
    if [[ -n $start ]]; then out+="${out:+, }$start$([[ $prev != "$start" ]] && echo "-$prev")"; fi
    start=$p prev=$p
  done
  if [[ -n $start ]]; then out+="${out:+, }$start$([[ $prev != "$start" ]] && echo "-$prev")"; fi
  echo "$out"
}

# instance_describe DIR: "seaweedfs in .demo/seaweedfs (the demo's; ports 8333 ...)".
instance_describe() {
  local dir=$1 kind whose ports
  kind=$(instance_kind "$dir") || kind=unknown
  case $dir in
    "$DEMO_DIR" | "$DEMO_DIR"/*) whose="the demo's" ;;
    "$STATE_ROOT"/test-*) whose="a test session's" ;;
    "$STATE_ROOT/$kind" | "$STATE_ROOT/worker-tier") whose="make up's" ;;
    *) whose="hand-started" ;;
  esac
  # shellcheck disable=SC2046  # a list of port numbers
  ports=$(port_ranges $(instance_ports "$dir"))
  printf '%s in %s (%s%s)\n' "$kind" "$(rel_path "$dir")" "$whose" "${ports:+; ports $ports}"
}

# instances_holding DIR PORT...: the running instances of this checkout, other than DIR, that hold one of
# PORTS (by their recorded ports), one per line as "STATE_DIR PORT".
instances_holding() {
  local self=$1 d p q
  shift
  while IFS= read -r d; do
    [[ $d == "$self" ]] && continue
    for q in $(instance_ports "$d"); do
      for p in "$@"; do
        if [[ $p == "$q" ]] && instance_running "$d"; then
          echo "$d $p"
          continue 3
        fi
      done
    done
  done < <(instance_list)
}
