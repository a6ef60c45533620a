//! Writing to the terminal when the reader may be gone: `ups-doctor env | head -1`,
//! `ups-doctor run … | true`, Ctrl-C on `ups-doctor run … | tee log` (tee dies first).
//!
//! Rust starts every program with `SIGPIPE` ignored, so a write to a pipe whose reader left fails
//! with `EPIPE`, and std's `println!` then panics (exit 101 and a backtrace). Unix tools instead
//! stop writing to a reader that left and end quietly. ups-doctor keeps `SIGPIPE` ignored (dying
//! of it would lose the result of a run still being saved) and does what such tools do with the
//! `EPIPE`: the stream is marked closed, nothing more is written to it, the command finishes its
//! work (result.json and report.md are written) and ends with its documented exit status
//! ([`crate::exit`]). Any other failed write to the terminal (a full disk under `> file`) is said
//! once on stderr and then ignored the same way; none ever panics.
//!
//! The macros [`print!`](crate::print), [`println!`](crate::println), [`eprint!`](crate::eprint)
//! and [`eprintln!`](crate::eprintln) stand in for std's: the library has them in textual scope
//! (lib.rs declares this module first, with `#[macro_use]`), and `main.rs` imports them, so every
//! line ups-doctor prints goes through [`write`]. Children are unaffected: `std::process::Command`
//! gives them `SIGPIPE` back at its default action.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// One of the two streams ups-doctor prints to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

impl Stream {
    fn closed(self) -> &'static AtomicBool {
        match self {
            Stream::Stdout => &STDOUT_CLOSED,
            Stream::Stderr => &STDERR_CLOSED,
        }
    }
}

/// Whether `stream`'s reader has gone (or writing to it failed): nothing more is written to it.
pub fn is_closed(stream: Stream) -> bool {
    stream.closed().load(Ordering::Relaxed)
}

/// Writes `args` to `stream`, never panicking: a failed write closes the stream for the rest of
/// the command (see the module's documentation). What is written passes the one rule for secrets
/// first ([`crate::secrets::scrub`]: secrets masked, control sequences removed): this is the
/// terminal's choke point.
pub fn write(stream: Stream, args: fmt::Arguments<'_>) {
    if is_closed(stream) {
        return;
    }
    let text = fmt::format(args);
    write_raw(stream, &crate::secrets::scrub(&text));
}

/// [`write`] for ups-doctor's own styled output (the coloured matrix, the live status line): the
/// same rule, keeping colour sequences, `ESC [ K` and carriage returns
/// ([`crate::secrets::scrub_styled`]).
pub fn write_styled(stream: Stream, text: &str) {
    if !is_closed(stream) {
        write_raw(stream, &crate::secrets::scrub_styled(text));
    }
}

/// A JSON document on `stream` (`--json`), masked as a document ([`crate::secrets::scrub_json`])
/// rather than as text, pretty, ending in a newline.
pub fn write_json(stream: Stream, doc: &impl serde::Serialize) {
    if is_closed(stream) {
        return;
    }
    let mut value = serde_json::to_value(doc).expect("what ups-doctor prints serialises");
    crate::secrets::scrub_json(&mut value);
    let text = serde_json::to_string_pretty(&value).expect("a JSON value always encodes") + "\n";
    write_raw(stream, &text);
}

fn write_raw(stream: Stream, text: &str) {
    let written = match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            // A line that stays in the buffer would fail only at exit, where nothing can tell.
            out.write_all(text.as_bytes()).and_then(|()| out.flush())
        }
        Stream::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
    };
    if let Err(e) = written {
        gone(stream, &e);
    }
}

/// `stream` failed with `e`: closed from now on; said on stderr unless the reader just left.
fn gone(stream: Stream, e: &std::io::Error) {
    if stream.closed().swap(true, Ordering::Relaxed) {
        return;
    }
    if e.kind() != std::io::ErrorKind::BrokenPipe && stream == Stream::Stdout && !is_closed(Stream::Stderr) {
        let _ = writeln!(
            std::io::stderr(),
            "ups-doctor: warning: could not write to stdout: {e}; the rest of it is dropped"
        );
    }
}

/// std's `print!`, except that a reader who left is not an error (see [`crate::output`]).
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::output::write($crate::output::Stream::Stdout, format_args!($($arg)*)) };
}

/// std's `println!`, except that a reader who left is not an error (see [`crate::output`]).
#[macro_export]
macro_rules! println {
    () => { $crate::output::write($crate::output::Stream::Stdout, format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::output::write($crate::output::Stream::Stdout, format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// std's `eprint!`, except that a reader who left is not an error (see [`crate::output`]).
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::output::write($crate::output::Stream::Stderr, format_args!($($arg)*)) };
}

/// std's `eprintln!`, except that a reader who left is not an error (see [`crate::output`]).
#[macro_export]
macro_rules! eprintln {
    () => { $crate::output::write($crate::output::Stream::Stderr, format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::output::write($crate::output::Stream::Stderr, format_args!("{}\n", format_args!($($arg)*)))
    };
}
