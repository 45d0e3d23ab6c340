#!/usr/bin/env bash
# Runs the daemon against real NVML while a workload runs, records a trace of it, and saves a scrape.
#   tools/device-live-check.sh WORKLOADS_PY SCENARIO OUTDIR [SECONDS]
# Used on the lent GPU machines to produce tests/data/scrapes/* and tests/data/traces/* (see their README).
set -u
W=$1; S=$2; OUT=$3; SECS=${4:-30}; WARM=${WARM:-10}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
daemon=$!
python3 "$W" run "$S" --seconds $((SECS + WARM + 5)) >"$OUT/$S.workload.log" 2>&1 &
wpid=$!
sleep "$WARM"
python3 -m gpuwarden record --duration "$SECS" --out "$OUT/$S.jsonl.gz" --meta "scenario=$S" \
  --meta "workload_pid=$wpid" --meta recorded_by=tools/device-live-check.sh &
rec=$!
sleep $((SECS / 2))
curl -sf -w 'scrape seconds: %{time_total}\n' http://127.0.0.1:10400/metrics -o "$OUT/$S.scrape.txt"
curl -sf http://127.0.0.1:10400/api/v1/gpus -o "$OUT/$S.gpus.json"
curl -sf http://127.0.0.1:10400/api/v1/diagnosis -o "$OUT/$S.diagnosis.json" || true
curl -s http://127.0.0.1:10400/readyz; echo
ps -o pid,rss,etimes,times,args -p "$daemon"
wait "$rec"
wait "$wpid"; echo "workload exit $?: $(tail -1 "$OUT/$S.workload.log")"
kill -TERM "$daemon"; wait "$daemon"; echo "daemon exit $?"
tail -5 "$OUT/serve.log"
