#!/usr/bin/env bash
# Verifies the GPU path on a GPU machine in one command, with binaries built elsewhere.
#
#   scripts/gpu-check.sh --bundle      on the build machine, after `cargo test --no-run`: copies
#                                      the ups-doctor and ups-doctor-trainer binaries, the trainer
#                                      crate's unit-test binary and the integration-test binary
#                                      (tests/gpu.rs is a module of it) into target/gpu-bundle/
#                                      (debug info stripped, symbols kept), the one path to carry
#   OUT=/some/dir scripts/gpu-check.sh on the GPU machine, from the checkout
#
# The binaries come from target/gpu-bundle/ (else target/{release,debug}; UPS_DOCTOR_BIN names
# the ups-doctor binary, which starts the ups-doctor-trainer beside it). libtorch with CUDA comes from TORCH_LIB (default: the GPU machines'
# /opt/torch/.venv/lib/python3.12/site-packages/torch/lib), put on LD_LIBRARY_PATH.
#
# Writes under $OUT (default ./gpu-check-out): nvidia-smi, `ups-doctor env`, 20 raw NVML readings
# (fixtures for the sample-processing tests), the report of every scenario in scenarios/gpu/,
# single-cuda with 0 and with 4 spawned workers, the #[ignore]d GPU tests' output, and summary.md
# with the figures. Every step runs even when an earlier one fails; the exit status is 1 if any
# failed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/gpu-check-out}
mkdir -p "$OUT"
TORCH_LIB=${TORCH_LIB:-/opt/torch/.venv/lib/python3.12/site-packages/torch/lib}
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BUNDLE=$REPO/target/gpu-bundle
# The newest executable among the given files whose test list mentions $1 (cargo leaves test
# binaries of earlier builds next to the current ones).
pick() {
  local marker=$1; shift
  ls -t "$@" 2>/dev/null | while read -r f; do
    [ -f "$f" ] && [ -x "$f" ] && "$f" --list 2>/dev/null | grep -c "$marker" >/dev/null && { echo "$f"; break; }
  done
}
if [ "${1:-}" = "--bundle" ]; then
  mkdir -p "$BUNDLE"
  main=$(ls -t target/release/ups-doctor target/debug/ups-doctor 2>/dev/null | head -n1)
  trainer=$(ls -t target/release/ups-doctor-trainer target/debug/ups-doctor-trainer 2>/dev/null | head -n1)
  lib=$(pick "cuda::tests" target/*/deps/ups_doctor_trainer-*)
  gpu=$(pick "gpu_single_cuda" target/*/deps/tests-*)
  [ -n "$main" ] && [ -n "$trainer" ] && [ -n "$lib" ] && [ -n "$gpu" ] \
    || { echo "gpu-check: build first: cargo build && cargo test --no-run" >&2; exit 2; }
  strip --strip-debug -o "$BUNDLE/ups-doctor" "$main"
  strip --strip-debug -o "$BUNDLE/ups-doctor-trainer" "$trainer"
  strip --strip-debug -o "$BUNDLE/lib-tests" "$lib"
  doctor=$(pick "probe::nvml" target/*/deps/ups_doctor-*)
  [ -z "$doctor" ] || strip --strip-debug -o "$BUNDLE/doctor-tests" "$doctor"
  strip --strip-debug -o "$BUNDLE/gpu-tests" "$gpu"
  du -sh "$BUNDLE"
  exit 0
fi
BIN=${UPS_DOCTOR_BIN:-}
if [ -z "$BIN" ]; then
  for b in target/gpu-bundle/ups-doctor target/release/ups-doctor target/debug/ups-doctor; do
    [ -x "$b" ] && { BIN=$REPO/$b; break; }
  done
fi
[ -x "${BIN:-}" ] || { echo "gpu-check: no ups-doctor binary (set UPS_DOCTOR_BIN)" >&2; exit 2; }
export UPS_DOCTOR_BIN=$BIN UPS_DOCTOR_REPO=$REPO
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python3)
failed=()
step() { # step NAME COMMAND...: runs it, output to $OUT/NAME.txt, records failures
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUT/steps.log"
  local t0=$SECONDS
  "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
  [ $rc -eq 0 ] || failed+=("$name (exit $rc)")
}
step nvidia-smi nvidia-smi
step env "$BIN" env
"$BIN" env --json >"$OUT/env.json" 2>/dev/null
step nvml-record "$BIN" nvml-record --count 20 --every-ms 200
step gpu-scenarios "$BIN" run scenarios/gpu --out "$OUT/gpu-scenarios" --quiet
step single-cuda-workers0 "$BIN" run scenarios/gpu/single-cuda.json --out "$OUT/single-cuda-workers0" --quiet
step single-cuda-workers4-spawn "$BIN" run scenarios/gpu/single-cuda.json --set data.workers=4 \
  --set data.start_method=spawn --out "$OUT/single-cuda-workers4-spawn" --quiet
GPU_TESTS=$(pick "gpu_single_cuda" "$BUNDLE/gpu-tests" target/*/deps/tests-*)
LIB_TESTS=$(pick "cuda::tests" "$BUNDLE/lib-tests" target/*/deps/ups_doctor_trainer-*)
if [ -n "$GPU_TESTS" ]; then
  step gpu-tests "$GPU_TESTS" --include-ignored --test-threads=1 gpu::
else
  failed+=("gpu-tests (no target/*/deps/tests-* test binary)")
fi
if [ -n "$LIB_TESTS" ]; then
  step lib-gpu-tests "$LIB_TESTS" --include-ignored --test-threads=1 gpu cuda:: device:: amp::
else
  failed+=("lib-gpu-tests (no target/*/deps/ups_doctor_trainer-* test binary)")
fi
DOCTOR_TESTS=$(pick "probe::nvml" "$BUNDLE/doctor-tests" target/*/deps/ups_doctor-*)
if [ -n "$DOCTOR_TESTS" ]; then
  step nvml-tests "$DOCTOR_TESTS" --include-ignored --test-threads=1 probe::nvml gpu
else
  failed+=("nvml-tests (no target/*/deps/ups_doctor-* test binary)")
fi

"$PY" - "$OUT" >"$OUT/summary.md" 2>"$OUT/summary.err" <<'PYEOF' || failed+=("summary (see summary.err)")
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("# GPU check\n")
env = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {}
gpu = env.get("gpu") or {}
drv = gpu.get("driver") or {}
print(f"- driver {drv.get('driver_version')}, CUDA driver API {drv.get('cuda_driver_version')}, "
      f"libtorch CUDA {(gpu.get('cuda') or {}).get('cuda_runtime')}, NCCL {(gpu.get('cuda') or {}).get('nccl_version')}")
for g in drv.get("gpus", []):
    print(f"- GPU {g['index']}: {g['name']}, {g['memory_total_bytes'] / 2**30:.1f} GiB")
print("\n| run | scenario | outcome | met | steps/s | samples/s | util median / peak | SM active median / peak | peak GPU memory |")
print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
for run in ["gpu-scenarios", "single-cuda-workers0", "single-cuda-workers4-spawn"]:
    f = out / run / "result.json"
    if not f.exists():
        print(f"| {run} | (no result.json) | | | | | | | |")
        continue
    for s in json.loads(f.read_text())["scenarios"]:
        g = ((s.get("gpu") or {}).get("gpus") or [{}])[0]
        u, sm = g.get("util_percent") or {}, g.get("sm_active_percent") or {}
        fmt = lambda d: f"{d['median']:.0f}% / {d['peak']:.0f}%" if d else "—"
        mem = g.get("memory_used_peak_bytes")
        mem = f"{mem / 2**30:.2f} GiB" if mem else "—"
        why = (s.get("gpu") or {}).get("unavailable")
        print(f"| {run} | {s['name']} | {s['outcome']} | {s['met_expectation']} | {s.get('steps_per_s') or 0:.2f} | "
              f"{s.get('samples_per_s') or 0:.0f} | {why or fmt(u)} | {fmt(sm)} | {mem} |")
PYEOF

echo "== done; failed: ${#failed[@]}" | tee -a "$OUT/steps.log"
for f in "${failed[@]}"; do echo "   $f" | tee -a "$OUT/steps.log"; done
[ ${#failed[@]} -eq 0 ]
