#!/usr/bin/env bash
# Verifies the GPU path on a GPU machine in one command, with binaries built elsewhere.
#
#   scripts/gpu-check.sh --bundle      on the build machine, after `cargo build --release` and
#                                      `cargo test --no-run`: copies
#                                      the ups-doctor and ups-doctor-trainer binaries, the trainer
#                                      crate's unit-test binary and the integration-test binary
#                                      (tests/gpu.rs is a module of it) into target/gpu-bundle/
#                                      (debug info stripped, symbols kept; the test binaries fully
#                                      stripped) and packs it as target/gpu-bundle.tar.xz, the one
#                                      path to carry (it is unpacked on the GPU machine)
#   OUT=/some/dir scripts/gpu-check.sh on the GPU machine, from the checkout
#
# The binaries come from target/gpu-bundle/ (else target/{release,debug}; UPS_DOCTOR_BIN names
# the ups-doctor binary, which starts the ups-doctor-trainer beside it). libtorch with CUDA comes
# from TORCH_LIB (default: the GPU machines' /opt/torch/.venv/lib/python3.12/site-packages/torch/lib),
# put on LD_LIBRARY_PATH.
#
# Writes under $OUT (default ./gpu-check-out): nvidia-smi, `ups-doctor env`, 20 raw NVML readings
# and 100 more beside a training run (nvml-training.jsonl: the recording the sample-processing
# tests use, src/harness/observe/fixtures/), the report of every scenario in scenarios/gpu/,
# single-cuda with 0 and with 4 spawned workers, the same on an input-heavy setting, the training
# step against PyTorch eager on the GPU (PAIRS rounds, default 3), the #[ignore]d GPU tests'
# output, and summary.md with the figures. Every step runs under STEP_TIMEOUT seconds (150) and
# even when an earlier one fails; ONLY="NAME …" runs only the GPU steps named; without a GPU the
# GPU steps are skipped, each with the reason. The exit status is 1 if any step failed.
#
# The device tool brings back at most 8 files: run it as
#   R=$OUT; OUT=/tmp/gc scripts/gpu-check.sh; cp /tmp/gc/summary.md $R/; tar czf $R/gc.tgz -C /tmp gc
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
  strip --strip-all -o "$BUNDLE/lib-tests" "$lib"
  doctor=$(pick "probe::nvml" target/*/deps/ups_doctor-*)
  [ -z "$doctor" ] || strip --strip-all -o "$BUNDLE/doctor-tests" "$doctor"
  strip --strip-all -o "$BUNDLE/gpu-tests" "$gpu"
  du -sh "$BUNDLE"
  # The device tool carries at most 64 MiB: one xz archive (~15 MB), unpacked there by this script.
  tar -C target -cf - gpu-bundle | xz -T2 -6 >"$BUNDLE.tar.xz"
  ls -la "$BUNDLE.tar.xz"
  exit 0
fi
if [ -f "$BUNDLE.tar.xz" ] && [ ! -d "$BUNDLE" ]; then
  tar -C target -xJf "$BUNDLE.tar.xz" || echo "gpu-check: could not unpack $BUNDLE.tar.xz" >&2
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
export PY BIN UPS_DOCTOR_PYTHON=${UPS_DOCTOR_PYTHON:-$PY}
failed=()
# A step that runs past STEP_TIMEOUT seconds (default 150) is killed and counted as failed: a hang
# must not eat the short device lease.
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
# Without a GPU (a dry run on a CPU machine) the GPU steps are skipped, each with this reason.
NO_GPU=""
nvidia-smi -L >/dev/null 2>&1 || NO_GPU="no GPU here: nvidia-smi -L failed or is not installed"
step() { # step NAME COMMAND...: runs it, output to $OUT/NAME.txt, records failures
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUT/steps.log"
  local t0=$SECONDS
  if declare -F "$1" >/dev/null; then # a function of this script: run in a shell of its own
    timeout -k 10 "$STEP_TIMEOUT" bash -c "$(declare -f "$1"); $*" >"$OUT/$name.txt" 2>&1
  else
    timeout -k 10 "$STEP_TIMEOUT" "$@" >"$OUT/$name.txt" 2>&1
  fi
  local rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
  [ $rc -eq 0 ] || failed+=("$name (exit $rc)")
}
# ONLY="gpu-scenarios bench-step": run only the GPU steps named (a re-run after a fix).
gpu_step() { # like step, skipped with the reason where there is no GPU
  if [ -n "$NO_GPU" ]; then
    echo "== $1: skipped ($NO_GPU)" | tee -a "$OUT/steps.log"
    return
  fi
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then
    echo "== $1: skipped (not in ONLY)" | tee -a "$OUT/steps.log"
    return
  fi
  step "$@"
}
gpu_step nvidia-smi nvidia-smi
step env "$BIN" env
"$BIN" env --json >"$OUT/env.json" 2>/dev/null
gpu_step nvml-record "$BIN" nvml-record --count 20 --every-ms 200
gpu_step gpu-scenarios "$BIN" run scenarios/gpu --out "$OUT/gpu-scenarios" --quiet
# NVML read beside a real training run: the recording that replaces the hand-made fixture
# (src/harness/observe/fixtures/); the run's result.json names the rank's pid.
[ -n "$NO_GPU" ] || { "$BIN" nvml-record --count 100 --every-ms 200 >"$OUT/nvml-training.jsonl" 2>&1 & }
gpu_step single-cuda-workers0 "$BIN" run scenarios/gpu/single-cuda.json --out "$OUT/single-cuda-workers0" --quiet
wait
gpu_step single-cuda-workers4-spawn "$BIN" run scenarios/gpu/single-cuda.json --set data.workers=4 \
  --set data.start_method=spawn --out "$OUT/single-cuda-workers4-spawn" --quiet
# Input-heavy: 64 augmentation passes (FFT pairs) per sample make building a batch cost more than
# the GPU's step; in the trainer (0 workers) the GPU waits, with 4 spawned workers it should not.
HEAVY=${HEAVY:-64}
gpu_step heavy-workers0 "$BIN" run scenarios/gpu/single-cuda.json --set data.augment_passes="$HEAVY" \
  --out "$OUT/heavy-workers0" --quiet
gpu_step heavy-workers4-spawn "$BIN" run scenarios/gpu/single-cuda.json --set data.augment_passes="$HEAVY" \
  --set data.workers=4 --set data.start_method=spawn --out "$OUT/heavy-workers4-spawn" --quiet
# The training step against PyTorch eager on the same model, data and batch (single-cuda's), on
# the GPU, alternating, PAIRS rounds; each side's whole loop (data included) on its own clock.
bench_step() {
  local model='{"hidden":192,"heads":3,"depths":[2,2],"latent_tokens":32}' i
  for i in $(seq "${PAIRS:-3}"); do
    echo "round $i ours: $("$BIN" train scenarios/gpu/single-cuda.json 2>&1 | grep '^done:')"
    echo "round $i eager: $("$PY" bench/peers/step.py --device cuda --model "$model" --samples 256 \
      --grid 256 --batch 64 --steps 300 2>&1 | grep -E '^(done|parameters):' | tr '\n' ' ')"
  done
}
gpu_step bench-step bench_step
GPU_TESTS=$(pick "gpu_single_cuda" "$BUNDLE/gpu-tests" target/*/deps/tests-*)
LIB_TESTS=$(pick "cuda::tests" "$BUNDLE/lib-tests" target/*/deps/ups_doctor_trainer-*)
if [ -n "$GPU_TESTS" ]; then
  gpu_step gpu-tests "$GPU_TESTS" --include-ignored --test-threads=1 gpu::
else
  failed+=("gpu-tests (no target/*/deps/tests-* test binary)")
fi
if [ -n "$LIB_TESTS" ]; then
  gpu_step lib-gpu-tests "$LIB_TESTS" --include-ignored --test-threads=1 gpu cuda:: device:: amp::
else
  failed+=("lib-gpu-tests (no target/*/deps/ups_doctor_trainer-* test binary)")
fi
DOCTOR_TESTS=$(pick "probe::nvml" "$BUNDLE/doctor-tests" target/*/deps/ups_doctor-*)
if [ -n "$DOCTOR_TESTS" ]; then
  gpu_step nvml-tests "$DOCTOR_TESTS" --include-ignored --test-threads=1 probe::nvml gpu
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
for run in ["gpu-scenarios", "single-cuda-workers0", "single-cuda-workers4-spawn", "heavy-workers0",
            "heavy-workers4-spawn"]:
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
bench = out / "bench-step.txt"
if bench.exists():
    import re, statistics
    rate = re.compile(r"([\d.]+) steps/s")
    rows = {"ours": [], "eager": []}
    for line in bench.read_text().splitlines():
        m = re.match(r"round \d+ (ours|eager): .*?" + rate.pattern, line)
        if m:
            rows[m.group(1)].append(float(m.group(2)))
    print("\n## Training step on the GPU vs PyTorch eager (single-cuda's model, data and batch; 300 steps)\n")
    print("| rounds | ups-doctor steps/s | PyTorch eager steps/s | ours ÷ eager (step time) |")
    print("| ---: | ---: | ---: | ---: |")
    if rows["ours"] and rows["eager"]:
        o, e = statistics.median(rows["ours"]), statistics.median(rows["eager"])
        print(f"| {min(len(rows['ours']), len(rows['eager']))} | {o:.2f} ({min(rows['ours']):.2f}–{max(rows['ours']):.2f}) | "
              f"{e:.2f} ({min(rows['eager']):.2f}–{max(rows['eager']):.2f}) | {e / o:.3f} |")
    else:
        print("| 0 | — | — | see bench-step.txt |")
for run in ["heavy-workers0", "heavy-workers4-spawn"]:
    f = out / run / "result.json"
    if f.exists():
        s = json.loads(f.read_text())["scenarios"][0]
        print(f"\n- {run}: {s['verdict'].get('headline')}")
PYEOF

echo "== done; failed: ${#failed[@]}" | tee -a "$OUT/steps.log"
for f in "${failed[@]}"; do echo "   $f" | tee -a "$OUT/steps.log"; done
[ ${#failed[@]} -eq 0 ]
