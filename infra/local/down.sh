#!/usr/bin/env bash
# `make down`: stop what `make up` started, in reverse order: the worker (its flow runs with it), the
# Prefect server, the S3 store(s). Each by its recorded PID, SIGTERM then SIGKILL. Data is kept.
#
#   infra/local/down.sh
set -euo pipefail
SERVER=down
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE=$REPO_ROOT/infra/local

rc=0
# Only instances that were ever started (their state dir exists): no noise, no Ceph tooling needed otherwise.
for name in worker prefect seaweedfs ceph; do
  [[ -d $REPO_ROOT/.state/$name ]] || continue
  if env -u STATE_DIR -u PORT bash "$HERE/$name.sh" down; then
    say "$name stopped"
  else
    say "$name: stop failed"
    rc=1
  fi
done
exit "$rc"
