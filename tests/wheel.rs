//! The `ups-doctor` wheel (pyproject.toml, `./x wheel`), installed the way ML engineers install
//! py-spy: `pip install` into a fresh virtual environment that has PyTorch but no Rust toolchain
//! and no libtorch of ups-doctor's, then used from that environment alone: `--version`, `env`,
//! `run -- torchrun` on a rank that crashes, `attach` to a running job (py-spy, the wheel's one
//! dependency, found beside ups-doctor), and the refusal of built-in scenarios, whose trainer the
//! wheel does not carry.
//!
//! The wheel is the one `./x test` builds before `cargo test` (a release build takes minutes:
//! too slow for a test) and names in `UPS_DOCTOR_WHEEL`; the py-spy wheel it depends on is in
//! `UPS_DOCTOR_WHEEL_DEPS` (`$CACHE/wheels`), so pip installs offline. Without them the test
//! fails and says how to get them: it never skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{Sandbox, eventually, free_port, repo, venv_python};

fn env_path(name: &str, what: &str) -> PathBuf {
    let path = std::env::var_os(name).map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "{name} is not set: it names {what}; `./x test` sets it (it builds the wheel with `./x wheel` \
             and downloads py-spy's wheel once), or set it by hand (`{name}=$(./x wheel)` for the wheel)"
        )
    });
    assert!(path.exists(), "{name}={} does not exist ({what}): run `./x wheel`", path.display());
    path
}

/// A fresh venv with the wheel installed, torch visible through a `.pth` file, and nothing else.
struct Installed {
    venv: PathBuf,
    /// When `pip install` started.
    install_started: Instant,
    /// From the start of `pip install` to its end.
    install: Duration,
}

impl Installed {
    fn bin(&self, name: &str) -> PathBuf {
        self.venv.join("bin").join(name)
    }

    /// `PATH` of the environment: its own `bin`, then the system's programs but Rust's (a folder
    /// of links to `/usr/bin` and `/bin` without `cargo*`, `rust*`: apt's Rust lives there).
    fn path(&self) -> String {
        format!("{}:{}", self.venv.join("bin").display(), self.system_bin().display())
    }

    fn system_bin(&self) -> PathBuf {
        self.venv.with_file_name("system-bin")
    }

    /// A command with only this environment's variables: no `LIBTORCH`, no `UPS_DOCTOR_*`, no
    /// `CARGO_*`, no `PYTHONPATH`.
    fn cmd(&self, program: &Path, cwd: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", self.path())
            .env("HOME", std::env::var_os("HOME").expect("HOME is set"))
            .env("VIRTUAL_ENV", &self.venv)
            .current_dir(cwd)
            .stdin(Stdio::null());
        cmd
    }

    fn doctor(&self, cwd: &Path, args: &[&str]) -> Output {
        self.cmd(&self.bin("ups-doctor"), cwd).args(args).output().expect("ups-doctor runs")
    }
}

fn install(sb: &Sandbox) -> Installed {
    let wheel =
        env_path("UPS_DOCTOR_WHEEL", "the ups-doctor wheel under test (target/wheels/ups_doctor-*.whl)");
    let deps = env_path("UPS_DOCTOR_WHEEL_DEPS", "the folder of the wheel's dependencies (py-spy's wheel)");
    let venv = sb.path().join("venv");
    let system = |cmd: &mut Command| {
        cmd.env_clear().env("PATH", "/usr/bin:/bin").env("HOME", std::env::var_os("HOME").unwrap());
        let out = cmd.output().expect("runs");
        assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The wheel holds the executable and its metadata, nothing else (no trainer, no libtorch), and
    // declares py-spy.
    let listing = system(
        Command::new(venv_python())
            .arg("-c")
            .arg(
                "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); print('\\n'.join(z.namelist())); \
         m = [n for n in z.namelist() if n.endswith('.dist-info/METADATA')][0]; \
         print('\\n'.join(l for l in z.read(m).decode().splitlines() if l.startswith('Requires-Dist')))",
            )
            .arg(&wheel),
    );
    let version = env!("CARGO_PKG_VERSION");
    for line in listing.lines() {
        assert!(
            line == format!("ups_doctor-{version}.data/scripts/ups-doctor")
                || line.starts_with(&format!("ups_doctor-{version}.dist-info/"))
                || line.starts_with("Requires-Dist: "),
            "the wheel holds {line}:\n{listing}"
        );
    }
    assert!(listing.contains("Requires-Dist: py-spy"), "{listing}");
    let size = std::fs::metadata(&wheel).unwrap().len();
    assert!(size <= 15 << 20, "the wheel is {size} bytes, more than its 15 MiB budget");
    // The test venv's Python makes a venv of its base interpreter: empty but for pip.
    system(Command::new(venv_python()).args(["-m", "venv"]).arg(&venv));
    let started = Instant::now();
    system(
        Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-index",
                "--find-links",
            ])
            .arg(&deps)
            .arg(&wheel),
    );
    let installed = Installed { venv, install_started: started, install: started.elapsed() };
    let system_bin = installed.system_bin();
    std::fs::create_dir(&system_bin).unwrap();
    for dir in ["/bin", "/usr/bin"] {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let text = name.to_string_lossy();
            if text.starts_with("cargo") || text.starts_with("rust") || system_bin.join(&name).exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(entry.path(), system_bin.join(&name));
        }
    }
    assert!(installed.bin("ups-doctor").is_file(), "pip installed bin/ups-doctor");
    assert!(installed.bin("py-spy").is_file(), "pip installed the wheel's dependency py-spy beside it");
    assert!(!installed.bin("ups-doctor-trainer").exists(), "the wheel carries no trainer");
    // The user's PyTorch, as their environment would have it: the test venv's site-packages on
    // sys.path (a `.pth` file), and torchrun's console script as pip writes it for this Python.
    let site = |python: &Path| {
        let out = system(
            Command::new(python).args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]),
        );
        PathBuf::from(out.trim())
    };
    let torch_site = site(&venv_python());
    std::fs::write(
        site(&installed.bin("python")).join("user-torch.pth"),
        format!("{}\n", torch_site.display()),
    )
    .unwrap();
    let torchrun = std::fs::read_to_string(venv_python().with_file_name("torchrun")).unwrap();
    let (_, body) = torchrun.split_once('\n').unwrap();
    let script = installed.bin("torchrun");
    std::fs::write(&script, format!("#!{}\n{body}", installed.bin("python").display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Neither a Rust toolchain nor a libtorch of ups-doctor's is reachable from it.
    for dir in installed.path().split(':') {
        for tool in ["cargo", "rustc", "rustup"] {
            assert!(
                !Path::new(dir).join(tool).exists(),
                "{tool} is in {dir}: the environment must have no Rust"
            );
        }
    }
    installed
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn program() -> String {
    repo().join("tests/programs/launchers.py").display().to_string()
}

#[test]
fn the_wheel_installed_in_a_fresh_venv_runs_torchrun_attaches_and_refuses_built_in_scenarios() {
    let sb = Sandbox::new();
    let started = Instant::now();
    let env = install(&sb);
    let here = sb.path();

    // The version is the wheel's.
    let wheel = std::env::var("UPS_DOCTOR_WHEEL").unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert!(wheel.contains(&format!("ups_doctor-{version}-")), "{wheel} is version {version}");
    let out = env.doctor(here, &["--version"]);
    assert_eq!(text(&out).0.trim(), format!("ups-doctor {version}"), "{:?}", text(&out));

    // `env` sees the environment's Python and its torch; no libtorch of its own.
    let out = env.doctor(here, &["env", "--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "env: {stderr}");
    let facts: Value = serde_json::from_str(&stdout).unwrap();
    let facts = facts.to_string();
    assert!(facts.contains(&env.bin("python3").display().to_string()), "the venv's Python: {facts}");
    assert!(facts.contains("\"2.11.0"), "its torch 2.11.0: {facts}");

    // A torchrun job whose rank 1 segfaults in step 3: the culprit, first failure 1, and the
    // program's line from Python's fault handler.
    let out_dir = here.join("crash");
    let port = free_port().to_string();
    let argv = ["run", "--out", out_dir.to_str().unwrap(), "--", "torchrun", "--nproc_per_node", "2"];
    let prog = program();
    let job = ["--master_port", &port, &prog, "--launcher", "env", "--segv-rank", "1", "--segv-step", "3"];
    let out = env.doctor(here, &[&argv[..], &job[..]].concat());
    let first_report = env.install_started.elapsed();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "a crash is exit 1; stderr:\n{stderr}");
    let result: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("result.json")).unwrap()).unwrap();
    let s = &result["scenarios"][0];
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    assert_eq!(s["ranks"][1]["signal"], "SIGSEGV", "{:#}", s["ranks"][1]);
    assert_eq!(s["ranks"][0]["collateral"], true, "{:#}", s["ranks"][0]);
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Rank 1 was killed by SIGSEGV"), "{headline}");
    let key = s["verdict"]["key_line"].as_str().unwrap_or_default();
    assert!(key.starts_with("Fatal Python error: Segmentation fault (launchers.py:"), "{key}");
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains("launchers.py"), "{report}");
    // The run found the py-spy that came with the wheel (for the stacks of a hung rank).
    assert_eq!(s["external"]["py_spy"].as_str(), env.bin("py-spy").to_str(), "{:#}", s["external"]);
    eprintln!(
        "wheel: pip install {:.1} s; from the start of `pip install` to the first report {:.1} s",
        env.install.as_secs_f64(),
        first_report.as_secs_f64()
    );

    attach_to_a_running_job(&env, here);

    // A built-in scenario: refused at once, saying what the trainer is and how to build it.
    let scenario = repo().join("scenarios/ddp-2rank-cpu.json");
    let scenario = scenario.to_str().unwrap();
    for args in [
        vec!["run", scenario],
        vec!["bisect", scenario],
        vec!["sweep", scenario, "--vary", "train.steps=2,3"],
    ] {
        let t = Instant::now();
        let out = env.doctor(here, &args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?} is bad input; stderr:\n{stderr}");
        assert!(t.elapsed() < Duration::from_secs(10), "{args:?} is refused at once");
        for words in [
            "built-in trainer",
            "ups-doctor-trainer",
            "your own training command needs no trainer",
            "`./x trainer`",
            "UPS_DOCTOR_TRAINER",
        ] {
            assert!(stderr.contains(words), "{args:?}: {words:?} in:\n{stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    eprintln!("wheel: the whole test {:.1} s", started.elapsed().as_secs_f64());
}

/// A job already running (torchrun, 2 ranks) started from the environment, attached to: its ranks,
/// and their stacks read by the py-spy that came with the wheel.
fn attach_to_a_running_job(env: &Installed, here: &Path) {
    struct Job(Child);
    impl Drop for Job {
        fn drop(&mut self) {
            // The launcher and its ranks: the test's own processes.
            let mut all = vec![self.0.id()];
            let mut i = 0;
            while i < all.len() {
                all.extend(crate::util::children_of(all[i]));
                i += 1;
            }
            for pid in all.iter().rev() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid as i32),
                    nix::sys::signal::SIGKILL,
                );
            }
            let _ = self.0.wait();
        }
    }
    let log = here.join("job.log");
    let port = free_port().to_string();
    let prog = program();
    let mut cmd = env.cmd(&env.bin("torchrun"), here);
    cmd.args([
        "--nproc_per_node",
        "2",
        "--master_port",
        &port,
        &prog,
        "--launcher",
        "env",
        "--steps",
        "100000",
    ]);
    let file = std::fs::File::create(&log).unwrap();
    let job = Job(cmd.stdout(file.try_clone().unwrap()).stderr(file).spawn().expect("torchrun starts"));
    let output = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(240), || {
            output().contains("rank 0 step 20") && output().contains("rank 1 step 20")
        }),
        "the job trains:\n{}",
        output()
    );
    let out_dir = here.join("attach");
    let out = env.doctor(here, &["attach", &job.0.id().to_string(), "--out", out_dir.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "running is exit 0; stderr:\n{stderr}");
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(out_dir.join(name)).unwrap()).unwrap()
    };
    let attach = read("attach.json");
    assert_eq!(attach["state"], "running", "{attach:#}");
    assert_eq!(attach["ranks_found"], serde_json::json!([0, 1]), "{attach:#}");
    let result = read("result.json");
    let py_spy = &result["scenarios"][0]["external"]["py_spy"];
    assert_eq!(py_spy.as_str(), env.bin("py-spy").to_str(), "the py-spy pip installed beside ups-doctor");
    for rank in result["scenarios"][0]["ranks"].as_array().unwrap() {
        let stacks: Vec<&str> =
            rank["dumps"].as_array().into_iter().flatten().filter_map(|d| d["py_spy"].as_str()).collect();
        assert!(
            stacks.iter().any(|s| s.contains("launchers.py")),
            "py-spy read rank {}'s stack in the program: {rank:#}",
            rank["rank"]
        );
    }
    drop(job);
}
