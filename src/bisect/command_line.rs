//! A command's bisect in the command's own words: the minimal failing command line, ready to
//! paste into a POSIX shell (its folder and variables included), and the boundary as the
//! program's flags (`` `--num-workers 2` ``, `` `--pin-memory` is removed ``, `` `NCCL_P2P_DISABLE`
//! is unset ``).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::scenario::{Scenario, shell_line, shell_quote};

use super::search::BoundaryEntry;
use super::space::env_id;

/// The minimal failing command of a command's bisect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinimalCommand {
    /// The line to paste into a shell: `cd DIR && NAME=VALUE … PROGRAM ARGS…`.
    pub line: String,
    /// Each cut that makes it pass, in the program's own words.
    pub passes_once: Vec<String>,
    /// The nodes the line is run on, one copy each, where it needs more than one (a torchrun
    /// `--nnodes N` that still fails only across nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
}

/// The minimal command of `minimal` and the cuts of `boundary` that pass, with `flags` naming
/// the flag each param stands for.
pub fn minimal_command(
    minimal: &Scenario,
    boundary: &[BoundaryEntry],
    flags: &BTreeMap<String, String>,
) -> MinimalCommand {
    let mut words: Vec<String> =
        minimal.launch.env.iter().map(|(k, v)| format!("{k}={}", shell_quote(v))).collect();
    words.push(shell_line(&minimal_argv(minimal)));
    let mut line = words.join(" ");
    if let Some(dir) = &minimal.launch.cwd {
        line = format!("cd {} && {line}", shell_quote(dir));
    }
    let passes_once =
        boundary.iter().filter(|b| b.passes).map(|b| in_flag_words(&b.cut, flags, minimal)).collect();
    let nodes = (minimal.launch.nodes > 1).then_some(minimal.launch.nodes);
    MinimalCommand { line, passes_once, nodes }
}

/// The minimal scenario's command line with its params filled in (other placeholders as written).
fn minimal_argv(minimal: &Scenario) -> Vec<String> {
    let command = minimal.command.as_deref().unwrap_or_default();
    crate::scenario::render_with(command, &minimal.params, |name| minimal.launch_placeholder(name))
}

/// A boundary setting (`params.num_workers=3`) in the command's own words (`` `--num-workers 3` ``,
/// `` `--depths 4,4` `` or `` `--gpus 0 1` `` as the list was written, `` `--pin-memory` is
/// removed ``, `` `NAME` is unset ``); anything else as it is.
fn in_flag_words(cut: &str, flags: &BTreeMap<String, String>, scenario: &Scenario) -> String {
    let settings: Vec<&str> = cut.split(", ").collect();
    // One rank is on one node: the rank cut takes the nodes along, and says so by itself.
    let said = |s: &&&str| !(s.starts_with("launch.nodes=") && settings.len() > 1);
    let words: Vec<String> =
        settings.iter().filter(said).map(|s| setting_in_flag_words(s, flags, scenario)).collect();
    words.join(" and ")
}

/// One setting of a cut in the command's own words.
fn setting_in_flag_words(setting: &str, flags: &BTreeMap<String, String>, scenario: &Scenario) -> String {
    let Some((field, value)) = setting.split_once('=') else { return format!("`{setting}`") };
    if field == "launch.world_size" {
        return format!("the launcher runs {value} rank{}", if value == "1" { "" } else { "s" });
    }
    if field == "launch.nodes" && value == "1" {
        let ranks = scenario.launch.world_size;
        return format!("its {ranks} rank{} run on one node", if ranks == 1 { "" } else { "s" });
    }
    if let Some(name) = field.strip_prefix(env_id("").as_str()) {
        return format!("`{name}` is unset");
    }
    let Some((name, flag)) = field.strip_prefix("params.").and_then(|name| flags.get_key_value(name)) else {
        return format!("`{setting}`");
    };
    let value = value.trim_matches('"');
    let value = match value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        Some(items) if scenario.params.get(name).is_some_and(|p| p.words) => items.replace(',', " "),
        Some(items) => items.to_string(),
        None => value.to_string(),
    };
    if value.is_empty() { format!("`{flag}` is removed") } else { format!("`{flag} {value}`") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(cut: &str, passes: bool) -> BoundaryEntry {
        BoundaryEntry { component: String::new(), cut: cut.into(), passes, runs: 1 }
    }

    #[test]
    fn the_minimal_command_carries_its_folder_and_variables_and_says_each_passing_cut_in_flags() {
        let scenario: Scenario = serde_json::from_value(serde_json::json!({
            "name": "t",
            "command": ["torchrun", "--nproc_per_node", "{world_size}", "t.py", "--workers", "{workers}",
                        "--depths", "{depths}", "{pin}", "--gpus", "{gpus}"],
            "launch": {"world_size": 2, "env": {"KERNEL": "fast one", "NCCL_P2P_DISABLE": "1"},
                       "cwd": "/runs/it's here"},
            "params": {"workers": 3, "depths": [4, 4], "pin": {"value": "--pin-memory", "cuts": [""]},
                       "gpus": {"value": [0, 1, 2], "words": true}}
        }))
        .unwrap();
        let flags = BTreeMap::from([
            ("workers".to_string(), "--workers".to_string()),
            ("depths".to_string(), "--depths".to_string()),
            ("pin".to_string(), "--pin-memory".to_string()),
            ("gpus".to_string(), "--gpus".to_string()),
        ]);
        let boundary = [
            entry("params.workers=2", true),
            entry("params.depths=[4]", true),
            entry("params.pin=\"\"", true),
            entry("params.gpus=[0,1]", true),
            entry("launch.env.NCCL_P2P_DISABLE=null", true),
            entry("launch.world_size=1", true),
            entry("launch.env.KERNEL=null", false),
        ];
        let m = minimal_command(&scenario, &boundary, &flags);
        assert_eq!(
            m.line,
            "cd '/runs/it'\\''s here' && KERNEL='fast one' NCCL_P2P_DISABLE=1 torchrun --nproc_per_node 2 t.py \
             --workers 3 --depths 4,4 --pin-memory --gpus 0 1 2"
        );
        assert_eq!(
            m.passes_once,
            [
                "`--workers 2`",
                "`--depths 4`",
                "`--pin-memory` is removed",
                "`--gpus 0 1`",
                "`NCCL_P2P_DISABLE` is unset",
                "the launcher runs 1 rank"
            ]
        );
    }

    #[test]
    fn a_command_that_still_needs_its_nodes_is_given_per_node_and_the_one_node_cut_in_words() {
        let scenario: Scenario = serde_json::from_value(serde_json::json!({
            "name": "t",
            "command": ["torchrun", "--nnodes", "{nodes}", "--nproc_per_node", "{ranks_per_node}", "t.py"],
            "launch": {"world_size": 4, "nodes": 2},
        }))
        .unwrap();
        let boundary = [entry("launch.nodes=1", true), entry("launch.world_size=1", true)];
        let m = minimal_command(&scenario, &boundary, &BTreeMap::new());
        assert_eq!(m.line, "torchrun --nnodes 2 --nproc_per_node 2 t.py");
        assert_eq!(m.passes_once, ["its 4 ranks run on one node", "the launcher runs 1 rank"]);
        // The rank cut's own ladder takes the nodes along, and is said as the rank cut.
        let m = minimal_command(
            &scenario,
            &[entry("launch.nodes=1, launch.world_size=1", true)],
            &BTreeMap::new(),
        );
        assert_eq!(m.passes_once, ["the launcher runs 1 rank"]);
        assert_eq!(m.nodes, Some(2));
        let mut one = scenario.clone();
        one.launch.nodes = 1;
        let m = minimal_command(&one, &[], &BTreeMap::new());
        assert_eq!((m.line.as_str(), m.nodes), ("torchrun --nnodes 1 --nproc_per_node 4 t.py", None));
    }
}
