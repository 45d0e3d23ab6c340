#!/usr/bin/env bash
# On a lent GPU machine: a training job (tools/workloads.py) stopped with SIGSTOP while it holds its GPU, as Ctrl-Z, a
# debugger or a scheduler's suspend leave it. The daemon (live NVML) serves; its diagnosis is saved while the job is
# stopped; `gpuwarden record` records the stop and the SIGCONT after it.
#   tools/device-stopped.sh OUTDIR [SECONDS] [SCENARIO]
set -u
OUT=$1; SECS=${2:-40}; S=${3:-bf16_matmul}; WARM=${WARM:-12}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
daemon=$!
python3 tools/workloads.py run "$S" --gpu 0 --seconds $((WARM + SECS + 30)) >"$OUT/workload.log" 2>&1 &
wpid=$!
sleep "$WARM"
python3 -m gpuwarden record --duration "$SECS" --out "$OUT/stopped.jsonl.gz" --meta "scenario=$S stopped (SIGSTOP)" \
  --meta "workload_pid=$wpid" --meta recorded_by=tools/device-stopped.sh &
rec=$!
sleep 5
kill -STOP "$wpid"; echo "stopped $wpid at $(date +%s.%N)"
grep State /proc/$wpid/status
sleep $((SECS - 15))
curl -sf http://127.0.0.1:10400/api/v1/diagnosis -o "$OUT/diagnosis.json"
curl -sf http://127.0.0.1:10400/api/v1/idleness -o "$OUT/idleness.json"
kill -CONT "$wpid"; echo "continued at $(date +%s.%N)"
wait "$rec"; echo "record exit $?"
wait "$wpid"; echo "workload exit $?: $(tail -1 "$OUT/workload.log")"
kill -TERM "$daemon"; wait "$daemon"
python3 - "$OUT/diagnosis.json" <<'PY'
import json, sys
for g in json.load(open(sys.argv[1]))["gpus"][:1]:
    d = g.get("diagnosis") or {}
    print(g["gpu"], d.get("verdict"), d.get("summary"))
PY
cat "$OUT/idleness.json"; echo
