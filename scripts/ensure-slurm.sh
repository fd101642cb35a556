#!/bin/sh
# Make sure a one-host Slurm answers (tests and CI call this): Debian's slurmctld + slurmd + munge,
# as root, no systemd.
#   1. install slurmctld, slurmd, slurm-client and munge with apt when missing;
#   2. write /etc/slurm/slurm.conf for this host (one node, one partition) when absent;
#   3. start munged, slurmctld and slurmd when they are not running, and wait until the node is idle.
# Logs: /tmp/rlk-slurm/*.log. Idempotent: a second call with everything up only checks.
set -eu
CONF=/etc/slurm/slurm.conf
LOGS=/tmp/rlk-slurm
mkdir -p "$LOGS"

. "$(cd "$(dirname "$0")" && pwd)/lib/install-missing.sh"
install_missing ensure-slurm slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge

host="$(hostname -s)"
if [ ! -f "$CONF" ] || ! grep -q "^NodeName=$host " "$CONF"; then
    cpus="$(nproc)"
    mem_mb="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
    # linuxproc/none plugins: no cgroup hierarchy to manage without systemd
    cat >"$CONF" <<EOF
# written by rlk-kit scripts/ensure-slurm.sh: a one-host cluster for tests
ClusterName=rlk
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
fi
mkdir -p /var/spool/slurmctld /var/spool/slurmd /run/munge
chown munge:munge /run/munge 2>/dev/null || true

running() { pgrep -x "$1" >/dev/null 2>&1; }
if ! running munged; then
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
    su -s /bin/sh munge -c "munged --log-file=$LOGS/munged.log" 2>/dev/null || munged --force --log-file="$LOGS/munged.log"
fi
running slurmctld || slurmctld
running slurmd || slurmd

i=0
until sinfo -h -N -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; do
    i=$((i + 1))
    if [ "$i" -eq 10 ]; then scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true; fi
    if [ "$i" -ge 60 ]; then
        echo "ensure-slurm: node $host not idle within 60 s; see $LOGS/slurmctld.log and $LOGS/slurmd.log" >&2
        sinfo -N >&2 || true
        exit 1
    fi
    sleep 1
done
echo "ensure-slurm: $(sinfo -V), node $host $(sinfo -h -N -o '%T')" >&2
