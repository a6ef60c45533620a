#!/usr/bin/env python3
"""ups-doctor against the PyTorch peers users would pick instead, side by side on this machine.

Run through `bench/run` (it installs the PyTorch venv and builds the release binary first):

    bench/run [--quick] [--only harness,loader,step,ddp,detect,bisect] [--pairs N] [--threads N]
              [--out BENCHMARKS.md] [--note TEXT]

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
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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

# Sizes. `full` is what BENCHMARKS.md is made from (about 15 minutes on an idle 2-core machine);
# `quick` tries every comparison in a few minutes, for correctness only.
SIZES = {
    "full": {
        "pairs": 5,
        "harness": {"steps": 300},
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


class BenchError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Measuring


def proc_children():
    """ppid → [pid] over every process on the machine."""
    children = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rindex(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def tree_pss_bytes(root):
    """Total PSS of `root` and every descendant, from /proc/<pid>/smaps_rollup."""
    children = proc_children()
    todo, total = [root], 0
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


class PssSampler(threading.Thread):
    """Samples the total PSS of a process tree every `interval` seconds; keeps the peak."""

    def __init__(self, root, interval=0.1):
        super().__init__(daemon=True)
        self.root, self.interval, self.peak = root, interval, 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, tree_pss_bytes(self.root))
            self.stop.wait(self.interval)


class Runner:
    """Runs commands, keeps their output under the work folder, fails loudly."""

    def __init__(self, work):
        self.work = work
        self.count = 0
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def run(self, cmd, env=None, label="run", sample_memory=False, expect_rc=(0,), timeout=600):
        self.count += 1
        log = self.work / "logs" / f"{self.count:04d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', label)}"
        full_env = dict(os.environ, **(env or {}))
        started = time.perf_counter()
        proc = subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        sampler = None
        if sample_memory:
            sampler = PssSampler(proc.pid)
            sampler.start()
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            # Interrupted or too slow: nothing of ours may outlive the bench.
            kill_group(proc)
            raise
        finally:
            if sampler:
                sampler.stop.set()
                sampler.join()
        wall = time.perf_counter() - started
        kill_group(proc)  # a straggler left in the group (none expected)
        log.with_suffix(".out").write_text(out)
        log.with_suffix(".err").write_text(err)
        log.with_suffix(".cmd").write_text(shell(cmd, env) + "\n")
        if proc.returncode not in expect_rc:
            tail = "\n".join((err or out).strip().splitlines()[-15:])
            raise BenchError(f"`{shell(cmd, env)}` exited with {proc.returncode} (expected {list(expect_rc)}); "
                             f"output in {log}.out/.err:\n{tail}")
        return {"stdout": out, "stderr": err, "wall_s": wall, "peak_pss": sampler.peak if sampler else None,
                "log": str(log)}


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def shell(cmd, env=None):
    prefix = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items())
    words = " ".join(shlex.quote(display_path(c)) for c in cmd)
    return f"{prefix} {words}".strip()


def display_path(c):
    s = str(c)
    root = str(REPO) + "/"
    return s[len(root):] if s.startswith(root) else s


def parse(regex, text, what):
    m = regex.search(text)
    if not m:
        raise BenchError(f"no `{what}` line in the output:\n{text[-2000:]}")
    return m


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def interleave(contenders, rounds, warmup, progress):
    """Runs `contenders` (name → zero-argument function returning a dict of figures) round-robin:
    `warmup` rounds thrown away, then `rounds` kept. Returns name → list of figure dicts."""
    kept = {name: [] for name in contenders}
    total = warmup + rounds
    for r in range(total):
        for name, fn in contenders.items():
            figures = fn()
            tag = "warm-up" if r < warmup else f"round {r - warmup + 1}/{rounds}"
            progress(f"{tag} {name}: " + ", ".join(f"{k} {fmt(v)}" for k, v in figures.items()
                                                   if isinstance(v, (int, float))))
            if r >= warmup:
                kept[name].append(figures)
    return kept


def fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def per_round_ratio(results, a, b, key):
    """Median and min–max over rounds of results[a][i][key] / results[b][i][key]."""
    ratios = [x[key] / y[key] for x, y in zip(results[a], results[b]) if x.get(key) and y.get(key)]
    return stats(ratios)


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

        def bare():
            r = self.runner.run(bare_cmd, env, "harness-bare")
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

        res = interleave({"bare": bare, "harnessed": harnessed}, self.pairs, self.warmup, self.progress)
        ratio = per_round_ratio(res, "harnessed", "bare", "trainer_steps_per_s")
        ratio_h = per_round_ratio(
            {"h": [{"x": x["harness_steps_per_s"]} for x in res["harnessed"]],
             "b": [{"x": x["trainer_steps_per_s"]} for x in res["bare"]]}, "h", "b", "x")
        self.results["harness"] = {"rounds": res, "ratio": ratio, "ratio_harness_clock": ratio_h}
        rows = [
            ("`ups-doctor train` (bare, markers dropped)", stats([x["trainer_steps_per_s"] for x in res["bare"]]),
             None, stats([x["wall_s"] for x in res["bare"]])),
            ("`ups-doctor run` (markers, memory and `/dev/shm` sampling every 250 ms, watchdog)",
             stats([x["trainer_steps_per_s"] for x in res["harnessed"]]),
             stats([x["harness_steps_per_s"] for x in res["harnessed"]]),
             stats([x["wall_s"] for x in res["harnessed"]])),
        ]
        met = ratio["median"] >= 0.98
        self.ratios.append(("1. harness overhead", "steps/s under `run` ÷ bare (trainer clock)",
                            ratio, "≥ 0.98", met))
        text = [
            "## 1. Harness overhead",
            "",
            f"The reference scenario (`{scenario}`, {steps} steps, one rank, {self.threads} intra-op "
            "threads) run bare and under the harness with everything it samples on (markers for every "
            "phase through the pipe, per-process PSS/USS of the rank's tree and `/dev/shm` every 250 ms, "
            "the hang watchdog's 50 ms loop).",
            "",
            "Both sides are measured on the same clock: the trainer's own, over the training loop (first "
            "step's start to the last step's end, start-up excluded), from its `done:` line (bare: stdout; "
            "under `run`: the rank's `rank0.stdout.log`). The harness's own `steps_per_s` "
            "(result.json, from marker arrival times) is shown next to it.",
            "",
            "```sh",
            shell(bare_cmd, env),
            shell(run_cmd, env) + "   # OUT: a fresh folder per round",
            "```",
            "",
            "| | steps/s (trainer clock) | steps/s (harness, result.json) | wall time of the command (s) |",
            "| --- | --- | --- | --- |",
        ]
        for name, s, h, w in rows:
            text.append(f"| {name} | {cell(s)} | {cell(h) if h else '–'} | {cell(w, 2)} |")
        text += ["", f"**Ratio** (under `run` ÷ bare, per round): {cell(ratio, 3)}; "
                 f"on the harness's clock: {cell(ratio_h, 3)}. Goal ≥ 0.98: **{'met' if met else 'not met'}**.", ""]
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
        text = [
            "## 3. Training step vs PyTorch eager (CPU)",
            "",
            "The same operator in PyTorch (`bench/peers/upsmodel.py`, a layer-for-layer port of "
            "`src/trainer/model.rs`: encoder with supernode pooling, windowed self-attention, AdaLN "
            "conditioning on viscosity, perceiver decoder); the bench stops unless its parameter count "
            "equals ups-doctor's (from `optimizer_state_bytes` of a one-step run). The same step: batch "
            "built in the process (timed as data, not compute), forward, MSE, loss read back, backward, "
            "global-norm clipping at 1.0, AdamW with the trainer's warm-up, gradients set to None. "
            "`torch.optim.AdamW` runs its default CPU implementation (per tensor, like ours). Step time = "
            "compute time of the loop ÷ steps, on each trainer's own clock (its `done:` line).",
            "",
            f"Intra-op threads: {self.threads} on both sides (`OMP_NUM_THREADS` and `torch.set_num_threads`). "
            "GPU: no GPU was lent to this run, so there is no GPU figure.",
            "",
        ]
        self.results["step"] = {}
        for label, model, data, batch, steps in self.size["step"]:
            sets = [*model_sets(model), "--set", f"data.samples={data['samples']}", "--set", f"data.grid={data['grid']}",
                    "--set", f"data.timesteps={data['timesteps']}", "--set", f"data.queries={data['queries']}",
                    "--set", f"data.batch_size={batch}"]
            ours_params = self.parameter_count(sets)
            env = {"OMP_NUM_THREADS": str(self.threads)}
            ours_cmd = self.ups("train", "scenarios/train-cpu.json", *sets, "--set", f"train.steps={steps}")
            peer_cmd = self.peer("step.py", "--model", json.dumps(model, separators=(",", ":")),
                                 "--samples", data["samples"], "--grid", data["grid"], "--timesteps", data["timesteps"],
                                 "--queries", data["queries"], "--batch", batch, "--steps", steps,
                                 "--threads", self.threads)
            peer_params = []

            def ours():
                r = self.runner.run(ours_cmd, env, "step-ours")
                m = parse(DONE_RE, r["stdout"], "done:")
                return {"step_ms": float(m["compute_s"]) / int(m["steps"]) * 1e3, "steps_per_s": float(m["rate"])}

            def theirs():
                r = self.runner.run(peer_cmd, env, "step-peer")
                m = parse(DONE_RE, r["stdout"], "done:")
                p = parse(PARAMS_RE, r["stdout"], "parameters:")
                peer_params.append(int(p[1]))
                if int(p[1]) != ours_params:
                    raise BenchError(f"the PyTorch model has {p[1]} parameters, ups-doctor's {ours_params}: "
                                     "bench/peers/upsmodel.py no longer matches src/trainer/model.rs")
                return {"step_ms": float(m["compute_s"]) / int(m["steps"]) * 1e3, "steps_per_s": float(m["rate"])}

            self.progress(f"step: {label}, {ours_params} parameters")
            res = interleave({"ups-doctor": ours, "PyTorch eager": theirs}, self.pairs, self.warmup, self.progress)
            self.results["step"][label] = {"rounds": res, "parameters": ours_params}
            ratio = per_round_ratio(res, "ups-doctor", "PyTorch eager", "step_ms")
            self.ratios.append((f"3. training step, {label}", "step time, ups-doctor ÷ PyTorch eager", ratio,
                                "≤ 1.0", ratio["median"] <= 1.0))
            text += [
                f"### {label}: {ours_params:,} parameters on both sides, batch {batch}, {steps} steps",
                "",
                "```json",
                json.dumps(dict(model=model_full(model), data=dict(data, batch_size=batch)), separators=(", ", ": ")),
                "```",
                "",
                "```sh",
                shell(ours_cmd, env),
                shell(peer_cmd, env),
                "```",
                "",
                "| | step time (ms) | steps/s, whole loop |",
                "| --- | --- | --- |",
                f"| ups-doctor (tch) | {cell(stats([x['step_ms'] for x in res['ups-doctor']]), 2)} | "
                f"{cell(stats([x['steps_per_s'] for x in res['ups-doctor']]))} |",
                f"| PyTorch eager | {cell(stats([x['step_ms'] for x in res['PyTorch eager']]), 2)} | "
                f"{cell(stats([x['steps_per_s'] for x in res['PyTorch eager']]))} |",
                "",
                f"**Ratio** (step time, ups-doctor ÷ PyTorch, per round): {cell(ratio, 3)}. Goal ≤ 1.0: "
                f"**{'met' if ratio['median'] <= 1.0 else 'not met'}**.",
                "",
            ]
        self.sections.append(("step", text))

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
            "implementation (FSDP2, DTensor) whose comparison would say little about ours.",
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
            "`bisect.json`. OFAT only says which single cuts make the failure go away: it neither finds "
            "the smallest failing values (thresholds) nor reduces the rest, and it misses interactions "
            "(cutting either part of a pair makes the failure go away, so both look necessary, but OFAT "
            "never tries removing everything else). Its count is a lower bound on what a hand-made OFAT "
            "that also looked for thresholds would cost. Probes run two at a time (`--jobs 2`); the run "
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
            f"run. Made by `{shell(['bench/run', *sys.argv[1:]])}` in {elapsed / 60:.1f} min "
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
            "test suite; these are measurements. Re-run: `bench/run` (about 15 min on an idle 2-core machine; "
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


def cell(s, digits=None):
    if not s:
        return "–"
    def f(v):
        if digits is not None:
            return f"{v:.{digits}f}"
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])})"


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


def readings(key, bench):
    """What the figures say, including where ups-doctor is behind and why."""
    r = bench.results.get(key)
    if r is None:
        return []
    out = ["**Reading.** "]
    if key == "harness":
        ratio, spread = r["ratio"]["median"], (r["ratio"]["min"], r["ratio"]["max"])
        out[0] += (f"Under the harness the trainer ran at {ratio:.1%} of its bare speed (rounds: "
                   f"{spread[0]:.1%} to {spread[1]:.1%}). ")
        if ratio >= 0.98:
            out[0] += ("The harness costs the trainer nothing beyond noise: the rank's part is about ten small "
                       "marker writes per step into a pipe; sampling and the watchdog run in the harness process. ")
        else:
            out[0] += ("That is below the 0.98 goal. What the harness adds runs beside the trainer on the same "
                       "cores: every 250 ms it reads `/proc/<pid>/smaps_rollup` of the rank's process tree and "
                       "`statvfs` of `/dev/shm`, it wakes every 50 ms, and the rank writes about ten marker lines "
                       "per step into a pipe. When the trainer's intra-op threads occupy every core, each such "
                       "wake-up preempts one of them, and an OpenMP barrier then waits for it. ")
            if spread[1] >= 0.98:
                out[0] += "Some rounds did meet it, so part of the gap is the machine's noise. "
        rh = r["ratio_harness_clock"]["median"]
        out[0] += (f"On the harness's own clock (marker arrival times) the ratio is {rh:.1%}: both clocks span the "
                   "same loop.")
    elif key == "loader":
        med = lambda tag, name, k: stats([x[k] for x in r[tag]["rounds"][name]])["median"]  # noqa: E731
        parts, behind = [], []
        for tag, g in r.items():
            ratio = per_round_ratio(g["rounds"], g["ours"], g["peer"], "samples_per_s")["median"]
            parts.append(f"{tag} {ratio:.2f}×")
            if ratio < 1.0:
                behind.append(tag)
        out[0] += ("Throughput, ups-doctor ÷ PyTorch doing the same vectorised batch work: " + ", ".join(parts) + ". ")
        if behind:
            out[0] += (f"ups-doctor is behind at {', '.join(behind)}: there the work per batch dominates and "
                       "both sides run the same libtorch kernels, so the transport cannot make up for it. ")
        out[0] += (
            "With no workers both run the same kernels in one process and the difference is the interpreter "
            "around them (and the query points: ours are drawn in Rust, the peer sorts random keys with torch). "
            "With workers it is the transport: ups-doctor's workers write each batch into a slot of one "
            "`/dev/shm` ring and send 16 bytes down a pipe, and the trainer copies the batch out once; "
            "PyTorch's workers move every tensor of every batch into a new shared-memory segment and send "
            "its handle through a multiprocessing queue, and the main process maps and unpickles it. "
            "The per-sample dataset most PyTorch code uses pays the interpreter and small-tensor overhead "
            "per sample (every augmentation pass on one row instead of a batch): that is where the largest "
            "gaps are, and it is the idiom's cost, not the DataLoader's. ")
        if "w0" in r and "w4-spawn" in r:
            g4 = r["w4-spawn"]
            p0 = med("w0", r["w0"]["peer"], "peak_pss_mib")
            o0 = med("w0", r["w0"]["ours"], "peak_pss_mib")
            p4 = med("w4-spawn", g4["peer"], "peak_pss_mib")
            o4 = med("w4-spawn", g4["ours"], "peak_pss_mib")
            out[0] += (
                f"Memory: `import torch` alone puts PyTorch's main process at {p0:.0f} MiB PSS against "
                f"{o0:.0f} MiB for ups-doctor's (the full CUDA wheel's libraries are loaded even on CPU; "
                "ups-doctor links only libtorch's CPU library). Each spawned PyTorch worker imports torch again: "
                f"about {(p4 - p0) / 4:.0f} MiB PSS per worker here, against {(o4 - o0) / 4:.0f} MiB for "
                "ups-doctor's spawned workers (the same binary re-executed: its libtorch pages are shared), "
                f"and a first batch after {med('w4-spawn', g4['peer'], 'first_batch_s'):.1f} s against "
                f"{med('w4-spawn', g4['ours'], 'first_batch_s'):.1f} s. ")
            if g4.get("dup"):
                dup = med("w4-spawn", g4["dup"], "peak_pss_mib")
                mem = med("w4-spawn", "ups-doctor, memory cache (each worker regenerates it)", "peak_pss_mib")
                out[0] += (
                    f"A numpy dataset is pickled into every spawned worker ({dup:.0f} MiB against {p4:.0f} MiB "
                    "with tensors, which torch moves to shared memory on its own); ups-doctor's `memory` cache "
                    f"with `spawn` is the same duplication ({mem:.0f} MiB against {o4:.0f} MiB with `shm`, and "
                    "the workers regenerate the data before their first batch), which is why `shm` is the "
                    "cache to use with `spawn`. ")
            out[0] += ("Peak PSS includes data generation in the main process (the solver's temporaries), "
                       "the same on both sides.")
    elif key == "step":
        parts = []
        for label, v in r.items():
            ratio = per_round_ratio(v["rounds"], "ups-doctor", "PyTorch eager", "step_ms")["median"]
            parts.append(f"{label}: {ratio:.2f}")
        out[0] += "Step time, ups-doctor ÷ PyTorch eager: " + "; ".join(parts) + ". "
        out[0] += (
            "Both dispatch the same libtorch kernels; what differs is around them. PyTorch eager pays the "
            "Python interpreter on every op (a few microseconds each, hundreds of ops per step for this model), "
            "which matters most for a small model; tch calls the same ATen ops from Rust. "
            "Our AdamW is written out per tensor in Rust (about ten tensor ops per parameter tensor, "
            "each allocating a temporary), as is PyTorch's default CPU AdamW; and our clipping reads "
            "each gradient's squared norm back to the host, where PyTorch's `clip_grad_norm_` stacks the norms "
            "first. With a wider model the kernels dominate and the two converge; a ratio above 1 there is "
            "our optimizer's extra temporaries and host reads, not the model.")
    elif key == "ddp":
        sc = per_round_ratio(r, "ups-doctor ddp-2", "ups-doctor single", "steps_per_s")["median"]
        sp = per_round_ratio(r, "PyTorch DDP-2 (gloo, torchrun)", "PyTorch single", "steps_per_s")["median"]
        sf = per_round_ratio(r, "ups-doctor fsdp-2", "ups-doctor single", "steps_per_s")["median"]
        out[0] += (f"Two ranks give ups-doctor {sc:.2f}× its single-rank speed with DDP and {sf:.2f}× with FSDP; "
                   f"PyTorch gets {sp:.2f}× with DDP. ")
        out[0] += (
            "Per step, DDP adds one all-reduce of the whole model's gradients (0.5 MB here) over loopback; "
            "our ring sends it in two phases after backward has finished, where PyTorch's Reducer starts "
            "reducing buckets during backward; on this small model the gradient fits one bucket either way, so "
            "overlap gains little. Our FSDP adds an all-gather before and a reduce-scatter after every step, "
            "plus a host read of the global gradient norm, which is why it scales less than DDP on a model this "
            "small. On two cores, two ranks also share the machine with the harness (ups-doctor) or the "
            "torchrun agent (PyTorch).")
    elif key == "detect":
        crash = stats([x["noticed_s"] for x in r["crash"]])["median"]
        rep = stats([x["report_s"] for x in r["crash"]])["median"]
        hang = stats([x["verdict_s"] for x in r["hang"]])["median"]
        limit = r["hang"][0]["limit_s"]
        record = stats([x["crash_record_to_noticed_s"] for x in r["crash"]])["median"]
        out[0] += (
            f"A crash is seen {crash:.2f} s after it happens ({crash - record:.2f} s of it inside the rank: its "
            f"crash handler symbolises the backtrace before re-raising the signal; {record:.3f} s from the "
            f"backtrace's arrival to the harness reaping the rank, within its 50 ms poll), comparable to torchrun's "
            f"0.1 s monitor interval, and the report with the backtrace, the first failure and the collateral "
            f"rank is written {rep:.1f} s after the crash (the collateral rank ends on its own first). "
            f"A hang is declared {hang:.2f} s after the last marker for `hang_after_s` = {limit:g}: late by "
            "at most one poll interval, against NCCL's 10-minute default watchdog.")
    elif key == "bisect":
        rows = list(r.values())
        ladder = sum(x["ladder"]["runs"] for x in rows)
        plain = sum(x["ddmin"]["runs"] for x in rows)
        ofat = sum(x["ladder"]["confirm"] + len(x["ladder"]["components"]) for x in rows)
        wl = sum(x["ladder"]["wall_s"] for x in rows)
        wp = sum(x["ddmin"]["wall_s"] for x in rows)
        out[0] += (
            f"Over these cases bisect used {ladder} runs with the ladder, {plain} without it, against {ofat} for "
            f"OFAT, and took {wl:.0f} s with the ladder against {wp:.0f} s without. Delta debugging finds a "
            "single cause among n components in about 2·log₂ n runs where OFAT spends n; cases with thresholds "
            "cost bisect more runs (halving each numeric component that must stay), which OFAT would not have "
            "found at all. The ladder's saving is mostly in wall time rather than run count: its big cuts are "
            "one run each, and once DDP and the workers are cut, every later probe is a single-rank run "
            "without workers, which starts and ends faster.")
    return out + [""]


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
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")
    args.work = args.work or str(REPO / "reports" / "runs" / f"bench-{stamp}")
    bench = Bench(args)
    bench.progress(f"bench: {', '.join(order)}; {bench.pairs} rounds after a warm-up; raw output in "
                   f"{display_path(bench.work)}")
    machine = machine_facts(bench)
    try:
        for name in order:
            bench.progress(f"== {name}")
            getattr(bench, name)()
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    finally:
        (bench.work / "results.json").write_text(json.dumps(bench.results, indent=1, default=str))
    machine["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    elapsed = time.perf_counter() - bench.started
    bench.write(machine, order, elapsed)
    bench.progress(f"wrote {display_path(Path(args.out))} ({elapsed / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
