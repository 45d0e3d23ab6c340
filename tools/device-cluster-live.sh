#!/usr/bin/env bash
# gpuwarden top and report against live NVML: one node serving real readings, a Prometheus scraping it every second,
# and two Slurm jobs in turn on GPU 0 (job ids from SLURM_JOB_ID in the environment): 901 input-starved
# (tools/workloads.py loader_workers), then 902 holding 20 GiB with nothing running; the whole run is recorded.
#   PROMETHEUS=/path/to/prometheus tools/device-cluster-live.sh OUTDIR
set -u
OUT=$1; mkdir -p "$OUT"
GPUWARDEN_PRICE_PER_GPU_HOUR=2.5 GPUWARDEN_NODE_NAME=h100-live \
  python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
daemon=$!
cat >"$OUT/prometheus.yml" <<'YML'
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: gpuwarden
    static_configs: [{targets: ["127.0.0.1:10400"]}]
YML
"$PROMETHEUS" --config.file="$OUT/prometheus.yml" --storage.tsdb.path="$OUT/tsdb" \
  --web.listen-address=127.0.0.1:9090 >"$OUT/prometheus.log" 2>&1 &
prom=$!
sleep 3
python3 -m gpuwarden record --duration 85 --out "$OUT/h100-jobs-in-turn.jsonl.gz" --meta scenario=jobs_in_turn \
  --meta recorded_by=tools/device-cluster-live.sh >"$OUT/record.log" 2>&1 &
rec=$!
SLURM_JOB_ID=901 python3 tools/workloads.py run loader_workers --seconds 40 >"$OUT/job901.log" 2>&1
SLURM_JOB_ID=902 python3 -c "import torch, time; x = torch.empty(20 * 2**30, dtype=torch.uint8, device='cuda'); \
torch.cuda.synchronize(); time.sleep(40)" >"$OUT/job902.log" 2>&1
wait "$rec"
curl -sf http://127.0.0.1:10400/metrics | grep -E '^(gpu_held_idle_energy|gpuwarden_gpu_hour_price|gpu_idle_seconds_total)' \
  | grep -v ' 0.0$'
export COLUMNS=150
python3 -m gpuwarden top --prometheus http://127.0.0.1:9090 --range 100s --step 1s
python3 -m gpuwarden top --prometheus http://127.0.0.1:9090 --range 100s --step 1s --json >"$OUT/top.json"
for j in 901 902; do
  python3 -m gpuwarden report --job $j --prometheus http://127.0.0.1:9090 --range 100s --step 1s
  python3 -m gpuwarden report --job $j --prometheus http://127.0.0.1:9090 --range 100s --step 1s --json >"$OUT/report-$j.json"
done
kill -TERM "$daemon" "$prom"; wait "$daemon"; echo "daemon exit $?"
rm -rf "$OUT/tsdb"
