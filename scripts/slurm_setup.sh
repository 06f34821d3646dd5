#!/usr/bin/env bash
# slurm_setup.sh — a single-node Slurm cluster for the tests (tests/test_slurm.c):
# Debian's slurm-wlm and munge, this host as the one node with 4 CPUs
# declared, everything (config, state, logs, pid files) under one directory.
#
#   scripts/slurm_setup.sh start   installs slurm-wlm and munge when missing
#                                  (apt-get, as root), writes the config,
#                                  starts munged, slurmctld and slurmd (or
#                                  keeps the ones a previous start left
#                                  running) and waits until `sinfo` shows the
#                                  node idle
#   scripts/slurm_setup.sh stop    stops the daemons this script started
#
# The directory is $EMBER_SLURM_DIR (default /tmp/ember-slurm). After a
# start, DIR/slurm.conf is the config (tests point SLURM_CONF at it) and
# either DIR/ready exists or DIR/unavailable holds, on one line, why the
# cluster could not be started (not root, no apt-get, a daemon that did not
# come up): the test prints that line as its reason to skip. start always
# exits 0, so a machine without Slurm still runs the rest of the suite.
#
# Choices that make it work in a container without systemd or cgroups:
# proctrack/linuxproc and task/none (no cgroup plugins), no accounting,
# SlurmdParameters=config_overrides (the node may have fewer CPUs than the 4
# declared), and ports 16817/16818 so a cluster already on this host (6817)
# is left alone.
set -uo pipefail

dir=${EMBER_SLURM_DIR:-/tmp/ember-slurm}
conf=$dir/slurm.conf

unavailable() {
    mkdir -p "$dir"
    stop # whatever did start (munged before a failing slurmctld) does not stay
    rm -f "$dir/ready"
    echo "$*" >"$dir/unavailable"
    echo "slurm_setup: Slurm tests will skip: $*" >&2
    exit 0
}

# kill_pidfile FILE: stops the daemon whose pid FILE holds, when that pid is
# still the daemon FILE is named after (not another process that got its pid)
kill_pidfile() {
    local f=$1 pid
    [ -f "$f" ] || return 0
    pid=$(cat "$f" 2>/dev/null)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$(basename "$f" .pid)" ]; then
        kill "$pid" 2>/dev/null
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$f"
}

stop() {
    kill_pidfile "$dir/slurmd.pid"
    kill_pidfile "$dir/slurmctld.pid"
    kill_pidfile "$dir/munged.pid"
    rm -f "$dir/ready"
}

node_idle() {
    SLURM_CONF=$conf timeout 5 sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'
}

write_conf() {
    local host
    host=$(hostname -s)
    mkdir -p "$dir/state" "$dir/slurmd"
    cat >"$conf" <<EOF
# written by scripts/slurm_setup.sh: one node (this host), for ember's tests
ClusterName=ember-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/slurmd
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    mkdir -p "$dir"
    rm -f "$dir/unavailable"
    [ "$(id -u)" = 0 ] || unavailable "not root (the daemons are started as root by scripts/slurm_setup.sh)"
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v srun >/dev/null ||
        ! command -v munged >/dev/null; then
        command -v apt-get >/dev/null || unavailable "slurm-wlm and munge are not installed and there is no apt-get"
        echo "slurm_setup: installing slurm-wlm and munge"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge \
            >"$dir/apt.log" 2>&1; then
            apt-get update >>"$dir/apt.log" 2>&1
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge \
                >>"$dir/apt.log" 2>&1 ||
                unavailable "apt-get install slurm-wlm munge failed: $(tail -n 1 "$dir/apt.log")"
        fi
    fi
    write_conf
    if [ -f "$dir/ready" ] && node_idle; then
        echo "slurm_setup: re-using the running cluster ($conf)"
        return 0
    fi
    stop
    # munged with its own socket, key and pid file (the system's is left alone)
    if [ ! -s "$dir/munge.key" ]; then
        dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2>/dev/null
        chmod 400 "$dir/munge.key"
    fi
    mkdir -p "$dir/munge"
    chmod 700 "$dir/munge"
    munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
        --seed-file="$dir/munge/seed" --log-file="$dir/munge/munged.log" >"$dir/munged.out" 2>&1 ||
        unavailable "munged did not start: $(tail -n 1 "$dir/munged.out")"
    slurmctld -c -f "$conf" >"$dir/slurmctld.out" 2>&1 ||
        unavailable "slurmctld did not start: $(tail -n 1 "$dir/slurmctld.out")"
    slurmd -f "$conf" >"$dir/slurmd.out" 2>&1 ||
        unavailable "slurmd did not start: $(tail -n 1 "$dir/slurmd.out")"
    for _ in $(seq 100); do
        if node_idle; then
            touch "$dir/ready"
            echo "slurm_setup: single-node cluster up ($conf)"
            return 0
        fi
        sleep 0.2
    done
    local why
    why=$(SLURM_CONF=$conf timeout 5 sinfo -h -N -o '%t %E' 2>&1 | head -n 1)
    unavailable "the node did not become idle within 20 s (sinfo: ${why:-nothing}; logs in $dir)"
}

case ${1:-} in
start) start ;;
stop) stop ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
