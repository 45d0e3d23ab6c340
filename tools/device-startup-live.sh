#!/usr/bin/env bash
# On a lent GPU machine: jobs that start up (CUDA context, then a model built on the CPU) and then run, one after
# another, under a live `gpuwarden serve` (code evidence on) that sees each arrive; its /api/v1/diagnosis is saved
# every 2 s, and one `gpuwarden record` covers the whole session, so the live verdicts can be compared with the
# replay of the same session (tools/compare_live_replay.py).
#   tools/device-startup-live.sh OUTDIR "SCENARIO[:ARGS]..." [SECONDS] [STARTUP]
set -u
OUT=$1; LIST=$2; SECS=${3:-45}; START=${4:-12}; GAP=${GAP:-6}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
cat >"$OUT/gpuwarden.yml" <<EOF
insight:
  code_evidence:
    enabled: true
    seconds: 5
    every_seconds: 60
EOF
python3 -m gpuwarden serve --config.file "$OUT/gpuwarden.yml" --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
daemon=$!
n=$(echo $LIST | wc -w)
total=$(( n * (SECS + START + GAP + 8) + 10 ))
python3 -m gpuwarden record --duration "$total" --poll.interval 1 --out "$OUT/session.jsonl.gz" \
  --meta "jobs=$LIST" --meta recorded_by=tools/device-startup-live.sh 2>>"$OUT/record.log" &
rec=$!
( while sleep 2; do curl -s http://127.0.0.1:10400/api/v1/diagnosis; echo; done ) >"$OUT/live.jsonl" &
watcher=$!
sleep "$GAP"
for item in $LIST; do
  s=${item%%:*}; args=""; [ "$item" != "$s" ] && args=$(echo "${item#*:}" | tr ',' ' ')
  tag=$(echo "$item" | tr ':,= ' '____')
  echo "$(date +%s.%N) start $item" >>"$OUT/jobs.txt"
  python3 tools/workloads.py run "$s" $args --startup "$START" --seconds "$SECS" >"$OUT/$tag.workload.log" 2>&1
  echo "$(date +%s.%N) end $item: $(tail -1 "$OUT/$tag.workload.log")" >>"$OUT/jobs.txt"
  sleep "$GAP"
done
kill "$watcher"
wait "$rec"
ps -o pid,rss,etimes,times,args -p "$daemon" | tee "$OUT/daemon-usage.txt"
kill -TERM "$daemon"; wait "$daemon"
cat "$OUT/jobs.txt"
grep -c '"summary"' "$OUT/live.jsonl"
