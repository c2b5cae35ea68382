#!/usr/bin/env bash
# The servers of this checkout: the demo's (DEMO_DIR, default .demo/) and `make up`'s, hand-started and test
# sessions' (STATE_ROOT, default .state/), each a directory with a `server` file.
#
#   infra/local/instances.sh [list]          one line each: running|stopped, kind, directory, its ports
#   infra/local/instances.sh serving KIND PORT
#       the directory of the instance of KIND that runs, healthy, with PORT as its S3 (or API) port;
#       exit 1 if there is none (test sessions' are not counted: they are theirs alone). `make demo` asks
#       this before it starts a store of its own.
set -euo pipefail
SERVER=instances
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

case ${1:-list} in
  list)
    while IFS= read -r d; do
      kind=$(instance_kind "$d") || continue
      if instance_running "$d"; then state=running; else state=stopped; fi
      ports=$(instance_ports "$d")
      printf '%-8s %-9s %s%s\n' "$state" "$kind" "$(rel_path "$d")" "${ports:+  ports ${ports// /,}}"
    done < <(instance_list)
    ;;
  serving)
    (($# == 3)) || usage_exit
    while IFS= read -r d; do
      [[ $(instance_kind "$d" || true) == "$2" && $(instance_conf "$d" PORT) == "$3" ]] || continue
      [[ $d == "$STATE_ROOT"/test-* ]] && continue # a test session's store is that session's alone
      if run_instance "$d" status >/dev/null 2>&1; then
        echo "$d"
        exit 0
      fi
    done < <(instance_list)
    exit 1
    ;;
  *) usage_exit ;;
esac
