#!/usr/bin/env bash
# Runs two daemons side by side on the GPUs of a device machine - this tree's and an older tree's (BEFORE, a folder
# holding its gpuwarden package) - while a workload runs, and saves a scrape of each: the series a GPU each exports
# on real NVML, against the same GPU at the same time.
#   tools/device-series-check.sh BEFORE SCENARIO OUTDIR [SECONDS]
set -u
B=$1; S=$2; OUT=$3; SECS=${4:-60}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
nvidia-smi -L
python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve-now.log" 2>&1 &
now=$!
(cd "$B" && exec python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10401) >"$OUT/serve-before.log" 2>&1 &
before=$!
python3 tools/workloads.py run "$S" --seconds "$SECS" >"$OUT/workload.log" 2>&1 &
wpid=$!
sleep $((SECS - 10))
curl -sf http://127.0.0.1:10400/metrics -o "$OUT/now.prom"
curl -sf http://127.0.0.1:10401/metrics -o "$OUT/before.prom"
curl -sf "http://127.0.0.1:10400/metrics" -H 'Accept: application/openmetrics-text' -o /dev/null -w 'now scrape %{time_total}s\n'
ps -o pid,rss,etimes,times,args -p "$now" -p "$before"
wait "$wpid"; echo "workload exit $?: $(tail -1 "$OUT/workload.log")"
kill -TERM "$now" "$before"; wait "$now"; echo "daemon exit $?"; wait "$before"
tail -3 "$OUT/serve-now.log" "$OUT/serve-before.log"
