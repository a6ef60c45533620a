//! What "the same failure" means to bisect.
//!
//! A cut is only taken when the cut-down scenario fails *the same way* as the original: the same
//! outcome class, the same signal or exit code, in a process of the same role, in the same phase,
//! and, for a program of the user's own (which has no phase markers, and whose every Python
//! exception ends in `exit 1`), what the judge saw: the pattern it established, the signal of the
//! process that died first where that was not the rank itself (a DataLoader worker's `SIGSEGV`
//! behind its rank's `exit 1`), the exception's type and the stable part of the key line.
//! "Any failure" is not enough: a cut that turns a segfault in `forward` into a hang in
//! `data.next`, or a worker's segfault into PyTorch's `ValueError` for `batch_size=0`, has found a
//! different bug, and is reported as such instead of being followed.

use serde::{Deserialize, Serialize};

use crate::scenario::OutcomeKind;
use crate::schema::{ProcessRole, RankResult, ScenarioResult, Signal};

/// The identity of a failure, as far as bisect compares failures.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signature {
    /// How the failing process ended.
    pub outcome: OutcomeKind,
    /// The signal (`SIGSEGV`), for `signaled`.
    pub signal: Option<Signal>,
    /// The exit status, for `exited`.
    pub exit_code: Option<i32>,
    /// The role of the failing process: `rank` today, `worker` once data-loader workers land.
    pub role: ProcessRole,
    /// The failing process's last phase (`forward`, `model.build/conditioner`).
    pub phase: Option<String>,
    /// The known failure pattern the judge established (`worker-killed-by-signal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// The signal of the process that died first, where that was not the failing rank itself: a
    /// DataLoader worker's `SIGSEGV` (PyTorch's `is killed by signal: Segmentation fault.`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub died_first: Option<Signal>,
    /// The type of the exception the key line names (`ValueError`, `torch.OutOfMemoryError`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<String>,
    /// The key line's stable part: numbers, addresses and folders that vary from run to run
    /// replaced (`RuntimeError: DataLoader worker (pid(s) N) exited unexpectedly
    /// (train.py:N in <module>)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl Signature {
    /// One line for reports: "signaled SIGSEGV in a rank at `forward`",
    /// "exited with code 1 in a rank at `backward`", "hung in a worker", "exited with code 1 in
    /// a rank after a process died of SIGSEGV [worker-killed-by-signal]: `RuntimeError: …`".
    /// Which rank is not part of the failure's identity: a cut of the rank count moves it.
    pub fn describe(&self) -> String {
        let mut out = match self.outcome {
            OutcomeKind::FalseSuccess => "false success".to_string(),
            OutcomeKind::TimedOut => "timed out".to_string(),
            OutcomeKind::LaunchFailed => "launch failed".to_string(),
            other => other.as_str().to_string(),
        };
        if let Some(signal) = self.signal {
            out.push(' ');
            out.push_str(&signal.name());
        }
        if let Some(code) = self.exit_code {
            out.push_str(&format!(" with code {code}"));
        }
        match self.role {
            ProcessRole::Other => out.push_str(" in a process"),
            role => out.push_str(&format!(" in a {role}")),
        }
        if let Some(phase) = &self.phase {
            out.push_str(&format!(" at `{phase}`"));
        }
        if let Some(signal) = self.died_first {
            out.push_str(&format!(" after a process of it died of {}", signal.name()));
        }
        if let Some(pattern) = &self.pattern {
            out.push_str(&format!(" [{pattern}]"));
        }
        match (&self.key, &self.exception) {
            (Some(key), _) => out.push_str(&format!(": `{key}`")),
            (None, Some(exception)) => out.push_str(&format!(": `{exception}`")),
            (None, None) => {}
        }
        out
    }

    /// The failure signature of a run: the first failing rank's class, signal or exit code, and
    /// phase; for a command of the user's own also what the judge saw: its pattern, and for a
    /// rank that exited with an error status the signal of what died first, the exception and
    /// the key line's stable part. `None` when it passed. A failed run whose judge named no first failure (ranks that failed alike) is
    /// read from its lowest failed rank: which rank is no part of the identity.
    pub fn of(result: &ScenarioResult) -> Observation {
        let failed = match result.first_failure {
            Some(f) => result.ranks.iter().find(|r| r.rank == f),
            None if result.outcome != OutcomeKind::Passed => {
                result.ranks.iter().filter(|r| r.outcome != OutcomeKind::Passed).min_by_key(|r| r.rank)
            }
            None => None,
        }?;
        let mut signature = Signature {
            outcome: failed.outcome,
            signal: failed.signal,
            exit_code: (failed.outcome == OutcomeKind::Exited).then_some(failed.exit_code).flatten(),
            role: ProcessRole::Rank,
            // Masked here, by the one rule every output follows (a program names its phases and
            // writes its key lines), so that the signature a probe shows equals the one its masked
            // cache entry gives back on a re-run.
            phase: failed.last_phase.as_deref().map(|p| crate::secrets::scrub(p).into_owned()),
            pattern: None,
            died_first: None,
            exception: None,
            key: None,
        };
        if result.scenario.command.is_some() {
            signature.pattern = result.verdict.pattern.clone();
            // A rank a signal killed is told by that signal; the words around a native crash (a
            // fault handler's lines, a peer's abort during teardown) come and go from run to run
            // (`bisect::a_torchrun_command_over_two_nodes`: `Fatal Python error: Aborted` in one
            // confirm run of two). A rank that exited with an error status is told by its error.
            if failed.outcome != OutcomeKind::Exited {
                return Some(signature);
            }
            let key_line = result.verdict.key_line.as_deref().or(failed.error.as_deref());
            signature.died_first = died_first(failed);
            signature.exception = key_line.and_then(exception_type).map(str::to_string);
            signature.key = key_line.map(|line| crate::secrets::scrub(&stable_part(line)).into_owned());
        }
        Some(signature)
    }
}

/// The signal PyTorch says killed one of the rank's DataLoader workers (`DataLoader worker (pid
/// 123) is killed by signal: Segmentation fault.`), in the rank's quoted lines or its log's tail.
fn died_first(rank: &RankResult) -> Option<Signal> {
    const NEEDLE: &str = "is killed by signal: ";
    let quoted = rank.quotes.iter().flat_map(|q| q.lines.iter());
    let words = quoted
        .chain(rank.log_tail.iter())
        .filter(|l| l.contains("DataLoader worker (pid"))
        .find_map(|l| Some(l[l.find(NEEDLE)? + NEEDLE.len()..].to_string()))?;
    // `strsignal`'s words, as Python's `signal.strsignal` gives them to PyTorch.
    const WORDS: [(&str, Signal); 7] = [
        ("Segmentation fault", Signal::SEGV),
        ("Bus error", Signal::BUS),
        ("Killed", Signal::KILL),
        ("Aborted", Signal::ABRT),
        ("Floating point exception", Signal::FPE),
        ("Illegal instruction", Signal::ILL),
        ("Terminated", Signal::TERM),
    ];
    WORDS.iter().find(|(w, _)| words.starts_with(w)).map(|(_, s)| *s)
}

/// The exception type a key line opens with (`ValueError: …`, `torch.OutOfMemoryError: …`);
/// `None` for a line that is not a Python exception's (`Fatal Python error: …`).
fn exception_type(line: &str) -> Option<&str> {
    let line = line.trim();
    let end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')).unwrap_or(line.len());
    let name = &line[..end];
    let identifier = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let exception = end == line.len() || line[end..].starts_with(':');
    (identifier && exception && !name.ends_with('.')).then_some(name)
}

/// The part of a key line that stays the same from run to run of the same failure: every number
/// (pids, addresses, sizes, times, line numbers) is `N`, a list of them one `N` (`(pid(s) N)`
/// whatever the count of workers), and a path is its last part (temporary folders differ).
pub fn stable_part(line: &str) -> String {
    const LONG: usize = 200;
    let words: Vec<String> = line.split_whitespace().map(last_part).collect();
    let chars: Vec<char> = words.join(" ").chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if !c.is_ascii_digit() {
            out.push(c);
            continue;
        }
        // A number: decimal (`1.25`, `1_000`), or `0x` and hex digits.
        let hex = c == '0' && chars.get(i).is_some_and(|n| *n == 'x' || *n == 'X');
        if hex {
            i += 1;
        }
        while let Some(&n) = chars.get(i) {
            let joined = (n == '.' || n == '_') && chars.get(i + 1).is_some_and(char::is_ascii_digit);
            if n.is_ascii_digit() || (hex && n.is_ascii_hexdigit()) || joined {
                i += 1;
            } else {
                break;
            }
        }
        // `N, N, N` is one list of numbers.
        if out.ends_with("N, ") {
            out.truncate(out.len() - 2);
        } else {
            out.push('N');
        }
    }
    let out = out.trim_end_matches('.').to_string();
    match out.char_indices().nth(LONG) {
        Some((cut, _)) => out[..cut].to_string(),
        None => out,
    }
}

/// A word that names a path (`'/tmp/tmpab12/x.bin',`, `./data/x`) as its last part (`'x.bin',`),
/// the quotes and punctuation around it kept; other words (`and/or`) as they are.
fn last_part(word: &str) -> String {
    let starts_path = |i: usize| {
        let before = word[..i].trim_end_matches('.');
        before.chars().all(|c| !c.is_alphanumeric() && c != '_')
    };
    let Some(start) = word.find('/').filter(|&i| starts_path(i)) else { return word.to_string() };
    let start = word[..start].rfind(|c: char| c != '.').map_or(0, |i| i + 1);
    let (open, rest) = word.split_at(start);
    let end = rest.rfind(|c: char| c.is_alphanumeric() || c == '_' || c == '-').map_or(rest.len(), |i| i + 1);
    let (path, close) = rest.split_at(end);
    match path.rsplit('/').find(|p| !p.is_empty() && *p != "." && *p != "..") {
        Some(last) => format!("{open}{last}{close}"),
        None => word.to_string(),
    }
}

/// What one run of a candidate showed: `None` means the run passed, `Some` the failure it had.
pub type Observation = Option<Signature>;

#[cfg(test)]
mod tests {
    use super::*;

    fn signature(outcome: OutcomeKind) -> Signature {
        Signature {
            outcome,
            signal: None,
            exit_code: None,
            role: ProcessRole::Rank,
            phase: None,
            pattern: None,
            died_first: None,
            exception: None,
            key: None,
        }
    }

    #[test]
    fn describe_reads_as_one_phrase() {
        let segv = Signature {
            signal: Some(Signal::SEGV),
            phase: Some("forward".into()),
            ..signature(OutcomeKind::Signaled)
        };
        assert_eq!(segv.describe(), "signaled SIGSEGV in a rank at `forward`");
        let exited = Signature {
            exit_code: Some(1),
            phase: Some("backward".into()),
            ..signature(OutcomeKind::Exited)
        };
        assert_eq!(exited.describe(), "exited with code 1 in a rank at `backward`");
        assert_eq!(signature(OutcomeKind::TimedOut).describe(), "timed out in a rank");
        assert_eq!(
            Signature { role: ProcessRole::Worker, ..signature(OutcomeKind::Hung) }.describe(),
            "hung in a worker"
        );
        let other = Signature { role: ProcessRole::Other, ..signature(OutcomeKind::Exited) };
        assert_eq!(other.describe(), "exited in a process");
    }

    #[test]
    fn signatures_that_differ_in_any_part_are_different_failures() {
        let a = Signature { phase: Some("forward".into()), ..signature(OutcomeKind::Hung) };
        let b = Signature { phase: Some("backward".into()), ..signature(OutcomeKind::Hung) };
        assert_ne!(a, b);
        assert_ne!(a, Signature { role: ProcessRole::Worker, ..a.clone() });
        assert_eq!(a, a.clone());
    }

    #[test]
    fn the_stable_part_of_a_key_line_drops_what_varies_from_run_to_run() {
        let cases = [
            (
                "RuntimeError: DataLoader worker (pid(s) 9682, 9683) exited unexpectedly (loader_crash.py:45 in <module>)",
                "RuntimeError: DataLoader worker (pid(s) N) exited unexpectedly (loader_crash.py:N in <module>)",
            ),
            (
                "RuntimeError: DataLoader worker (pid(s) 12) exited unexpectedly (loader_crash.py:45 in <module>)",
                "RuntimeError: DataLoader worker (pid(s) N) exited unexpectedly (loader_crash.py:N in <module>)",
            ),
            (
                "ValueError: batch_size should be a positive integer value, but got batch_size=0 (t.py:43 in <module>)",
                "ValueError: batch_size should be a positive integer value, but got batch_size=N (t.py:N in <module>)",
            ),
            (
                "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/tmpab12x/shard-3.bin' (t.py:9 in load)",
                "FileNotFoundError: [Errno N] No such file or directory: 'shard-N.bin' (t.py:N in load)",
            ),
            (
                "Fatal Python error: Segmentation fault at 0x7f3a2b1c00 and/or ./data/x",
                "Fatal Python error: Segmentation fault at N and/or x",
            ),
            ("RuntimeError: took 1.25 s.", "RuntimeError: took N s"),
        ];
        for (line, stable) in cases {
            assert_eq!(stable_part(line), stable, "{line}");
        }
    }

    #[test]
    fn the_exception_type_is_read_only_from_an_exception_line() {
        assert_eq!(exception_type("ValueError: bad (t.py:4 in f)"), Some("ValueError"));
        assert_eq!(
            exception_type("torch.OutOfMemoryError: CUDA out of memory"),
            Some("torch.OutOfMemoryError")
        );
        assert_eq!(exception_type("KeyboardInterrupt"), Some("KeyboardInterrupt"));
        assert_eq!(exception_type("Fatal Python error: Segmentation fault"), None);
        assert_eq!(exception_type("terminate called after throwing"), None);
        assert_eq!(exception_type("[enforce fail at pair.cc:12] x"), None);
    }

    #[test]
    fn a_worker_segfault_and_a_refused_argument_are_different_failures_of_one_exit_status() {
        let worker = Signature {
            exit_code: Some(1),
            pattern: Some("worker-killed-by-signal".into()),
            died_first: Some(Signal::SEGV),
            exception: Some("RuntimeError".into()),
            key: Some(stable_part("RuntimeError: DataLoader worker (pid(s) 9682, 9683) exited unexpectedly")),
            ..signature(OutcomeKind::Exited)
        };
        let refused = Signature {
            exit_code: Some(1),
            exception: Some("ValueError".into()),
            key: Some(stable_part(
                "ValueError: batch_size should be a positive integer value, but got batch_size=0",
            )),
            ..signature(OutcomeKind::Exited)
        };
        assert_ne!(worker, refused);
        assert_eq!(
            worker.describe(),
            "exited with code 1 in a rank after a process of it died of SIGSEGV [worker-killed-by-signal]: \
             `RuntimeError: DataLoader worker (pid(s) N) exited unexpectedly`"
        );
        // One worker or two: the same failure.
        let one = stable_part("RuntimeError: DataLoader worker (pid(s) 9682) exited unexpectedly");
        assert_eq!(worker.key.as_deref(), Some(one.as_str()));
    }
}
