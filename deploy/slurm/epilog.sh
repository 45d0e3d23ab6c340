#!/bin/sh
# gpuwarden's Slurm epilog: one JSON record of the job's GPU efficiency, written once per job (from its first node),
# kept after Prometheus's retention has dropped the series. In slurm.conf: Epilog=/etc/slurm/epilog.d/gpuwarden.sh
#
# Settings (environment, or edit the defaults here):
#   GPUWARDEN_PROMETHEUS    the Prometheus HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics)
#   GPUWARDEN_JOB_RECORDS   the directory of the records: one file per job, <id>.json
#   GPUWARDEN_REPORT_ARGS   more flags for `gpuwarden report` (--header, --prometheus.bearer-token-file, --selector)
#   GPUWARDEN_JOB_MAPPING_DIR the job mapping directory deploy/slurm/prolog.sh writes: the job's lines are removed
#                           on every node
#
# The job's series carry its SLUID on Slurm 26.05+ (cgroups named by SLUID, the default), its numeric id before
# that or with CgroupJobIdPaths=yes: the record is asked for under the SLUID first, then the numeric id.
# The epilog never fails the job: every error goes to the record's .err file.
PROMETHEUS=${GPUWARDEN_PROMETHEUS:-http://prometheus:9090}
RECORDS=${GPUWARDEN_JOB_RECORDS:-/var/log/gpuwarden/jobs}
GPUWARDEN=${GPUWARDEN:-gpuwarden}

[ -n "$SLURM_JOB_ID" ] || exit 0

# the job mapping (deploy/slurm/prolog.sh), on every node: the job's lines out of each GPU's file, an empty file out
MAPPING=${GPUWARDEN_JOB_MAPPING_DIR:-/run/gpuwarden/jobs}
for f in "$MAPPING"/*; do
    [ -f "$f" ] || continue
    grep -vxF "$SLURM_JOB_ID" "$f" > "$f.tmp" 2>/dev/null
    if [ -s "$f.tmp" ]; then mv "$f.tmp" "$f"; else rm -f "$f" "$f.tmp"; fi
done
rm -f "$MAPPING/owners/$SLURM_JOB_ID"

first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)
[ -z "$first" ] || [ "$first" = "$SLURMD_NODENAME" ] || exit 0

# the range: from the job's start (SLURM_JOB_START_TIME where Slurm sets it, else scontrol) to now, plus 2 minutes
start=${SLURM_JOB_START_TIME:-}
if [ -z "$start" ]; then
    when=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.*StartTime=\([^ ]*\).*/\1/p')
    start=$(date -d "$when" +%s 2>/dev/null || echo 0)
fi
now=$(date +%s)
minutes=$(( (now - start) / 60 + 2 ))
[ "$start" -gt 0 ] 2>/dev/null || minutes=$(( 7 * 24 * 60 ))

mkdir -p "$RECORDS" || exit 0
out="$RECORDS/$SLURM_JOB_ID.json"
for id in ${SLURM_JOB_SLUID:-} "$SLURM_JOB_ID"; do
    # shellcheck disable=SC2086 # GPUWARDEN_REPORT_ARGS is a list of flags
    if "$GPUWARDEN" report --job "$id" --prometheus "$PROMETHEUS" --range "${minutes}m" --json \
        $GPUWARDEN_REPORT_ARGS > "$out.tmp" 2> "$out.err"; then
        mv "$out.tmp" "$out" && rm -f "$out.err"
        exit 0
    fi
done
rm -f "$out.tmp"
exit 0
