//! What every process of a scenario left, normalised so that a pattern reads it the same way for
//! the built-in trainer and for a user's own program: how each rank ended and who ended it, the
//! key error line (not PyTorch's trailing hints), stack frames from in-process dumps and from
//! `py-spy dump --native` alike, and the OOM kills, `/dev/shm` and memory figures beside them.
//! Pure: results in, evidence out.

use crate::scenario::{OutcomeKind, Scenario};
use crate::schema::{
    CgroupReport, ExitSource, GpuXid, LauncherEnd, Leftovers, MemoryReport, OomKill, ProcessRole, QuoteKind,
    RankResult, ScenarioResult, Signal, SilentCpu, ThreadStack,
};

/// The line that says what went wrong, and where in the user's code.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyLine {
    /// `ValueError: corrupt sample at index 5`, `Fatal Python error: Segmentation fault`, the
    /// `what():` of a C++ exception.
    pub text: String,
    /// The innermost frame in the user's own code: `train.py:66 in __getitem__`.
    pub at: Option<String>,
    /// Python's fault handler dumped the stacks as the process died of a fatal signal: the line
    /// is its `Fatal Python error: …`, or the `what():` of the C++ exception whose uncaught
    /// throw aborted the process just before the dump.
    pub fatal: bool,
}

impl KeyLine {
    /// Whether it is a Python exception's line (`RuntimeError: …`): the program raised, and its
    /// exit handlers ran after that, not after its code had finished.
    pub fn is_exception(&self) -> bool {
        !self.fatal && looks_like_exception(&self.text)
    }

    /// `ValueError: x (train.py:66 in __getitem__)`; a message of several sentences (PyTorch's
    /// DDP errors run to a paragraph) is cut after its first sentence.
    pub fn render(&self) -> String {
        const LONG: usize = 200;
        // A long C++ message opens with where it was thrown (`[enforce fail at …/pair.cc:456] `,
        // `[/pytorch/…/pair.cc:538] `): the words after it say what went wrong.
        let text = match self.text.strip_prefix('[').and_then(|t| t.split_once("] ")) {
            Some((place, rest)) if self.text.len() > LONG && is_source_place(place) => rest.trim_start(),
            _ => self.text.as_str(),
        };
        let text = match text.find(". ") {
            Some(end) if text.len() > LONG && end + 1 < LONG => format!("{} …", &text[..=end]),
            _ => text.to_string(),
        };
        match &self.at {
            Some(at) => format!("{text} ({at})"),
            None => text,
        }
    }
}

/// `enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456`: a C++ source file
/// and line, as native libraries open their messages with.
fn is_source_place(place: &str) -> bool {
    let Some((file, line)) = place.rsplit_once(':') else { return false };
    let native = [".cc", ".cpp", ".cu", ".h", ".hpp", ".c"].iter().any(|ext| file.ends_with(ext));
    native && !line.is_empty() && line.chars().all(|c| c.is_ascii_digit())
}

/// One stack frame, whichever tool wrote it: innermost first in a [`Thread`].
#[derive(Debug, Clone, PartialEq)]
pub struct StackFrame {
    /// `c10d::Reducer::finalize_backward`, `barrier`, `0x7f30…` for an anonymous one.
    pub function: String,
    /// The library (`libgomp.so.1`) or the source position (`torch/_tensor.py:581`).
    pub place: Option<String>,
}

impl StackFrame {
    /// Whether the function or its place contains `needle`.
    pub fn mentions(&self, needle: &str) -> bool {
        self.function.contains(needle) || self.place.as_deref().is_some_and(|p| p.contains(needle))
    }
}

/// One thread of one process of a rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    /// The rank's own process, or a child of it (a DataLoader worker, a forked child).
    pub in_child: bool,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub name: String,
    pub frames: Vec<StackFrame>,
    /// Where the kernel has it waiting: its system call (`202 (futex)`) or wait channel, when it
    /// was looked at from outside.
    pub wait: Option<String>,
}

/// Who ended a rank.
#[derive(Debug, Clone, PartialEq)]
pub enum EndedBy {
    /// It exited by itself (any status) or crashed on its own signal.
    Itself,
    /// ups-doctor tore it down (after a hang, an overrun, or another rank's failure).
    Teardown { signal: Signal },
    /// The kernel's OOM killer, as the cgroup or the kernel log recorded it.
    OomKiller,
    /// A signal nobody in the run is known to have sent (SIGKILL, SIGTERM from outside).
    Outside { signal: Signal },
    /// Its launcher said it sent the signal (torchrun's `Sending process N closing signal
    /// SIGTERM`, after another rank failed): the rank may have been on its way out already.
    Launcher { signal: Signal },
    /// A cluster's worker (Ray Train's) that the cluster ended as the job ended (see
    /// `ExitSource::Cluster`): with no error of its own and not named by the cluster as a failed
    /// rank, or named with the error it relayed, then ended by the cluster's SIGKILL or SIGTERM.
    Cluster,
    /// It could not be started, or how it ended was not observed.
    Unknown,
}

/// One rank and what it left.
#[derive(Debug, Clone)]
pub struct RankEvidence<'a> {
    pub result: &'a RankResult,
    /// What it printed that matters, `[rankN]:` prefixes removed: its error, the quoted blocks,
    /// its log tail.
    pub text: Vec<String>,
    pub key: Option<KeyLine>,
    pub threads: Vec<Thread>,
    pub ended_by: EndedBy,
}

impl RankEvidence<'_> {
    pub fn rank(&self) -> u32 {
        self.result.rank
    }

    /// Whether any line it printed contains `needle`.
    pub fn said(&self, needle: &str) -> bool {
        self.text.iter().any(|l| l.contains(needle))
    }

    /// The first line it printed that contains `needle`.
    pub fn line_with(&self, needle: &str) -> Option<&str> {
        self.text.iter().find(|l| l.contains(needle)).map(String::as_str)
    }

    pub fn failed(&self) -> bool {
        self.result.outcome != OutcomeKind::Passed
    }
}

/// Everything the judge reads about one scenario.
#[derive(Debug, Clone)]
pub struct Evidence<'a> {
    pub scenario: &'a Scenario,
    /// A user's own program (not the built-in trainer): texts about markers and the trainer's
    /// phases do not apply.
    pub foreign: bool,
    pub ranks: Vec<RankEvidence<'a>>,
    pub memory: Option<&'a MemoryReport>,
    pub leftovers: &'a Leftovers,
    pub oom_kills: &'a [OomKill],
    /// Xids the NVIDIA driver logged during the scenario.
    pub xids: &'a [GpuXid],
    pub cgroup: Option<&'a CgroupReport>,
    pub launcher: Option<&'a LauncherEnd>,
}

/// What the judge is given: the scenario and every rank's result with what was measured around
/// them.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub scenario: &'a Scenario,
    pub ranks: &'a [RankResult],
    pub wall_s: f64,
    pub memory: Option<&'a MemoryReport>,
    pub leftovers: &'a Leftovers,
    pub oom_kills: &'a [OomKill],
    /// Xids the NVIDIA driver logged during the scenario.
    pub xids: &'a [GpuXid],
    pub cgroup: Option<&'a CgroupReport>,
    pub launcher: Option<&'a LauncherEnd>,
}

impl<'a> Observed<'a> {
    /// What the judge reads of a result: the one way evidence is built, for every caller, so that
    /// what was judged is what `result.json` keeps.
    pub fn of(result: &'a ScenarioResult) -> Observed<'a> {
        Observed {
            scenario: &result.scenario,
            ranks: &result.ranks,
            wall_s: result.wall_s,
            memory: result.memory.as_ref(),
            leftovers: &result.leftovers,
            oom_kills: &result.oom_kills,
            xids: &result.xids,
            cgroup: result.cgroup.as_ref(),
            launcher: result.external.as_ref().and_then(|e| e.launcher.as_ref()),
        }
    }
}

impl<'a> Evidence<'a> {
    pub fn gather(o: &Observed<'a>) -> Self {
        let foreign = o.scenario.is_external();
        let ranks = o.ranks.iter().map(|r| rank_evidence(r, foreign, o.oom_kills, o.launcher)).collect();
        Evidence {
            scenario: o.scenario,
            foreign,
            ranks,
            memory: o.memory,
            leftovers: o.leftovers,
            oom_kills: o.oom_kills,
            xids: o.xids,
            cgroup: o.cgroup,
            launcher: o.launcher,
        }
    }

    /// When ups-doctor began to end a run whose ranks it found hung or out of time: the earliest
    /// moment a rank was declared hung, or the scenario's time limit; `None` for a run whose ranks
    /// ended by themselves. What a rank did after it (a collective its SIGTERM handler issued) is
    /// its reaction to the teardown, not evidence of what went wrong.
    pub fn teardown_began_at(&self) -> Option<f64> {
        let hung = self.ranks.iter().filter_map(|r| r.result.hung_at_s);
        let limit = self
            .ranks
            .iter()
            .any(|r| r.result.outcome == OutcomeKind::TimedOut)
            .then_some(self.scenario.limits.timeout_s);
        hung.chain(limit).min_by(f64::total_cmp)
    }

    /// torchrun's own account of the first failure (its "Root Cause" block), in one line.
    pub fn launcher_summary(&self) -> Option<String> {
        let quote = self.launcher?.quotes.iter().find(|q| q.title == QuoteKind::TorchrunRootCause)?;
        let field = |name: &str| {
            quote.lines.iter().find_map(|l| {
                let (key, value) = l.split_once(':')?;
                (key.trim() == name).then(|| value.trim().to_string())
            })
        };
        Some(format!(
            "torchrun's summary names rank {} as the root cause (first observed failure), exitcode {}",
            field("rank")?,
            field("exitcode")?
        ))
    }

    pub fn rank(&self, rank: u32) -> Option<&RankEvidence<'a>> {
        self.ranks.iter().find(|r| r.rank() == rank)
    }

    /// OOM kills of `rank`'s processes (itself or its workers).
    pub fn oom_kills_of(&self, rank: u32) -> impl Iterator<Item = &OomKill> {
        self.oom_kills.iter().filter(move |k| k.rank == Some(rank))
    }
}

fn rank_evidence<'a>(
    r: &'a RankResult,
    foreign: bool,
    oom_kills: &[OomKill],
    launcher: Option<&LauncherEnd>,
) -> RankEvidence<'a> {
    let mut text: Vec<String> = r.error.iter().cloned().collect();
    for q in &r.quotes {
        text.extend(q.lines.iter().cloned());
    }
    text.extend(r.log_tail.iter().cloned());
    let text: Vec<String> = text.iter().map(|l| strip_rank_prefix(l).to_string()).collect();
    // The built-in trainer reports its error in a marker. A program's own output comes first:
    // the helper's `error` marker is one line of it, without the frame it was raised in.
    let from_marker =
        || r.error.as_ref().map(|e| KeyLine { text: e.trim().to_string(), at: None, fatal: false });
    let key = if foreign {
        key_line(&text[usize::from(r.error.is_some())..]).or_else(from_marker)
    } else {
        from_marker().or_else(|| key_line(&text))
    };
    let mut threads: Vec<Thread> = r.stacks.iter().map(in_process_thread).collect();
    for dump in &r.dumps {
        let in_child = dump.role != ProcessRole::Rank;
        if let Some(text) = &dump.py_spy {
            for (tid, name, frames) in py_spy_threads(text) {
                let kernel = dump.threads.iter().find(|k| Some(k.tid) == tid);
                let wait = kernel.and_then(|k| k.syscall.clone().or_else(|| k.wchan.clone()));
                threads.push(Thread { in_child, pid: Some(dump.pid), tid, name, frames, wait });
            }
        }
        if let Some(text) = &dump.python {
            for (name, frames) in fault_handler_threads(text) {
                threads.push(Thread { in_child, pid: Some(dump.pid), tid: None, name, frames, wait: None });
            }
        }
    }
    let killed_by_oom = r.pid.is_some_and(|pid| oom_kills.iter().any(|k| k.pid == pid));
    let ended_by = match (r.outcome, r.torn_down_with, r.signal) {
        (_, _, _) if killed_by_oom => EndedBy::OomKiller,
        (OutcomeKind::LaunchFailed, _, _) => EndedBy::Unknown,
        (OutcomeKind::Hung | OutcomeKind::TimedOut, Some(sent), _) => EndedBy::Teardown { signal: sent },
        (_, Some(sent), _) => EndedBy::Teardown { signal: sent },
        (OutcomeKind::Signaled, None, Some(sig)) if launcher_sent(launcher, r.pid, sig) => {
            EndedBy::Launcher { signal: sig }
        }
        // The cluster's SIGKILL or SIGTERM to its worker, not a stranger's.
        (OutcomeKind::Signaled, None, Some(Signal::KILL | Signal::TERM))
            if matches!(r.exit_source, Some(ExitSource::Cluster | ExitSource::ClusterAfterError)) =>
        {
            EndedBy::Cluster
        }
        (
            OutcomeKind::Signaled,
            None,
            Some(sig @ (Signal::KILL | Signal::TERM | Signal::INT | Signal::HUP)),
        ) => EndedBy::Outside { signal: sig },
        // Its end was not read (its launcher reaped it), but it wrote its stacks as SIGTERM came:
        // its launcher's, where the launcher said it sent it.
        (OutcomeKind::Exited, None, None) if r.exit_code.is_none() && got_sigterm(r) => {
            match launcher_sent(launcher, r.pid, Signal::TERM) {
                true => EndedBy::Launcher { signal: Signal::TERM },
                false => EndedBy::Outside { signal: Signal::TERM },
            }
        }
        (OutcomeKind::Exited, None, None) if r.exit_code.is_none() => EndedBy::Unknown,
        (OutcomeKind::Exited | OutcomeKind::Signaled, None, _)
            if r.exit_source == Some(ExitSource::Cluster) =>
        {
            EndedBy::Cluster
        }
        _ => EndedBy::Itself,
    };
    RankEvidence { result: r, text, key, threads, ended_by }
}

/// Whether the rank itself wrote its stacks as SIGTERM stopped it (the observer's handler).
fn got_sigterm(r: &RankResult) -> bool {
    r.dumps
        .iter()
        .any(|d| d.role == ProcessRole::Rank && d.taken.as_deref() == Some(crate::schema::TAKEN_AT_SIGTERM))
}

/// Whether the launcher's output says it sent `signal` to `pid` (torchrun's elastic agent:
/// `Sending process 798 closing signal SIGTERM`; `torch.multiprocessing.spawn`: `Terminating
/// process 798 via signal SIGTERM`).
fn launcher_sent(launcher: Option<&LauncherEnd>, pid: Option<u32>, signal: Signal) -> bool {
    let (Some(l), Some(pid)) = (launcher, pid) else { return false };
    let name = signal.name();
    let said = [
        format!("Sending process {pid} closing signal {name}"),
        format!("Terminating process {pid} via signal {name}"),
    ];
    l.log_tail
        .iter()
        .chain(l.quotes.iter().flat_map(|q| q.lines.iter()))
        .chain(&l.signalled)
        .any(|line| said.iter().any(|s| line.contains(s.as_str())))
}

/// A rank whose end was not observed (its launcher reaped it first) and that its launcher says
/// it signalled to stop, which torchrun and `torch.multiprocessing.spawn` do only to the ranks
/// still running once another has failed: nothing says it failed for a reason of its own.
pub fn stopped_by_launcher_unobserved(rank: &RankEvidence, launcher: Option<&LauncherEnd>) -> bool {
    matches!(rank.ended_by, EndedBy::Unknown)
        && [Signal::TERM, Signal::KILL].into_iter().any(|s| launcher_sent(launcher, rank.result.pid, s))
}

/// A rank its launcher says it stopped, seen to die of that signal, that shows nothing of a
/// failure of its own: no error line, and its program had not begun to exit. torchrun and
/// `torch.multiprocessing.spawn` stop ranks only once another has failed, so it is collateral
/// whenever another failed for its own reason, whatever the clocks say: the other's end may be
/// known only from the launcher's summary, read after this one's (a rank that failed at import,
/// before ups-doctor found its process).
pub fn stopped_by_launcher_while_running(rank: &RankEvidence) -> bool {
    matches!(rank.ended_by, EndedBy::Launcher { .. } | EndedBy::Cluster)
        && rank.key.is_none()
        && rank.result.error.is_none()
        && rank.result.observed.as_ref().and_then(|o| o.exiting_at_s).is_none()
}

/// `in `forward` at step 3`, `in `model.build/encoder``, or `before its first marker`.
pub fn location(rank: &RankResult) -> String {
    match (&rank.last_phase, rank.last_step) {
        (Some(p), Some(s)) => format!("in `{p}` at step {s}"),
        (Some(p), None) => format!("in `{p}`"),
        (None, _) => "before its first marker".to_string(),
    }
}

/// When a rank failed: a hung rank when its last marker came, any other when it ended.
/// The share of a core above which a rank silent at the time limit counts as busy there
/// (spinning or computing): a quarter, which a spinning process gets even on two cores shared by
/// eight; a rank waiting in a gloo collective or a store uses well under 1 %.
pub const BUSY_SILENCE_SHARE: f64 = 0.25;
/// The share below which it counts as waiting.
pub const IDLE_SILENCE_SHARE: f64 = 0.05;

/// A rank the run's time limit ended while it had been silent (no marker, no output) for
/// `limits.hang_after_s` or more: what its process did over the silence. Its CPU time is read once
/// a second, so the silence measured may fall up to two seconds short of the whole.
pub fn silent_at_limit(rank: &RankResult, scenario: &Scenario) -> Option<SilentCpu> {
    let s = rank.silent_cpu.filter(|_| rank.outcome == OutcomeKind::TimedOut)?;
    (s.silent_s + 2.0 >= scenario.limits.hang_after_s).then_some(s)
}

pub fn failure_time(rank: &RankResult) -> f64 {
    match rank.outcome {
        OutcomeKind::Hung => rank.last_marker_at_s.or(rank.last_output_at_s).unwrap_or(0.0),
        _ => rank.ended_at_s.or(rank.last_marker_at_s).unwrap_or(f64::INFINITY),
    }
}

/// A line of a launcher's output without PyTorch's `[rank3]: ` prefix.
fn strip_rank_prefix(line: &str) -> &str {
    if let Some(rest) = line.strip_prefix("[rank")
        && let Some((digits, rest)) = rest.split_once("]:")
        && digits.bytes().all(|b| b.is_ascii_digit())
    {
        return rest.strip_prefix(' ').unwrap_or(rest);
    }
    line
}

fn in_process_thread(t: &ThreadStack) -> Thread {
    Thread {
        in_child: t.thread.starts_with("loader-w"),
        pid: None,
        tid: u32::try_from(t.tid).ok(),
        wait: None,
        name: t.thread.clone(),
        frames: t
            .frames
            .iter()
            .map(|f| StackFrame {
                function: f.symbol.clone().unwrap_or_else(|| f.addr.clone()),
                place: f.location.clone(),
            })
            .collect(),
    }
}

/// A thread of a py-spy dump: its id, its name, its frames innermost first.
pub type PySpyThread = (Option<u32>, String, Vec<StackFrame>);

/// The threads of a `py-spy dump --native` text: `Thread 123 (idle): "MainThread"` followed by
/// indented frames `    function (place)`, innermost first.
pub fn py_spy_threads(text: &str) -> Vec<PySpyThread> {
    let mut out: Vec<PySpyThread> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Thread ") {
            let tid = rest.split_whitespace().next().and_then(|t| t.parse().ok());
            let name = rest.split_once('"').map_or(rest, |(_, n)| n.trim_end_matches('"')).to_string();
            out.push((tid, name, Vec::new()));
        } else if line.starts_with("    ")
            && let Some((_, _, frames)) = out.last_mut()
        {
            let frame = line.trim();
            let (function, place) = match frame.rfind(" (") {
                Some(i) if frame.ends_with(')') => {
                    (frame[..i].to_string(), Some(frame[i + 2..frame.len() - 1].to_string()))
                }
                _ => (frame.to_string(), None),
            };
            frames.push(StackFrame { function, place });
        }
    }
    out
}

/// The threads of a dump Python's `faulthandler` wrote as a signal stopped the process (the
/// observer's, whose first line names the main thread's id, which faulthandler does not): each
/// thread's name (`MainThread`, else `thread 0x…`) and frames, innermost first. A frame's place
/// is the file's name for the program's own files, else its whole path (which says it is the
/// standard library's or an installed package's).
pub fn fault_handler_threads(text: &str) -> Vec<(String, Vec<StackFrame>)> {
    let main = text.lines().next().and_then(|l| l.strip_prefix("main thread ")).map(str::trim);
    let mut out: Vec<(String, Vec<StackFrame>)> = Vec::new();
    for line in text.lines() {
        let header = line.strip_prefix("Current thread ").or_else(|| line.strip_prefix("Thread "));
        if let Some(rest) = header.filter(|_| line.contains("most recent call first")) {
            let id = rest.split_whitespace().next().unwrap_or_default();
            let name = if Some(id) == main { "MainThread".to_string() } else { format!("thread {id}") };
            out.push((name, Vec::new()));
        } else if let Some(rest) = line.trim_start().strip_prefix("File \"")
            && let Some((path, after)) = rest.split_once("\", line ")
            && let Some((number, function)) = after.split_once(" in ")
            && let Some((_, frames)) = out.last_mut()
        {
            let file = if is_user_path(path) { path.rsplit('/').next().unwrap_or(path) } else { path };
            frames.push(StackFrame {
                function: function.trim().to_string(),
                place: Some(format!("{file}:{number}")),
            });
        }
    }
    out
}

/// The key error line of what a process printed: the exception line of its last Python traceback
/// (not the hint PyTorch prints after it) with the innermost frame in the user's code; else
/// Python's fault handler's first line with the frame it names; else the `what():` of an uncaught
/// C++ exception; else the last line that reads like an error.
pub fn key_line(lines: &[String]) -> Option<KeyLine> {
    let lines: Vec<String> = lines.iter().map(|l| strip_rank_prefix(l).to_string()).collect();
    let lines = lines.as_slice();
    if lost_traceback(lines) {
        // What follows is Python's account of the failed write (`object repr : …Error…`), which
        // any fallback below would take for the error.
        return None;
    }
    python_exception(lines)
        .or_else(|| aborted_cpp_exception(lines))
        .or_else(|| fault_handler(lines))
        .or_else(|| cpp_exception(lines))
        .or_else(|| {
            last_error_line(lines).map(|text| KeyLine {
                text: text.trim().to_string(),
                at: None,
                fatal: false,
            })
        })
}

fn python_exception(lines: &[String]) -> Option<KeyLine> {
    let is_start = |l: &String| l.trim_start().ends_with("Traceback (most recent call last):");
    let start = lines.iter().rposition(is_start)?;
    let last = exception_at(lines, start)?;
    // An exception raised while another was handled (`During handling of the above exception,
    // another exception occurred:`: clean-up code that failed too, as Lightning's teardown does
    // when a DataLoader could not start): the first of the chain is where it began, said first.
    let mut root = None;
    let mut from = start;
    while let Some(before) = lines[..from].iter().rposition(|l| !l.trim().is_empty())
        && lines[before].trim() == HANDLING
        && let Some(earlier) = lines[..before].iter().rposition(is_start)
    {
        root = exception_at(lines, earlier).or(root);
        from = earlier;
    }
    Some(match root {
        // The user's frame of the first where it shows one (Python prints the first traceback from
        // where it was caught: often library frames only), else the last's.
        Some(root) => KeyLine {
            text: format!("{}; while handling it: {}", root.text, last.text),
            at: root.at.or(last.at),
            fatal: root.fatal,
        },
        None => last,
    })
}

/// Python's line between two tracebacks of an exception raised while another was handled.
pub const HANDLING: &str = "During handling of the above exception, another exception occurred:";

/// The exception of the traceback whose first line is `lines[start]`, with its innermost frame in
/// the user's code.
fn exception_at(lines: &[String], start: usize) -> Option<KeyLine> {
    let mut at = None;
    for line in &lines[start + 1..] {
        let trimmed = line.trim_start();
        if let Some(frame) = trimmed.strip_prefix("File \"") {
            if let Some(place) = user_frame(frame) {
                at = Some(place);
            }
            continue;
        }
        if line.starts_with(' ') || line.trim().is_empty() || trimmed.starts_with('^') {
            continue;
        }
        // A traceback cut off before its exception (Python lost stderr while printing it, and
        // wrote its own account of that instead: `object address  : 0x…`) has no key line.
        return looks_like_exception(line).then(|| KeyLine {
            text: line.trim().to_string(),
            at,
            fatal: false,
        });
    }
    None
}

/// `ValueError: …`, `torch.distributed.DistBackendError: …`, `KeyboardInterrupt`: a dotted name
/// first, then the end of the line or `:`.
fn looks_like_exception(line: &str) -> bool {
    let line = line.trim();
    let name_end =
        line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')).unwrap_or(line.len());
    let name = &line[..name_end];
    let starts_well = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    starts_well && (name_end == line.len() || line[name_end..].starts_with(':'))
}

/// Python's last words when it could not print a traceback: `lost sys.stderr`.
pub const LOST_STDERR: &str = "lost sys.stderr";

/// The last traceback was cut off: Python lost stderr while printing it.
fn lost_traceback(lines: &[String]) -> bool {
    let Some(lost) = lines.iter().rposition(|l| l.trim() == LOST_STDERR) else { return false };
    let traceback =
        lines.iter().rposition(|l| l.trim_start().ends_with("Traceback (most recent call last):"));
    traceback.is_some_and(|t| t < lost)
}

/// `patterns.py:66 in __getitem__` from `path", line 66, in __getitem__` when the path is the
/// user's own (not the standard library's or an installed package's).
fn user_frame(frame: &str) -> Option<String> {
    let (path, rest) = frame.split_once('"')?;
    if !is_user_path(path) {
        return None;
    }
    let line = rest.split("line ").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?;
    let func = rest.split(", in ").nth(1).or_else(|| rest.split(" in ").nth(1)).map(str::trim);
    let file = path.rsplit('/').next().unwrap_or(path);
    Some(match func {
        Some(f) => format!("{file}:{line} in {f}"),
        None => format!("{file}:{line}"),
    })
}

/// Whether a frame's file is the program's own: not the standard library's, an installed
/// package's, or a `sitecustomize.py`'s (ups-doctor's observer, or a fault injected from outside).
pub(crate) fn is_user_path(path: &str) -> bool {
    const NOT_USER: [&str; 7] = [
        "site-packages",
        "dist-packages",
        "/lib/python3",
        "<frozen",
        "/usr/lib/",
        "<string>",
        "sitecustomize.py",
    ];
    !NOT_USER.iter().any(|n| path.contains(n))
}

/// `Fatal Python error: Segmentation fault` and the first of the user's frames under it: in the
/// thread that faulted (faulthandler's `Current thread` block) when it names one, since the other
/// threads (a logger, ups-doctor's observer, a DataLoader's pin-memory thread) were only waiting.
fn fault_handler(lines: &[String]) -> Option<KeyLine> {
    let start = lines.iter().rposition(|l| l.starts_with("Fatal Python error:"))?;
    let dump: Vec<&String> =
        lines[start + 1..].iter().take_while(|l| !l.starts_with("Extension modules:")).collect();
    // Each thread's block, from its `Thread 0x…` or `Current thread 0x…` line.
    let heads: Vec<usize> = (0..dump.len())
        .filter(|&i| dump[i].starts_with("Thread 0x") || dump[i].starts_with("Current thread"))
        .collect();
    let frames = |head: usize| {
        let end = heads.iter().copied().find(|&h| h > head).unwrap_or(dump.len());
        dump[head + 1..end].iter().find_map(|l| l.trim_start().strip_prefix("File \"").and_then(user_frame))
    };
    // The thread that faulted, when Python was running in it; else (a library's own thread
    // crashed or aborted, which has no Python frames) the main thread, which faulthandler lists
    // last, then the others: where the program's own code was when it died.
    let current = heads.iter().copied().filter(|&h| dump[h].starts_with("Current thread"));
    let at = current.chain(heads.iter().rev().copied()).find_map(frames);
    Some(KeyLine { text: lines[start].trim().to_string(), at, fatal: true })
}

/// Whether the last dump of Python's fault handler in `lines` shows no thread running Python
/// code: at least one thread listed, each `<no Python frame>`. The main thread holds the
/// program's frames (`<module>` below every other) for as long as its code runs, so a dump in
/// which no thread has a frame came once that code had returned, while Python shut down.
/// `None` where there is no dump, or where its end is not seen: a line that is not the dump's
/// (another process's, in a shared output), or a dump long enough that a quote may have cut it
/// (`QUOTED_DUMP_LINES`; the main thread is listed last).
pub fn fault_handler_without_python(lines: &[String]) -> Option<bool> {
    /// A quote of the fault handler's lines keeps at most 20 (`harness::observe::quotes`).
    const QUOTED_DUMP_LINES: usize = 19;
    let start = lines.iter().rposition(|l| strip_rank_prefix(l).starts_with("Fatal Python error:"))?;
    let (mut threads, mut without, mut seen) = (0, 0, 0);
    for line in &lines[start + 1..] {
        let line = strip_rank_prefix(line).trim_end();
        let trimmed = line.trim_start();
        if line.starts_with("Extension modules:") {
            return Some(threads > 0 && without == threads);
        }
        seen += 1;
        if line.starts_with("Thread 0x") || line.starts_with("Current thread 0x") {
            threads += 1;
        } else if trimmed.starts_with("File \"") {
            return Some(false);
        } else if trimmed == "<no Python frame>" && threads > without {
            without += 1;
        } else if !line.is_empty() {
            return None;
        }
    }
    (seen < QUOTED_DUMP_LINES).then_some(threads > 0 && without == threads)
}

/// How many fault-handler dumps `lines` holds (a launcher's output shared by its ranks), when
/// every one of them shows no thread running Python code ([`fault_handler_without_python`]):
/// each came as its process shut down. `None` where there is none, or one that has a frame or
/// whose end is not seen.
pub fn fault_dumps_without_python(lines: &[String]) -> Option<usize> {
    let is_start = |l: &String| strip_rank_prefix(l).starts_with("Fatal Python error:");
    let starts: Vec<usize> = lines.iter().enumerate().filter(|(_, l)| is_start(l)).map(|(i, _)| i).collect();
    for (n, &at) in starts.iter().enumerate() {
        // Up to the next dump, and the C++ line just before it.
        let end = starts.get(n + 1).map_or(lines.len(), |&next| {
            if next > 0 && strip_rank_prefix(&lines[next - 1]).starts_with("terminate called") {
                next - 1
            } else {
                next
            }
        });
        if fault_handler_without_python(&lines[at..end]) != Some(true) {
            return None;
        }
    }
    (!starts.is_empty()).then_some(starts.len())
}

fn cpp_exception(lines: &[String]) -> Option<KeyLine> {
    let start = lines.iter().rposition(|l| l.contains("terminate called after throwing"))?;
    let what = lines[start..].iter().find_map(|l| l.split_once("what():").map(|(_, w)| w.trim().to_string()));
    Some(KeyLine {
        text: what.filter(|w| !w.is_empty()).unwrap_or_else(|| lines[start].trim().to_string()),
        at: None,
        fatal: false,
    })
}

/// The `what():` of the C++ exception whose uncaught throw aborted the process, when C++ printed
/// it just before Python's fault handler dumped the stacks (`terminate called after throwing an
/// instance of 'gloo::EnforceNotMet'`, `what(): … Received data size doesn't match expected
/// size …`): the library's own words for what went wrong, with where the program's code was.
fn aborted_cpp_exception(lines: &[String]) -> Option<KeyLine> {
    /// A `what():` runs to a few lines, or to a C++ backtrace (c10's `Exception raised from …`,
    /// `frame #0: …`), before the dump starts.
    const WHAT_LINES: usize = 60;
    let handler = fault_handler(lines)?;
    let start = lines.iter().rposition(|l| l.starts_with("Fatal Python error:"))?;
    let from = start.saturating_sub(WHAT_LINES);
    let terminate =
        from + lines[from..start].iter().rposition(|l| l.starts_with("terminate called after throwing"))?;
    if lines[terminate..start].iter().any(|l| l.trim_start().ends_with("Traceback (most recent call last):"))
    {
        return None;
    }
    let what = lines[terminate..start].iter().find_map(|l| l.split_once("what():").map(|(_, w)| w.trim()))?;
    (!what.is_empty()).then(|| KeyLine { text: what.to_string(), at: handler.at, fatal: true })
}

/// Lines that follow an error without being it: PyTorch's debugging hints, log lines.
fn is_hint(line: &str) -> bool {
    const HINTS: [&str; 4] = [
        "TORCH_DISTRIBUTED_DEBUG",
        "CUDA_LAUNCH_BLOCKING",
        "TORCH_USE_CUDA_DSA",
        "For debugging consider passing",
    ];
    HINTS.iter().any(|h| line.contains(h))
}

/// The last line that reads like an error message, hints excluded.
pub fn last_error_line(lines: &[String]) -> Option<String> {
    const NEEDLES: [&str; 7] =
        ["error", "exception", "panicked", "terminate called", "what():", "fatal", "traceback"];
    lines
        .iter()
        .rev()
        .filter(|l| !is_hint(l))
        .find(|l| {
            let lower = l.to_ascii_lowercase();
            NEEDLES.iter().any(|n| lower.contains(n))
        })
        .cloned()
}

/// Whether `r` stands for a process below a launcher whose rank number no signal gave.
pub fn rank_unknown(r: &RankResult) -> bool {
    r.identified_by.is_none() && r.exit_source == Some(ExitSource::ProcfsRankUnknown)
}

/// `Rank 1`, or for a process whose rank number is unknown `The process 4242 below the launcher
/// (rank number unknown)`; `lead` is how the sentence starts (`Rank`/`rank`, `The`/`the`).
pub fn rank_name(r: &RankResult, lead: &str) -> String {
    if rank_unknown(r) {
        let the = if lead.starts_with(char::is_uppercase) { "The" } else { "the" };
        return format!(
            "{the} process {} below the launcher (rank number unknown)",
            r.pid.map_or("?".into(), |p| p.to_string())
        );
    }
    if r.identified_by.is_none() && r.exit_source == Some(ExitSource::LauncherStatus) {
        return format!("{lead} {} (its process was not identified: the launcher's status)", r.rank);
    }
    format!("{lead} {}", r.rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(|l| strip_rank_prefix(l).to_string()).collect()
    }

    /// PyTorch 2.11's DDP error for an unused parameter, as rank 0 printed it (recorded).
    pub const DDP_UNUSED: &str = include_str!("fixtures/ddp_unused.txt");

    #[test]
    fn the_key_line_of_a_ddp_error_is_its_exception_not_the_trailing_hint() {
        // As the launcher printed it, `[rank0]:` prefixes and all.
        let raw: Vec<String> = DDP_UNUSED.lines().map(String::from).collect();
        let key = key_line(&raw).unwrap();
        assert!(
            key.text.starts_with("RuntimeError: Expected to have finished reduction in the prior iteration"),
            "{key:?}"
        );
        assert_eq!(key.at.as_deref(), Some("patterns.py:53 in train"));
        assert!(last_error_line(&lines(DDP_UNUSED)).is_some_and(|l| !l.contains("TORCH_DISTRIBUTED_DEBUG")));
        assert_eq!(
            key.render(),
            "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. … \
             (patterns.py:53 in train)"
        );
    }

    /// Lightning's Transformer demo under its own launcher with a 16 KiB `/dev/shm` (the accuracy
    /// matrix's held-out `lightning-transformer` × small-shm, 2026-12-07; rank 1's lines of the
    /// launcher's output, `[rank1]: ` cut): the DataLoader could not make its semaphore (`ENOSPC`),
    /// then Lightning's teardown raised while handling that. The first is where it began.
    #[test]
    fn an_exception_raised_while_another_was_handled_gives_the_first_then_the_last() {
        let key = key_line(&lines(include_str!("fixtures/handling_chain.txt"))).unwrap();
        assert_eq!(
            key.text,
            "OSError: [Errno 28] No space left on device; while handling it: RuntimeError: Please call \
             `iter(combined_loader)` first."
        );
        assert_eq!(key.at.as_deref(), Some("lightning_transformer.py:9 in <module>"));
        // The second traceback alone (the first cut off): the last exception, as before.
        let text = lines(include_str!("fixtures/handling_chain.txt"));
        let second = text.iter().position(|l| l.trim() == HANDLING).unwrap() + 1;
        assert_eq!(
            key_line(&text[second..]).unwrap().text,
            "RuntimeError: Please call `iter(combined_loader)` first."
        );
    }

    #[test]
    fn a_dataloader_workers_traceback_gives_the_datasets_line() {
        let key = key_line(&lines(include_str!("fixtures/dataset_error.txt"))).unwrap();
        assert_eq!(key.render(), "ValueError: corrupt sample at index 5 (patterns.py:66 in __getitem__)");
    }

    #[test]
    fn fault_handler_and_cpp_exceptions_have_key_lines_too() {
        let segv = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n  \
                    File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n  \
                    File \"/t/ddp.py\", line 44 in <module>\n\nExtension modules: numpy";
        assert_eq!(
            key_line(&lines(segv)).unwrap().render(),
            "Fatal Python error: Segmentation fault (ddp.py:44 in <module>)"
        );
        // With other threads (ups-doctor's observer waiting in its own thread), the thread that
        // faulted names the site, not the first thread faulthandler lists.
        let threads = "Fatal Python error: Segmentation fault\n\nThread 0x00007fea (most recent call first):\n  \
                       File \"/usr/lib/python3.11/threading.py\", line 331 in wait\n  \
                       File \"/runs/1-segv/python-site/sitecustomize.py\", line 112 in _run\n  \
                       File \"/t/logger.py\", line 9 in run\n\n\
                       Current thread 0x00007feb (most recent call first):\n  \
                       File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n  \
                       File \"/t/ddp.py\", line 44 in <module>\n\nExtension modules: numpy";
        assert_eq!(
            key_line(&lines(threads)).unwrap().render(),
            "Fatal Python error: Segmentation fault (ddp.py:44 in <module>)"
        );
        let cpp = "terminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error: initialization error\nException raised from c10_cuda_check_implementation";
        assert_eq!(key_line(&lines(cpp)).unwrap().text, "CUDA error: initialization error");
    }

    /// A rank aborted by an exception a library thread threw (gloo's, as torch 2.11 printed it
    /// here for two ranks that all-reduced 16 and 8 floats): the `what():` is the key line, at
    /// the program's own frame in the main thread, which is not the "current" one (the thread
    /// that aborted runs no Python) and is listed after ups-doctor's observer thread.
    #[test]
    fn an_aborting_cpp_exception_is_the_key_line_at_the_main_threads_own_frame() {
        let aborted = "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  \
                       what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] \
                       op.preamble.length <= op.nbytes. 16 vs 8. Received data size doesn't match expected size. Is \
                       there a distributed collective mismatch in your code?\n\
                       Fatal Python error: Aborted\n\n\
                       Thread 0x00007f3dc7bff6c0 (most recent call first):\n  \
                       File \"/usr/lib/python3.11/threading.py\", line 331 in wait\n  \
                       File \"/runs/1-m/python-site/sitecustomize.py\", line 180 in _run\n\n\
                       Thread 0x00007f3e7e276b80 (most recent call first):\n  \
                       File \"/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py\", line 3075 in all_reduce\n  \
                       File \"/runs/1-m/python-site/sitecustomize.py\", line 691 in collective\n  \
                       File \"/t/mismatch.py\", line 5 in <module>\n\n\
                       Extension modules: numpy";
        let key = key_line(&lines(aborted)).unwrap();
        assert!(key.fatal && !key.is_exception(), "{key:?}");
        assert_eq!(key.at.as_deref(), Some("mismatch.py:5 in <module>"));
        assert_eq!(
            key.render(),
            "op.preamble.length <= op.nbytes. 16 vs 8. Received data size doesn't match expected size. Is there a \
             distributed collective mismatch in your code? (mismatch.py:5 in <module>)"
        );
        // The same dump without C++'s words: the fault handler's own line, at the same frame.
        let bare: Vec<String> = lines(aborted).into_iter().skip(2).collect();
        let key = key_line(&bare).unwrap();
        assert_eq!(key.render(), "Fatal Python error: Aborted (mismatch.py:5 in <module>)");
        // A traceback printed after the abort's words is another process's account: not joined.
        let mut later = lines(aborted);
        later.insert(2, "Traceback (most recent call last):".to_string());
        assert_eq!(aborted_cpp_exception(&later), None);
    }

    #[test]
    fn a_fault_handler_dump_at_sigterm_becomes_threads_with_the_main_one_named() {
        let dump = "main thread 0x00007f55a8c4f740\n\
                    Thread 0x00007f551bfff6c0 (most recent call first):\n  \
                    File \"/usr/lib/python3.11/threading.py\", line 331 in wait\n  \
                    File \"/runs/1-x/python-site/sitecustomize.py\", line 214 in _run\n\n\
                    Current thread 0x00007f55a8c4f740 (most recent call first):\n  \
                    File \"/t/inject/sitecustomize.py\", line 50 in _compute\n  \
                    File \"/v/lib/python3.11/site-packages/torch/optim/optimizer.py\", line 510 in wrapper\n  \
                    File \"/t/observed_ddp.py\", line 41 in main\n  \
                    File \"/t/observed_ddp.py\", line 56 in <module>\n";
        let threads = fault_handler_threads(dump);
        assert_eq!(threads.len(), 2);
        assert_eq!(threads[0].0, "thread 0x00007f551bfff6c0");
        assert_eq!(threads[0].1[0].place.as_deref(), Some("/usr/lib/python3.11/threading.py:331"));
        assert_eq!(threads[1].0, "MainThread");
        assert_eq!(threads[1].1.len(), 4);
        assert_eq!(threads[1].1[0].place.as_deref(), Some("/t/inject/sitecustomize.py:50"));
        assert_eq!(
            threads[1].1[2],
            StackFrame { function: "main".into(), place: Some("observed_ddp.py:41".into()) }
        );
    }

    #[test]
    fn py_spy_native_dumps_become_frames() {
        let dump = "Process 11340: python patterns.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n\
                    Thread 11340 (active): \"MainThread\"\n    sched_yield (libc.so.6)\n    \
                    GOMP_parallel (libgomp.so.1)\n    <module> (patterns.py:86)\n    0x7f300dc4524a (libc.so.6)\n\
                    Thread 11341 (idle): \"Thread-1\"\n    futex_wait (libc.so.6)\n";
        let threads = py_spy_threads(dump);
        assert_eq!(threads.len(), 2);
        assert_eq!((threads[0].0, threads[0].1.as_str()), (Some(11340), "MainThread"));
        assert_eq!(
            threads[0].2[1],
            StackFrame { function: "GOMP_parallel".into(), place: Some("libgomp.so.1".into()) }
        );
        assert_eq!(threads[0].2[2].place.as_deref(), Some("patterns.py:86"));
        assert_eq!(threads[1].2.len(), 1);
    }
}
