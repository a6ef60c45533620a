//! A rank that crashed in native code, and one that claimed success without finishing.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{
    EndedBy, Evidence, KeyLine, RankEvidence, fault_dumps_without_python, fault_handler_without_python,
    key_line, rank_name,
};
use crate::scenario::OutcomeKind;
use crate::schema::{QuoteKind, Signal};

pub const NATIVE_CRASH: Pattern = Pattern {
    id: "native-crash",
    title: "Native crash",
    matches: "the first rank to fail was killed by SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT raised in \
              the process itself; the first frame in the program's own code comes from the crash handler's \
              backtrace (built-in trainer) or Python's fault handler (`PYTHONFAULTHANDLER`, set by ups-doctor). \
              A crash after the observer's summary at exit (the program's own code had finished), or whose own \
              fault-handler dump lists no thread with a Python frame (the main thread's are gone once the program \
              has returned), is said to have come as Python shut down, not in training; where ranks share a \
              launcher's output and every crashed rank's dump there is so, each crashed at exit on its own",
    explanation: "The process crashed in native code (libtorch, a CUDA/NCCL library, an extension, or memory \
                  shared between processes). Python prints no traceback for it and torchrun only reports \
                  `exitcode: -11` and `Signal 11 (SIGSEGV) received by PID`.",
    next_step: "Read the stack from the top: the first frame in your own code is where to look. Then cut the \
                program down (`ups-doctor bisect`, or remove components one at a time) to find what the crash \
                needs.",
    reference: "https://pytorch.org/docs/stable/elastic/errors.html",
};

pub const FALSE_SUCCESS: Pattern = Pattern {
    id: "false-success",
    title: "False success",
    matches: "a rank exited with status 0 without its completion evidence (the built-in trainer's `done` \
              marker; for a program, `expect.completes_when`)",
    explanation: "Something ended the process with status 0 before training completed, like a wrapper calling \
                  `os._exit(0)` or `sys.exit(0)` after catching an exception: the real error was swallowed.",
    next_step: "Look for exception handlers that exit with 0 around the training loop; the log tail shows the \
                last output before the exit.",
    reference: "https://docs.python.org/3/library/os.html#os._exit",
};

pub const CRASH_SIGNALS: [Signal; 5] = [Signal::SEGV, Signal::BUS, Signal::ILL, Signal::FPE, Signal::ABRT];

/// The lines of Python's fault handler the launcher printed (ranks under a launcher share its
/// output, and the handler names no rank), if it holds one.
fn launcher_fault_handler<'e>(ev: &Evidence<'e>) -> Option<&'e [String]> {
    let quote = ev.launcher?.quotes.iter().find(|q| q.title == QuoteKind::FaultHandler)?;
    Some(&quote.lines)
}

/// The key line of the fault handler's lines in the launcher's output (`handler`), as `first`'s:
/// only where `first` has none of its own and is the only rank a fatal signal ended by itself
/// (the handler prints only on such a signal, so the stack can be no other rank's).
fn fault_handler_in_launcher_output(
    ev: &Evidence,
    first: &RankEvidence,
    handler: &[String],
) -> Option<KeyLine> {
    if first.key.as_ref().is_some_and(|k| k.fatal) {
        return None;
    }
    if crashed_by_itself(ev) != 1 {
        return None;
    }
    key_line(handler).filter(|k| k.fatal)
}

/// The key line of `rank`'s death by a fatal signal: its own fault-handler dump's, else the one in
/// the launcher's shared output when the stack can be no other rank's.
pub fn fatal_key(ev: &Evidence, rank: &RankEvidence) -> Option<KeyLine> {
    if let Some(own) = rank.key.as_ref().filter(|k| k.fatal) {
        return Some(own.clone());
    }
    let own_crash = rank.result.outcome == OutcomeKind::Signaled
        && rank.result.signal.is_some_and(|s| CRASH_SIGNALS.contains(&s))
        && matches!(rank.ended_by, EndedBy::Itself);
    if !ev.foreign || !own_crash {
        return None;
    }
    fault_handler_in_launcher_output(ev, rank, launcher_fault_handler(ev)?)
}

/// The ranks a fatal signal ended that they raised themselves: each prints a fault-handler dump.
pub fn crashed_by_itself(ev: &Evidence) -> usize {
    ev.ranks
        .iter()
        .filter(|r| {
            r.result.outcome == OutcomeKind::Signaled
                && r.result.signal.is_some_and(|s| CRASH_SIGNALS.contains(&s))
                && matches!(r.ended_by, EndedBy::Itself)
        })
        .count()
}

/// How many ranks crashed at exit each on its own, told by a launcher's output they share: a
/// dump for every rank a fatal signal ended, and none of them with a Python frame (each came as
/// its process shut down). 0 when that is not so, or only one rank crashed.
pub fn all_crashed_at_exit(ev: &Evidence) -> usize {
    let crashed = crashed_by_itself(ev);
    let dumps = launcher_fault_handler(ev).and_then(fault_dumps_without_python);
    if crashed >= 2 && dumps == Some(crashed) { crashed } else { 0 }
}

pub fn native_crash(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let r = first.result;
    let sig = r.signal.filter(|s| CRASH_SIGNALS.contains(s))?;
    if r.outcome != OutcomeKind::Signaled {
        return None;
    }
    let mut f = Finding::of(&NATIVE_CRASH);
    let handler = if ev.foreign { launcher_fault_handler(ev) } else { None };
    let in_launcher = handler.and_then(|h| fault_handler_in_launcher_output(ev, first, h));
    let own = if ev.foreign {
        first
            .key
            .as_ref()
            .filter(|k| k.fatal)
            .and_then(|k| k.at.clone())
            .or_else(|| in_launcher.as_ref().and_then(|h| h.at.clone()))
    } else {
        r.backtrace
            .iter()
            .find(|fr| fr.symbol.as_deref().is_some_and(|s| s.contains("ups_doctor_trainer::")))
            .map(|fr| match &fr.location {
                Some(l) => format!("{} at {l}", fr.symbol.as_deref().unwrap_or(&fr.addr)),
                None => fr.symbol.clone().unwrap_or_else(|| fr.addr.clone()),
            })
    };
    f.evidence.push(match (&own, &in_launcher) {
        (Some(place), Some(h)) if h.at.as_ref() == Some(place) => format!(
            "first frame in the program's own code: `{place}`, from Python's fault handler in the launcher's output \
             (rank {} is the only rank a fatal signal ended, so the stack is its)",
            r.rank
        ),
        (Some(place), _) => format!("first frame in the program's own code: `{place}`"),
        (None, Some(_)) => "Python's fault handler in the launcher's output (quoted below) named no frame of the \
                            program's own code (the crash came from a thread or library without Python frames)"
            .to_string(),
        (None, None) if handler.is_some() => {
            "Python's fault handler printed a stack into the launcher's shared output (quoted below); it does not \
             say whose, and more than one rank was ended by a fatal signal"
                .to_string()
        }
        (None, None) if ev.foreign => {
            "Python's fault handler named no frame of the program's own code (the crash came \
                               from a thread or library without Python frames)"
                .to_string()
        }
        (None, None) => format!(
            "the crash handler's backtrace has {} frames, none in the trainer's own code",
            r.backtrace.len()
        ),
    });
    if sig == Signal::ABRT {
        f.cause = Some(format!(
            "{} `abort()`: a failed assertion or an uncaught C++ exception (its `what():` line is the key line when \
             it was printed).",
            NATIVE_CRASH.explanation
        ));
    }
    if ev.foreign {
        // The rank's own dump: in its own output, or the launcher's when no other rank crashed,
        // or every dump of the launcher's when each crashed rank's shows no Python frame.
        let shared = all_crashed_at_exit(ev);
        let dump = if first.said("Fatal Python error") {
            Some(first.text.as_slice())
        } else {
            handler.filter(|_| in_launcher.is_some() || shared > 0)
        };
        at_exit(first, sig, handler, dump, shared, &mut f);
    }
    Some(f)
}

/// C++'s last words when a thread is torn down while it still runs: a joinable `std::thread`
/// destroyed, or a thread ended from inside C++ (Python ends a thread that takes the interpreter
/// lock back while it shuts down).
const TERMINATE_WITHOUT_EXCEPTION: &str = "terminate called without an active exception";

/// A crash after the program's own code had finished, as the observer's exit summary shows, or
/// the rank's own fault-handler dump (`dump`) where no thread had a Python frame left: it came
/// while Python shut down, not in training; said so in the headline, evidence, cause and next
/// step.
fn at_exit(
    first: &RankEvidence,
    sig: Signal,
    handler: Option<&[String]>,
    dump: Option<&[String]>,
    shared: usize,
    f: &mut Finding,
) {
    let r = first.result;
    let exiting = r.observed.as_ref().and_then(|o| o.exiting_at_s);
    let without_python = exiting.is_none() && dump.and_then(fault_handler_without_python) == Some(true);
    if exiting.is_none() && !without_python {
        return;
    }
    let done = match r.observed.as_ref().map_or(0, |o| o.steps) {
        0 => String::new(),
        1 => " (1 optimizer step done)".to_string(),
        n => format!(" ({n} optimizer steps done)"),
    };
    f.headline = Some(format!(
        "{} was killed by {sig} after its program had finished, as Python shut down{done}.",
        rank_name(r, "Rank")
    ));
    let when = r.ended_at_s.map(|t| format!(" by {t:.2} s")).unwrap_or_default();
    f.evidence.push(match exiting {
        Some(exiting) => format!(
            "{}'s program had finished its own code: its exit handlers ran at {exiting:.2} s (the observer's \
             summary at exit), and it was killed by {sig}{when}",
            rank_name(r, "rank")
        ),
        None if shared > 0 => format!(
            "{}'s program had finished its own code: each of the {shared} dumps of Python's fault handler in the \
             launcher's output, one for every rank a fatal signal ended, shows no thread running Python code \
             (`<no Python frame>` for every thread; the main thread holds the program's frames while its code \
             runs), and it was killed by {sig}{when}",
            rank_name(r, "rank")
        ),
        None => format!(
            "{}'s program had finished its own code: Python's fault handler shows no thread running Python code \
             (`<no Python frame>` for every thread it lists; the main thread holds the program's frames while its \
             code runs), and it was killed by {sig}{when}",
            rank_name(r, "rank")
        ),
    });
    let terminate = first.said(TERMINATE_WITHOUT_EXCEPTION)
        || handler.is_some_and(|h| h.iter().any(|l| l.starts_with(TERMINATE_WITHOUT_EXCEPTION)));
    f.cause = Some(if terminate {
        f.evidence.push(format!("C++ printed `{TERMINATE_WITHOUT_EXCEPTION}` before the abort"));
        "A crash at exit, not in training: a thread was still running native code when the process shut down. \
         `terminate called without an active exception` is what C++ prints when a thread is torn down while it \
         runs: a joinable `std::thread` destroyed at exit, or a thread that Python ends as it takes the \
         interpreter lock back from inside a C++ call (a PyTorch or extension call that had let go of it) during \
         shutdown."
            .to_string()
    } else {
        format!(
            "A crash at exit, not in training: it came during Python's shutdown (module teardown, garbage \
             collection, the destructors of native libraries and their threads). {}",
            NATIVE_CRASH.explanation
        )
    });
    f.next_step = Some(format!(
        "The program's own work ran to its end{done}: what it wrote before returning is there, but the exit status says it \
         failed, so a scheduler or launcher treats the run as failed. Stop background work before the program \
         returns: `dist.destroy_process_group()`, DataLoader workers (`persistent_workers`), threads a library or \
         the program started. If the program already does, the race is inside a library at shutdown: re-running \
         shows how often it happens, and the quoted lines belong in that library's issue tracker."
    ));
}

pub fn false_success(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    if first.result.outcome != OutcomeKind::FalseSuccess {
        return None;
    }
    let mut f = Finding::of(&FALSE_SUCCESS);
    if ev.foreign {
        f.cause = Some(
            "Something ended the program with status 0 before it finished, like a wrapper calling `os._exit(0)` \
             or `sys.exit(0)` after catching an exception: the real error was swallowed."
                .into(),
        );
        f.next_step = Some(
            "Look for exception handlers that exit with 0 around the training loop. The program's own last error \
             lines are quoted below the verdict."
                .into(),
        );
    }
    Some(f)
}
