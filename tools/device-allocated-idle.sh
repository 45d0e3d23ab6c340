#!/usr/bin/env bash
# On a lent machine with 2+ GPUs: a job allocated GPUs 0 and 1 (a job mapping directory as deploy/slurm/prolog.sh
# writes it) runs on GPU 0 only. The daemon (live NVML, job_mapping_dir) serves; a mid-run scrape and its diagnosis
# are saved; `gpuwarden record` records the node meanwhile (it reads NVML only: the allocation is not in the trace,
# the tests give it again from a real Slurm).
#   tools/device-allocated-idle.sh OUTDIR [SECONDS] [SCENARIO]
set -u
OUT=$1; SECS=${2:-40}; S=${3:-bf16_matmul}; WARM=${WARM:-10}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/jobs"
echo 777 > "$OUT/jobs/0"; echo 777 > "$OUT/jobs/1"
nvidia-smi -L > "$OUT/gpus.txt"
GPUWARDEN_JOB_MAPPING_DIR="$OUT/jobs" python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 \
  >"$OUT/serve.log" 2>&1 &
daemon=$!
python3 tools/workloads.py run "$S" --gpu 0 --seconds $((SECS + WARM + 5)) >"$OUT/workload.log" 2>&1 &
wpid=$!
sleep "$WARM"
python3 -m gpuwarden record --duration "$SECS" --out "$OUT/one-of-two.jsonl.gz" --meta "scenario=$S on GPU 0 of 2" \
  --meta "workload_pid=$wpid" --meta recorded_by=tools/device-allocated-idle.sh &
rec=$!
sleep $((SECS / 2 + 5))
curl -sf http://127.0.0.1:10400/metrics -o "$OUT/scrape.txt"
curl -sf http://127.0.0.1:10400/api/v1/diagnosis -o "$OUT/diagnosis.json"
wait "$rec"; echo "record exit $?"
wait "$wpid"; echo "workload exit $?: $(tail -1 "$OUT/workload.log")"
kill -TERM "$daemon"; wait "$daemon"; echo "daemon exit $?"
grep -E '^gpu_(state_seconds_total|diagnosis|job_info)\{' "$OUT/scrape.txt" | grep -v ' 0$' | grep -v '} 0.0$'
tail -3 "$OUT/serve.log"
