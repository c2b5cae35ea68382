#!/usr/bin/env bash
# moto server (an in-memory AWS emulator) on 127.0.0.1, over real HTTP: for AWS-only semantics our code
# relies on (GLACIER / DEEP_ARCHIVE, RestoreObject, InvalidObjectState). Nothing persists across down/up.
#
#   infra/local/moto.sh up|down|status|clean
#
# env: STATE_DIR (default .state/moto; holds the PID and the log), PORT (default 5000),
#      ACCESS_KEY / SECRET_KEY (moto accepts any; recorded for uniformity), READY_TIMEOUT (30 s),
#      STOP_TIMEOUT (5 s), MOTO_BIN. moto opens no port besides PORT.
set -euo pipefail
SERVER=moto
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STATE_DIR=${STATE_DIR:-$REPO_ROOT/.state/moto}
config_load PORT ACCESS_KEY SECRET_KEY
PORT=${PORT:-5000}
ACCESS_KEY=${ACCESS_KEY:-ckptvault}
SECRET_KEY=${SECRET_KEY:-ckptvault-secret}
READY_TIMEOUT=${READY_TIMEOUT:-30}
STOP_TIMEOUT=${STOP_TIMEOUT:-5}

PIDFILE=$STATE_DIR/moto.pid
LOG=$STATE_DIR/moto.log
# moto's own management API: answering it proves the listener is moto, not some other server.
URL=http://127.0.0.1:$PORT/moto-api/

running() { pid_alive "$PIDFILE" moto_server; }
healthy() { running && http_ready "$URL"; }

up() {
  if healthy; then
    ready_line "$PORT"
    return 0
  fi
  if running; then
    say "pid $(<"$PIDFILE") is running but does not answer; restarting it"
    stop_pid "$PIDFILE" moto_server "$STOP_TIMEOUT"
  fi
  local moto
  moto=$(find_bin moto_server) || die "moto_server not found: pip install 'moto[server]' (it is in .[dev])"
  require_ports_free "$PORT"
  mkdir -p "$STATE_DIR"
  chmod 700 "$STATE_DIR"
  echo "$SERVER" >"$STATE_DIR/server"
  config_save PORT ACCESS_KEY SECRET_KEY
  echo "=== $(date -u +%FT%TZ) up" >>"$LOG"
  # moto logs every request to stderr whatever its settings: that goes to the log file, not to callers.
  start_bg "$PIDFILE" "$LOG" "$moto" -H 127.0.0.1 -p "$PORT"
  if ! wait_until $((SECONDS + READY_TIMEOUT)) "moto on :$PORT (${READY_TIMEOUT}s limit)" "http_ready $URL" running; then
    log_tail "$LOG"
    stop_pid "$PIDFILE" moto_server 2 || true
    exit 1
  fi
  ready_line "$PORT"
}

status() {
  if healthy; then
    echo "$SERVER: running (pid $(<"$PIDFILE")), $(ready_line "$PORT"), state $STATE_DIR"
  elif running; then
    echo "$SERVER: pid $(<"$PIDFILE") running but :$PORT does not answer"
    return 1
  else
    echo "$SERVER: not running (state $STATE_DIR)"
    return 3
  fi
}

case ${1:-} in
  up) up ;;
  down) stop_pid "$PIDFILE" moto_server "$STOP_TIMEOUT" ;;
  status) status ;;
  clean) stop_pid "$PIDFILE" moto_server "$STOP_TIMEOUT" && rm -rf "$STATE_DIR" ;;
  *) usage_exit ;;
esac
