//! Running a short helper program (a Python interpreter, `py-spy`, our own `cuda-probe`) with a
//! time limit, and finding programs on `PATH`: the one way the probes and the harness do both.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a bounded command left: its status and its whole output.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` with no stdin and both outputs read as they come (so a talkative command never
/// blocks on a full pipe). `Ok(None)`: it did not end within `limit` and was killed.
pub fn bounded(cmd: &mut Command, limit: Duration) -> std::io::Result<Option<Finished>> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let out = child.stdout.take().map(|s| std::thread::spawn(move || read_all(s)));
    let err = child.stderr.take().map(|s| std::thread::spawn(move || read_all(s)));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let join = |h: Option<std::thread::JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
    let (stdout, stderr) = (join(out), join(err));
    Ok(status.map(|status| Finished { status, stdout, stderr }))
}

fn read_all(mut r: impl std::io::Read) -> String {
    let mut buf = Vec::new();
    let _ = r.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The first executable file named `name` in a folder of `PATH` (as `execvp` would pick it).
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| is_executable(p))
}

/// A regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_ends_gives_its_status_and_output() {
        let done = bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(30),
        )
        .unwrap()
        .expect("it ends");
        assert_eq!(
            (done.status.code(), done.stdout.as_str(), done.stderr.as_str()),
            (Some(3), "out\n", "err\n")
        );
    }

    #[test]
    fn a_command_that_does_not_end_is_killed_at_the_limit() {
        let ran =
            bounded(Command::new("sh").args(["-c", "exec sleep 30"]), Duration::from_millis(200)).unwrap();
        assert!(ran.is_none());
    }

    #[test]
    fn programs_are_found_on_path() {
        assert!(find_on_path("sh").is_some_and(|p| is_executable(&p)));
        assert_eq!(find_on_path("ups-doctor-no-such-program"), None);
    }
}
