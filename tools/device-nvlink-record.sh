#!/usr/bin/env bash
# Records a trace of a node's NVLink links and fabric while an all-reduce runs over them, and saves a scrape.
#   tools/device-nvlink-record.sh OUTDIR [SECONDS]
# Used on a lent machine of two or more GPUs linked by NVLink to produce tests/data/traces/h200x2-nvlink.jsonl.gz.
# The slow interval is 2 s so that each GPU's link counters (read every 10 slow reads) are read several times.
set -u
OUT=$1; SECS=${2:-40}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
python3 -m gpuwarden record --duration "$SECS" --poll.slow-interval 2 --out "$OUT/h200x2-nvlink.jsonl.gz" \
  --meta scenario=nvlink_allreduce --meta recorded_by=tools/device-nvlink-record.sh \
  --meta "workload=an all-reduce of 1 GiB over every GPU (NCCL), from ${SECS}/4 s on" &
rec=$!
python3 -m gpuwarden serve --poll.slow-interval 2 --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
daemon=$!
sleep $((SECS / 4))
python3 -c "import sys; sys.path.insert(0, 'tools'); import nvlink_probe as p; print(p.traffic($SECS / 2))" \
  >"$OUT/traffic.log" 2>&1
curl -sf http://127.0.0.1:10400/metrics -o "$OUT/scrape.txt"
wait "$rec"; echo "record exit $?"
kill -TERM "$daemon"; wait "$daemon"; echo "daemon exit $?"
python3 -m gpuwarden check --format json >"$OUT/check.json"; echo "check exit $?"
grep -E "^gpu_(nvlink|fabric)" "$OUT/scrape.txt" | head -12
tail -3 "$OUT/traffic.log"
