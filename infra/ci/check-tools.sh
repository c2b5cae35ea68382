#!/usr/bin/env bash
# The external tools the test suite needs, checked before `make test`: with CI=true a test whose tool
# is missing fails (tests/helpers.py missing_tool), so a machine without one should fail the run at
# once, naming every missing tool and how to get it, not one test at a time 25 minutes later.
#
#   bash infra/ci/check-tools.sh             check; exit 1 naming each missing tool
#   bash infra/ci/check-tools.sh --install   apt-get install the Debian package of each missing tool that
#                                            has one (as root, or through sudo -n), then checkov into a
#                                            virtualenv of its own if it is missing; checks nothing
#
# .ci/run runs both, as phases. Ceph and Chromium have their own install phases there
# (infra/local/install-ceph.sh; Debian's chromium + chromium-driver), so here they are only checked.
set -euo pipefail

# checkov (tests/infra/test_checkov.py) is on PyPI only, and its own pins would downgrade boto3, botocore
# and packaging in .venv: it gets a virtualenv of its own, linked onto PATH. The two directories can be
# moved (tests/infra/test_ci_tools.py installs into a temporary one).
CHECKOV_VERSION=3.3.30
CHECKOV_VENV=${CKPTVAULT_TOOLS_DIR:-/opt/ckptvault-tools}/checkov
CHECKOV_LINK=${CKPTVAULT_BIN_DIR:-/usr/local/bin}/checkov

# name | check (cmd NAME: on PATH; file PATH: executable there, as the test hard-codes it; py CODE: python3
# runs it; tfmirror: the provider mirror tests/infra/test_iam_policy.py looks for) | Debian package, if
# one provides it | how to get it
TOOLS='
make|cmd make|make|apt-get install make (make test)
gcc|cmd gcc|gcc|apt-get install gcc (wheels without a binary build for this platform)
python3 venv|py import ensurepip, venv|python3-venv|apt-get install python3-venv (make test builds .venv with python3 -m venv)
openssl|cmd openssl|openssl|apt-get install openssl (the TLS tests make a self-signed certificate)
setpriv|cmd setpriv|util-linux|apt-get install util-linux (as root, a test drops capabilities with it)
curl|cmd curl|curl|apt-get install curl (infra/local/*.sh poll the servers with it)
uuidgen|cmd uuidgen|uuid-runtime|apt-get install uuid-runtime (infra/local/ceph.sh)
promtool|cmd promtool|prometheus|apt-get install prometheus, Debian'"'"'s (tests/infra/test_prometheus_rules.py runs promtool check rules and promtool test rules)
prometheus|cmd prometheus|prometheus|apt-get install prometheus, Debian'"'"'s (tests/integration/test_prometheus_scrape.py starts the server, tests/prometheus.py)
prometheus-pushgateway|cmd prometheus-pushgateway|prometheus-pushgateway|apt-get install prometheus-pushgateway (tests/integration/test_metrics_cli.py pushes to it)
kubectl|cmd kubectl|kubernetes-client|apt-get install kubernetes-client, Debian'"'"'s kubectl (tests/infra/test_k8s_manifests.py runs kubectl kustomize)
checkov|checkov||bash infra/ci/check-tools.sh --install (a virtualenv with checkov==3.3.30, linked as /usr/local/bin/checkov), or set CKPTVAULT_CHECKOV (tests/infra/test_checkov.py)
terraform|cmd terraform||not in Debian'"'"'s archive nor on PyPI: put HashiCorp'"'"'s terraform (>= 1.5) binary on PATH, e.g. /usr/local/bin (tests/infra/test_iam_policy.py; infra/terraform/README.md)
terraform provider mirror|tfmirror||a directory holding registry.terraform.io/hashicorp/aws, at /opt/tf-plugins or $CKPTVAULT_TF_PLUGIN_DIR: `terraform providers mirror DIR` in infra/terraform, once, where the Terraform registry can be reached (the test initialises offline from it)
ceph-mon|cmd ceph-mon||run infra/local/install-ceph.sh as root (.ci/run does)
ceph-osd|cmd ceph-osd||run infra/local/install-ceph.sh as root (.ci/run does)
radosgw|cmd radosgw||run infra/local/install-ceph.sh as root (.ci/run does)
radosgw-admin|cmd radosgw-admin||run infra/local/install-ceph.sh as root (.ci/run does)
ceph|cmd ceph||run infra/local/install-ceph.sh as root (.ci/run does)
ceph-authtool|cmd ceph-authtool||run infra/local/install-ceph.sh as root (.ci/run does)
monmaptool|cmd monmaptool||run infra/local/install-ceph.sh as root (.ci/run does)
chromium|file /usr/bin/chromium||apt-get install chromium (.ci/run does; the Prefect UI test)
chromedriver|file /usr/bin/chromedriver||apt-get install chromium-driver (.ci/run does; the Prefect UI test)
'

# where NAME's check finds it (printed), or a non-zero status
where() {
  local check=$1 arg d
  arg=${check#* }
  case $check in
    cmd\ *) command -v "$arg" ;;
    file\ *) [[ -x $arg ]] && echo "$arg" ;;
    py\ *) python3 -c "$arg" 2>/dev/null && command -v python3 ;;
    checkov)  # as tests/infra/test_checkov.py finds it
      if [[ -n ${CKPTVAULT_CHECKOV:-} ]]; then
        [[ -x $CKPTVAULT_CHECKOV ]] && echo "$CKPTVAULT_CHECKOV"
      else
        command -v checkov
      fi
      ;;
    tfmirror)
      for d in "${CKPTVAULT_TF_PLUGIN_DIR:-}" /opt/tf-plugins; do
        if [[ -n $d && -d $d/registry.terraform.io/hashicorp/aws ]]; then
          echo "$d"
          return 0
        fi
      done
      return 1
      ;;
    *)
      echo "check-tools: unknown check '$check'" >&2
      return 2
      ;;
  esac
}

install_missing() {
  local name check pkg how pkgs=()
  while IFS='|' read -r name check pkg how; do
    [[ -n $name && -n $pkg ]] || continue
    where "$check" >/dev/null 2>&1 || pkgs+=("$pkg")
  done <<<"$TOOLS"
  local sudo=()
  ((EUID == 0)) || sudo=(sudo -n)
  if ((${#pkgs[@]} == 0)); then
    echo "check-tools: no Debian package to install"
  else
    echo "check-tools: installing ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${pkgs[@]}"
  fi
  # after apt: the virtualenv needs python3-venv, which the line above installs where it is missing
  if where checkov >/dev/null 2>&1; then
    echo "check-tools: checkov is already installed"
  else
    install_checkov "${sudo[@]}"
  fi
}

# A virtualenv with checkov only, and the link to it; rerun over a half-made one, it completes it.
install_checkov() {
  echo "check-tools: installing checkov==$CHECKOV_VERSION in $CHECKOV_VENV"
  "$@" mkdir -p "$(dirname "$CHECKOV_VENV")" "$(dirname "$CHECKOV_LINK")"
  "$@" python3 -m venv "$CHECKOV_VENV"
  "$@" "$CHECKOV_VENV/bin/pip" install -q --disable-pip-version-check "checkov==$CHECKOV_VERSION"
  "$@" ln -sfn "$CHECKOV_VENV/bin/checkov" "$CHECKOV_LINK"
  "$CHECKOV_LINK" --version
}

check_all() {
  local name check pkg how at missing=()
  while IFS='|' read -r name check pkg how; do
    [[ -n $name ]] || continue
    if at=$(where "$check" 2>/dev/null); then
      printf '  ok       %-26s %s\n' "$name" "$at"
    else
      printf '  MISSING  %-26s %s\n' "$name" "$how"
      missing+=("$name")
    fi
  done <<<"$TOOLS"
  if ((${#missing[@]})); then
    printf 'check-tools: %d missing: %s. The tests that need them fail with CI=true; install them (above) and rerun.\n' \
      "${#missing[@]}" "$(IFS=,; echo "${missing[*]}" | sed 's/,/, /g')" >&2
    return 1
  fi
  echo "check-tools: every tool the suite needs is here"
}

case ${1:-} in
  --install) install_missing ;;
  "") check_all ;;
  *)
    echo "usage: $0 [--install]" >&2
    exit 2
    ;;
esac
