#!/usr/bin/env bash
# CI: run README.md's SLURM job-array example for real, on a one-node cluster started on this machine,
# and check that the merged shards equal the same grid run in one process.
#
# Why: the example is what users copy to spread a sweep over a cluster; only a real sbatch, array
# variables and --dependency show that it works. The example is read from README.md (the two fenced
# blocks of "Across machines: SLURM job arrays"), so README and CI cannot drift. It runs a small CPU grid
# through the variables the example documents (docs/slurm.md): KVBENCH_MODELS, KVBENCH_DATA, KVBENCH_WORKERS
# and pytest's own PYTEST_ADDOPTS, which sbatch passes on to the job with the rest of the environment.
#
# The cluster lives in a temporary directory (slurm.conf, munge key and socket, state, logs): nothing under
# /etc is changed and the daemons started here are stopped on exit, failure included. Only where the SLURM
# packages cannot be installed at all (not root, no apt-get, or apt-get failed) does this print
# "SKIPPED: <reason>" and exit 0. A missing kvbench command, a cluster that does not come up, or a failed shard,
# merge or comparison prints "FAILED: <reason>" and exits 1: those are broken installs or a broken example.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WAIT_S=${KVBENCH_SLURM_WAIT_S:-900}   # the longest the jobs may take, queued and running

skip() { echo "SKIPPED: SLURM job-array example: $*"; exit 0; }
fail() { echo "FAILED: SLURM job-array example: $*" >&2; exit 1; }

# --- install (as .ci/run installs chromium) ------------------------------------------------------------
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurm-wlm munge >/dev/null) || skip "apt-get could not install slurm-wlm and munge"
    echo "installed slurm-wlm and munge in ${SECONDS}s"
  else
    skip "slurm-wlm and munge are not installed, and installing them needs root and apt-get"
  fi
fi
command -v kvbench >/dev/null 2>&1 || fail "no kvbench console script on PATH (the package is not installed: pip install -e .)"

# --- a one-node cluster in a temporary directory ------------------------------------------------------
CLUSTER=$(mktemp -d "${TMPDIR:-/tmp}/kvbench-slurm.XXXXXX")
WORK="$CLUSTER/project"          # the user's project folder: bench/ and pyproject.toml, results land here
PIDS=()
teardown() {
  local status=$?
  # Jobs still queued or running (a failure or timeout above) are cancelled while slurmctld is up, then
  # the daemons started below are stopped by their own process ids.
  if [ "${SLURM_CONF:-}" = "$CLUSTER/slurm.conf" ] && squeue -h -o %A >"$CLUSTER/left" 2>/dev/null && [ -s "$CLUSTER/left" ]; then
    xargs scancel <"$CLUSTER/left" || true
    for _ in $(seq 30); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 1; done
  fi
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$status" -ne 0 ]; then
    for log in "$CLUSTER"/log/*.log "$WORK"/slurm-*.out; do
      [ -f "$log" ] && { echo "--- $log (last 40 lines)"; tail -n 40 "$log"; }
    done
  fi
  rm -rf "$CLUSTER"
}
trap teardown EXIT
mkdir -p "$CLUSTER"/{log,state,spool,munge} "$WORK"
chmod 700 "$CLUSTER/munge"

# munge: the authentication slurm's daemons and clients share, on a private socket and key.
dd if=/dev/urandom of="$CLUSTER/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$CLUSTER/munge/munge.key"
munged --foreground --force --socket="$CLUSTER/munge/munge.socket" --key-file="$CLUSTER/munge/munge.key" \
  --pid-file="$CLUSTER/munge/munged.pid" --seed-file="$CLUSTER/munge/munged.seed" \
  --log-file="$CLUSTER/log/munged.log" >/dev/null 2>&1 &
PIDS+=($!)

# The node as slurmd sees it (real CPUs, sockets, cores, memory), renamed to localhost, with 8 fake GPUs
# (slurm drops a GPU without a device file, so each is an empty file) for the example's --gres=gpu:8.
NODE_HARDWARE=$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]* //')
export SLURM_CONF="$CLUSTER/slurm.conf"   # daemons, sbatch/squeue/scontrol and the jobs read this one
cat >"$SLURM_CONF" <<EOF
ClusterName=kvbench-ci
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$CLUSTER/munge/munge.socket
StateSaveLocation=$CLUSTER/state
SlurmdSpoolDir=$CLUSTER/spool
SlurmctldPidFile=$CLUSTER/slurmctld.pid
SlurmdPidFile=$CLUSTER/slurmd.pid
SlurmctldLogFile=$CLUSTER/log/slurmctld.log
SlurmdLogFile=$CLUSTER/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 $NODE_HARDWARE Gres=gpu:8 State=UNKNOWN
PartitionName=ci Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
mkdir "$CLUSTER/dev" && touch "$CLUSTER"/dev/gpu{0..7}
echo "NodeName=localhost Name=gpu File=$CLUSTER/dev/gpu[0-7]" >"$CLUSTER/gres.conf"

slurmctld -D -i -f "$SLURM_CONF" >/dev/null 2>&1 &
PIDS+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 60); do
  [ "$(sinfo -h -n localhost -o %t 2>/dev/null)" = idle ] && break
  sleep 1
done
[ "$(sinfo -h -n localhost -o %t 2>/dev/null)" = idle ] \
  || fail "the one-node cluster did not come up within 60 s (the daemons' logs follow)"
echo "one-node SLURM cluster up: $(sinfo -h -N -o '%N %c CPUs %m MB %G')"

# --- the README's example, as written ---------------------------------------------------------------
# A fenced block of README.md that contains the given text, without its fences.
readme_block() {
  awk -v marker="$1" '
    /^```/ { if (inside) { if (found) { printf "%s", block; exit } inside = 0; block = ""; found = 0 }
             else inside = 1
             next }
    inside { block = block $0 "\n"; if (index($0, marker)) found = 1 }' "$REPO/README.md"
}
readme_block "# sweep.sbatch" >"$WORK/sweep.sbatch"
readme_block "sbatch --parsable sweep.sbatch" >"$WORK/submit.sh"
[ -s "$WORK/sweep.sbatch" ] && [ -s "$WORK/submit.sh" ] || fail "README.md has no sweep.sbatch or submit block"
cp -r "$REPO/bench" "$REPO/pyproject.toml" "$WORK/"

# The small CPU grid: the embedded model on the shipped data, no xdist workers (-n 0), 2 methods x 2 budgets
# x 2 RULER tasks at 512 tokens, 2 samples each: 8 items over the example's 4 shards.
export KVBENCH_MODELS=default KVBENCH_DATA=fixtures KVBENCH_WORKERS=0
export PYTEST_ADDOPTS="-m ruler --kvbench-methods snapkv,streamingllm --kvbench-budgets 64,128 \
--kvbench-tasks niah_single_1,niah_multikey_1 --kvbench-context-lengths 512 --kvbench-samples 2 \
--kvbench-torch-threads 1 -p no:cacheprovider"

cd "$WORK"
SECONDS=0
# shellcheck disable=SC1091  # the README's two submission lines; they set JOB, and print the merge job
source ./submit.sh >submit.out || fail "submitting the README's example: $(cat submit.out)"
MERGE_JOB=$(awk '/Submitted batch job/ { print $4 }' submit.out)
[ -n "${JOB:-}" ] && [ -n "$MERGE_JOB" ] || fail "submission printed no job ids: $(cat submit.out)"
echo "submitted array job $JOB (4 shards) and merge job $MERGE_JOB (afterany:$JOB)"

# Meanwhile, the same grid in one process, outside SLURM: what the merged run must equal.
python -m pytest bench/ --kvbench-model "$KVBENCH_MODELS" --kvbench-data "$KVBENCH_DATA" \
  --kvbench-results single -q >single.out 2>&1 || { cat single.out; fail "the one-process run failed"; }

until [ -z "$(squeue -h -j "$JOB,$MERGE_JOB" -o %i 2>/dev/null)" ]; do
  [ "$SECONDS" -lt "$WAIT_S" ] || { squeue; fail "the jobs did not finish within ${WAIT_S}s"; }
  sleep 5
done
echo "array and merge jobs finished in ${SECONDS}s"

# Every array task and the merge job completed with exit code 0 (pytest: every item passed).
scontrol -o show job "$JOB" >jobs.txt
scontrol -o show job "$MERGE_JOB" >>jobs.txt
awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^(JobId|ArrayTaskId|JobState|RunTime|ExitCode)=/) printf "%s ", $i; print "" }' jobs.txt
[ "$(grep -c . jobs.txt)" -eq 5 ] || { cat jobs.txt; fail "expected 4 array tasks and 1 merge job"; }
! grep -v ' JobState=COMPLETED .* ExitCode=0:0 ' jobs.txt >/dev/null \
  || fail "a job did not complete with exit code 0 (states above; its output below)"
[ "$(find results/shards/"$JOB" -mindepth 3 -maxdepth 3 -path '*/runs/*' | wc -l)" -eq 4 ] \
  || fail "expected one run per array task under results/shards/$JOB"

python "$REPO/.ci/same_results.py" results/runs/* single/runs/*
