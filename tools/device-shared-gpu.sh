#!/usr/bin/env bash
# Two processes of one Slurm job share GPU 0 (no Slurm cgroup: the job id comes from SLURM_JOB_ID in their
# environment), while `gpuwarden serve` reads live NVML and `gpuwarden record` writes a trace; then a scrape of the
# per-process utilization and job series, and the cost of nvmlDeviceGetProcessUtilization.
#   tools/device-shared-gpu.sh OUTDIR [SECONDS]
# Used on the lent GPU machines for tests/data/traces/h100-shared-slurm-env.jsonl.gz (see tests/data/README.md).
set -u
OUT=$1; SECS=${2:-30}; WARM=${WARM:-12}
mkdir -p "$OUT"
python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
daemon=$!
SLURM_JOB_ID=777 python3 tools/workloads.py run bf16_matmul --seconds $((SECS + WARM + 5)) >"$OUT/rank0.log" 2>&1 &
r0=$!
SLURM_JOB_ID=777 python3 tools/workloads.py run self_paused --seconds $((SECS + WARM + 5)) >"$OUT/rank1.log" 2>&1 &
r1=$!
sleep "$WARM"
python3 -m gpuwarden record --duration "$SECS" --out "$OUT/h100-shared-slurm-env.jsonl.gz" \
  --meta scenario=shared_slurm_env --meta "rank_pids=$r0,$r1" --meta recorded_by=tools/device-shared-gpu.sh &
rec=$!
sleep $((SECS / 2))
curl -sf http://127.0.0.1:10400/metrics -o "$OUT/scrape.txt"
grep -E '^gpu_(process_sm_utilization_ratio|utilization_ratio|job_info|process_job_info)' "$OUT/scrape.txt"
python3 -m gpuwarden diagnose --url http://127.0.0.1:10400 --brief
python3 - <<'PY'
import time, pynvml
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
t = time.perf_counter(); n = 200; last = int(time.time() * 1e6) - 2_000_000
for _ in range(n):
    try:
        s = pynvml.nvmlDeviceGetProcessUtilization(h, last)
    except pynvml.NVMLError as e:
        s = e
print(f"nvmlDeviceGetProcessUtilization: {(time.perf_counter() - t) / n * 1e6:.0f} us/call; last answer: "
      f"{[(x.pid, x.smUtil, x.memUtil) for x in s] if isinstance(s, list) else s}")
PY
wait "$rec"
wait "$r0" "$r1"; echo "ranks: $(tail -1 "$OUT/rank0.log") | $(tail -1 "$OUT/rank1.log")"
python3 -m gpuwarden diagnose --replay "$OUT/h100-shared-slurm-env.jsonl.gz" --brief
kill -TERM "$daemon"; wait "$daemon"; echo "daemon exit $?"
tail -3 "$OUT/serve.log"
