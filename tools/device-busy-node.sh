#!/usr/bin/env bash
# A production-like node on a lent GPU machine: a DataLoader of 16 workers on the GPU and 1,500 extra host processes,
# with gpuwarden and nvitop-exporter polling every second side by side (bench.compare --together), scraped every 15 s
# and then every 1 s; gpuwarden's verdict on the loader (diagnose, live); the NVML floor (bench.nvml_costs); and the
# busy-node benchmark over the fake NVML (bench.busy_node) on this machine's cores.
#   tools/device-busy-node.sh OUTDIR [SECONDS]      (from the repository root, wheels installed, PATH with their bin)
# SKIP_BUSY_NODE=1 leaves out the fake-NVML benchmark.
set -u
trap "kill 0" EXIT
OUT=$1; SECS=${2:-60}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ -z "${SKIP_BUSY_NODE:-}" ]; then
  python3 -m bench.busy_node --grid 1:16:0 8:16:2000 64:16:0 --seconds 10 --json "$OUT/busy-node.json" \
    2>&1 | tee "$OUT/busy-node.txt"
fi
python3 tools/workloads.py run loader_workers --workers 16 --seconds $((4 * SECS + 200)) >"$OUT/loader.log" 2>&1 </dev/null &
loader=$!
sleepers=()
for _ in $(seq 1500); do sleep 3600 </dev/null >/dev/null 2>&1 & sleepers+=($!); done
echo "host processes: $(ls /proc | grep -c '^[0-9]')"
sleep 20  # the loader's workers up
python3 -m bench.compare --together --only gpuwarden,nvitop-exporter --duration "$SECS" --warmup 20 \
  --scrape-interval 15 --json "$OUT/compare-scrape15.json" 2>&1 | tail -14
python3 -m bench.compare --together --only gpuwarden,nvitop-exporter --duration "$SECS" --warmup 5 \
  --scrape-interval 1 --json "$OUT/compare-scrape1.json" 2>&1 | tail -14
python3 -m gpuwarden diagnose --seconds 30 --json >"$OUT/diagnose-loader.json" 2>"$OUT/diagnose.err"
python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['diagnosis']; [print('verdict', g['gpu'], g['diagnosis']['verdict'], g['diagnosis']['summary']) for g in d['gpus'] if g.get('diagnosis')]" "$OUT/diagnose-loader.json"
python3 -m bench.nvml_costs --polls 100 --interval 0.1 --json "$OUT/nvml-costs.json" 2>&1 | tail -25
kill "$loader" "${sleepers[@]}" 2>/dev/null; pkill -f "tools/workloads.py" 2>/dev/null
wait 2>/dev/null
echo done
