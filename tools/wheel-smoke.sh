#!/usr/bin/env bash
# Builds the sdist and the wheel, checks them (twine), installs the wheel into a fresh virtual environment outside
# the checkout and smoke-tests the installed command there: serve --demo, one scrape, diagnose, mixin, --version.
#   tools/wheel-smoke.sh [OUTDIR]      (run from the repository root; .ci/run calls it)
set -euo pipefail
out=${1:-dist}
rm -rf "$out"
python3 -m pip install -q build twine
python3 -m build -q --sdist --wheel --outdir "$out" . >/dev/null
python3 -m twine check --strict "$out"/*
work=$(mktemp -d)
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
wheel=$(realpath "$out"/*.whl)  # the smoke runs away from the checkout, where a relative OUTDIR is not
"$work/venv/bin/python" -m pip install -q "$wheel"
cd "$work"  # away from the checkout: only the installed wheel can be imported
port=$("$work/venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$work/venv/bin/gpuwarden" serve --demo --web.listen-address "127.0.0.1:$port" 2>"$work/serve.log" &
pid=$!
"$work/venv/bin/python" - "$port" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/metrics"
for _ in range(100):
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode()
        break
    except OSError:
        time.sleep(0.2)
else:
    sys.exit("the installed daemon did not answer")
assert "gpu_up" in body and "gpuwarden_build_info" in body, body[:500]
print(f"wheel smoke: scrape of the installed daemon OK ({len(body)} bytes)")
PY
"$work/venv/bin/python" -c 'import gpuwarden, sys; assert "site-packages" in gpuwarden.__file__, gpuwarden.__file__'
demo=$("$work/venv/bin/python" -c 'from gpuwarden.replay import demo_trace_path; print(demo_trace_path())')
"$work/venv/bin/gpuwarden" diagnose --replay "$demo" >/dev/null
"$work/venv/bin/gpuwarden" top --help >/dev/null
# the kubelet client's gRPC runtime is the kubelet extra: without it a configured socket is one line at start
printf 'kubelet_socket: /nonexistent/kubelet.sock\n' >"$work/kubelet.yml"
if "$work/venv/bin/gpuwarden" serve --config.file "$work/kubelet.yml" --web.listen-address 127.0.0.1:0 \
    2>"$work/kubelet.err"; then
  echo "wheel smoke: a kubelet_socket without the kubelet extra was accepted" >&2; exit 1
fi
grep -q "pip install 'gpuwarden\[kubelet\]'" "$work/kubelet.err" && test "$(wc -l <"$work/kubelet.err")" -eq 1
# with it, the client's generated messages and its gRPC runtime
"$work/venv/bin/python" -m pip install -q "$wheel[kubelet]"
"$work/venv/bin/python" -c 'from gpuwarden.kubelet.client import PodResources; PodResources().close()'
# the rules, routes and dashboards come with the wheel, rendered for a site (promtool and amtool where installed)
"$work/venv/bin/gpuwarden" mixin --out "$work/site" --runbook-url https://wiki.example/gpu \
  --grafana-url https://grafana.example --dcgm-compat both >/dev/null
test -s "$work/site/grafana/dashboards/gpuwarden-node.json"
grep -q 'runbook_url: https://wiki.example/gpu#gpulost' "$work/site/prometheus/gpuwarden.rules.yml"
if command -v promtool >/dev/null; then
  promtool check rules "$work/site/prometheus/gpuwarden.rules.yml" "$work/site/prometheus/dcgm-compat.rules.yml" >/dev/null
fi
if command -v amtool >/dev/null; then amtool check-config "$work/site/alertmanager/alertmanager.yml" >/dev/null; fi
"$work/venv/bin/gpuwarden" --version | head -1
echo "wheel smoke: OK"
