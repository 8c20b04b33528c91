#!/usr/bin/env bash
# What a GPU run (.ci/gpu-run.sh) carries, made on the build machine (nvcc and network, no GPU):
#   DIST/        the wheels of this checkout (python -m build_tools --arch all), with the commit in DIST/COMMIT;
#   .whl/        the test tools the GPU host lacks (hypothesis and sortedcontainers for the fuzz tests, pytest-xdist
#                and execnet for TESTS_WORKERS), for its Python 3.12;
#   .upstream/   upstream TileKernels v1 with tilelang, for the host, upstream, cold and profile steps (packed by
#                ../shared/tools/pack-upstream-for-device.sh where that exists; skipped otherwise);
#   build-launch/  the kernels of tests/fixtures/launch_kernels.py, for tests/gpu/test_launch_features.py.
# The device call then carries DIST, .whl, .upstream and build-launch (64 MiB in all) and runs, for example,
#   DIST=DIST TESTS_WORKERS=6 bash .ci/gpu-run.sh tests    and then    DIST=DIST bash .ci/gpu-run.sh host
#
#   bash .ci/gpu-prep.sh [DIST]    (default dist-gpu; BUILD_DIR, default build/, keeps the build for the next run: a
#                                   full build from nothing takes about 15 minutes on 2 cores, a rebuild what changed)
set -euo pipefail
cd "$(dirname "$0")/.."
dist=${1:-dist-gpu}
[ -z "$(git status --porcelain --untracked-files=no)" ] || echo "warning: the checkout has uncommitted changes; DIST/COMMIT names HEAD" >&2
python -m build_tools --arch all --build-dir "${BUILD_DIR:-build}" --out "$dist"
git rev-parse --short HEAD > "$dist/COMMIT"
python -m build_tools --arch sm90 --registry tests.fixtures.launch_kernels --build-dir build-launch --no-wheels
rm -rf .whl && python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
  hypothesis sortedcontainers pytest-xdist execnet
pack=../shared/tools/pack-upstream-for-device.sh
if [ -f "$pack" ] && [ ! -f .upstream/tk-upstream.tar.xz ]; then
  mkdir -p .upstream && bash "$pack" .upstream/tk-upstream.tar.xz
fi
du -sh "$dist" .whl .upstream build-launch 2>/dev/null
