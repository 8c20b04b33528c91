#!/bin/bash
# exp/ncu.sh DIST SELECTOR...: ncu with stall reasons of benchmarks.ncu_profile selectors, from DIST's wheels
D=$1; shift
rm -rf /tmp/tk-site /tmp/tk-work; mkdir -p /tmp/tk-site /tmp/tk-work
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tk-site $D/*.whl
cp -r tests benchmarks pyproject.toml /tmp/tk-work/; cd /tmp/tk-work
PYTHONPATH=/tmp/tk-site timeout 300 ncu --profile-from-start off --nvtx --clock-control none --print-units base \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__inst_executed_op_shared_ld.sum' \
  python3 -m benchmarks.ncu_profile "$@"
