#!/usr/bin/env bash
# The simulated trainer `make up` runs beside its stack (ckptvault_cli/trainer.py): two training runs that save
# a checkpoint every EVERY seconds on the demo's hot tier (live-hf, whose hook signals each save to the Prefect
# API, and live-ds, which the scheduled ingest finds), so the stack's flows have real work. `down` stops it
# with SIGTERM (it exits between two saves, or leaves the one in progress unfinished, as a crash would).
#
#   infra/local/trainer.sh up|down|status|clean
#
# env: STATE_DIR (default STATE_ROOT/trainer: PID, log), HOT (the hot tier, default DEMO_DIR/hot), EVERY (180 s),
#      KEEP (12 checkpoints per run on the hot tier), SIZE_MIB (8 MiB per checkpoint),
#      PREFECT_API_URL (where the hook's events go; unset: the
#      hook starts an ingest itself, `CKPTVAULT_CONFIG` naming its config), STOP_TIMEOUT (10 s).
set -euo pipefail
SERVER=trainer
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STATE_DIR=${STATE_DIR:-$STATE_ROOT/trainer}
HOT=${HOT:-$DEMO_DIR/hot}
EVERY=${EVERY:-180}
KEEP=${KEEP:-12}
SIZE_MIB=${SIZE_MIB:-8}
STOP_TIMEOUT=${STOP_TIMEOUT:-10}
PIDFILE=$STATE_DIR/trainer.pid
LOG=$STATE_DIR/trainer.log
PATTERN="ckptvault_cli.trainer --hot"

running() { pid_alive "$PIDFILE" "$PATTERN"; }

up() {
  local python
  python=$(find_bin python) || die "no python: build .venv first (make venv)"
  mkdir -p "$STATE_DIR" "$HOT"
  echo "$SERVER" >"$STATE_DIR/server"
  if running; then
    echo "trainer already running (pid $(<"$PIDFILE")), saving under $HOT"
    return 0
  fi
  echo "=== $(date -u +%FT%TZ) up (every $EVERY s, hot tier $HOT)" >>"$LOG"
  local before
  before=$(wc -l <"$LOG")
  start_bg "$PIDFILE" "$LOG" "$python" -u -m ckptvault_cli.trainer --hot "$HOT" --every "$EVERY" --keep "$KEEP" \
    --size-mib "$SIZE_MIB"
  # this start's first line (an earlier start's is in the same log)
  wait_until $((SECONDS + 30)) "the trainer's first line in $LOG" \
    "tail -n +$((before + 1)) '$LOG' | grep -q '^trainer: a save'" running ||
    { log_tail "$LOG"; die "the trainer did not start (log $LOG)"; }
  running || { log_tail "$LOG"; die "the trainer exited (log $LOG)"; }
  echo "trainer saving live-hf and live-ds every $EVERY s under $HOT (pid $(<"$PIDFILE"))"
}

status() {
  if running; then
    echo "$SERVER: running (pid $(<"$PIDFILE")), every $EVERY s under $HOT, state $STATE_DIR"
  else
    echo "$SERVER: not running (state $STATE_DIR)"
    return 3
  fi
}

case ${1:-} in
  up) up ;;
  down) stop_pid "$PIDFILE" "$PATTERN" "$STOP_TIMEOUT" ;;
  status) status ;;
  clean) stop_pid "$PIDFILE" "$PATTERN" "$STOP_TIMEOUT" && rm -rf "$STATE_DIR" ;;
  *) usage_exit ;;
esac
