#!/usr/bin/env bash
# Single-node Ceph Pacific on 127.0.0.1: 1 mon, 1 OSD (bluestore on a sparse file), 1 RGW, no mgr.
# The on-prem object store of the pipeline suite: custom storage class COLD and real lifecycle
# transitions (rgw_lc_debug_interval makes a lifecycle "day" last LC_DEBUG_INTERVAL seconds).
# Adapted from shared/reference/ceph-rgw-single-node.sh (verified there): same config, plus bounded
# waits, a restart path that keeps the data, PID-based stop, and configurable ports.
#
#   infra/local/ceph.sh up|down|status|clean
#
# Needs the Debian packages (infra/local/install-ceph.sh, as root). Region "default", path-style.
# env: STATE_DIR (default .state/ceph), PORT (RGW S3, default 7480), MON_V2_PORT (PORT+1),
#      MON_V1_PORT (PORT+2), OSD_PORT_MIN/OSD_PORT_MAX (6800/7300: the OSD binds 8 free ports in this
#      range, so instances can share it), ACCESS_KEY, SECRET_KEY, STORE_BYTES (8 GiB sparse file),
#      OBJECTSTORE (bluestore|memstore), LC_DEBUG_INTERVAL (10 s), READY_TIMEOUT (180 s, whole `up`),
#      STOP_TIMEOUT (5 s per daemon).
# Ports, users and keys are fixed when the cluster is created (they are in the monmap and the RGW user);
# `up` on an existing STATE_DIR restarts the daemons on the same data.
set -euo pipefail
SERVER=ceph
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

STATE_DIR=${STATE_DIR:-$REPO_ROOT/.state/ceph}
CONF_VARS=(PORT MON_V2_PORT MON_V1_PORT OSD_PORT_MIN OSD_PORT_MAX ACCESS_KEY SECRET_KEY
  STORE_BYTES OBJECTSTORE LC_DEBUG_INTERVAL)
# Recorded values count only for a cluster that was fully created; a failed bootstrap is redone anyway.
if [[ -f $STATE_DIR/.created ]]; then config_load "${CONF_VARS[@]}"; fi
PORT=${PORT:-7480}
MON_V2_PORT=${MON_V2_PORT:-$((PORT + 1))}
MON_V1_PORT=${MON_V1_PORT:-$((PORT + 2))}
OSD_PORT_MIN=${OSD_PORT_MIN:-6800}
OSD_PORT_MAX=${OSD_PORT_MAX:-7300}
ACCESS_KEY=${ACCESS_KEY:-ckptvault}
SECRET_KEY=${SECRET_KEY:-ckptvault-secret}
STORE_BYTES=${STORE_BYTES:-$((8 * 1024 ** 3))}
OBJECTSTORE=${OBJECTSTORE:-bluestore}
LC_DEBUG_INTERVAL=${LC_DEBUG_INTERVAL:-10}
READY_TIMEOUT=${READY_TIMEOUT:-180}
STOP_TIMEOUT=${STOP_TIMEOUT:-5}

BASE=$STATE_DIR
CONF=$BASE/ceph.conf
URL=http://127.0.0.1:$PORT/
CREATED=$BASE/.created # written last by a successful bootstrap; without it the state is wiped
DAEMONS=(rgw.a osd.0 mon.a) # stop order: clients of the mon first
C=(-c "$CONF")

pidfile() { echo "$BASE/run/$1.fgpid"; }
# The config path is in every daemon's command line: it tells our daemons from another instance's.
alive() { pid_alive "$(pidfile "$1")" "$CONF"; }
all_alive() { alive mon.a && alive osd.0 && alive rgw.a; }
healthy() { all_alive && http_ready "$URL"; }
any_alive() {
  local d
  for d in "${DAEMONS[@]}"; do alive "$d" && return 0; done
  return 1
}
# Every ceph CLI call gets a hard limit: the CLI can block for minutes on a mon that is not there.
ceph_cli() { timeout 20 ceph "${C[@]}" --connect-timeout 5 "$@"; }
new_uuid() { uuidgen 2>/dev/null || cat /proc/sys/kernel/random/uuid; }

mon_up() { ceph_cli mon stat; }
osd_up() { ceph_cli osd stat -f json 2>/dev/null | grep -q '"num_up_osds":1'; }

stop_all() {
  local d
  for d in "${DAEMONS[@]}"; do stop_pid "$(pidfile "$d")" "$CONF" "$STOP_TIMEOUT" || true; done
}

write_conf() {
  cat >"$CONF" <<EOF
[global]
fsid = $FSID
mon_host = [v2:127.0.0.1:$MON_V2_PORT,v1:127.0.0.1:$MON_V1_PORT]
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
keyring = $BASE/keyring
run_dir = $BASE/run
admin_socket = $BASE/run/\$name.asok
pid_file = $BASE/run/\$name.pid
log_file = $BASE/log/\$name.log
mon_cluster_log_file = $BASE/log/cluster.log
crash_dir = $BASE/crash
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
mon_max_pg_per_osd = 1000
mon_mgr_mkfs_grace = 31536000
[mon]
mon_data = $BASE/mon/\$id
mon_data_avail_warn = 1
mon_data_avail_crit = 0
[osd]
osd_data = $BASE/osd/\$id
keyring = $BASE/osd/\$id/keyring
ms_bind_port_min = $OSD_PORT_MIN
ms_bind_port_max = $OSD_PORT_MAX
osd_objectstore = $OBJECTSTORE
memstore_device_bytes = $STORE_BYTES
bluestore_block_path = $BASE/osd/\$id/block.file
bluestore_block_size = $STORE_BYTES
bluestore_block_create = true
bluestore_fsck_on_mount = false
osd_memory_target = 939524096
[client.rgw.a]
keyring = $BASE/rgw/keyring
rgw_data = $BASE/rgw
rgw_frontends = beast endpoint=127.0.0.1:$PORT
rgw_lc_debug_interval = $LC_DEBUG_INTERVAL
rgw_gc_obj_min_wait = 10
rgw_gc_processor_period = 10
EOF
}

start_mon() { start_bg "$(pidfile mon.a)" "$BASE/log/mon.a.out" ceph-mon "${C[@]}" -i a -f; }
start_osd() { start_bg "$(pidfile osd.0)" "$BASE/log/osd.0.out" ceph-osd "${C[@]}" -i 0 -f; }
start_rgw() { start_bg "$(pidfile rgw.a)" "$BASE/log/rgw.a.out" radosgw "${C[@]}" -n client.rgw.a -f; }

# wait_for WHAT CHECK DAEMON: bounded by the one deadline of the whole `up`.
wait_for() { wait_until "$DEADLINE" "$1 (${READY_TIMEOUT}s limit for up)" "$2" "alive $3"; }

bootstrap() {
  # Wipe only the paths we create (never a bare rm -rf of STATE_DIR: it may be mistyped).
  rm -rf "$BASE"/{mon,osd,rgw,run,log,crash,keyring,monmap,ceph.conf,config.env,.created}
  mkdir -p "$BASE"/{mon/a,osd/0,rgw,run,log,crash}
  FSID=$(new_uuid)
  write_conf
  config_save "${CONF_VARS[@]}"

  # keys: mon. + client.admin in one keyring; mon mkfs imports both into its auth db
  ceph-authtool --create-keyring "$BASE/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$BASE/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null

  # monitor
  monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_V2_PORT,v1:127.0.0.1:$MON_V1_PORT]" \
    "$BASE/monmap" >/dev/null
  ceph-mon "${C[@]}" --mkfs -i a --monmap "$BASE/monmap" --keyring "$BASE/keyring" >>"$BASE/log/mon.a.out" 2>&1
  start_mon
  wait_for "mon" mon_up mon.a

  # one OSD
  local osd_uuid osd_key osd_id
  osd_uuid=$(new_uuid)
  osd_key=$(ceph-authtool --gen-print-key)
  echo "{\"cephx_secret\": \"$osd_key\"}" >"$BASE/osd/0/new.json"
  osd_id=$(ceph_cli osd new "$osd_uuid" -i "$BASE/osd/0/new.json")
  [[ $osd_id == 0 ]] || die "expected osd id 0, got '$osd_id'"
  ceph-authtool --create-keyring "$BASE/osd/0/keyring" -n osd.0 --add-key "$osd_key" >/dev/null
  ceph-osd "${C[@]}" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$BASE/log/osd.0.out" 2>&1
  start_osd
  wait_for "osd" osd_up osd.0

  # RGW. 'user create' also creates the default zonegroup/zone (the 'placement add' commands fail
  # with ENOENT if run first). Add the COLD storage class before radosgw starts: a running radosgw
  # only sees placement changes after a restart.
  timeout 60 radosgw-admin "${C[@]}" user create --uid=ckptvault --display-name=ckptvault \
    --access-key="$ACCESS_KEY" --secret="$SECRET_KEY" >/dev/null
  timeout 60 radosgw-admin "${C[@]}" zonegroup placement add --rgw-zonegroup default \
    --placement-id default-placement --storage-class COLD >/dev/null
  timeout 60 radosgw-admin "${C[@]}" zone placement add --rgw-zone default --placement-id default-placement \
    --storage-class COLD --data-pool default.rgw.cold.data >/dev/null
  ceph_cli auth get-or-create client.rgw.a mon 'allow rw' osd 'allow rwx' mgr 'allow rw' \
    -o "$BASE/rgw/keyring"
  start_rgw
  wait_for "rgw S3 on :$PORT" "http_ready $URL" rgw.a
  touch "$CREATED"
}

restart() {
  # Same data, same ports: start whichever daemons are not running, in dependency order.
  mkdir -p "$BASE/run" "$BASE/log"
  alive mon.a || start_mon
  wait_for "mon" mon_up mon.a
  alive osd.0 || start_osd
  wait_for "osd" osd_up osd.0
  alive rgw.a || start_rgw
  wait_for "rgw S3 on :$PORT" "http_ready $URL" rgw.a
}

up_failed() {
  local rc=$?
  ((rc == 0)) && return 0
  LOG_TAIL_LINES=${LOG_TAIL_LINES:-25} log_tail "$BASE"/log/{rgw.a.out,client.rgw.a.log,osd.0.out,osd.0.log,mon.a.out,mon.a.log}
  say "up failed (exit $rc); stopping the daemons it started"
  stop_all
  exit "$rc"
}

up() {
  if healthy; then
    ready_line "$PORT"
    return 0
  fi
  command -v radosgw >/dev/null 2>&1 || die "radosgw not installed; run infra/local/install-ceph.sh as root"
  # Admin sockets live in run/; a unix socket path is limited to 107 bytes.
  ((${#BASE} <= 80)) || die "STATE_DIR is too long for Ceph's admin sockets (${#BASE} > 80 chars): $BASE"
  mkdir -p "$BASE"
  chmod 700 "$BASE"
  echo "$SERVER" >"$BASE/server"
  DEADLINE=$((SECONDS + READY_TIMEOUT))
  if [[ -f $CREATED ]]; then
    if any_alive; then
      say "some daemons are running but S3 does not answer; restarting the missing ones"
    else
      require_ports_free "$PORT" "$MON_V2_PORT" "$MON_V1_PORT"
    fi
    trap up_failed EXIT
    restart
  else
    stop_all # leftovers of a failed bootstrap
    require_ports_free "$PORT" "$MON_V2_PORT" "$MON_V1_PORT"
    trap up_failed EXIT
    bootstrap
  fi
  trap - EXIT
  ready_line "$PORT"
}

status() {
  local d state=()
  for d in "${DAEMONS[@]}"; do
    if alive "$d"; then state+=("$d:$(<"$(pidfile "$d")")"); else state+=("$d:down"); fi
  done
  if healthy; then
    echo "$SERVER: running (${state[*]}), $(ready_line "$PORT"), state $BASE"
  elif any_alive; then
    echo "$SERVER: partly running (${state[*]}); S3 on :$PORT does not answer"
    return 1
  else
    echo "$SERVER: not running (state $BASE)"
    return 3
  fi
}

case ${1:-} in
  up) up ;;
  down) stop_all ;;
  status) status ;;
  clean) stop_all && rm -rf "$BASE" ;;
  *) usage_exit ;;
esac
