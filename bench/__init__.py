"""Benchmarks of gpuwarden (issue 6): scrape latency, CPU, memory, exposition size, poll cost.

``python3 -m bench.run`` measures gpuwarden over replayed and real GPUs; ``python3 -m bench.compare`` puts it
side by side with nvitop-exporter and an nvidia-smi shell-out exporter on one GPU machine;
``python3 bench/nvml_costs.py`` times each NVML call the poller makes. Method and figures: docs/performance.md.
"""
