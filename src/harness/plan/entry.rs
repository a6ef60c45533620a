//! Where the Python code a command runs lives, when its argv does not name a file: the module of
//! `python -m MODULE`, and a Python console script (`trl`, `tune`, any program whose `#!` names a
//! Python: pip writes one for each entry point, `from trl.cli import main; sys.exit(main())`) and
//! the module it takes its entry point from. `auto` reads them as it reads a script: TRL's CLI
//! (`trl grpo …`) starts its ranks through `accelerate launch` in its own process, and taken for
//! one plain copy per rank its first crash was blamed on the wrong process.
//!
//! A module is looked for along the interpreter's own `sys.path` (asked of it once, with the
//! user's environment: `PYTHONPATH` and `.pth` files count), never by importing anything.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the interpreter gets to print its `sys.path`.
const PROBE_LIMIT: Duration = Duration::from_secs(10);
/// How much of a file is read: a script or module, not a binary or a data file.
const READ_LIMIT: u64 = 256 << 10;

/// The first [`READ_LIMIT`] bytes of `path` as text.
pub fn read_head(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(READ_LIMIT).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The file `program` (`argv[0]`) runs: a path as it is (relative ones from `cwd`), else the
/// first match along `PATH`.
pub fn locate(program: &str, cwd: Option<&Path>) -> Option<PathBuf> {
    if program.contains('/') {
        let path = match cwd {
            Some(dir) if Path::new(program).is_relative() => dir.join(program),
            _ => program.into(),
        };
        return path.is_file().then_some(path);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|p| p.is_file())
}

/// The interpreter a script's `#!` line names, if it names a Python (`#!/venv/bin/python3`,
/// `#!/usr/bin/env python3`).
pub fn python_of_shebang(text: &str) -> Option<String> {
    let line = text.lines().next()?.strip_prefix("#!")?;
    let mut words = line.split_whitespace();
    let first = words.next()?;
    let program =
        if Path::new(first).file_name().is_some_and(|n| n == "env") { words.next()? } else { first };
    let name = Path::new(program).file_name()?.to_string_lossy();
    name.starts_with("python").then(|| program.to_string())
}

/// The modules a console script takes its entry point from: each `from MODULE import …` of it.
pub fn entry_modules(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("from ")?.split_once(" import ").map(|(m, _)| m.trim()))
        .filter(|m| !m.is_empty() && !m.starts_with('.') && !m.starts_with("__future__"))
        .collect()
}

/// The modules an entry module imports the code of its subcommand `sub` from: a CLI that
/// dispatches by a table (`litgpt finetune_lora …`: `from litgpt.finetune.lora import setup as
/// finetune_lora_fn`) runs what those modules say, not what its own module does. A module matches
/// where its last part (`…grpo`) or last two joined by `_` (`finetune.lora`) is the subcommand, or
/// where what it imports is named for it (`finetune_lora_fn`); `-` in the subcommand reads as `_`.
pub fn subcommand_modules<'a>(text: &'a str, sub: &str) -> Vec<&'a str> {
    let sub = sub.replace('-', "_");
    if sub.is_empty() || !sub.chars().all(|c| c.is_alphanumeric() || c == '_') {
        return Vec::new();
    }
    let named = |n: &str| n == sub || n.strip_prefix(sub.as_str()).is_some_and(|rest| rest.starts_with('_'));
    let mut found: Vec<&str> = Vec::new();
    for line in text.lines() {
        let Some((module, names)) =
            line.trim_start().strip_prefix("from ").and_then(|l| l.split_once(" import "))
        else {
            continue;
        };
        let module = module.trim();
        if module.is_empty() || module.starts_with('.') {
            continue;
        }
        let parts: Vec<&str> = module.split('.').collect();
        let tail_two = (parts.len() >= 2).then(|| parts[parts.len() - 2..].join("_"));
        let imported = names.trim_matches(|c: char| c == '(' || c == ')' || c.is_whitespace());
        let by_name = imported.split(',').flat_map(|n| n.split(" as ")).map(str::trim).any(named);
        if (parts.last() == Some(&sub.as_str()) || tail_two.as_deref() == Some(sub.as_str()) || by_name)
            && !found.contains(&module)
        {
            found.push(module);
        }
    }
    found
}

/// The file of `module` as `python` would find it along its `sys.path` (a package's
/// `__init__.py`, or with `main`, its `__main__.py`, as `python -m` runs it), run from `cwd`.
pub fn module_file(python: &str, module: &str, cwd: Option<&Path>, main: bool) -> Option<PathBuf> {
    let parts: Vec<&str> = module.split('.').collect();
    if parts.iter().any(|p| p.is_empty() || !p.chars().all(|c| c.is_alphanumeric() || c == '_')) {
        return None;
    }
    let relative: PathBuf = parts.iter().collect();
    let package_file = if main { "__main__.py" } else { "__init__.py" };
    sys_path(python, cwd).into_iter().find_map(|entry| {
        let base = entry.join(&relative);
        [base.with_extension("py"), base.join(package_file)].into_iter().find(|p| p.is_file())
    })
}

/// `python`'s `sys.path` run from `cwd` (its first entry, the folder, is `cwd` for `-m`), asked
/// once per interpreter and folder; empty where it cannot be run or does not answer in time.
fn sys_path(python: &str, cwd: Option<&Path>) -> Vec<PathBuf> {
    static ASKED: Mutex<Option<HashMap<(String, Option<PathBuf>), Vec<PathBuf>>>> = Mutex::new(None);
    let key = (python.to_string(), cwd.map(Path::to_path_buf));
    if let Some(known) = ASKED.lock().ok().and_then(|m| m.as_ref()?.get(&key).cloned()) {
        return known;
    }
    let found = ask_sys_path(python, cwd).unwrap_or_default();
    if let Ok(mut asked) = ASKED.lock() {
        asked.get_or_insert_with(HashMap::new).insert(key, found.clone());
    }
    found
}

fn ask_sys_path(python: &str, cwd: Option<&Path>) -> Option<Vec<PathBuf>> {
    let mut cmd = std::process::Command::new(python);
    cmd.args(["-c", "import os, sys; print('\\n'.join(os.path.abspath(p) for p in sys.path))"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    crate::harness::os::sys::die_with_parent(&mut cmd);
    let mut child = cmd.spawn().ok()?;
    let deadline = Instant::now() + PROBE_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    Some(out.lines().filter(|l| !l.is_empty()).map(PathBuf::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_console_scripts_interpreter_and_entry_module_are_read_from_it() {
        // What pip writes for `trl = trl.cli:main` (trl 0.24.0's entry point).
        let script = "#!/venv/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom trl.cli import main\n\
                      if __name__ == '__main__':\n    sys.exit(main())\n";
        assert_eq!(python_of_shebang(script).as_deref(), Some("/venv/bin/python"));
        assert_eq!(entry_modules(script), ["trl.cli"]);
        assert_eq!(python_of_shebang("#!/usr/bin/env python3\nprint(1)\n").as_deref(), Some("python3"));
        assert_eq!(python_of_shebang("#!/bin/bash\ntorchrun t.py\n"), None);
        assert_eq!(python_of_shebang("\x7fELF"), None);
        assert!(entry_modules("from __future__ import annotations\nfrom . import x\n").is_empty());
    }

    #[test]
    fn a_clis_subcommand_is_read_from_the_module_its_entry_module_imports_it_from() {
        // litgpt 0.5.12's `litgpt/__main__.py`, as it imports its subcommands.
        let main = "import torch\nfrom jsonargparse import CLI, set_config_read_mode\n\
                    from litgpt.chat.base import main as chat_fn\n\
                    from litgpt.finetune.full import setup as finetune_full_fn\n\
                    from litgpt.finetune.lora import setup as finetune_lora_fn\n\
                    from litgpt.pretrain import setup as pretrain_fn\n\
                    from litgpt.scripts.convert_pretrained_checkpoint import (\n\
                    from litgpt.parser_config import parser_commands\n";
        assert_eq!(subcommand_modules(main, "finetune_lora"), ["litgpt.finetune.lora"]);
        assert_eq!(subcommand_modules(main, "pretrain"), ["litgpt.pretrain"]);
        assert_eq!(subcommand_modules(main, "chat"), ["litgpt.chat.base"]);
        assert_eq!(subcommand_modules(main, "finetune"), ["litgpt.finetune.full", "litgpt.finetune.lora"]);
        assert!(subcommand_modules(main, "serve").is_empty());
        assert!(subcommand_modules(main, "../x").is_empty());
        assert_eq!(
            subcommand_modules("from tool.cmds.run_job import main\n", "run-job"),
            ["tool.cmds.run_job"]
        );
    }

    #[test]
    fn a_module_is_found_along_the_interpreters_own_sys_path() {
        let dir = std::env::temp_dir().join(format!("entry-module-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pkg/cli")).unwrap();
        std::fs::write(dir.join("pkg/__init__.py"), "").unwrap();
        std::fs::write(dir.join("pkg/tool.py"), "").unwrap();
        std::fs::write(dir.join("pkg/cli/__init__.py"), "").unwrap();
        std::fs::write(dir.join("pkg/cli/__main__.py"), "").unwrap();
        // `-c`'s first entry is the folder it runs in.
        let found = |m: &str, main: bool| module_file("python3", m, Some(&dir), main);
        assert_eq!(found("pkg.tool", false), Some(dir.join("pkg/tool.py")));
        assert_eq!(found("pkg.cli", false), Some(dir.join("pkg/cli/__init__.py")));
        assert_eq!(found("pkg.cli", true), Some(dir.join("pkg/cli/__main__.py")));
        assert_eq!(found("pkg.missing", false), None);
        assert_eq!(found("pkg/../etc", false), None);
        assert_eq!(module_file("/no/such/python", "pkg.tool", Some(&dir), false), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
