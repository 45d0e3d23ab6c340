#!/usr/bin/env bash
# Records the host-compute workloads (tools/workloads.py host_optimizer, host_metrics) at two sizes each on a lent
# GPU machine: a trace per variant (gpuwarden record, with the live daemon's verdict at the end in the header's
# metadata via the diagnose below), and what a running `serve`, `diagnose` live and `diagnose` over the replay say.
#   tools/device-record-host.sh OUTDIR [SECONDS]
set -u
OUT=$1; SECS=${2:-25}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 </dev/null &
daemon=$!
for v in host_optimizer:2048 host_optimizer:8192 host_metrics:2048 host_metrics:8192; do
  s=${v%%:*}; n=${v##*:}; name="h100-k-${s//_/-}-size-$n"
  python3 tools/workloads.py run "$s" --size "$n" --seconds $((SECS + 45)) >"$OUT/$name.workload.log" 2>&1 </dev/null &
  w=$!
  sleep 8  # the model built, the loop running
  python3 -m gpuwarden record --duration "$SECS" --interval 1 --out "$OUT/$name.jsonl.gz" --meta "scenario=$s" \
    --meta "size=$n" --meta "workload_pid=$w" --meta recorded_by=tools/device-record-host.sh >/dev/null 2>&1
  live=$(python3 -m gpuwarden diagnose --seconds 12 --json 2>/dev/null | python3 -c \
    "import json,sys; d=json.load(sys.stdin)['diagnosis']['gpus'][0]['diagnosis']; print(d['verdict'] if d else None)")
  replay=$(python3 -m gpuwarden diagnose --replay "$OUT/$name.jsonl.gz" --json 2>/dev/null | python3 -c \
    "import json,sys; d=json.load(sys.stdin)['diagnosis']['gpus'][0]['diagnosis']; print(d['verdict'] if d else None, '|', d['summary'] if d else '')")
  served=$(curl -sf http://127.0.0.1:10400/api/v1/diagnosis | python3 -c \
    "import json,sys; d=json.load(sys.stdin)['gpus'][0]['diagnosis']; print(d['verdict'] if d else None)")
  echo "$name serve=$served diagnose-live=$live replay=$replay"
  kill "$w" 2>/dev/null; wait "$w" 2>/dev/null
  tail -1 "$OUT/$name.workload.log"
done
kill -TERM "$daemon"; wait "$daemon"
