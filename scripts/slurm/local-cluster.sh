#!/bin/bash
# scripts/slurm/local-cluster.sh - a one-node Slurm on this machine, for the tests (test/test_slurm.py)
# and for trying the batch scripts of scripts/slurm/ by hand.
#   scripts/slurm/local-cluster.sh start DIR   # munged, slurmctld, slurmd (as root, no systemd)
#   scripts/slurm/local-cluster.sh stop DIR    # stops what start started (the pids in DIR)
#   scripts/slurm/local-cluster.sh env DIR     # the line to source: export SLURM_CONF=...
# Needs Debian's slurmctld, slurmd, slurm-client and munge (scripts/install-deps.sh test installs
# them where it runs as root). Everything lives under DIR: slurm.conf, state, spool, logs, munge's
# socket. The node is this machine (NodeName = hostname -s, address 127.0.0.1) with all its CPUs and
# no GPUs (docs/slurm.md, "On a node without GPUs").
#
# Short waits, so that a test sees a requeue within seconds: AuthInfo=cred_expire=10 (a requeued
# batch job becomes eligible cred_expire + 1 s after its requeue; 120 s by default), KillWait=5
# (SIGTERM to SIGKILL at a time limit or scancel; 30 s by default), MessageTimeout/SchedulerParameters
# left at their defaults otherwise. WLB_SLURM_PORT (default 6917) is slurmctld's port, slurmd's the
# next one; munged gets its own socket in DIR, so a system munged is not touched. WLB_SLURM_CPUS
# (default: nproc) is the CPUs the node offers (config_overrides: more than the machine has lets
# several small test jobs run at once).
set -euo pipefail
cmd=${1:?usage: local-cluster.sh start|stop|env DIR}
dir=${2:?usage: local-cluster.sh start|stop|env DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
port=${WLB_SLURM_PORT:-6917}
node=$(hostname -s)
conf=$dir/slurm.conf
sock=$dir/munge/munge.socket

stop_pid() { # name: the daemon whose pid is in $dir/NAME.pid, TERM, then KILL after 5 s
    local f=$dir/$1.pid pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

case $cmd in
env)
    echo "export SLURM_CONF=$conf"
    ;;
stop)
    stop_pid slurmd
    stop_pid slurmctld
    stop_pid munged
    ;;
start)
    [ "$(id -u)" -eq 0 ] || { echo "local-cluster.sh: needs root (slurmd starts jobs as their users)" >&2; exit 2; }
    for prog in munged slurmctld slurmd sbatch; do
        command -v "$prog" > /dev/null || { echo "local-cluster.sh: no $prog (apt-get install slurmctld slurmd slurm-client munge)" >&2; exit 2; }
    done
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge" "$dir/log"
    chmod 700 "$dir/munge"
    [ -s "$dir/munge/munge.key" ] || { dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none; chmod 600 "$dir/munge/munge.key"; }
    cpus=${WLB_SLURM_CPUS:-$(nproc)}
    cat > "$conf" <<CONF
# written by scripts/slurm/local-cluster.sh: a one-node cluster for tests
ClusterName=wlbtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
MessageTimeout=10
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    export SLURM_CONF=$conf
    munged --force --socket="$sock" --key-file="$dir/munge/munge.key" --pid-file="$dir/munged.pid" \
           --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munge.seed"
    slurmctld -i -f "$conf"
    slurmd -f "$conf"
    for _ in $(seq 150); do
        state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
        case $state in idle|mix|alloc) echo "local-cluster.sh: node $node $state ($conf)"; exit 0 ;; esac
        sleep 0.2
    done
    echo "local-cluster.sh: node $node not idle after 30 s (state '${state:-}'); logs in $dir/log" >&2
    tail -5 "$dir/log/"*.log >&2 || true
    exit 1
    ;;
*)
    echo "local-cluster.sh: unknown command $cmd (start, stop, env)" >&2
    exit 2
    ;;
esac
