//! Crash forensics inside the rank: native backtraces on fatal signals, and stack dumps of every
//! thread on request.
//!
//! Theory of operation:
//! - **Fatal signals** (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) run [`on_fatal_signal`] on an
//!   alternate stack (a stack overflow must still be reported). It first captures the raw return
//!   addresses into a fixed array and writes them as a `crash_raw` marker with `write(2)` only
//!   (async-signal-safe), then symbolises them (this allocates, so it may fail; the raw line is
//!   already out), then restores the default action and re-raises so the parent sees the real
//!   signal and exit status.
//! - **Stack dumps** are requested by the harness with [`STACK_DUMP_SIGNAL`] (SIGUSR1). That
//!   signal is blocked in every thread (the mask is set before any thread exists, so libtorch's
//!   OpenMP pool inherits it) except a dedicated dumper thread that waits for it with
//!   `sigwait`. The dumper then visits each thread: it sends it SIGUSR2, whose handler only
//!   records the raw addresses into a shared slot, and symbolises them itself in normal context.
//!   No allocation or lock ever happens inside a signal handler on the stuck threads.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::protocol::{self, Frame, Marker, STACK_DUMP_SIGNAL};

use super::markers;

const MAX_FRAMES: usize = 128;
const FATAL_SIGNALS: [i32; 5] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGABRT];
const THREAD_CAPTURE_SIGNAL: i32 = libc::SIGUSR2;
const ALT_STACK_SIZE: usize = 1 << 18;

/// Installs the crash handlers and the stack-dump thread. Call first thing, before tch starts
/// any thread.
pub fn install() {
    block_stack_dump_signal();
    install_alt_stack();
    for sig in FATAL_SIGNALS {
        set_handler(sig, on_fatal_signal as *const () as usize, libc::SA_SIGINFO | libc::SA_ONSTACK);
    }
    set_handler(
        THREAD_CAPTURE_SIGNAL,
        on_capture_request as *const () as usize,
        libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART,
    );
    std::thread::Builder::new()
        .name("ups-stack-dump".into())
        .spawn(stack_dump_loop)
        .expect("spawning the stack-dump thread");
}

/// In a data-loader worker: after `fork` only the calling thread exists, so the stack-dump
/// thread is started again (signal mask, handlers and alternate stack are inherited); a bus
/// error is then also announced the way PyTorch's workers do.
pub fn become_loader_worker() {
    let forked = own_threads().len() <= 1;
    if forked {
        let _ = std::thread::Builder::new().name("ups-stack-dump".into()).spawn(stack_dump_loop);
    }
    IN_LOADER_WORKER.store(true, Ordering::SeqCst);
}

static IN_LOADER_WORKER: AtomicBool = AtomicBool::new(false);

fn block_stack_dump_signal() {
    // SAFETY: plain sigset manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, STACK_DUMP_SIGNAL);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn install_alt_stack() {
    let stack: &'static mut [u8] = Box::leak(vec![0u8; ALT_STACK_SIZE].into_boxed_slice());
    let ss = libc::stack_t { ss_sp: stack.as_mut_ptr().cast(), ss_flags: 0, ss_size: stack.len() };
    // SAFETY: the stack is leaked, so it lives as long as the thread.
    unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
}

fn set_handler(sig: i32, handler: usize, flags: i32) {
    // SAFETY: installs a handler with a valid function pointer and an empty mask.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        action.sa_flags = flags;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(sig, &action, std::ptr::null_mut());
    }
}

/// Captures up to `MAX_FRAMES` return addresses of the calling thread without allocating.
fn capture_raw(out: &mut [usize; MAX_FRAMES]) -> usize {
    let mut n = 0;
    // SAFETY: `trace_unsynchronized` only requires that no other thread unwinds through the
    // backtrace crate concurrently with *symbolication*; raw tracing from a handler is the
    // documented use of this entry point.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            out[n] = frame.ip() as usize;
            n += 1;
            n < MAX_FRAMES
        });
    }
    n
}

/// Symbolises raw addresses (allocates; never call from a signal handler on a stuck thread).
fn symbolise(addrs: &[usize]) -> Vec<Frame> {
    let mut frames = Vec::with_capacity(addrs.len());
    for (i, &addr) in addrs.iter().enumerate() {
        // A return address points after the call; look up the call itself.
        let lookup = if i == 0 { addr } else { addr.saturating_sub(1) };
        let mut resolved = false;
        backtrace::resolve(lookup as *mut c_void, |sym| {
            let symbol = sym.name().map(|n| format!("{n:#}"));
            let location = match (sym.filename(), sym.lineno()) {
                (Some(f), Some(l)) => Some(format!("{}:{l}", f.display())),
                _ => None,
            };
            frames.push(Frame { addr: format!("{addr:#x}"), symbol, location });
            resolved = true;
        });
        if !resolved {
            frames.push(Frame { addr: format!("{addr:#x}"), symbol: object_offset(lookup), location: None });
        }
    }
    trim_handler_frames(frames)
}

/// For an address no symbol covers (a stripped library such as libtorch's bundled libgomp):
/// `<libgomp-a34b3233.so.1+0x1b2c3>`, the object it lies in and the offset, which still tells
/// the reader which library a thread is stuck in.
fn object_offset(addr: usize) -> Option<String> {
    // SAFETY: dladdr only reads the dynamic linker's tables; `info` is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set dli_fname to a NUL-terminated path owned by the dynamic linker.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    let name = path.rsplit('/').next().unwrap_or(&path).to_string();
    Some(format!("<{name}+{:#x}>", addr.wrapping_sub(info.dli_fbase as usize)))
}

/// Drops the frames of our own capture machinery (the unwinder, the handler and the kernel's
/// signal trampoline, which glibc's stripped symbol table leaves unnamed), so that frame #0 is
/// where the signal hit.
fn trim_handler_frames(frames: Vec<Frame>) -> Vec<Frame> {
    let is_handler = |f: &Frame| {
        f.symbol
            .as_deref()
            .is_some_and(|s| s.ends_with("on_fatal_signal") || s.ends_with("on_capture_request"))
    };
    let Some(handler) = frames.iter().position(is_handler) else {
        return frames;
    };
    let mut rest = handler + 1;
    // The trampoline has no symbol of its own (at most our `<libc.so.6+0x…>` placeholder).
    let unnamed = |s: &str| s.contains("restore_rt") || s.starts_with('<');
    if frames.get(rest).is_some_and(|f| f.symbol.as_deref().is_none_or(unnamed)) {
        rest += 1;
    }
    frames.into_iter().skip(rest).collect()
}

static IN_FATAL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_fatal_signal(sig: i32, _info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    if !IN_FATAL.swap(true, Ordering::SeqCst) {
        if sig == libc::SIGBUS && IN_LOADER_WORKER.load(Ordering::SeqCst) {
            let msg: &[u8] = b"ERROR: Unexpected bus error encountered in worker. This might be caused by \
                               insufficient shared memory (shm).\n";
            // SAFETY: write(2) is async-signal-safe.
            unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        }
        let mut addrs = [0usize; MAX_FRAMES];
        let n = capture_raw(&mut addrs);
        let fd = markers::raw_fd();
        if fd >= 0 {
            let mut buf = [0u8; 4096];
            let len = protocol::write_crash_raw(&mut buf, sig, protocol::monotonic_ns(), &addrs[..n]);
            // SAFETY: write(2) is async-signal-safe; buf holds `len` initialised bytes.
            unsafe { libc::write(fd, buf.as_ptr().cast(), len) };
            // Best effort from here on: symbolising allocates. If it faults, the nested fatal
            // signal is blocked, so the kernel kills us with it, which is still the right status.
            let frames = symbolise(&addrs[..n]);
            let line = Marker::Crash { signal: sig, frames }.to_stamped_line();
            // SAFETY: as above.
            unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
        }
    }
    // Our /dev/shm segments would outlive us otherwise (only the owning process removes them).
    super::loader::shm::unlink_registered();
    // Die by the same signal with the default action, so the exit status is the real one.
    // SAFETY: signal(2), sigprocmask(2) and raise(3) are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// The slot a thread fills in when asked for its stack. The dumper names the thread it asks in
/// `SLOT_FOR`; only that thread's handler fills the slot, so a late answer from a thread whose
/// wait already expired can never be taken for the next thread's stack.
static SLOT_FOR: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
static SLOT_ADDRS: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];
static SLOT_LEN: AtomicUsize = AtomicUsize::new(0);
static SLOT_READY: AtomicBool = AtomicBool::new(false);

extern "C" fn on_capture_request(_sig: i32, _info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // SAFETY: gettid is async-signal-safe.
    let me = unsafe { libc::syscall(libc::SYS_gettid) };
    if SLOT_FOR.load(Ordering::Acquire) != me || SLOT_READY.load(Ordering::Acquire) {
        return;
    }
    let mut addrs = [0usize; MAX_FRAMES];
    let n = capture_raw(&mut addrs);
    for (slot, &a) in SLOT_ADDRS.iter().zip(&addrs[..n]) {
        slot.store(a, Ordering::Relaxed);
    }
    SLOT_LEN.store(n, Ordering::Relaxed);
    SLOT_READY.store(true, Ordering::Release);
}

fn stack_dump_loop() {
    // SAFETY: sigwait on a set containing only the signal every thread blocks.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, STACK_DUMP_SIGNAL);
    }
    loop {
        let mut sig = 0;
        // SAFETY: valid set and out-pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        DUMPING.store(true, Ordering::SeqCst);
        dump_all_threads();
        DUMPING.store(false, Ordering::SeqCst);
    }
}

/// A stack dump the harness asked for is under way.
static DUMPING: AtomicBool = AtomicBool::new(false);

/// Waits, up to `limit`, for a stack dump the harness asked of this process (under way, or asked
/// and not yet begun) to be sent, so that a rank that fails while it is asked for its stacks (a
/// peer torn down on another node closed its connection) exits with them sent, not in the middle
/// of symbolising them (seen across two hosts: both nodes found the hang, one tore its ranks down
/// while the other's ranks were still dumping, and they exited without their stacks).
pub fn wait_for_stack_dump(limit: Duration) {
    let pending = || {
        // SAFETY: plain sigset queries on a local set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigpending(&mut set) == 0 && libc::sigismember(&set, STACK_DUMP_SIGNAL) == 1
        }
    };
    let deadline = Instant::now() + limit;
    while (DUMPING.load(Ordering::SeqCst) || pending()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This process's threads (procfs's `/proc/self/task`): id and name.
fn own_threads() -> Vec<(i64, String)> {
    let Ok(tasks) = procfs::process::Process::myself().and_then(|me| me.tasks()) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .map(|t| (i64::from(t.tid), t.stat().map(|s| s.comm).unwrap_or_default()))
        .collect()
}

/// Sends a `stack` marker for every thread but this one, then `stack_end`.
pub fn dump_all_threads() {
    let me = i64::from(nix::unistd::gettid().as_raw());
    let pid = std::process::id() as i32;
    let mut threads = own_threads();
    threads.sort_unstable();
    let mut answered = 0;
    for (tid, thread) in threads.into_iter().filter(|&(t, _)| t != me) {
        SLOT_READY.store(false, Ordering::SeqCst);
        SLOT_FOR.store(tid, Ordering::SeqCst);
        // SAFETY: tgkill to a thread of our own process.
        let sent = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, THREAD_CAPTURE_SIGNAL) };
        if sent != 0 {
            continue; // the thread exited meanwhile
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !SLOT_READY.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let answered_in_time = SLOT_READY.load(Ordering::Acquire);
        // From here on a late answer from this thread is ignored.
        SLOT_FOR.store(0, Ordering::SeqCst);
        let frames = if answered_in_time {
            let n = SLOT_LEN.load(Ordering::Relaxed);
            let addrs: Vec<usize> = SLOT_ADDRS[..n].iter().map(|a| a.load(Ordering::Relaxed)).collect();
            answered += 1;
            symbolise(&addrs)
        } else {
            vec![Frame {
                addr: "?".into(),
                symbol: Some("<thread did not answer the stack request within 2 s>".into()),
                location: None,
            }]
        };
        markers::emit(&Marker::Stack { tid, thread, frames });
    }
    markers::emit(&Marker::StackEnd { threads: answered });
}
