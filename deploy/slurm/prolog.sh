#!/bin/sh
# gpuwarden's Slurm prolog: writes the job mapping directory (dcgm-exporter's HPC job mapping format) so that the
# daemon counts a GPU allocated to the job and never opened as allocated_idle, not free. In slurm.conf:
#   Prolog=/etc/slurm/prolog.d/gpuwarden.sh      (the epilog, deploy/slurm/epilog.sh, removes the job's lines)
# and in gpuwarden's configuration: job_mapping_dir: /run/gpuwarden/jobs (GPUWARDEN_JOB_MAPPING_DIR here).
#
# One file a GPU, named by its index, one job id a line; and owners/<job id>: user=NAME and account=NAME lines. The indices are SLURM_JOB_GPUS where Slurm gives the prolog
# that; else this node's GRES=gpu...(IDX:0-1,3) of `scontrol show job -d` (Slurm 22.05 gives a prolog no GPU ids).
# The prolog never fails the job: a job that cannot be written is only not counted.
DIR=${GPUWARDEN_JOB_MAPPING_DIR:-/run/gpuwarden/jobs}

[ -n "$SLURM_JOB_ID" ] || exit 0
gpus=$(echo "${SLURM_JOB_GPUS:-}" | tr ',' ' ')
if [ -z "$gpus" ]; then
    idx=$(scontrol show job -d "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | while read -r field; do
        case "$field" in
            Nodes=*) nodes=${field#Nodes=} ;;
            GRES=*IDX:*)
                if scontrol show hostnames "$nodes" 2>/dev/null | grep -qxF "${SLURMD_NODENAME:-}"; then
                    field=${field#*IDX:}
                    echo "${field%%)*}"
                fi ;;
        esac
    done | tr ',' ' ')
    for item in $idx; do
        case "$item" in
            *-*) gpus="$gpus $(seq "${item%-*}" "${item#*-}" 2>/dev/null | tr '\n' ' ')" ;;
            *) gpus="$gpus $item" ;;
        esac
    done
fi
[ -n "$gpus" ] || exit 0
mkdir -p "$DIR" 2>/dev/null || exit 0
for gpu in $gpus; do
    case "$gpu" in
        *[!0-9]*|'') continue ;;
    esac
    echo "$SLURM_JOB_ID" >> "$DIR/$gpu" 2>/dev/null
done
# the job's owner, so that GPU-hours add up by user and account (gpuwarden top --by account)
mkdir -p "$DIR/owners" 2>/dev/null &&
    printf 'user=%s\naccount=%s\n' "${SLURM_JOB_USER:-}" "${SLURM_JOB_ACCOUNT:-}" > "$DIR/owners/$SLURM_JOB_ID" 2>/dev/null
exit 0
