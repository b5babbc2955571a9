#!/usr/bin/env bash
# A real, single-node Slurm on this machine, to try cluster=slurm and to test it.
#   scripts/slurm-local.sh up     install slurm-wlm and munge if missing (Debian/Ubuntu, as root),
#                                 configure one node with this machine's cores, start munged,
#                                 slurmctld and slurmd, wait until the node is idle
#   scripts/slurm-local.sh down   stop the daemons; nothing is left running
#   scripts/slurm-local.sh status
# Exit status 3 with one line when it cannot be done here (not root, no apt-get, daemons fail).
set -euo pipefail
STATE=/var/lib/distrain-slurm
CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)
CPUS=$(nproc)
SLOTS=$(( CPUS * 8 ))  # over-subscribed: a test cluster of a few tasks per core, as cluster=local allows

cannot() { echo "slurm-local: cannot start Slurm here: $*" >&2; exit 3; }

install() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return
  [ "$(id -u)" = 0 ] || cannot "installing slurm-wlm and munge needs root"
  command -v apt-get >/dev/null || cannot "no apt-get to install slurm-wlm and munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
    || cannot "apt-get install slurm-wlm munge failed"
}

configure() {
  mkdir -p "$STATE/ctld" "$STATE/d" /etc/slurm
  cat > "$CONF" <<CONF
# Written by distrain's scripts/slurm-local.sh: one node, for trying and testing cluster=slurm.
ClusterName=distrain
SlurmctldHost=$NODE
AuthType=auth/munge
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
NodeName=$NODE CPUs=$SLOTS State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}

up() {
  [ "$(id -u)" = 0 ] || cannot "the daemons run as root here"
  install
  configure
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    runuser -u munge -- munged 2>/dev/null || munged --force || cannot "munged did not start"
  fi
  pgrep -x slurmctld >/dev/null || slurmctld || cannot "slurmctld did not start (see $STATE/slurmctld.log)"
  pgrep -x slurmd >/dev/null || slurmd || cannot "slurmd did not start (see $STATE/slurmd.log)"
  for _ in $(seq 60); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    case "$state" in idle*|mixed*|allocated*) echo "slurm-local: node $NODE $state, $SLOTS slots"; return;; esac
    scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
    sleep 0.5
  done
  cannot "node $NODE did not become idle (state: ${state:-none}; see $STATE/*.log)"
}

DAEMONS="slurmd slurmctld munged"
running() { for daemon in $DAEMONS; do pgrep -x "$daemon"; done; }

down() {
  for daemon in $DAEMONS; do pkill -x "$daemon" || true; done
  for _ in $(seq 50); do
    [ -z "$(running)" ] && { echo "slurm-local: stopped"; return; }
    sleep 0.2
  done
  for daemon in $DAEMONS; do pkill -9 -x "$daemon" || true; done
  echo "slurm-local: stopped (killed)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) sinfo 2>/dev/null || echo "slurm-local: not running" ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
