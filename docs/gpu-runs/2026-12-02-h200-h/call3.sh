#!/usr/bin/env bash
# Nsight Compute counters of the landed per_token_requant e4m3 -> e2m1 (float32 with and without round_sf, packed UE8M0)
# and e4m3 -> e4m3 packed, for the next session's direction.
set -u
O=$1
SITE=/tmp/tk-site; rm -rf $SITE /tmp/tk-work; mkdir -p $SITE /tmp/tk-work
python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE dist-final/*.whl || exit 1
cp -r tests benchmarks pyproject.toml /tmp/tk-work/; cd /tmp/tk-work
export PYTHONPATH=$SITE
timeout 400 ncu --profile-from-start off --nvtx --clock-control none --print-units base \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
  --section SchedulerStats --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis \
  python3 -m benchmarks.ncu_profile 'quant.per_token_requant:"fmt":"e2m1","in_fmt":"e4m3"' \
  'quant.per_token_requant:"fmt":"e4m3","in_fmt":"e4m3","in_sf_format":"ue8m0"' > $O/ncu.log 2>&1
echo "ncu rc $?"
python3 -m benchmarks.ncu_profile --table $O/ncu.log > $O/ncu-table.md 2>&1; cat $O/ncu-table.md | head -40
grep -E "profiled:|Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc A|No Eligible|Pipe|ALU|FMA" $O/ncu.log | head -80
