//! Reliability, second pass (issue 32), through the real binary: the world a user's shell, a
//! shared `/tmp`, a full disk, a big job and a public issue tracker make for ups-doctor.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::util::{Sandbox, eventually, files_under, unpack_bundle};

/// A pipe: (read end, write end).
fn pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    nix::unistd::pipe().expect("a pipe")
}

/// The write end of a pipe whose reader has already gone: what `… | true` gives a program.
fn reader_gone() -> std::os::fd::OwnedFd {
    let (reader, writer) = pipe();
    drop(reader);
    writer
}

/// What a test must never see on ups-doctor's stderr: a panic over a closed pipe.
fn assert_no_panic(stderr: &str, what: &str) {
    assert!(!stderr.contains("panicked"), "{what} panicked:\n{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{what} complained about the closed pipe:\n{stderr}");
}

#[test]
fn env_into_a_reader_that_left_ends_quietly_with_0() {
    let sb = Sandbox::new();
    for args in [&["env"][..], &["env", "--json"], &["env", "--markdown"]] {
        let out = sb.cmd().args(args).stdout(reader_gone()).stderr(Stdio::piped()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("`ups-doctor {}` ({})", args.join(" "), out.status);
        assert_no_panic(&stderr, &what);
        assert_eq!(out.status.code(), Some(0), "{what}:\n{stderr}");
    }
}

#[test]
fn run_into_a_reader_that_left_saves_everything_and_keeps_its_exit_status() {
    let sb = Sandbox::new();
    let passes = sb.scenario("passes", r#"{"command": ["true"]}"#);
    let fails = sb.scenario("fails", r#"{"command": ["false"]}"#);
    // `run … | true` (stdout gone), and `run … |& true` (both gone), with and without --json.
    for (file, code) in [(&passes, 0), (&fails, 1)] {
        for (stderr_gone, json) in [(false, false), (false, true), (true, false)] {
            let out_dir = sb.path().join(format!("out-{code}-{stderr_gone}-{json}"));
            let mut cmd = sb.cmd();
            cmd.arg("run").arg(file).arg("--out").arg(&out_dir).stdout(reader_gone());
            if json {
                cmd.arg("--json");
            }
            if stderr_gone {
                cmd.stderr(reader_gone());
            } else {
                cmd.stderr(Stdio::piped());
            }
            let out = cmd.output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let what =
                format!("{} (stderr gone: {stderr_gone}, --json: {json}): {}", file.display(), out.status);
            assert_no_panic(&stderr, &what);
            assert_eq!(out.status.code(), Some(code), "{what}:\n{stderr}");
            for name in ["result.json", "report.md"] {
                assert!(out_dir.join(name).is_file(), "no {name}: {what}:\n{stderr}");
            }
        }
    }
}

/// Every file under `dir`, recursively.
#[test]
fn ctrl_c_while_piped_into_a_tee_that_died_first_saves_and_exits_130() {
    use std::os::unix::process::CommandExt;
    let sb = Sandbox::new();
    let started = sb.path().join("started");
    let file = sb.scenario(
        "waits",
        &format!(
            r#"{{"command": ["sh", "-c", "touch {}; exec sleep 600"], "limits": {{"timeout_s": 300, "hang_after_s": 200}}}}"#,
            started.display()
        ),
    );
    let (reader, writer) = pipe();
    let stderr_file = sb.path().join("stderr");
    // Live progress on (not --quiet): the progress lines go to stderr, the matrix to stdout.
    let mut child = sb
        .cmd()
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(sb.out())
        .stdout(writer)
        .stderr(std::fs::File::create(&stderr_file).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(120), || started.exists()), "the scenario never started");
    // The terminal's Ctrl-C reaches the whole pipeline; `tee` dies of it first.
    drop(reader);
    // SAFETY: kill(2) on the process group of the child started above.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(&stderr_file).unwrap();
    let what = format!("status {status}\n{stderr}");
    assert_no_panic(&stderr, &what);
    assert_eq!(status.code(), Some(130), "{what}");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sb.out().join("result.json")).unwrap()).unwrap();
    assert_eq!(result["interrupted"], true, "{result:#}");
    assert!(sb.out().join("report.md").is_file(), "{what}");
    let temporary: Vec<PathBuf> =
        files_under(&sb.out()).into_iter().filter(|f| f.extension().is_some_and(|e| e == "tmp")).collect();
    assert!(temporary.is_empty(), "temporary files left: {temporary:?}");
}

#[test]
fn links_planted_in_a_reused_out_are_never_written_through() {
    use std::os::unix::fs::symlink;
    let sb = Sandbox::new();
    let file = sb.scenario("plain", r#"{"command": ["sh", "-c", "echo out-line; echo err-line >&2"]}"#);
    // Someone who could prepare the folder (a shared /tmp) planted links to a file of the victim.
    let victim = sb.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let scenario_dir = sb.out().join("1-plain");
    std::fs::create_dir_all(&scenario_dir).unwrap();
    std::fs::create_dir_all(sb.out().join("python-site")).unwrap();
    let planted = [
        scenario_dir.join("rank0.stdout.log"),
        scenario_dir.join("rank0.stderr.log"),
        scenario_dir.join("scenario.json"),
        sb.out().join("python-site/sitecustomize.py"),
        sb.out().join("result.json"),
        sb.out().join("report.md"),
    ];
    for link in &planted {
        symlink(&victim, link).unwrap();
    }
    let out = sb.cmd().arg("run").arg(&file).arg("--out").arg(sb.out()).arg("--quiet").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n", "written through a link:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for path in &planted {
        let meta = std::fs::symlink_metadata(path).unwrap();
        assert!(meta.file_type().is_file(), "{} is still a link", path.display());
    }
    assert_eq!(std::fs::read_to_string(&planted[0]).unwrap(), "out-line\n");
    assert_eq!(std::fs::read_to_string(&planted[1]).unwrap(), "err-line\n");

    // A scenario folder planted as a link to a folder elsewhere is refused, and nothing lands there.
    let elsewhere = sb.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let out2 = sb.path().join("out2");
    std::fs::create_dir_all(&out2).unwrap();
    symlink(&elsewhere, out2.join("1-plain")).unwrap();
    let out = sb.cmd().arg("run").arg(&file).arg("--out").arg(&out2).arg("--quiet").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "files written into the linked folder:\n{stderr}"
    );
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("is a symbolic link"), "{stderr}");
}

#[test]
fn a_full_disk_cuts_only_this_runs_own_logs_and_says_which_and_by_how_much() {
    let sb = Sandbox::new();
    // 290 kB of output. No copy of ups-doctor's own sitecustomize.py in the run's folder
    // (the user chose the buffering and no observer is asked for): a full disk removes that copy
    // before it cuts any log (`reliability::a_full_disk…`), and this test is about the logs.
    let noisy = sb.scenario("noisy", r#"{"command": ["seq", "1", "50000"], "launch": {"observe": false}}"#);
    let disk = crate::util::SmallDisk::mount(sb.path().join("small"), "192k");
    let out_dir = disk.0.join("out");
    // The user's own logs, in the --out they reuse: the largest files on the disk.
    std::fs::create_dir_all(out_dir.join("1-noisy")).unwrap();
    let theirs: Vec<(PathBuf, Vec<u8>)> = [("notes.log", 70_000), ("1-noisy/earlier.log", 20_000)]
        .into_iter()
        .map(|(name, len)| {
            let bytes: Vec<u8> = (0..len).map(|i| b"user log line\n"[i % 14]).collect();
            let path = out_dir.join(name);
            std::fs::write(&path, &bytes).unwrap();
            (path, bytes)
        })
        .collect();
    let out = sb
        .cmd()
        .env("PYTHONUNBUFFERED", "1")
        .arg("run")
        .arg(&noisy)
        .arg("--out")
        .arg(&out_dir)
        .arg("--quiet")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let what = format!("status {}\n{stderr}", out.status);
    assert!(!out_dir.join("python-site").exists(), "ups-doctor's sitecustomize.py was written; {what}");
    for (path, bytes) in &theirs {
        assert!(std::fs::read(path).unwrap() == *bytes, "the user's {} was changed; {what}", path.display());
    }
    assert_eq!(out.status.code(), Some(0), "{what}");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("result.json")).unwrap()).unwrap();
    let cuts = result["logs_cut"].as_array().unwrap_or_else(|| panic!("no logs_cut: {result:#}"));
    assert_eq!(cuts.len(), 1, "{result:#}");
    assert_eq!(cuts[0]["path"], "1-noisy/rank0.stdout.log", "{result:#}");
    let (from, to) = (cuts[0]["from_bytes"].as_u64().unwrap(), cuts[0]["to_bytes"].as_u64().unwrap());
    let now = std::fs::metadata(out_dir.join("1-noisy/rank0.stdout.log")).unwrap().len();
    assert_eq!(to, now, "the result's length of the cut log is not the file's");
    assert!(to < from, "{result:#}");
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains(&format!("`1-noisy/rank0.stdout.log`: {from} → {to} bytes")), "{report}");
    assert!(stderr.contains("1-noisy/rank0.stdout.log"), "{what}");
}

/// `ups-doctor` started with the open-file limit `soft`:`hard`, as `ulimit -Sn`/`-Hn` leave it.
fn with_open_files(mut cmd: std::process::Command, soft: u64, hard: u64) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn a_low_soft_open_file_limit_is_raised_so_every_rank_starts() {
    let sb = Sandbox::new();
    // 100 ranks need about 600 files; the soft limit of 128 stopped rank 24 with EMFILE.
    // Ranks that live until every one has started (`true` ranks would free their files at once).
    let file = sb.scenario(
        "many",
        r#"{"command": ["sleep", "5"], "launch": {"style": "per_rank", "world_size": 100}}"#,
    );
    let mut cmd = sb.cmd();
    cmd.arg("run").arg(&file).arg("--out").arg(sb.out()).args(["--quiet", "--json"]);
    let out = with_open_files(cmd, 128, 4096).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{}", result["scenarios"][0]["verdict"]);
    assert_eq!(result["scenarios"][0]["ranks"].as_array().map(Vec::len), Some(100));
}

#[test]
fn a_world_size_the_hard_open_file_limit_cannot_hold_is_refused_before_launch() {
    let sb = Sandbox::new();
    // Ranks that live until every one has started (`true` ranks would free their files at once).
    let file = sb.scenario(
        "many",
        r#"{"command": ["sleep", "5"], "launch": {"style": "per_rank", "world_size": 100}}"#,
    );
    let mut cmd = sb.cmd();
    cmd.arg("run").arg(&file).arg("--out").arg(sb.out()).arg("--quiet");
    let out = with_open_files(cmd, 256, 256).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`launch.world_size`: 100 ranks need about"), "{stderr}");
    assert!(stderr.contains("open-file limit is 256"), "{stderr}");
    assert!(stderr.contains("ulimit -Hn"), "{stderr}");
    let most: u64 = stderr
        .split("use `world_size: ")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no world size offered: {stderr}"));
    assert!((1..100).contains(&most), "{stderr}");
    assert!(!sb.out().join("1-many").exists(), "ranks were launched");
}

#[test]
fn many_ranks_that_could_not_start_are_summed_up_as_ranges() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "missing",
        r#"{"command": ["no-such-program-for-ups-doctor"], "launch": {"style": "per_rank", "world_size": 40}}"#,
    );
    let out = sb.run(&[&file], &[]);
    let headline = out.scenario()["verdict"]["headline"].as_str().unwrap().to_string();
    assert!(headline.contains("Ranks 1–39 failed after it"), "{headline}");
    let evidence = out.scenario()["verdict"]["evidence"].to_string();
    assert!(evidence.contains("ranks 1–39 could not be started"), "{evidence}");
    assert!(!evidence.contains("rank 17 "), "{evidence}");
}

#[test]
fn secrets_in_env_argv_params_and_program_output_reach_no_output() {
    let sb = Sandbox::new();
    // Token-shaped values are long enough to be recognised as tokens by shape alone.
    let ghp = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";
    let hf = "hf_abcdefghijklmnopqrstuvwxyz012345";
    let sk = "sk-proj-abcdefghijklmnopqrstuvwxyz0123";
    let aws = "AKIAIOSFODNN7EXAMPLE";
    let env = [
        ("TORCH_GITHUB_PAT", ghp.to_string()),
        ("NCCL_DB_PASS", "passvalue1".to_string()),
        ("NCCL_PWD", "pwdvalue1".to_string()),
        ("TORCH_CREDS", "credsvalue1".to_string()),
        ("UPS_DOCTOR_PW", "pwvalue1".to_string()),
        ("UPS_DOCTOR_STORE", "tcp://admin:urlpassword1@10.0.0.1:29500".to_string()),
    ];
    // The program prints secrets too: a traceback-like error and its configuration.
    // And the values it was given, echoed: its `--api-key` ($2) and its scenario's `HF_TOKEN`.
    let script = format!(
        "echo \"config: HF_TOKEN=outputtoken1 store=tcp://u:outputpw1@h:1\"; \
         echo \"using key $2 and token $HF_TOKEN\"; \
         echo \"RuntimeError: auth failed for {sk} and {aws}\" >&2; exit 1"
    );
    let file = sb.scenario(
        "leaky",
        &serde_json::json!({
            "command": ["sh", "-c", script, "sh", "--api-key", "apikeyvalue1", "--hf-token", hf,
                        "--token=tokenvalue1", "--key", "{api_key}"],
            "launch": {"style": "per_rank", "env": {"HF_TOKEN": "envtokenvalue1"}},
            "params": {"api_key": "paramvalue0"}
        })
        .to_string(),
    );
    let secrets = [
        ghp,
        hf,
        sk,
        aws,
        "passvalue1",
        "pwdvalue1",
        "credsvalue1",
        "pwvalue1",
        "urlpassword1",
        "outputtoken1",
        "outputpw1",
        "apikeyvalue1",
        "tokenvalue1",
        "paramvalue0",
        "paramvalue1",
        "envtokenvalue1",
    ];
    let run = sb
        .cmd()
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(sb.out())
        .args(["--set", "params.api_key=paramvalue1", "--json", "--quiet"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    let mut shown = vec![("run --json".to_string(), String::from_utf8_lossy(&run.stdout).into_owned())];
    // The program's own output did reach the result (so masking, not absence, keeps it out).
    assert!(shown[0].1.contains("RuntimeError: auth failed for"), "{}", shown[0].1);
    for args in [&["report", "out", "--issue", "--public"][..], &["report", "out", "--issue"]] {
        let out = sb.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        shown.push((args.join(" "), String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    // The bundle's files, log tails included.
    let bundled = sb.cmd().args(["report", "out", "--bundle"]).output().unwrap();
    assert_eq!(bundled.status.code(), Some(0), "{}", String::from_utf8_lossy(&bundled.stderr));
    let in_bundle = unpack_bundle(&sb.out(), &sb.path().join("unpacked"));
    assert!(in_bundle.iter().any(|p| p.to_string_lossy().contains("logs/")), "{in_bundle:?}");
    for path in in_bundle {
        shown.push((format!("bundle: {}", path.display()), std::fs::read_to_string(&path).unwrap()));
    }
    for args in [&["env"][..], &["env", "--json"], &["env", "--markdown"], &["env", "--public"]] {
        let out = sb.cmd().args(args).envs(env.iter().map(|(k, v)| (*k, v.as_str()))).output().unwrap();
        shown.push((args.join(" "), String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    // Every file of the run folder, but the program's own records: its logs, as it wrote them,
    // and scenario.json, which must keep the values to run it again.
    let mut checked = 0;
    for path in files_under(&sb.out()) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".log") || name == "scenario.json" || name.ends_with(".tar.gz") {
            continue;
        }
        checked += 1;
        shown.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
    }
    assert!(checked >= 2, "result.json and report.md at least");
    for (what, text) in &shown {
        for secret in secrets {
            assert!(!text.contains(secret), "{what} shows `{secret}`:\n{text}");
        }
    }
    let result = &shown[0].1;
    for name in ["TORCH_GITHUB_PAT", "NCCL_DB_PASS", "UPS_DOCTOR_STORE", "--api-key", "--hf-token"] {
        assert!(result.contains(name), "the result lost {name}:\n{result}");
    }
    assert!(result.contains("tcp://admin:<redacted>@10.0.0.1:29500"), "{result}");
}

/// `bisect -- CMD` and `sweep -- CMD` of a command that carries secrets in its flags and prints
/// them: bisect.json, bisect.md, sweep.json, sweep.md and every run folder under them show none.
/// minimal.json and scenario.json are scenarios to run again and keep their values.
#[test]
fn secrets_in_a_commands_flags_reach_no_bisect_or_sweep_output() {
    let hf = "hf_abcdefghijklmnopqrstuvwxyz012345";
    let script = "echo \"RuntimeError: auth failed with $2 and $4\" >&2; exit 1";
    // `--steps 5` gives bisect something to cut.
    let leaky = [
        "sh",
        "-c",
        script,
        "sh",
        "--api-key",
        "apikeyvalue2",
        "--hf-token",
        hf,
        "--token=tokenvalue2",
        "--steps",
        "5",
    ];
    let secrets = ["apikeyvalue2", hf, "tokenvalue2"];
    let sb = Sandbox::new();
    let bisect = sb
        .cmd()
        .args(["bisect", "--quiet", "--budget", "12", "--out"])
        .arg(sb.path().join("bisect"))
        .arg("--cache")
        .arg(sb.path().join("cache"))
        .arg("--")
        .args(leaky)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bisect.stderr);
    assert!(sb.path().join("bisect/bisect.json").exists(), "bisect wrote nothing:\n{stderr}");
    let sweep = sb
        .cmd()
        .args(["sweep", "--quiet", "-L", "n", "1,2", "--out"])
        .arg(sb.path().join("sweep"))
        .arg("--")
        .args(leaky)
        .args(["--n", "{n}"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&sweep.stderr);
    assert!(sb.path().join("sweep/sweep.json").exists(), "sweep wrote nothing:\n{stderr}");
    let mut checked = Vec::new();
    for path in
        files_under(&sb.path().join("bisect")).into_iter().chain(files_under(&sb.path().join("sweep")))
    {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".log") || name == "scenario.json" || name == "minimal.json" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for secret in secrets {
            assert!(!text.contains(secret), "{} shows `{secret}`:\n{text}", path.display());
        }
        checked.push(name);
    }
    for name in ["bisect.json", "bisect.md", "sweep.json", "sweep.md", "result.json", "report.md"] {
        assert!(checked.iter().any(|c| c == name), "{name} was not among the files checked: {checked:?}");
    }
}

/// `setsid sleep 600`, started by the test (so before any run): nobody's run. Killed on drop.
struct Bystander(std::process::Child);

impl Bystander {
    /// Started, and older than anything started after this returns by at least two clock ticks:
    /// ups-doctor tells a process moved in from outside by its start time, which the kernel keeps
    /// in ticks (1/100 s), so one started in the same tick as the run is not provably older.
    fn start() -> Bystander {
        let child = std::process::Command::new("setsid")
            .args(["sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = start_ticks(child.id()).expect("the bystander's start time");
        assert!(
            eventually(Duration::from_secs(5), || uptime_ticks() >= started + 3),
            "the clock did not move"
        );
        Bystander(child)
    }
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat`, field 22).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The time since boot in the same ticks (`/proc/uptime`; USER_HZ is 100).
fn uptime_ticks() -> u64 {
    let text = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    text.split_whitespace().next().and_then(|s| s.parse::<f64>().ok()).map_or(0, |s| (s * 100.0) as u64)
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The shell lines that put `$d` to the writing process's own scenario cgroup folder (cgroup v1's
/// memory hierarchy, else v2).
const OWN_CGROUP: &str = "d=$(grep -E '^[0-9]+:memory:' /proc/self/cgroup | cut -d: -f3); b=/sys/fs/cgroup/memory; \
     [ -n \"$d\" ] || { d=$(grep '^0::' /proc/self/cgroup | cut -d: -f3); b=/sys/fs/cgroup; }; d=$b$d";

#[test]
fn a_foreign_process_moved_into_the_scenarios_cgroup_is_left_alone() {
    let sb = Sandbox::new();
    let bystander = Bystander::start();
    let pid = bystander.0.id();
    let moved = sb.path().join("moved");
    // A program running as root writes a pid that is not its own into its cgroup.procs.
    let script = format!("{OWN_CGROUP}; echo {pid} > $d/cgroup.procs && echo $d > {}", moved.display());
    let file = sb.scenario("mover", &serde_json::json!({"command": ["sh", "-c", script]}).to_string());
    let out = sb.run(&[&file], &[]);
    let stderr = out.stderr();
    let cgroup = std::fs::read_to_string(&moved).unwrap_or_else(|_| {
        panic!("the program could not move the process (no scenario cgroup?):\n{stderr}")
    });
    assert!(crate::util::alive(u64::from(pid)), "the foreign process was killed:\n{stderr}");
    let leftovers = out.scenario()["leftovers"].to_string();
    assert!(!leftovers.contains(&format!("\"pid\":{pid}")), "listed as the run's leftover: {leftovers}");
    assert!(stderr.contains(&format!("left alone process {pid}")), "{stderr}");
    drop(bystander);
    // The group could not be removed while the process was in it; remove it now it is gone.
    let cgroup = cgroup.trim().to_string();
    assert!(eventually(Duration::from_secs(10), || std::fs::remove_dir(&cgroup).is_ok()
        || !Path::new(&cgroup).exists()));
}

#[test]
fn a_setsid_daemon_that_keeps_the_run_id_and_leaves_the_cgroup_is_ended_and_listed() {
    let sb = Sandbox::new();
    let pid_file = sb.path().join("daemon-pid");
    let cgroup_file = sb.path().join("daemon-cgroup");
    // Double fork + setsid, then out of the scenario's cgroup into its parent's.
    let daemon = format!(
        "{OWN_CGROUP}; echo $$ > $(dirname $d)/cgroup.procs; cat /proc/self/cgroup > {}; echo $$ > {}; exec sleep 600",
        cgroup_file.display(),
        pid_file.display()
    );
    // The rank leaves once the daemon is out (no `wait`: a daemon is not waited for).
    let script = format!(
        "(setsid sh -c '{}' < /dev/null > /dev/null 2>&1 &); while [ ! -s {} ]; do sleep 0.05; done",
        daemon.replace('\'', "'\\''"),
        pid_file.display()
    );
    let file = sb.scenario("daemon", &serde_json::json!({"command": ["sh", "-c", script]}).to_string());
    let out = sb.run(&[&file], &[]);
    let stderr = out.stderr();
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|_| panic!("the daemon never started:\n{stderr}"))
        .trim()
        .parse()
        .unwrap();
    let alive_after = eventually(Duration::from_secs(5), || !crate::util::alive(u64::from(pid)));
    if !alive_after {
        // SAFETY: kill(2) of the daemon this test's scenario started, so it does not outlive the test.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert!(alive_after, "the daemon survived the run:\n{stderr}");
    let cgroups = std::fs::read_to_string(&cgroup_file).unwrap();
    assert!(!cgroups.contains("ups-doctor."), "the daemon did not leave the scenario's cgroup:\n{cgroups}");
    let leftovers = &out.scenario()["leftovers"]["processes"];
    let listed = leftovers.as_array().into_iter().flatten().find(|p| p["pid"] == pid);
    let listed = listed.unwrap_or_else(|| panic!("the daemon is not a listed leftover: {leftovers}"));
    assert_eq!(listed["killed"], true, "{leftovers}");
}

/// Issue 57, item 6: a process started *after* the scenario's cgroup was made, elsewhere (by this
/// test, while the run is going: `setsid sleep 600`), and moved into the cgroup by the program
/// running as root, is not the run's: membership and a start time after the group's are no proof.
/// It does not descend from ups-doctor (the child subreaper of everything the run starts), so it is
/// left alone, said so, and not listed among the run's leftovers.
#[test]
fn a_foreign_process_started_during_the_run_and_moved_into_its_cgroup_is_left_alone() {
    let sb = Sandbox::new();
    let ready = sb.path().join("ready");
    let pid_file = sb.path().join("foreign-pid");
    let moved = sb.path().join("moved");
    let script = format!(
        "{OWN_CGROUP}; echo $d > {ready}; while [ ! -s {pids} ]; do sleep 0.05; done; \
         echo $(cat {pids}) > $d/cgroup.procs && echo $d > {moved}",
        ready = ready.display(),
        pids = pid_file.display(),
        moved = moved.display()
    );
    let file = sb.scenario("mover", &serde_json::json!({"command": ["sh", "-c", script]}).to_string());
    let (out, foreign) = std::thread::scope(|scope| {
        let run = scope.spawn(|| sb.run(&[&file], &[]));
        assert!(
            eventually(Duration::from_secs(60), || std::fs::read_to_string(&ready)
                .is_ok_and(|t| !t.is_empty())),
            "the program never started"
        );
        // Started now, by the test: after the cgroup was made, and no process of the run.
        let foreign = std::process::Command::new("setsid")
            .args(["sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::fs::write(&pid_file, foreign.id().to_string()).unwrap();
        (run.join().unwrap(), foreign)
    });
    let mut foreign = foreign;
    let pid = foreign.id();
    let stderr = out.stderr();
    let cgroup = std::fs::read_to_string(&moved).unwrap_or_else(|_| {
        panic!("the program could not move the process (no scenario cgroup?):\n{stderr}")
    });
    let alive = crate::util::alive(u64::from(pid));
    let _ = foreign.kill();
    let _ = foreign.wait();
    assert!(alive, "the foreign process was killed:\n{stderr}");
    let leftovers = out.scenario()["leftovers"].to_string();
    assert!(!leftovers.contains(&format!("\"pid\":{pid}")), "listed as the run's leftover: {leftovers}");
    assert!(
        stderr.contains(&format!("left alone process {pid}"))
            && stderr.contains("does not descend from ups-doctor"),
        "{stderr}"
    );
    let cgroup = cgroup.trim().to_string();
    assert!(eventually(Duration::from_secs(10), || std::fs::remove_dir(&cgroup).is_ok()
        || !Path::new(&cgroup).exists()));
}

/// Issue 57, item 8: without a cgroup (`UPS_DOCTOR_CGROUP_PARENT` names a folder that is none), a
/// daemon made the classic way — `setsid`, then a fork whose parent exits, so that its process
/// group's leader is gone — used to be reparented to init, and was neither a group of the run nor
/// below a rank: it survived the run and Leftovers said nothing. ups-doctor is now the child
/// subreaper of what it starts: the daemon is reparented to it, carries the run id, and is ended,
/// reaped and listed.
#[test]
fn a_double_forked_daemon_of_a_run_without_a_cgroup_is_ended_and_listed() {
    let sb = Sandbox::new();
    let pid_file = sb.path().join("daemon-pid");
    let not_a_cgroup = sb.path().join("not-a-cgroup");
    std::fs::create_dir(&not_a_cgroup).unwrap();
    let script = format!(
        "setsid sh -c 'sleep 600 < /dev/null > /dev/null 2>&1 & echo $! > {pids}'; while [ ! -s {pids} ]; do sleep 0.05; done",
        pids = pid_file.display()
    );
    let file = sb.scenario("daemon", &serde_json::json!({"command": ["sh", "-c", script]}).to_string());
    let mut cmd = sb.cmd();
    cmd.env("UPS_DOCTOR_CGROUP_PARENT", &not_a_cgroup);
    let out = sb.run_with(cmd, &[&file], &[]);
    let stderr = out.stderr();
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|_| panic!("the daemon never started:\n{stderr}"))
        .trim()
        .parse()
        .unwrap();
    let gone = eventually(Duration::from_secs(5), || !crate::util::alive(u64::from(pid)));
    if !gone {
        // SAFETY: kill(2) of the daemon this test's scenario started, so it does not outlive the test.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let s = out.scenario();
    assert!(s["cgroup_unavailable"].is_string(), "the run had a cgroup: {s:#}");
    assert!(gone, "the daemon survived the run:\n{stderr}");
    let leftovers = &s["leftovers"]["processes"];
    let listed = leftovers.as_array().into_iter().flatten().find(|p| p["pid"] == pid);
    let listed = listed.unwrap_or_else(|| panic!("the daemon is not a listed leftover: {leftovers}"));
    assert_eq!(listed["killed"], true, "{leftovers}");
}

/// The host pids of the processes whose environment carries `UPS_DOCTOR_RUN_ID=run_id`.
fn processes_of_run(run_id: &str) -> Vec<u32> {
    let needle = format!("UPS_DOCTOR_RUN_ID={run_id}\0");
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .filter(|&pid| crate::util::alive(u64::from(pid)))
        .collect()
}

/// An ups-doctor run inside its own PID namespace (`unshare --pid`: a container that shares the
/// host's cgroup tree and `/dev/shm`), under a shell that is the namespace's pid 1, so that killing
/// ups-doctor leaves its program running as a SIGKILLed harness would.
struct Contained {
    unshare: std::process::Child,
    segment: PathBuf,
    run_id: String,
    program: Vec<u32>,
}

impl Contained {
    fn start(sb: &Sandbox) -> Option<Contained> {
        use std::os::unix::process::CommandExt;
        let probe =
            std::process::Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).output();
        if !probe.is_ok_and(|o| o.status.success()) {
            eprintln!("skipped: `unshare --pid --fork --mount-proc` is not permitted here (needs root)");
            return None;
        }
        let named = sb.path().join("segment");
        // The program makes a `/dev/shm` segment in the run's name, as the built-in trainer does.
        let script = format!(
            "f=/dev/shm/ups-doctor-$UPS_DOCTOR_RUN_ID-keep; echo x > $f; echo $f > {}; exec sleep 600",
            named.display()
        );
        let body = serde_json::json!({
            "command": ["sh", "-c", script],
            "limits": { "timeout_s": 900, "hang_after_s": 800 }
        });
        let file = sb.scenario("contained", &body.to_string());
        let line = format!(
            "'{}' run '{}' --out '{}' --quiet; sleep 600",
            crate::util::bin().display(),
            file.display(),
            sb.path().join("contained-out").display()
        );
        let unshare = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &line])
            .current_dir(sb.path())
            .env("NO_COLOR", "1")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("unshare starts");
        let mut contained =
            Contained { unshare, segment: PathBuf::new(), run_id: String::new(), program: Vec::new() };
        let started = eventually(Duration::from_secs(120), || {
            let Ok(path) = std::fs::read_to_string(&named) else { return false };
            contained.segment = PathBuf::from(path.trim());
            let name = contained.segment.file_name().unwrap().to_string_lossy().into_owned();
            contained.run_id = name["ups-doctor-".len()..name.len() - "-keep".len()].to_string();
            contained.program = processes_of_run(&contained.run_id);
            !contained.program.is_empty()
        });
        assert!(started, "the contained run's program never started");
        Some(contained)
    }

    /// The host pid of the contained ups-doctor: the child of the namespace's shell.
    fn harness(&self) -> u32 {
        let shell = crate::util::children_of(self.unshare.id());
        let harness = shell.iter().flat_map(|&s| crate::util::children_of(s)).find(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "ups-doctor")
        });
        harness.expect("the contained ups-doctor runs")
    }
}

impl Drop for Contained {
    fn drop(&mut self) {
        // SAFETY: killpg(2) of the process group this test made for unshare; its namespace's
        // processes all die with its pid 1.
        unsafe { libc::killpg(self.unshare.id() as i32, libc::SIGKILL) };
        let _ = self.unshare.wait();
        let _ = std::fs::remove_file(&self.segment);
    }
}

#[test]
fn a_run_in_another_pid_namespace_is_left_alone_while_it_lives_and_swept_once_it_is_dead() {
    let sb = Sandbox::new();
    let Some(contained) = Contained::start(&sb) else { return };
    let plain = sb.scenario("plain", &crate::util::tiny(""));
    // Its pid means nothing here (it is 2 in its namespace): a later run on the host must see
    // from its locks that it lives.
    let later = sb.run(&[&plain], &[]);
    assert_eq!(later.code(), 0, "{}", later.stderr());
    let killed: Vec<_> = contained.program.iter().filter(|&&p| !crate::util::alive(p.into())).collect();
    assert!(killed.is_empty(), "a later run killed the live contained run's {killed:?}:\n{}", later.stderr());
    assert!(contained.segment.exists(), "a later run removed the live contained run's segment");
    let leftovers = later.scenario()["leftovers"].to_string();
    assert!(!leftovers.contains("earlier_run"), "listed as an earlier run's: {leftovers}");
    // Without a cgroup only the segment's lock tells; the program is found by the cgroup alone.
    let cgroups = ups_doctor::harness::os::cgroup::parent().is_ok();
    if cgroups {
        assert!(later.stderr().contains("left alone the cgroup"), "{}", later.stderr());
    }
    // SIGKILLed, the contained ups-doctor leaves its program running in its namespace: now it is
    // dead, and the next run on the host ends what it left.
    let harness = contained.harness();
    // SAFETY: kill(2) of the ups-doctor this test started, found as its shell's child.
    unsafe { libc::kill(harness as i32, libc::SIGKILL) };
    assert!(eventually(Duration::from_secs(30), || !crate::util::alive(harness.into())));
    let next = sb.run(&[&plain], &[]);
    assert_eq!(next.code(), 0, "{}", next.stderr());
    let ended = eventually(Duration::from_secs(30), || {
        contained.program.iter().all(|&p| !crate::util::alive(p.into()))
    });
    assert!(ended || !cgroups, "the dead contained run's program outlived the next run:\n{}", next.stderr());
    assert!(!contained.segment.exists(), "the dead contained run's segment outlived the next run");
    let lock = Path::new("/dev/shm").join(format!(".ups-doctor-{}.lock", contained.run_id));
    assert!(!lock.exists(), "the dead run's lock file outlived the next run");
}
