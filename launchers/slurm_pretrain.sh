#!/usr/bin/env bash
# Multi-node pretraining under Slurm: one torchrun per node (srun), c10d rendezvous on the first node.
#
#   sbatch launchers/slurm_pretrain.sh --config configs/qwen3_0.6b_8k_plsh_s10.toml [--section.key=value ...]
#   sbatch --nodes=4 --time=12:00:00 launchers/slurm_pretrain.sh --config ...   # sbatch flags beat the header
#   DRY_RUN=1 bash launchers/slurm_pretrain.sh --config ...    # inside an allocation: print, launch nothing
#
# Submit from the repository root (the job runs there: relative config and run paths resolve from it).
# Every argument goes to launchers/pretrain.py. Knobs (environment, all optional):
#   GPUS_PER_NODE         ranks per node (default: the allocation's GPUs per node, else 8)
#   MASTER_PORT           rendezvous port on the first node (default: 15000 + job id % 10000)
#   PLSH_TIMEOUT_S        [parallel].timeout_s for every collective (default 600; see "Timeouts" below)
#   PLSH_RESUME           auto | never | a checkpoint dir (default auto; a requeued job always resumes)
#   MAX_RESTARTS          torchrun restarts of all local ranks after a failure (default 0: Slurm requeues;
#                         above 0 torchrun would also restart ranks that stopped with 75 for a requeue)
#   PLSH_CONTAINER_IMAGE  run in this image with pyxis (srun --container-image), e.g. the docker/ image
#   TORCHRUN              torchrun executable (default: torchrun on PATH, e.g. from an activated .venv)
#   DRY_RUN=1             print the srun line and each node's torchrun line, then exit
#
# Time limit and preemption (launchers/pretrain.py exit code 75, plsh_dist/train/preemption.py):
# --signal=B:USR1@300 sends USR1 to this script only (B:) about 300 s before the time limit. The trap
# passes it on with `scancel --signal=USR1 $SLURM_JOB_ID`, which signals every process of the job's
# steps but not this shell. torchrun is started with USR1 ignored (an ignored signal stays ignored
# across exec; torchrun has no handler of its own and would die), the ranks catch it: they finish the
# current optimizer step, write a checkpoint through the atomic path and exit 75. When the step has
# ended, this script runs `scontrol requeue` if its status is 75, or if the step failed after USR1 came
# or after the ranks stopped for preemption (torchrun reports their 75 as 1; they leave a marker file,
# PLSH_PREEMPTED_MARKER, so `scancel --signal=USR1 $SLURM_JOB_ID`, which skips this shell, requeues too);
# the requeued job runs with --resume auto and continues from that checkpoint exactly. Make the lead time (@300) longer than one step plus one checkpoint save.
# SIGTERM (scancel, Slurm's own preemption, a drained node) reaches the ranks from Slurm directly: they
# checkpoint the same way if that fits in Slurm's KillWait (and torchrun's 30 s before it SIGKILLs its
# ranks), and this script does not requeue (scancel means stop; Slurm requeues a job it preempts
# itself, --requeue). --requeue also lets Slurm requeue the job after a node failure. Without
# [checkpoint].save_on_signal the ranks die on USR1 and the requeued job resumes from the last
# periodic checkpoint ([checkpoint].every_steps).
#
#SBATCH --job-name=plsh-pretrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=96
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
set -euo pipefail

die() {
    echo "slurm_pretrain: $*" >&2
    exit 2
}

root=${SLURM_SUBMIT_DIR:-$(pwd)}
cd "$root"
[[ -f launchers/pretrain.py ]] || die "no launchers/pretrain.py under $root: submit from the repository root"

# --- the allocation ---------------------------------------------------------------------------------
[[ -n ${SLURM_JOB_ID:-} && -n ${SLURM_JOB_NODELIST:-} ]] \
    || die "SLURM_JOB_ID / SLURM_JOB_NODELIST are not set: submit with sbatch (DRY_RUN=1 inside salloc previews)"
nnodes=${SLURM_NNODES:-${SLURM_JOB_NUM_NODES:-}}
[[ $nnodes =~ ^[1-9][0-9]*$ ]] || die "SLURM_NNODES='$nnodes' is not a node count"
command -v scontrol > /dev/null 2>&1 || die "scontrol not found: run this on a Slurm node"
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
((${#hosts[@]} == nnodes)) \
    || die "SLURM_JOB_NODELIST expands to ${#hosts[@]} host(s) (${hosts[*]}) but SLURM_NNODES=$nnodes"
# The first node hosts the rendezvous store (same as `scontrol show hostnames ... | head -n1`).
master_addr=${hosts[0]}
# Per job, so two jobs that share a first node do not collide; below Linux's ephemeral range (32768+).
master_port=${MASTER_PORT:-$((15000 + SLURM_JOB_ID % 10000))}
gpus_per_node=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
[[ $gpus_per_node =~ ^[1-9][0-9]*$ ]] || die "GPUS_PER_NODE='$gpus_per_node' must be a positive integer"
restarts=${SLURM_RESTART_COUNT:-0}

# --- arguments for pretrain.py ----------------------------------------------------------------------
train_args=("$@")
have_config=0 have_resume=0 timeout_s=${PLSH_TIMEOUT_S:-600} timeout_from_args=0
for ((i = 0; i < ${#train_args[@]}; i++)); do
    arg=${train_args[i]}
    next=${train_args[i + 1]:-}
    case $arg in
        --config | --config=*) have_config=1 ;;
        --resume | --resume=* | --checkpoint.resume | --checkpoint.resume=*) have_resume=1 ;;
        --parallel.timeout_s=*) timeout_s=${arg#*=} timeout_from_args=1 ;;
        --parallel.timeout_s) timeout_s=$next timeout_from_args=1 ;;
    esac
done
((have_config)) || die "pass --config configs/<run>.toml (and any --section.key=value overrides)"
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || die "[parallel].timeout_s='$timeout_s' must be a positive integer of seconds"
# This script owns [parallel].timeout_s so that the trainer's collective timeout and the NCCL/rendezvous
# settings below agree (a value in the config file is overridden; set PLSH_TIMEOUT_S or pass the flag).
((timeout_from_args)) || train_args+=("--parallel.timeout_s=$timeout_s")

resume=${PLSH_RESUME:-auto}
if ((restarts > 0)) && [[ $resume == never ]]; then
    # A requeued job that started over would overwrite the checkpoints it should continue from.
    echo "slurm_pretrain: restart $restarts of job $SLURM_JOB_ID: PLSH_RESUME=never ignored, resuming (auto)" >&2
    resume=auto
fi
((have_resume)) || train_args+=(--resume "$resume")

# --- NCCL and torch.distributed ---------------------------------------------------------------------
# Defaults only: anything already set in the environment wins.
# Warnings only; INFO prints the topology and the transport NCCL picked (first thing to read when slow).
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Interface for NCCL's bootstrap and socket transport: anything but loopback and docker bridges. Set the
# cluster's fabric explicitly when nodes have several (e.g. NCCL_SOCKET_IFNAME=ib0 or =bond0).
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker}
# InfiniBand/RoCE on (set 1 on Ethernet-only clusters to skip IB probing). NCCL_IB_HCA picks adapters
# (e.g. "mlx5" or "=mlx5_0:1,mlx5_1:1"); unset = every active HCA. RoCEv2 usually also needs
# NCCL_IB_GID_INDEX=3. Both are passed through when set.
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-0}
# How long a lost InfiniBand link is retried before NCCL reports an error: each try waits
# 4.096 us * 2^NCCL_IB_TIMEOUT (22 -> ~17 s), NCCL_IB_RETRY_CNT tries (7 -> ~2 min in all). This stays
# below timeout_s so a broken link ends as an NCCL error naming the transport, not as a bare timeout.
export NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-22}
export NCCL_IB_RETRY_CNT=${NCCL_IB_RETRY_CNT:-7}
ib_window_s=$(((4096 * (1 << NCCL_IB_TIMEOUT) * NCCL_IB_RETRY_CNT) / 1000000000))
if ((ib_window_s >= timeout_s)); then
    echo "slurm_pretrain: warning: NCCL IB retries last ~${ib_window_s}s, not less than [parallel].timeout_s=" \
         "${timeout_s}s: a lost link will surface as a collective timeout; lower NCCL_IB_TIMEOUT/RETRY_CNT" >&2
fi
# A collective that waits longer than timeout_s (a dead or hung peer), or an NCCL error, makes torch's
# watchdog abort the communicators and end the process instead of hanging; srun --kill-on-bad-exit then
# stops the other nodes, and the job ends (or is requeued) instead of idling to the time limit.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
# CPU threads per rank (torchrun would force 1 otherwise).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(((${SLURM_CPUS_PER_TASK:-$gpus_per_node} / gpus_per_node) > 0 ? \
    (${SLURM_CPUS_PER_TASK:-$gpus_per_node} / gpus_per_node) : 1))}

# --- the launch -------------------------------------------------------------------------------------
# One torchrun per node. With the c10d rendezvous, ranks come from the rendezvous (each node's ranks stay
# consecutive, so an SP group of <= GPUS_PER_NODE ranks stays on one node's NVLink); --node-rank is
# informational there and used as is by --rdzv-backend=static. join_timeout: how long the first node
# waits for the others (slow container starts) before giving up.
node_cmd=(
    "${TORCHRUN:-torchrun}"
    --nnodes="$nnodes"
    --nproc-per-node="$gpus_per_node"
    --rdzv-backend=c10d
    --rdzv-endpoint="$master_addr:$master_port"
    --rdzv-id="$SLURM_JOB_ID"
    --rdzv-conf="join_timeout=$timeout_s"
    --max-restarts="${MAX_RESTARTS:-0}"
    launchers/pretrain.py
    "${train_args[@]}"
)
container_args=()
if [[ -n ${PLSH_CONTAINER_IMAGE:-} ]]; then
    container_args=(--container-image="$PLSH_CONTAINER_IMAGE" --container-mounts="$root:/workspace/plsh_dist"
                    --container-workdir=/workspace/plsh_dist)
fi
# SLURM_NODEID differs per node, so it is read inside the step: bash -c gets torchrun as $0 and the
# rest as "$@", which keeps every argument exactly as given (no re-quoting). USR1 ignored: see the top.
# shellcheck disable=SC2016  # $0, $@ and $SLURM_NODEID are meant for the inner shell
srun_cmd=(
    srun --nodes="$nnodes" --ntasks-per-node=1 --kill-on-bad-exit=1 --label "${container_args[@]}"
    bash -c 'trap "" USR1; exec "$0" --node-rank="$SLURM_NODEID" "$@"' "${node_cmd[@]}"
)

echo "slurm_pretrain: job $SLURM_JOB_ID (restart $restarts): $nnodes node(s) x $gpus_per_node GPU(s)," \
     "rendezvous $master_addr:$master_port, timeout_s $timeout_s, resume $resume"

if [[ ${DRY_RUN:-0} == 1 ]]; then
    printf 'srun:'
    printf ' %q' "${srun_cmd[@]}"
    printf '\n'
    for ((node = 0; node < nnodes; node++)); do
        printf 'node %d (%s):' "$node" "${hosts[node]}"
        printf ' %q' "${node_cmd[0]}" "--node-rank=$node" "${node_cmd[@]:1}"
        printf '\n'
    done
    exit 0
fi

# pretrain.py's exit code after a checkpoint on SIGTERM / SIGUSR1 (plsh_dist/train/preemption.py).
exit_preempted=75
# torchrun reports its ranks' 75 as 1, and `scancel --signal=USR1 JOB` (without --batch) signals the ranks
# but not this shell: so the ranks also create this file when they stop for preemption (on every node;
# this shell runs on the first and reads its own).
preempted_marker=${TMPDIR:-/tmp}/plsh-preempted-$SLURM_JOB_ID
rm -f "$preempted_marker"
export PLSH_PREEMPTED_MARKER=$preempted_marker
got_usr1=0 got_term=0
# shellcheck disable=SC2329  # invoked by the trap below
on_usr1() {
    got_usr1=1
    echo "slurm_pretrain: USR1 (time limit close): asking the ranks of job $SLURM_JOB_ID to checkpoint and stop" >&2
    if ! scancel --signal=USR1 "$SLURM_JOB_ID"; then
        echo "slurm_pretrain: warning: scancel --signal=USR1 $SLURM_JOB_ID failed: the ranks may not checkpoint" >&2
    fi
}
# shellcheck disable=SC2329  # invoked by the trap below
on_term() {
    got_term=1
    echo "slurm_pretrain: SIGTERM (scancel, preemption or requeue): the step is being stopped; no requeue from here" >&2
}
trap on_usr1 USR1
trap on_term TERM

# srun runs in the background: bash runs a trap only between commands, and `wait` returns when a
# trapped signal arrives, whereas a foreground srun would delay the requeue until the step ended.
"${srun_cmd[@]}" &
srun_pid=$!
while kill -0 "$srun_pid" 2> /dev/null; do
    wait "$srun_pid" || true
done
wait "$srun_pid" && status=0 || status=$?
echo "slurm_pretrain: srun exited with status $status"
ranks_preempted=0
if [[ -e $preempted_marker ]]; then
    ranks_preempted=1
    rm -f "$preempted_marker"
fi
# Requeue after the step, never during it: `scontrol requeue` would stop the ranks mid-checkpoint.
if ((!got_term && (status == exit_preempted || (status != 0 && (got_usr1 || ranks_preempted))))); then
    echo "slurm_pretrain: requeueing job $SLURM_JOB_ID (step status $status): it resumes from its last checkpoint" >&2
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
