#!/bin/sh
# Wheels the lent GPU machine lacks for benchmarks/device_check.py (its image has Python 3.12 with torch, numpy,
# scipy, pyyaml, networkx, sympy and typing-extensions, and nothing can be fetched there): projection's pydantic and
# the Megatron-Core that benchmarks/gpu_megatron_host.py times. Run here, from anywhere; they land in .whl/ at the
# repository root, which git ignores (.git/info/exclude) and the device call carries (benchmarks/README.md).
set -eu
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-path info/exclude)"  # .git may be a file (a worktree)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 megatron-core==0.16.1
ls -l .whl
