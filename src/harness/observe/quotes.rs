//! The program's own words: finds the lines of an external program's output worth quoting next
//! to the verdict (the tail of the last Python traceback, PyTorch DataLoader's worker messages,
//! torchrun's "Root Cause (first observed failure)" block, Python's fault handler). Pure: lines in,
//! quotes out; what they mean is [`crate::diagnose`]'s to judge.

use crate::schema::{Quote, QuoteKind};

/// Lines kept of a traceback (its tail: the exception and the frames nearest to it).
const TRACEBACK_LINES: usize = 25;
/// Lines kept of a fault-handler dump or a torchrun block.
const BLOCK_LINES: usize = 20;

/// The quotes found in `lines` (a process's stderr, then stdout), most telling first.
pub fn program_quotes(lines: &[String]) -> Vec<Quote> {
    let mut quotes = Vec::new();
    if let Some(block) = torchrun_root_cause(lines) {
        quotes.push(Quote { title: QuoteKind::TorchrunRootCause, lines: block });
    }
    let loader: Vec<String> = lines
        .iter()
        .filter(|l| is_dataloader_message(l))
        .map(|l| l.trim_end().to_string())
        .fold(Vec::new(), |mut kept, l| {
            if !kept.contains(&l) {
                kept.push(l);
            }
            kept
        });
    if !loader.is_empty() {
        let skip = loader.len().saturating_sub(6);
        quotes.push(Quote { title: QuoteKind::DataLoader, lines: loader[skip..].to_vec() });
    }
    // torchrun's own `ChildFailedError` traceback only says a child failed: its Root Cause block
    // above says which, and how.
    if let Some(block) = last_traceback(lines).filter(|b| !b.iter().any(|l| l.contains("ChildFailedError"))) {
        quotes.push(Quote { title: QuoteKind::PythonTraceback, lines: block });
    }
    if let Some(block) = fault_handler(lines) {
        quotes.push(Quote { title: QuoteKind::FaultHandler, lines: block });
    }
    quotes
}

/// The quotes of a process's output, each stream read on its own: a traceback at the end of its
/// stderr does not run on into what the program printed to stdout (which, quoted as the
/// traceback's tail, pushed the exception itself out of it). Of a kind found in both, stderr's.
pub fn output_quotes(stderr: &[String], stdout: &[String]) -> Vec<Quote> {
    let mut quotes = program_quotes(stderr);
    for q in program_quotes(stdout) {
        if !quotes.iter().any(|k| k.title == q.title) {
            quotes.push(q);
        }
    }
    // Most telling first, as `program_quotes` orders them (the order of `QuoteKind`).
    quotes.sort_by_key(|q| q.title as u8);
    quotes
}

fn is_dataloader_message(line: &str) -> bool {
    [
        "DataLoader worker (pid",
        "in DataLoader worker process",
        "Unexpected bus error encountered in worker",
        "unable to allocate shared memory(shm)",
        "dataloader's workers are out of shared memory",
    ]
    .iter()
    .any(|needle| line.contains(needle))
}

/// The last `Traceback (most recent call last):` through the end of that traceback, tail only.
/// torchrun's own `ChildFailedError` traceback says only that a child failed: an earlier one (a
/// rank's) is preferred.
fn last_traceback(lines: &[String]) -> Option<Vec<String>> {
    let starts: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with("Traceback (most recent call last):"))
        .map(|(i, _)| i)
        .collect();
    // A traceback ends where a launcher's log line, a separator or the next traceback begins.
    let ends_at = |start: usize| {
        lines[start + 1..]
            .iter()
            .position(|l| {
                is_log_line(l)
                    || l.starts_with("=====")
                    || l.starts_with("Traceback (most recent call last):")
            })
            .map_or(lines.len(), |n| start + 1 + n)
    };
    let own =
        |start: &&usize| !lines[**start..ends_at(**start)].iter().any(|l| l.contains("ChildFailedError"));
    let start = *starts.iter().rev().find(own).or(starts.last())?;
    let end = ends_at(start);
    // An exception raised while another was handled: the first traceback of the chain is where it
    // began (the judge's key line leads with it), so it is quoted too, each traceback's tail.
    let handling = lines[..start]
        .iter()
        .rposition(|l| !l.trim().is_empty())
        .filter(|&h| lines[h].trim() == crate::diagnose::evidence::HANDLING && starts.iter().any(|&s| s < h));
    let Some(h) = handling else { return Some(tail(&lines[start..end], TRACEBACK_LINES)) };
    let first = *starts.iter().rfind(|&&s| s < h)?;
    // As many lines as one traceback's quote: each tail one shorter, and the line between them.
    let mut out = tail(&lines[first..h], TRACEBACK_LINES / 2 - 1);
    while out.last().is_some_and(|l| l.trim().is_empty()) {
        out.pop();
    }
    out.push(lines[h].clone());
    out.extend(tail(&lines[start..end], TRACEBACK_LINES - TRACEBACK_LINES / 2 - 1));
    Some(out)
}

/// A traceback's first line and its last `n - 1` lines (the exception and the frames nearest to
/// it), with a line saying how many were left out between them.
fn tail(block: &[String], n: usize) -> Vec<String> {
    let skip = block.len().saturating_sub(n);
    if skip == 0 {
        return block.to_vec();
    }
    let mut out = vec![block[0].clone(), format!("  … {skip} lines …")];
    out.extend(block[skip + 1..].iter().cloned());
    out
}

/// A logging line of torchrun or PyTorch's C++ side (`[W…`, `W0101 12:00:00.000`, `E…`).
fn is_log_line(line: &str) -> bool {
    let b = line.as_bytes();
    let glog = b.len() > 5 && matches!(b[0], b'W' | b'E' | b'I') && b[1..5].iter().all(u8::is_ascii_digit);
    glog || line.starts_with("[W") || line.starts_with("[E") || line.starts_with("[I")
}

/// torchrun's block from `Root Cause (first observed failure):` to its closing `=====` line.
fn torchrun_root_cause(lines: &[String]) -> Option<Vec<String>> {
    let start = lines.iter().rposition(|l| l.contains("Root Cause (first observed failure)"))?;
    let block: Vec<String> = lines[start..]
        .iter()
        .take_while(|l| !l.starts_with("====="))
        .take(BLOCK_LINES)
        .map(|l| l.trim_end().to_string())
        .collect();
    Some(block)
}

/// `Fatal Python error: Segmentation fault` and the stack faulthandler prints after it (up to
/// its list of extension modules, or another process's line), with C++'s own last words just
/// before it when it aborted (`terminate called without an active exception`, or `terminate
/// called after throwing …` and its `what():`).
/// The block of ups-doctor's own observer thread (only waiting) is left out, so the thread that
/// faulted is not cut off by the quote's length.
/// Where the output holds several dumps (ranks sharing a launcher's output) and none of them
/// shows a Python frame (each came as its process shut down), all are quoted when they fit: the
/// judge tells from them that every such rank crashed at exit, each on its own. Else the last.
fn fault_handler(lines: &[String]) -> Option<Vec<String>> {
    let starts: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("Fatal Python error:"))
        .map(|(i, _)| i)
        .collect();
    let mut dumps: Vec<Vec<String>> = starts.iter().map(|&at| dump_at(lines, at)).collect();
    let without_python =
        |d: &Vec<String>| crate::diagnose::evidence::fault_handler_without_python(d) == Some(true);
    if dumps.len() > 1
        && dumps.iter().all(without_python)
        && dumps.iter().map(Vec::len).sum::<usize>() <= BLOCK_LINES
    {
        return Some(dumps.concat());
    }
    let mut last = dumps.pop()?;
    last.truncate(BLOCK_LINES);
    Some(last)
}

/// The dump whose `Fatal Python error:` line is `lines[at]`, as [`fault_handler`] quotes it.
fn dump_at(lines: &[String], at: usize) -> Vec<String> {
    let terminate = lines[at.saturating_sub(3)..at].iter().rposition(|l| l.starts_with("terminate called"));
    let start = terminate.map_or(at, |i| at.saturating_sub(3) + i);
    let dump: Vec<&String> = lines[start..]
        .iter()
        .enumerate()
        .take_while(|(i, l)| {
            !l.starts_with("Extension modules:")
                && !l.starts_with("[rank")
                // The next dump (its C++ line or its own first line) ends this one.
                && (*i <= at - start || !(l.starts_with("Fatal Python error:") || l.starts_with("terminate called")))
        })
        .map(|(_, l)| l)
        .collect();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < dump.len() {
        let end = (i + 1..dump.len())
            .find(|&j| dump[j].starts_with("Thread 0x") || dump[j].starts_with("Current thread"))
            .unwrap_or(dump.len());
        // ups-doctor's own thread: every frame its `sitecustomize`'s or `threading`'s. (The
        // program's threads pass through the observer's wrappers around collectives too.)
        let frames: Vec<&&String> =
            dump[i + 1..end].iter().filter(|l| l.trim_start().starts_with("File \"")).collect();
        let observer = dump[i].starts_with("Thread 0x")
            && frames.iter().any(|l| l.contains("python-site/sitecustomize.py"))
            && frames
                .iter()
                .all(|l| l.contains("python-site/sitecustomize.py") || l.contains("/threading.py\""));
        if !observer {
            kept.extend(dump[i..end].iter().map(|l| l.trim_end().to_string()));
        }
        i = end;
    }
    kept
}

/// A rank's own lines in a launcher's output: PyTorch prefixes what a rank's uncaught exception
/// prints with `[rankN]: `.
pub fn rank_lines(lines: &[String], rank: u32) -> Vec<String> {
    let prefix = format!("[rank{rank}]:");
    lines
        .iter()
        .filter_map(|l| {
            l.strip_prefix(&prefix).map(|rest| rest.strip_prefix(' ').unwrap_or(rest).to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lightning's teardown raised while the DataLoader's `ENOSPC` was handled (the accuracy
    /// matrix's held-out `lightning-transformer` × small-shm; the diagnose fixture): both
    /// tracebacks' tails are quoted, the first one's exception included.
    #[test]
    fn a_chain_of_an_exception_raised_while_another_was_handled_is_quoted_from_its_first() {
        let text = lines(include_str!("../../diagnose/fixtures/handling_chain.txt"));
        let quote = last_traceback(&text).unwrap();
        assert!(quote.iter().any(|l| l == "OSError: [Errno 28] No space left on device"), "{quote:#?}");
        assert!(quote.iter().any(|l| l.contains("multiprocessing/synchronize.py")), "{quote:#?}");
        assert!(quote.last().is_some_and(|l| l.starts_with("RuntimeError: Please call")), "{quote:#?}");
        assert!(quote.len() <= TRACEBACK_LINES + 1, "{}", quote.len());
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(String::from).collect()
    }

    /// What PyTorch 2.11 prints when a worker cannot allocate its batch in `/dev/shm`.
    const SHM: &str = "\
step 0
Traceback (most recent call last):
  File \"/t/shm_loader.py\", line 40, in <module>
    for step, batch in enumerate(loader):
  File \"/v/torch/utils/data/dataloader.py\", line 1515, in _process_data
    data.reraise()
RuntimeError: Caught RuntimeError in DataLoader worker process 1.
Original Traceback (most recent call last):
  File \"/v/torch/utils/data/_utils/collate.py\", line 210, in collate_tensor_fn
    storage = elem._typed_storage()._new_shared(numel, device=elem.device)
RuntimeError: unable to allocate shared memory(shm) for file </torch_4242_1827363_0>: Resource exhausted (12)
";

    #[test]
    fn a_dataloader_shm_failure_is_quoted_with_its_traceback() {
        let l = lines(SHM);
        let quotes = program_quotes(&l);
        let titles: Vec<QuoteKind> = quotes.iter().map(|q| q.title).collect();
        assert_eq!(titles, [QuoteKind::DataLoader, QuoteKind::PythonTraceback]);
        assert_eq!(quotes[1].lines.first().map(String::as_str), Some("Traceback (most recent call last):"));
        assert!(quotes[1].lines.last().unwrap().contains("Resource exhausted (12)"));
    }

    #[test]
    fn a_traceback_at_the_end_of_stderr_does_not_run_on_into_stdout() {
        let stderr = lines(
            "Traceback (most recent call last):\n  File \"/t/train.py\", line 9, in <module>\n    step()\n\
             ValueError: the batch was empty",
        );
        let stdout: Vec<String> = (0..40).map(|i| format!("step {i} loss 0.5")).collect();
        let quotes = output_quotes(&stderr, &stdout);
        let [q] = &quotes[..] else { panic!("{quotes:#?}") };
        assert_eq!(q.title, QuoteKind::PythonTraceback);
        assert_eq!(q.lines.last().map(String::as_str), Some("ValueError: the batch was empty"), "{q:#?}");
        // Read as one stream, the program's prints became the traceback's tail and the exception
        // was cut out of it.
        let joined: Vec<String> = stderr.iter().chain(&stdout).cloned().collect();
        assert!(!program_quotes(&joined)[0].lines.iter().any(|l| l.contains("ValueError")));
        // A fault handler's dump on stdout (`faulthandler.enable(sys.stdout)`) is still quoted,
        // after the traceback.
        let stdout = lines(
            "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n  File \"/t/train.py\", line 3 in <module>",
        );
        let titles: Vec<QuoteKind> = output_quotes(&stderr, &stdout).iter().map(|q| q.title).collect();
        assert_eq!(titles, [QuoteKind::PythonTraceback, QuoteKind::FaultHandler]);
    }

    #[test]
    fn a_killed_workers_message_and_torchruns_root_cause_are_quoted() {
        let l = lines(
            "RuntimeError: DataLoader worker (pid 77) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory.\n\
             ============================================================\n\
             Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -11 (pid: 9)\n\
             ============================================================",
        );
        let quotes = program_quotes(&l);
        assert_eq!(quotes[0].title, QuoteKind::TorchrunRootCause);
        assert_eq!(quotes[0].lines.len(), 4);
    }

    #[test]
    fn torchruns_own_traceback_gives_way_to_a_ranks() {
        let l = lines(
            "[rank0]: Traceback (most recent call last):\n[rank0]:   File \"t.py\", line 3\n[rank0]: RuntimeError: Connection closed by peer\n\
             Traceback (most recent call last):\n  File \"r.py\", line 1\nValueError: a rank's own error\n\
             Traceback (most recent call last):\n  File \"torchrun\", line 8\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        );
        assert_eq!(
            last_traceback(&l).unwrap().last().map(String::as_str),
            Some("ValueError: a rank's own error")
        );
        let rank0 = rank_lines(&l, 0);
        assert_eq!(rank0.len(), 3);
        assert_eq!(
            last_traceback(&rank0).unwrap().last().map(String::as_str),
            Some("RuntimeError: Connection closed by peer")
        );
        assert!(rank_lines(&l, 1).is_empty());
    }

    #[test]
    fn the_observers_waiting_thread_is_left_out_of_a_fault_handler_quote() {
        let l = lines(
            "Fatal Python error: Segmentation fault\n\nThread 0x00007fea (most recent call first):\n  \
             File \"/usr/lib/python3.11/threading.py\", line 331 in wait\n  \
             File \"/runs/1-segv/python-site/sitecustomize.py\", line 112 in _run\n\n\
             Thread 0x00007fec (most recent call first):\n  File \"/t/logger.py\", line 9 in run\n\n\
             Current thread 0x00007feb (most recent call first):\n  File \"/t/ddp.py\", line 44 in <module>\n\n\
             Extension modules: numpy",
        );
        let quote = fault_handler(&l).unwrap();
        let text = quote.join("\n");
        assert!(!text.contains("sitecustomize"), "{text}");
        assert!(text.contains("logger.py") && text.contains("ddp.py\", line 44"), "{text}");
        assert_eq!(quote[0], "Fatal Python error: Segmentation fault");
        // The program's main thread in a collective passes through the observer's wrapper: it
        // is the program's thread, and stays (seen here: a rank aborted by gloo in `all_reduce`).
        let main = lines(
            "Fatal Python error: Aborted\n\nThread 0x00007f88 (most recent call first):\n  \
             File \"/usr/lib/python3.11/threading.py\", line 331 in wait\n  \
             File \"/runs/1-x/python-site/sitecustomize.py\", line 180 in _run\n\n\
             Thread 0x00007f89 (most recent call first):\n  \
             File \"/v/site-packages/torch/distributed/distributed_c10d.py\", line 3075 in all_reduce\n  \
             File \"/runs/1-x/python-site/sitecustomize.py\", line 691 in collective\n  \
             File \"/t/train.py\", line 52 in main\n\nExtension modules: numpy",
        );
        let text = fault_handler(&main).unwrap().join("\n");
        assert!(text.contains("train.py\", line 52") && !text.contains("in _run"), "{text}");
    }

    /// What PyTorch 2.11 under torchrun printed when a rank's thread was still in C++ as Python
    /// shut down: C++'s line, then the fault handler's dump, every thread without a Python frame.
    #[test]
    fn cpp_last_words_before_an_abort_open_the_fault_handler_quote() {
        let l = lines(
            "step 10 loss 0.7786\nterminate called without an active exception\nFatal Python error: Aborted\n\n\
             Current thread 0x00007fe6cda126c0 (most recent call first):\n  <no Python frame>\n\n\
             Thread 0x00007fe78703db80 (most recent call first):\n  <no Python frame>\n\n\
             Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)",
        );
        let quote = fault_handler(&l).unwrap();
        assert_eq!(
            quote[..2],
            ["terminate called without an active exception", "Fatal Python error: Aborted"]
        );
        assert!(!quote.iter().any(|q| q.contains("step 10") || q.contains("Extension")), "{quote:?}");
        let without = lines("step 10\nFatal Python error: Aborted\n");
        assert_eq!(fault_handler(&without).unwrap()[0], "Fatal Python error: Aborted");
    }

    /// Both ranks of a torchrun run aborted as they shut down (PyTorch 2.11, gloo; seen in a
    /// benchmark here): two dumps in the launcher's output, neither with a Python frame. Both are
    /// quoted; where one has a frame, only the last is.
    #[test]
    fn every_dump_is_quoted_when_none_shows_a_python_frame() {
        let dump = |thread: &str, frame: &str| {
            format!(
                "terminate called without an active exception\nFatal Python error: Aborted\n\n\
                 Thread 0x{thread} (most recent call first):\n  {frame}\n\n\
                 Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)\n"
            )
        };
        let both = lines(&format!(
            "step 1990 loss 1.07\ntraining finished\n{}{}W1129 18:16:18 api.py:986] failed",
            dump("00007fcef59cbb80", "<no Python frame>"),
            dump("00007f77aedc9b80", "<no Python frame>")
        ));
        let quote = fault_handler(&both).unwrap();
        assert_eq!(quote.iter().filter(|l| l.starts_with("Fatal Python error")).count(), 2, "{quote:?}");
        assert_eq!(quote.iter().filter(|l| l.starts_with("terminate called")).count(), 2, "{quote:?}");
        assert!(quote[2..].iter().any(|l| l.contains("00007fcef59cbb80")), "{quote:?}");
        let one_in_python = lines(&format!(
            "{}{}",
            dump("00007fcef59cbb80", "File \"/w/train.py\", line 40 in main"),
            dump("00007f77aedc9b80", "<no Python frame>")
        ));
        let quote = fault_handler(&one_in_python).unwrap();
        assert_eq!(quote.iter().filter(|l| l.starts_with("Fatal Python error")).count(), 1, "{quote:?}");
        assert!(quote.iter().any(|l| l.contains("00007f77aedc9b80")), "{quote:?}");
    }

    #[test]
    fn long_tracebacks_keep_their_head_and_tail() {
        let mut text = String::from("Traceback (most recent call last):\n");
        for i in 0..40 {
            text.push_str(&format!("  File \"f{i}.py\", line 1\n"));
        }
        text.push_str("ValueError: boom\nW0101 00:00:00.000 torchrun log line\n");
        let quote = last_traceback(&lines(&text)).unwrap();
        assert_eq!(quote.len(), TRACEBACK_LINES + 1);
        assert_eq!(quote[1], "  … 17 lines …");
        assert_eq!(quote.last().unwrap(), "ValueError: boom");
    }
}
