# shellcheck shell=bash
# Shared helpers for the local S3 server scripts (seaweedfs.sh, ceph.sh, moto.sh).
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

# require_ports_free PORT...: fail fast (exit 3) instead of letting a server die on bind later.
require_ports_free() {
  local p
  for p in "$@"; do
    if port_in_use "$p"; then
      DIE_CODE=$EXIT_PORT_BUSY die "port $p on 127.0.0.1 is already in use (another instance? set PORT or STATE_DIR)"
    fi
  done
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
