//! The one seam to the operating system for rank processes: spawn in a process group of its own
//! with a marker pipe, death-with-parent, drained output; signal the group; peek at and reap the
//! exit status. Everything above this module is plain data and decisions.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::protocol::{MARKER_FD_ENV, MARKER_INO_ENV, MAX_MARKER_LINE, Marker};

use super::capture::{self, Captured};

/// The number a launcher's process carries: past every rank, also those of a grown world.
pub const LAUNCHER_NUMBER: u32 = u32::MAX;

/// Everything needed to start one rank.
#[derive(Debug, Clone)]
pub struct RankSpec {
    pub rank: u32,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(String, String)>,
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
    /// A mount namespace to join before exec (the scenario's private `/dev/shm`), with the
    /// working directory to return to after joining (`setns` moves to the namespace's root).
    pub mount_ns: Option<(RawFd, CString)>,
    /// Hand the process a marker pipe (`UPS_DOCTOR_MARKER_FD`); a launcher gets none (its ranks
    /// write to the run's FIFO instead).
    pub marker_pipe: bool,
    /// Variables not to pass on from ups-doctor's own environment.
    pub env_remove: Vec<String>,
    /// Report output as activity ([`Event::Output`]); for programs that may send no markers.
    pub report_output: bool,
    /// Which process a line of its output came from, where it relays several's (a cluster's
    /// launcher): a line is then that process's sign of life alone.
    pub output_origin: Option<capture::Origin>,
    /// A stdout line matching this sets the capture's `matched`.
    pub stdout_pattern: Option<regex::Regex>,
    /// The same for stderr (`completes_when.output`).
    pub stderr_pattern: Option<regex::Regex>,
    /// The folder it starts in; `None`: ups-doctor's own.
    pub cwd: Option<PathBuf>,
    /// The scenario cgroup's `cgroup.procs`: the child moves itself in before `exec`, so all it
    /// starts is in the group from its first instruction on.
    pub cgroup: Option<CString>,
}

/// What the reader threads report to the supervising loop.
#[derive(Debug)]
pub enum Event {
    Marker {
        rank: u32,
        at: Instant,
        marker: Marker,
    },
    /// A line on the marker pipe that is not a marker.
    BadMarker {
        rank: u32,
        at: Instant,
    },
    /// The marker pipe reached end of file: every holder of its write end is gone.
    MarkersClosed {
        rank: u32,
    },
    /// The rank process has exited (it is not reaped yet): sent the moment the kernel says so,
    /// so that which rank ended first does not depend on the supervising loop's tick.
    Exited {
        rank: u32,
        at: Instant,
    },
    /// The rank wrote to stdout or stderr (throttled, see [`capture::ACTIVITY_EVERY`]).
    Output {
        rank: u32,
        at: Instant,
        /// The process the line came from, where the stream relays several (a cluster's
        /// launcher's): then the output is that process's alone.
        from: Option<u32>,
    },
    /// A process a launcher started (a rank, or one that looked like one) has ended, seen by the
    /// `/proc` watcher: its status as read while it was a zombie (`None` when it was gone before
    /// it could be read).
    FoundExited {
        pid: u32,
        exit: Option<Exit>,
        at: Instant,
    },
    /// The user interrupted ups-doctor (see `run::interrupt`).
    Interrupt,
    /// A launcher's program formed a process group of more ranks than the run was watching (a
    /// script that starts its own ranks, whose command line says not how many): the run now
    /// watches `world` ranks. Sent before any marker of the new ranks.
    WorldGrew {
        world: u32,
        at: Instant,
    },
}

impl Event {
    /// Whether the run loop must look now. Markers of progress and output only move the hang
    /// deadline later, so the loop reads them when it next wakes (every one keeps the time it
    /// arrived); exits, crashes, stacks, `done`, worker claims (checked while the worker runs)
    /// and interrupts wake it.
    pub fn urgent(&self) -> bool {
        match self {
            Event::Marker { marker, .. } => !matches!(
                marker,
                Marker::Begin { .. }
                    | Marker::End { .. }
                    | Marker::Progress { .. }
                    | Marker::Step { .. }
                    | Marker::Dataset { .. }
                    | Marker::Group { .. }
                    | Marker::Starts { .. }
                    | Marker::Joining { .. }
                    | Marker::Collective { .. }
                    | Marker::Issued { .. }
                    | Marker::Observer { .. }
                    | Marker::Torch { .. }
            ),
            Event::BadMarker { .. } | Event::Output { .. } => false,
            _ => true,
        }
    }
}

/// Where readers and watchers send [`Event`]s: every event is queued, and an urgent one
/// ([`Event::urgent`]) also wakes the run loop, which otherwise sleeps until its next deadline.
///
/// Markers are bounded: a program writing them faster than the loop folds them in (a flood of
/// millions a second) would otherwise grow the queue without limit (measured: 1.4 GiB at 10
/// million markers, about 140 bytes each). Past [`MAX_QUEUED_MARKERS`] markers waiting, a marker
/// that would not wake the loop is dropped, and past [`MAX_QUEUED_URGENT`] any marker is; each
/// drop is counted for its rank ([`Sink::take_dropped`]) and reported. Other events (exits,
/// interrupts, output) are never dropped: their number is bounded by the processes.
#[derive(Debug, Clone)]
pub struct Sink {
    events: Sender<(Event, usize)>,
    wake: SyncSender<()>,
    load: std::sync::Arc<Load>,
    dropped: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u32, u64>>>,
}

/// Markers waiting in the queue, and what they hold.
#[derive(Debug, Default)]
struct Load {
    markers: AtomicUsize,
    /// The lines they were read from, plus [`MARKER_OVERHEAD`] each: about their memory.
    bytes: AtomicUsize,
}

/// Markers waiting in the queue past which one that does not wake the loop is dropped (a
/// trainer sends about ten a step, a hundred steps a second at most).
pub const MAX_QUEUED_MARKERS: usize = 1 << 16;
/// Bytes of waiting markers past which one that does not wake the loop is dropped: a marker's
/// line may be up to [`MAX_MARKER_LINE`] long, so the count alone would not bound memory.
pub const MAX_QUEUED_BYTES: usize = 16 << 20;
/// Past four times these limits even a marker that would wake the loop (a crash, `done`, a
/// stack) is dropped, so that a flood of progress never costs those.
pub const URGENT_FACTOR: usize = 4;
/// What a queued marker costs besides its line: the event and the channel's slot (measured about
/// 140 bytes a marker in all for short lines).
pub const MARKER_OVERHEAD: usize = 160;

/// The run loop's end of a [`Sink`]: events in the order they were sent.
#[derive(Debug)]
pub struct Queue {
    events: Receiver<(Event, usize)>,
    load: std::sync::Arc<Load>,
}

impl Queue {
    /// The next event waiting, if any.
    pub fn try_recv(&self) -> Result<Event, mpsc::TryRecvError> {
        let (event, bytes) = self.events.try_recv()?;
        if matches!(event, Event::Marker { .. } | Event::BadMarker { .. }) {
            self.load.markers.fetch_sub(1, Ordering::Relaxed);
            self.load.bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        Ok(event)
    }

    /// Every event waiting now, without blocking.
    pub fn try_iter(&self) -> impl Iterator<Item = Event> + '_ {
        std::iter::from_fn(|| self.try_recv().ok())
    }

    /// Markers waiting now, and about the memory they hold.
    pub fn waiting(&self) -> (usize, usize) {
        (self.load.markers.load(Ordering::Relaxed), self.load.bytes.load(Ordering::Relaxed))
    }
}

impl Sink {
    /// A sink, the queue it fills and the wake-ups it gives.
    pub fn new() -> (Sink, Queue, Receiver<()>) {
        let (events, queue) = mpsc::channel();
        // One pending wake-up is enough: the loop drains the whole queue when it wakes.
        let (wake, wakes) = mpsc::sync_channel(1);
        let load = std::sync::Arc::<Load>::default();
        let sink =
            Sink { events, wake, load: std::sync::Arc::clone(&load), dropped: std::sync::Arc::default() };
        (sink, Queue { events: queue, load }, wakes)
    }

    /// Markers dropped since the last call, by rank (see [`Sink`]).
    pub fn take_dropped(&self) -> std::collections::BTreeMap<u32, u64> {
        std::mem::take(&mut *self.dropped.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Queues `event`; false once the run loop is gone.
    pub fn send(&self, event: Event) -> bool {
        self.send_read(event, 0)
    }

    /// [`Sink::send`] for an event read from a line of `line` bytes (a marker): dropped and
    /// counted when the queue holds too many markers already (see [`Sink`]).
    pub fn send_read(&self, event: Event, line: usize) -> bool {
        let urgent = event.urgent();
        let mut bytes = 0;
        if let Event::Marker { rank, .. } | Event::BadMarker { rank, .. } = &event {
            let factor = if urgent { URGENT_FACTOR } else { 1 };
            bytes = line + MARKER_OVERHEAD;
            let markers = self.load.markers.fetch_add(1, Ordering::Relaxed);
            let held = self.load.bytes.fetch_add(bytes, Ordering::Relaxed);
            if markers >= MAX_QUEUED_MARKERS * factor || held + bytes > MAX_QUEUED_BYTES * factor {
                self.load.markers.fetch_sub(1, Ordering::Relaxed);
                self.load.bytes.fetch_sub(bytes, Ordering::Relaxed);
                *self.dropped.lock().unwrap_or_else(|e| e.into_inner()).entry(*rank).or_default() += 1;
                return true;
            }
            // Half full: the loop takes them in now rather than at its next deadline.
            if markers + 1 == MAX_QUEUED_MARKERS / 2 {
                let _ = self.wake.try_send(());
            }
        }
        let sent = self.events.send((event, bytes)).is_ok();
        if urgent {
            let _ = self.wake.try_send(());
        }
        sent
    }
}

/// How a process ended, from its wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal { signal: i32, core_dumped: bool },
}

/// A running rank and the threads draining its pipes.
pub struct RankProcess {
    pub pid: u32,
    child: Child,
    stdout: Option<JoinHandle<Captured>>,
    stderr: Option<JoinHandle<Captured>>,
}

/// Starts a rank. Its markers and pipe closure arrive on `events`.
pub fn spawn_rank(spec: &RankSpec, events: Sink) -> io::Result<RankProcess> {
    // Before the first rank: what a run starts stays below ups-doctor (see `sys`).
    static SUBREAPER: std::sync::Once = std::sync::Once::new();
    SUBREAPER.call_once(|| {
        if let Err(e) = super::sys::become_child_subreaper() {
            eprintln!(
                "ups-doctor: warning: cannot adopt the run's orphaned processes (PR_SET_CHILD_SUBREAPER: {e})"
            );
        }
    });
    let (reader, writer) = marker_pipe()?;
    let write_fd = writer.as_raw_fd();
    let parent = std::process::id() as i32;
    let mount_ns = spec.mount_ns.clone();
    let cgroup = spec.cgroup.clone();

    let marker_pipe = spec.marker_pipe;
    let mut cmd = Command::new(&spec.program);
    for name in &spec.env_remove {
        cmd.env_remove(name);
    }
    // Set by the observer in the first process that sees `RANK` (python/site/sitecustomize.py):
    // one left over from an outer run would make this run's ranks look like a rank's children.
    cmd.env_remove("UPS_DOCTOR_RANK_PID");
    cmd.args(&spec.args).envs(spec.env.iter().map(|(k, v)| (k, v)));
    if let Some(cwd) = &spec.cwd {
        // (With a private `/dev/shm` the child enters its namespace and changes to this folder
        // again in `pre_exec`, which runs after this change: `mount_ns` carries the same folder.)
        cmd.current_dir(cwd);
    }
    if marker_pipe {
        use std::os::unix::fs::MetadataExt;
        let inode = writer.metadata().map(|m| m.ino()).unwrap_or(0);
        cmd.env(MARKER_FD_ENV, write_fd.to_string()).env(MARKER_INO_ENV, inode.to_string());
    } else {
        cmd.env_remove(MARKER_FD_ENV).env_remove(MARKER_INO_ENV);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: the closure only calls async-signal-safe functions (open, write, close, setpgid,
    // prctl, getppid, fcntl, setns, chdir, _exit), as required between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(procs) = &cgroup {
                super::cgroup::enter(procs)?;
            }
            // Own process group: signals to the group reach the rank and anything it starts,
            // and a Ctrl-C on the terminal reaches only ups-doctor, which then tears down.
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Die with ups-doctor, even if it is SIGKILLed.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1); // ups-doctor died between fork and prctl
            }
            // The marker pipe's write end is the one fd this child inherits on purpose.
            if marker_pipe && libc::fcntl(write_fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Join the scenario's mount namespace: its `/dev/shm` is the private one.
            if let Some((ns, cwd)) = &mount_ns {
                if libc::setns(*ns, libc::CLONE_NEWNS) != 0 || libc::chdir(cwd.as_ptr()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    // Only the child may hold the write end, so that EOF means "the rank and its children are
    // gone".
    drop(writer);
    let pid = child.id();
    let rank = spec.rank;
    let events_for_output = events.clone();
    let events_for_exit = events.clone();
    // Named for `top -H` and bench/own_cpu.py: a launcher's number is past any rank's.
    let who = if rank == LAUNCHER_NUMBER { "launcher".to_string() } else { rank.to_string() };
    std::thread::Builder::new()
        .name(format!("exit-{who}"))
        .spawn(move || watch_exit(pid, rank, events_for_exit))?;
    std::thread::Builder::new()
        .name(format!("markers-{who}"))
        .spawn(move || read_markers(rank, reader, events))?;
    let watch = |pattern: Option<regex::Regex>| capture::Watch {
        on_output: spec.report_output.then(|| {
            let events = events_for_output.clone();
            Box::new(move |from| {
                events.send(Event::Output { rank, at: Instant::now(), from });
            }) as Box<dyn FnMut(Option<u32>) + Send>
        }),
        pattern,
        origin: spec.output_origin.clone(),
    };
    let stdout = child
        .stdout
        .take()
        .map(|s| capture::drain_watching(s, spec.stdout_log.clone(), watch(spec.stdout_pattern.clone())));
    let stderr = child
        .stderr
        .take()
        .map(|s| capture::drain_watching(s, spec.stderr_log.clone(), watch(spec.stderr_pattern.clone())));
    drop(events_for_output);
    Ok(RankProcess { pid, child, stdout, stderr })
}

/// The marker pipe, (read end, write end), both close-on-exec (the child clears the flag on its
/// write end alone), enlarged so that a writer does not wait for the paced reader.
fn marker_pipe() -> io::Result<(File, File)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    enlarge_pipe(read.as_fd());
    Ok((File::from(read), File::from(write)))
}

/// Waits, in a thread of its own, for the rank's exit without reaping it (`WNOWAIT` leaves the
/// child for `reap`, and its group id reserved), and announces it the moment the kernel says so,
/// so that which rank ended first does not depend on when the run loop looks.
fn watch_exit(pid: u32, rank: u32, events: Sink) {
    // SAFETY: `siginfo_t` is a plain C struct for which all-zero bytes are a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid out-pointer; WNOWAIT leaves the child for `reap` (and its group id
        // reserved); blocking here costs only this thread.
        let rc =
            unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 {
            events.send(Event::Exited { rank, at: Instant::now() });
            return;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Creates the FIFO of a launcher-style run at `path` and opens it for reading. It is opened
/// read-write, so the open never waits for a writer and the read end never sees end of file while
/// ranks come and go; the run ends by its processes, not by the FIFO.
pub fn open_marker_fifo(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let _ = std::fs::remove_file(path);
    // Mode 0600: only this user's processes may write markers.
    nix::unistd::mkfifo(c_path.as_c_str(), nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    // Opened for reading and writing: the open does not wait for a writer, and the FIFO never
    // reads as ended while the run goes on.
    let fd = nix::fcntl::open(
        c_path.as_c_str(),
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    enlarge_pipe(fd.as_fd());
    Ok(File::from(fd))
}

/// Which rank each writer of a launcher-style run's FIFO is, pid → global rank: what the lines
/// said (`claimed`, kept by the reader, read by rank discovery) and what rank discovery found by
/// other signals (`found`, kept by the supervisor, read by the reader); and `first`, this node's
/// first global rank, which the supervisor corrects when the launcher's rendezvous placed the
/// node elsewhere than the plan expected (torchrun's `c10d` orders nodes by host and agent pid,
/// not by `--node-rank`).
#[derive(Debug, Default)]
pub struct PidRanks {
    pub claimed: std::collections::BTreeMap<u32, u32>,
    pub found: std::collections::BTreeMap<u32, u32>,
    pub first: u32,
    /// Processes the launcher started for a rank again (an elastic restart), which are not
    /// watched. Once there is one, only the found (watched) processes' lines and their children's
    /// are routed: every later attempt writes the same ranks.
    pub restarted: std::collections::BTreeSet<u32>,
    /// A world larger than the one watched, declared by a found rank's environment (its
    /// `WORLD_SIZE`) before any group was formed: the router routes that many ranks from then on.
    pub declared_world: u32,
    /// This node's first global rank as the first rank to form its process group said it
    /// (`rank - local_rank` of its `group` marker): the place a cluster gave the node (Ray Train
    /// numbers its workers node after node, in an order of its own), read where nothing in the
    /// ranks' starting environment says it.
    pub said_first: Option<u32>,
}

/// How often at most a marker reader reads its pipe while markers keep coming.
pub const MARKER_BATCH: Duration = Duration::from_millis(100);

/// The marker pipe's size asked for (Linux's default limit for an unprivileged process): 1 MiB
/// holds the lines of a [`MARKER_BATCH`] at over 100,000 markers a second, so a writer does not
/// wait for the reader's next batch.
const MARKER_PIPE_BYTES: i32 = 1 << 20;

/// Stamps older than this are not believed (a writer's clock is the machine's, so this only
/// guards against a foreign writer's nonsense); the time of reading stands instead.
const STAMP_MAX_AGE: Duration = Duration::from_secs(600);

/// A pipe read at most once per [`MARKER_BATCH`]: a trainer sends about ten markers a step, and
/// a reader woken for each line (1,250 a second at 150 steps/s, measured) takes a core from the
/// trainer's threads that often, each time making an OpenMP barrier wait for the thread it
/// preempted. Paced, it reads whatever arrived since, at most ten times a second. The first
/// line after a quiet spell is read as it comes (a read that waited needs no pause), and a read
/// that filled the buffer is followed at once (more is waiting). A line's time is the writer's
/// stamp (see [`written_at`]); exits do not come through here (see [`watch_exit`]), so neither
/// when a rank ended nor when it wrote its last marker depends on the pacing.
struct Paced<R> {
    inner: R,
    /// When the last read returned, unless it filled the buffer.
    last: Option<Instant>,
}

impl<R> Paced<R> {
    fn new(inner: R) -> Paced<R> {
        Paced { inner, last: None }
    }
}

impl<R: Read> Read for Paced<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(due) = self.last.map(|last| last + MARKER_BATCH) {
            let now = Instant::now();
            if now < due {
                std::thread::sleep(due - now);
            }
        }
        let n = self.inner.read(buf);
        let full = matches!(n, Ok(n) if n == buf.len());
        self.last = (!full).then(Instant::now);
        n
    }
}

/// Asks for a marker pipe (or FIFO) of [`MARKER_PIPE_BYTES`]; one the kernel refuses (a user
/// over their pipe quota) keeps its 64 KiB, and a writer then waits a little at most.
fn enlarge_pipe(fd: std::os::fd::BorrowedFd<'_>) {
    let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(MARKER_PIPE_BYTES));
}

/// When a marker line read at `read_at` was written: its writer's stamp
/// ([`crate::protocol::STAMP_KEY`], `CLOCK_MONOTONIC`) on ups-doctor's clock, or `read_at` for a
/// line without one or with one that cannot be right (after its reading, or older than
/// [`STAMP_MAX_AGE`]).
pub fn written_at(line: &str, read_at: Instant) -> Instant {
    crate::protocol::stamp_of(line)
        .and_then(|stamp| stamp_instant(stamp, STAMP_MAX_AGE))
        .filter(|at| *at <= read_at)
        .unwrap_or(read_at)
}

/// A writer's `CLOCK_MONOTONIC` stamp (nanoseconds) on ups-doctor's clock; `None` for one in the
/// future or older than `max_age`.
pub fn stamp_instant(stamp: u64, max_age: Duration) -> Option<Instant> {
    let (now_ns, now) = (crate::protocol::monotonic_ns()?, Instant::now());
    let age = Duration::from_nanos(now_ns.checked_sub(stamp)?);
    (age <= max_age).then(|| now.checked_sub(age)).flatten()
}

/// A wall-clock time (`CLOCK_REALTIME`, nanoseconds since the Unix epoch: what PyTorch's Flight
/// Recorder stamps its entries with) on ups-doctor's clock, by the two clocks' offset now (the
/// wall clock may have been stepped since: that error is NTP's, milliseconds at worst); `None` for
/// one in the future.
pub fn wall_instant(wall_ns: u64) -> Option<Instant> {
    let now_wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
    let now = Instant::now();
    now.checked_sub(now_wall.checked_sub(Duration::from_nanos(wall_ns))?)
}

/// Lines kept for a writer whose rank is not known yet, per writer and writers at most.
const PENDING_LINES: usize = 256;
const PENDING_WRITERS: usize = 64;

/// Routes the lines of a launcher-style run's FIFO to ranks. A line carries its writer's `pid`
/// and, when the writer knows it (`RANK`, or `torch.distributed.get_rank()` once the process
/// group is up), its `rank`: a writer's first rank is its claim. A line without a rank goes to the
/// writer's claimed or found rank, else to its parent's (a spawned DataLoader worker), else it
/// waits until the writer's rank is known (an `mp.spawn` rank's markers before
/// `init_process_group`). So does a line of a rank of the world that is not (yet) one of this
/// node's: the node's place may still be corrected ([`PidRanks::first`]).
struct TaggedRouter {
    /// The whole run's ranks (`0..world`); a rank beyond is no rank.
    world: u32,
    /// How many ranks this node runs, from [`PidRanks::first`]; events are numbered from it.
    local: u32,
    /// A one-node run whose world may grow to the process group its program forms, up to this
    /// many ranks ([`Event::WorldGrew`]); `None`: the world is fixed.
    grow_to: Option<u32>,
    pending: std::collections::BTreeMap<u32, Vec<(Instant, serde_json::Value)>>,
}

impl TaggedRouter {
    fn route(
        &mut self,
        line: &str,
        at: Instant,
        ranks: &std::sync::Mutex<PidRanks>,
        parent: impl Fn(u32) -> Option<u32>,
    ) -> Vec<Event> {
        let Ok(serde_json::Value::Object(v)) = serde_json::from_str::<serde_json::Value>(line) else {
            return Vec::new();
        };
        let pid = v.get("pid").and_then(|p| p.as_u64()).and_then(|p| u32::try_from(p).ok());
        // After a restart was seen, only the watched processes' lines (and their workers') are a
        // rank's: every later attempt's processes write the same ranks. Only then: the parent's
        // read is a system call a line.
        if let (Some(p), Ok(known)) = (pid, ranks.lock())
            && !known.restarted.is_empty()
        {
            let watched = |p: u32| known.found.contains_key(&p);
            if !(watched(p) || parent(p).is_some_and(watched)) {
                return Vec::new();
            }
        }
        if let Ok(known) = ranks.lock()
            && known.declared_world > self.world
            && self.grow_to.is_some_and(|cap| known.declared_world <= cap)
        {
            (self.world, self.local) = (known.declared_world, known.declared_world);
        }
        let grew = self.grow(&v);
        let said = v.get("rank").and_then(|r| u32::try_from(r.as_u64()?).ok()).filter(|r| *r < self.world);
        let v = serde_json::Value::Object(v);
        let rank = {
            let Ok(mut known) = ranks.lock() else { return Vec::new() };
            // A `worker` line's writer is a DataLoader worker (the helper's `worker_init_fn`): it
            // goes to the rank it names, and claims no rank for its pid, which is not the rank's.
            let worker = v.get("t").and_then(|t| t.as_str()) == Some("worker");
            let local = v.get("local_rank").and_then(|r| u32::try_from(r.as_u64()?).ok());
            if v.get("t").and_then(|t| t.as_str()) == Some("group")
                && let (Some(rank), Some(local)) = (said, local)
                && known.found.is_empty()
            {
                let first = rank.checked_sub(local).filter(|f| f + self.local <= self.world);
                known.said_first = known.said_first.or(first);
            }
            let global = match (said, pid) {
                (Some(rank), Some(pid)) if worker => Some(known.claimed.get(&pid).copied().unwrap_or(rank)),
                (Some(rank), Some(pid)) => Some(*known.claimed.entry(pid).or_insert(rank)),
                (Some(rank), None) => Some(rank),
                (None, Some(pid)) => {
                    let of = |p: u32| known.claimed.get(&p).or_else(|| known.found.get(&p)).copied();
                    of(pid).or_else(|| parent(pid).and_then(of))
                }
                (None, None) => None,
            };
            global.and_then(|g| g.checked_sub(known.first)).filter(|l| *l < self.local)
        };
        let grew = grew.map(|world| Event::WorldGrew { world, at });
        match (rank, pid) {
            (Some(rank), _) => {
                let mut lines = pid.and_then(|p| self.pending.remove(&p)).unwrap_or_default();
                lines.push((at, v));
                grew.into_iter().chain(lines.into_iter().map(|(at, v)| Self::event(rank, at, v))).collect()
            }
            (None, Some(pid)) => {
                if self.pending.len() < PENDING_WRITERS || self.pending.contains_key(&pid) {
                    let lines = self.pending.entry(pid).or_default();
                    if lines.len() < PENDING_LINES {
                        lines.push((at, v));
                    }
                }
                grew.into_iter().collect()
            }
            (None, None) => grew.into_iter().collect(),
        }
    }

    /// A `group` line of a world larger than the one watched, in a run that may grow (up to
    /// `grow_to`): the new world, which this router routes from now on.
    fn grow(&mut self, v: &serde_json::Map<String, serde_json::Value>) -> Option<u32> {
        let cap = self.grow_to?;
        // The world a rank was given as it entered `init_process_group` counts too: a rank may
        // never return from it (the one it waits for exited before joining).
        if !matches!(v.get("t").and_then(|t| t.as_str()), Some("group" | "joining")) {
            return None;
        }
        let world = u32::try_from(v.get("world_size")?.as_u64()?).ok()?;
        if world <= self.world || world > cap {
            return None;
        }
        (self.world, self.local) = (world, world);
        Some(world)
    }

    /// The marker of a line routed to `rank`: the rank is filled in where the writer did not know
    /// it (a `start` marker needs one).
    fn event(rank: u32, at: Instant, mut v: serde_json::Value) -> Event {
        if let Some(o) = v.as_object_mut() {
            o.insert("rank".into(), rank.into());
        }
        match serde_json::from_value::<Marker>(v) {
            Ok(marker) => Event::Marker { rank, at, marker },
            Err(_) => Event::BadMarker { rank, at },
        }
    }
}

/// Reads a launcher-style run's FIFO and routes each line to its writer's rank (see
/// [`TaggedRouter`]) among `local` ranks from [`PidRanks::first`] of a run of `world` (which a
/// process group of more ranks grows, up to `grow_to`, when given); lines of ranks beyond the
/// world are dropped, those of no known writer or another node's rank wait. The thread ends when
/// the receiver is gone.
pub fn read_tagged_markers(
    fifo: File,
    (world, local, grow_to): (u32, u32, Option<u32>),
    ranks: std::sync::Arc<std::sync::Mutex<PidRanks>>,
    events: Sink,
) {
    let mut reader = BufReader::with_capacity(1 << 16, Paced::new(fifo));
    let mut buf = Vec::with_capacity(4096);
    let mut router = TaggedRouter { world, local, grow_to, pending: Default::default() };
    loop {
        buf.clear();
        match Read::take(&mut reader, MAX_MARKER_LINE as u64).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let read_at = Instant::now();
        let line = String::from_utf8_lossy(&buf);
        let at = written_at(&line, read_at);
        let parent = |pid: u32| crate::probe::memory::read_stat(pid).map(|s| s.ppid);
        let line_bytes = buf.len();
        for event in router.route(line.trim_end(), at, &ranks, parent) {
            if !events.send_read(event, line_bytes) {
                return;
            }
        }
    }
}

fn read_markers(rank: u32, pipe: File, events: Sink) {
    let mut reader = BufReader::with_capacity(1 << 16, Paced::new(pipe));
    let mut buf = Vec::with_capacity(4096);
    loop {
        buf.clear();
        // Bounded line read: a runaway writer cannot make us buffer without limit.
        let n = match Read::take(&mut reader, MAX_MARKER_LINE as u64).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let at = Instant::now();
        if buf.last() != Some(&b'\n') && n == MAX_MARKER_LINE {
            // Skip the rest of an over-long line.
            let _ = reader.skip_until(b'\n');
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        let event = match Marker::parse(line) {
            Ok(marker) => Event::Marker { rank, at: written_at(line, at), marker },
            Err(_) => Event::BadMarker { rank, at },
        };
        if !events.send_read(event, n) {
            return;
        }
    }
    events.send(Event::MarkersClosed { rank });
}

impl RankProcess {
    /// Whether the rank has exited, without reaping it: the zombie keeps its process-group id
    /// reserved, so [`RankProcess::kill_group`] after this can never hit a recycled group.
    pub fn peek_exit(&self) -> Option<Exit> {
        // SAFETY: `siginfo_t` is a plain C struct for which all-zero bytes are a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; WNOWAIT leaves the child waitable.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                self.pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid/si_status are valid to read for SIGCHLD-style siginfo from waitid.
        if rc != 0 || unsafe { info.si_pid() } == 0 {
            return None;
        }
        let status = unsafe { info.si_status() };
        Some(match info.si_code {
            libc::CLD_EXITED => Exit::Code(status),
            libc::CLD_DUMPED => Exit::Signal { signal: status, core_dumped: true },
            _ => Exit::Signal { signal: status, core_dumped: false },
        })
    }

    /// Sends `signal` to the rank's whole process group. Returns whether any process got it.
    /// Ownership: the group was created by this child (`setpgid(0, 0)` before exec) and its
    /// leader is our child, never reaped before this is last called (`peek_exit` and the exit
    /// thread wait with `WNOWAIT`), so the group id cannot have been recycled; only processes of
    /// ups-doctor's own session can join it.
    /// A SIGKILL goes to the cleanup helpers last ([`super::cleanup`]), each member proven in the
    /// group through a pidfd, and then to the whole group again (whatever started meanwhile).
    pub fn signal_group(&self, signal: i32) -> bool {
        let group = || {
            // SAFETY: kill(2) on our own child's process group.
            unsafe { libc::kill(-(self.pid as i32), signal) == 0 }
        };
        if signal != libc::SIGKILL {
            return group();
        }
        let members = self.live_group_members();
        let sent = super::cleanup::kill_helpers_last(
            &members,
            |pid| self.signal_member(pid, signal),
            |pid| self.in_group(pid),
        );
        group() || sent
    }

    /// Whether `pid` is a live (not zombie) member of the rank's process group.
    fn in_group(&self, pid: u32) -> bool {
        crate::probe::memory::read_stat(pid).is_some_and(|s| !s.zombie() && s.pgid == self.pid)
    }

    /// Sends `signal` to `pid` only if the process its pidfd names is in the rank's group.
    fn signal_member(&self, pid: u32, signal: i32) -> bool {
        let Ok(fd) = super::sys::pidfd_open(pid) else { return false };
        self.in_group(pid) && super::sys::pidfd_send_signal(&fd, signal).is_ok()
    }

    /// The live (not zombie) processes of the rank's process group: the rank and the data-loader
    /// workers it started.
    pub fn live_group_members(&self) -> Vec<u32> {
        let pgid = self.pid.to_string();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return vec![self.pid];
        };
        let mut pids: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    return false;
                };
                // After the `(comm)` field: state, ppid, pgrp.
                let mut rest = stat.rsplit(')').next().unwrap_or("").split_whitespace();
                let state = rest.next();
                state != Some("Z") && rest.nth(1) == Some(pgid.as_str())
            })
            .collect();
        pids.sort_unstable();
        pids
    }

    /// Kills whatever is left of the group, reaps the rank, and collects its captured output.
    /// Returns the exit, the output captures and whether leftover processes had to be killed.
    pub fn reap(mut self) -> (Exit, Captured, Captured, bool) {
        let leftovers = self.signal_group(libc::SIGKILL);
        let status = match self.child.wait() {
            Ok(s) => s,
            Err(_) => std::process::ExitStatus::from_raw(0),
        };
        let exit = match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal { signal, core_dumped: status.core_dumped() },
            (None, None) => Exit::Code(-1),
        };
        let join = |h: Option<JoinHandle<Captured>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        let stdout = join(self.stdout.take());
        let stderr = join(self.stderr.take());
        (exit, stdout, stderr, leftovers)
    }
}

impl Drop for RankProcess {
    /// A rank must never outlive its supervisor, whatever path dropped it.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.signal_group(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks_of(events: &[Event]) -> Vec<(u32, bool)> {
        events
            .iter()
            .map(|e| match e {
                Event::Marker { rank, .. } => (*rank, true),
                Event::BadMarker { rank, .. } => (*rank, false),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn tagged_lines_wait_for_their_writers_rank_and_workers_go_to_their_parents() {
        let ranks = std::sync::Mutex::new(PidRanks::default());
        let mut router = TaggedRouter { world: 2, local: 2, grow_to: None, pending: Default::default() };
        let at = Instant::now();
        let parent = |pid: u32| (pid == 200).then_some(100);
        // An `mp.spawn` rank before `init_process_group`: it does not know its rank yet.
        let start = r#"{"t":"start","pid":100,"world_size":2,"device":"python"}"#;
        assert!(router.route(start, at, &ranks, parent).is_empty());
        // Its first line after it: the claim, and the waiting start marker with the rank filled in.
        let begin = r#"{"t":"begin","phase":"forward","step":0,"pid":100,"rank":1}"#;
        let events = router.route(begin, at, &ranks, parent);
        assert_eq!(ranks_of(&events), [(1, true), (1, true)]);
        assert!(matches!(&events[0], Event::Marker { marker: Marker::Start { rank: 1, pid: 100, .. }, .. }));
        assert_eq!(ranks.lock().unwrap().claimed.get(&100), Some(&1));
        // A spawned worker of it that knows no rank goes to its parent's.
        let worker = r#"{"t":"worker","id":0,"pid":200,"start_method":"spawn"}"#;
        assert_eq!(ranks_of(&router.route(worker, at, &ranks, parent)), [(1, true)]);
        // A writer found by another signal.
        ranks.lock().unwrap().found.insert(300, 0);
        let other = r#"{"t":"begin","phase":"forward","pid":300}"#;
        assert_eq!(ranks_of(&router.route(other, at, &ranks, parent)), [(0, true)]);
        // A rank outside the world is no rank; a line that is no object is dropped.
        assert!(
            router.route(r#"{"t":"begin","phase":"x","pid":400,"rank":7}"#, at, &ranks, parent).is_empty()
        );
        assert!(router.route("not json", at, &ranks, parent).is_empty());
        // A writer claims once: a later different rank does not move it.
        let again = r#"{"t":"begin","phase":"backward","pid":100,"rank":0}"#;
        assert_eq!(ranks_of(&router.route(again, at, &ranks, parent)), [(1, true)]);
    }

    /// The helper's `worker_init_fn` line is written by the DataLoader worker itself, with the rank
    /// it read from its parent's process group: it goes to that rank, but its pid is not the
    /// rank's. Seen under load: a forked worker's line came before its rank's first line with a
    /// rank, and the worker was taken for rank 1 (its exit 0 for the rank's, which had segfaulted).
    #[test]
    fn a_workers_own_line_goes_to_its_rank_and_claims_no_rank_for_the_worker() {
        let ranks = std::sync::Mutex::new(PidRanks::default());
        let mut router = TaggedRouter { world: 2, local: 2, grow_to: None, pending: Default::default() };
        let at = Instant::now();
        let worker = r#"{"t":"worker","id":0,"pid":160,"start_method":"fork","rank":1}"#;
        assert_eq!(ranks_of(&router.route(worker, at, &ranks, |_| None)), [(1, true)]);
        assert!(!ranks.lock().unwrap().claimed.contains_key(&160), "{:?}", ranks.lock().unwrap().claimed);
        let rank = r#"{"t":"begin","phase":"forward","step":0,"pid":150,"rank":1}"#;
        assert_eq!(ranks_of(&router.route(rank, at, &ranks, |_| None)), [(1, true)]);
        assert_eq!(ranks.lock().unwrap().claimed.get(&150), Some(&1));
    }

    /// After a launcher's restart the rank's new process (and its workers) write to the same FIFO
    /// with the same rank: their lines are not the first process's, which the rank's result holds.
    #[test]
    fn lines_of_a_rank_started_again_and_of_its_workers_are_not_routed() {
        let ranks = std::sync::Mutex::new(PidRanks::default());
        let mut router = TaggedRouter { world: 2, local: 2, grow_to: None, pending: Default::default() };
        let at = Instant::now();
        let parent = |pid: u32| match pid {
            600 => Some(500),
            150 => Some(100),
            _ => None,
        };
        ranks.lock().unwrap().found.insert(100, 1);
        let first = r#"{"t":"observer","steps":3,"pid":100,"rank":1}"#;
        assert_eq!(ranks_of(&router.route(first, at, &ranks, parent)), [(1, true)]);
        ranks.lock().unwrap().restarted.insert(500);
        let again = r#"{"t":"observer","steps":9,"pid":500,"rank":1}"#;
        assert!(router.route(again, at, &ranks, parent).is_empty());
        let its_worker = r#"{"t":"observer","steps":0,"pid":600}"#;
        assert!(router.route(its_worker, at, &ranks, parent).is_empty());
        // A third attempt's process, which discovery no longer looks for, is no more the rank's.
        let third = r#"{"t":"observer","steps":2,"pid":700,"rank":1}"#;
        assert!(router.route(third, at, &ranks, parent).is_empty());
        let still = router.route(first, at, &ranks, parent);
        assert_eq!(ranks_of(&still), [(1, true)], "the first process's lines still go");
        let first_worker = r#"{"t":"worker","id":0,"pid":150,"start_method":"fork"}"#;
        assert_eq!(ranks_of(&router.route(first_worker, at, &ranks, parent)), [(1, true)]);
    }

    #[test]
    fn a_group_larger_than_the_world_grows_it_before_the_new_ranks_lines_are_routed() {
        let ranks = std::sync::Mutex::new(PidRanks::default());
        let mut router = TaggedRouter { world: 1, local: 1, grow_to: Some(4), pending: Default::default() };
        let at = Instant::now();
        let none = |_: u32| None;
        // Rank 1 (Lightning's child, an `mp.spawn` rank) speaks first: beyond the world, it waits.
        let start = r#"{"t":"start","pid":701,"world_size":1,"device":"python","rank":1}"#;
        assert!(router.route(start, at, &ranks, none).is_empty());
        // Rank 0 formed a group of 2: the world grows first, then its line goes to rank 0.
        let group = r#"{"t":"group","backend":"gloo","rank":0,"world_size":2,"store":"env://","pid":700}"#;
        let events = router.route(group, at, &ranks, none);
        assert!(matches!(events[0], Event::WorldGrew { world: 2, .. }), "{events:?}");
        assert_eq!(ranks_of(&events[1..]), [(0, true)]);
        // Rank 1's next line is routed, with the line that waited.
        let group1 = r#"{"t":"group","backend":"gloo","rank":1,"world_size":2,"store":"env://","pid":701}"#;
        assert_eq!(ranks_of(&router.route(group1, at, &ranks, none)), [(1, true), (1, true)]);
        // A group past the cap, or no larger, grows nothing.
        let huge = r#"{"t":"group","backend":"gloo","rank":0,"world_size":9,"store":"env://","pid":700}"#;
        assert_eq!(ranks_of(&router.route(huge, at, &ranks, none)), [(0, true)]);
        let mut fixed = TaggedRouter { world: 1, local: 1, grow_to: None, pending: Default::default() };
        let ranks = std::sync::Mutex::new(PidRanks::default());
        assert!(fixed.route(group, at, &ranks, none).iter().all(|e| !matches!(e, Event::WorldGrew { .. })));
    }

    #[test]
    fn another_nodes_rank_waits_until_this_node_is_placed_there() {
        // Node 0 of two, two ranks each; torchrun's rendezvous gave it ranks 2 and 3.
        let ranks = std::sync::Mutex::new(PidRanks::default());
        let mut router = TaggedRouter { world: 4, local: 2, grow_to: None, pending: Default::default() };
        let at = Instant::now();
        let none = |_: u32| None;
        let start = r#"{"t":"start","pid":500,"world_size":4,"device":"python","rank":3}"#;
        assert!(router.route(start, at, &ranks, none).is_empty(), "not one of ranks 0-1");
        assert_eq!(ranks.lock().unwrap().claimed.get(&500), Some(&3), "the claim is global");
        ranks.lock().unwrap().first = 2;
        let begin = r#"{"t":"begin","phase":"forward","step":0,"pid":500,"rank":3}"#;
        assert_eq!(ranks_of(&router.route(begin, at, &ranks, none)), [(1, true), (1, true)]);
        // Beyond the world it is no rank at all.
        assert!(router.route(r#"{"t":"begin","phase":"x","pid":600,"rank":4}"#, at, &ranks, none).is_empty());
        assert!(!ranks.lock().unwrap().claimed.contains_key(&600));
    }

    #[test]
    fn a_group_marker_says_where_a_cluster_placed_the_node_until_a_rank_is_found() {
        // Node 0 of two, one rank each; Ray placed this node's worker at world rank 1.
        let ranks = std::sync::Mutex::new(PidRanks::default());
        let mut router = TaggedRouter { world: 2, local: 1, grow_to: None, pending: Default::default() };
        let (at, none) = (Instant::now(), |_: u32| None);
        let group = r#"{"t":"group","backend":"gloo","rank":1,"world_size":2,"local_rank":0,"pid":900}"#;
        assert!(router.route(group, at, &ranks, none).is_empty(), "not yet this node's");
        assert_eq!(ranks.lock().unwrap().said_first, Some(1));
        // A second word does not move it; neither does one once a rank was found, nor one that
        // leaves no room for the node's ranks.
        let other = r#"{"t":"group","backend":"gloo","rank":0,"world_size":2,"local_rank":0,"pid":901}"#;
        router.route(other, at, &ranks, none);
        assert_eq!(ranks.lock().unwrap().said_first, Some(1));
        for (found, line) in [
            (true, r#"{"t":"group","backend":"gloo","rank":0,"world_size":2,"local_rank":0,"pid":902}"#),
            (false, r#"{"t":"group","backend":"gloo","rank":1,"world_size":2,"local_rank":2,"pid":903}"#),
        ] {
            let ranks = std::sync::Mutex::new(PidRanks::default());
            if found {
                ranks.lock().unwrap().found.insert(1, 0);
            }
            router.route(line, at, &ranks, none);
            assert_eq!(ranks.lock().unwrap().said_first, None, "{line}");
        }
    }

    #[test]
    fn progress_markers_queue_without_waking_the_loop_and_an_exit_wakes_it() {
        let (sink, queue, wakes) = Sink::new();
        let at = Instant::now();
        let step = Marker::Step { step: 3, loss: 0.5, data_ms: 1.0, compute_ms: 2.0, samples: 8 };
        assert!(sink.send(Event::Marker { rank: 0, at, marker: step }));
        assert!(sink.send(Event::Output { rank: 0, at, from: None }));
        assert!(wakes.try_recv().is_err(), "a step only moves the hang deadline later");
        assert_eq!(queue.try_iter().count(), 2, "but it is queued, with its arrival time");
        sink.send(Event::Exited { rank: 0, at });
        sink.send(Event::Marker { rank: 0, at, marker: Marker::StackEnd { threads: 2 } });
        assert!(wakes.try_recv().is_ok());
        assert!(wakes.try_recv().is_err(), "one pending wake-up stands for any number of events");
        assert_eq!(queue.try_iter().count(), 2);
        drop(queue);
        assert!(!sink.send(Event::Interrupt), "the loop is gone");
    }

    /// A small deterministic generator (xorshift), so that every run checks the same cases.
    struct Seeded(u64);

    impl Seeded {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// What a flood of `lines` lines of random kinds and sizes leaves in the queue, read by the
    /// real reader from a real pipe while the loop takes nothing: (markers, bad lines, dropped,
    /// the most markers and bytes waiting).
    fn flood(seed: u64, lines: usize, urgent_share: u64) -> (u64, u64, u64, (usize, usize), u64) {
        let mut rng = Seeded(seed);
        let mut text = Vec::new();
        let mut sent = 0u64;
        for i in 0..lines {
            let line: Vec<u8> = match rng.below(100) {
                // Valid progress markers, short or long.
                0..=59 => {
                    let longest = if rng.below(50) == 0 { 20_000 } else { 40 };
                    let phase = "p".repeat(1 + rng.below(longest) as usize);
                    format!(r#"{{"t":"progress","phase":"{phase}","done":{i},"total":{lines}}}"#).into_bytes()
                }
                // Markers that wake the loop (`done`).
                n if n < 60 + urgent_share => br#"{"t":"done"}"#.to_vec(),
                // Not JSON, or not UTF-8, or JSON that is no marker.
                n if n < 90 => match rng.below(3) {
                    0 => b"not a marker".to_vec(),
                    1 => vec![0xff, 0xfe, b'{', 0x80],
                    _ => br#"{"t":"no-such-marker","x":1}"#.to_vec(),
                },
                // Empty lines: not counted at all.
                n if n < 95 => Vec::new(),
                // A line over the limit (rarely: a few MiB each).
                _ if rng.below(200) == 0 => vec![b'x'; MAX_MARKER_LINE + 1 + rng.below(1000) as usize],
                _ => br#"{"t":"begin","phase":"forward"}"#.to_vec(),
            };
            if !line.is_empty() {
                sent += 1;
            }
            text.extend_from_slice(&line);
            text.push(b'\n');
        }
        let (sink, queue, _wakes) = Sink::new();
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let mut w = File::from(write);
            w.write_all(&text).unwrap();
        });
        let reader = std::thread::spawn({
            let sink = sink.clone();
            move || read_markers(0, File::from(read), sink)
        });
        writer.join().unwrap();
        reader.join().unwrap();
        let waiting = queue.waiting();
        let (mut markers, mut bad) = (0, 0);
        for event in queue.try_iter() {
            match event {
                Event::Marker { .. } => markers += 1,
                Event::BadMarker { .. } => bad += 1,
                _ => {}
            }
        }
        let dropped = sink.take_dropped().get(&0).copied().unwrap_or(0);
        (markers, bad, dropped, waiting, sent)
    }

    #[test]
    fn a_marker_flood_of_any_shape_is_bounded_and_every_line_is_accounted_for() {
        for (seed, lines, urgent) in [(1, 1_000, 0), (2, 120_000, 0), (3, 150_000, 30), (4, 400_000, 30)] {
            let (markers, bad, dropped, (held, bytes), sent) = flood(seed, lines, urgent);
            let what = format!(
                "seed {seed}, {lines} lines: {markers} markers, {bad} bad, {dropped} dropped of {sent}; {held} waiting, {bytes} bytes"
            );
            // Every line is a marker, a bad line or a counted drop: none vanishes.
            assert_eq!(markers + bad + dropped, sent, "{what}");
            // The queue never holds more than its bounds.
            assert!(held <= MAX_QUEUED_MARKERS * URGENT_FACTOR, "{what}");
            assert!(bytes <= MAX_QUEUED_BYTES * URGENT_FACTOR, "{what}");
            assert!(markers + bad <= (MAX_QUEUED_MARKERS * URGENT_FACTOR) as u64, "{what}");
            if sent as usize <= MAX_QUEUED_MARKERS / 2 {
                assert_eq!(dropped, 0, "{what}");
            } else {
                assert!(dropped > 0, "{what}");
            }
        }
    }
}
