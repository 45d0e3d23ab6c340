#!/usr/bin/env bash
# An exited process whose memory a forked child keeps, beside a job running kernels, under a live gpuwarden:
# does NVML go on listing the exited PID, and which job does gpuwarden give the GPU?
#   tools/device-exited-holder.sh OUTDIR
set -u
OUT=$1; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m gpuwarden serve --web.listen-address 127.0.0.1:10400 >"$OUT/serve.log" 2>&1 &
daemon=$!
# the job that works: bf16 products on GPU 0 for 70 s, 900 MB
python3 -c "
import torch, time
a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.time() + 70
while time.time() < end:
    for _ in range(20): a @ b
    torch.cuda.synchronize(); time.sleep(0.05)
" >"$OUT/train.log" 2>&1 &
train=$!
# the parent: CUDA initialised, 1.7 GB held, forks a helper that sleeps (keeping the device open), then exits
python3 -c "
import os, sys, time, torch
x = torch.empty(1700 * 2**20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()
pid = os.fork()
if pid == 0:
    time.sleep(80); os._exit(0)
print('parent', os.getpid(), 'helper', pid, flush=True)
os._exit(0)
" >"$OUT/parent.log" 2>&1
sleep 25
cat "$OUT/parent.log"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do
  [ -d /proc/$p ] && echo "pid $p: in /proc ($(tr '\0' ' ' </proc/$p/cmdline | cut -c1-60))" || echo "pid $p: NOT in /proc"
done
curl -sf http://127.0.0.1:10400/metrics >"$OUT/metrics.txt"
grep -E '^gpu_(process_job_info|process_memory_used_bytes|job_info)' "$OUT/metrics.txt"
curl -sf http://127.0.0.1:10400/api/v1/diagnosis >"$OUT/diagnosis.json"
python3 -c "
import json; d = json.load(open('$OUT/diagnosis.json'))
for j in d['jobs']: print('job', j['job'], 'kind', j['job_kind'], 'gpus', j['gpus'], 'pids', j['pids'])
for p in d['processes']: print('pid', p['pid'], 'job', p['job'], 'user', p['user'], 'kept_by', p.get('kept_by'), 'MiB', (p['gpu_memory_bytes'] or 0) >> 20)
"
ps -o pid,ppid,cmd -p "$(cat /proc/*/task/*/children 2>/dev/null | tr ' ' '\n' | sort -u | tr '\n' ',' | sed 's/,$//')" 2>/dev/null | grep -i python | head -5
wait "$train"
kill -TERM "$daemon"; wait "$daemon"
