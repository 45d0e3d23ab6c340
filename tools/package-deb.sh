#!/usr/bin/env bash
# Builds the Debian package of gpuwarden: a self-contained virtual environment under /opt/gpuwarden (Debian's own
# python3.11, the dependencies at the versions and hashes of requirements.lock, the kubelet extra included, and
# gpuwarden's wheel), /usr/bin/gpuwarden and its bash completion, the systemd unit of deploy/systemd (ExecStart at
# /usr/bin/gpuwarden), /etc/gpuwarden/config.yml and gpuwarden.env as conffiles, and the maintainer scripts of
# deploy/debian (the gpuwarden system user, the bytecode compiled for the installed paths, the service enabled and
# started where systemd runs). Laid out as dh-virtualenv lays out such a package, built with dpkg-deb, checked with
# lintian where it is installed (deploy/debian/lintian-overrides gives each override its reason).
#   tools/package-deb.sh WHEEL [OUTDIR]     (from the repository root; .ci/run calls it)
# Prints the path of the .deb. Needs /usr/bin/python3.11 (Debian 12's) and pip 22.3 or newer as python3 -m pip.
set -euo pipefail
wheel=$(realpath "$1")
out=$(realpath -m "${2:-dist}")
version=$(basename "$wheel" | cut -d- -f2)  # NAME-VERSION-TAGS.whl
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
venv="$root/opt/gpuwarden"
# The environment is made where it is staged, then told where it will live: its scripts' interpreter lines and the
# activate script name the staging path, rewritten below. No bytecode is written here (it would name the staging
# path too): postinst compiles it for /opt/gpuwarden.
/usr/bin/python3.11 -m venv --without-pip "$venv"
pip_install() {  # without the warnings of index locations a machine's pip configuration names and lacks
  python3 -m pip --python "$venv/bin/python" install -q --no-compile --no-deps "$@" \
    2> >(grep -v '^WARNING: Location' >&2)
}
pip_install --require-hashes -r requirements.lock
pip_install "$wheel"
grep -rlI --null "$root" "$venv/bin" | xargs -0 sed -i "s#$root##g"
sed -i '/^command = /d' "$venv/pyvenv.cfg"
rm -f "$venv"/bin/Activate.ps1 "$venv"/bin/activate.csh "$venv"/bin/activate.fish
find "$venv" -name '__pycache__' -prune -exec rm -rf {} +
find "$venv/lib" -type f -perm /111 -exec chmod a-x {} +  # modules and shared objects are loaded, not run
if left=$(grep -rlI "$stage" "$root"); then
  echo "package-deb: the staging path is left in ${left%%$'\n'*}" >&2
  exit 1
fi
install -d "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/gpuwarden" "$root/usr/share/doc/gpuwarden" \
  "$root/usr/share/lintian/overrides" "$root/usr/share/bash-completion/completions" "$root/DEBIAN"
"$venv/bin/python" -m gpuwarden completion bash >"$root/usr/share/bash-completion/completions/gpuwarden"
ln -s /opt/gpuwarden/bin/gpuwarden "$root/usr/bin/gpuwarden"
sed 's#^ExecStart=/usr/local/bin/gpuwarden #ExecStart=/usr/bin/gpuwarden #' deploy/systemd/gpuwarden.service \
  >"$root/lib/systemd/system/gpuwarden.service"
grep -q '^ExecStart=/usr/bin/gpuwarden ' "$root/lib/systemd/system/gpuwarden.service"
install -m 0644 deploy/gpuwarden.example.yml "$root/etc/gpuwarden/config.yml"
install -m 0644 deploy/systemd/gpuwarden.env "$root/etc/gpuwarden/gpuwarden.env"
install -m 0644 deploy/debian/copyright "$root/usr/share/doc/gpuwarden/copyright"
install -m 0644 deploy/debian/lintian-overrides "$root/usr/share/lintian/overrides/gpuwarden"
when=$(date -R -u -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")
printf 'gpuwarden (%s) unstable; urgency=medium\n\n  * Release %s: CHANGELOG.md says what changed.\n\n -- %s  %s\n' \
  "$version" "$version" "gpuwarden authors <gpuwarden@users.noreply.github.com>" "$when" |
  gzip -9n >"$root/usr/share/doc/gpuwarden/changelog.gz"
printf '/etc/gpuwarden/config.yml\n/etc/gpuwarden/gpuwarden.env\n' >"$root/DEBIAN/conffiles"
install -m 0755 deploy/debian/postinst deploy/debian/prerm deploy/debian/postrm "$root/DEBIAN/"
(cd "$root" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum >DEBIAN/md5sums)
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: gpuwarden
Version: $version
Architecture: $arch
Maintainer: gpuwarden authors <gpuwarden@users.noreply.github.com>
Installed-Size: $size
Depends: python3.11, libc6 (>= 2.17), passwd, init-system-helpers (>= 1.54~)
Section: admin
Priority: optional
Homepage: https://github.com/gpuwarden/gpuwarden
Description: NVIDIA GPU monitoring daemon and Prometheus exporter
 gpuwarden polls NVML on every GPU node for utilization, memory, power,
 clocks and their event reasons, PCIe, NVLink, ECC, XID errors and
 processes, tells why a GPU is not working (a starved data loader, a job
 holding memory idle, a straggling peer), and serves it all as Prometheus
 metrics with alert rules and Grafana dashboards.
 .
 A self-contained environment under /opt/gpuwarden, the systemd unit
 gpuwarden.service, and its configuration in /etc/gpuwarden.
EOF
mkdir -p "$out"
deb="$out/gpuwarden_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
if command -v lintian >/dev/null 2>&1; then
  lintian --fail-on error,warning "$deb" >&2
fi
echo "$deb"
