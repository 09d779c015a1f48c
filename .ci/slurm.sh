#!/usr/bin/env bash
# A real SLURM on this one machine, for tests and CI: munge + slurmctld + slurmd.
#
#   .ci/slurm.sh install   install what is missing (apt-get), start nothing.
#   .ci/slurm.sh [start]   install (apt-get) what is missing, configure, start the
#                          daemons; idempotent (a second call reuses what runs).
#                          The last line it prints is the path of its pids file.
#   .ci/slurm.sh stop      kill the daemons this script started, by the pids in
#                          that file (TERM, then KILL after 10 s), nothing else.
#   .ci/slurm.sh status    the pids file and sinfo.
#
# Environment:
#   DPSCALE_SLURM_STATE      state folder: pids, logs, spool (default /tmp/dpscale-slurm)
#   DPSCALE_SLURM_NODES      compute nodes to emulate (default 2). N > 1 runs N slurmd
#                            on this machine (`slurmd -N nodeI`, ports 6818..), so a job
#                            can span nodes and `srun` starts one task on each.
#   DPSCALE_SLURM_FAKE_GPUS  GPUs declared per node (default 2). Bookkeeping only: each
#                            is a character device cloned from /dev/null, so --gpus and
#                            --gres are scheduled and CUDA_VISIBLE_DEVICES is set.
#   DPSCALE_SLURM_PARTITION  the one partition's name (default gpu, as profiles/slurm).
#   DPSCALE_SLURM_CPUS, DPSCALE_SLURM_MEM_MB
#                            CPUs and memory each node declares (default 16 and 131072,
#                            a GPU node's shape, so profiles/slurm's 8 CPUs per GPU and
#                            4 GB per CPU are schedulable). Declared, not real: slurmd runs
#                            with config_overrides and nothing confines a job (task/none).
#
# Needs root (not root: it runs itself again through `sudo -n`, keeping the
# DPSCALE_SLURM_* settings): it writes /etc/slurm/slurm.conf (and gres.conf), where sbatch, srun
# and squeue look by default (the executor's job steps drop SLURM_* variables, so
# SLURM_CONF would not reach a nested srun). It refuses to overwrite a slurm.conf
# it did not write. Debian 12: slurmctld slurmd slurm-client munge (Slurm 22.05.8,
# munge 0.5.15). No accounting database: `sacct` knows no jobs, use squeue.
set -euo pipefail

STATE=${DPSCALE_SLURM_STATE:-/tmp/dpscale-slurm}
PIDS=$STATE/pids
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
GRES=$CONF_DIR/gres.conf
MARK="# written by dpscale .ci/slurm.sh"
PARTITION=${DPSCALE_SLURM_PARTITION:-gpu}
NODES=${DPSCALE_SLURM_NODES:-2}
FAKE_GPUS=${DPSCALE_SLURM_FAKE_GPUS:-2}
CPUS=${DPSCALE_SLURM_CPUS:-16}
MEM_MB=${DPSCALE_SLURM_MEM_MB:-131072}

log() { echo "[slurm.sh] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

recorded_pid() {  # name -> its pid, if recorded, alive and still that daemon
    [ -f "$PIDS" ] || return 0
    local pid comm
    pid=$(awk -v n="$1" '$1 == n {print $2}' "$PIDS" | tail -n1)
    alive "$pid" || return 0
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    # a recycled pid is not ours: slurmd-node1 -> slurmd, munged -> munged
    if [ "$comm" = "${1%%-*}" ]; then echo "$pid"; fi
}

forget() {  # name
    [ -f "$PIDS" ] || return 0
    grep -v "^$1 " "$PIDS" > "$PIDS.tmp" || true
    mv "$PIDS.tmp" "$PIDS"
}

record() {  # name pid
    touch "$PIDS"
    forget "$1"
    echo "$1 $2" >> "$PIDS"
}

wait_pidfile() {  # file seconds -> pid of a live process
    local f=$1 _
    for _ in $(seq $(( $2 * 10 ))); do
        if [ -s "$f" ] && alive "$(cat "$f")"; then cat "$f"; return 0; fi
        sleep 0.1
    done
    return 1
}

node_names() {  # the slurm node names, one a line
    if [ "$NODES" -eq 1 ]; then hostname -s; else seq -f "node%g" 1 "$NODES"; fi
}

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]} with apt-get (log: $STATE/apt.log)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$STATE/apt.log" 2>&1; then
        apt-get update -qq >>"$STATE/apt.log" 2>&1 || true
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$STATE/apt.log" 2>&1 \
            || die "apt-get install ${missing[*]} failed; see $STATE/apt.log"
    fi
}

start_munge() {
    local pid
    pid=$(recorded_pid munged)
    if [ -z "$pid" ] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munged is already running (not started by this script: left alone)"
        return 0
    fi
    if [ -z "$pid" ]; then
        if [ ! -s /etc/munge/munge.key ]; then
            log "creating /etc/munge/munge.key"
            mkdir -p /etc/munge
            if command -v mungekey >/dev/null; then mungekey --create --force
            else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
            chown munge:munge /etc/munge/munge.key
            chmod 400 /etc/munge/munge.key
        fi
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown munge:munge /run/munge /var/log/munge /var/lib/munge
        chmod 755 /run/munge
        rm -f /run/munge/munged.pid
        runuser -u munge -- munged --force
        pid=$(wait_pidfile /run/munge/munged.pid 10) \
            || die "munged did not start (see /var/log/munge/munged.log)"
        record munged "$pid"
        log "munged started, pid $pid"
    fi
    munge -n | unmunge >/dev/null || die "munge credentials do not verify (munge -n | unmunge)"
}

# Write slurm.conf and gres.conf; return 0 when either changed, 1 when not.
write_conf() {
    local host hw names gres_types="" gres_line="" i name port changed=1
    host=$(hostname -s)
    hw="CPUs=$CPUS RealMemory=$MEM_MB"   # declared (config_overrides), see the header
    mkdir -p "$STATE/spool/ctld" "$STATE/log" "$CONF_DIR"
    if [ "$FAKE_GPUS" -gt 0 ]; then
        # slurmd drops a GPU without a device file: each one gets a character
        # device cloned from /dev/null (major 1, minor 3)
        mkdir -p "$STATE/dev"
        for i in $(seq 0 $(( FAKE_GPUS - 1 ))); do
            [ -c "$STATE/dev/gpu$i" ] || mknod "$STATE/dev/gpu$i" c 1 3 2>/dev/null || {
                log "cannot mknod $STATE/dev/gpu$i: declaring no GPUs"; FAKE_GPUS=0; break; }
        done
    fi
    if [ "$FAKE_GPUS" -gt 0 ]; then
        gres_types="GresTypes=gpu"
        gres_line=" Gres=gpu:$FAKE_GPUS"
    fi
    names=$(node_names | paste -sd, -)
    {
        echo "$MARK (state in $STATE). Delete it to give /etc/slurm back to the package."
        cat <<EOF
ClusterName=dpscale
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
# the nodes' CPUs and memory are the declared ones, not the hardware's
SlurmdParameters=config_overrides
# finished jobs stay visible to squeue for 10 minutes: with no accounting
# database, squeue is how the executor learns that a job ended
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldPort=6817
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d-%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
$gres_types
EOF
        i=0
        for name in $(node_names); do
            port=$(( 6818 + i )); i=$(( i + 1 ))
            echo "NodeName=$name NodeHostname=$host NodeAddr=127.0.0.1 Port=$port $hw$gres_line State=UNKNOWN"
        done
        echo "PartitionName=$PARTITION Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    } > "$CONF.new"
    if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.new"; then rm -f "$CONF.new"
    else mv "$CONF.new" "$CONF"; log "wrote $CONF"; changed=0; fi
    if [ "$FAKE_GPUS" -gt 0 ]; then
        { echo "$MARK"; echo "NodeName=$names Name=gpu File=$STATE/dev/gpu[0-$(( FAKE_GPUS - 1 ))]"; } > "$GRES.new"
        if [ -f "$GRES" ] && cmp -s "$GRES" "$GRES.new"; then rm -f "$GRES.new"
        else mv "$GRES.new" "$GRES"; log "wrote $GRES"; changed=0; fi
    elif [ -f "$GRES" ]; then
        rm -f "$GRES"; changed=0
    fi
    return $changed
}

start_slurm() {
    install_packages
    start_munge
    local f
    for f in "$CONF" "$GRES"; do
        if [ -f "$f" ] && ! grep -q "^$MARK" "$f"; then
            die "$f exists and was not written by this script; move it away first (this script is for throwaway machines and CI)"
        fi
    done
    local changed=0 running=0 name pid
    write_conf && changed=1
    for name in slurmctld $(node_names | sed 's/^/slurmd-/'); do
        [ -n "$(recorded_pid "$name")" ] && running=1
    done
    if [ "$changed" = 1 ] && [ "$running" = 1 ]; then
        log "configuration changed: restarting the SLURM daemons"
        stop_slurm_daemons
    fi
    # daemons of an older layout (another DPSCALE_SLURM_NODES) are stopped too
    if [ -f "$PIDS" ]; then
        for name in $(awk '$1 ~ /^slurmd-/ {print $1}' "$PIDS"); do
            node_names | sed 's/^/slurmd-/' | grep -qx "$name" || stop_pids "$name"
        done
    fi
    if [ -z "$(recorded_pid slurmctld)" ]; then
        rm -f "$STATE/slurmctld.pid"
        slurmctld -i        # daemonises; -i: ignore job/node state an earlier run left
        pid=$(wait_pidfile "$STATE/slurmctld.pid" 20) \
            || die "slurmctld did not start: $(tail -n 20 "$STATE/log/slurmctld.log" 2>/dev/null)"
        record slurmctld "$pid"
        log "slurmctld started, pid $pid"
    fi
    for name in $(node_names); do
        [ -n "$(recorded_pid "slurmd-$name")" ] && continue
        rm -f "$STATE/slurmd-$name.pid"
        mkdir -p "$STATE/spool/d-$name"
        if [ "$NODES" -eq 1 ]; then slurmd; else slurmd -N "$name"; fi
        pid=$(wait_pidfile "$STATE/slurmd-$name.pid" 20) \
            || die "slurmd $name did not start: $(tail -n 20 "$STATE/log/slurmd-$name.log" 2>/dev/null)"
        record "slurmd-$name" "$pid"
        log "slurmd $name started, pid $pid"
    done
    # nodes report in within seconds; one left down or drained by an earlier run is resumed
    local states="" want _
    want=$(node_names | wc -l)
    for _ in $(seq 60); do
        states=$(sinfo -h -N -p "$PARTITION" -o %t 2>/dev/null | sort | uniq -c | xargs || true)
        if [ "$(sinfo -h -N -p "$PARTITION" -t idle,mix,alloc -o %N 2>/dev/null | wc -l)" -ge "$want" ]; then
            break
        fi
        case "$states" in
            *down*|*drain*) scontrol update NodeName="$names_csv" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    if [ "$(sinfo -h -N -p "$PARTITION" -t idle,mix,alloc -o %N 2>/dev/null | wc -l)" -lt "$want" ]; then
        die "nodes not ready (sinfo: $states); logs in $STATE/log"
    fi
    log "partition $PARTITION: $want node(s) up ($states)"
    echo "$PIDS"
}

stop_pids() {  # name...: TERM them all at once, wait up to 10 s for all, then KILL; forget them
    # (each daemon takes ~2 s to go after its TERM: one at a time, the four took 8 s of
    # every test session's teardown)
    local name pid i _ names=() pids=()
    for name in "$@"; do
        pid=$(recorded_pid "$name")
        if [ -n "$pid" ]; then
            kill -TERM "$pid" 2>/dev/null || true
            names+=("$name"); pids+=("$pid")
        fi
    done
    for _ in $(seq 100); do
        local left=0
        for pid in "${pids[@]}"; do alive "$pid" && left=1; done
        [ "$left" = 0 ] && break
        sleep 0.1
    done
    for i in "${!pids[@]}"; do
        if alive "${pids[$i]}"; then kill -KILL "${pids[$i]}" 2>/dev/null || true; fi
        log "stopped ${names[$i]} (pid ${pids[$i]})"
    done
    for name in "$@"; do forget "$name"; done
}

stop_slurm_daemons() {  # [name...]: stopped with the controller
    [ -f "$PIDS" ] || return 0
    # the nodes first, then the controller
    stop_pids $(awk '$1 ~ /^slurmd/ {print $1}' "$PIDS")
    stop_pids slurmctld "$@"
}

stop_slurm() {
    [ -f "$PIDS" ] || { log "no pids file at $PIDS: nothing to stop"; return 0; }
    stop_slurm_daemons munged   # nothing is left to authenticate
    rm -f "$PIDS"
}

if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        exec sudo -n env DPSCALE_SLURM_STATE="$STATE" DPSCALE_SLURM_NODES="$NODES" \
            DPSCALE_SLURM_FAKE_GPUS="$FAKE_GPUS" DPSCALE_SLURM_PARTITION="$PARTITION" \
            DPSCALE_SLURM_CPUS="$CPUS" DPSCALE_SLURM_MEM_MB="$MEM_MB" \
            PATH="$PATH" bash "$0" "$@"
    fi
    die "needs root or passwordless sudo (writes $CONF, starts daemons)"
fi
mkdir -p "$STATE"
names_csv=$(node_names | paste -sd, -)
case "${1:-start}" in
    install) install_packages; log "installed: $(slurmctld -V 2>/dev/null || echo '?'), munge $(munged -V 2>/dev/null | awk '{print $1}' || echo '?')" ;;
    start) start_slurm ;;
    stop) stop_slurm ;;
    status) cat "$PIDS" 2>/dev/null || true; sinfo 2>/dev/null || true ;;
    *) die "usage: $0 [install|start|stop|status]" ;;
esac
