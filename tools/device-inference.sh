#!/usr/bin/env bash
# On a lent GPU machine: inference servers of several shapes and rates, a job stopped in cycles and device-to-host
# copies (tools/workloads.py, tools/serving_workloads.py), each recorded with `gpuwarden record` while a live
# `gpuwarden serve` (default 1 s poll) runs, its /api/v1/diagnosis and /api/v1/idleness saved near the recording's
# end; with OLD=DIR a previous tree's daemon serves beside it (its CPU and RSS in the same run). One tar.gz out.
#   tools/device-inference.sh OUTDIR "SCENARIO[:ARGS]..." [SECONDS]
set -u
OUT=$1; LIST=$2; SECS=${3:-22}; WARM=${WARM:-8}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
new=$!
if [ -n "${OLD:-}" ]; then
  (cd "$OLD" && exec python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10401) >"$OUT/serve-old.log" 2>&1 &
  old=$!
fi
sleep 4
( while sleep 1; do curl -s -o /dev/null http://127.0.0.1:10400/metrics;
  [ -n "${OLD:-}" ] && curl -s -o /dev/null http://127.0.0.1:10401/metrics; done ) &
scraper=$!
for item in $LIST; do
  s=${item%%:*}; args=""; [ "$item" != "$s" ] && args=$(echo "${item#*:}" | tr ',' ' ')
  tag=$(echo "$item" | tr ':,= ' '____' | tr -s '_' | sed 's/_-/-/g')
  python3 tools/workloads.py run "$s" $args --seconds $((SECS + WARM + 3)) --split-out "$OUT/$tag.split.json" \
    >"$OUT/$tag.workload.log" 2>&1 &
  w=$!
  sleep "$WARM"
  python3 -m gpuwarden record --duration "$SECS" --interval 1 --out "$OUT/$tag.jsonl.gz" --meta "scenario=$s" \
    --meta "workload_args=$args" --meta "workload_pid=$w" --meta recorded_by=tools/device-inference.sh \
    2>>"$OUT/record.log" &
  rec=$!
  sleep "${CAPTURE:-$((SECS - 2))}"
  curl -s http://127.0.0.1:10400/api/v1/diagnosis -o "$OUT/$tag.live-diagnosis.json"
  curl -s http://127.0.0.1:10400/api/v1/idleness -o "$OUT/$tag.live-idleness.json"
  curl -s http://127.0.0.1:10400/metrics -o "$OUT/$tag.live-metrics.txt"
  wait "$rec"; wait "$w"; echo "$item: $(tail -1 "$OUT/$tag.workload.log")"
done
usage() { for p in $new ${old:-}; do
  echo "pid $p: $(awk '{print "cpu_s", ($14+$15)/100, "elapsed_s", '"$(cut -d' ' -f1 /proc/uptime)"' - $22/100}' /proc/$p/stat) $(grep VmRSS /proc/$p/status)"
done; }
usage | tee "$OUT/cpu-rss.txt"
kill "$scraper" 2>/dev/null
kill -TERM $new ${old:-}; wait
