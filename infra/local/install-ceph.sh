#!/usr/bin/env bash
# Install the Debian packages infra/local/ceph.sh needs (Ceph Pacific mon, OSD, RGW, CLI tools, plus
# curl and uuidgen). As root. Idempotent: does nothing when every tool is already on PATH, so CI and
# developers can call it unconditionally. ~70 MB download, ~50 s on a fresh machine.
set -euo pipefail

PACKAGES=(ceph-mon ceph-osd radosgw ceph-common curl uuid-runtime)
# One tool per package; all present means all installed.
TOOLS=(ceph-mon ceph-osd radosgw ceph curl uuidgen)

missing=()
for t in "${TOOLS[@]}"; do
  command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
if ((${#missing[@]} == 0)); then
  echo "install-ceph: already installed ($(radosgw --version 2>/dev/null | head -n 1))"
  exit 0
fi

if ((EUID != 0)); then
  echo "install-ceph: missing ${missing[*]}; run as root (sudo $0)" >&2
  exit 1
fi

echo "install-ceph: missing ${missing[*]}; installing ${PACKAGES[*]}"
# noninteractive: CI has no stdin, and a debconf prompt would hang the run.
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# --no-install-recommends: the recommends pull in mgr modules, python web stacks and more (hundreds of MB)
# that a one-node lab does not use.
apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
echo "install-ceph: installed ($(radosgw --version | head -n 1))"
