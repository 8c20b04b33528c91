#!/usr/bin/env bash
# One GPU run on a machine with a GPU and no network: install the wheels built here (dist/), run
# the GPU tests and the benchmarks from a copy of the checkout outside it (so that imports resolve to
# the installed wheels, not to the source tree), leave every log under $OUT, and end by condensing them
# into the run's record, $OUT/DATE-GPU.jsonl (benchmarks/record.py; copy it to docs/measurements/).
#   COMMIT=SHA bash .ci/gpu-run.sh [tests] [bench] [tune] [cold] [pip] [host] [upstream] [profile] [ncu] [sanitize] [adversarial] [ep_moe] [ab]
# (default steps: tests bench tune cold). COMMIT names the commit the wheels were built from; without it the
# script reads $DIST/COMMIT, and without that the record is left to `python -m benchmarks.record $OUT --commit SHA`.
# Test dependencies the GPU host lacks (hypothesis and sortedcontainers, for tests/gpu/test_fuzz_ops.py; pytest-xdist and
# execnet, for TESTS_WORKERS) are installed from .whl/ when it is carried there. .ci/gpu-prep.sh makes .whl/, the
# wheels, the upstream pack and build-launch/ on the build machine.
set -uo pipefail
OUT=${OUT:-/tmp/tk-out}
SITE=${SITE:-/tmp/tk-site}  # the installed wheels; WORK: the copy of the tests the steps run in (two runs at once: set both apart)
WORK=${WORK:-/tmp/tk-work}
steps=${*:-tests bench tune cold}
DIST=${DIST:-dist}          # the wheels to install
TESTS=${TESTS:-tests/gpu tests/test_readme.py}   # pytest selection (the README blocks run on the GPU too)
KERNELS=${KERNELS:-*}       # benchmark selection (globs over kernel names, comma-separated)
COMMIT=${COMMIT:-$(cat "$DIST/COMMIT" 2>/dev/null || echo unknown)}
# A warm machine keeps /tmp between calls, and pip --target skips packages already there: start clean.
rm -rf "$SITE" "$WORK"
mkdir -p "$OUT" "$SITE" "$WORK"
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
# Kernels that exercise launch features no shipped kernel uses (TMA, cooperative, big shared memory).
[ -d build-launch/sm_90a ] && export TILE_KERNELS_AOT_LAUNCH_TEST_DIR=$PWD/build-launch/sm_90a

# The runtime comes as two wheels, with the C extension (cp311-abi3, this host's kind) and pure Python: install the first.
wheels=$(ls $DIST/*.whl)
native=$(ls $DIST/*runtime-*-abi3-*.whl 2>/dev/null)
[ -n "$native" ] && wheels=$(ls $DIST/*.whl | grep -v 'runtime-.*-py3-none-any')
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $wheels $(ls .whl/*.whl 2>/dev/null) || exit 1
[ -z "$native" ] || python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import tile_kernels_aot._driver_native' "$SITE" || exit 1
cp -r tests benchmarks examples pyproject.toml README.md "$WORK"/
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  ls $DIST
  echo "compute_capability $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1)"
  echo "commit $COMMIT"
  echo "kernels $KERNELS"
  echo "tests $TESTS"
  # The tools that built the installed cubins, from an arch package's manifest.
  python3 -c 'import glob, json, sys; p = json.load(open(sorted(glob.glob(sys.argv[1] + "/tile_kernels_aot_sm*/manifest.json"))[0]))["provenance"]
print("built_with_tilelang", p["tilelang"]); print("built_with_nvcc", p["nvcc"])' "$SITE"
} | tee "$OUT/environment.txt"

status=0
cd "$WORK"
for step in $steps; do
  case $step in
    tests) # Past TESTS_TIMEOUT a kernel has likely hung: the steps after it would share the GPU with it (a killed
           # process's hung kernel can keep the GPU busy and slow every later measurement), so the run stops there.
           # A device call lasts at most 600 s: split a long selection over calls with TESTS.
           # TESTS_WORKERS=N spreads the tests over N processes (pytest-xdist, from .whl/), which share the GPU; the tests
           # marked `alone` (device-wide memory checks, the largest allocations) then run in one process after them.
           workers=; [ -n "${TESTS_WORKERS:-}" ] && python3 -c 'import xdist' 2>/dev/null && workers="-n $TESTS_WORKERS"
           marks=(); [ -n "$workers" ] && marks=(-m 'not alone')
           timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest $TESTS $workers "${marks[@]}" -q -p no:cacheprovider -rfEs --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/pytest.log" | tail -n 25
           rc=${PIPESTATUS[0]}
           if [ -n "$workers" ] && [ $rc -ne 124 ]; then
             timeout 300 python3 -m pytest $TESTS -m alone -q -p no:cacheprovider -rfEs --junitxml="$OUT/junit-alone.xml" 2>&1 | tee -a "$OUT/pytest.log" | tail -n 5
             alone=${PIPESTATUS[0]}
             [ $alone -ne 0 ] && [ $alone -ne 5 ] && rc=$alone  # 5: the selection has no such test
           fi
           [ $rc -ne 0 ] && status=1
           if [ $rc -eq 124 ]; then echo "## tests timed out: a kernel has likely hung (pytest's faulthandler dump above names the test); stopping the run" | tee -a "$OUT/pytest.log"; break; fi ;;
    bench) timeout 400 python3 -m benchmarks.run --decode --kernels "$KERNELS" --out "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.log" | tail -n 40 || status=1 ;;
    tune)  [ -d "$OLDPWD/build-tune/sm_90a" ] && timeout 90 python3 -m benchmarks.tune "$OLDPWD/build-tune/sm_90a" --out "$OUT/tune.jsonl" 2>&1 | tee "$OUT/tune.log" | tail -n 60 ;;
    cold)  # Ours, then upstream's mHC compile from an empty TileLang cache in each process (when its pack is here).
           for i in 1 2 3; do python3 benchmarks/cold_start.py ops; python3 benchmarks/cold_start.py mhc; done 2>&1 | tee "$OUT/cold_start.log"
           if [ -f "$OLDPWD/.upstream/tk-upstream.tar.xz" ]; then
             mkdir -p /tmp/tk-up && [ -d /tmp/tk-up/tile_kernels ] || tar -xJf "$OLDPWD/.upstream/tk-upstream.tar.xz" -C /tmp/tk-up
             for i in 1 2; do rm -rf /tmp/tlcache-cold; PYTHONPATH=$SITE:/tmp/tk-up CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} \
               TILELANG_CACHE_DIR=/tmp/tlcache-cold TILELANG_PRINT_ON_COMPILATION=0 timeout 600 python3 benchmarks/cold_start.py mhc-upstream \
               2>/dev/null | grep '^{' | tee -a "$OUT/cold_start.log"; done
           fi ;;
    ep_moe) # examples/ep_moe.py on one GPU and, where the machine has two or more, on two: its JSON lines go into the record.
           gpus=$(nvidia-smi -L | wc -l)
           for n in 1 2; do
             [ "$n" -le "$gpus" ] || continue
             timeout 300 torchrun --standalone --nproc-per-node "$n" examples/ep_moe.py --check 2>&1 | tee -a "$OUT/ep_moe.log" | grep '^{' >> "$OUT/ep_moe.jsonl" || status=1
           done ;;
    pip)   # The user's path, into the machine's own Python (the machine is thrown away after the run): pip
           # resolves the meta package, the runtime and the arch wheels from dist/ and torch from what is installed.
           (env -u PYTHONPATH python3 -m pip install --no-index --find-links "$OLDPWD/$DIST" tile-kernels-aot && cd / \
            && env -u PYTHONPATH python3 -c 'import torch, tile_kernels_aot as tk; s = torch.randn(4, 256, device="cuda"); print("pip install ok:", tk.__file__, tk.moe.topk_gate(s, 8).tolist()[0])') 2>&1 | tee "$OUT/pip_install.log" || status=1 ;;
    upstream) # Upstream TileKernels (JIT) on the same inputs, from the pack of ../shared/tools/pack-upstream-for-device.sh.
           mkdir -p /tmp/tk-up && tar -xJf "$OLDPWD/.upstream/tk-upstream.tar.xz" -C /tmp/tk-up \
           && PYTHONPATH=$SITE:/tmp/tk-up CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TILELANG_CACHE_DIR=/tmp/tlcache TILELANG_PRINT_ON_COMPILATION=0 \
              timeout ${UPSTREAM_TIMEOUT:-300} python3 -m benchmarks.upstream --kernels "$KERNELS" --out "$OUT/upstream.jsonl" 2>&1 | grep -v '^\[' | tee "$OUT/upstream.log" | tail -n 30 || status=1 ;;
    profile) # per-launch device times, ours and upstream's (needs the upstream step's unpacked /tmp/tk-up)
           PYTHONPATH=$SITE:/tmp/tk-up CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TILELANG_CACHE_DIR=/tmp/tlcache TILELANG_PRINT_ON_COMPILATION=0 \
              timeout 200 python3 -m benchmarks.profile_kernels --kernels "$KERNELS" 2>&1 | grep -v '^\[' | tee "$OUT/profile.log" | tail -n 40 ;;
    ncu)   # hardware counters of chosen calls: NCU_SELECT (selectors of benchmarks.ncu_profile), NCU_UPSTREAM (kernels)
           [ -n "${NCU_UPSTREAM:-}" ] && mkdir -p /tmp/tk-up && tar -xJf "$OLDPWD/.upstream/tk-upstream.tar.xz" -C /tmp/tk-up
           PYTHONPATH=$SITE:/tmp/tk-up CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TILELANG_CACHE_DIR=/tmp/tlcache TILELANG_PRINT_ON_COMPILATION=0 \
              timeout 400 ncu --profile-from-start off --nvtx --clock-control none --print-units base \
                --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
                --section SchedulerStats --section WarpStateStats --section InstructionStats \
                python3 -m benchmarks.ncu_profile ${NCU_SELECT:-} ${NCU_UPSTREAM:+--upstream $NCU_UPSTREAM} > "$OUT/ncu.log" 2>&1
           grep -E "profiled:|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible" "$OUT/ncu.log" | tail -n 120 ;;
    sanitize) # every spec once under compute-sanitizer: SANITIZE_TOOLS (default memcheck racecheck synccheck initcheck), SANITIZE_KERNELS
              # (a glob). The tools run at once, each in its own process.
           : > "$OUT/sanitize.log"
           tools=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
           for tool in $tools; do
             ( timeout ${SANITIZE_TIMEOUT:-240} compute-sanitizer --tool $tool --error-exitcode 1 python3 -m benchmarks.sanitize \
                 --kernels "${SANITIZE_KERNELS:-*}" > /tmp/tk-sanitize-$tool.txt 2>&1; echo $? > /tmp/tk-sanitize-$tool.rc ) &
           done
           wait
           for tool in $tools; do
             rc=$(cat /tmp/tk-sanitize-$tool.rc)
             echo "## $tool, kernels ${SANITIZE_KERNELS:-*}" >> "$OUT/sanitize.log"
             grep -v '^ran ' /tmp/tk-sanitize-$tool.txt | tail -n 20 >> "$OUT/sanitize.log"
             [ "$rc" -ne 0 ] && { status=1; echo "## $tool: FAILED (exit $rc)" >> "$OUT/sanitize.log"; }
           done
           tail -n 60 "$OUT/sanitize.log" ;;
    adversarial) # bad index and gating values, each case in its own process under memcheck, ADVERSARIAL_JOBS at once
                 # (ADVERSARIAL_CASES: a glob; ADVERSARIAL_SAMPLE=1: benchmarks.adversarial.sample() only)
           timeout ${ADVERSARIAL_TIMEOUT:-560} python3 -m benchmarks.adversarial --all --cases "${ADVERSARIAL_CASES:-*}" ${ADVERSARIAL_SAMPLE:+--sample} \
             --jobs ${ADVERSARIAL_JOBS:-8} \
             --sanitizer ${ADVERSARIAL_SANITIZER:-memcheck} --out "$OUT/adversarial.jsonl" 2>&1 | tee "$OUT/adversarial.log" | tail -n 80
           [ ${PIPESTATUS[0]} -ne 0 ] && status=1 ;;
    ab)    # A/B of a build of some kernels (AB_BUILD, e.g. build-bf/sm_90a, carried): the installed package against the same
           # with AB_BUILD's kernels in place (benchmarks.overlay); AB_KERNELS (default KERNELS) timed in one process
           # (benchmarks.run --ab), each case on each side in turn, AB_ROUNDS times (default 4), in the order base, new, new,
           # base, ..., then compared (benchmarks.compare: medians over the rounds, and the control, the last base round
           # against the first); AB_LABEL says what the A/B measures (e.g. "device checks"); AB_TESTS (a pytest selection)
           # run on the overlay.
           rm -rf /tmp/tk-ab && python3 -m benchmarks.overlay "$SITE/tile_kernels_aot_sm90a" "$OLDPWD/$AB_BUILD" /tmp/tk-ab | tee "$OUT/ab.log"
           python3 -c 'import json, sys; print(json.dumps(dict(zip(("build", "label", "kernels"), sys.argv[1:]))))' \
             "$AB_BUILD" "${AB_LABEL:-}" "${AB_KERNELS:-$KERNELS}" > "$OUT/ab.json"
           timeout ${AB_TIMEOUT:-400} python3 -m benchmarks.run --kernels "${AB_KERNELS:-$KERNELS}" --ab /tmp/tk-ab --rounds "${AB_ROUNDS:-4}" \
             --out "$OUT/ab" >> "$OUT/ab.log" 2>&1 || status=1
           bases=; news=
           for round in $(seq "${AB_ROUNDS:-4}"); do
             bases=$bases${bases:+,}$OUT/ab-base-$round.jsonl; news=$news${news:+,}$OUT/ab-new-$round.jsonl
           done
           python3 -m benchmarks.compare "$bases" "$news" 2>&1 | tee "$OUT/ab-compare.txt" | tail -n 30
           if [ -n "${AB_TESTS:-}" ]; then
             TILE_KERNELS_AOT_KERNEL_DIRS=/tmp/tk-ab timeout ${AB_TESTS_TIMEOUT:-200} python3 -m pytest $AB_TESTS -q -p no:cacheprovider -rfEs 2>&1 \
               | tee "$OUT/ab-pytest.log" | tail -n 15
             [ ${PIPESTATUS[0]} -ne 0 ] && status=1
           fi ;;
    host)  # host time per call of every case: ours, torch.neg on its input, upstream's (from the upstream pack); then one
           # call broken down by layer
           [ -d /tmp/tk-up ] || { mkdir -p /tmp/tk-up && tar -xJf "$OLDPWD/.upstream/tk-upstream.tar.xz" -C /tmp/tk-up; }
           PYTHONPATH=$SITE:/tmp/tk-up CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TILELANG_CACHE_DIR=/tmp/tlcache TILELANG_PRINT_ON_COMPILATION=0 \
              timeout ${HOST_TIMEOUT:-400} python3 -m benchmarks.host_overhead --kernels "$KERNELS" --out "$OUT/host.jsonl" 2>&1 | grep -v '^\[' \
              | tee "$OUT/host.log" | tail -n 60 || status=1
           timeout 120 python3 -m benchmarks.host_profile > "$OUT/host_profile.log" 2>&1; head -n 45 "$OUT/host_profile.log" ;;
  esac
done
# The record: what the steps measured, a few lines of JSON (benchmarks/record.py says which).
if [ -f "$OUT/bench.jsonl" ] || [ -f "$OUT/upstream.jsonl" ] || [ -f "$OUT/junit.xml" ] || [ -f "$OUT/sanitize.log" ] || [ -f "$OUT/adversarial.jsonl" ] \
   || [ -f "$OUT/host.jsonl" ] || [ -f "$OUT/ab.json" ]; then
  if [ "$COMMIT" = unknown ]; then
    echo "## no record written: COMMIT is unset; run python -m benchmarks.record OUT_DIR --commit SHA on the fetched output"
  else
    python3 -m benchmarks.record "$OUT" --out "$OUT" || status=1
  fi
fi
exit $status
