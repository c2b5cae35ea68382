#!/usr/bin/env bash
# `make down`: stop every server this checkout started, and say which: the demo's store (DEMO_DIR, default
# .demo/), `make up`'s worker (its flow runs with it), Prefect server and store (STATE_ROOT, default .state/),
# and any hand-started under STATE_ROOT/* (`STATE_DIR=.state/x infra/local/seaweedfs.sh up`): every
# directory there with a `server` file. The simulated trainer first (its hook would start ingests), then the
# workers, then Dask clusters, then Prefect servers, then the stores; each by its recorded PID (SIGTERM, then
# SIGKILL after STOP_TIMEOUT s, said when used), checked stopped afterwards. Data is kept.
# A test session's servers (STATE_ROOT/test-<kind>-<pytest pid>) are left to that session while it runs.
#
#   infra/local/down.sh [clean]
#
# clean (`make clean`): the same, then delete DEMO_DIR and STATE_ROOT, and only once nothing in them runs:
# a server whose directory is deleted under it keeps running and recreates it. A running test session's
# directory is kept. Exit 1 if anything could not be stopped (and then nothing is deleted).
set -euo pipefail
SERVER=down
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MODE=${1:-down}
case $MODE in
  down | clean) ;;
  *)
    echo "usage: $0 [clean]   (env: DEMO_DIR STATE_ROOT STOP_TIMEOUT; see infra/local/README.md)" >&2
    exit 2
    ;;
esac

mapfile -t all < <(instance_list)
ordered=()
for kind in trainer worker dask prefect; do
  for d in "${all[@]}"; do [[ $(instance_kind "$d" || true) == "$kind" ]] && ordered+=("$d"); done
done
for d in "${all[@]}"; do [[ $(instance_kind "$d" || true) =~ ^(trainer|worker|dask|prefect)$ ]] || ordered+=("$d"); done

stopped=0 failed=0 kept=()
for d in "${ordered[@]}"; do
  if live_test_session "$d"; then
    kept+=("$d")
    continue
  fi
  instance_kind "$d" >/dev/null || continue # not a server we know how to stop
  instance_running "$d" || continue
  desc=$(instance_describe "$d")
  if run_instance "$d" down >&2 && ! instance_running "$d"; then
    say "stopped $desc"
    stopped=$((stopped + 1))
  else
    say "error: could not stop $desc"
    failed=$((failed + 1))
  fi
done
for d in "${kept[@]}"; do
  if instance_running "$d"; then
    say "left running: $(instance_describe "$d"), whose pytest session is still running"
  fi
done
if ((stopped == 0 && failed == 0)); then
  say "nothing of this checkout was running (looked in $(rel_path "$DEMO_DIR") and $(rel_path "$STATE_ROOT"))"
fi
if ((failed > 0)); then
  [[ $MODE == clean ]] && say "not deleting anything while a server runs on its data"
  exit 1
fi
[[ $MODE == clean ]] || exit 0

# Deletion: never a path that holds this checkout or the home directory (DEMO_DIR/STATE_ROOT mistyped).
for root in "$DEMO_DIR" "$STATE_ROOT"; do
  [[ -e $root ]] || continue
  case $REPO_ROOT/ in
    "$root"/*) die "refusing to delete $root: it holds this checkout" ;;
  esac
  if [[ $root == / || $root == "$(realpath -m "${HOME:-/}")" ]]; then die "refusing to delete $root"; fi
  keep=()
  for d in "${kept[@]}"; do [[ $d == "$root"/* ]] && keep+=("$d"); done
  if ((${#keep[@]} == 0)); then
    rm -rf "$root"
    say "deleted $(rel_path "$root")"
  else
    for entry in "$root"/* "$root"/.[!.]*; do
      [[ -e $entry ]] || continue
      for d in "${keep[@]}"; do [[ $entry == "$d" ]] && continue 2; done
      rm -rf "$entry"
    done
    say "deleted $(rel_path "$root") except ${#keep[@]} running test session dir(s): ${keep[*]}"
  fi
done
