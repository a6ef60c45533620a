"""A fault injected from outside a training program, for tests/attach.rs: with this folder on
PYTHONPATH, Python imports this file at start-up in every process. In the rank whose `RANK` is
`ATTACH_STALL_RANK`, a global optimizer step pre-hook stalls (sleeps, outside any collective) from
its `ATTACH_STALL_STEP`-th step on, after writing its pid to `ATTACH_STALL_FILE` (whole: written
beside it, then renamed). The rank whose `RANK` is `ATTACH_EXIT_RANK` exits with status 0 at once,
before its program runs (so before the rendezvous: the others wait for it there). Every other
process is left alone."""

import os

if os.environ.get("RANK") is not None and os.environ.get("RANK") == os.environ.get("ATTACH_EXIT_RANK"):
    os._exit(0)

if os.environ.get("RANK") is not None and os.environ.get("RANK") == os.environ.get("ATTACH_STALL_RANK"):
    import time

    # `torch.optim` does not keep its `optimizer` submodule as an attribute: import the name.
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    _steps = [0]

    def stall_in_optimizer_hook(optimizer, args, kwargs):
        _steps[0] += 1
        if _steps[0] > int(os.environ.get("ATTACH_STALL_STEP", "3")):
            # Written beside it and renamed into place: the test waits for the file to exist and
            # then reads the pid, so it must never see the file before the pid is in it.
            path = os.environ["ATTACH_STALL_FILE"]
            with open(path + ".partial", "w") as f:
                f.write(str(os.getpid()))
            os.replace(path + ".partial", path)
            while True:
                time.sleep(3600)

    register_optimizer_step_pre_hook(stall_in_optimizer_hook)
