#!/usr/bin/env bash
# A single-node Slurm of a test's own, for jobs started with `srun` (tests of the Rust
# crates and of the Python package use it alike).
#
#   tests/slurm-single-node.sh start DIR   # munged, slurmctld, slurmd in DIR; prints
#                                          # the slurm.conf to export as SLURM_CONF
#   tests/slurm-single-node.sh stop DIR    # stops them and removes DIR
#
# Needs root and Debian's slurmd, slurmctld, slurm-client and munge. Everything lives in
# DIR (a new directory): the munge key and socket, the configuration on ports that were
# free, state, spool and logs; nothing of the machine's own Slurm or munge is touched.
# `start` fails with one line saying why (and the daemons' logs) when it cannot.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

stop() {
    for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
}

if [ "$cmd" = stop ]; then
    stop
    exit 0
fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

fail() {
    echo "slurm-single-node: $*" >&2
    for log in "$dir"/log/*; do
        [ -f "$log" ] && { echo "--- $log" >&2; tail -n 15 "$log" >&2; }
    done
    stop
    exit 1
}

[ "$(id -u)" -eq 0 ] || { echo "slurm-single-node: needs root" >&2; exit 1; }
PATH=$PATH:/usr/sbin:/sbin
for tool in munged slurmctld slurmd srun sinfo; do
    command -v "$tool" >/dev/null || {
        echo "slurm-single-node: $tool is not installed (apt-get install slurmd slurmctld slurm-client munge)" >&2
        exit 1
    }
done
mkdir "$dir" || { echo "slurm-single-node: cannot create $dir (it must not exist)" >&2; exit 1; }
chmod 700 "$dir"
mkdir -p "$dir/spool" "$dir/state" "$dir/log"
head -c 1024 /dev/urandom >"$dir/munge.key"
chmod 600 "$dir/munge.key"

# munged detaches once its socket is ready.
munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
    --log-file="$dir/log/munged.log" --pid-file="$dir/munged.pid" \
    --seed-file="$dir/munged.seed" || fail "munged did not start"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
host=$(hostname -s)
cpus=$(nproc)
cat >"$dir/slurm.conf" <<EOF
ClusterName=quivertest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=quiver Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$dir/slurm.conf
# Both daemons fork into the background and write their pid files.
slurmctld -i -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 600); do
    [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && { echo "$SLURM_CONF"; exit 0; }
    sleep 0.1
done
fail "the node did not become idle within 60 s"
