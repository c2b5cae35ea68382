#!/usr/bin/env bash
# `make up`: everything ckptvault needs on one machine, started in order, each with a readiness wait and a
# time limit: the S3 store (SeaweedFS by default, STORE=ceph for Ceph RGW), a Prefect server (SQLite, UI),
# the `ckptvault` process work pool with the five deployments, and one worker. Idempotent: what already
# runs healthy is left as it is. `make down` (down.sh) stops them all; data and the database are kept
# (`infra/local/<name>.sh clean` deletes one).
#
#   infra/local/up.sh
#
# env: STORE (seaweedfs|ceph), STORE_PORT (the store's S3 port; default its script's: 8333 / 7480),
#      PREFECT_PORT (4200), CKPTVAULT_CONFIG (default .state/ckptvault.toml, written on first `up` for the
#      local store: bucket `ckpts`, one source `local` at .state/hot/local, format auto), BUCKET (ckpts).
# State: .state/<store>/, .state/prefect/, .state/worker/ (each script's default STATE_DIR).
set -euo pipefail
SERVER=up
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE=$REPO_ROOT/infra/local

STORE=${STORE:-seaweedfs}
PREFECT_PORT=${PREFECT_PORT:-4200}
BUCKET=${BUCKET:-ckpts}
CONFIG=${CKPTVAULT_CONFIG:-$REPO_ROOT/.state/ckptvault.toml}
case $STORE in
  seaweedfs | ceph) ;;
  *) die "STORE=$STORE is not known: seaweedfs (default) or ceph" ;;
esac
export DO_NOT_TRACK=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false

# run_script NAME ACTION [VAR=VALUE...]: one of our scripts with its default STATE_DIR, whatever the caller
# exported (a stray PORT or STATE_DIR must not move the servers that `make down` will look for).
run_script() {
  local name=$1 action=$2
  shift 2
  env -u STATE_DIR -u PORT -u READY_TIMEOUT "$@" bash "$HERE/$name.sh" "$action"
}

t0=$SECONDS
say "1/3 S3 store: $STORE"
store_env=()
[[ -n ${STORE_PORT:-} ]] && store_env+=("PORT=$STORE_PORT")
store_line=$(run_script "$STORE" up "${store_env[@]}") || die "the $STORE store did not start (see above)"
echo "$store_line"
# The endpoint, keys and region this store instance was created with.
S3_URL=${store_line##* }
store_conf=$REPO_ROOT/.state/$STORE/config.env
ACCESS_KEY=$(grep -E '^ACCESS_KEY=' "$store_conf" | tail -n 1 | cut -d= -f2-)
SECRET_KEY=$(grep -E '^SECRET_KEY=' "$store_conf" | tail -n 1 | cut -d= -f2-)
if [[ $STORE == ceph ]]; then REGION=default; else REGION=us-east-1; fi

say "2/3 Prefect server on 127.0.0.1:$PREFECT_PORT"
api_line=$(run_script prefect up "PORT=$PREFECT_PORT" | tail -n 1) || die "the Prefect server did not start (see above)"
PREFECT_API_URL=${api_line#PREFECT_API_URL=}

if [[ ! -f $CONFIG ]]; then
  mkdir -p "$(dirname "$CONFIG")" "$REPO_ROOT/.state/hot/local" "$REPO_ROOT/.state/drill-scratch"
  cat >"$CONFIG" <<EOF
# written by infra/local/up.sh for the local $STORE store; edit freely (it is not rewritten)
[store]
bucket = "$BUCKET"
prefix = "local"
endpoint_url = "$S3_URL"
region = "$REGION"

[[sources]]
run = "local"
path = "$REPO_ROOT/.state/hot/local"
format = "auto"
settle_seconds = 60

[drill]
scratch = "$REPO_ROOT/.state/drill-scratch"
EOF
  say "wrote $CONFIG (one source: .state/hot/local)"
fi

export AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY AWS_DEFAULT_REGION=$REGION
export AWS_EC2_METADATA_DISABLED=true
# The bucket, with the rules ingest expects (ensure_bucket is idempotent).
"$REPO_ROOT/.venv/bin/python" -c '
import sys
from ckptvault.config import load_config
from ckptvault.store import ensure_bucket
ensure_bucket(load_config(sys.argv[1]).store)
' "$CONFIG" || die "could not create the bucket of $CONFIG"

say "3/3 work pool ckptvault, deployments, worker"
run_script worker up "PREFECT_API_URL=$PREFECT_API_URL" "CKPTVAULT_CONFIG=$CONFIG" "CKPTVAULT_HOME=$REPO_ROOT" ||
  die "the worker did not start (see above)"

cat <<EOF

ckptvault is up ($((SECONDS - t0)) s): $STORE at $S3_URL, Prefect UI at http://127.0.0.1:$PREFECT_PORT
For the ckptvault and prefect commands in this shell:

  export PREFECT_API_URL=$PREFECT_API_URL
  export CKPTVAULT_CONFIG=$CONFIG
  export AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY AWS_DEFAULT_REGION=$REGION
  export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false

  prefect deployment run ingest/ingest            # or wait: every 10 minutes
  prefect deployment run restore/restore --param run=local --param dest=/tmp/restored
  make down                                       # stop the worker, the server and the store
EOF
