#!/bin/bash
# exp/ncu-src.sh DIST SELECTOR...: per-SASS-instruction executed counts (ncu source page, csv) of each profiled kernel
D=$1; shift
rm -rf /tmp/tk-site /tmp/tk-work; mkdir -p /tmp/tk-site /tmp/tk-work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tk-site $D/*.whl
cp -r tests benchmarks pyproject.toml /tmp/tk-work/; cd /tmp/tk-work
PYTHONPATH=/tmp/tk-site timeout 300 ncu --profile-from-start off --nvtx --clock-control none --section SourceCounters --section InstructionStats \
  -o /tmp/src-report -f python3 -m benchmarks.ncu_profile "$@" > $OUT/ncu-src-run.log 2>&1
ncu --import /tmp/src-report.ncu-rep --page source --csv --print-source sass > $OUT/ncu-src.csv 2>&1
ls -la $OUT; head -c 600 $OUT/ncu-src.csv
