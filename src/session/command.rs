//! `ups-doctor run [OPTIONS] -- PROGRAM [ARGS…]`: the user's command is the scenario. The options
//! say what a scenario file would (ranks, style, limits, variables, folder, the line that says it
//! finished); the rank count comes from the launcher's own flags where it has them. The result is
//! an ordinary scenario, loaded and checked by the same strict loader as a file, so `--set` and
//! every error message work the same; `scenario.json` in the run folder re-runs it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::Error;
pub use crate::scenario::rank_flag_value;
use crate::scenario::{self, Override, declared_ranks, flag_value, rank_flags};

/// What the command line says about a command.
#[derive(Debug, Clone, Default)]
pub struct CommandOptions {
    pub ranks: Option<u32>,
    /// `auto`, `per_rank` or `launcher`.
    pub style: Option<String>,
    pub hang_after_s: Option<f64>,
    pub timeout_s: Option<f64>,
    pub memory_limit: Option<String>,
    pub shm_size: Option<String>,
    /// `NAME=VALUE`, as given.
    pub env: Vec<String>,
    pub cwd: Option<PathBuf>,
    pub expect_output: Option<String>,
    pub name: Option<String>,
}

impl CommandOptions {
    /// Refuses options that describe a command when there is none (scenario files were given):
    /// they would be dropped without a word. Names the first one given and where a file says it.
    pub fn none_given(&self) -> Result<(), Error> {
        let given = [
            ("--ranks", self.ranks.is_some()),
            ("--style", self.style.is_some()),
            ("--hang-after", self.hang_after_s.is_some()),
            ("--timeout", self.timeout_s.is_some()),
            ("--memory-limit", self.memory_limit.is_some()),
            ("--shm-size", self.shm_size.is_some()),
            ("--env", !self.env.is_empty()),
            ("--cwd", self.cwd.is_some()),
            ("--expect-output", self.expect_output.is_some()),
            ("--name", self.name.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag));
        match given {
            None => Ok(()),
            Some(option) => Err(Error::BadInput(format!(
                "`{option}` describes a command after `--`; a scenario file says it in its own fields \
                 (`launch.env`, `launch.cwd`, `limits`, …) or with `--set`"
            ))),
        }
    }
}

/// Where a command's scenario says it came from, in error messages.
pub const ORIGIN: &str = crate::scenario::COMMAND_LINE;

/// The scenario of `argv` run with `options` (and `--set`), checked as strictly as a file.
pub fn scenario(
    argv: &[String],
    options: &CommandOptions,
    set: &[Override],
) -> Result<scenario::Scenario, Error> {
    let file = scenario_file(argv, options)?;
    let text = serde_json::to_string_pretty(&file).expect("serialises");
    Ok(scenario::load_str(&text, Path::new(ORIGIN), set)?)
}

/// The scenario file `argv` with `options` stands for (not yet checked by the loader): what
/// `sweep -- CMD` writes to its folder.
pub fn scenario_file(argv: &[String], options: &CommandOptions) -> Result<Value, Error> {
    let Some(program) = argv.first() else {
        return Err(Error::BadInput(
            "`--` is followed by no program\n  hint: put the command after it, e.g. `ups-doctor run -- torchrun \
             --nproc_per_node 2 train.py`, or leave `--` out to run scenario files"
                .into(),
        ));
    };
    if crate::harness::find_program(program).is_none() {
        return Err(Error::BadInput(format!(
            "`{program}` is not a program on PATH nor a file that can be run, so nothing was started\n  hint: \
             check the spelling, activate the environment that has it (a virtualenv or conda env), or give its \
             path (`./train.py` needs `chmod +x` and a `#!` line; else `python train.py`)"
        )));
    }
    let declared = declared_ranks(argv);
    let ranks = match (options.ranks, declared) {
        (Some(0), _) => return Err(Error::BadInput("`--ranks 0`: a run needs at least one rank".into())),
        (Some(n), Some((m, flag))) if n != m => {
            return Err(Error::BadInput(format!(
                "`--ranks {n}` contradicts the command's own `{flag}` ({m} ranks)\n  hint: drop `--ranks` (the \
                 launcher's flag decides), or change `{flag}` to {n}"
            )));
        }
        (Some(n), _) => n,
        (None, Some((m, _))) => m,
        (None, None) => 1,
    };
    let mut env = BTreeMap::new();
    for pair in &options.env {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(Error::BadInput(format!(
                "`--env {pair}` has no `=`\n  hint: write `--env NAME=VALUE`, e.g. `--env OMP_NUM_THREADS=1`"
            )));
        };
        env.insert(name.to_string(), value.to_string());
    }
    let cwd = match &options.cwd {
        Some(dir) if !dir.is_dir() => {
            return Err(Error::BadInput(format!(
                "`--cwd {}` is not a folder\n  hint: give the folder the command should run in (it is created by \
                 nobody else)",
                dir.display()
            )));
        }
        Some(dir) => Some(std::path::absolute(dir).unwrap_or_else(|_| dir.clone()).display().to_string()),
        None => None,
    };
    let mut launch = json!({ "world_size": ranks });
    let put = |section: &mut Value, key: &str, value: Option<Value>| {
        if let Some(v) = value {
            section[key] = v;
        }
    };
    put(&mut launch, "style", options.style.clone().map(Value::from));
    put(&mut launch, "memory_limit", options.memory_limit.clone().map(Value::from));
    put(&mut launch, "env", (!env.is_empty()).then(|| json!(env)));
    put(&mut launch, "cwd", cwd.map(Value::from));
    let mut file = json!({
        "name": options.name.clone().unwrap_or_else(|| name_of(argv)),
        "command": argv,
        "launch": launch,
    });
    let mut limits = json!({});
    put(&mut limits, "hang_after_s", options.hang_after_s.map(Value::from));
    put(&mut limits, "timeout_s", options.timeout_s.map(Value::from));
    if limits.as_object().is_some_and(|m| !m.is_empty()) {
        file["limits"] = limits;
    }
    if let Some(size) = &options.shm_size {
        file["data"] = json!({ "shm_size": size });
    }
    if let Some(pattern) = &options.expect_output {
        file["expect"] = json!({ "completes_when": { "output": pattern } });
    }
    Ok(file)
}

/// Writes a command's scenario `file` as `scenario.json` into `out` (or a fresh
/// `reports/runs/<time>-<what>-<name>` folder), where `bisect -- CMD` and `sweep -- CMD` then read
/// it like any scenario file; the file's path and the folder.
pub fn write_scenario(file: &Value, out: Option<PathBuf>, what: &str) -> Result<(PathBuf, PathBuf), Error> {
    let name = file["name"].as_str().unwrap_or("command");
    let out = super::out_dir::out_dir_or_fresh(out, &format!("-{what}-{}", super::out_dir::sanitize(name)))?;
    let path = out.join("scenario.json");
    let text = serde_json::to_string_pretty(file).expect("serialises") + "\n";
    crate::run_files::replace(&path, text.as_bytes()).map_err(|source| Error::Io {
        what: "write",
        path: path.clone(),
        source,
    })?;
    Ok((path, out))
}

/// What `bisect -- CMD` may cut in a command line, as placeholders and the params that fill them:
/// the launcher's rank count (`{world_size}`, which bisect lowers to 1, when the command runs on
/// one node), and each flag of the program after its script: an integer `--flag N` (lowered
/// towards 0), a list of integers, comma-joined (`--depths 2,2,1`) or as separate words
/// (`--gpus 0 1 2`, argparse's `nargs="+"`: every integer up to the next flag), of which fewer
/// of its first items are kept, an on/off value (`true`/`1`/`yes`/`on` switched to its off word), a bare `--flag`
/// (removed: its value `""` drops the argument). `keep` names flags left as they are;
/// `cuts` gives a flag's values to try, in order (`--cut --batch-size=64,8`). Anything else (a
/// float, a path, a word) stays as written. Returns the argv and the params, each with the flag
/// it stands for.
pub fn decompose(
    argv: &[String],
    keep: &[String],
    cuts: &[(String, Vec<String>)],
) -> (Vec<String>, serde_json::Map<String, Value>, BTreeMap<String, String>) {
    let mut out = argv.to_vec();
    let mut params = serde_json::Map::new();
    let mut flags = BTreeMap::new();
    let mut fill = |names: &[&str], placeholder: &str| {
        for (i, arg) in argv.iter().enumerate() {
            for flag in names {
                if arg == flag && i + 1 < argv.len() {
                    out[i + 1] = format!("{{{placeholder}}}");
                } else if arg.starts_with(&format!("{flag}=")) {
                    out[i] = format!("{flag}={{{placeholder}}}");
                }
            }
        }
    };
    if let Some((per, nodes)) = rank_flags(argv) {
        if torchrun_nodes(argv).is_some() {
            fill(nodes, "nodes");
            fill(per, "ranks_per_node");
        } else if flag_value(argv, nodes).is_none() && declared_ranks(argv).is_some_and(|(n, _)| n > 1) {
            fill(per, "world_size");
        }
    }
    let Some(script) = argv.iter().position(|a| a.ends_with(".py")).or((!argv.is_empty()).then_some(0))
    else {
        return (out, params, flags);
    };
    let is_flag = |a: &str| a.starts_with("--") && a.len() > 2;
    let name_for = |flag: &str, params: &serde_json::Map<String, Value>| {
        let base: String = flag
            .trim_start_matches('-')
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let base = if base.starts_with(|c: char| c.is_ascii_digit()) { format!("f_{base}") } else { base };
        let mut name = base.clone();
        let mut n = 2;
        while params.contains_key(&name) || scenario::BUILTIN_PLACEHOLDERS.contains(&name.as_str()) {
            name = format!("{base}_{n}");
            n += 1;
        }
        name
    };
    const ON_OFF: [(&str, &str); 4] = [("true", "false"), ("1", "0"), ("yes", "no"), ("on", "off")];
    let mut dropped = Vec::new();
    let mut i = script + 1;
    while i < argv.len() {
        let arg = &argv[i];
        if !is_flag(arg) {
            i += 1;
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let next = argv.get(i + 1).filter(|n| !is_flag(n) && inline.is_none()).cloned();
        let value = inline.clone().or(next.clone());
        let width = if next.is_some() { 2 } else { 1 };
        if keep.iter().any(|k| k == &flag) {
            i += width;
            continue;
        }
        let slot = |out: &mut Vec<String>, name: &str| match (&inline, &next) {
            (Some(_), _) => out[i] = format!("{flag}={{{name}}}"),
            (None, Some(_)) => out[i + 1] = format!("{{{name}}}"),
            (None, None) => out[i] = format!("{{{name}}}"),
        };
        let given = cuts.iter().find(|(f, _)| f == &flag).map(|(_, v)| v.clone());
        let words = if inline.is_none() && given.is_none() { word_list(&argv[i + 1..]) } else { Vec::new() };
        if words.len() > 1 {
            let name = name_for(&flag, &params);
            out[i + 1] = format!("{{{name}}}");
            dropped.extend(i + 2..i + 1 + words.len());
            flags.insert(name.clone(), flag.clone());
            params.insert(name, json!({"value": words, "words": true}));
            i += 1 + words.len();
            continue;
        }
        let param = match (&value, given) {
            (Some(v), Some(list)) => Some(json!({"value": v, "cuts": list})),
            (None, Some(_)) | (None, None) => Some(json!({"value": flag, "cuts": [""]})),
            (Some(v), None) => {
                // Only where the list renders back exactly as written (`2,2`, not `02, 2`).
                let list: Option<Vec<u64>> = v
                    .split(',')
                    .map(|item| item.parse().ok().filter(|n: &u64| n.to_string() == item))
                    .collect();
                if let Ok(n) = v.parse::<u64>() {
                    (n > 0).then(|| json!(n))
                } else if let Some(items) = list.filter(|items| items.len() > 1) {
                    Some(json!(items))
                } else if let Some((_, off)) = ON_OFF.iter().find(|(on, _)| v.eq_ignore_ascii_case(on)) {
                    Some(json!({"value": v, "cuts": [off]}))
                } else {
                    None
                }
            }
        };
        if let Some(param) = param {
            let name = name_for(&flag, &params);
            slot(&mut out, &name);
            flags.insert(name.clone(), flag.clone());
            params.insert(name, param);
        }
        i += width;
    }
    let out = out.into_iter().enumerate().filter(|(k, _)| !dropped.contains(k)).map(|(_, a)| a).collect();
    (out, params, flags)
}

/// The node count of a torchrun command over several nodes (`--nnodes 2`; not an elastic
/// `MIN:MAX`), which bisect plays on this machine as `launch.nodes`: its node count and ranks per
/// node become `{nodes}` and `{ranks_per_node}`, and cutting the nodes to one gives the same
/// ranks on one node.
pub fn torchrun_nodes(argv: &[String]) -> Option<u32> {
    let (_, nodes) = rank_flags(argv)?;
    let (value, _) = flag_value(argv, nodes).filter(|_| nodes.contains(&"--nnodes"))?;
    value.parse::<u32>().ok().filter(|n| *n > 1)
}

/// The integers at the start of `rest` (the words after a flag), each written as it renders
/// back (`0`, not `00`): the items of a list written as separate words.
fn word_list(rest: &[String]) -> Vec<u64> {
    rest.iter().map_while(|a| a.parse::<u64>().ok().filter(|n| n.to_string() == *a)).collect()
}

/// The scenario's name: the script's stem (`train` for `torchrun … train.py`), else the program's.
fn name_of(argv: &[String]) -> String {
    let stem = |a: &String| Path::new(a).file_stem().map(|s| s.to_string_lossy().into_owned());
    argv.iter().find(|a| a.ends_with(".py")).and_then(stem).or_else(|| stem(&argv[0])).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn a_command_line_is_cut_into_its_flags_and_the_launchers_rank_count() {
        let argv = words(
            "torchrun --nproc_per_node 2 t.py --num-workers 8 --lr 0.1 --pin-memory --amp=yes --data /d --batch-size 64",
        );
        let keep = vec!["--lr".to_string()];
        let cuts = vec![("--batch-size".to_string(), vec!["16".to_string(), "8".to_string()])];
        let (out, params, flags) = decompose(&argv, &keep, &cuts);
        assert_eq!(
            out,
            words(
                "torchrun --nproc_per_node {world_size} t.py --num-workers {num_workers} --lr 0.1 {pin_memory} --amp={amp} --data /d --batch-size {batch_size}"
            )
        );
        assert_eq!(params["num_workers"], json!(8));
        assert_eq!(params["pin_memory"], json!({"value": "--pin-memory", "cuts": [""]}));
        assert_eq!(params["amp"], json!({"value": "yes", "cuts": ["no"]}));
        assert_eq!(params["batch_size"], json!({"value": "64", "cuts": ["16", "8"]}));
        assert_eq!(flags["pin_memory"], "--pin-memory");
        assert_eq!(params.len(), 4, "the float, the path and the kept flag stay: {params:?}");
        // A comma-joined list of integers keeps fewer items; other lists stay as written.
        let (out, params, _) = decompose(
            &words("python t.py --depths 2,2,1 --gpus 0 --lrs 0.1,0.2 --ids 01,2 --one=3,4"),
            &[],
            &[],
        );
        assert_eq!(out, words("python t.py --depths {depths} --gpus 0 --lrs 0.1,0.2 --ids 01,2 --one={one}"));
        assert_eq!((&params["depths"], &params["one"]), (&json!([2, 2, 1]), &json!([3, 4])));
        // A list written as separate words: the integers up to the next flag or other word.
        let (out, params, flags) =
            decompose(&words("python t.py --gpus 0 1 2 --seeds 7 8 data.csv --ids 1 02 --n 3"), &[], &[]);
        assert_eq!(out, words("python t.py --gpus {gpus} --seeds {seeds} data.csv --ids {ids} 02 --n {n}"));
        assert_eq!(params["gpus"], json!({"value": [0, 1, 2], "words": true}));
        assert_eq!(params["seeds"], json!({"value": [7, 8], "words": true}));
        assert_eq!(
            (&params["ids"], &params["n"], &flags["gpus"]),
            (&json!(1), &json!(3), &"--gpus".to_string())
        );
        // A flag named as a built-in placeholder gets another name, which the loader accepts.
        let (out, params, flags) = decompose(&words("python t.py --world-size 4 --nodes 2"), &[], &[]);
        assert_eq!(out, words("python t.py --world-size {world_size_2} --nodes {nodes_2}"));
        assert_eq!((&params["world_size_2"], &flags["nodes_2"]), (&json!(4), &"--nodes".to_string()));
    }

    #[test]
    fn torchrun_over_several_nodes_gives_its_node_count_and_ranks_per_node_to_the_scenario() {
        for line in
            ["torchrun --nnodes 2 --nproc_per_node 3 t.py", "torchrun --nnodes=2 --nproc-per-node=3 t.py"]
        {
            let (out, _, _) = decompose(&words(line), &[], &[]);
            let want =
                line.replace("2 ", "{nodes} ").replace("=2", "={nodes}").replace('3', "{ranks_per_node}");
            assert_eq!(out, words(&want), "{line}");
            assert_eq!(torchrun_nodes(&words(line)), Some(2));
        }
        // An elastic `MIN:MAX` range, one node, or another launcher's nodes: left as written.
        for line in [
            "torchrun --nnodes 1:4 --nproc_per_node 2 t.py",
            "torchrun --nnodes 1 --nproc_per_node 1 t.py",
            "deepspeed --num_nodes 2 --num_gpus 1 t.py",
        ] {
            assert_eq!(decompose(&words(line), &[], &[]).0, words(line), "{line}");
            assert_eq!(torchrun_nodes(&words(line)), None, "{line}");
        }
        // The scenario a bisect makes of it plays the nodes here, and fills the placeholders back.
        let argv = words("torchrun --nnodes 2 --nproc_per_node 3 t.py --workers 4");
        let (out, params, _) = decompose(&argv, &[], &[]);
        let ranks = declared_ranks(&argv).unwrap().0;
        let file = json!({"name": "t", "command": out, "params": params, "launch": {"world_size": ranks, "nodes": 2}});
        let s = scenario::load_str(&file.to_string(), Path::new(ORIGIN), &[]).unwrap();
        assert_eq!((s.launch.world_size, s.launch.nodes), (6, 2));
        let filled: Vec<String> = ["{nodes}", "{ranks_per_node}", "{world_size}"]
            .iter()
            .map(|p| s.launch_placeholder(p.trim_matches(['{', '}'])).unwrap())
            .collect();
        assert_eq!(filled, ["2", "3", "6"]);
    }

    #[test]
    fn a_scripts_stem_names_the_scenario() {
        assert_eq!(name_of(&words("torchrun --nproc_per_node 2 /x/train.py --lr 1")), "train");
        assert_eq!(name_of(&words("./bin/run-job --x")), "run-job");
    }
}
