//! CUDA and NCCL errors in their libraries' own words: a device-side assert, an illegal memory
//! access, a device that does not exist, NCCL's system and network errors. Named only from the
//! failing rank's own error line. Their texts are the libraries' (quoted in the tests with where
//! each came from).

use super::{Finding, Pattern, erring};
use crate::diagnose::evidence::{Evidence, RankEvidence};

pub const CUDA_DEVICE_ASSERT: Pattern = Pattern {
    id: "cuda-device-assert",
    title: "CUDA device-side assert",
    matches: "the rank's error is `CUDA error: device-side assert triggered` (`torch.AcceleratorError` or \
              `RuntimeError`); the kernel's own `Assertion `…` failed.` line, where the rank printed one, is quoted",
    explanation: "A CUDA kernel checked something and it failed: most often an index out of range (a class label \
                  at or above the number of classes in a loss, an embedding index past the vocabulary). CUDA \
                  reports it at a later call, so the Python stack usually points at the wrong line, and the \
                  process's CUDA context is unusable afterwards.",
    next_step: "Run again with `CUDA_LAUNCH_BLOCKING=1` (the stack then points at the kernel that failed) or on the \
                CPU, where the same index error is raised at once with its value; check labels and indices against \
                their ranges (`assert labels.max() < num_classes`).",
    reference: "https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-semantics",
};

pub const CUDA_ILLEGAL_ACCESS: Pattern = Pattern {
    id: "cuda-illegal-memory-access",
    title: "CUDA illegal memory access",
    matches: "the rank's error is `CUDA error: an illegal memory access was encountered`",
    explanation: "A CUDA kernel read or wrote memory it did not own: a bug in a custom or third-party kernel (an \
                  extension, a fused op), memory freed while a kernel still used it (a tensor kept alive only on \
                  another stream), or a hardware fault (then the kernel log has an `NVRM: Xid` line). CUDA reports \
                  it at a later call, so the Python stack may point at the wrong line.",
    next_step: "Run again with `CUDA_LAUNCH_BLOCKING=1` to find the kernel; run the rank under `compute-sanitizer`; \
                if it moves between GPUs or nodes, look for `NVRM: Xid` in `dmesg` and have the node checked.",
    reference: "https://docs.nvidia.com/compute-sanitizer/ComputeSanitizer/index.html",
};

pub const INVALID_DEVICE_ORDINAL: Pattern = Pattern {
    id: "invalid-device-ordinal",
    title: "A GPU that does not exist",
    matches: "the rank's error is `CUDA error: invalid device ordinal`",
    explanation: "The rank asked for a GPU index the process cannot see: more ranks per node than GPUs (`--nproc_per_node` \
                  above the GPU count), `cuda:LOCAL_RANK` under a `CUDA_VISIBLE_DEVICES` that leaves each process one \
                  GPU (then every rank's GPU is `cuda:0`), or a global `RANK` used where the local one was meant.",
    next_step: "Start at most as many ranks per node as it has GPUs, and pick the device with `LOCAL_RANK` \
                (`torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))`); where the scheduler sets \
                `CUDA_VISIBLE_DEVICES` per task, use `cuda:0`.",
    reference: "https://docs.pytorch.org/docs/stable/elastic/run.html",
};

pub const NCCL_ERROR: Pattern = Pattern {
    id: "nccl-error",
    title: "NCCL error",
    matches: "the rank's error is PyTorch's `NCCL error in: FILE:LINE, unhandled system error`, `unhandled cuda \
              error` or `invalid usage` (`torch.distributed.DistBackendError`), with NCCL's `ncclSystemError: …` and \
              `Last error:` lines where printed; NCCL's `remote process exited or there was a network error` is \
              a lost peer, collateral of the rank that ended first",
    explanation: "NCCL itself failed on this rank: a system call or socket (`unhandled system error`: the network \
                  interface it picked is unreachable, a firewall, too little `/dev/shm` for its buffers), a CUDA \
                  call (`unhandled cuda error`), or calls that do not fit (`invalid usage`: two ranks on one GPU, \
                  mismatched collectives).",
    next_step: "Run again with `NCCL_DEBUG=INFO` (and `NCCL_DEBUG_SUBSYS=INIT,NET`) to see the interface and \
                transport NCCL chose; pin the interface with `NCCL_SOCKET_IFNAME`; on a machine without \
                InfiniBand set `NCCL_IB_DISABLE=1`; give the container a larger `/dev/shm` (`--shm-size`).",
    reference: "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html",
};

pub const GPU_XID: Pattern = Pattern {
    id: "gpu-xid",
    title: "A GPU fault the NVIDIA driver reported (Xid)",
    matches: "while the run ran, the NVIDIA driver wrote `NVRM: Xid (PCI:…): CODE, pid=PID, …` to the kernel log \
              (read from `/dev/kmsg`) naming a process of one of its ranks; a program that only prints such a \
              line, and an Xid of another job's process, are not it",
    explanation: "The GPU or its driver failed under that rank: a hardware fault (79: the GPU fell off the bus; \
                  48, 63, 64, 94, 95: ECC errors and row remapping; 74: NVLink; 119, 120: the GPU's system \
                  processor) or a fault of a kernel the program ran (13: a graphics engine exception, 31: a GPU \
                  memory page fault, 43: the GPU stopped processing). What the ranks did after it (a CUDA error, \
                  a hang in a collective, a crash) follows from it.",
    next_step: "For a hardware Xid: take the node out of the pool and have its GPU checked (`nvidia-smi -q`, the \
                Xid catalogue's action for the code: a reset, a reboot, a field diagnostic); run again elsewhere. \
                For 13, 31 or 43: a kernel read or wrote out of bounds: run again with `CUDA_LAUNCH_BLOCKING=1` \
                and under `compute-sanitizer`.",
    reference: "https://docs.nvidia.com/deploy/xid-errors/",
};

/// What an Xid code is, in a few words; `None` for a code not described here.
fn xid_meaning(code: u32) -> Option<(&'static str, bool)> {
    // (what, a hardware fault)
    Some(match code {
        13 => ("a graphics engine exception in a kernel the program ran", false),
        31 => ("a GPU memory page fault: a kernel accessed an address it did not own", false),
        43 => ("the GPU stopped processing the program's work", false),
        48 => ("an uncorrectable double-bit ECC error", true),
        63 | 64 => ("an ECC page retirement or row remapping event", true),
        74 => ("an NVLink error", true),
        79 => ("the GPU has fallen off the bus", true),
        94 => ("a contained ECC error", true),
        95 => ("an uncontained ECC error", true),
        119 | 120 => ("an error of the GPU's system processor (GSP)", true),
        _ => return None,
    })
}

/// A failed run whose rank's process the NVIDIA driver named in an Xid: that rank, and the fault.
pub fn xid(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let x = ev.xids.iter().find(|x| x.rank.is_some())?;
    let rank = x.rank?;
    let mut f = Finding::of(&GPU_XID);
    f.culprit = Some(rank);
    let (what, hardware) = xid_meaning(x.code).unwrap_or(("a fault NVIDIA's Xid catalogue describes", true));
    let pid = x.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
    f.headline = Some(format!(
        "Rank {rank}'s GPU failed: the NVIDIA driver reported Xid {} ({what}) for its process{pid} at {:.1} s.",
        x.code, x.at_s
    ));
    f.evidence.push(format!("kernel log (`/dev/kmsg`) at {:.1} s: `{}`", x.at_s, x.line.trim()));
    if !hardware {
        f.next_step = Some(
            "A kernel the program ran read or wrote out of bounds: run again with `CUDA_LAUNCH_BLOCKING=1` and under \
             `compute-sanitizer` to find it; if it follows the GPU rather than the code, have the node checked."
                .to_string(),
        );
    }
    Some(f)
}

fn found(pattern: &'static Pattern, r: &RankEvidence, what: &str) -> Finding {
    let mut f = Finding::of(pattern);
    f.culprit = Some(r.rank());
    f.headline = Some(format!("Rank {} {what}.", r.rank()));
    f
}

pub fn device_assert(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let r = erring(ev, first, &["CUDA error: device-side assert triggered"])?;
    let mut f = found(
        &CUDA_DEVICE_ASSERT,
        r,
        "failed a CUDA device-side assert (the Python stack may point at a later call)",
    );
    // The kernel's own line: `…/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0],
    // thread: [0,0,0] Assertion `t >= 0 && t < n_classes` failed.`
    if let Some(line) = r.text.iter().find(|l| l.contains("Assertion `") && l.contains("` failed")) {
        f.evidence.push(format!("the kernel's assertion: {}", line.trim()));
    }
    Some(f)
}

pub fn illegal_access(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let r = erring(ev, first, &["CUDA error: an illegal memory access was encountered"])?;
    Some(found(
        &CUDA_ILLEGAL_ACCESS,
        r,
        "hit a CUDA illegal memory access (the Python stack may point at a later call)",
    ))
}

pub fn invalid_ordinal(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let r = erring(ev, first, &["CUDA error: invalid device ordinal"])?;
    let mut f = found(&INVALID_DEVICE_ORDINAL, r, "asked for a GPU that this process cannot see");
    let visible = r.result.device.as_deref().map(|d| format!(" (its device: {d})")).unwrap_or_default();
    let world = ev.scenario.launch.world_size;
    f.evidence
        .push(format!("rank {} of {world} ranks{visible}: CUDA error: invalid device ordinal", r.rank()));
    Some(f)
}

pub fn nccl_error(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let r = erring(
        ev,
        first,
        &["unhandled system error", "unhandled cuda error", "invalid usage (run with NCCL_DEBUG"],
    )?;
    let key = r.key.as_ref()?.text.as_str();
    if !key.contains("NCCL") {
        return None;
    }
    let which = ["unhandled system error", "unhandled cuda error", "invalid usage"]
        .into_iter()
        .find(|w| key.contains(w))
        .unwrap_or("an error");
    let mut f = found(&NCCL_ERROR, r, &format!("failed in NCCL: {which}"));
    for label in ["ncclSystemError:", "ncclUnhandledCudaError:", "ncclInvalidUsage:", "Last error:"] {
        if let Some(i) = r.text.iter().position(|l| l.contains(label)) {
            let mut line = r.text[i].trim().to_string();
            // `Last error:` says it on the next line.
            if line.ends_with("Last error:")
                && let Some(next) = r.text.get(i + 1)
            {
                line = format!("{line} {}", next.trim());
            }
            f.evidence.push(line);
        }
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{failed, judged};

    /// PyTorch's `c10/cuda/CUDAException.cpp` message around cudart's error string, as torch 2.11
    /// raises it (`torch.AcceleratorError`): its pieces are verbatim in the installed
    /// `torch/lib/libc10_cuda.so` (`CUDA error: `, `CUDA kernel errors might be asynchronously
    /// reported at some other API call, so the stacktrace below might be incorrect.`, `For
    /// debugging consider passing CUDA_LAUNCH_BLOCKING=1`, ``Compile with `TORCH_USE_CUDA_DSA` to
    /// enable device-side assertions.``) and the error strings in
    /// `nvidia/cu13/lib/libcudart.so.13` (nvidia-cuda-runtime 13.0.96: `device-side assert
    /// triggered`, `an illegal memory access was encountered`, `invalid device ordinal`). The
    /// kernel's assertion line is `aten/src/ATen/native/cuda/Loss.cu`'s, as CUDA prints device
    /// asserts. Not recordings of a GPU: none was lent yet.
    fn cuda(error: &str) -> String {
        format!(
            "Traceback (most recent call last):\n  File \"/work/train.py\", line 40, in <module>\n    loss = \
             criterion(model(x), y)\ntorch.AcceleratorError: CUDA error: {error}\nCUDA kernel errors might be \
             asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor \
             debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable \
             device-side assertions.\n"
        )
    }

    const ASSERT_LINE: &str = "/pytorch/aten/src/ATen/native/cuda/Loss.cu:250: \
                               nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [3,0,0] Assertion `t \
                               >= 0 && t < n_classes` failed.";

    #[test]
    fn cuda_errors_are_named_from_the_ranks_own_error_with_the_kernels_assertion() {
        let lost = "Traceback (most recent call last):\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] \
                    Connection closed by peer [127.0.0.1]:4000";
        let assert = format!("{ASSERT_LINE}\n{}", cuda("device-side assert triggered"));
        let j = judged(&[failed(0, 5.3, lost), failed(1, 5.0, &assert)]);
        assert_eq!(j.verdict.pattern.as_deref(), Some("cuda-device-assert"), "{:#?}", j.verdict);
        assert_eq!(j.first_failure, Some(1));
        assert!(j.verdict.evidence.iter().any(|e| e.contains("Assertion `t >= 0 && t < n_classes` failed.")));
        assert!(j.verdict.next_step.unwrap().contains("CUDA_LAUNCH_BLOCKING=1"));
        for (error, pattern) in [
            ("an illegal memory access was encountered", "cuda-illegal-memory-access"),
            ("invalid device ordinal", "invalid-device-ordinal"),
        ] {
            let j = judged(&[failed(0, 2.0, &cuda(error))]);
            assert_eq!(j.verdict.pattern.as_deref(), Some(pattern), "{error}: {:#?}", j.verdict);
        }
        // The assert's text in a log line (a warning of a retried batch) before another error is
        // not the rank's error.
        let printed = "batch 7 skipped: CUDA error: device-side assert triggered (retrying on the CPU)\n\
                       Traceback (most recent call last):\n  File \"/work/train.py\", line 52, in <module>\n\
                       ValueError: bad label";
        let j = judged(&[failed(0, 2.0, printed)]);
        assert_ne!(j.verdict.pattern.as_deref(), Some("cuda-device-assert"), "{:#?}", j.verdict);
    }

    /// ProcessGroupNCCL's `NCCL error in: FILE:LINE, MESSAGE, NCCL version V` (its pieces are in the
    /// installed `torch/lib/libtorch_cuda.so`: `NCCL error in: `, `, NCCL version `, `ncclSystemError:
    /// System call (e.g. socket, malloc) or external library call failed or device error. `,
    /// `ncclRemoteError: A call failed possibly due to a network error or a remote process exiting
    /// prematurely.`) around NCCL's own strings (`nvidia/nccl/lib/libnccl.so.2`, nvidia-nccl-cu13
    /// 2.28.9: `unhandled system error (run with NCCL_DEBUG=INFO for details)`, `remote process
    /// exited or there was a network error`). The `Last error:` line is NCCL's socket message form.
    fn nccl(message: &str, detail: &str) -> String {
        format!(
            "Traceback (most recent call last):\n  File \"/work/train.py\", line 12, in <module>\n    \
             dist.barrier()\ntorch.distributed.DistBackendError: NCCL error in: \
             /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, {message}, NCCL version 2.28.9\n{detail}"
        )
    }

    #[test]
    fn an_nccl_system_error_is_named_and_a_remote_error_is_a_lost_peer() {
        let system = nccl(
            "unhandled system error (run with NCCL_DEBUG=INFO for details)",
            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n\
             Last error:\nsocketStartConnect: Connect to 10.0.0.2<43210> failed : Software caused connection abort",
        );
        let remote = nccl(
            "remote process exited or there was a network error",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        );
        // Rank 1's remote error came first by the clock; it only lost its peer.
        let j = judged(&[failed(0, 5.1, &system), failed(1, 5.0, &remote)]);
        assert_eq!(j.verdict.pattern.as_deref(), Some("nccl-error"), "{:#?}", j.verdict);
        assert_eq!(j.first_failure, Some(0), "{}", j.verdict.headline);
        assert!(
            j.verdict.headline.starts_with("Rank 0 failed in NCCL: unhandled system error."),
            "{}",
            j.verdict.headline
        );
        let ev = j.verdict.evidence.join("\n");
        assert!(ev.contains("Last error: socketStartConnect: Connect to 10.0.0.2<43210> failed"), "{ev}");
        assert!(j.verdict.next_step.unwrap().contains("NCCL_SOCKET_IFNAME"));
    }
}
