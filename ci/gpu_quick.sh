#!/usr/bin/env bash
# A shorter GPU pass: build, then only the test files given in $TE_QUICK_TESTS and the
# benchmark scripts in $TE_QUICK_BENCH (for re-checking fixes within a small device budget).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/packages/te-pytorch/python${PYTHONPATH:+:$PYTHONPATH}"
TE_WITH_CUDA=ON TE_CUDA_ARCHS=90 python3 -m pip install --no-build-isolation --no-deps -v ./packages/te-core \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
python3 -m pytest -p no:cacheprovider -q ${TE_QUICK_TESTS} > "$OUT/tests.log" 2>&1; rc=$?
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -30
for b in ${TE_QUICK_BENCH:-}; do python3 "$b" 2>&1 | grep -v Warning | tee "$OUT/$(basename "$b" .py).log"; done
exit $rc
