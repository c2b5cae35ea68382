#!/usr/bin/env bash
# A real Dask cluster on 127.0.0.1: one `dask scheduler` and WORKERS `dask worker` processes, for
# `[scale] dask_address` (or `ckptvault ingest --dask-address`) to run ingest's upload tasks on.
#
#   infra/local/dask.sh up|down|status|clean
#
# env: STATE_DIR (default .state/dask), PORT (the scheduler's, default 8786; its HTTP health/metrics
#      server is PORT+1: never :8787, where a dashboard of someone else's would be), WORKERS (2),
#      THREADS (tasks at once per worker, 1: each upload task has its own [store] max_concurrency part
#      threads), READY_TIMEOUT (60 s: the scheduler up and every worker registered), STOP_TIMEOUT (5 s).
#
# Worker i (0-based) is named node-i and stands for one node: its own directory STATE_DIR/node-i (its
# Dask local directory, and CKPTVAULT_NODE_DIR in its environment), CKPTVAULT_NODE=node-i, and a Dask
# resource node-i=1, which pins the work of a node-local source (locality = "node") to the node that
# holds its files (docs/OPERATIONS.md, "Node-local shards"). Each worker runs under
# its own nanny (Dask's default), which restarts a worker process that dies; `up` on a running cluster
# starts any worker whose nanny is gone. The address to use is printed: `Dask scheduler ready at
# tcp://127.0.0.1:PORT`.
set -euo pipefail
SERVER=dask
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STATE_DIR=${STATE_DIR:-$REPO_ROOT/.state/dask}
config_load PORT WORKERS THREADS
PORT=${PORT:-8786}
WORKERS=${WORKERS:-2}
THREADS=${THREADS:-1}
READY_TIMEOUT=${READY_TIMEOUT:-60}
STOP_TIMEOUT=${STOP_TIMEOUT:-5}
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || die "WORKERS=$WORKERS: give a number of worker processes, 1 or more"
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || die "THREADS=$THREADS: give a number of threads per worker, 1 or more"

ADDRESS=tcp://127.0.0.1:$PORT
# The scheduler unpickles every task graph and the workers run it: both import ckptvault (and the
# flows' tasks) from this checkout, whatever the venv's install points at, so a cluster started from
# a checkout runs that checkout's code, like its client.
export PYTHONPATH=$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}
SCHED_PID=$STATE_DIR/scheduler.pid

worker_pidfile() { echo "$STATE_DIR/node-$1.pid"; }
# The patterns pid_alive checks: a reused PID of an unrelated process is not ours.
sched_running() { pid_alive "$SCHED_PID" "dask scheduler"; }
worker_running() { pid_alive "$(worker_pidfile "$1")" "dask worker"; }

python_bin() { find_bin python || die "no python: build .venv first (make venv)"; }

# registered N: the scheduler answers and has at least N workers (a client handshake, 5 s bound).
registered() {
  "$(python_bin)" - "$ADDRESS" "$1" <<'PY'
import sys
from distributed import Client
with Client(sys.argv[1], timeout=5, set_as_default=False) as c:
    sys.exit(0 if len(c.scheduler_info(n_workers=-1)["workers"]) >= int(sys.argv[2]) else 1)
PY
}

ready_msg() { echo "Dask scheduler ready at $ADDRESS ($WORKERS workers)"; }

start_worker() {
  local i=$1 dask node=node-$1
  dask=$(find_bin dask) || die "dask not found: pip install 'ckptvault[dask]' (it is in .[dev])"
  mkdir -p "$STATE_DIR/$node"
  # env: the node's identity for the tasks it runs (the nanny passes its environment to the worker).
  CKPTVAULT_NODE=$node CKPTVAULT_NODE_DIR=$STATE_DIR/$node \
    start_bg "$(worker_pidfile "$i")" "$STATE_DIR/$node.log" "$dask" worker "$ADDRESS" \
    --name "$node" --host 127.0.0.1 --nthreads "$THREADS" --nworkers 1 \
    --local-directory "$STATE_DIR/$node" --resources "$node=1" --no-dashboard
}

up() {
  local dask i started=0
  dask=$(find_bin dask) || die "dask not found: pip install 'ckptvault[dask]' (it is in .[dev])"
  mkdir -p "$STATE_DIR"
  chmod 700 "$STATE_DIR"
  if ! sched_running; then
    require_ports_free "$PORT" $((PORT + 1))
    echo "$SERVER" >"$STATE_DIR/server"
    config_save PORT WORKERS THREADS
    echo "=== $(date -u +%FT%TZ) up" >>"$STATE_DIR/scheduler.log"
    start_bg "$SCHED_PID" "$STATE_DIR/scheduler.log" "$dask" scheduler --host 127.0.0.1 --port "$PORT" \
      --dashboard-address "127.0.0.1:$((PORT + 1))" --no-dashboard
    if ! wait_until $((SECONDS + READY_TIMEOUT)) "dask scheduler on :$PORT" "registered 0" sched_running; then
      log_tail "$STATE_DIR/scheduler.log"
      down
      exit 1
    fi
  fi
  for ((i = 0; i < WORKERS; i++)); do
    worker_running "$i" && continue
    start_worker "$i"
    started=$((started + 1))
  done
  if ! wait_until $((SECONDS + READY_TIMEOUT)) "$WORKERS dask workers at $ADDRESS" "registered $WORKERS" sched_running; then
    for ((i = 0; i < WORKERS; i++)); do log_tail "$STATE_DIR/node-$i.log"; done
    log_tail "$STATE_DIR/scheduler.log"
    ((started == WORKERS)) && down # a cluster we created and that never worked; a restart keeps the rest
    exit 1
  fi
  ready_msg
}

down() {
  local i rc=0
  # workers first: a scheduler stopped under them makes each retry its connection until it times out
  for ((i = 0; i < WORKERS; i++)); do
    stop_pid "$(worker_pidfile "$i")" "dask worker" "$STOP_TIMEOUT" || rc=1
  done
  stop_pid "$SCHED_PID" "dask scheduler" "$STOP_TIMEOUT" || rc=1
  return "$rc"
}

status() {
  local i alive=0
  for ((i = 0; i < WORKERS; i++)); do worker_running "$i" && alive=$((alive + 1)); done
  if sched_running && registered "$WORKERS"; then
    echo "$SERVER: running (scheduler pid $(<"$SCHED_PID"), $alive/$WORKERS worker processes), $(ready_msg), state $STATE_DIR"
  elif sched_running || ((alive > 0)); then
    echo "$SERVER: scheduler $(sched_running && echo running || echo stopped), $alive/$WORKERS workers, not all registered at $ADDRESS"
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
