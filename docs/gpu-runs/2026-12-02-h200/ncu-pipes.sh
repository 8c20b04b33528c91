#!/bin/bash
# exp/ncu-pipes.sh DIST SELECTOR...: per-pipe instruction counts and utilisation, memory workload, from DIST's wheels
D=$1; shift
rm -rf /tmp/tk-site /tmp/tk-work; mkdir -p /tmp/tk-site /tmp/tk-work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tk-site $D/*.whl
cp -r tests benchmarks pyproject.toml /tmp/tk-work/; cd /tmp/tk-work
PYTHONPATH=/tmp/tk-site timeout 300 ncu --profile-from-start off --nvtx --clock-control none --print-units base \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats --section WarpStateStats \
  --metrics 'regex:^sm__inst_executed_pipe_[a-z_]*\.sum$,regex:^sm__pipe_[a-z_]*_cycles_active\.avg\.pct_of_peak_sustained_active$,regex:^sm__inst_executed_pipe_[a-z_]*\.avg\.pct_of_peak_sustained_active$' \
  python3 -m benchmarks.ncu_profile "$@"
