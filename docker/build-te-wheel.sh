#!/bin/sh
# Compile Transformer Engine's PyTorch extension (transformer-engine-torch, published only as an
# sdist) into a wheel for the CUDA image on the Debian base, reproducibly:
#   - in a bookworm container (the image's own OS: Debian's CPython 3.11, g++ 12, glibc 2.36),
#     with no network, torch and the nvidia-*-cu12 wheels installed from the host wheelhouse;
#   - CUDA_HOME assembled from the trixie toolchain image's nvcc 12.4.131 (the CUDA 12 major torch's
#     cu128 build requires) and the CUDA 12.8 headers of the locked nvidia-*-cu12 wheels;
#   - the sdist unpacked at a fixed path with SOURCE_DATE_EPOCH set, so paths and zip times in the
#     wheel do not depend on when or where it is built;
#   - the venv's bin/ on PATH, so torch's extension builder finds the locked ninja and compiles
#     MAX_JOBS files at a time (default 2) instead of one after another, under `nice -n $NICE`
#     (default 19: the container's processes are the engine's children, not this shell's).
#     Ninja hands g++ absolute source paths, which __FILE__ (in the assert messages) would carry;
#     -fmacro-prefix-map drops the build directory from them. NINJA=0 compiles one file at a time
#     without ninja, as the first lock's wheel was made (other bytes: docs/cuda-image.md).
# Usage: docker/build-te-wheel.sh SDIST WHEELHOUSE OUTDIR [ARCH]   (ARCH default 9.0 = sm_90)
# Writes OUTDIR/<wheel> and OUTDIR/te-build.json (sdist/wheel sha256, toolchain, arch, seconds).
set -eu
SDIST="$(realpath "$1")"; WHEELHOUSE="$(realpath "$2")"; OUT="$(realpath -m "$3")"; ARCH="${4:-9.0}"
BUILDER="${BUILDER:-rlk-kit/debian-builder:bookworm}"
TOOLCHAIN="${TOOLCHAIN:-rlk-kit/cuda-toolchain:trixie-12.4}"
TORCH="${TORCH:-torch==2.9.1}"
MAX_JOBS="${MAX_JOBS:-2}"; NICE="${NICE:-19}"; NINJA="${NINJA:-1}"
mkdir -p "$OUT"
tc="$(mktemp -d)"; trap 'rm -rf "$tc"' EXIT INT TERM
# nvcc is a static binary (glibc >= 2.7): copy the toolkit's bin/ out of the trixie image.
cid="$(docker create "$TOOLCHAIN" true)"
docker cp "$cid:/usr/lib/nvidia-cuda-toolkit/bin" "$tc/bin" && docker rm "$cid" >/dev/null
toolchain_id="$(docker image inspect --format '{{.Id}}' "$TOOLCHAIN")"
builder_id="$(docker image inspect --format '{{.Id}}' "$BUILDER")"
name="$(basename "$SDIST" .tar.gz)"
docker run --rm --network none -e SOURCE_DATE_EPOCH=1704067200 -e PYTHONHASHSEED=0 -e MAX_JOBS="$MAX_JOBS" \
  -v "$SDIST:/in/$(basename "$SDIST"):ro" -v "$WHEELHOUSE:/wheelhouse:ro" -v "$tc/bin:/opt/cuda/bin:ro" -v "$OUT:/out" \
  "$BUILDER" sh -euc "
    t0=\$(date +%s)
    python3 -m venv /opt/venv
    if [ '$NINJA' = 1 ]; then export PATH=/opt/venv/bin:\$PATH CFLAGS='-fmacro-prefix-map=/build/$name/='; fi
    nice -n $NICE /opt/venv/bin/pip install -q --no-index --find-links /wheelhouse '$TORCH' nvidia-cuda-nvcc-cu12 nvidia-cuda-cccl-cu12 pybind11 setuptools wheel packaging ninja numpy
    t1=\$(date +%s)
    mkdir -p /opt/cuda/include
    for d in /opt/venv/lib/python3.11/site-packages/nvidia/*/include; do cp -rn \"\$d\"/. /opt/cuda/include/; done
    mkdir -p /build && tar -xzf /in/$(basename "$SDIST") -C /build && cd /build/$name
    CUDA_HOME=/opt/cuda NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS='${ARCH%%.*}${ARCH#*.}' TORCH_CUDA_ARCH_LIST='$ARCH' \
      NVTE_FRAMEWORK=pytorch \
      nice -n $NICE /opt/venv/bin/pip wheel -v --no-index --no-deps --no-build-isolation -w /out/ . > /out/$name.log 2>&1 \
      || { tail -30 /out/$name.log >&2; exit 1; }
    t2=\$(date +%s)
    echo \"\$((t1-t0)) \$((t2-t1))\" > /out/$name.seconds
    /opt/cuda/bin/nvcc --version | tail -2 | head -1 > /out/$name.nvcc
    g++ --version | head -1 > /out/$name.gxx
    /opt/venv/bin/python -c 'import torch; print(torch.__version__, torch.version.cuda)' > /out/$name.torch
    if [ '$NINJA' = 1 ]; then echo \"ninja \$(ninja --version), MAX_JOBS=\$MAX_JOBS, CFLAGS=\$CFLAGS\"; else echo serial; fi > /out/$name.jobs
  "
wheel="$(ls "$OUT"/transformer_engine_torch-*.whl | head -n1)"
set -- $(cat "$OUT/$name.seconds")
python3 - "$SDIST" "$wheel" "$OUT/te-build.json" "$ARCH" "$toolchain_id" "$builder_id" "$1" "$2" \
  "$(cat "$OUT/$name.nvcc")" "$(cat "$OUT/$name.gxx")" "$(cat "$OUT/$name.torch")" "$(cat "$OUT/$name.jobs")" <<'PY'
import hashlib, json, sys, os
sdist, wheel, out, arch, tc, builder, setup_s, compile_s, nvcc, gxx, torch, jobs = sys.argv[1:]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
json.dump({"sdist": {"file": os.path.basename(sdist), "sha256": sha(sdist)},
           "wheel": {"file": os.path.basename(wheel), "sha256": sha(wheel), "size": os.path.getsize(wheel)},
           "arch": arch, "toolchain_image": tc, "builder_image": builder, "nvcc": nvcc, "cxx": gxx, "torch": torch, "jobs": jobs,
           "setup_seconds": int(setup_s), "compile_seconds": int(compile_s)}, open(out, "w"), indent=2)
PY
cat "$OUT/te-build.json"
