#!/bin/bash
# exp/scan.sh DIST SELECTOR...: per call, the average active threads per warp instruction, warp instructions and duration
D=$1; shift
rm -rf /tmp/tk-site /tmp/tk-work; mkdir -p /tmp/tk-site /tmp/tk-work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tk-site $D/*.whl
cp -r tests benchmarks pyproject.toml /tmp/tk-work/; cd /tmp/tk-work
PYTHONPATH=/tmp/tk-site timeout 400 ncu --profile-from-start off --nvtx --clock-control none --print-units base --csv \
  --metrics smsp__thread_inst_executed_per_inst_executed.ratio,smsp__inst_executed.sum,gpu__time_duration.sum \
  python3 -m benchmarks.ncu_profile "$@"
