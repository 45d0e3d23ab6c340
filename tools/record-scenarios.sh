#!/usr/bin/env bash
# Records the ground-truth traces shipped under tests/data/traces/ and the demo trace.
#
# Run on a machine with an NVIDIA GPU, PyTorch and gpuwarden importable, from the repo root:
#   tools/record-scenarios.sh WORKLOADS_PY OUTDIR [SECONDS]
# For each single-GPU scenario of tools/workloads.py it starts the workload, waits
# for it to warm up, and records a trace with `gpuwarden record` while it runs; a "session" trace
# is recorded across all of them (the demo trace). Each trace's header metadata names the scenario.
set -u
W=$1; OUT=$2; SECS=${3:-30}
WARM=${WARM:-8}
mkdir -p "$OUT"
GW="python3 -m gpuwarden"
scenarios=(compute_bound starved_dataloader starved_cpu_heavy h2d_pageable_copy held_idle)
total=$(( (SECS + WARM + 4) * (${#scenarios[@]} + 1) + 10 ))
$GW record --duration "$total" --interval 1 --out "$OUT/session.jsonl.gz" \
  --meta scenario=session --meta "note=scenarios in order: idle ${scenarios[*]}" \
  --meta recorded_by=tools/record-scenarios.sh 2>"$OUT/session.err" &
session=$!
# idle: no process on the GPU
sleep "$WARM"
$GW record --duration "$SECS" --out "$OUT/idle.jsonl.gz" --meta scenario=idle \
  --meta recorded_by=tools/record-scenarios.sh || echo "record idle failed"
sleep 4
for s in "${scenarios[@]}"; do
  python3 "$W" run "$s" --seconds $((SECS + WARM + 2)) >"$OUT/$s.workload.log" 2>&1 &
  wpid=$!
  sleep "$WARM"
  $GW record --duration "$SECS" --out "$OUT/$s.jsonl.gz" --meta "scenario=$s" --meta "workload_pid=$wpid" \
    --meta recorded_by=tools/record-scenarios.sh || echo "record $s failed"
  wait "$wpid"; echo "workload $s exit $?: $(tail -1 "$OUT/$s.workload.log")"
  sleep 4
done
wait "$session"; echo "session exit $?"
ls -la "$OUT"
