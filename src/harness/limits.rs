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

/// The scenarios whose ranks would not fit in the open-file limit: one line each.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\nerror: "))]
pub struct TooFewFiles(pub Vec<FilesRefused>);

/// One scenario refused: the field, the files its ranks need, the limit, the fix.
#[derive(Debug, thiserror::Error)]
#[error(
    "{at}: `{FIELD}`: {ranks} ranks{} need about {need} open files in ups-doctor ({} a rank), but its open-file \
     limit is {} (the soft limit was raised to the hard limit, {}, already)\n  hint: use `world_size: {most}` or \
     fewer, or raise the hard limit before the run: `ulimit -Hn {need}` as root, `LimitNOFILE={need}` for a \
     systemd service, `--ulimit nofile={need}:{need}` for `docker run`",
    if *.per_node { " on this node" } else { "" },
    nofile::FILES_PER_RANK,
    limit.soft,
    limit.hard
)]
pub struct FilesRefused {
    /// Where the world size is written: `file:line:column`, or `file: --set raw`.
    pub at: String,
    pub ranks: u64,
    /// Whether `ranks` are this node's share of several.
    pub per_node: bool,
    pub need: u64,
    pub limit: nofile::Limit,
    /// The most ranks that fit.
    pub most: u64,
}

/// The field a refusal names.
const FIELD: &str = "launch.world_size";

/// Raises the soft open-file limit to the hard one, then refuses (with the figure and the fix,
/// one line per scenario) every scenario whose ranks would still not fit in it.
///
/// # Errors
///
/// Bad input: each scenario's file and field, the files needed, the limit, the fix.
pub fn check_open_files(inputs: &[ScenarioInput]) -> Result<(), TooFewFiles> {
    let limit = nofile::raise();
    let open = nofile::open_now();
    let refused: Vec<FilesRefused> = inputs
        .iter()
        .filter_map(|i| {
            let ranks = processes_started(i);
            let need = nofile::needed(ranks, open);
            (need > limit.soft).then(|| refusal(i, ranks, need, limit, open))
        })
        .collect();
    if refused.is_empty() { Ok(()) } else { Err(TooFewFiles(refused)) }
}

fn refusal(input: &ScenarioInput, ranks: u64, need: u64, limit: nofile::Limit, open: u64) -> FilesRefused {
    let at = match input.overrides.iter().rev().find(|o| o.starts_with(&format!("{FIELD}="))) {
        Some(raw) => format!("{}: --set {raw}", input.file.display()),
        None => crate::scenario::field_location(&input.file, FIELD),
    };
    FilesRefused {
        at,
        ranks,
        per_node: input.scenario.launch.nodes > 1,
        need,
        limit,
        most: nofile::most_ranks(limit.soft, open),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(per_node: bool) -> FilesRefused {
        let limit = nofile::Limit { soft: 256, hard: 256 };
        FilesRefused { at: "s.json:3:5".into(), ranks: 100, per_node, need: 620, limit, most: 38 }
    }

    #[test]
    fn a_refusal_names_the_field_the_figures_and_the_fix_one_line_per_scenario() {
        let text = TooFewFiles(vec![refused(true), refused(false)]).to_string();
        let (first, second) = text.split_once("\nerror: ").unwrap();
        assert_eq!(
            first,
            "s.json:3:5: `launch.world_size`: 100 ranks on this node need about 620 open files in ups-doctor (6 a \
             rank), but its open-file limit is 256 (the soft limit was raised to the hard limit, 256, already)\n  \
             hint: use `world_size: 38` or fewer, or raise the hard limit before the run: `ulimit -Hn 620` as root, \
             `LimitNOFILE=620` for a systemd service, `--ulimit nofile=620:620` for `docker run`"
        );
        assert_eq!(second, first.replace(" on this node", ""));
    }
}
