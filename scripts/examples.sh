#!/usr/bin/env bash
# Regenerates the committed example reports under reports/examples/ with the current build: the
# shipped scenarios, the external ones (PyTorch from the test venv), the two-node ones, and two
# bisects. Each is made in a scratch folder and then replaces its example, so a failed run leaves
# the old example in place. Needs `./x build` first (and the venv, as `./x test` makes it).
#
#   scripts/examples.sh            # all five
#   scripts/examples.sh run-nodes  # one
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/debug/ups-doctor
[ -x "$bin" ] || { echo "examples.sh: no $bin: run ./x build first" >&2; exit 2; }
venv_bin="$(dirname "${UPS_DOCTOR_PYTHON:-$HOME/.cache/ups-doctor/pytorch-2.11.0/bin/python}")"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

make_example() {
    local name=$1
    shift
    local out=$scratch/$name
    echo "examples.sh: $name" >&2
    # Exit 1 is a scenario that did not meet its expect; the report is written all the same.
    PATH="$venv_bin:$PATH" "$@" --out "$out" --quiet >/dev/null || [ $? -eq 1 ]
    [ -f "$out/report.md" ] || [ -f "$out/bisect.md" ] || { echo "examples.sh: $name wrote no report" >&2; exit 1; }
    # The observer's sitecustomize copied into each run folder is ours, not the example's.
    find "$out" -type d -name python-site -prune -exec rm -rf {} +
    rm -rf "reports/examples/$name"
    mv "$out" "reports/examples/$name"
}

want=("${@:-run-shipped-scenarios run-external-scenarios run-nodes bisect-segv-needs-conditioning bisect-external-workers-pin-memory}")
for name in ${want[*]}; do
    case $name in
        run-shipped-scenarios) make_example "$name" "$bin" run scenarios/ ;;
        run-external-scenarios) make_example "$name" "$bin" run scenarios/external ;;
        run-nodes) make_example "$name" "$bin" run scenarios/nodes/ ;;
        bisect-segv-needs-conditioning)
            make_example "$name" "$bin" bisect scenarios/segv-needs-conditioning.json --cache "$scratch/c1" ;;
        bisect-external-workers-pin-memory)
            make_example "$name" "$bin" bisect scenarios/external/workers-pin-memory.json --cache "$scratch/c2" ;;
        *) echo "examples.sh: no example named $name" >&2; exit 2 ;;
    esac
done
