//! A user's command as it runs: its argv with placeholders filled, the environment ups-doctor
//! gives its Python, the variables that name a rank, and the style `auto` picks for it (one copy
//! per rank, or a launcher that starts its own ranks). Pure.

use std::path::Path;

use super::entry;
use crate::scenario::{Scenario, launcher, render_with};

/// The command's argv with every placeholder filled in; `master_port` is the run's free port.
pub fn argv(scenario: &Scenario, scenario_dir: &Path, master_port: u16) -> Vec<String> {
    let command = scenario.command.as_deref().unwrap_or_default();
    render_with(command, &scenario.params, |name| match name {
        "master_port" => Some(master_port.to_string()),
        "scenario_dir" => Some(scenario_dir.display().to_string()),
        _ => scenario.launch_placeholder(name),
    })
}

/// Variables set for every process of a command unless the user set them: unbuffered Python
/// output (so the last lines before a crash are not lost in a buffer, and output shows activity),
/// and Python's fault handler (a Python stack on SIGSEGV, SIGBUS, SIGABRT).
pub const PYTHON_ENV: [(&str, &str); 2] = [("PYTHONUNBUFFERED", "1"), ("PYTHONFAULTHANDLER", "1")];

/// Line-buffered output for a command's Python processes, where ups-doctor chose unbuffered: see
/// the file itself for why (a launcher's ranks share one stdout).
pub const SITECUSTOMIZE: &str = include_str!("../../../python/site/sitecustomize.py");

/// The folder the command runs in: `launch.cwd` with `{scenario_dir}` filled in, or `None` for
/// ups-doctor's own (a relative one is relative to ups-doctor's, as for the process itself).
pub fn cwd(scenario: &Scenario, scenario_dir: &Path) -> Option<std::path::PathBuf> {
    let cwd = scenario.launch.cwd.as_ref()?;
    Some(cwd.replace("{scenario_dir}", &scenario_dir.display().to_string()).into())
}

/// A path of the command's, as the command's own process will open it: a relative one from the
/// folder it runs in (`--cwd`, `launch.cwd`), not from ups-doctor's.
fn in_cwd(cwd: Option<&Path>, path: &str) -> std::path::PathBuf {
    match cwd {
        Some(dir) if Path::new(path).is_relative() => dir.join(path),
        _ => path.into(),
    }
}

/// The torchrun variables a launcher must not inherit from ups-doctor's own environment (its
/// ranks get their own from it; a stray `RANK` would also make the launcher look like a rank).
/// Not `MASTER_ADDR` and `MASTER_PORT`: a program that starts its own ranks (`mp.spawn`,
/// Lightning's launcher) reads its rendezvous from them, and a user who exported them chose it;
/// torchrun gives its ranks its own whatever they are.
pub const RANK_ENV: [&str; 6] =
    ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK"];

/// What `launch.style: auto` takes for `argv`: launcher (true) or per rank, and why, in words.
/// A launcher is a known launcher program, `python -m torch.distributed.run` (or `.launch`), or
/// a Python script whose source starts its own ranks (`torch.multiprocessing.spawn`, `mp.spawn`,
/// `start_processes`, Lightning's `Trainer`, a library's launcher called with a process count).
/// Relative paths are read from `cwd`, the folder the command runs in; a script that cannot be
/// read is said to be so, never taken silently.
pub fn auto_style(argv: &[String], cwd: Option<&Path>) -> (bool, String) {
    let name =
        |s: &str| Path::new(s).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let program = argv.first().map(|p| name(p)).unwrap_or_default();
    if let Some(l) = launcher::of_command(argv) {
        return (
            true,
            match l.programs.contains(&program.as_str()) {
                true => format!("`{program}` is a launcher (it starts the ranks)"),
                false => {
                    let module = argv.iter().skip_while(|a| *a != "-m").nth(1).cloned().unwrap_or_default();
                    format!("`python -m {module}` is {} (it starts the ranks)", l.name)
                }
            },
        );
    }
    for (what, source) in python_sources(argv, &program, cwd) {
        match source {
            Err(unreadable) => return (false, unreadable),
            Ok(text) => {
                if let Some(why) = starts_own_ranks(&text) {
                    return (true, format!("{what} starts its own ranks ({why})"));
                }
            }
        }
    }
    if let Some((what, source)) = shell_source(argv, &program, cwd)
        && let Some((launcher, line)) = launcher_in(&source)
    {
        return (true, format!("`{what}` runs `{launcher}` (line {line}), a launcher: it starts the ranks"));
    }
    (false, format!("`{program}` is not a known launcher: one copy per rank, each with torchrun's variables"))
}

/// What `python …` runs: code given with `-c`, a module (`-m`), or a script.
enum PythonProgram<'a> {
    Code(&'a str),
    Module(&'a str),
    Script(&'a str),
}

fn python_program(argv: &[String]) -> Option<PythonProgram<'_>> {
    let mut args =
        argv.iter().skip(1).skip_while(|a| a.starts_with('-') && !matches!(a.as_str(), "-m" | "-c"));
    Some(match args.next()?.as_str() {
        "-c" => PythonProgram::Code(args.next().map(String::as_str).unwrap_or_default()),
        "-m" => PythonProgram::Module(args.next().map(String::as_str).unwrap_or_default()),
        script => PythonProgram::Script(script),
    })
}

/// The launcher of the table that starts `argv`'s ranks: its program, or what its Python
/// program's source says, or the first launcher a shell script runs (each read from `cwd`, as
/// [`auto_style`] reads it). `None` for a command that names none.
pub fn launcher_of(argv: &[String], cwd: Option<&Path>) -> Option<&'static launcher::Launcher> {
    if let Some(l) = launcher::of_command(argv) {
        return Some(l);
    }
    let program = Path::new(argv.first()?).file_name()?.to_string_lossy().into_owned();
    if let Some((_, source)) = shell_source(argv, &program, cwd) {
        return launcher::of_shell_word(launcher_in(&source)?.0);
    }
    python_sources(argv, &program, cwd)
        .into_iter()
        .find_map(|(_, source)| launcher::in_program_source(&source.ok()?).map(|(l, _)| l))
}

/// The Python code `argv` runs, to read for how it starts its ranks, each with what to call it:
/// `python -c`'s code, `python script.py`'s script (or, where it cannot be read, why, in words
/// that say the style is then a guess), `python -m MODULE`'s module, or a Python console script
/// (`trl`) and then each module it takes its entry point from ([`entry`]).
fn python_sources(
    argv: &[String],
    program: &str,
    cwd: Option<&Path>,
) -> Vec<(String, Result<String, String>)> {
    let name =
        |s: &str| Path::new(s).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if !program.starts_with("python") {
        let Some(text) = argv.first().and_then(|p| entry::locate(p, cwd)).and_then(|p| entry::read_head(&p))
        else {
            return Vec::new();
        };
        let Some(python) = entry::python_of_shebang(&text) else { return Vec::new() };
        let mut modules: Vec<(String, Result<String, String>)> = entry::entry_modules(&text)
            .into_iter()
            .filter_map(|m| {
                let file = entry::module_file(&python, m, cwd, false)?;
                Some((format!("`{program}` (its entry point `{m}`)"), Ok(entry::read_head(&file)?)))
            })
            .collect();
        // Its subcommand's own module, where the entry module imports it (a CLI's table).
        if let Some(sub) = argv.get(1).filter(|a| !a.starts_with('-')) {
            let mut of_sub = Vec::new();
            for (_, source) in &modules {
                let Ok(source) = source else { continue };
                for m in entry::subcommand_modules(source, sub) {
                    let Some(text) =
                        entry::module_file(&python, m, cwd, false).and_then(|f| entry::read_head(&f))
                    else {
                        continue;
                    };
                    of_sub.push((format!("`{program} {sub}` (its module `{m}`)"), Ok(text)));
                }
            }
            modules.extend(of_sub);
        }
        return std::iter::once((format!("`{program}`"), Ok(text))).chain(modules).collect();
    }
    match python_program(argv) {
        None => Vec::new(),
        Some(PythonProgram::Code(code)) => vec![("`python -c`".into(), Ok(code.to_string()))],
        Some(PythonProgram::Module(module)) => entry::module_file(&argv[0], module, cwd, true)
            .and_then(|file| entry::read_head(&file))
            .map(|text| vec![(format!("`python -m {module}`"), Ok(text))])
            .unwrap_or_default(),
        Some(PythonProgram::Script(script)) => {
            let path = in_cwd(cwd, script);
            let source = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "`{}` could not be read to see whether it starts its own ranks ({}: {e}): \
                     taken for a plain script, one copy per rank; name the style with `--style launcher` \
                     (`launch.style`) if it starts its ranks itself",
                    name(script),
                    path.display(),
                    e = e.to_string().split(" (os error").next().unwrap_or_default(),
                )
            });
            vec![(format!("`{}`", name(script)), source)]
        }
    }
}

/// What in a Python program's source says that it starts its own ranks (the launcher table's
/// words for it).
fn starts_own_ranks(source: &str) -> Option<&'static str> {
    launcher::in_program_source(source).map(|(_, why)| why)
}

/// Whether `argv` is a shell a person types into (`bash`, `-bash`, `zsh -i`): no script and no
/// `-c` command. It may have started ranks by hand (`RANK=1 python train.py &`), yet it is the
/// user's, never a job's launcher: nothing of ups-doctor's may signal it.
pub fn is_interactive_shell(argv: &[String]) -> bool {
    let Some(first) = argv.first() else { return false };
    let name = Path::new(first.trim_start_matches('-')).file_name().map(|n| n.to_string_lossy().into_owned());
    let shell = name.is_some_and(|n| SHELLS.contains(&n.as_str()) || n == "fish");
    shell && argv.iter().skip(1).all(|a| a.starts_with('-') && a != "-c")
}

/// Shells whose command or script `auto` reads for a launcher.
const SHELLS: [&str; 5] = ["bash", "sh", "zsh", "dash", "ksh"];

/// The shell text `argv` runs, and what to call it: `bash -c '…'`'s command, `bash train.sh`'s
/// script, or `./train.sh` itself when it starts with a shell's `#!`.
fn shell_source(argv: &[String], program: &str, cwd: Option<&Path>) -> Option<(String, String)> {
    let name =
        |s: &str| Path::new(s).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // Its first 64 KiB: a script, not a binary or a data file that happens to be named.
    let read = |path: &str| {
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(in_cwd(cwd, path)).ok()?.take(64 << 10).read_to_end(&mut bytes).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    };
    if SHELLS.contains(&program) {
        let mut rest = argv.iter().skip(1);
        while let Some(arg) = rest.next() {
            if arg == "-c" {
                return rest.next().map(|c| ("the shell command".to_string(), c.clone()));
            }
            if !arg.starts_with('-') {
                return read(arg).map(|t| (name(arg), t));
            }
        }
        return None;
    }
    let text = read(argv.first()?)?;
    let shebang = text.lines().next().filter(|l| l.starts_with("#!"))?;
    SHELLS.iter().any(|sh| shebang.split(['/', ' ']).any(|w| w == *sh)).then(|| (name(&argv[0]), text))
}

/// The first launcher a shell text runs (comments aside), and its line number.
fn launcher_in(source: &str) -> Option<(&'static str, usize)> {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    // A comment runs nothing: a whole line from `#`, or from ` #` on.
    fn code(line: &str) -> &str {
        if line.trim_start().starts_with('#') { "" } else { line.split(" #").next().unwrap_or(line) }
    }
    source.lines().map(code).enumerate().find_map(|(i, line)| {
        launcher::shell_words().find_map(|needle| {
            line.match_indices(needle)
                .any(|(at, _)| {
                    !word(line[..at].chars().next_back()) && !word(line[at + needle.len()..].chars().next())
                })
                .then_some((needle, i + 1))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_renders_params_and_built_in_placeholders() {
        let s: Scenario = serde_json::from_value(serde_json::json!({
            "command": ["torchrun", "--nproc_per_node", "{world_size}", "{scenario_dir}/t.py", "--d={depths}", "{pin}"],
            "params": {"depths": [2, 2], "pin": {"value": false}},
            "launch": {"world_size": 2, "style": "launcher"}
        }))
        .unwrap();
        assert_eq!(
            argv(&s, Path::new("/s"), 29501),
            ["torchrun", "--nproc_per_node", "2", "/s/t.py", "--d=2,2", "false"]
        );
    }

    #[test]
    fn auto_takes_launcher_for_launchers_and_programs_that_start_their_own_ranks() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let programs = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs");
        let launchers = programs.join("launchers.py").display().to_string();
        let plain = programs.join("ddp.py").display().to_string();
        for (argv, launcher, why) in [
            (args(&["torchrun", "--nproc_per_node", "2", "t.py"]), true, "`torchrun` is a launcher"),
            (args(&["/venv/bin/accelerate", "launch", "t.py"]), true, "`accelerate` is a launcher"),
            (
                args(&["python", "-u", "-m", "torch.distributed.run", "t.py"]),
                true,
                "`python -m torch.distributed.run` is torchrun",
            ),
            (args(&["python3", &launchers]), true, "`launchers.py` starts its own ranks"),
            (args(&["python", &plain]), false, "`python` is not a known launcher"),
            (args(&["python", "-m", "mypkg.train"]), false, "`python` is not a known launcher"),
            (args(&["python", "-u", "-c", "print(1)"]), false, "`python` is not a known launcher"),
            (
                args(&["python", "-c", "import torch.multiprocessing as mp; mp.spawn(f, nprocs=2)"]),
                true,
                "`python -c` starts its own ranks",
            ),
            (args(&["./train.sh"]), false, "`train.sh` is not a known launcher"),
            (
                args(&["bash", "-c", "export X=1; torchrun --nproc_per_node 2 t.py"]),
                true,
                "`the shell command` runs `torchrun` (line 1), a launcher",
            ),
            (args(&["sh", "-c", "python t.py  # not torchrun here"]), false, "`sh` is not a known launcher"),
            (args(&["bash", "-c", "python mytorchrun.py"]), false, "`bash` is not a known launcher"),
        ] {
            let (is_launcher, text) = auto_style(&argv, None);
            assert_eq!(is_launcher, launcher, "{argv:?}: {text}");
            assert!(text.starts_with(why), "{argv:?}: {text}");
        }
        // A script with a shell's `#!`, run as it is or through its shell.
        let dir = std::env::temp_dir().join(format!("auto-style-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("train.sh");
        std::fs::write(&script, "#!/usr/bin/env bash\n# torchrun in a comment is not a launch\nset -e\n\npython -m torch.distributed.run --nproc_per_node 2 t.py\n").unwrap();
        let script = script.display().to_string();
        for argv in [args(&[&script]), args(&["bash", "-e", &script])] {
            let (is_launcher, text) = auto_style(&argv, None);
            assert!(is_launcher, "{argv:?}: {text}");
            assert_eq!(
                text,
                "`train.sh` runs `torch.distributed.run` (line 5), a launcher: it starts the ranks"
            );
        }
        // Ranks forked by `start_processes` (no `spawn(` in the source).
        let forks = dir.join("forks.py");
        std::fs::write(&forks, "import torch.multiprocessing as mp\n\nmp.start_processes(work, nprocs=2, start_method=\"fork\")\n").unwrap();
        let (is_launcher, text) = auto_style(&args(&["python", &forks.display().to_string()]), None);
        assert!(is_launcher, "{text}");
        assert_eq!(
            text,
            "`forks.py` starts its own ranks (it calls `torch.multiprocessing.start_processes`)"
        );
        // A library's launcher (PyTorch-Ignite's), by the process count it is called with.
        let ignite = dir.join("ignite_trainer.py");
        std::fs::write(&ignite, "import ignite.distributed as idist\nwith idist.Parallel(backend=\"gloo\", nproc_per_node=2) as p:\n    p.run(training)\n").unwrap();
        let (is_launcher, text) = auto_style(&args(&["python", &ignite.display().to_string()]), None);
        assert!(is_launcher, "{text}");
        assert_eq!(
            text,
            "`ignite_trainer.py` starts its own ranks (a call in it says how many processes to start: `nproc_per_node=`)"
        );
        // A Python console script (as pip writes one for an entry point) whose entry module starts
        // the ranks through `accelerate launch` in its own process, as TRL's CLI (`trl.cli`) does;
        // and the same module run with `python -m`.
        std::fs::create_dir_all(dir.join("tool")).unwrap();
        std::fs::write(dir.join("tool/__init__.py"), "").unwrap();
        std::fs::write(
            dir.join("tool/cli.py"),
            "from accelerate.commands.launch import launch_command, launch_command_parser\n\n\
             def main():\n    launch_command(launch_command_parser().parse_args([SCRIPT]))\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("tool-cli"),
            "#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom tool.cli import main\n\
             if __name__ == '__main__':\n    sys.exit(main())\n",
        )
        .unwrap();
        let (is_launcher, text) = auto_style(&args(&["./tool-cli", "grpo"]), Some(&dir));
        assert!(is_launcher, "{text}");
        assert_eq!(
            text,
            "`tool-cli` (its entry point `tool.cli`) starts its own ranks (it runs `accelerate launch` in its own \
             process (`launch_command`), which starts the ranks)"
        );
        assert_eq!(launcher_of(&args(&["./tool-cli"]), Some(&dir)).map(|l| l.name), Some("accelerate"));
        let (is_launcher, text) = auto_style(&args(&["python3", "-m", "tool.cli"]), Some(&dir));
        assert!(is_launcher, "{text}");
        assert!(text.starts_with("`python -m tool.cli` starts its own ranks"), "{text}");
        // torchrun run in-process by a module that imports it (Fabric's CLI, `fabric run`).
        std::fs::write(
            dir.join("tool/fab.py"),
            "import torch.distributed.run as torchrun\n\ntorchrun.main(ARGS)\n",
        )
        .unwrap();
        let (is_launcher, text) = auto_style(&args(&["python3", "-m", "tool.fab"]), Some(&dir));
        assert!(is_launcher, "{text}");
        assert_eq!(
            launcher_of(&args(&["python3", "-m", "tool.fab"]), Some(&dir)).map(|l| l.name),
            Some("torchrun")
        );
        // Its module not found (another folder): taken for a plain command, as before.
        let (is_launcher, text) = auto_style(&args(&["python3", "-m", "tool.cli"]), Some(&dir.join("tool")));
        assert!(!is_launcher, "{text}");
        // A CLI dispatching by a table (litgpt's): the subcommand's own module says it starts its
        // ranks (Fabric), the others' do not.
        std::fs::create_dir_all(dir.join("tool/train")).unwrap();
        std::fs::write(dir.join("tool/train/__init__.py"), "").unwrap();
        std::fs::write(
            dir.join("tool/train/lora.py"),
            "import lightning as L\n\nfabric = L.Fabric(devices=2)\n",
        )
        .unwrap();
        std::fs::write(dir.join("tool/chat.py"), "def main():\n    print('hi')\n").unwrap();
        std::fs::write(
            dir.join("tool/table.py"),
            "from tool.chat import main as chat_fn\nfrom tool.train.lora import setup as train_lora_fn\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("tool-table"),
            "#!/usr/bin/env python3\nimport sys\nfrom tool.table import main\n",
        )
        .unwrap();
        let (is_launcher, text) = auto_style(&args(&["./tool-table", "train_lora", "ckpt"]), Some(&dir));
        assert!(is_launcher, "{text}");
        assert!(
            text.starts_with("`tool-table train_lora` (its module `tool.train.lora`) starts its own ranks"),
            "{text}"
        );
        let (is_launcher, text) = auto_style(&args(&["./tool-table", "chat"]), Some(&dir));
        assert!(!is_launcher, "{text}");
        for (shell, interactive) in [
            (&["bash"][..], true),
            (&["-bash"], true),
            (&["/usr/bin/zsh", "-i"], true),
            (&["bash", "train.sh"], false),
            (&["bash", "-c", "torchrun t.py"], false),
            (&["python", "-i"], false),
        ] {
            assert_eq!(is_interactive_shell(&args(shell)), interactive, "{shell:?}");
        }
        // A relative script is read from the folder the command runs in (`--cwd`), not from
        // ups-doctor's: the same program by its bare name.
        let (is_launcher, text) = auto_style(&args(&["python", "forks.py"]), Some(&dir));
        assert!(is_launcher, "{text}");
        let (bash, text) = auto_style(&args(&["bash", "train.sh"]), Some(&dir));
        assert!(bash, "{text}");
        // Where it cannot be read, the style is said to be a guess, with the path it looked at.
        let (is_launcher, text) = auto_style(&args(&["python", "forks.py"]), Some(&dir.join("elsewhere")));
        assert!(!is_launcher, "{text}");
        let looked = dir.join("elsewhere/forks.py").display().to_string();
        assert!(text.starts_with("`forks.py` could not be read") && text.contains(&looked), "{text}");
        assert!(text.contains("--style launcher"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
