# shellcheck shell=bash
# scripts/slurm/job.sh - what the batch scripts of scripts/slurm/ share (sourced, not run): start
# wlbtrain under the script's launcher, pass the time limit's warning on to the ranks, and requeue
# the job only when that is what should happen (docs/slurm.md, "Requeue policy").
#
#   launcher=(srun --mpi=pmix ...)        # or (mpirun -np N ...)
#   source scripts/slurm/job.sh
#   wlb_job CONFIG [wlbtrain flags...]    # exits with the job's status
#
# Requeued (scontrol requeue $SLURM_JOB_ID, the job keeps its id and starts again with
# SLURM_RESTART_COUNT + 1, resuming from checkpoint.dir's latest with checkpoint.resume=auto):
#   - exit 75 after the time limit's early warning: #SBATCH --signal=B:USR1@SECONDS sends SIGUSR1 to
#     this shell alone; the trap remembers it and passes it on to the launcher, the ranks write a
#     checkpoint and exit 75;
#   - exit 76: the watchdog ended a hung job (parallel.timeout_s).
# Not requeued:
#   - a plain scancel (SIGTERM to the job with no SIGUSR1 before it): the ranks still stop with a
#     checkpoint (exit 75), and the job stays cancelled; resume it with a new sbatch and
#     --set checkpoint.resume=auto;
#   - any other status (0 done, 1 a failure, 2 bad input, 137 killed, ...);
#   - a job without checkpoint.dir: a requeued run would start again from step 1;
#   - the (WLB_MAX_REQUEUES + 1)-th requeue in a row with no new checkpoint (default 3): the
#     attempts and checkpoint.dir's latest step at each are kept in checkpoint.dir/slurm-requeues;
#     a job that hangs on every start stops there with a message and a failure status.
# WLB_MAX_REQUEUES: that bound (sbatch --export=ALL,WLB_MAX_REQUEUES=5 ...).

wlb_usr1=0
wlb_term=0
wlb_launcher_pid=

# The trap: remember which signal came, pass it on to the launcher as SIGUSR1 (srun turns a SIGTERM
# it receives into SIGKILL for the tasks; Open MPI's mpirun ends the job at once on SIGTERM).
wlb_signal() {
    if [ "$1" = USR1 ]; then wlb_usr1=1; else wlb_term=1; fi
    echo "wlbtrain job ${SLURM_JOB_ID:-?}: SIG$1 received$([ "$1" = USR1 ] && echo " (the time limit is near)" || echo " (scancel or a preemption)"): passed on to the ranks as SIGUSR1"
    if [ -n "$wlb_launcher_pid" ]; then kill -USR1 "$wlb_launcher_pid" 2>/dev/null || true; fi
}

# checkpoint.dir of the config and flags (empty when none), as wlbtrain resolves it.
wlb_checkpoint_dir() {
    local dir
    dir=$(./wlbtrain "$@" --print-config 2>/dev/null | sed -n '/^checkpoint:/,/^[^ ]/s/^  dir: //p' | head -n 1) || true
    [ "$dir" = none ] && dir=
    printf '%s' "$dir"
}

# Requeues this job unless the bound is reached; $1: why. Returns 1 when it did not requeue.
wlb_requeue() {
    local why=$1 dir=$2 state latest prev_job=- prev_count=0 prev_latest=- count max=${WLB_MAX_REQUEUES:-3}
    state=$dir/slurm-requeues
    latest=$(cat "$dir/latest" 2>/dev/null || echo none)
    if [ -f "$state" ]; then
        read -r prev_job prev_count prev_latest < <(tail -n 1 "$state") || true
    fi
    count=1
    [ "$prev_job" = "$SLURM_JOB_ID" ] && [ "$prev_latest" = "$latest" ] && count=$((prev_count + 1))
    if [ "$count" -gt "$max" ]; then
        local noun=requeues
        [ "$prev_count" -eq 1 ] && noun=requeue
        echo "wlbtrain job $SLURM_JOB_ID: $why, but not requeued: $prev_count $noun in a row without a new checkpoint (latest: $latest; WLB_MAX_REQUEUES $max, $state); look at the job's output and checkpoint.dir's flight records (wlbtrain inspect $dir)" >&2
        return 1
    fi
    if ! { mkdir -p "$dir" && echo "$SLURM_JOB_ID $count $latest" >> "$state"; }; then
        echo "wlbtrain job $SLURM_JOB_ID: $why, but not requeued: cannot count the requeues in $state" >&2
        return 1
    fi
    echo "wlbtrain job $SLURM_JOB_ID: $why: requeueing (requeue $count of at most $max in a row without a new checkpoint; latest: $latest)"
    scontrol requeue "$SLURM_JOB_ID"
}

wlb_job() {
    local config=${1:?usage: wlb_job CONFIG [wlbtrain flags...]} status=0 dir resume=()
    shift
    dir=$(wlb_checkpoint_dir --config "$config" "$@")
    [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && resume=(--set checkpoint.resume=auto)
    trap 'wlb_signal USR1' USR1
    trap 'wlb_signal TERM' TERM
    # shellcheck disable=SC2154 # launcher: set by the batch script that sources this file
    "${launcher[@]}" ./wlbtrain --config "$config" "$@" ${resume[@]+"${resume[@]}"} &
    wlb_launcher_pid=$!
    # wait returns early when a trapped signal arrives: wait again until the launcher has ended,
    # then once more for its exit status (bash keeps it).
    while kill -0 "$wlb_launcher_pid" 2>/dev/null; do wait "$wlb_launcher_pid" || true; done
    wait "$wlb_launcher_pid" || status=$?
    local why=
    if [ "$status" -eq 75 ] && [ "$wlb_usr1" -eq 1 ]; then
        why="stopped with a checkpoint before the time limit (exit 75)"
    elif [ "$status" -eq 75 ]; then
        local by="a stop signal the ranks got directly"
        [ "$wlb_term" -eq 1 ] && by="SIGTERM without the time limit's SIGUSR1 (scancel, or a preemption)"
        echo "wlbtrain job ${SLURM_JOB_ID:-?}: stopped with a checkpoint (exit 75) by $by: not requeued; go on with sbatch ... --set checkpoint.resume=auto"
    elif [ "$status" -eq 76 ]; then
        why="the watchdog ended a hung job (exit 76; wlbtrain inspect ${dir:-checkpoint.dir} names the rank)"
    fi
    if [ -n "$why" ]; then
        if [ -z "${SLURM_JOB_ID:-}" ]; then
            echo "wlbtrain job: $why; not inside a Slurm job: nothing to requeue" >&2
        elif [ -z "$dir" ]; then
            echo "wlbtrain job $SLURM_JOB_ID: $why, but not requeued: no checkpoint.dir, a requeued run would start again from step 1" >&2
        elif wlb_requeue "$why" "$dir"; then
            exit "$status"
        fi
    fi
    exit "$status"
}
