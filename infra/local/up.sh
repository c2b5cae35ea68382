#!/usr/bin/env bash
# `make up`: everything ckptvault needs on one machine, started in order, each with a readiness wait and a
# time limit: the S3 store (SeaweedFS by default, STORE=ceph for Ceph RGW), a Prefect server (SQLite, UI),
# the `ckptvault` process work pool with the seven deployments, its workers, and the simulated trainer
# (trainer.sh) saving two runs on the demo's hot tier; then a first ingest run. It serves the demo's config
# (DEMO_DIR/ckptvault.toml, prefix `demo`, written by `python -m ckptvault_cli.demo config` when no demo
# wrote it, with the demo's checkpoints), so the UI shows the demo's runs. Idempotent: what already
# runs healthy is left as it is. `make down` (down.sh) stops them all; data and the database are kept
# (`make clean` deletes them).
#
# The two roles (docs/OPERATIONS.md, "Two roles"). On SeaweedFS, when the config says
# `[store] deletes = "tier-only"` (a config up.sh writes does), two workers: STATE_ROOT/worker polls the
# pool's `default` queue (ingest, drill, watch, restore) with the key of the SeaweedFS user
# `ckptvault-ingest`, whose policy (infra/terraform/ingest-policy.json.tftpl) has no delete at all, and
# STATE_ROOT/worker-tier polls the `tier` queue (the tier deployment, prefect.yaml) with `ckptvault-tier`'s
# key (worker-policy.json.tftpl: may delete under the prefix). infra/local/roles.py makes the users
# (idempotent) and writes their keys to STATE_ROOT/roles.env (mode 600). Otherwise (STORE=ceph, whose
# users are made with radosgw-admin, not through the S3 port; or a config of the user's without the
# switch, whose flows would fail at their first delete under the ingest policy) one worker polls both
# queues with the store's admin key, as before, and up.sh says so.
#
#   infra/local/up.sh [store]     store: only the S3 store, the stack's config file and its bucket
#
# Which store. `make demo` and `make up` share one per kind instead of fighting over port 8333 (7480 for
# Ceph): while `make up` has no store of its own (STATE_ROOT/<store>), it uses the one `make demo` created
# (DEMO_DIR/<store>), with that store's port, keys (ckptvault-demo/...) and data, starting it if it is
# stopped; otherwise, and when STORE_PORT asks for another port than the demo's, its own. Once the stack
# has its own store it keeps it (its catalog is in it): a demo store that then holds the port is stopped
# (its data is kept; `make demo` uses the stack's store while it runs). A port held by another server of
# this checkout (hand-started, a test session) is named with the command that stops it; one held by
# anything else is named with the variable that moves ours: STORE_PORT, PREFECT_PORT.
#
# env: STORE (seaweedfs|ceph), STORE_PORT (the store's S3 port for a new store; default its script's:
#      8333 / 7480), PREFECT_PORT (4200), CKPTVAULT_CONFIG (a config of yours, served instead of the demo's:
#      no trainer, no demo checkpoints), TRAINER_EVERY (180 s between two saves of a simulated run),
#      TRAINER_SIZE_MIB (8 MiB a save),
#      STATE_ROOT (.state), DEMO_DIR (.demo; the demo's store, config and hot tier).
# State: STATE_ROOT/<store>/ (unless the demo's store is used), STATE_ROOT/prefect/, STATE_ROOT/worker/,
#        STATE_ROOT/worker-tier/, STATE_ROOT/trainer/, STATE_ROOT/roles.env; DEMO_DIR/ckptvault.toml, DEMO_DIR/hot/.
set -euo pipefail
SERVER=up
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MODE=${1:-all}
case $MODE in
  all | store) ;;
  *)
    echo "usage: $0 [store]   (env: STORE STORE_PORT PREFECT_PORT STATE_ROOT DEMO_DIR; see infra/local/README.md)" >&2
    exit 2
    ;;
esac
STORE=${STORE:-seaweedfs}
CONFIG=${CKPTVAULT_CONFIG:-$STATE_ROOT/ckptvault.toml}
PY_BIN=$REPO_ROOT/.venv/bin/python
case $STORE in
  seaweedfs) DEFAULT_STORE_PORT=8333 ;;
  ceph) DEFAULT_STORE_PORT=7480 ;;
  *) die "STORE=$STORE is not known: seaweedfs (default) or ceph" ;;
esac
export DO_NOT_TRACK=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false

# start_part KIND DIR VAR DEFAULT_PORT [VAR=VALUE...]: `KIND.sh up` on STATE_DIR=DIR, its stdout passed on.
# VAR names the variable of ours that chooses its port (STORE_PORT, PREFECT_PORT); DEFAULT_PORT is the
# port for an instance that does not exist yet. A created instance keeps the port it was created with.
start_part() {
  local kind=$1 dir=$2 var=$3 default=$4 recorded="" port holder hport hint
  shift 4
  local env_args=("$@")
  if instance_created "$kind" "$dir"; then
    recorded=$(instance_conf "$dir" PORT)
    if [[ -n ${!var:-} && ${!var} != "$recorded" ]]; then
      die "$var=${!var}, but the $kind in $(rel_path "$dir") was created on port $recorded and keeps it" \
        "(its data is tied to it); unset $var, or stop it and delete that directory to start afresh elsewhere"
    fi
    port=$recorded
  else
    port=${!var:-$default}
    env_args+=("PORT=$port")
  fi
  local block
  if [[ -n $recorded ]]; then block=$(instance_ports "$dir"); else block=$(port_block "$kind" "$port"); fi
  # Not running healthy: a server of this checkout may hold one of its ports. The demo's store yields to
  # the stack's store (see the header); any other holder is named, with how to stop it.
  if [[ ! -f $dir/server ]] || ! run_at "$kind" "$dir" status >/dev/null 2>&1; then
    # shellcheck disable=SC2086  # a list of port numbers
    while read -r holder hport; do
      [[ -n $holder ]] || continue
      case $holder in
        "$DEMO_DIR"/*)
          if [[ $kind =~ ^(seaweedfs|ceph)$ && $(instance_kind "$holder") =~ ^(seaweedfs|ceph)$ ]]; then
            say "stopping $(instance_describe "$holder"): it holds port $hport, which the $kind of this stack" \
              "($(rel_path "$dir")) was created on; its data is kept, and \`make demo\` uses this stack's store while it runs"
            run_instance "$holder" down >&2 || die "could not stop the demo's store in $(rel_path "$holder")"
            continue
          fi
          ;;
      esac
      if live_test_session "$holder"; then
        hint="it stops when its pytest session ends"
      else
        hint="stop it (\`make down\` stops every server of this checkout; this one alone: STATE_DIR=$holder bash infra/local/$(instance_kind "$holder").sh down)"
      fi
      if [[ -z $recorded ]]; then hint+=", or choose other ports: $var=$(free_port_near "$kind" "$port") make up"; fi
      DIE_CODE=$EXIT_PORT_BUSY die "port $hport is held by $(instance_describe "$holder"); $hint"
    done < <(instances_holding "$dir" $block)
  fi
  # Anything else on a port is not ours: the hint names what really moves the port.
  if [[ -z $recorded ]]; then
    hint="not by a server of this checkout; choose other ports with $var, e.g. $var=$(free_port_near "$kind" "$port") make up"
  elif [[ $dir == "$DEMO_DIR"/* ]]; then
    hint="the demo's store in $(rel_path "$dir"), which make up uses, was created on port $recorded and keeps it;"
    hint+=" free the port, or give make up a store of its own elsewhere: $var=$(free_port_near "$kind" "$recorded") make up"
  else
    hint="the $kind in $(rel_path "$dir") was created on port $recorded and keeps it; free the port,"
    hint+=" or delete that directory (its data goes) and rerun with $var=$(free_port_near "$kind" "$recorded") make up"
  fi
  run_at "$kind" "$dir" up "${env_args[@]}" "PORT_HINT=$hint"
}

t0=$SECONDS
say "1/4 S3 store: $STORE"
OWN_STORE=$STATE_ROOT/$STORE
DEMO_STORE=$DEMO_DIR/$STORE
STORE_DIR=$OWN_STORE
if ! instance_created "$STORE" "$OWN_STORE" && instance_created "$STORE" "$DEMO_STORE" &&
  [[ -z ${STORE_PORT:-} || $STORE_PORT == "$(instance_conf "$DEMO_STORE" PORT)" ]]; then
  STORE_DIR=$DEMO_STORE
  say "using the demo's store: $(instance_describe "$DEMO_STORE"), its data and keys; \`make down\` stops it with the rest"
fi
rc=0
store_line=$(start_part "$STORE" "$STORE_DIR" STORE_PORT "$DEFAULT_STORE_PORT" | tail -n 1) || rc=$?
((rc == 0)) || DIE_CODE=$rc die "the $STORE store did not start (see above)"
echo "$store_line"
# The endpoint, keys and region this store instance was created with.
S3_URL=${store_line##* }
ACCESS_KEY=$(instance_conf "$STORE_DIR" ACCESS_KEY)
SECRET_KEY=$(instance_conf "$STORE_DIR" SECRET_KEY)
if [[ $STORE == ceph ]]; then REGION=default; else REGION=us-east-1; fi

if [[ -n ${CKPTVAULT_CONFIG:-} ]]; then
  [[ -f $CONFIG ]] || die "CKPTVAULT_CONFIG=$CONFIG does not exist; unset it to serve the demo's config ($(rel_path "$DEMO_DIR/ckptvault.toml"))"
  if ! grep -qF "endpoint_url = \"$S3_URL\"" "$CONFIG"; then
    say "warning: $CONFIG does not name this store's endpoint $S3_URL; edit its endpoint_url"
  fi
else
  # The config `make demo` writes (the same one, rewritten while it carries its marker line): the demo's runs
  # and the simulated trainer's, prefix `demo`, which the two roles' keys are scoped to.
  CONFIG=$(DEMO_DIR=$DEMO_DIR STATE_ROOT=$STATE_ROOT "$PY_BIN" -m ckptvault_cli.demo config "$S3_URL" "$STORE") ||
    die "could not write the demo's config in $(rel_path "$DEMO_DIR")"
  say "config: $(rel_path "$CONFIG") (the demo's runs and the simulated trainer's, prefix demo)"
  if [[ -f $STATE_ROOT/ckptvault.toml ]] && head -n 1 "$STATE_ROOT/ckptvault.toml" | grep -q "written by infra/local/up.sh"; then
    say "note: $(rel_path "$STATE_ROOT/ckptvault.toml") (an older make up's, prefix local) is no longer served; delete it when done with it"
  fi
fi
export AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY AWS_DEFAULT_REGION=$REGION
export AWS_EC2_METADATA_DISABLED=true
# The bucket (ensure_bucket is idempotent and leaves an existing bucket as it is).
"$PY_BIN" -c '
import sys
from ckptvault.config import load_config
from ckptvault.store import ensure_bucket
ensure_bucket(load_config(sys.argv[1]).store)
' "$CONFIG" || die "could not create the bucket of $CONFIG"

if [[ $MODE == store ]]; then
  cat <<EOF
export CKPTVAULT_CONFIG=$CONFIG
export AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY AWS_DEFAULT_REGION=$REGION
EOF
  exit 0
fi

say "2/4 Prefect server"
rc=0
api_line=$(start_part prefect "$STATE_ROOT/prefect" PREFECT_PORT 4200 | tail -n 1) || rc=$?
((rc == 0)) || DIE_CODE=$rc die "the Prefect server did not start (see above)"
PREFECT_API_URL=${api_line#PREFECT_API_URL=}
PREFECT_UI=${PREFECT_API_URL%/api}

say "3/4 work pool ckptvault, deployments, workers"
WORKER_ARGS=("PREFECT_API_URL=$PREFECT_API_URL" "CKPTVAULT_CONFIG=$CONFIG" "CKPTVAULT_HOME=$REPO_ROOT")
TIER_WORKER=$STATE_ROOT/worker-tier
ROLES_FILE=$STATE_ROOT/roles.env
split=""
if [[ $STORE == seaweedfs ]]; then
  deletes=$("$PY_BIN" -c '
import sys
from ckptvault.config import load_config
print(load_config(sys.argv[1]).store.deletes)
' "$CONFIG") || die "could not read $CONFIG"
  if [[ $deletes == tier-only ]]; then
    split=1
  else
    single_why="$CONFIG has [store] deletes = \"$deletes\", and the ingest role cannot delete; add deletes = \"tier-only\" to its [store] and rerun make up for the two roles"
  fi
else
  single_why="Ceph RGW's users are made with radosgw-admin, not through the S3 port: the two roles are set up on SeaweedFS only"
fi
# A store started before its IAM API was writable (an older seaweedfs.sh, still running) refuses the users:
# then the one worker of before, rather than no stack at all.
if [[ -n $split ]] && ! "$PY_BIN" "$LOCAL_DIR/roles.py" "$CONFIG" "$ROLES_FILE"; then
  split=""
  single_why="the store refused to make the ingest and tier users (above); \`make down && make up\` restarts it with its IAM API writable"
fi
if [[ -n $split ]]; then
  INGEST_ACCESS_KEY=$(grep -E '^INGEST_ACCESS_KEY=' "$ROLES_FILE" | cut -d= -f2)
  INGEST_SECRET_KEY=$(grep -E '^INGEST_SECRET_KEY=' "$ROLES_FILE" | cut -d= -f2)
  TIER_ACCESS_KEY=$(grep -E '^TIER_ACCESS_KEY=' "$ROLES_FILE" | cut -d= -f2)
  TIER_SECRET_KEY=$(grep -E '^TIER_SECRET_KEY=' "$ROLES_FILE" | cut -d= -f2)
  run_at worker "$STATE_ROOT/worker" up "${WORKER_ARGS[@]}" WORK_QUEUE=default \
    "AWS_ACCESS_KEY_ID=$INGEST_ACCESS_KEY" "AWS_SECRET_ACCESS_KEY=$INGEST_SECRET_KEY" ||
    die "the ingest worker did not start (see above)"
  # deployed once, by the ingest worker's `up` just before
  run_at worker "$TIER_WORKER" up "${WORKER_ARGS[@]}" WORK_QUEUE=tier DEPLOY=0 \
    "AWS_ACCESS_KEY_ID=$TIER_ACCESS_KEY" "AWS_SECRET_ACCESS_KEY=$TIER_SECRET_KEY" ||
    die "the tier worker did not start (see above)"
  workers_text="Two workers, one per role (docs/OPERATIONS.md, \"Two roles\"):
  $(rel_path "$STATE_ROOT/worker"): queue default (ingest, drill, watch, restore), key $INGEST_ACCESS_KEY of user ckptvault-ingest,
    which cannot delete anything (no s3:DeleteObject; the config says deletes = \"tier-only\")
  $(rel_path "$TIER_WORKER"): queue tier (tier), key $TIER_ACCESS_KEY of user ckptvault-tier, which may delete under the prefix
  Their keys are in $(rel_path "$ROLES_FILE"); the exports below give this shell the store's admin key."
else
  say "one worker for both queues, with the store's admin key: $single_why"
  # A worker-tier of an earlier `make up` would keep polling the tier queue with its role's key.
  if [[ -f $TIER_WORKER/server ]] && instance_running "$TIER_WORKER"; then
    run_at worker "$TIER_WORKER" down || die "could not stop the tier worker in $(rel_path "$TIER_WORKER")"
  fi
  run_at worker "$STATE_ROOT/worker" up "${WORKER_ARGS[@]}" || die "the worker did not start (see above)"
  workers_text="One worker ($(rel_path "$STATE_ROOT/worker")) runs all seven deployments with the store's admin key
  ($single_why)."
fi

say "4/4 the demo's checkpoints, the simulated trainer, a first ingest"
if [[ -z ${CKPTVAULT_CONFIG:-} ]]; then
  DEMO_DIR=$DEMO_DIR STATE_ROOT=$STATE_ROOT "$PY_BIN" -m ckptvault_cli.demo seed || die "could not write the demo's checkpoints"
  run_at trainer "$STATE_ROOT/trainer" up "HOT=$DEMO_DIR/hot" "EVERY=${TRAINER_EVERY:-180}" "SIZE_MIB=${TRAINER_SIZE_MIB:-8}" \
    "PREFECT_API_URL=$PREFECT_API_URL" "CKPTVAULT_CONFIG=$CONFIG" || die "the simulated trainer did not start (see above)"
  trainer_text="The simulated trainer ($(rel_path "$STATE_ROOT/trainer")) saves live-hf (its hook's event starts an ingest of
  that step) and live-ds (the scheduled ingest finds it) every ${TRAINER_EVERY:-180} s under $(rel_path "$DEMO_DIR/hot")."
else
  trainer_text="No simulated trainer: CKPTVAULT_CONFIG names a config of yours."
fi
# The first ingest now rather than in 10 minutes: the UI shows the archive from the start.
PREFECT_HOME=$STATE_ROOT/worker/home PREFECT_API_URL=$PREFECT_API_URL timeout 60 "$REPO_ROOT/.venv/bin/prefect" \
  --no-prompt deployment run ingest/ingest >/dev/null || say "warning: could not start the first ingest run"
cat <<EOF

ckptvault is up ($((SECONDS - t0)) s): $STORE at $S3_URL ($(rel_path "$STORE_DIR")), Prefect UI at $PREFECT_UI
$workers_text
$trainer_text
The UI's flow runs show the first ingest (the demo's checkpoints); Deployments > restore > Run > Custom run
brings a run back from the archive (docs/prefect-ui.md). For the ckptvault and prefect commands in this shell:

  export PREFECT_API_URL=$PREFECT_API_URL
  export CKPTVAULT_CONFIG=$CONFIG
  export AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY AWS_DEFAULT_REGION=$REGION
  export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false

  .venv/bin/ckptvault ls                                    # the catalog: the demo's runs and the trainer's
  .venv/bin/prefect deployment run ingest/ingest            # or wait: every 10 minutes
  .venv/bin/prefect deployment run restore/restore --param run=llama-8b-hf --param dest=$DEMO_DIR/restored/llama-8b-hf
  .venv/bin/prefect deployment run drill/drill              # or wait: Sundays 05:00 UTC
  make down                                                 # stop every server of this checkout (data is kept)
EOF
