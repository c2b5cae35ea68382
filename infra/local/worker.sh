#!/usr/bin/env bash
# A Prefect process worker for the `ckptvault` work pool, on this machine, against a running Prefect API.
# `up` creates the work pool if it is missing, deploys the seven deployments of ckptvault_prefect/deployments/prefect.yaml
# (`cd ckptvault_prefect/deployments && prefect --no-prompt deploy --all`), then starts Prefect's process worker for POOL (ckptvault_prefect/runtime/worker.py)
# in the background and waits until the worker has registered with the API. With WORK_QUEUE it polls that
# queue of the pool only (`make up` runs two: `default` with the ingest role's key, `tier` with the tier
# role's); without it, every queue of the pool (Prefect's default), so one worker runs all seven deployments.
#
#   infra/local/worker.sh up|down|status|clean
#
# env: PREFECT_API_URL (default http://127.0.0.1:${PREFECT_PORT:-4200}/api; the server must be up: see
#      prefect.sh), STATE_DIR (default .state/worker: PID, log, the worker's PREFECT_HOME), POOL (ckptvault),
#      WORK_QUEUE (empty: every queue of the pool),
#      DEPLOY (1: deploy on `up`; 0 to only start the worker), CKPTVAULT_HOME (default: this checkout; the
#      deployments' pull step changes into it before each flow run), CKPTVAULT_CONFIG (the config file the
#      flow runs read when a run's config_path parameter is empty; passed to the worker as is),
#      READY_TIMEOUT (60 s), STOP_TIMEOUT (10 s; the worker exits within ~1 s of SIGTERM, SIGKILL only after this,
#      and said), PREFECT_BIN.
# Flow runs are child processes of the worker and inherit its environment (AWS_* credentials included): a
# running worker started with another WORK_QUEUE or AWS_ACCESS_KEY_ID than this `up` asks for is restarted.
set -euo pipefail
SERVER=worker
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STATE_DIR=${STATE_DIR:-$REPO_ROOT/.state/worker}
config_load POOL
POOL=${POOL:-ckptvault}
WORK_QUEUE=${WORK_QUEUE:-}
PREFECT_API_URL=${PREFECT_API_URL:-http://127.0.0.1:${PREFECT_PORT:-4200}/api}
PREFECT_API_URL=${PREFECT_API_URL%/}
DEPLOY=${DEPLOY:-1}
CKPTVAULT_HOME=${CKPTVAULT_HOME:-$REPO_ROOT}
READY_TIMEOUT=${READY_TIMEOUT:-60}
STOP_TIMEOUT=${STOP_TIMEOUT:-10}

PIDFILE=$STATE_DIR/worker.pid
LOG=$STATE_DIR/worker.log
NAMEFILE=$STATE_DIR/worker.name
# What the running worker was started with (queue and access key id; never the secret): see `up`.
STARTEDFILE=$STATE_DIR/worker.started
PATTERN="ckptvault_prefect.runtime.worker --pool $POOL"

export DO_NOT_TRACK=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_API_URL CKPTVAULT_HOME
# The CLI and the worker keep their own profile and local results here, not in ~/.prefect.
export PREFECT_HOME=$STATE_DIR/home

running() { pid_alive "$PIDFILE" "$PATTERN"; }
api_ok() { [[ $(curl -s --max-time 2 "$PREFECT_API_URL/health" 2>/dev/null) == true ]]; }
# The API knows a worker of this name in the pool: it has started and sent its first heartbeat.
registered() {
  local name
  name=$(<"$NAMEFILE")
  curl -sf --max-time 2 -X POST -H 'content-type: application/json' -d '{}' \
    "$PREFECT_API_URL/work_pools/$POOL/workers/filter" 2>/dev/null | grep -q "\"name\":\"$name\""
}
healthy() { running && registered; }
pool_exists() { curl -sf --max-time 5 -o /dev/null "$PREFECT_API_URL/work_pools/$POOL"; }

# Flow runs are child processes of the worker, each started in a session of its own (Prefect isolates them):
# a SIGTERM to the worker's group alone would leave them running as orphans. So `down` signals both: the worker's group
# and each flow run's group (SIGTERM: the runs end Crashed, their on_crashed alert fires; an interrupted
# ingest resumes on its next run), then SIGKILL whatever is left after TIMEOUT s.
# stop_worker TIMEOUT
stop_worker() {
  local timeout=$1 pid deadline groups=() g
  if ! running; then
    rm -f "$PIDFILE"
    return 0
  fi
  pid=$(<"$PIDFILE")
  mapfile -t groups < <(pgrep -P "$pid" 2>/dev/null || true)
  groups=("$pid" "${groups[@]}")
  _groups_alive() {
    local x
    for x in "${groups[@]}"; do kill -0 -- "-$x" 2>/dev/null && return 0; done
    return 1
  }
  for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || kill -TERM "$g" 2>/dev/null || true; done
  deadline=$((SECONDS + timeout))
  while _groups_alive && ((SECONDS < deadline)); do sleep 0.1; done
  if _groups_alive; then
    say "worker $pid (and $((${#groups[@]} - 1)) flow runs) still there ${timeout}s after SIGTERM; sending SIGKILL"
    for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
    deadline=$((SECONDS + 10))
    while _groups_alive && ((SECONDS < deadline)); do sleep 0.1; done
  fi
  rm -f "$PIDFILE"
}

ensure_pool() {
  if pool_exists; then return 0; fi
  say "creating process work pool '$POOL'"
  # The server fetches a collection registry from the internet here; offline it falls back to bundled data.
  timeout 60 "$PREFECT" --no-prompt work-pool create "$POOL" --type process >>"$LOG" 2>&1 ||
    pool_exists || {
    log_tail "$LOG"
    die "could not create work pool '$POOL'"
  }
}

deploy() {
  say "deploying ckptvault_prefect/deployments/prefect.yaml to $PREFECT_API_URL"
  local t0=$SECONDS
  # Without CKPTVAULT_HOME: `deploy` would resolve the pull step's {{ $CKPTVAULT_HOME }} now, baking this
  # machine's path into the deployments; unset, the template is stored and each worker resolves it at run time.
  if ! (cd "$REPO_ROOT/ckptvault_prefect/deployments" && env -u CKPTVAULT_HOME timeout 300 "$PREFECT" --no-prompt deploy --all) >>"$LOG" 2>&1; then
    log_tail "$LOG"
    die "prefect deploy --all failed (log $LOG)"
  fi
  say "deployed in $((SECONDS - t0)) s"
}

up() {
  PREFECT=$(find_bin prefect) || die "prefect not found: pip install -e . (make venv)"
  command -v curl >/dev/null 2>&1 || die "curl not found (apt-get install curl)"
  mkdir -p "$STATE_DIR/home"
  chmod 700 "$STATE_DIR"
  echo "$SERVER" >"$STATE_DIR/server"
  config_save POOL
  echo "=== $(date -u +%FT%TZ) up (API $PREFECT_API_URL)" >>"$LOG"
  api_ok || die "no Prefect API answers at $PREFECT_API_URL/health (start one: infra/local/prefect.sh up)"
  ensure_pool
  if [[ $DEPLOY == 1 ]]; then deploy; fi
  local started="queue=${WORK_QUEUE:-*} key=${AWS_ACCESS_KEY_ID:-}"
  if [[ -s $NAMEFILE ]] && healthy; then
    if [[ $(cat "$STARTEDFILE" 2>/dev/null) == "$started" ]]; then
      say "worker $(<"$NAMEFILE") already running (pid $(<"$PIDFILE"))"
      return 0
    fi
    # An older `make up`'s worker (every queue, the admin key) would keep taking the tier runs: restart it.
    say "worker $(<"$NAMEFILE") runs with other settings than ($started); restarting it"
    stop_worker "$STOP_TIMEOUT"
  fi
  if running; then
    say "pid $(<"$PIDFILE") is running but not registered with $PREFECT_API_URL; restarting it"
    stop_worker "$STOP_TIMEOUT"
  fi
  # A name per start: readiness is "the API has heard from THIS worker", not from an earlier one.
  echo "ckptvault-$(hostname -s 2>/dev/null || echo local)-$(date +%s)" >"$NAMEFILE"
  [[ -n ${CKPTVAULT_CONFIG:-} ]] && say "flow runs without a config_path read CKPTVAULT_CONFIG=$CKPTVAULT_CONFIG"
  local queue_args=()
  [[ -n $WORK_QUEUE ]] && queue_args=(--work-queue "$WORK_QUEUE")
  # Prefect's ProcessWorker under a cancel scope of ours (ckptvault_prefect/runtime/worker.py): the one
  # `prefect worker start` makes does not stop on SIGTERM or SIGINT (prefect 3.9.1)
  start_bg "$PIDFILE" "$LOG" "$(dirname "$PREFECT")/python" -m ckptvault_prefect.runtime.worker --pool "$POOL" "${queue_args[@]}" --name "$(<"$NAMEFILE")"
  echo "$started" >"$STARTEDFILE"
  if ! wait_until $((SECONDS + READY_TIMEOUT)) "worker for pool $POOL (${READY_TIMEOUT}s limit)" registered running; then
    log_tail "$LOG"
    stop_worker 3 || true
    exit 1
  fi
  echo "worker $(<"$NAMEFILE") polling pool $POOL${WORK_QUEUE:+ (queue $WORK_QUEUE)} at $PREFECT_API_URL"
}

status() {
  if running && { [[ ! -s $NAMEFILE ]] || ! api_ok || registered; }; then
    echo "$SERVER: running (pid $(<"$PIDFILE")), pool $POOL ($(cat "$STARTEDFILE" 2>/dev/null)), API $PREFECT_API_URL, state $STATE_DIR"
  elif running; then
    echo "$SERVER: pid $(<"$PIDFILE") running but not registered with $PREFECT_API_URL"
    return 1
  else
    echo "$SERVER: not running (state $STATE_DIR)"
    return 3
  fi
}

case ${1:-} in
  up) up ;;
  down) stop_worker "$STOP_TIMEOUT" ;;
  status) status ;;
  clean) stop_worker "$STOP_TIMEOUT" && rm -rf "$STATE_DIR" ;;
  *) usage_exit ;;
esac
