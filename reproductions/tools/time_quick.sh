#!/usr/bin/env bash
# Wall time of `python -m reproductions --experiment E --quick`, end to end, for each experiment E in turn,
# from an empty results folder and an empty data/feature cache (as on a fresh machine), into a
# scratch folder so that the committed records are untouched. Prints one line per experiment.
#   bash reproductions/tools/time_quick.sh [SCRATCH=/tmp/quick-timing] [EXPERIMENTS="table2 finetune dirichlet"]
# Afterwards, `python -m reproductions.tools.compare_reruns --reruns SCRATCH/results` compares them with the records.
set -uo pipefail
cd "$(dirname "$0")/../.."
scratch=${1:-/tmp/quick-timing}
experiments=${2:-table2 finetune dirichlet}
rm -rf "$scratch" && mkdir -p "$scratch"
export DPNOISE_CACHE=$scratch/cache
for experiment in $experiments; do
  started=$(date +%s)
  echo "$(date -u +%FT%TZ) start $experiment"
  .venv/bin/python -m reproductions --experiment "$experiment" --quick --results-dir "$scratch/results" \
    --figures-dir "$scratch/figures" --work-dir "$scratch/runs" \
    > "$scratch/$experiment.log" 2>&1
  status=$?
  echo "$(date -u +%FT%TZ) end $experiment exit=$status minutes=$(( ($(date +%s) - started) / 60 ))"
done
