//! A rank that ran out of something its program asked for, in the library's own words: GPU
//! memory (PyTorch's CUDA caching allocator), a checkpoint that does not fit the model
//! (`load_state_dict`), file descriptors (PyTorch's `file_descriptor` sharing strategy). Each is
//! named only from the rank's own error (its key line), never from a line it merely printed.

use super::{Finding, Pattern, erring};
use crate::diagnose::evidence::{Evidence, RankEvidence};

pub const CUDA_OOM: Pattern = Pattern {
    id: "cuda-oom",
    title: "CUDA out of memory",
    matches: "the rank's error is PyTorch's `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate X. \
              GPU N has a total capacity of C of which F is free. … Of the allocated memory A is allocated by \
              PyTorch, and R is reserved by PyTorch but unallocated.` (the CUDA caching allocator's message, \
              `c10/cuda/CUDACachingAllocator.cpp`); its figures are read from it",
    explanation: "The rank asked PyTorch's CUDA allocator for more GPU memory than the GPU had free. Memory \
                  PyTorch reserved but did not use (fragmentation) counts against the GPU like memory in use; \
                  so does every other process on the GPU (another job, a zombie of an earlier run, DataLoader \
                  workers that touched CUDA).",
    next_step: "Make the rank need less: a smaller per-rank batch (keep the global batch with gradient \
                accumulation), activation checkpointing, bf16 autocast, or sharding (FSDP). Where the error says \
                much is reserved but unallocated, set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`. Check \
                with `nvidia-smi` that no other process holds memory on that GPU.",
    reference: "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf",
};

pub const STATE_DICT_MISMATCH: Pattern = Pattern {
    id: "state-dict-mismatch",
    title: "Checkpoint does not fit the model",
    matches: "the rank's error is `RuntimeError: Error(s) in loading state_dict for M:` with PyTorch's lines \
              `Missing key(s) in state_dict: …`, `Unexpected key(s) in state_dict: …` and `size mismatch for K: \
              copying a param with shape … from checkpoint, the shape in current model is …`",
    explanation: "`load_state_dict` (strict, the default) refuses a checkpoint whose parameter names or shapes \
                  differ from the model's: a checkpoint of another model or configuration, of the same model \
                  wrapped differently (DDP's `module.` prefix, `torch.compile`'s `_orig_mod.`), or saved with \
                  another world size (sharded state).",
    next_step: "Load the checkpoint into the model it was saved from: the same configuration, unwrapped the same \
                way (save `model.module.state_dict()` under DDP, or strip the prefix the key lines show before \
                loading). Use `strict=False` only when the missing and unexpected keys are known to be expected.",
    reference: "https://docs.pytorch.org/tutorials/beginner/saving_loading_models.html",
};

pub const TOO_MANY_OPEN_FILES: Pattern = Pattern {
    id: "too-many-open-files",
    title: "Too many open files (DataLoader tensor sharing)",
    matches: "the rank's error is `RuntimeError: received 0 items of ancdata` (`multiprocessing`'s \
              `recvfds`), PyTorch's `Too many open files. Communication with the workers is no longer \
              possible`, or `OSError: [Errno 24] Too many open files`",
    explanation: "DataLoader workers hand each tensor to the rank as a file descriptor (PyTorch's default \
                  `file_descriptor` sharing strategy); a rank that holds many batches' tensors at once (a \
                  batch of many small tensors, batches kept in a list) needs one descriptor each, and the \
                  process's open-file limit (`ulimit -n`) runs out: the descriptor passed over the socket \
                  never arrives.",
    next_step: "Raise the limit (`ulimit -n 65536` in the job's shell, or the container's `nofile` limit), or \
                call `torch.multiprocessing.set_sharing_strategy('file_system')` at the start of the program; \
                keep fewer batches alive (`.detach().clone()` or `.item()` what you keep).",
    reference: "https://docs.pytorch.org/docs/stable/multiprocessing.html#sharing-strategies",
};

/// The figure after `label` in the allocator's message, up to `until`: `20.00 GiB`.
fn figure<'t>(text: &'t str, label: &str, until: &str) -> Option<&'t str> {
    let rest = &text[text.find(label)? + label.len()..];
    Some(rest[..rest.find(until)?].trim())
}

/// A size as the allocator writes it (`230.12 MiB`, `1.96 GiB`, `512 bytes`), in bytes.
fn bytes_of(size: &str) -> Option<f64> {
    let (n, unit) = size.split_once(' ')?;
    let n: f64 = n.parse().ok()?;
    let scale = match unit {
        "bytes" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n * scale)
}

pub fn cuda_oom(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let r = erring(ev, first, &["CUDA out of memory. Tried to allocate"])?;
    let text = r.key.as_ref()?.text.as_str();
    let asked = figure(text, "Tried to allocate ", ". GPU");
    let gpu = figure(text, ". GPU ", " has a total capacity");
    let capacity = figure(text, "has a total capacity of ", " of which");
    let free = figure(text, " of which ", " is free");
    let allocated = figure(text, "Of the allocated memory ", " is allocated by PyTorch");
    let reserved = figure(text, "and ", " is reserved by PyTorch but unallocated")
        .map(|s| s.rsplit("and ").next().unwrap_or(s).trim());
    let others: Vec<String> = text
        .split("Process ")
        .skip(1)
        .filter_map(|p| {
            let (pid, rest) = p.split_once(" has ")?;
            let used = rest.split(" memory in use").next()?;
            pid.chars().all(|c| c.is_ascii_digit()).then(|| format!("process {pid} held {used}"))
        })
        .collect();
    let mut f = Finding::of(&CUDA_OOM);
    f.culprit = Some(r.rank());
    let on = gpu.map(|g| format!(" on GPU {g}")).unwrap_or_default();
    let room = match (capacity, free) {
        (Some(c), Some(fr)) => format!(" ({c} in all, {fr} free)"),
        _ => String::new(),
    };
    f.headline = Some(format!(
        "Rank {} ran out of GPU memory{on}: it asked PyTorch's allocator for {}{room}.",
        r.rank(),
        asked.unwrap_or("more")
    ));
    let mut line = format!("rank {}: CUDA out of memory{on}", r.rank());
    if let Some(a) = asked {
        line += &format!(", asked for {a}");
    }
    if let Some(a) = allocated {
        line += &format!("; PyTorch had {a} allocated");
    }
    if let Some(res) = reserved {
        line += &format!(" and {res} reserved but unallocated");
    }
    f.evidence.push(line);
    if !others.is_empty() {
        f.evidence
            .push(format!("other processes on the GPU, in the allocator's words: {}", others.join(", ")));
    }
    // Fragmentation: what PyTorch holds unused would have served the request.
    let fragmented = match (reserved.and_then(bytes_of), asked.and_then(bytes_of)) {
        (Some(res), Some(ask)) => res >= ask || res >= 1024.0 * 1024.0 * 1024.0,
        _ => false,
    };
    if fragmented {
        f.next_step = Some(format!(
            "PyTorch held {} reserved but unallocated, {}: set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` \
             (fragmentation). If that is not enough: a smaller per-rank batch, activation checkpointing, bf16 \
             autocast.",
            reserved.unwrap_or("memory"),
            if reserved.and_then(bytes_of).zip(asked.and_then(bytes_of)).is_some_and(|(r, a)| r >= a) {
                "more than the request"
            } else {
                "over 1 GiB"
            }
        ));
    }
    Some(f)
}

pub fn state_dict_mismatch(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let r = erring(ev, first, &["Error(s) in loading state_dict"])?;
    let mut f = Finding::of(&STATE_DICT_MISMATCH);
    f.culprit = Some(r.rank());
    let keys = |label: &str| -> Vec<String> {
        r.text
            .iter()
            .find_map(|l| l.split_once(label).map(|(_, rest)| rest))
            // PyTorch quotes each name: `"0.weight", "0.bias". ` (a quoted error line may go on
            // with where it was raised).
            .map(|rest| rest.split('"').skip(1).step_by(2).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let missing = keys("Missing key(s) in state_dict:");
    let unexpected = keys("Unexpected key(s) in state_dict:");
    let sizes: Vec<&str> =
        r.text.iter().filter(|l| l.contains("size mismatch for ")).map(|l| l.trim()).collect();
    let few = |k: &[String]| {
        let shown: Vec<&str> = k.iter().take(3).map(String::as_str).collect();
        let more = if k.len() > 3 { format!(" and {} more", k.len() - 3) } else { String::new() };
        format!("{} ({}{more})", k.len(), shown.join(", "))
    };
    if !missing.is_empty() {
        f.evidence.push(format!("missing from the checkpoint: {}", few(&missing)));
    }
    if !unexpected.is_empty() {
        f.evidence.push(format!("in the checkpoint but not in the model: {}", few(&unexpected)));
    }
    if let Some(s) = sizes.first() {
        let more = if sizes.len() > 1 { format!(" (and {} more)", sizes.len() - 1) } else { String::new() };
        f.evidence.push(format!("{s}{more}"));
    }
    // The same names under a prefix: the model was wrapped one way when saved and another now.
    let prefixed = |from: &[String], to: &[String]| -> Option<String> {
        let p = from.first()?.split_once('.')?.0.to_string() + ".";
        (from.iter().all(|k| k.starts_with(&p))
            && to.iter().all(|k| from.iter().any(|u| u.strip_prefix(&p) == Some(k.as_str()))))
        .then_some(p)
    };
    let headline_why = if let Some(p) =
        (!missing.is_empty()).then(|| prefixed(&unexpected, &missing)).flatten()
    {
        f.next_step = Some(format!(
            "The checkpoint's names carry a `{p}` prefix the model's lack: it was saved from the wrapped model \
             ({}). Save the unwrapped model's `state_dict()`, or strip the prefix: `{{k.removeprefix(\"{p}\"): v for \
             k, v in sd.items()}}`.",
            if p == "module." {
                "DDP's `module.`"
            } else if p == "_orig_mod." {
                "`torch.compile`'s `_orig_mod.`"
            } else {
                "a wrapper's"
            }
        ));
        format!(": the checkpoint's names carry a `{p}` prefix the model's lack")
    } else if let Some(p) = (!unexpected.is_empty()).then(|| prefixed(&missing, &unexpected)).flatten() {
        f.next_step = Some(format!(
            "The model's names carry a `{p}` prefix the checkpoint's lack: load into the unwrapped model (DDP's \
             `model.module`) or add the prefix to the checkpoint's names."
        ));
        format!(": the model's names carry a `{p}` prefix the checkpoint's lack")
    } else if !sizes.is_empty() && missing.is_empty() && unexpected.is_empty() {
        ": the same names with other shapes (another configuration or world size)".to_string()
    } else {
        String::new()
    };
    f.headline =
        Some(format!("Rank {} could not load its checkpoint into the model{headline_why}.", r.rank()));
    Some(f)
}

pub fn too_many_open_files(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let r = erring(
        ev,
        first,
        &[
            "received 0 items of ancdata",
            "Too many open files. Communication with the workers",
            "[Errno 24] Too many open files",
        ],
    )?;
    let mut f = Finding::of(&TOO_MANY_OPEN_FILES);
    f.culprit = Some(r.rank());
    f.headline = Some(format!(
        "Rank {} ran out of file descriptors: its DataLoader workers share each tensor as one (PyTorch's \
         `file_descriptor` strategy) and the open-file limit was reached.",
        r.rank()
    ));
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{failed, judged};
    use super::*;

    /// The allocator's message as `c10/cuda/CUDACachingAllocator.cpp` of torch 2.11 assembles it
    /// (its pieces are verbatim in the installed `libc10_cuda.so`: `CUDA out of memory. Tried to
    /// allocate `, `. GPU `, ` has a total capacity of `, ` of which `, ` is free. `, `Process `,
    /// ` has `, ` memory in use. `, `Including non-PyTorch memory, this process`, `Of the allocated
    /// memory `, ` is allocated by PyTorch, `, ` is reserved by PyTorch but unallocated.`, ` If
    /// reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=…`), with sizes
    /// as its `format_size` writes them. Not a recording of a GPU: none was lent yet.
    pub const OOM: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a \
        total capacity of 79.19 GiB of which 1.96 GiB is free. Process 4242 has 3.00 GiB memory in use. Including \
        non-PyTorch memory, this process has 74.22 GiB memory in use. Of the allocated memory 70.50 GiB is \
        allocated by PyTorch, and 3.12 GiB is reserved by PyTorch but unallocated. If reserved but unallocated \
        memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
        documentation for Memory Management  \
        (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";

    fn traceback(error: &str) -> String {
        format!(
            "Traceback (most recent call last):\n  File \"/work/train.py\", line 40, in <module>\n                 loss = model(x).sum()\n{error}"
        )
    }

    #[test]
    fn a_cuda_oom_names_the_rank_the_request_and_fragmentation_and_a_printed_one_is_not_the_error() {
        let lost =
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer";
        let j = judged(&[failed(0, 5.2, &traceback(lost)), failed(1, 5.0, &traceback(OOM))]);
        assert_eq!(j.verdict.pattern.as_deref(), Some("cuda-oom"), "{:#?}", j.verdict);
        assert_eq!(j.first_failure, Some(1));
        assert!(
            j.verdict.headline.starts_with(
                "Rank 1 ran out of GPU memory on GPU 0: it asked PyTorch's allocator for 20.00 GiB (79.19 GiB in \
                 all, 1.96 GiB free)."
            ),
            "{}",
            j.verdict.headline
        );
        let ev = j.verdict.evidence.join("\n");
        assert!(
            ev.contains("rank 1: CUDA out of memory on GPU 0, asked for 20.00 GiB; PyTorch had 70.50 GiB allocated and 3.12 GiB reserved but unallocated"),
            "{ev}"
        );
        assert!(ev.contains("process 4242 held 3.00 GiB"), "{ev}");
        assert!(j.verdict.next_step.unwrap().contains("expandable_segments:True"));
        // The same text printed by a rank that then failed of something else (a retry that
        // logged the OOM and went on) is not its error.
        let printed =
            format!("{OOM}\nretrying with a smaller batch\n{}", traceback("ValueError: bad label 7"));
        let j = judged(&[failed(0, 5.0, &printed)]);
        assert_ne!(j.verdict.pattern.as_deref(), Some("cuda-oom"), "{:#?}", j.verdict);
    }

    #[test]
    fn a_checkpoint_saved_from_the_ddp_wrapped_model_names_the_prefix() {
        // PyTorch 2.11's own message (`Module.load_state_dict`), as `tests/` produce it.
        let error = "RuntimeError: Error(s) in loading state_dict for Sequential:\n\tMissing key(s) in state_dict: \
                     \"0.weight\", \"0.bias\". \n\tUnexpected key(s) in state_dict: \"module.0.weight\", \
                     \"module.0.bias\". ";
        let j = judged(&[failed(0, 3.0, &traceback(error))]);
        assert_eq!(j.verdict.pattern.as_deref(), Some("state-dict-mismatch"), "{:#?}", j.verdict);
        assert!(
            j.verdict.headline.contains("the checkpoint's names carry a `module.` prefix"),
            "{}",
            j.verdict.headline
        );
        assert!(j.verdict.next_step.unwrap().contains("DDP's `module.`"));
        let ev = j.verdict.evidence.join("\n");
        assert!(ev.contains("missing from the checkpoint: 2 (0.weight, 0.bias)"), "{ev}");
        let shapes = "RuntimeError: Error(s) in loading state_dict for Linear:\n\tsize mismatch for weight: copying a \
                      param with shape torch.Size([2, 4]) from checkpoint, the shape in current model is \
                      torch.Size([3, 4]).";
        let j = judged(&[failed(0, 3.0, &traceback(shapes))]);
        assert!(j.verdict.headline.contains("the same names with other shapes"), "{}", j.verdict.headline);
    }

    #[test]
    fn descriptors_run_out_when_worker_tensors_come_as_file_descriptors() {
        let j = judged(&[failed(0, 3.0, &traceback("RuntimeError: received 0 items of ancdata"))]);
        assert_eq!(j.verdict.pattern.as_deref(), Some("too-many-open-files"), "{:#?}", j.verdict);
        assert!(j.verdict.next_step.unwrap().contains("set_sharing_strategy('file_system')"));
    }

    #[test]
    fn sizes_read_as_the_allocator_writes_them() {
        assert_eq!(bytes_of("512 bytes"), Some(512.0));
        assert_eq!(bytes_of("1.50 KiB"), Some(1536.0));
        assert_eq!(bytes_of("2.00 GiB"), Some(2.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(bytes_of("lots"), None);
        assert_eq!(figure(OOM, "Tried to allocate ", ". GPU"), Some("20.00 GiB"));
        assert_eq!(figure(OOM, " of which ", " is free"), Some("1.96 GiB"));
    }
}
