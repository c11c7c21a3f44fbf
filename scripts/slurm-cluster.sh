#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine, for the tests and for trying `--backend slurm`:
#
#   scripts/slurm-cluster.sh start    install (Debian packages) if needed, configure, start
#   scripts/slurm-cluster.sh status   daemons, nodes and queue
#   scripts/slurm-cluster.sh stop     cancel this cluster's jobs and stop every daemon it started
#
# One controller (slurmctld), two compute nodes `node1` and `node2` (two slurmd on localhost, each with
# 4 CPUs and 4 GPUs declared through GRES, backed by empty placeholder files: no CUDA device exists,
# jobs just get the allocation) in partition `debug`, and accounting (slurmdbd + a private MariaDB) so
# that `sacct` and job states are real. The GPUs are of two types, 2 of type `a` (devices 0-1) and 2 of
# type `b` (devices 2-3) on each node, so that `--gres=gpu:a:N` and `launch probe --instance-types a,b`
# pick GPUs by type on one node and on two, while an untyped `--gpus-per-node=N` takes any of the 4.
# Needs root (Slurm's daemons, /etc/slurm) and apt for the first install; exits 3 with the reason when
# this machine cannot run it (the tests then skip with it).
# Verified configuration and traps: see the comments below (from shared/recipes/slurm-local-cluster.md).
#
# Everything lives under $SCALELAB_SLURM_DIR (default /tmp/scalelab-slurm); the configuration is written
# to /etc/slurm/slurm.conf (where Slurm's clients look) only if that file is absent or was written here.
set -euo pipefail

BASE=${SCALELAB_SLURM_DIR:-/tmp/scalelab-slurm}
CONF_DIR=/etc/slurm
MARK="# written by scalelab scripts/slurm-cluster.sh"
NODES=(node1 node2)
GPU_TYPES=(a b)   # GPUS_PER_TYPE of each type on every node
GPUS_PER_TYPE=2
GPUS=$(( ${#GPU_TYPES[@]} * GPUS_PER_TYPE ))
CPUS=4
CTLD_PORT=${SCALELAB_SLURM_PORT:-6817}      # slurmctld; slurmd ports follow, slurmdbd and MariaDB after
DBD_PORT=$((CTLD_PORT + 12))
DB_PORT=$((CTLD_PORT + 13))

die() { echo "slurm-cluster: $*" >&2; exit "${2:-1}"; }
cannot() { echo "slurm-cluster: cannot run a Slurm cluster on this machine: $*" >&2; exit 3; }
say() { echo "slurm-cluster: $*"; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ---- install -------------------------------------------------------------------------------------

install_packages() {
  local missing=()
  for bin in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge slurmdbd:slurmdbd \
             mariadbd:mariadb-server; do
    command -v "${bin%%:*}" >/dev/null 2>&1 || missing+=("${bin##*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || cannot "Slurm is not installed (${missing[*]}) and installing it needs root"
  command -v apt-get >/dev/null || cannot "Slurm is not installed and there is no apt-get (install slurm-wlm, slurmdbd, munge, mariadb-server)"
  say "installing ${missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -q slurm-wlm slurmdbd munge mariadb-server; } >"$BASE/apt.log" 2>&1 \
    || cannot "apt-get install slurm-wlm slurmdbd munge mariadb-server failed (see $BASE/apt.log)"
}

# ---- configuration -------------------------------------------------------------------------------

write_config() {
  mkdir -p "$BASE"/{state,spool,run,log,dev} "$CONF_DIR"
  if [ -f "$CONF_DIR/slurm.conf" ] && ! grep -qF "$MARK" "$CONF_DIR/slurm.conf"; then
    cannot "$CONF_DIR/slurm.conf exists and was not written by this script (a real Slurm installation?); not touching it"
  fi
  local nodes_line="" gres_lines="" port=$CTLD_PORT name gres t first
  for name in "${NODES[@]}"; do
    port=$((port + 1))
    mkdir -p "$BASE/dev/$name"
    for i in $(seq 0 $((GPUS - 1))); do : >"$BASE/dev/$name/nvidia$i"; done
    gres="" first=0
    for t in "${GPU_TYPES[@]}"; do
      gres+="${gres:+,}gpu:$t:$GPUS_PER_TYPE"
      # GRES needs File=, else slurmd reports 0 GPUs and the node is drained (recipe); one line per type.
      gres_lines+="NodeName=$name Name=gpu Type=$t File=$BASE/dev/$name/nvidia[$first-$((first + GPUS_PER_TYPE - 1))]"$'\n'
      first=$((first + GPUS_PER_TYPE))
    done
    # Two slurmd share this host: NodeHostname/NodeAddr localhost, each its own Port (recipe).
    nodes_line+="NodeName=$name NodeHostname=localhost NodeAddr=127.0.0.1 Port=$port CPUs=$CPUS RealMemory=8000 Gres=$gres State=UNKNOWN"$'\n'
  done
  cat >"$CONF_DIR/slurm.conf" <<EOF
$MARK
ClusterName=scalelab
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
# No cgroups here: track processes through /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Nodes declare more CPUs than this machine has (2 cores): allowed only with config_overrides.
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
GresTypes=gpu
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# Typed GPUs accounted per type too: sacct's AllocTRES then says gres/gpu:a=N.
AccountingStorageTRES=gres/gpu$(printf ',gres/gpu:%s' "${GPU_TYPES[@]}")
JobCompType=jobcomp/none
${nodes_line}PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP
EOF
  printf '%s\n%s' "$MARK" "$gres_lines" >"$CONF_DIR/gres.conf"
  cat >"$CONF_DIR/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$BASE/run/slurmdbd.pid
LogFile=$BASE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=scalelab
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$CONF_DIR/slurmdbd.conf"  # slurmdbd refuses a world-readable config
}

# ---- daemons -------------------------------------------------------------------------------------

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  [ -f /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key -f; }
  # --force: munged complains about log-file ownership when run this way (harmless, recipe).
  munged --force --pid-file="$BASE/run/munged.pid" 2>>"$BASE/log/munged.err" || cannot "munged does not start (see $BASE/log/munged.err)"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
  cannot "munge does not authenticate (munge -n | unmunge fails)"
}

start_mariadb() {
  local data="$BASE/mysql"
  pid_alive "$BASE/run/mariadb.pid" && return 0
  if [ ! -d "$data/mysql" ]; then
    mariadb-install-db --user=root --datadir="$data" --auth-root-authentication-method=socket \
      >"$BASE/log/mariadb-install.log" 2>&1 || cannot "mariadb-install-db failed (see $BASE/log/mariadb-install.log)"
  fi
  mariadbd --user=root --datadir="$data" --socket="$BASE/run/mariadb.sock" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --pid-file="$BASE/run/mariadb.pid" --log-error="$BASE/log/mariadb.log" \
    --innodb-buffer-pool-size=64M --skip-log-bin >/dev/null 2>&1 &
  for _ in $(seq 100); do
    mariadb --socket="$BASE/run/mariadb.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2
  done
  mariadb --socket="$BASE/run/mariadb.sock" >/dev/null 2>>"$BASE/log/mariadb.log" <<'EOF' || cannot "MariaDB did not start (see $BASE/log/mariadb.log)"
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'scalelab';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'scalelab';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
}

start_slurmdbd() {
  pid_alive "$BASE/run/slurmdbd.pid" && return 0
  slurmdbd >>"$BASE/log/slurmdbd.err" 2>&1 || cannot "slurmdbd does not start (see $BASE/log/slurmdbd.log)"
  for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
  sacctmgr -n list cluster >/dev/null 2>&1 || cannot "slurmdbd does not answer (see $BASE/log/slurmdbd.log)"
  sacctmgr -n list cluster format=cluster%30 | grep -qw scalelab || sacctmgr -i add cluster scalelab >/dev/null
}

start_slurm() {
  pid_alive "$BASE/run/slurmctld.pid" || slurmctld >>"$BASE/log/slurmctld.err" 2>&1 \
    || cannot "slurmctld does not start (see $BASE/log/slurmctld.log)"
  local name
  for name in "${NODES[@]}"; do
    pid_alive "$BASE/run/slurmd-$name.pid" || slurmd -N "$name" >>"$BASE/log/slurmd-$name.err" 2>&1 \
      || cannot "slurmd $name does not start (see $BASE/log/slurmd-$name.log)"
  done
  # Nodes drained by an earlier unclean stop come back.
  for _ in $(seq 150); do
    local states
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
    if [ "$(echo "$states" | grep -cE ' (idle|mix|alloc)$')" -eq ${#NODES[@]} ]; then
      say "up: nodes $(echo "$states" | tr '\n' ' ')(partition debug, ${GPUS} GPUs each: ${GPUS_PER_TYPE} of each type ${GPU_TYPES[*]}; accounting on)"
      return 0
    fi
    if echo "$states" | grep -qE ' (drain|down|inval|drng)\*?$'; then
      scontrol update nodename="$(IFS=,; echo "${NODES[*]}")" state=resume >/dev/null 2>&1 || true
    fi
    sleep 0.2
  done
  die "nodes did not become idle: $(sinfo -N -o '%N %t %E' 2>&1 | tr '\n' ';') (see $BASE/log/)"
}

cmd_start() {
  mkdir -p "$BASE"
  [ "$(uname -s)" = Linux ] || cannot "Slurm needs Linux"
  install_packages
  [ "$(id -u)" -eq 0 ] || cannot "the test cluster's daemons run as root (SlurmUser=root); run as root"
  write_config
  mkdir -p "$BASE/log" "$BASE/run"
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurm
}

stop_pidfile() {  # stop the process whose pid file is $1 (it was started here), SIGKILL after 10 s
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

cmd_stop() {
  if [ -f "$CONF_DIR/slurm.conf" ] && grep -qF "$MARK" "$CONF_DIR/slurm.conf" && pid_alive "$BASE/run/slurmctld.pid"; then
    scancel --full --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true  # this cluster's jobs only
    scontrol shutdown >/dev/null 2>&1 || true  # stops slurmctld and every slurmd (recipe)
  fi
  local name
  for _ in $(seq 50); do
    pid_alive "$BASE/run/slurmctld.pid" || break; sleep 0.2
  done
  stop_pidfile "$BASE/run/slurmctld.pid"
  for name in "${NODES[@]}"; do stop_pidfile "$BASE/run/slurmd-$name.pid"; done
  stop_pidfile "$BASE/run/slurmdbd.pid"
  stop_pidfile "$BASE/run/mariadb.pid"
  stop_pidfile "$BASE/run/munged.pid"  # only a munged started here has its pid file here
  say "stopped"
}

cmd_status() {
  local d ok=0
  for d in slurmctld slurmd-node1 slurmd-node2 slurmdbd mariadb munged; do
    if pid_alive "$BASE/run/$d.pid"; then echo "$d: running (pid $(cat "$BASE/run/$d.pid"))"; else echo "$d: stopped"; ok=1; fi
  done
  if [ $ok -eq 0 ]; then sinfo -N -o '%N %P %t %c %G' && squeue; fi
  return $ok
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
