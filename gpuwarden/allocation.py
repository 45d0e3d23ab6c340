"""Which jobs a scheduler allocated each GPU to, from an HPC job mapping directory (Slurm's prolog writes it).

The format is dcgm-exporter's HPC job mapping: a directory with one file a GPU, named by its NVML index (``0``,
``1``; ``2.0`` for MIG instance 0 of GPU 2), holding the ids of the jobs allocated that GPU, one a line. A site's
prolog writes the files for the job's GPUs (``CUDA_VISIBLE_DEVICES`` / ``SLURM_JOB_GPUS``) and its epilog removes
them, so a site that feeds dcgm-exporter this way feeds gpuwarden with the same scripts (deploy/slurm has both).

gpuwarden's prolog also writes each job's owner in ``owners/<job id>`` (lines ``user=NAME`` and ``account=NAME``,
Slurm's SLURM_JOB_USER and SLURM_JOB_ACCOUNT): read for the jobs the files name, they label gpu_job_info so that
lost GPU-hours add up by user and account (``gpuwarden top --by account``). A directory without it (dcgm-exporter's
scripts) gives jobs without owners.

The files are read at every poll: a few small files, as many as the node has GPUs and jobs. Their content is hostile
input (anyone who can write the directory): a line that is not a job id (letters, digits and ``_ + . -``, at most
MAX_JOB_ID_CHARS) is left out, logged once per file, and at most MAX_JOBS_PER_GPU ids are kept a GPU; an owner's
name that is not a Slurm user or account name (OWNER_NAME) is left out.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpuwarden.insight.attribution import job_scope
from gpuwarden.insight.vocabulary.result import ProcessJob
from gpuwarden.model import GpuReading

log = logging.getLogger(__name__)

#: Longest job id kept (Slurm's ids are digits, ``123_4`` for an array task, ``123+0`` for a heterogeneous
#: component; a SLUID is 14 characters).
MAX_JOB_ID_CHARS = 64
#: Most job ids kept for one GPU (a GPU shared by time-slicing or overcommit holds a few at most).
MAX_JOBS_PER_GPU = 16
#: Largest mapping file read, in bytes (MAX_JOBS_PER_GPU ids of MAX_JOB_ID_CHARS, with room to spare).
MAX_FILE_BYTES = 4096
_JOB_ID = re.compile(rf"[0-9A-Za-z][0-9A-Za-z_+.\-]{{0,{MAX_JOB_ID_CHARS - 1}}}")
_FILE = re.compile(r"(\d{1,4})(?:\.(\d{1,2}))?")
#: The subdirectory of each job's owner, a file a job id.
OWNERS = "owners"
#: What an owner's user or account name may be (POSIX user names and Slurm account names, with ``@`` for a domain's
#: users), at most 64 characters.
OWNER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+\-]{0,63}")
#: The owner fields read, as gpu_job_info names them.
OWNER_KEYS = ("user", "account")


def parse(text: str) -> tuple[list[str], int]:
    """The job ids of one mapping file's ``text`` (first seen first, each once, at most MAX_JOBS_PER_GPU) and the
    number of non-empty lines left out as not a job id."""
    ids: list[str] = []
    bad = 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not _JOB_ID.fullmatch(line):
            bad += 1
        elif line not in ids and len(ids) < MAX_JOBS_PER_GPU:
            ids.append(line)
    return ids, bad


def parse_owner(text: str) -> dict[str, str]:
    """The owner in an owner file's ``text``: ``user`` and ``account`` from its ``key=value`` lines, each where its
    value is an OWNER_NAME (the last line of a key wins); other lines are left out."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        key = key.strip()
        if sep and key in OWNER_KEYS and OWNER_NAME.fullmatch(value.strip()):
            out[key] = value.strip()
    return out


class JobMapping:
    """The HPC job mapping directory ``directory``: ``assign(gpus)`` sets each GPU's ``allocated_jobs``.

    A missing directory means no allocation (the prolog creates it with the first job); an unreadable file is left
    out of that poll, logged once until it reads again."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._warned: set[str] = set()

    def read(self) -> dict[int, list[str]]:
        """NVML index -> the job ids its file (and its MIG instances' files) name, in file name order; {} without
        the directory."""
        try:
            names = sorted(p.name for p in self.directory.iterdir())
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._warn(str(self.directory), f"the job mapping directory is unreadable: {exc.strerror}")
            return {}
        out: dict[int, list[str]] = {}
        for name in names:
            m = _FILE.fullmatch(name)
            if m is None:
                continue
            try:
                with (self.directory / name).open("rb") as f:
                    raw = f.read(MAX_FILE_BYTES)
            except (IsADirectoryError, FileNotFoundError):
                continue  # a directory of that name, or the epilog removed the file meanwhile
            except OSError as exc:
                self._warn(name, f"a job mapping file is unreadable: {exc.strerror}")
                continue
            self._warned.discard(name)
            ids, bad = parse(raw.decode("utf-8", "replace"))
            if bad:
                self._warn(f"{name}:bad", f"{bad} line(s) of a job mapping file are not job ids: left out")
            jobs = out.setdefault(int(m.group(1)), [])
            jobs.extend(j for j in ids if j not in jobs and len(jobs) < MAX_JOBS_PER_GPU)
        return out

    def owners(self, jobs: Iterable[str]) -> dict[str, dict[str, str]]:
        """Job id -> its owner (``parse_owner`` of ``owners/<id>``) for each of ``jobs`` (ids ``parse`` kept) that
        has one; a missing or unreadable file is no owner."""
        out: dict[str, dict[str, str]] = {}
        for job in jobs:
            try:
                with (self.directory / OWNERS / job).open("rb") as f:
                    owner = parse_owner(f.read(MAX_FILE_BYTES).decode("utf-8", "replace"))
            except OSError:
                continue
            if owner:
                out[job] = owner
        return out

    def assign(self, gpus: list[GpuReading]) -> list[GpuReading]:
        """``gpus`` with ``allocated_jobs`` and ``job_owners`` set from the directory, by NVML index."""
        mapped = self.read()
        if not mapped:
            return gpus
        owners = self.owners({j for jobs in mapped.values() for j in jobs})
        return [g.model_copy(update={"allocated_jobs": mapped[g.index],
                                     "job_owners": {j: owners[j] for j in mapped[g.index] if j in owners}})
                if g.index in mapped else g for g in gpus]  # fmt: skip

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, extra={"directory": str(self.directory), "file": key.split(":")[0]})


def allocated_jobs(
    gpus: Iterable[GpuReading], processes: Sequence[ProcessJob]
) -> dict[tuple[int, str, str, str], dict[str, str]]:
    """(gpu, uuid, job_kind, job_id) -> gpu_job_info's labels of each job a scheduler allocated one of ``gpus`` to
    (``processes``: the node's GPU processes with their jobs, gpuwarden.insight.vocabulary.result.ProcessJob): a Slurm
    job of the job mapping directory (``GpuReading.allocated_jobs``: its id as the job id and the Slurm job number), a
    Kubernetes pod the kubelet assigned it (``GpuReading.pods``). A pod's job id is its UID where a process of it is
    seen on the node (the id its processes' cgroups give), else ``namespace/pod`` (the pod-resources API names pods,
    not their UIDs)."""
    uids = {(p.namespace, p.pod): p.job for p in processes if p.job_kind == "kubernetes" and p.pod}
    out: dict[tuple[int, str, str, str], dict[str, str]] = {}
    for g in gpus:
        for job in g.allocated_jobs:
            owner = g.job_owners.get(job, {})
            out[(g.index, g.uuid, "slurm", job)] = {
                "job_id": job, "job_kind": "slurm", "job_scope": job_scope("slurm"), "namespace": "", "pod": "",
                "container": "", "slurm_job_id": job, "user": owner.get("user", ""),
                "account": owner.get("account", ""),
            }  # fmt: skip
        for a in g.pods:
            job = uids.get((a.namespace, a.pod), f"{a.namespace}/{a.pod}")
            labels = out.setdefault(
                (g.index, g.uuid, "kubernetes", job),
                {"job_id": job, "job_kind": "kubernetes", "job_scope": job_scope("kubernetes"),
                 "namespace": a.namespace, "pod": a.pod, "container": a.container, "slurm_job_id": "", "user": "",
                 "account": ""},
            )  # fmt: skip
            if labels["container"] != a.container:
                labels["container"] = "*"  # devices of several containers of the pod
    return out
