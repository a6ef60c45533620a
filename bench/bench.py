#!/usr/bin/env python3
"""ups-doctor against the PyTorch peers users would pick instead, side by side on one machine.

Run through `bench/run` (it installs the PyTorch venv and builds the release binary first):

    bench/run [--quick] [--only harness,loader,step,ddp,detect,bisect] [--pairs N] [--threads N]
              [--out BENCHMARKS.md] [--note TEXT] [--baseline BINARY --baseline-label TEXT]

Every comparison runs its contenders interleaved (A B A B …): one warm-up round that is thrown
away, then `--pairs` measured rounds (5 by default). Figures are the median and the min–max of the
measured rounds; a ratio is the median of the per-round ratios, so that slow drifts of a busy
machine hit both sides of a round alike. Raw outputs and every figure go to
`reports/runs/bench-<UTC time>/` (git-ignored); the report goes to `--out`.

Only the standard library is used here; the peers (bench/peers/) run in the PyTorch venv.
"""

import argparse
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import (  # noqa: E402
    REPO, BenchError, Runner, cell, display_path, interleave, parse, per_round_ratio, shell, stats)
from readings import readings  # noqa: E402

PEERS = REPO / "bench" / "peers"
CASES = REPO / "bench" / "cases"

DONE_RE = re.compile(
    r"done: (?P<total>\d+) steps, .*?; (?P<steps>\d+) steps in (?P<loop_s>[\d.]+) s, (?P<rate>[\d.]+) steps/s "
    r"\(data (?P<data_s>[\d.]+) s, compute (?P<compute_s>[\d.]+) s\)"
)
LOADER_RE = re.compile(
    r"loader-only: (?P<batches>\d+) batches of (?P<batch>\d+) samples in (?P<total_s>[\d.]+) s, first batch after "
    r"(?P<first_s>[\d.]+) s, (?P<rate>[\d.]+) samples/s after the first (?P<warm>\d+) batches; "
    r"dataset checksum (?P<checksum>0x[0-9a-f]+)"
)
PARAMS_RE = re.compile(r"parameters: (\d+); intra-op threads: (\d+)")
OPS_RE = re.compile(r"ops per step: (?P<ops>\d+); a trivial op: (?P<us>[\d.]+) us")

# Sizes. `full` is what BENCHMARKS.md is made from (about 10 minutes on an idle 2-core machine);
# `quick` tries every comparison in a few minutes, for correctness only.
SIZES = {
    "full": {
        "pairs": 5,
        "harness": {"steps": 600},
        # 512 trajectories × 126 snapshots × 128 points: a 33 MB cache that is quick to generate
        # (the solver's cost grows with samples × grid, the cache with the snapshots too).
        "loader": {"samples": 512, "grid": 128, "timesteps": 126, "queries": 64, "batch": 32, "augment": 16,
                   "batches": 300, "per_sample_batches": 30},
        "step": [
            ("default model", {}, {"samples": 64, "grid": 128, "timesteps": 10, "queries": 64}, 16, 200),
            ("wider and deeper", {"hidden": 192, "heads": 3, "latent_tokens": 32, "depths": [2, 2], "mlp_ratio": 4},
             {"samples": 64, "grid": 256, "timesteps": 10, "queries": 128}, 32, 40),
        ],
        "ddp": {"global_batch": 32, "steps": 150},
        "detect_runs": 5,
        "bisect": "all",
    },
    "quick": {
        "pairs": 2,
        "harness": {"steps": 60},
        "loader": {"samples": 128, "grid": 128, "timesteps": 32, "queries": 64, "batch": 32, "augment": 16,
                   "batches": 60, "per_sample_batches": 12},
        "step": [
            ("default model", {}, {"samples": 64, "grid": 128, "timesteps": 10, "queries": 64}, 16, 40),
        ],
        "ddp": {"global_batch": 32, "steps": 30},
        "detect_runs": 2,
        "bisect": "some",
    },
}


# ---------------------------------------------------------------------------------------------
# The comparisons


class Bench:
    def __init__(self, args):
        self.args = args
        self.size = SIZES["quick" if args.quick else "full"]
        self.pairs = args.pairs or self.size["pairs"]
        self.warmup = 1
        self.threads = args.threads or os.cpu_count() or 1
        self.binary = Path(args.binary).resolve()
        self.python = args.python
        self.work = Path(args.work).resolve()
        self.runner = Runner(self.work)
        self.results = {}
        self.sections = []
        self.ratios = []  # (comparison, figure, median/min/max or {"text"}, goal, met)
        self.dirs = 0
        self.started = time.perf_counter()

    def progress(self, text):
        elapsed = time.perf_counter() - self.started
        print(f"[{elapsed:6.0f} s] {text}", file=sys.stderr, flush=True)

    def ups(self, *args):
        return [self.binary, *args]

    def peer(self, script, *args):
        return [self.python, PEERS / script, *args]

    def run_dir(self, label):
        """A fresh folder for one `ups-doctor run --out` or `bisect --out`."""
        self.dirs += 1
        return self.work / "runs" / f"{self.dirs:04d}-{label}"

    # -- 1 -----------------------------------------------------------------------------------
    def harness(self):
        steps = self.size["harness"]["steps"]
        sets = ["--set", f"train.steps={steps}"]
        env = {"OMP_NUM_THREADS": str(self.threads)}
        scenario = "scenarios/train-cpu.json"
        bare_cmd = self.ups("train", scenario, *sets)
        run_cmd = self.ups("run", scenario, *sets, "--json", "--quiet", "--out", "OUT")
        # The rank's own share of the overhead: markers written into a pipe that another process
        # drains (as the harness's reader thread does), without the harness's sampling and supervisor.
        pipe_env = dict(env, UPS_DOCTOR_MARKER_FD="3")
        pipe_cmd = ["bash", "-c", " ".join(shlex.quote(str(c)) for c in bare_cmd) + " 3> >(cat > /dev/null)"]

        def bare():
            r = self.runner.run(bare_cmd, env, "harness-bare")
            m = parse(DONE_RE, r["stdout"], "done:")
            return {"trainer_steps_per_s": float(m["rate"]), "wall_s": r["wall_s"]}

        def piped():
            r = self.runner.run(pipe_cmd, pipe_env, "harness-markers-piped")
            m = parse(DONE_RE, r["stdout"], "done:")
            return {"trainer_steps_per_s": float(m["rate"]), "wall_s": r["wall_s"]}

        def harnessed():
            out = self.run_dir("harness-run")
            r = self.runner.run([*run_cmd[:-1], out], env, "harness-run")
            result = json.loads(r["stdout"])
            s = result["scenarios"][0]
            log = next(out.glob("*/rank0.stdout.log")).read_text()
            m = parse(DONE_RE, log, "done:")
            return {"trainer_steps_per_s": float(m["rate"]), "harness_steps_per_s": s["steps_per_s"],
                    "wall_s": r["wall_s"], "samples": (s.get("memory") or {}).get("samples")}

        res = interleave({"bare": bare, "piped": piped, "harnessed": harnessed}, self.pairs, self.warmup,
                         self.progress)
        ratio = per_round_ratio(res, "harnessed", "bare", "trainer_steps_per_s")
        ratio_p = per_round_ratio(res, "piped", "bare", "trainer_steps_per_s")
        ratio_h = per_round_ratio(
            {"h": [{"x": x["harness_steps_per_s"]} for x in res["harnessed"]],
             "b": [{"x": x["trainer_steps_per_s"]} for x in res["bare"]]}, "h", "b", "x")
        self.results["harness"] = {"rounds": res, "ratio": ratio, "ratio_harness_clock": ratio_h,
                                   "ratio_piped": ratio_p}
        rows = [
            ("`ups-doctor train` (bare, markers dropped)", stats([x["trainer_steps_per_s"] for x in res["bare"]]),
             None, stats([x["wall_s"] for x in res["bare"]])),
            ("`ups-doctor train`, markers into a pipe drained by `cat` (the rank's share, no harness)",
             stats([x["trainer_steps_per_s"] for x in res["piped"]]), None,
             stats([x["wall_s"] for x in res["piped"]])),
            ("`ups-doctor run` (markers, memory and `/dev/shm` sampling, supervisor)",
             stats([x["trainer_steps_per_s"] for x in res["harnessed"]]),
             stats([x["harness_steps_per_s"] for x in res["harnessed"]]),
             stats([x["wall_s"] for x in res["harnessed"]])),
        ]
        met = ratio["median"] >= 0.99
        self.ratios.append(("1. harness overhead", "steps/s under `run` ÷ bare (trainer clock)",
                            ratio, "≥ 0.99", met))
        text = [
            "## 1. Harness overhead",
            "",
            f"The reference scenario (`{scenario}`, {steps} steps, one rank, {self.threads} intra-op "
            "threads) run bare and under the harness with everything it samples on (markers for every "
            "phase through the pipe, read at most ten times a second; per-process RSS of the rank's tree and "
            "`/dev/shm` every 250 ms, PSS/USS from `smaps_rollup` once a second or when RSS grew, in a sampling "
            "thread at nice 10; the supervisor, which sleeps until an exit, a stack dump or "
            "its next deadline (no fixed tick); NVML sampling, `limits.gpu_sample_ms`, is on but has no "
            "GPU to read on a machine without one).",
            "",
            "Both sides are measured on the same clock: the trainer's own, over the training loop (first "
            "step's start to the last step's end, start-up excluded), from its `done:` line (bare: stdout; "
            "under `run`: the rank's `rank0.stdout.log`). The harness's own `steps_per_s` "
            "(result.json, from the times the rank stamped on its markers) is shown next to it.",
            "",
            "```sh",
            shell(bare_cmd, env),
            shell(pipe_cmd, pipe_env),
            shell(run_cmd, env) + "   # OUT: a fresh folder per round",
            "```",
            "",
            "| | steps/s (trainer clock) | steps/s (harness, result.json) | wall time of the command (s) |",
            "| --- | --- | --- | --- |",
        ]
        for name, s, h, w in rows:
            text.append(f"| {name} | {cell(s)} | {cell(h) if h else '–'} | {cell(w, 2)} |")
        text += ["", f"**Ratio** (under `run` ÷ bare, per round): {cell(ratio, 3)}; "
                 f"on the harness's clock: {cell(ratio_h, 3)}. Goal ≥ 0.99: **{'met' if met else 'not met'}**. "
                 f"Markers into a drained pipe alone ÷ bare: {cell(ratio_p, 3)}.", ""]
        self.sections.append(("harness", text))

    # -- 2 -----------------------------------------------------------------------------------
    def loader(self):
        L = self.size["loader"]
        base_sets = ["--set", f"data.samples={L['samples']}", "--set", f"data.grid={L['grid']}",
                     "--set", f"data.timesteps={L['timesteps']}", "--set", f"data.queries={L['queries']}",
                     "--set", f"data.batch_size={L['batch']}", "--set", f"data.augment_passes={L['augment']}"]
        peer_base = ["--samples", L["samples"], "--grid", L["grid"], "--timesteps", L["timesteps"],
                     "--queries", L["queries"], "--batch", L["batch"], "--augment-passes", L["augment"]]
        env = {"OMP_NUM_THREADS": str(self.threads)}
        cache_mib = L["samples"] * L["timesteps"] * L["grid"] * 4 / 2**20
        checksums = {}

        def ours(workers, method, cache, batches):
            cmd = self.ups("train", "--loader-only", "scenarios/train-cpu.json", *base_sets,
                           "--set", f"train.steps={batches}", "--set", f"data.workers={workers}",
                           "--set", f"data.start_method={method}", "--set", f"data.cache={cache}")
            return cmd

        def theirs(workers, method, dataset, storage, batches):
            return self.peer("loader.py", *peer_base, "--batches", batches, "--workers", workers,
                             "--start-method", method, "--dataset", dataset, "--storage", storage,
                             "--threads", self.threads)

        def measured(cmd, label):
            def fn():
                r = self.runner.run(cmd, env, label, sample_memory=True)
                m = parse(LOADER_RE, r["stdout"], "loader-only:")
                checksums.setdefault(m["checksum"], []).append(label)
                return {"samples_per_s": float(m["rate"]), "first_batch_s": float(m["first_s"]),
                        "peak_pss_mib": r["peak_pss"] / 2**20, "wall_s": r["wall_s"]}
            return fn

        b, bs = L["batches"], L["per_sample_batches"]
        # Per group: contenders (name → (short name, command)), the ups-doctor contender and the
        # peer that ratios are taken against, and the peer that duplicates the dataset per worker.
        OURS_MEM, OURS_SHM, OURS_SPAWN_MEM = "ups-doctor, memory cache", "ups-doctor, shm cache", \
            "ups-doctor, memory cache (each worker regenerates it)"
        BATCHED, PER_SAMPLE = "PyTorch, batched dataset", "PyTorch, per-sample dataset"
        TENSORS, NUMPY = "PyTorch, batched dataset of tensors (torch moves them to shm)", \
            "PyTorch, batched dataset of numpy arrays (pickled into every worker)"
        groups = []
        for workers, method in [(0, "fork"), (2, "fork"), (4, "fork"), (2, "spawn"), (4, "spawn")]:
            c = {}
            tag = f"w{workers}" + (f"-{method}" if workers else "")
            if method == "fork":
                c[OURS_MEM] = ("ups-doctor", ours(workers, method, "memory", b))
                c[BATCHED] = ("PyTorch batched", theirs(workers, method, "batched", "tensor", b))
                if workers != 2:
                    c[PER_SAMPLE] = ("PyTorch per-sample", theirs(workers, method, "per-sample", "tensor", bs))
                groups.append((tag, workers, method, c, OURS_MEM, BATCHED, None))
            else:
                c[OURS_SHM] = ("ups-doctor shm", ours(workers, method, "shm", b))
                c[TENSORS] = ("PyTorch tensors", theirs(workers, method, "batched", "tensor", b))
                if workers == 4:
                    c[OURS_SPAWN_MEM] = ("ups-doctor memory", ours(workers, method, "memory", b))
                    c[NUMPY] = ("PyTorch numpy", theirs(workers, method, "batched", "numpy", b))
                groups.append((tag, workers, method, c, OURS_SHM, TENSORS, NUMPY if workers == 4 else None))

        text = [
            "## 2. Data loader vs PyTorch's DataLoader",
            "",
            f"The same Burgers samples on both sides: {L['samples']} trajectories × {L['timesteps']} snapshots × "
            f"{L['grid']} points ({cache_mib:.1f} MiB of `f32`), generated by ups-doctor's solver and by its "
            "op-for-op port in `bench/peers/upsdata.py` after the same `manual_seed`; every run prints the "
            "dataset's checksum (its `f32` words weighted by position, mod 2⁶⁴) and the bench stops if any "
            "differs. The same per-sample work: the input snapshot on the whole grid, "
            f"{L['queries']} random distinct query points, the next snapshot gathered there, both normalised, "
            f"and {L['augment']} augmentation passes (`data.augment_passes`: a random sub-grid translation of "
            f"input and target through an rfft/irfft pair each); batches of {L['batch']}, shuffled, "
            "2 batches prefetched per worker, workers kept across epochs.",
            "",
            "Loader only, no model (`ups-doctor train --loader-only`, a hidden flag that runs the scenario's "
            "data path and draws every batch training would): with a model, the step would hide the loader. "
            "Peers (`bench/peers/loader.py`, torch.utils.data.DataLoader): *batched* implements "
            "`__getitems__` with ups-doctor's vectorised batch code (the same work, done the same way: the "
            "fair comparison of the loader machinery); *per-sample* is the `__getitem__` + default collate "
            "dataset most users write. Throughput: samples/s after every worker's first prefetch "
            f"(the first `workers × 2` batches), {b} batches per run ({bs} for per-sample peers, "
            "which are slower). Memory: the peak total PSS of the process tree (trainer + workers, "
            "and PyTorch's resource tracker where it starts one), sampled by the bench every 100 ms the same "
            "way for both, start-up and data generation included.",
            "",
            f"Intra-op threads: {self.threads} in the main process (`OMP_NUM_THREADS`, `torch.set_num_threads`); "
            "workers use one (both tools set that themselves).",
            "",
        ]
        self.results["loader"] = {}
        closing = []
        for tag, workers, method, c, ref_ours, ref_peer, dup_peer in groups:
            self.progress(f"loader {tag}")
            fns = {name: measured(cmd, f"loader-{tag}-{i}") for i, (name, (_, cmd)) in enumerate(c.items())}
            res = interleave(fns, self.pairs, self.warmup, self.progress)
            self.results["loader"][tag] = {"rounds": res, "ours": ref_ours, "peer": ref_peer, "dup": dup_peer}
            title = "no workers" if workers == 0 else f"{workers} workers, `{method}`"
            peer_short = c[ref_peer][0]
            text += [f"### {title}", "", "```sh"]
            for name, (_, cmd) in c.items():
                text.append(f"# {name}")
                text.append(shell(cmd, env))
            text += ["```", "",
                     "| | samples/s | first batch after (s) | peak PSS, trainer + workers (MiB) | "
                     f"samples/s ÷ {peer_short} | PSS ÷ {peer_short} |",
                     "| --- | --- | --- | --- | --- | --- |"]
            for name in c:
                tr = per_round_ratio(res, name, ref_peer, "samples_per_s") if name != ref_peer else None
                mr = per_round_ratio(res, name, ref_peer, "peak_pss_mib") if name != ref_peer else None
                text.append(
                    f"| {name} | {cell(stats([x['samples_per_s'] for x in res[name]]))} | "
                    f"{cell(stats([x['first_batch_s'] for x in res[name]]), 2)} | "
                    f"{cell(stats([x['peak_pss_mib'] for x in res[name]]))} | "
                    f"{cell(tr, 2) if tr else '–'} | {cell(mr, 2) if mr else '–'} |")
            text.append("")
            ours_short = c[ref_ours][0]
            tr = per_round_ratio(res, ref_ours, ref_peer, "samples_per_s")
            self.ratios.append((f"2. loader, {title}", f"samples/s, {ours_short} ÷ {peer_short}",
                                tr, "≥ 1", tr["median"] >= 1.0))
            if PER_SAMPLE in c:
                ps = per_round_ratio(res, ref_ours, PER_SAMPLE, "samples_per_s")
                self.ratios.append((f"2. loader, {title}", f"samples/s, {ours_short} ÷ PyTorch per-sample",
                                    ps, "≥ 1", ps["median"] >= 1.0))
            if method == "spawn":
                mr = per_round_ratio(res, ref_ours, ref_peer, "peak_pss_mib")
                self.ratios.append((f"2. loader, {title}", f"peak PSS, {ours_short} ÷ {peer_short}", mr, "–", None))
            if dup_peer:
                mr = per_round_ratio(res, ref_ours, dup_peer, "peak_pss_mib")
                self.ratios.append((f"2. loader, {title}", f"peak PSS, {ours_short} ÷ {c[dup_peer][0]} "
                                    "(PyTorch duplicates the dataset per worker)", mr, "≤ 0.5", mr["median"] <= 0.5))
        if len(checksums) != 1:
            raise BenchError(f"the loaders did not see the same samples: dataset checksums {checksums}")
        # What PyTorch's runtime costs before any data: the main process and every spawned worker
        # pay it.
        baseline_cmd = [self.python, "-c", "import time, torch; time.sleep(1)"]
        baseline = stats([self.runner.run(baseline_cmd, env, "loader-import-torch", sample_memory=True)["peak_pss"]
                          / 2**20 for _ in range(3)])
        self.results["loader_import_torch_pss_mib"] = baseline
        text += [f"`import torch` alone (`{shell(baseline_cmd)}`, 3 runs): {cell(baseline)} MiB PSS.", ""]
        text += [f"Every run saw the same dataset: checksum `{next(iter(checksums))}`.", ""]
        self.sections.append(("loader", text))

    # -- 3 -----------------------------------------------------------------------------------
    def parameter_count(self, sets):
        """ups-doctor's trainable parameter count: AdamW's state is two f32 moments per
        parameter (result.json's `optimizer_state_bytes`) after one step of a single rank."""
        out = self.run_dir("params")
        r = self.runner.run(self.ups("run", "scenarios/train-cpu.json", *sets, "--set", "train.steps=1",
                                     "--json", "--quiet", "--out", out), {"OMP_NUM_THREADS": "1"}, "params")
        state = json.loads(r["stdout"])["scenarios"][0]["ranks"][0]["optimizer_state_bytes"]
        return state // 8

    def step(self):
        baseline = self.args.baseline and Path(self.args.baseline).resolve()
        text = [
            "## 3. Training step vs PyTorch eager (CPU)",
            "",
            "The same operator in PyTorch (`bench/peers/upsmodel.py`, a layer-for-layer port of "
            "`crates/trainer/src/model.rs`: encoder with supernode pooling, windowed self-attention, AdaLN "
            "conditioning on viscosity, perceiver decoder); the bench stops unless its parameter count "
            "equals ups-doctor's (from `optimizer_state_bytes` of a one-step run). The same step: batch "
            "built in the process (timed as data, not compute), forward, MSE, loss read back, backward, "
            "global-norm clipping at 1.0, AdamW with the trainer's warm-up, gradients set to None. "
            "`torch.optim.AdamW` runs its default CPU implementation (a loop over the parameters: `foreach` "
            "and `fused` are opt-in on the CPU) and `clip_grad_norm_` its default (`_foreach_norm`, "
            "`_foreach_mul_`); ups-doctor's trainer runs libtorch's fused AdamW kernel (`_fused_adamw_`, what "
            "`AdamW(fused=True)` runs) and the same two clipping ops, reading nothing back. Step time = "
            "compute time of the loop ÷ steps, on each trainer's own clock (its `done:` line).",
            "",
            f"Intra-op threads: {self.threads} on both sides (`OMP_NUM_THREADS` and `torch.set_num_threads`). "
            "GPU: no GPU was lent to this run, so there is no GPU figure.",
            "",
        ]
        if baseline:
            text += [
                f"**Before and after, in the same run.** `{display_path(baseline)}` is ups-doctor built from "
                f"{self.args.baseline_label}, run interleaved with the two others (ups-doctor, the baseline, "
                "PyTorch, in every round), so that both ratios saw the same machine.",
                "",
            ]
        self.results["step"] = {}
        for label, model, data, batch, steps in self.size["step"]:
            text += self.step_size(label, model, data, batch, steps, baseline)
        self.sections.append(("step", text))

    def step_size(self, label, model, data, batch, steps, baseline):
        """One model size of section 3: the contenders interleaved, their figures and ratios."""
        sets = [*model_sets(model), "--set", f"data.samples={data['samples']}", "--set", f"data.grid={data['grid']}",
                "--set", f"data.timesteps={data['timesteps']}", "--set", f"data.queries={data['queries']}",
                "--set", f"data.batch_size={batch}"]
        ours_params = self.parameter_count(sets)
        env = {"OMP_NUM_THREADS": str(self.threads)}
        train = ["train", "scenarios/train-cpu.json", *sets, "--set", f"train.steps={steps}"]
        peer_args = ["--model", json.dumps(model, separators=(",", ":")), "--samples", data["samples"],
                     "--grid", data["grid"], "--timesteps", data["timesteps"], "--queries", data["queries"],
                     "--batch", batch, "--threads", self.threads]
        peer_cmd = self.peer("step.py", *peer_args, "--steps", steps)

        def trainer(binary, tag):
            def run():
                r = self.runner.run([binary, *train], env, tag)
                m = parse(DONE_RE, r["stdout"], "done:")
                return {"step_ms": float(m["compute_s"]) / int(m["steps"]) * 1e3, "steps_per_s": float(m["rate"])}
            return run

        def theirs():
            r = self.runner.run(peer_cmd, env, "step-peer")
            m = parse(DONE_RE, r["stdout"], "done:")
            p = parse(PARAMS_RE, r["stdout"], "parameters:")
            if int(p[1]) != ours_params:
                raise BenchError(f"the PyTorch model has {p[1]} parameters, ups-doctor's {ours_params}: "
                                 "bench/peers/upsmodel.py no longer matches crates/trainer/src/model.rs")
            return {"step_ms": float(m["compute_s"]) / int(m["steps"]) * 1e3, "steps_per_s": float(m["rate"])}

        # Launch-bound or compute-bound: how many ATen ops PyTorch issues a step (one profiled step
        # after a short run, outside every timed loop) and what an op that does nothing costs.
        counted = self.runner.run(self.peer("step.py", *peer_args, "--steps", 3, "--count-ops"), env, "step-ops")
        ops = parse(OPS_RE, counted["stdout"], "ops per step:")
        contenders = {"ups-doctor": trainer(self.binary, "step-ours")}
        if baseline:
            contenders["ups-doctor baseline"] = trainer(baseline, "step-baseline")
        contenders["PyTorch eager"] = theirs
        self.progress(f"step: {label}, {ours_params} parameters, {ops['ops']} ops a step")
        res = interleave(contenders, self.pairs, self.warmup, self.progress)
        self.results["step"][label] = {"rounds": res, "parameters": ours_params, "ops": int(ops["ops"]),
                                       "empty_op_us": float(ops["us"])}
        ratio = per_round_ratio(res, "ups-doctor", "PyTorch eager", "step_ms")
        self.ratios.append((f"3. training step, {label}", "step time, ups-doctor ÷ PyTorch eager", ratio,
                            "≤ 0.9", ratio["median"] <= 0.9))
        eager_ms = stats([x["step_ms"] for x in res["PyTorch eager"]])["median"]
        text = [
            f"### {label}: {ours_params:,} parameters on both sides, batch {batch}, {steps} steps",
            "",
            "```json",
            json.dumps(dict(model=model_full(model), data=dict(data, batch_size=batch)), separators=(", ", ": ")),
            "```",
            "",
            "```sh",
            shell(self.ups(*train), env),
            shell(peer_cmd, env),
            "```",
            "",
            f"PyTorch issues {ops['ops']} ATen ops a step (forward, backward, clipping, AdamW; counted by "
            f"`torch.profiler`, `step.py --count-ops`): {eager_ms * 1e3 / int(ops['ops']):.1f} µs of its step "
            f"per op, against {float(ops['us']):.2f} µs for an op that does nothing (a 1-element `torch.add`).",
            "",
            "| | step time (ms) | steps/s, whole loop |",
            "| --- | --- | --- |",
        ]
        names = {"ups-doctor": "ups-doctor (tch)", "ups-doctor baseline": f"ups-doctor, {self.args.baseline_label}",
                 "PyTorch eager": "PyTorch eager"}
        for name, rounds in res.items():
            text.append(f"| {names[name]} | {cell(stats([x['step_ms'] for x in rounds]), 2)} | "
                        f"{cell(stats([x['steps_per_s'] for x in rounds]))} |")
        text += ["", f"**Ratio** (step time, ups-doctor ÷ PyTorch, per round): {cell(ratio, 3)}. Goal ≤ 0.9: "
                 f"**{'met' if ratio['median'] <= 0.9 else 'not met'}**."]
        if baseline:
            before = per_round_ratio(res, "ups-doctor baseline", "PyTorch eager", "step_ms")
            self.ratios.append((f"3. training step, {label}", f"the same, {self.args.baseline_label}", before,
                                "–", None))
            text[-1] += f" {self.args.baseline_label[0].upper()}{self.args.baseline_label[1:]}: {cell(before, 3)}."
        return text + [""]

    # -- 4 -----------------------------------------------------------------------------------
    def ddp(self):
        D = self.size["ddp"]
        gb, steps = D["global_batch"], D["steps"]
        one = {"OMP_NUM_THREADS": "1"}
        contenders = {}
        cmds = {}

        def ours(mode, world):
            sets = ["--set", f"launch.mode={mode}", "--set", f"launch.world_size={world}",
                    "--set", f"data.batch_size={gb // world}", "--set", f"train.steps={steps}"]
            cmd = self.ups("run", "scenarios/train-cpu.json", *sets, "--json", "--quiet", "--out", "OUT")

            def fn():
                out = self.run_dir(f"ddp-{mode}{world}")
                r = self.runner.run([*cmd[:-1], out], one, f"ddp-ours-{mode}{world}")
                s = json.loads(r["stdout"])["scenarios"][0]
                m = parse(DONE_RE, next(out.glob("*/rank0.stdout.log")).read_text(), "done:")
                return {"steps_per_s": float(m["rate"]), "harness_steps_per_s": s["steps_per_s"]}
            return cmd, fn

        def theirs(world):
            args = ["--batch", gb // world, "--steps", steps, "--threads", 1]
            if world == 1:
                cmd = self.peer("step.py", *args)
            else:
                cmd = [self.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", world,
                       PEERS / "step.py", *args, "--parallel", "ddp"]

            def fn():
                r = self.runner.run(cmd, one, f"ddp-peer-{world}")
                m = parse(DONE_RE, r["stdout"], "done:")
                return {"steps_per_s": float(m["rate"])}
            return cmd, fn

        for name, (cmd, fn) in [("ups-doctor single", ours("single", 1)), ("ups-doctor ddp-2", ours("ddp", 2)),
                                ("ups-doctor fsdp-2", ours("fsdp", 2)), ("PyTorch single", theirs(1)),
                                ("PyTorch DDP-2 (gloo, torchrun)", theirs(2))]:
            contenders[name], cmds[name] = fn, cmd
        res = interleave(contenders, self.pairs, self.warmup, self.progress)
        self.results["ddp"] = res
        scale = {name: per_round_ratio(res, name, base, "steps_per_s") for name, base in [
            ("ups-doctor ddp-2", "ups-doctor single"), ("ups-doctor fsdp-2", "ups-doctor single"),
            ("PyTorch DDP-2 (gloo, torchrun)", "PyTorch single")]}
        vs_peer = {
            "ups-doctor single": per_round_ratio(res, "ups-doctor single", "PyTorch single", "steps_per_s"),
            "ups-doctor ddp-2": per_round_ratio(res, "ups-doctor ddp-2", "PyTorch DDP-2 (gloo, torchrun)",
                                                "steps_per_s"),
        }
        self.ratios.append(("4. DDP scaling", "ddp-2 steps/s, ups-doctor ÷ PyTorch DDP (gloo)",
                            vs_peer["ups-doctor ddp-2"], "≥ 1", vs_peer["ups-doctor ddp-2"]["median"] >= 1.0))
        self.ratios.append(("4. DDP scaling", "speed-up single → ddp-2, ups-doctor",
                            scale["ups-doctor ddp-2"], "–", None))
        self.ratios.append(("4. DDP scaling", "speed-up single → DDP-2, PyTorch",
                            scale["PyTorch DDP-2 (gloo, torchrun)"], "–", None))
        text = [
            "## 4. DDP scaling on CPU",
            "",
            f"The default model, a global batch of {gb} (per rank: {gb} on one rank, {gb // 2} on two), {steps} "
            "steps, one intra-op thread per rank (`OMP_NUM_THREADS=1`, torchrun's default for several ranks; "
            "one rank then uses one of the machine's cores, two ranks both). ups-doctor's ranks are launched by "
            "`ups-doctor run` and exchange gradients over its `tcp` ring (DDP: one all-reduce of the whole "
            "25 MB bucket after backward; FSDP: all-gather before the step, reduce-scatter after); PyTorch's by "
            "torchrun with Gloo (DDP's bucketed all-reduce overlapped with backward). steps/s on rank 0's "
            "own clock (its `done:` line) over the whole loop. PyTorch FSDP is not in the table: "
            "ups-doctor's FSDP is FSDP1-style on CPU, and PyTorch's FSDP on CPU with Gloo is a different "
            "implementation (FSDP2, DTensor) whose comparison would say little about ours. PyTorch's ranks "
            "leave with `os._exit(0)` after a final barrier: on this machine a rank sometimes aborted in Gloo's "
            "teardown (`terminate called without an active exception`) after its work was done.",
            "",
            "```sh",
        ]
        for name, cmd in cmds.items():
            text += [f"# {name}", shell(cmd, one) + ("   # OUT: a fresh folder per round" if "OUT" in map(str, cmd) else "")]
        text += ["```", "", "| | steps/s | speed-up over its single rank | ÷ the PyTorch counterpart |",
                 "| --- | --- | --- | --- |"]
        for name in contenders:
            sc = scale.get(name)
            vp = vs_peer.get(name)
            text.append(f"| {name} | {cell(stats([x['steps_per_s'] for x in res[name]]))} | "
                        f"{cell(sc, 2) if sc else '–'} | {cell(vp, 2) if vp else '–'} |")
        text.append("")
        self.sections.append(("ddp", text))

    # -- 5 -----------------------------------------------------------------------------------
    def detect(self):
        n = self.size["detect_runs"]
        crash_cmd = self.ups("run", "scenarios/ddp-rank1-segv.json", "--json", "--quiet", "--out", "OUT")
        hang_cmd = self.ups("run", "scenarios/hang-deadlock.json", "--json", "--quiet", "--out", "OUT")
        crash, hang = [], []
        for i in range(n):
            out = self.run_dir("detect-crash")
            r = self.runner.run([*crash_cmd[:-1], out], {}, "detect-crash")
            s = json.loads(r["stdout"])["scenarios"][0]
            rank = next(x for x in s["ranks"] if x["rank"] == s["first_failure"])
            other = [x for x in s["ranks"] if x["rank"] != s["first_failure"]]
            t0 = train_end(rank)
            start = scenario_start(out)
            crash.append({
                "noticed_s": rank["ended_at_s"] - t0,
                "crash_record_to_noticed_s": rank["ended_at_s"] - rank["last_marker_at_s"],
                "collateral_ended_s": max(x["ended_at_s"] for x in other) - rank["ended_at_s"],
                "report_s": (out / "report.md").stat().st_mtime - start - t0,
                "wall_s": s["wall_s"],
            })
            self.progress(f"detect crash {i + 1}/{n}: noticed after {crash[-1]['noticed_s']:.3f} s, report after "
                          f"{crash[-1]['report_s']:.2f} s")
            out = self.run_dir("detect-hang")
            r = self.runner.run([*hang_cmd[:-1], out], {}, "detect-hang")
            s = json.loads(r["stdout"])["scenarios"][0]
            rank = s["ranks"][0]
            t0 = train_end(rank)
            limit = s["scenario"]["limits"]["hang_after_s"]
            declared = t0 + rank["hang_detected_after_s"]
            hang.append({
                "verdict_s": rank["hang_detected_after_s"],
                "late_s": rank["hang_detected_after_s"] - limit,
                "ended_s": rank["ended_at_s"] - declared,
                "report_s": (out / "report.md").stat().st_mtime - scenario_start(out) - t0,
                "limit_s": limit,
            })
            self.progress(f"detect hang {i + 1}/{n}: verdict after {hang[-1]['verdict_s']:.3f} s of silence, "
                          f"report after {hang[-1]['report_s']:.2f} s")
        self.results["detect"] = {"crash": crash, "hang": hang}
        limit = hang[0]["limit_s"]
        noticed = stats([x["noticed_s"] for x in crash])
        verdict = stats([x["verdict_s"] for x in hang])
        self.ratios.append(("5. detection", "crash → harness noticed (s); torchrun polls every 0.1 s",
                            noticed, "–", None))
        self.ratios.append(("5. detection", f"last marker → hang verdict (s), `hang_after_s` = {limit:g}; "
                            "NCCL's watchdog: 600 s", verdict, "–", None))
        text = [
            "## 5. Detection latency",
            "",
            f"{n} runs each of a shipped crash and a shipped hang, times from `result.json` (seconds since the "
            "scenario started, stamped by the harness as markers arrive and as it sees processes end) and "
            "from the report's file time against the resolved `scenario.json` written just before the ranks "
            "start.",
            "",
            "```sh",
            shell(crash_cmd) + "   # OUT: a fresh folder per run",
            shell(hang_cmd) + "   # OUT: a fresh folder per run",
            "```",
            "",
            "**Crash** (`ddp-rank1-segv`: rank 1 gets SIGSEGV at the start of `forward` of step 3). The crash "
            "is placed at rank 1's last `step` marker (step 2's end), so each figure is an upper bound that "
            "includes step 3's `data.next` (well under a millisecond here) and the crash handler symbolising "
            "its backtrace before re-raising the signal.",
            "",
            "| | seconds, median (min–max) |",
            "| --- | --- |",
            f"| crash → the harness sees rank 1 end (signal, exit status reaped) | {cell(noticed, 3)} |",
            f"| of which: its backtrace record arrives → rank 1's end seen | "
            f"{cell(stats([x['crash_record_to_noticed_s'] for x in crash]), 3)} |",
            f"| rank 1's end → collateral rank 0 ended (its broken all-reduce) | "
            f"{cell(stats([x['collateral_ended_s'] for x in crash]), 3)} |",
            f"| crash → `report.md` written | {cell(stats([x['report_s'] for x in crash]), 3)} |",
            "",
            f"**Hang** (`hang-deadlock`: a two-thread deadlock in the optimizer at step 2, "
            f"`hang_after_s` = {limit:g}). Silence is counted from the last marker the rank sent; the verdict "
            "is followed by a stack dump of every thread (up to 5 s for answers), SIGTERM, a 3 s grace, SIGKILL "
            "if needed.",
            "",
            "| | seconds, median (min–max) |",
            "| --- | --- |",
            f"| last marker → hang verdict (silence when declared) | {cell(verdict, 3)} |",
            f"| verdict later than `hang_after_s` by | {cell(stats([x['late_s'] for x in hang]), 3)} |",
            f"| verdict → rank ended (stacks dumped, torn down) | {cell(stats([x['ended_s'] for x in hang]), 3)} |",
            f"| last step marker → `report.md` written | {cell(stats([x['report_s'] for x in hang]), 3)} |",
            "",
            "Anchors: torchrun's elastic agent checks its workers every 0.1 s (`monitor_interval`), so a "
            "crashed rank is noticed within about that, but with no backtrace for a signal and the other ranks "
            "left to time out; NCCL's watchdog declares a stuck collective after 10 minutes by default "
            "(`Timeout(ms)=600000`), and a hang outside a collective is never declared at all.",
            "",
        ]
        self.sections.append(("detect", text))

    # -- 6 -----------------------------------------------------------------------------------
    def bisect(self):
        cases = [
            ("single cause (conditioning)", CASES / "bisect-single.json", []),
            ("two-component interaction (attention × conditioning)", CASES / "bisect-pair.json", []),
            ("numeric thresholds (2+ blocks in stage 0, 4+ steps)", CASES / "bisect-threshold.json",
             ["--budget", "80"]),
            ("a stage-depth threshold from the phase itself", CASES / "bisect-depth.json",
             ["--set", "model.depths=[4, 2]"]),
            ("single cause under DDP with loader workers (ladder cuts apply)", CASES / "bisect-ladder.json", []),
            ("shipped: segv-needs-conditioning", REPO / "scenarios" / "segv-needs-conditioning.json", []),
        ]
        if self.size["bisect"] == "some":
            cases = [cases[0], cases[4]]
        rows = []
        results = {}
        for label, file, extra in cases:
            row = {}
            for strategy in ("ladder", "ddmin"):
                out = self.run_dir(f"bisect-{file.stem}-{strategy}")
                cmd = self.ups("bisect", file, *extra, "--strategy", strategy, "--json", "--quiet", "--jobs", "2",
                               "--out", out, "--cache", out / "cache")
                r = self.runner.run(cmd, {}, f"bisect-{file.stem}-{strategy}")
                rec = json.loads(r["stdout"])
                row[strategy] = {"runs": rec["runs"], "minimal_delta": rec["minimal_delta"],
                                 "boundary": rec["boundary"], "components": rec["components"],
                                 "exhausted": rec["budget_exhausted"], "wall_s": r["wall_s"],
                                 "confirm": sum(1 for p in rec["probes"] if p["stage"] == "confirm" and not p["cached"])}
                self.progress(f"bisect {file.stem} {strategy}: {rec['runs']} runs, boundary {rec['boundary']}")
            row["cmd"] = shell(self.ups("bisect", file, *extra, "--json", "--quiet", "--jobs", "2",
                                        "[--strategy ddmin]"))
            same = comparable(row["ladder"]["minimal_delta"]) == comparable(row["ddmin"]["minimal_delta"])
            rows.append((label, row, same))
            results[file.stem] = row
        self.results["bisect"] = results
        text = [
            "## 6. Bisect cost",
            "",
            "Real runs spent by `ups-doctor bisect` (confirm runs included; `--confirm 2`, each bisect with a "
            "fresh cache) on the planted cases of `tests/bisect.rs` (as files in `bench/cases/`) and a shipped "
            "scenario; the same search without the ladder (`--strategy ddmin`, a hidden switch: the big cuts "
            "become ordinary delta-debugging components); and one-factor-at-a-time (OFAT): the confirm runs "
            "plus one run per component, each cut alone from the original, i.e. `2 + len(components)` from "
            "`bisect.json`. OFAT only says which single cuts make the failure go away. It gives no minimal "
            "failing configuration (it never tries the harmless cuts together, which can interact), no "
            "thresholds (a numeric component is only tried at its minimum), and it misses a failure that "
            "needs either of two components (no single cut removes it). Its count is a lower bound on what a "
            "hand-made OFAT that also looked for thresholds would cost. Probes run two at a time (`--jobs 2`); the run "
            "counts do not depend on that, the wall times do. \"Same minimal configuration\" ignores "
            "`data.start_method` once `data.workers` is 0 (it then does nothing).",
            "",
            "```sh",
        ]
        text += [r[1]["cmd"] for r in rows]
        text += ["```", "",
                 "| case | components | runs: bisect (ladder) | runs: without the ladder | runs: OFAT | "
                 "wall time (s): ladder / without | same minimal configuration | boundary |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for label, row, same in rows:
            comps = len(row["ladder"]["components"])
            ofat = row["ladder"]["confirm"] + comps
            flag = lambda s: " (budget ran out)" if row[s]["exhausted"] else ""  # noqa: E731
            text.append(f"| {label} | {comps} | {row['ladder']['runs']}{flag('ladder')} | "
                        f"{row['ddmin']['runs']}{flag('ddmin')} | {ofat} | "
                        f"{row['ladder']['wall_s']:.1f} / {row['ddmin']['wall_s']:.1f} | {'yes' if same else 'no'} | "
                        f"{', '.join('`' + b + '`' for b in row['ladder']['boundary'])} |")
            self.ratios.append(("6. bisect cost", f"runs, {label}: ladder / no ladder / OFAT",
                                {"text": f"{row['ladder']['runs']} / {row['ddmin']['runs']} / {ofat}"}, "–", None))
        text.append("")
        self.sections.append(("bisect", text))

    # -- the report ---------------------------------------------------------------------------
    def write(self, machine, order, elapsed):
        lines = ["# Benchmarks", ""]
        if self.args.note:
            lines += [f"> **{self.args.note}**", ""]
        lines += [
            "ups-doctor against the PyTorch peers a user would pick instead, on the same machine in the same "
            f"run. Made by `{shell(['bench/run', *shown_args()])}` in {elapsed / 60:.1f} min "
            f"({'quick mode: sizes cut down, for trying the bench, not for reading' if self.args.quick else 'full sizes'}).",
            "",
            "## Machine",
            "",
            "| | |",
            "| --- | --- |",
        ]
        lines += [f"| {k} | {v} |" for k, v in machine.items()]
        lines += [
            "",
            "## Method",
            "",
            f"Each comparison runs its contenders interleaved, A B A B …: one warm-up round thrown away, then "
            f"{self.pairs} measured rounds. Every figure is the median (min–max) over the measured rounds; every "
            "ratio is the median (min–max) of the per-round ratios. Clocks are each program's own over its "
            "steady part (start-up excluded) unless a table says otherwise. Nothing here is asserted by the "
            "test suite; these are measurements. Re-run: `bench/run` (about 10 min on an idle 2-core machine; "
            "`bench/run --quick` for a try).",
            "",
        ]
        for name in order:
            for key, text in self.sections:
                if key == name:
                    lines += text
                    lines += readings(key, self)
        lines += ["## Ratios", "", "| comparison | figure | median (min–max) | goal | met |",
                  "| --- | --- | --- | --- | --- |"]
        for comparison, figure, value, goal, met in self.ratios:
            shown = value["text"] if "text" in value else cell(value, 3)
            lines.append(f"| {comparison} | {figure} | {shown} | {goal} | "
                         f"{'–' if met is None else ('yes' if met else '**no**')} |")
        lines.append("")
        Path(self.args.out).write_text("\n".join(lines))


def shown_args():
    """The command line as it made the report, without the text of `--note` (shown above it)."""
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a == "--note":
            args += ["--note", "TEXT"]
            skip = True
        elif a.startswith("--note="):
            args += ["--note", "TEXT"]
        else:
            args.append(a)
    return args


def comparable(delta):
    """A minimal configuration's delta without `data.start_method`, which does nothing once
    `data.workers` is 0 (bisect does not cut what cannot matter, so either setting may remain)."""
    if "data.workers=0" in delta:
        return [d for d in delta if not d.startswith("data.start_method=")]
    return delta


def model_sets(model):
    sets = []
    for k, v in model.items():
        sets += ["--set", f"model.{k}={json.dumps(v, separators=(',', ':'))}"]
    return sets


def model_full(model):
    defaults = {"depths": [1, 1], "hidden": 64, "heads": 4, "latent_tokens": 16, "window": 4, "attention": True,
                "conditioning": True, "mlp_ratio": 2}
    return dict(defaults, **model)


def train_end(rank):
    """When the rank's last `step` marker arrived (the end of its `train` span)."""
    spans = [s for s in rank.get("timeline", []) if s["phase"] == "train"]
    if not spans or spans[-1].get("end_s") is None:
        raise BenchError(f"rank {rank['rank']} has no finished step in its timeline")
    return spans[-1]["end_s"]


def scenario_start(out):
    """The scenario's start on the wall clock: its resolved scenario.json is written just before the
    ranks are spawned (and the harness's clock starts)."""
    return next(out.glob("*/scenario.json")).stat().st_mtime


def machine_facts(bench):
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = "unknown"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    torch_version = subprocess.run([bench.python, "-c", "import torch, sys; print(torch.__version__, sys.version.split()[0])"],
                                   capture_output=True, text=True).stdout.split()
    return {
        "CPU": f"{cpu}, {os.cpu_count()} logical cores",
        "memory": mem,
        "kernel": f"{platform.system()} {platform.release()}",
        "git commit": f"`{commit}`" + (" (with uncommitted changes)" if dirty else ""),
        "ups-doctor": f"`{display_path(bench.binary)}` (release build), libtorch 2.11.0",
        "peers": (f"PyTorch {torch_version[0]} on Python {torch_version[1]}" if len(torch_version) == 2
                  else "unknown") + f" (`{bench.python}`)",
        **({"baseline": f"`{display_path(Path(bench.args.baseline).resolve())}` ({bench.args.baseline_label}), "
                        "release build"} if bench.args.baseline else {}),
        "GPU": "none lent to this run",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes and 2 measured rounds: for trying the bench")
    p.add_argument("--only", default="harness,loader,step,ddp,detect,bisect",
                   help="comma-separated comparisons to run (default: all)")
    p.add_argument("--pairs", type=int, default=0, help="measured rounds per comparison (default 5; quick 2)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads of single-process runs (default: cores)")
    p.add_argument("--binary", default=str(REPO / "target" / "release" / "ups-doctor"))
    p.add_argument("--baseline", default="", help="another ups-doctor build (its ups-doctor-trainer beside it), "
                   "e.g. of main before a change: the step comparison runs it too, interleaved, for before and after")
    p.add_argument("--baseline-label", default="the baseline build",
                   help="what --baseline was built from, as the report names it (e.g. 'main at c18d13d')")
    p.add_argument("--python", default=os.environ.get("UPS_DOCTOR_PYTHON", ""))
    p.add_argument("--out", default=str(REPO / "BENCHMARKS.md"))
    p.add_argument("--work", default="")
    p.add_argument("--note", default="", help="a line shown under the title (e.g. 'preliminary, machine busy')")
    args = p.parse_args()
    order = [c.strip() for c in args.only.split(",") if c.strip()]
    known = ["harness", "loader", "step", "ddp", "detect", "bisect"]
    unknown = [c for c in order if c not in known]
    if unknown:
        p.error(f"--only: unknown comparison(s) {unknown}; choose from {','.join(known)}")
    if not args.python or not Path(args.python).exists():
        p.error("no PyTorch venv: set UPS_DOCTOR_PYTHON (bench/run does, after `./x pytorch`)")
    if not Path(args.binary).exists():
        p.error(f"no ups-doctor binary at {args.binary}: run `./x release` (bench/run does)")
    if args.baseline and not (Path(args.baseline).exists() and (Path(args.baseline).parent / "ups-doctor-trainer").exists()):
        p.error(f"--baseline {args.baseline}: no such ups-doctor with an ups-doctor-trainer beside it")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")
    args.work = args.work or str(REPO / "reports" / "runs" / f"bench-{stamp}")
    # Ctrl-C and SIGTERM end the command running with its process group (Runner.run), even when
    # this process was started with SIGINT ignored (a background job of a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    bench = Bench(args)
    bench.progress(f"bench: {', '.join(order)}; {bench.pairs} measured round(s) after a warm-up; raw output in "
                   f"{display_path(bench.work)}")
    machine = machine_facts(bench)
    try:
        for name in order:
            bench.progress(f"== {name}")
            getattr(bench, name)()
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # The command running was killed with its process group (Runner.run); nothing is left.
        print(f"bench: interrupted; figures so far in {display_path(bench.work / 'results.json')}", file=sys.stderr)
        return 130
    finally:
        (bench.work / "results.json").write_text(json.dumps(bench.results, indent=1, default=str))
    machine["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    elapsed = time.perf_counter() - bench.started
    bench.write(machine, order, elapsed)
    bench.progress(f"wrote {display_path(Path(args.out))} ({elapsed / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
