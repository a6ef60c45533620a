"""What the figures of bench/bench.py say, comparison by comparison, in words computed from the
figures themselves (so that a re-run on another machine reads true)."""

from measure import per_round_ratio, stats


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
        if ratio >= 0.99:
            out[0] += ("The harness costs the trainer nothing beyond noise: the rank's part is about ten small "
                       "stamped marker writes per step into a pipe, which the harness reads at most ten times a "
                       "second; sampling (RSS every 250 ms, `smaps_rollup` once a second or when RSS grows) "
                       "and the supervisor run in the harness process. ")
        else:
            out[0] += ("That is below the 0.99 goal. What the harness adds runs beside the trainer on the same "
                       "cores: its marker reader wakes at most ten times a second to read the rank's marker "
                       "lines (about ten per step), and a sampling thread at nice 10 reads the RSS of the "
                       "rank's process tree and `statvfs` of `/dev/shm` every 250 ms and `smaps_rollup` once a "
                       "second or when RSS grows; the supervisor itself sleeps until an exit or a deadline. When the trainer's intra-op threads occupy every core, each such wake-up "
                       "preempts one of them, and an OpenMP barrier then waits for it. ")
            if spread[1] >= 0.99:
                out[0] += "Some rounds did meet it, so part of the gap is the machine's noise. "
            rp = r["ratio_piped"]["median"]
            if rp >= 1.0:
                out[0] += (f"The rank's own share, markers into a pipe that another process drains, costs nothing "
                           f"measurable ({rp:.1%} of bare), so the gap is the harness's reading and sampling "
                           "beside the trainer. ")
            else:
                share = "most" if (1 - rp) > (1 - ratio) / 2 else "the smaller part"
                out[0] += (f"The rank's own share, markers into a pipe that another process drains, is {rp:.1%} of "
                           f"bare: {share} of the gap; the rest is the harness's reading and sampling beside the "
                           "trainer. ")
        rh = r["ratio_harness_clock"]["median"]
        out[0] += (f"On the harness's own clock (the times the rank stamped on its markers) the ratio is "
                   f"{rh:.1%}: both clocks span the same loop.")
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
            imp = bench.results.get("loader_import_torch_pss_mib") or {"median": float("nan")}
            out[0] += (
                f"Memory: with no workers PyTorch's process peaks at {p0:.0f} MiB PSS against {o0:.0f} MiB for "
                f"ups-doctor's, for the same data; `import torch` alone is {imp['median']:.0f} MiB (the full "
                "wheel initialises its CUDA libraries even on CPU; ups-doctor links libtorch's CPU library and "
                "finds no CUDA library to load here). Each spawned PyTorch worker imports torch again: "
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
        parts, behind, bound = [], [], []
        for label, v in r.items():
            ratio = per_round_ratio(v["rounds"], "ups-doctor", "PyTorch eager", "step_ms")["median"]
            part = f"{label}: {ratio:.2f}"
            if "ups-doctor baseline" in v["rounds"]:
                before = per_round_ratio(v["rounds"], "ups-doctor baseline", "PyTorch eager", "step_ms")["median"]
                part += f" ({bench.args.baseline_label}: {before:.2f})"
            parts.append(part)
            if ratio > 0.9:
                behind.append(label)
            eager = stats([x["step_ms"] for x in v["rounds"]["PyTorch eager"]])["median"]
            bound.append(f"{label} {eager * 1e3 / v['ops']:.0f} µs an op, {eager * 1e3 / v['ops'] / v['empty_op_us']:.0f}× "
                         "an empty one")
        out[0] += "Step time, ups-doctor ÷ PyTorch eager: " + "; ".join(parts) + ". "
        out[0] += (
            "Both run the same libtorch kernels for the model; what differs is around them. PyTorch eager pays "
            "the Python interpreter and its dispatch on every op, which weighs most where ops are short; tch calls "
            "the same ATen ops from Rust. How long PyTorch's ops are, on average: " + "; ".join(bound) + ": the "
            "shorter, the more of the step is dispatch (launch-bound); the longer, the more it is kernels "
            "(compute-bound), where the two converge. The optimizers differ: PyTorch's default CPU AdamW loops "
            "over the parameters (about nine tensor ops each); ups-doctor's is one fused kernel call over all "
            "of them (`_fused_adamw_`), which reads each parameter, gradient and moment once. ")
        if behind:
            out[0] += (
                f"The 0.9 goal is not met on {', '.join(behind)}. There forward and backward, the same kernels on "
                "both sides, are nearly the whole step, so what ups-doctor saves around them (dispatch, the "
                "optimizer's passes over memory) is a small part of it; the rest would have to come from the "
                "kernels themselves.")
    elif key == "ddp":
        sc = per_round_ratio(r, "ups-doctor ddp-2", "ups-doctor single", "steps_per_s")["median"]
        sp = per_round_ratio(r, "PyTorch DDP-2 (gloo, torchrun)", "PyTorch single", "steps_per_s")["median"]
        sf = per_round_ratio(r, "ups-doctor fsdp-2", "ups-doctor single", "steps_per_s")["median"]
        vs = per_round_ratio(r, "ups-doctor ddp-2", "PyTorch DDP-2 (gloo, torchrun)", "steps_per_s")["median"]
        out[0] += (f"Two ranks give ups-doctor {sc:.2f}× its single-rank speed with DDP and {sf:.2f}× with FSDP; "
                   f"PyTorch gets {sp:.2f}× with DDP; ups-doctor's DDP runs at {vs:.2f}× PyTorch's. ")
        if vs > 1.1:
            out[0] += ("Why PyTorch's DDP step is slower than ours here was not profiled; what it does beyond a "
                       "single rank is DDP's per-parameter autograd hooks, copying gradients into and out of its "
                       "bucket, and Gloo's all-reduce (both sides also all-reduce the loss for logging). ")
        elif vs < 0.9:
            out[0] += ("ups-doctor's DDP is behind PyTorch's here: its all-reduce starts only after backward and "
                       "runs over its own TCP ring, where Gloo's is tuned and DDP can start during backward. ")
        if max(sc, sp) < 1.3:
            out[0] += (
                "Neither scales well here: each rank computes half the batch in a few milliseconds, and the "
                "step then waits for a gradient exchange over loopback whose latency does not shrink with the "
                "batch; on two cores, the two ranks also share them with everything else on the machine (the "
                "harness, torchrun's agent, other processes), so one busy core stalls both ranks at every "
                "collective. ")
        out[0] += (
            "Per step, ups-doctor's DDP all-reduces the whole model's gradients (0.5 MB) in one bucket after "
            "backward, over its TCP ring; PyTorch's Reducer can start during backward, but with a model this "
            "small its gradients fill one bucket too, so there is little to overlap. ")
        if sf < sc:
            out[0] += ("FSDP exchanges more per step (an all-gather of the parameters before, a reduce-scatter of "
                       "the gradients after, and the global gradient norm), so it scales less than DDP.")
        else:
            out[0] += ("FSDP exchanges more per step (an all-gather before, a reduce-scatter after) but each "
                       "rank updates only half of the optimizer state, which on a model this small evens out "
                       "with DDP.")
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
        out[0] += (
            f"Over these cases bisect used {ladder} runs with the ladder and {plain} without it, against {ofat} "
            "for OFAT, and every bisect ended on a 1-minimal configuration with its boundary, which OFAT does not "
            "give. Delta debugging finds a single cause among n components in about 2·log₂ n runs where OFAT "
            "spends n; numeric thresholds cost bisect a few more runs (halving each numeric component that must "
            "stay), and OFAT would not have found them. ")
        if ladder == plain:
            out[0] += (
                "The ladder saves no runs on these cases: its big cuts cost one run each, and delta debugging "
                "over two or three more components costs about as much (it cuts them together with everything "
                "else in its first probe). What it buys is order: the big, expensive dimensions (ranks, "
                "workers) go first, so the report says at once whether the failure needs DDP or workers, and "
                "every later probe runs as one rank without workers. The wall times above are too noisy on a "
                "shared machine to show a difference.")
        elif ladder < plain:
            out[0] += f"The ladder saved {plain - ladder} runs in total."
        else:
            out[0] += (f"The ladder cost {ladder - plain} more runs in total than plain delta debugging: its big "
                       "cuts are tried one at a time, where delta debugging tries them together.")
    return out + [""]
