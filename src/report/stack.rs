//! How a stack reads in a report: names demangled (C++ through `cpp_demangle`, Rust through
//! `rustc-demangle`), the machinery every stack shares folded into one line each (the crash
//! handler and `backtrace` on top; the runtime's start-up, `__rust_try`/`catch_unwind`, libc's
//! start and thread start below), and runs of frames without a symbol folded into a count. Also
//! whose stack a rank's backtrace is: a data-loader worker's crash reaches the report through its
//! rank's marker pipe. `result.json` keeps every frame as captured.

use crate::protocol::Frame;
use crate::schema::RankResult;

/// `symbol` demangled: an Itanium C++ name (`_ZN3c10…`) or a Rust one (`_R…`, `_ZN…17h…E`); as it
/// is otherwise (already demangled, or not a mangled name).
pub(crate) fn demangle(symbol: &str) -> String {
    let trimmed = symbol.trim();
    if let Ok(rust) = rustc_demangle::try_demangle(trimmed) {
        // `{:#}` leaves out the hash suffix.
        return format!("{rust:#}");
    }
    if trimmed.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(trimmed)
        && let Ok(text) = sym.demangle()
    {
        return text;
    }
    symbol.to_string()
}

/// Why a frame is folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fold {
    /// Shown.
    Keep,
    /// The crash handler and the `backtrace` crate capturing the stack, on top.
    Handler,
    /// Process and thread start-up, unwinding guards and closure shims of the standard library.
    Runtime,
    /// No symbol: an address only.
    Unresolved,
}

fn fold_of(frame: &Frame) -> Fold {
    let Some(s) = frame.symbol.as_deref().map(str::trim).filter(|s| !s.is_empty()) else {
        // The null return address that ends an unwound stack is its outermost frame.
        let null = frame.addr.trim_start_matches("0x").trim_start_matches('0').is_empty();
        return if null { Fold::Runtime } else { Fold::Unresolved };
    };
    if s.starts_with('<') && s.contains("+0x") && s.ends_with('>') {
        return Fold::Unresolved;
    }
    const HANDLER: [&str; 8] = [
        "backtrace::",
        "<backtrace::",
        "on_fatal_signal",
        "on_capture_request",
        "capture_raw",
        "crash::symbolise",
        "__restore_rt",
        "stack_dump_loop",
    ];
    if HANDLER.iter().any(|p| s.starts_with(p) || s.contains(&format!("::{p}"))) {
        return Fold::Handler;
    }
    const RUNTIME: [&str; 24] = [
        "__rust_try",
        "__rust_begin_short_backtrace",
        "std::rt::",
        "std::panicking::",
        "std::panic::catch_unwind",
        "std::sys::backtrace::",
        "std::sys::pal::unix::thread::",
        "std::thread::Builder::spawn_unchecked",
        "<alloc::boxed::Box<F,A> as core::ops::function::FnOnce",
        "core::ops::function::FnOnce::call_once",
        "<core::panic::unwind_safe::AssertUnwindSafe<F> as core::ops::function::FnOnce",
        "<&dyn core::ops::function::Fn<(), Output = i32>",
        "{closure#0}<std::process::ExitCode>",
        "do_call<",
        "catch_unwind<",
        "call_once<",
        "__libc_start_main",
        "__libc_start_call_main",
        "__libc_start_main_impl",
        "_start",
        "start_thread",
        "clone3",
        "clone",
        // The C `main` that rustc generates (the program's own is `crate::main`).
        "main",
    ];
    // Short names only whole (`main`, `clone`, `_start`), longer ones as a prefix.
    if RUNTIME.iter().any(|p| s == *p || (p.len() > 6 && s.starts_with(p))) {
        return Fold::Runtime;
    }
    Fold::Keep
}

/// The frames as numbered lines, innermost first: `#3  symbol  (location)`, each fold one line
/// (`…   4 frames of the crash handler`). The numbers are the frames' indices in `result.json`.
pub(crate) fn lines(frames: &[Frame]) -> Vec<String> {
    let width = frames.len().saturating_sub(1).to_string().len();
    let mut out = Vec::new();
    let mut i = 0;
    while i < frames.len() {
        let fold = fold_of(&frames[i]);
        if fold == Fold::Keep {
            let f = &frames[i];
            let what = f.symbol.as_deref().map_or_else(|| f.addr.clone(), demangle);
            out.push(match &f.location {
                Some(loc) => format!("#{i:<width$}  {what}  ({loc})"),
                None => format!("#{i:<width$}  {what}"),
            });
            i += 1;
            continue;
        }
        let start = i;
        while i < frames.len() && fold_of(&frames[i]) == fold {
            i += 1;
        }
        let n = i - start;
        // A single unresolved frame between known ones says more as its address than folded.
        if fold == Fold::Unresolved && n == 1 {
            let f = &frames[start];
            out.push(format!("#{start:<width$}  {}", f.symbol.as_deref().unwrap_or(&f.addr)));
            continue;
        }
        let what = match fold {
            Fold::Handler => "of the crash handler capturing the stack",
            Fold::Runtime => "of the runtime (call shims, catch_unwind, start-up)",
            Fold::Unresolved => "without a symbol (addresses in result.json)",
            Fold::Keep => unreachable!("kept frames are not folded"),
        };
        let frames_word = if n == 1 { "frame" } else { "frames" };
        out.push(format!("{:<w$}  {n} {frames_word} {what}", "…", w = width + 1));
    }
    out
}

/// Whose stack a rank's crash backtrace is, as the report titles it: `rank 0`, or `data-loader
/// worker 0 (pid 5567) of rank 0` when the evidence says a worker crashed (the rank itself was
/// not killed by a signal, and the frames run the loader worker's loop); with the signal when it is
/// known (the rank's own, or the one the rank's error names).
pub(crate) fn backtrace_owner(r: &RankResult) -> (String, String) {
    let in_worker = r.signal.is_none()
        && r.backtrace.iter().any(|f| f.symbol.as_deref().is_some_and(|s| s.contains("loader::worker::")));
    let signal = match r.signal {
        Some(sig) => sig.name(),
        None => r
            .error
            .as_deref()
            .and_then(|e| e.split_once("killed by signal: "))
            .map(|(_, rest)| rest.split(['.', '\n']).next().unwrap_or(rest).trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "crash".to_string()),
    };
    if !in_worker {
        return (format!("rank {}", r.rank), signal);
    }
    let pid = r.error.as_deref().and_then(|e| {
        let rest = e.split_once("(pid ")?.1;
        rest.split(')').next()?.trim().parse::<u32>().ok()
    });
    let worker = pid.and_then(|p| r.workers.iter().find(|w| w.pid == p));
    let who = match (worker, pid) {
        (Some(w), _) => format!("data-loader worker {} (pid {}) of rank {}", w.id, w.pid, r.rank),
        (None, Some(p)) => format!("a data-loader worker (pid {p}) of rank {}", r.rank),
        (None, None) => format!("a data-loader worker of rank {}", r.rank),
    };
    (who, signal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(symbol: &str) -> Frame {
        Frame { addr: "0x1".into(), symbol: Some(symbol.into()), location: None }
    }

    #[test]
    fn cpp_and_rust_names_are_demangled() {
        assert_eq!(
            demangle("_ZN3c1019UndefinedTensorImpl10_singletonE"),
            "c10::UndefinedTensorImpl::_singleton"
        );
        assert_eq!(demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"), "core::ptr::drop_in_place");
        assert_eq!(demangle("ups_doctor_trainer::run"), "ups_doctor_trainer::run");
    }

    #[test]
    fn handler_runtime_and_unresolved_runs_fold_into_one_line_each() {
        let frames = vec![
            f("backtrace::backtrace::trace"),
            f("ups_doctor_trainer::crash::on_fatal_signal"),
            f("<libc.so.6+0x3c050>"),
            f("ups_doctor_trainer::faults::inject_segv"),
            f("<ups-doctor+0x730136>"),
            f("<ups-doctor+0x730137>"),
            f("_ZN2at6native12_GLOBAL__N_110add_kernelERNS_18TensorIteratorBaseERKN3c106ScalarE"),
            f("std::rt::lang_start_internal"),
            f("__rust_try"),
            f("__libc_start_main"),
            f("_start"),
        ];
        let text = lines(&frames).join("\n");
        assert!(text.contains("2 frames of the crash handler"), "{text}");
        assert!(text.contains("#2   <libc.so.6+0x3c050>"), "{text}");
        assert!(text.contains("#3   ups_doctor_trainer::faults::inject_segv"), "{text}");
        assert!(text.contains("2 frames without a symbol"), "{text}");
        assert!(
            text.contains(
                "at::native::(anonymous namespace)::add_kernel(at::TensorIteratorBase&, c10::Scalar const&)"
            ),
            "{text}"
        );
        assert!(text.contains("4 frames of the runtime"), "{text}");
        assert!(!text.contains("__rust_try") && !text.contains("_ZN2at"), "{text}");
    }

    #[test]
    fn a_workers_crash_reached_through_its_rank_is_titled_with_the_worker() {
        let mut r = crate::report::fixtures::rank(0, 2);
        r.signal = None;
        r.exit_code = Some(1);
        r.error =
            Some("DataLoader worker (pid 5567) is killed by signal: Bus error. It is possible that …".into());
        r.workers = vec![crate::schema::WorkerInfo {
            id: 1,
            pid: 5567,
            start_method: "fork".into(),
            started_at_s: 0.5,
        }];
        r.backtrace =
            vec![f("tch::wrappers::tensor::Tensor::copy_"), f("ups_doctor_trainer::loader::worker::serve")];
        assert_eq!(
            backtrace_owner(&r),
            ("data-loader worker 1 (pid 5567) of rank 0".to_string(), "Bus error".to_string())
        );
        // The rank's own crash stays the rank's.
        r.signal = Some(crate::schema::Signal::SEGV);
        r.backtrace = vec![f("ups_doctor_trainer::faults::inject_segv")];
        assert_eq!(backtrace_owner(&r), ("rank 0".to_string(), "SIGSEGV".to_string()));
    }
}
