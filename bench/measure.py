"""Running commands and measuring them for bench/bench.py: process-tree PSS sampling, interleaved
rounds, medians and per-round ratios, and how commands and figures are shown."""

import os
import re
import shlex
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


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


def cell(s, digits=None):
    if not s:
        return "–"
    def f(v):
        if digits is not None:
            return f"{v:.{digits}f}"
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])})"
