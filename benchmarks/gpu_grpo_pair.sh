#!/usr/bin/env bash
# The GPU arm pair side by side on one CUDA machine: gpu-native (P/P, fused production) then gpu-consistency
# (R/R), each through `kit run --runtime local`, sealed; the run dirs are tarred into OUT_DIR for kit verify /
# compare / analyze on any machine. ARMS="gpu-native gpu-consistency gpu-native-eager" adds the third arm (P/P
# on the eager formula). Example:  benchmarks/gpu_grpo_pair.sh /tmp/out   (ROLLOUTS=3 for a short rehearsal)
set -euo pipefail
out=${1:?usage: benchmarks/gpu_grpo_pair.sh OUT_DIR}
ws=${KIT_WORKSPACE:-$PWD/.workspace}
kit=${KIT:-kit}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
runs=()
for arm in ${ARMS:-gpu-native gpu-consistency}; do
    id="$arm-$stamp"
    echo "== $arm ($id)" >&2
    $kit run --arm "$arm" --runtime local --workspace "$ws" --run-id "$id" ${ROLLOUTS:+--rollouts "$ROLLOUTS"} || true
    runs+=("$id")
done
tar -C "$ws/runs" -czf "$out/gpu-pair-$stamp.tar.gz" "${runs[@]}"
$kit compare "$ws/runs/${runs[0]}" "$ws/runs/${runs[1]}" || true
echo "bundles: $out/gpu-pair-$stamp.tar.gz" >&2
