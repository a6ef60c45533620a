//! Checks before anything runs that this machine's limits let ups-doctor start every rank: the
//! open-file limit is raised to its hard value, and a world size that still cannot fit is refused
//! with the figure and the fix (see [`super::os::nofile`]).

use std::path::Path;

use crate::scenario::LaunchStyle;

use super::ScenarioInput;
use super::os::nofile;

/// Processes ups-doctor itself starts for `input` on this machine (or on one node of several):
/// one per rank, or one for a launcher that starts the ranks itself.
pub fn processes_started(input: &ScenarioInput) -> u64 {
    let s = &input.scenario;
    let per_node = u64::from(s.launch.world_size.div_ceil(s.launch.nodes.max(1)));
    if !s.is_external() {
        return per_node;
    }
    let launcher = match s.launch.style {
        LaunchStyle::Launcher => true,
        LaunchStyle::PerRank => false,
        LaunchStyle::Auto => {
            let dir = input.file.parent().unwrap_or(Path::new("."));
            use crate::harness::plan::command;
            command::auto_style(&command::argv(s, dir, 0), command::cwd(s, dir).as_deref()).0
        }
    };
    if launcher { 1 } else { per_node }
}

/// Raises the soft open-file limit to the hard one, then refuses (with the figure and the fix,
/// one line per scenario) every scenario whose ranks would still not fit in it.
///
/// # Errors
///
/// The message of bad input: the file and field, the files needed, the limit, the fix.
pub fn check_open_files(inputs: &[ScenarioInput]) -> Result<(), String> {
    let limit = nofile::raise();
    let open = nofile::open_now();
    let errors: Vec<String> = inputs
        .iter()
        .filter_map(|i| {
            let ranks = processes_started(i);
            let need = nofile::needed(ranks, open);
            (need > limit.soft).then(|| refusal(i, ranks, need, limit, open))
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(errors.join("\nerror: ")) }
}

fn refusal(input: &ScenarioInput, ranks: u64, need: u64, limit: nofile::Limit, open: u64) -> String {
    let field = "launch.world_size";
    let at = match input.overrides.iter().rev().find(|o| o.starts_with(&format!("{field}="))) {
        Some(raw) => format!("{}: --set {raw}", input.file.display()),
        None => crate::scenario::field_location(&input.file, field),
    };
    let most = nofile::most_ranks(limit.soft, open);
    let per_node = if input.scenario.launch.nodes > 1 { " on this node" } else { "" };
    format!(
        "{at}: `{field}`: {ranks} ranks{per_node} need about {need} open files in ups-doctor ({} a rank), but its \
         open-file limit is {} (the soft limit was raised to the hard limit, {}, already)\n  hint: use `world_size: \
         {most}` or fewer, or raise the hard limit before the run: `ulimit -Hn {need}` as root, `LimitNOFILE={need}` \
         for a systemd service, `--ulimit nofile={need}:{need}` for `docker run`",
        nofile::FILES_PER_RANK,
        limit.soft,
        limit.hard
    )
}
