#!/usr/bin/env bash
# A/B benchmark of wheel sets: OUT=... bash exp/ab.sh KERNELS ROUNDS TESTS dist-a dist-b ...
# Rounds alternate the variants; TESTS (a pytest selection, or none) then runs on every variant.
set -u
OUT=${OUT:-/tmp/o}; mkdir -p "$OUT"
K=$1; R=$2; TESTS=$3; shift 3
SRC=$PWD
for v in "$@"; do rm -rf /tmp/site-$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-$v $v/*.whl || exit 1; done
rm -rf /tmp/abwork; mkdir -p /tmp/abwork; cp -r tests benchmarks pyproject.toml /tmp/abwork/; cd /tmp/abwork
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; } > "$OUT/env.txt"
for r in $(seq "$R"); do
  for v in "$@"; do
    PYTHONPATH=/tmp/site-$v timeout 300 python3 -m benchmarks.run --kernels "$K" --out "$OUT/$v-$r.jsonl" > "$OUT/$v-$r.log" 2>&1
  done
done
if [ "$TESTS" != none ]; then
  for v in "$@"; do
    PYTHONPATH=/tmp/site-$v timeout 200 python3 -m pytest $TESTS -q -p no:cacheprovider > "$OUT/$v-tests.log" 2>&1
    echo "$v tests: $(tail -n 1 "$OUT/$v-tests.log")"
  done
fi
python3 "$SRC/exp/summary.py" "$OUT" "$@" | tee "$OUT/summary.txt"
