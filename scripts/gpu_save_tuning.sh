#!/usr/bin/env bash
# Save what a running (or cut-off) build has tuned so far, small enough to carry to the next GPU
# machine: Inductor's autotune timings (its local cache, one JSON per system under cache/) and the
# coordinate-descent results (*.best_config beside each kernel). The compiled kernels stay behind:
# they are hundreds of MB. On the next machine put the tarball at .gpu/tuning.tgz and carry .gpu;
# gpu_session.sh unpacks it into the Inductor cache, and ops already tuned are not benchmarked again.
# usage: scripts/gpu_save_tuning.sh WORKDIR OUT_TARBALL
set -eu
CACHE=$1/inductor_cache
cd "$CACHE"
find . \( -path './cache/*' -o -name '*.best_config' \) -type f > /tmp/tuning_files.txt
tar czf "$2" -T /tmp/tuning_files.txt
echo "saved $(wc -l < /tmp/tuning_files.txt) tuning files ($(du -h "$2" | cut -f1)) from $CACHE"
