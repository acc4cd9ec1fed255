#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (Debian 12: slurm-wlm and munge), to try the sbatch examples
# without a cluster. Not a production setup: the daemons run as root, without cgroups or accounting.
#
#   scripts/slurm/local_slurm.sh start   install (apt), configure and start munged, slurmctld, slurmd
#   scripts/slurm/local_slurm.sh demo    start, then run rollout.sbatch (2 tasks) and rollout_array.sbatch
#                                        (3 array tasks) over 7 synthetic episodes with the tiny config on the
#                                        CPU, resume a job whose rank was killed, and check every summary
#   scripts/slurm/local_slurm.sh stop    stop the daemons
#
# Environment: DZR (the dzr binary; default build/bin/dzr, then build-cpu/bin/dzr), WORK (the demo's
# directory; default /tmp/dzr-slurm-demo). The node offers its CPUs and its GPUs (/dev/nvidia*) to Slurm; on
# a machine without GPUs it offers 2 placeholder GPUs (no devices), so that the sbatch files run unchanged
# and dzr runs on the CPU (DZR_DEVICE=cpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
conf_dir=/etc/slurm
marker="# written by dzr scripts/slurm/local_slurm.sh"

SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"

install_packages() {
    local missing=()
    for p in slurm-wlm munge python3; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "local_slurm: installing ${missing[*]}"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

write_config() {
    if [[ -f $conf_dir/slurm.conf ]] && ! grep -q "^$marker" "$conf_dir/slurm.conf"; then
        echo "local_slurm: $conf_dir/slurm.conf exists and was not written by this script; not touching it" >&2
        exit 1
    fi
    local host node gpus gres_line
    host=$(hostname -s)
    # slurmd -C prints this node's NodeName line (CPUs, sockets, cores, threads, RealMemory).
    node=$(slurmd -C | head -n 1)
    gpus=$({ compgen -G '/dev/nvidia[0-9]*' || true; } | wc -l)
    $SUDO mkdir -p "$conf_dir" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/slurm
    if ((gpus > 0)); then
        gres_line="NodeName=$host Name=gpu File=/dev/nvidia[0-$((gpus - 1))]"
    else
        # NOTE: slurmd drops GPUs without a device file; two empty files stand in for them (without cgroups
        # Slurm only names them).
        gpus=2
        $SUDO touch /var/lib/slurm/placeholder-gpu0 /var/lib/slurm/placeholder-gpu1
        gres_line="NodeName=$host Name=gpu File=/var/lib/slurm/placeholder-gpu[0-1]"
    fi
    $SUDO tee "$conf_dir/slurm.conf" >/dev/null <<EOF_CONF
$marker
ClusterName=dzrlocal
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
GresTypes=gpu
$node Gres=gpu:$gpus State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF_CONF
    $SUDO tee "$conf_dir/gres.conf" >/dev/null <<EOF_GRES
$marker
AutoDetect=off
$gres_line
EOF_GRES
    # NOTE: slurmd refuses to start when cgroup.conf asks for plugins this setup does not use; none is needed.
    echo "local_slurm: $conf_dir/slurm.conf: node $host ($(echo "$node" | grep -o 'CPUs=[0-9]*'), $gpus GPUs)"
}

start() {
    install_packages
    write_config
    # munged: the key comes with the package; the daemon runs as the munge user.
    if ! pgrep -x munged >/dev/null; then
        $SUDO install -d -o munge -g munge -m 0755 /run/munge
        $SUDO runuser -u munge -- /usr/sbin/munged
    fi
    for _ in $(seq 1 20); do
        [[ -S /run/munge/munge.socket.2 ]] && break
        sleep 0.5
    done
    munge -n | unmunge >/dev/null
    pgrep -x slurmctld >/dev/null || $SUDO slurmctld
    pgrep -x slurmd >/dev/null || $SUDO slurmd
    local host
    host=$(hostname -s)
    for _ in $(seq 1 30); do
        local state
        state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
        case "$state" in
            idle*|mixed*|allocated*) echo "local_slurm: node $host is $state"; sinfo; return 0 ;;
            down*|drain*) $SUDO scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
        esac
        sleep 1
    done
    echo "local_slurm: the node did not come up; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
    sinfo >&2 || true
    exit 1
}

stop() {
    $SUDO scontrol shutdown 2>/dev/null || true
    [[ -f /run/munge/munged.pid ]] && $SUDO kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
    for _ in $(seq 1 20); do
        pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || pgrep -x munged >/dev/null || break
        sleep 0.5
    done
    echo "local_slurm: stopped"
}

# The merged summary of OUT: every episode ok, the number of episodes as expected.
check_summary() {
    python3 - "$1" "$2" <<'EOF_PY'
import json, sys
out, expected = sys.argv[1], int(sys.argv[2])
s = json.load(open(f"{out}/summary.json"))
t = s["totals"]
merged = json.load(open(f"{out}/ranks/merged.json"))
print(f"  {out}/summary.json: {t['episodes']} episodes, {t['ok']} ok, {t['failed']} failed; "
      f"merged by {merged['by']}; calls median {t['call_ms']['median'] / 1e3:.2f} s")
sys.exit(0 if t["episodes"] == expected and t["ok"] == expected else 1)
EOF_PY
}

demo() {
    start
    local dzr=${DZR:-}
    if [[ -z $dzr ]]; then
        for d in build/bin/dzr build-cpu/bin/dzr; do [[ -x $d ]] && dzr=$repo/$d && break; done
    fi
    [[ -n $dzr && -x $dzr ]] || { echo "local_slurm: no dzr binary (build it, or set DZR)" >&2; exit 1; }
    local work=${WORK:-/tmp/dzr-slurm-demo}
    rm -rf "$work"
    mkdir -p "$work/eps"
    "$dzr" ckpt make --config configs/tiny.yaml --seed 1 --dtype f32 --tokenizer tests/data/tokenizer/spiece.model \
        --out "$work/ckpt" >/dev/null
    local frames=(24 48 24 48 24 24 48)
    for i in "${!frames[@]}"; do
        "$dzr" episode synth --out "$work/eps/ep_$i" --frames "${frames[$i]}" --seed "$i" --width 160 --height 90 \
            --frames-format npy >/dev/null
    done
    local common=(--config "$repo/configs/tiny.yaml" --no-warmup)
    export DZR=$dzr DZR_DEVICE=cpu OPENBLAS_NUM_THREADS=1

    echo "== rollout.sbatch: 1 node, 2 tasks =="
    local t0=$SECONDS
    sbatch --wait --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --chdir="$work" --output="$work/job-%j.out" \
        scripts/slurm/rollout.sbatch "$work/eps" "$work/ckpt" "$work/out-tasks" "${common[@]}"
    echo "  $((SECONDS - t0)) s"
    check_summary "$work/out-tasks" 7

    echo "== rollout_array.sbatch: 3 array tasks =="
    t0=$SECONDS
    sbatch --wait --array=0-2 --cpus-per-task=1 --chdir="$work" --output="$work/array-%A_%a.out" \
        scripts/slurm/rollout_array.sbatch "$work/eps" "$work/ckpt" "$work/out-array" "${common[@]}"
    echo "  $((SECONDS - t0)) s"
    check_summary "$work/out-array" 7

    echo "== rollout.sbatch, a rank killed (SIGKILL) mid-episode, then the job resubmitted =="
    t0=$SECONDS
    local job
    job=$(sbatch --parsable --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --chdir="$work" \
        --output="$work/job-%j.out" scripts/slurm/rollout.sbatch "$work/eps" "$work/ckpt" "$work/out-killed" \
        "${common[@]}")
    local pid=""
    for _ in $(seq 1 300); do
        if [[ -f $work/out-killed/logs/rank-1.out ]] && grep -q "call 1/" "$work/out-killed/logs/rank-1.out"; then
            pid=$(python3 -c "import json; print(json.load(open('$work/out-killed/ranks/rank-1.json'))['pid'])")
            break
        fi
        sleep 0.2
    done
    [[ -n $pid ]] || { echo "local_slurm: rank 1 never started" >&2; exit 1; }
    kill -9 "$pid"
    while squeue -h -j "$job" 2>/dev/null | grep -q .; do sleep 0.5; done
    [[ ! -f $work/out-killed/summary.json ]] || { echo "local_slurm: a summary was merged despite the killed rank" >&2; exit 1; }
    echo "  killed rank 1 (pid $pid); $(ls "$work"/out-killed/*/done.json | wc -l) of 7 episodes done, no summary"
    sbatch --wait --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --chdir="$work" --output="$work/job-%j.out" \
        scripts/slurm/rollout.sbatch "$work/eps" "$work/ckpt" "$work/out-killed" "${common[@]}"
    echo "  $((SECONDS - t0)) s for both jobs"
    check_summary "$work/out-killed" 7

    # The three ways of running wrote the same actions, bit for bit.
    for i in "${!frames[@]}"; do
        cmp -s "$work/out-tasks/ep_$i/actions.npy" "$work/out-array/ep_$i/actions.npy" &&
            cmp -s "$work/out-tasks/ep_$i/actions.npy" "$work/out-killed/ep_$i/actions.npy" ||
            { echo "local_slurm: ep_$i: the actions differ between the runs" >&2; exit 1; }
    done
    echo "  actions.npy of every episode identical in the three outputs"
    echo "local_slurm: demo passed ($work)"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    demo) demo ;;
    *) echo "usage: $0 start|demo|stop" >&2; exit 2 ;;
esac
