#!/usr/bin/env bash
# On a lent GPU machine: record each workload kind of tools/workloads.py with `gpuwarden record` while a live
# `gpuwarden serve` runs, saving its /api/v1/diagnosis mid-run; optionally (OLD=DIR) serve a previous build side by
# side to compare CPU and resident memory. Results go to one tar.gz.
#   tools/device-record-kinds.sh OUTDIR "SCENARIO[:ARGS]..." [SECONDS]
set -u
OUT=$1; LIST=$2; SECS=${3:-25}; WARM=${WARM:-8}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
# the "remote storage" of remote_reader: one fast server, one slow with a latency per request
python3 tools/workloads.py serve-bytes --port 10501 --rate 200 >"$OUT/serve-bytes-fast.log" 2>&1 &
fast=$!
python3 tools/workloads.py serve-bytes --port 10502 --rate 20 --latency 0.02 >"$OUT/serve-bytes-slow.log" 2>&1 &
slow=$!
python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
new=$!
if [ -n "${OLD:-}" ]; then
  (cd "$OLD" && exec python3 -m exporter serve --web.listen-address 127.0.0.1:10401) >"$OUT/serve-old.log" 2>&1 &
  old=$!
fi
sleep 4
# the same request to both (ACCEPT unset: the text format, as the previous build serves it)
( while sleep 1; do curl -s -o /dev/null ${ACCEPT:+-H "Accept: $ACCEPT"} http://127.0.0.1:10400/metrics;
  [ -n "${OLD:-}" ] && curl -s -o /dev/null http://127.0.0.1:10401/metrics; done ) &
scraper=$!
for item in $LIST; do
  s=${item%%:*}; args=""; [ "$item" != "$s" ] && args=$(echo "${item#*:}" | tr ',' ' ')
  tag=$(echo "$item" | tr ':,= ' '____')
  python3 tools/workloads.py run "$s" $args --seconds $((SECS + WARM + 3)) --split-out "$OUT/$tag.split.json" \
    >"$OUT/$tag.workload.log" 2>&1 &
  w=$!
  sleep "$WARM"
  python3 -m gpuwarden record --duration "$SECS" --interval 1 --out "$OUT/$tag.jsonl.gz" --meta "scenario=$s" \
    --meta "workload_args=$args" --meta "workload_pid=$w" --meta recorded_by=tools/device-record-kinds.sh 2>>"$OUT/record.log" &
  rec=$!
  sleep "${CAPTURE:-$((SECS * 2 / 3))}"  # seconds into the recording when the live diagnosis is saved
  curl -s http://127.0.0.1:10400/api/v1/diagnosis -o "$OUT/$tag.live-diagnosis.json"
  wait "$rec"; wait "$w"; echo "$item: $(tail -1 "$OUT/$tag.workload.log")"
done
usage() { for p in $new ${old:-}; do
  echo "pid $p: $(awk '{print "cpu_s", ($14+$15)/100, "elapsed_s", '"$(cut -d' ' -f1 /proc/uptime)"' - $22/100}' /proc/$p/stat) $(grep VmRSS /proc/$p/status)"
done; }
usage | sed 's/^/after workloads: /' | tee "$OUT/cpu-rss.txt"
sleep "${IDLE:-0}"  # an idle GPU, both daemons still scraped every second
usage | sed "s/^/after ${IDLE:-0} s more, GPU idle: /" | tee -a "$OUT/cpu-rss.txt"
kill "$scraper" 2>/dev/null
curl -s http://127.0.0.1:10400/metrics | grep -E '^gpu_encoder|^gpuwarden_nvml_errors_total' | tee "$OUT/encoder-and-errors.txt"
curl -s -D - -o /dev/null -H 'Accept: application/openmetrics-text;version=1.0.0' -H 'Accept-Encoding: gzip' http://127.0.0.1:10400/metrics | head -8
python3 -m gpuwarden diagnose --replay "$OUT/$(echo "${LIST%% *}" | tr ':,= ' '____').jsonl.gz" | head -20
kill -TERM $new ${old:-} $fast $slow; wait
