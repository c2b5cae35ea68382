#!/usr/bin/env bash
# A Prefect server (API + UI) on 127.0.0.1, SQLite database in STATE_DIR/home (its PREFECT_HOME).
# For `make up`, the browser test and anyone who wants the UI; production with many workers uses
# Postgres instead (docs/OPERATIONS.md).
#
#   infra/local/prefect.sh up|down|status|clean
#
# env: STATE_DIR (default .state/prefect), PORT (default 4200), READY_TIMEOUT (90 s: ~9 s on an existing
#      database, ~30 s on a fresh one while the migrations run, more on a loaded machine), STOP_TIMEOUT (10 s),
#      PREFECT_BIN.
# Telemetry is off (DO_NOT_TRACK=1, PREFECT_SERVER_ANALYTICS_ENABLED=false): offline it would only fail
# noisily. `up` prints the API URL on its last line of stdout: `PREFECT_API_URL=http://127.0.0.1:PORT/api`.
set -euo pipefail
SERVER=prefect
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STATE_DIR=${STATE_DIR:-$REPO_ROOT/.state/prefect}
config_load PORT
PORT=${PORT:-4200}
READY_TIMEOUT=${READY_TIMEOUT:-90}
STOP_TIMEOUT=${STOP_TIMEOUT:-10}

PIDFILE=$STATE_DIR/server.pid
LOG=$STATE_DIR/server.log
API_URL=http://127.0.0.1:$PORT/api
# The command line of our server names its port: it tells ours from another instance's.
PATTERN="server start --host 127.0.0.1 --port $PORT"

export DO_NOT_TRACK=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false

running() { pid_alive "$PIDFILE" "$PATTERN"; }
# /api/health answers 200 `true` once the API serves; anything else (connection refused, 503) is "not yet".
health_ok() { [[ $(curl -s --max-time 2 "$API_URL/health" 2>/dev/null) == true ]]; }
healthy() { running && health_ok; }
ready() { echo "Prefect API ready at $API_URL (UI http://127.0.0.1:$PORT)"; }

# `prefect server start` runs uvicorn (and the server's services) in child processes: stop the whole
# process group it leads (start_bg gave it its own session), not only the CLI process.
# stop_group PIDFILE PATTERN TIMEOUT: SIGTERM to the group, SIGKILL after TIMEOUT s.
stop_group() {
  local pidfile=$1 pattern=$2 timeout=$3 pid deadline
  if ! pid_alive "$pidfile" "$pattern"; then
    rm -f "$pidfile"
    return 0
  fi
  pid=$(<"$pidfile")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + timeout))
  while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 -- "-$pid" 2>/dev/null; then
    say "process group $pid did not exit within ${timeout}s of SIGTERM; sending SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  fi
  rm -f "$pidfile"
}
stop_server() { stop_group "$PIDFILE" "$PATTERN" "$1"; }

up() {
  if healthy; then
    ready
    echo "PREFECT_API_URL=$API_URL"
    return 0
  fi
  if running; then
    say "pid $(<"$PIDFILE") is running but $API_URL/health does not answer; restarting it"
    stop_server "$STOP_TIMEOUT"
  fi
  command -v curl >/dev/null 2>&1 || die "curl not found (apt-get install curl)"
  local prefect
  prefect=$(find_bin prefect) || die "prefect not found: pip install -e . (make venv)"
  require_ports_free "$PORT"
  mkdir -p "$STATE_DIR/home"
  chmod 700 "$STATE_DIR"
  echo "$SERVER" >"$STATE_DIR/server"
  config_save PORT
  echo "=== $(date -u +%FT%TZ) up" >>"$LOG"
  # PREFECT_HOME holds the SQLite database (prefect.db), profiles and local results of this instance.
  # No PREFECT_API_URL for the server itself: a stray one from the caller's shell means nothing to it.
  local t0=$SECONDS
  start_bg "$PIDFILE" "$LOG" env -u PREFECT_API_URL PREFECT_HOME="$STATE_DIR/home" \
    PREFECT_UI_API_URL="$API_URL" PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 \
    "$prefect" server start --host 127.0.0.1 --port "$PORT"
  if ! wait_until $((SECONDS + READY_TIMEOUT)) "Prefect API on :$PORT (${READY_TIMEOUT}s limit)" health_ok running; then
    log_tail "$LOG"
    stop_server 3 || true
    exit 1
  fi
  say "healthy after $((SECONDS - t0)) s"
  ready
  echo "PREFECT_API_URL=$API_URL"
}

status() {
  if healthy; then
    echo "$SERVER: running (pid $(<"$PIDFILE")), $(ready), state $STATE_DIR"
  elif running; then
    echo "$SERVER: pid $(<"$PIDFILE") running but $API_URL/health does not answer"
    return 1
  else
    echo "$SERVER: not running (state $STATE_DIR)"
    return 3
  fi
}

case ${1:-} in
  up) up ;;
  down) stop_server "$STOP_TIMEOUT" ;;
  status) status ;;
  clean) stop_server "$STOP_TIMEOUT" && rm -rf "$STATE_DIR" ;;
  *) usage_exit ;;
esac
