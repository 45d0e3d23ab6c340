#!/usr/bin/env python3
"""Builds gpuwarden's OCI image the way distributions build theirs, from packages only, then runs it.

    python3 tools/package_image.py --deb dist/gpuwarden_VERSION_ARCH.deb [--out dist] [--suite bookworm]
        [--mirror http://deb.debian.org/debian] [--no-run]

1. ``mmdebstrap --variant=minbase`` makes a minimal Debian root filesystem with python3.11, and installs gpuwarden's
   Debian package into it (``dpkg -i``: its postinst adds the gpuwarden user and compiles the bytecode), as a tar;
2. ``podman import`` makes it an image with the configuration of the Dockerfile's final stage (its ``ENV``, ``USER``,
   ``EXPOSE``, ``ENTRYPOINT`` and ``LABEL``, read with dockerfile-parse: one configuration for both ways to build, and
   both lay gpuwarden out alike: /opt/gpuwarden, /usr/bin/gpuwarden), and ``podman save`` writes it as an OCI archive
   (``OUT/gpuwarden-VERSION.oci.tar``) that any registry or runtime takes (``skopeo copy oci-archive:...``);
3. unless ``--no-run``: the image is run with ``--demo`` (runc, with explicit ``--ulimit`` values: on machines whose
   container lacks CAP_SYS_RESOURCE, crun's and runc's defaults raise limits and are refused, and crun refuses a
   hybrid cgroup hierarchy), scraped, and checked to run as the numeric non-root user; then the same root filesystem's
   ``/usr/bin/gpuwarden --version`` runs under ``chroot`` as the gpuwarden user the package added.

Prints what it built and measured; exits 1 with the step that failed. Needs root (mmdebstrap's root mode, podman,
chroot), network access to the Debian mirror, and mmdebstrap, podman and runc (Debian packages).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def image_config() -> dict[str, object]:
    """The Dockerfile's final stage configuration: {"env": {...}, "labels": {...}, "user": str, "expose": [str],
    "entrypoint": [str]} (dockerfile-parse). Raises SystemExit naming what is missing."""
    from dockerfile_parse import DockerfileParser

    parsed = DockerfileParser(path=str(REPO / "Dockerfile"), cache_content=True)
    stage = parsed.structure
    last_from = max(i for i, ins in enumerate(stage) if ins["instruction"] == "FROM")
    final = [(ins["instruction"], ins["value"]) for ins in stage[last_from:]]
    users = [v for k, v in final if k == "USER"]
    entry = [v for k, v in final if k == "ENTRYPOINT"]
    if not users or not entry:
        raise SystemExit("package_image: the Dockerfile's final stage names no USER or ENTRYPOINT")
    return {"env": parsed.envs, "labels": parsed.labels, "user": users[-1],
            "expose": [v for k, v in final if k == "EXPOSE"], "entrypoint": json.loads(entry[-1])}  # fmt: skip


def changes(config: dict[str, object]) -> list[str]:
    """``podman import --change`` arguments for ``config`` (Dockerfile instructions, one each)."""
    out = [f"ENV {k}={v}" for k, v in config["env"].items()]  # type: ignore[attr-defined]
    out += [f"LABEL {k}={json.dumps(v)}" for k, v in config["labels"].items()]  # type: ignore[attr-defined]
    out += [f"EXPOSE {p}" for p in config["expose"]]  # type: ignore[attr-defined]
    out += [f"USER {config['user']}", f"ENTRYPOINT {json.dumps(config['entrypoint'])}"]
    return [arg for change in out for arg in ("--change", change)]


def run(*cmd: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; on failure exit 1 with its command and the end of its output."""
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and res.returncode != 0:
        tail = (res.stderr or res.stdout).strip()[-1500:]
        raise SystemExit(f"package_image: {shlex.join(cmd[:4])} ... exited {res.returncode}:\n{tail}")
    return res


def rootfs(deb: Path, tar: Path, suite: str, mirror: str) -> None:
    """A minimal Debian root filesystem with ``deb`` installed, as ``tar``: documentation, manuals and locales left
    out (dpkg path-exclude, as Debian's slim images do)."""
    name = deb.name
    excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("man", "doc", "info", "locale", "lintian")]
    run("mmdebstrap", "--variant=minbase", "--include=python3.11,passwd,init-system-helpers", *excludes,
        "--dpkgopt=path-include=/usr/share/doc/gpuwarden/*",
        f"--customize-hook=copy-in {deb} /tmp", f'--customize-hook=chroot "$1" dpkg -i /tmp/{name}',
        f'--customize-hook=rm "$1"/tmp/{name}', suite, str(tar), mirror)  # fmt: skip


def scrape(port: int, deadline: float) -> str:
    """/metrics of the daemon on 127.0.0.1:``port`` once it answers (until ``deadline``, monotonic)."""
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:  # noqa: S310
                return str(resp.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def free_port() -> int:
    """A free TCP port of 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_image(image: str, config: dict[str, object]) -> str:
    """Run ``image`` with ``--demo`` (host network, on a free port), scrape it, check its user; return a summary."""
    port = free_port()
    name = f"gpuwarden-smoke-{port}"
    limits = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
    run("podman", "--runtime", "runc", "run", "-d", "--rm", "--name", name, "--network", "host", *limits, image,
        "--demo", "--web.listen-address", f"127.0.0.1:{port}")  # fmt: skip
    try:
        began = time.monotonic()
        body = scrape(port, began + 120)
        took = time.monotonic() - began
        top = run("podman", "top", name, "user", "args").stdout.splitlines()
    finally:
        run("podman", "stop", "-t", "10", name, check=False)
    if "gpu_up{" not in body or "gpuwarden_build_info" not in body:
        raise SystemExit(f"package_image: the container's /metrics lacks gpu_up: {body[:300]!r}")
    user = str(config["user"]).split(":")[0]
    if len(top) < 2 or top[1].split()[0] != user:
        raise SystemExit(f"package_image: the container does not run as user {user}: {top}")
    return f"served /metrics ({len(body):,} bytes) {took:.1f} s after start, as user {user}: {top[1].split(None, 1)[1]}"


def chroot_check(tar: Path, work: Path) -> str:
    """The root filesystem unpacked: the package's user, its bytecode, and ``gpuwarden --version`` as that user."""
    root = work / "root"
    root.mkdir()
    run("tar", "-C", str(root), "-xf", str(tar))
    passwd = (root / "etc" / "passwd").read_text()
    if not any(line.startswith("gpuwarden:") for line in passwd.splitlines()):
        raise SystemExit("package_image: the package's postinst added no gpuwarden user")
    compiled = len(list((root / "opt" / "gpuwarden" / "lib").rglob("*.pyc")))
    if compiled == 0:
        raise SystemExit("package_image: the package's postinst compiled no bytecode")
    version = run("chroot", "--userspec=gpuwarden:gpuwarden", str(root), "/usr/bin/gpuwarden", "--version").stdout
    return f"{compiled:,} bytecode files; as the gpuwarden user: {version.splitlines()[0]}"


def main() -> int:
    """Build the root filesystem, the image and its OCI archive, then run them (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deb", required=True, type=Path, help="gpuwarden's Debian package (tools/package-deb.sh)")
    ap.add_argument("--out", type=Path, default=Path("dist"), help="where the OCI archive goes (default dist)")
    ap.add_argument("--suite", default="bookworm", help="the Debian suite (default bookworm: python3.11)")
    ap.add_argument("--mirror", default="http://deb.debian.org/debian", help="the Debian mirror")
    ap.add_argument("--no-run", action="store_true", help="build and inspect only")
    args = ap.parse_args()
    for tool in ("mmdebstrap", "podman", *(() if args.no_run else ("runc",))):
        if shutil.which(tool) is None:
            raise SystemExit(f"package_image: {tool} is not installed (apt-get install {tool})")
    version = args.deb.name.split("_")[1]
    config = image_config()
    image = f"localhost/gpuwarden:{version}"
    args.out.mkdir(parents=True, exist_ok=True)
    archive = args.out / f"gpuwarden-{version}.oci.tar"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tar = work / "rootfs.tar"
        began = time.monotonic()
        rootfs(args.deb.resolve(), tar, args.suite, args.mirror)
        print(f"root filesystem: {tar.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - began:.0f} s")
        run("podman", "import", *changes(config), str(tar), image)
        run("podman", "save", "--format", "oci-archive", "-o", str(archive), image)
        inspected = json.loads(run("podman", "image", "inspect", image).stdout)[0]["Config"]
        ports = sorted(inspected.get("ExposedPorts", {}))
        print(f"image {image}: {archive} ({archive.stat().st_size / 2**20:.0f} MiB), user {inspected.get('User')}, "
              f"entrypoint {inspected.get('Entrypoint')}, ports {ports}")  # fmt: skip
        if inspected.get("User") != config["user"] or inspected.get("Entrypoint") != config["entrypoint"]:
            raise SystemExit(f"package_image: the image's configuration is not the Dockerfile's: {inspected}")
        print(f"root filesystem under chroot: {chroot_check(tar, work)}")
        if not args.no_run:
            print(f"podman run {image} --demo: {run_image(image, config)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
