//! Who this node is: from `--nodes N --node-rank R --coordinator HOST:PORT`, or from the launcher
//! it runs under (Slurm's `SLURM_NNODES`, `SLURM_NODEID` and `SLURM_JOB_NODELIST`'s first host;
//! torchrun-style `NNODES`, `NODE_RANK` and `MASTER_ADDR`, or torchrun's own `PET_NNODES`,
//! `PET_NODE_RANK` and `PET_MASTER_ADDR`, which Kubeflow's PyTorchJob and TrainJob set in each pod).

use std::time::Duration;

/// The coordinator's port when nothing names one (`UPS_DOCTOR_COORDINATOR_PORT` does).
pub const DEFAULT_PORT: u16 = 29_411;
pub const PORT_ENV: &str = "UPS_DOCTOR_COORDINATOR_PORT";

/// This agent's place among the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub nodes: u32,
    pub node: u32,
    /// Node 0's `HOST:PORT`, which every agent connects to.
    pub coordinator: String,
    /// What node 0 listens on: the coordinator's address unless `--listen` says otherwise.
    pub listen: Option<String>,
    /// How long agents wait for the others (node 0) or for the coordinator (the others).
    pub join_timeout: Duration,
    /// Where the values came from: `flags`, `Slurm`, `NNODES/NODE_RANK`, `PET_NNODES/PET_NODE_RANK`.
    pub source: &'static str,
    /// What each node runs, for the hints of a failed join: `ups-doctor run SCENARIO`.
    pub each_node_runs: &'static str,
}

/// What each node of a multi-node run runs.
pub const RUN_ON_EACH_NODE: &str = "ups-doctor run SCENARIO";

/// What the command line said about nodes.
#[derive(Debug, Clone, Default)]
pub struct NodeFlags {
    pub nodes: Option<u32>,
    pub node_rank: Option<u32>,
    pub coordinator: Option<String>,
    pub listen: Option<String>,
    pub join_timeout_s: Option<f64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct NodeConfigError(pub String);

impl NodeConfig {
    /// The node configuration, or `None` for an ordinary one-machine run. `env` reads a variable.
    pub fn resolve(
        flags: &NodeFlags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<NodeConfig>, NodeConfigError> {
        let bad = |m: String| Err(NodeConfigError(m));
        let port = match env(PORT_ENV) {
            Some(p) => match p.trim().parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return bad(format!("`{PORT_ENV}={p}` is not a port number (1-65535)")),
            },
            None => DEFAULT_PORT,
        };
        let join_timeout = Duration::from_secs_f64(flags.join_timeout_s.unwrap_or(120.0).max(0.1));
        let (nodes, node, host, source) = if let Some(nodes) = flags.nodes {
            let Some(node) = flags.node_rank else {
                return bad(format!(
                    "`--nodes {nodes}` needs `--node-rank R` (0 on the coordinator's node, 0..{} on the others)",
                    nodes.saturating_sub(1)
                ));
            };
            (nodes, node, None, "flags")
        } else if flags.node_rank.is_some() {
            return bad("`--node-rank` needs `--nodes N`".into());
        } else if let (Some(n), Some(id)) = (env("SLURM_NNODES"), env("SLURM_NODEID")) {
            let nodes = parse_count("SLURM_NNODES", &n)?;
            if nodes < 2 {
                return Ok(None);
            }
            let ntasks = env("SLURM_NTASKS").and_then(|t| t.trim().parse::<u32>().ok());
            if ntasks.is_some_and(|t| t != nodes) && flags.coordinator.is_none() {
                return bad(format!(
                    "under Slurm with {nodes} nodes and {} tasks: start one ups-doctor per node (`srun --ntasks-per-node=1 ups-doctor run …`); ups-doctor starts the node's ranks itself",
                    ntasks.unwrap_or(0)
                ));
            }
            let host = match env("SLURM_JOB_NODELIST").or_else(|| env("SLURM_NODELIST")) {
                Some(list) => first_host(&list)
                    .ok_or_else(|| NodeConfigError(format!("`SLURM_JOB_NODELIST={list}` names no host")))?,
                None => return bad(
                    "`SLURM_NNODES` is set but `SLURM_JOB_NODELIST` is not: give `--coordinator HOST:PORT`"
                        .into(),
                ),
            };
            (nodes, parse_count("SLURM_NODEID", &id)?, Some(host), "Slurm")
        } else if let Some(placed) = torchrun_style(env) {
            let (nodes, node, host, source) = placed?;
            if nodes < 2 {
                return Ok(None);
            }
            (nodes, node, Some(host), source)
        } else {
            if flags.coordinator.is_some() {
                return bad("`--coordinator` needs `--nodes N --node-rank R`".into());
            }
            return Ok(None);
        };
        if nodes == 0 {
            return bad("`--nodes` must be at least 1".into());
        }
        if node >= nodes {
            return bad(format!(
                "node rank {node} is not below the number of nodes {nodes} (node ranks are 0..{})",
                nodes - 1
            ));
        }
        let coordinator = match (&flags.coordinator, host) {
            (Some(c), _) => c.clone(),
            (None, Some(h)) => format!("{h}:{port}"),
            (None, None) => format!("127.0.0.1:{port}"),
        };
        if split_host_port(&coordinator).is_none() {
            return bad(format!(
                "`--coordinator {coordinator}` is not HOST:PORT (e.g. `node01:{DEFAULT_PORT}`)"
            ));
        }
        Ok(Some(NodeConfig {
            nodes,
            node,
            coordinator,
            listen: flags.listen.clone(),
            join_timeout,
            source,
            each_node_runs: RUN_ON_EACH_NODE,
        }))
    }

    /// Node 0's host, for the ranks' `MASTER_ADDR`.
    pub fn coordinator_host(&self) -> String {
        split_host_port(&self.coordinator).map_or_else(|| "127.0.0.1".into(), |(h, _)| h.to_string())
    }
}

/// torchrun's variables for a node's place: its own names, and the `PET_` ones (torchrun reads
/// each of its flags from `PET_<FLAG>`; Kubeflow's PyTorchJob and TrainJob set them in every pod):
/// the node count, this node's rank, node 0's host, and what to call them.
const TORCHRUN_STYLE: [(&str, &str, &[&str], &str); 2] = [
    ("NNODES", "NODE_RANK", &["MASTER_ADDR"], "NNODES/NODE_RANK"),
    ("PET_NNODES", "PET_NODE_RANK", &["PET_MASTER_ADDR", "MASTER_ADDR"], "PET_NNODES/PET_NODE_RANK"),
];

/// The first of [`TORCHRUN_STYLE`] whose count and rank are both set: nodes, node, node 0's host.
fn torchrun_style(
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<Result<(u32, u32, String, &'static str), NodeConfigError>> {
    let (n, r, nodes_var, rank_var, hosts, source) = TORCHRUN_STYLE
        .iter()
        .find_map(|&(nv, rv, hosts, source)| Some((env(nv)?, env(rv)?, nv, rv, hosts, source)))?;
    let placed = || {
        // An elastic job's `MIN:MAX` nodes: how many run is known only once they met.
        if n.contains(':') {
            return Err(NodeConfigError(format!(
                "`{nodes_var}={n}` is an elastic range: ups-doctor needs the nodes' number; give `--nodes N \
                 --node-rank R --coordinator HOST:PORT`"
            )));
        }
        let nodes = parse_count(nodes_var, &n)?;
        let Some(host) = hosts.iter().find_map(|h| env(h)) else {
            return Err(NodeConfigError(format!(
                "`{nodes_var}` and `{rank_var}` are set but `{}` is not: it names node 0's host",
                hosts.join("` or `")
            )));
        };
        Ok((nodes, parse_count(rank_var, &r)?, host, source))
    };
    Some(placed())
}

fn parse_count(name: &str, value: &str) -> Result<u32, NodeConfigError> {
    value.trim().parse().map_err(|_| NodeConfigError(format!("`{name}={value}` is not a whole number")))
}

/// `HOST:PORT` (`[::1]:PORT` for IPv6) split in two.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port = port.parse::<u16>().ok().filter(|&p| p > 0)?;
    (!host.is_empty()).then_some((host, port))
}

/// The first host of a Slurm node list: `node[01-04,07],gpu1` → `node01`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                ',' if depth == 0 => return true,
                _ => {}
            }
            false
        })
        .map_or(list.len(), |(i, _)| i);
    let first = &list[..end];
    let host = match first.split_once('[') {
        Some((prefix, rest)) => {
            let range = rest.trim_end_matches(']').split(',').next()?;
            let start = range.split('-').next()?;
            format!("{prefix}{start}")
        }
        None => first.to_string(),
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn slurm_node_lists_give_their_first_host() {
        assert_eq!(first_host("node[01-04,07],gpu1").as_deref(), Some("node01"));
        assert_eq!(first_host("gpu7,gpu8").as_deref(), Some("gpu7"));
        assert_eq!(first_host("a-b[3,5]").as_deref(), Some("a-b3"));
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        assert_eq!(first_host(""), None);
    }

    #[test]
    fn flags_win_and_loopback_is_the_default() {
        let flags = NodeFlags { nodes: Some(2), node_rank: Some(1), ..Default::default() };
        let c = NodeConfig::resolve(&flags, &env_of(&[("SLURM_NNODES", "8")])).unwrap().unwrap();
        assert_eq!((c.nodes, c.node, c.coordinator.as_str(), c.source), (2, 1, "127.0.0.1:29411", "flags"));
        let flags = NodeFlags { coordinator: Some("[::1]:7000".into()), ..flags };
        let c = NodeConfig::resolve(&flags, &env_of(&[])).unwrap().unwrap();
        assert_eq!(c.coordinator_host(), "::1");
    }

    #[test]
    fn slurm_and_torchrun_variables_place_the_node() {
        let slurm = env_of(&[
            ("SLURM_NNODES", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
        ]);
        let c = NodeConfig::resolve(&NodeFlags::default(), &slurm).unwrap().unwrap();
        assert_eq!((c.nodes, c.node, c.coordinator.as_str(), c.source), (2, 1, "gpu07:29411", "Slurm"));
        let torchrun =
            env_of(&[("NNODES", "3"), ("NODE_RANK", "2"), ("MASTER_ADDR", "10.0.0.1"), (PORT_ENV, "4000")]);
        let c = NodeConfig::resolve(&NodeFlags::default(), &torchrun).unwrap().unwrap();
        assert_eq!((c.nodes, c.node, c.coordinator.as_str()), (3, 2, "10.0.0.1:4000"));
        // A Kubeflow pod (TrainJob's torch-distributed runtime, PyTorchJob with `nprocPerNode`):
        // torchrun's `PET_` variables; node 0's host is its master Service.
        let pod = env_of(&[
            ("PET_NNODES", "4"),
            ("PET_NODE_RANK", "3"),
            ("PET_NPROC_PER_NODE", "8"),
            ("PET_MASTER_ADDR", "job-node-0-0.job"),
            ("PET_MASTER_PORT", "29400"),
        ]);
        let c = NodeConfig::resolve(&NodeFlags::default(), &pod).unwrap().unwrap();
        assert_eq!(
            (c.nodes, c.node, c.coordinator.as_str(), c.source),
            (4, 3, "job-node-0-0.job:29411", "PET_NNODES/PET_NODE_RANK")
        );
        let c = NodeConfig::resolve(
            &NodeFlags::default(),
            &env_of(&[("PET_NNODES", "2"), ("PET_NODE_RANK", "0"), ("MASTER_ADDR", "master-0")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.coordinator, "master-0:29411");
        // One node is an ordinary run.
        assert_eq!(
            NodeConfig::resolve(
                &NodeFlags::default(),
                &env_of(&[("SLURM_NNODES", "1"), ("SLURM_NODEID", "0")])
            )
            .unwrap(),
            None
        );
        assert_eq!(NodeConfig::resolve(&NodeFlags::default(), &env_of(&[])).unwrap(), None);
    }

    #[test]
    fn wrong_placements_are_refused_with_the_fix() {
        let err = |flags: NodeFlags, env: &'static [(&'static str, &'static str)]| {
            NodeConfig::resolve(&flags, &env_of(env)).unwrap_err().0
        };
        assert!(
            err(NodeFlags { nodes: Some(2), ..Default::default() }, &[]).contains("needs `--node-rank R`")
        );
        assert!(
            err(NodeFlags { nodes: Some(2), node_rank: Some(2), ..Default::default() }, &[])
                .contains("not below")
        );
        let flags = NodeFlags {
            nodes: Some(2),
            node_rank: Some(0),
            coordinator: Some("node01".into()),
            ..Default::default()
        };
        assert!(err(flags, &[]).contains("is not HOST:PORT"));
        let e = err(
            NodeFlags::default(),
            &[
                ("SLURM_NNODES", "2"),
                ("SLURM_NODEID", "0"),
                ("SLURM_NTASKS", "8"),
                ("SLURM_JOB_NODELIST", "a,b"),
            ],
        );
        assert!(e.contains("--ntasks-per-node=1"), "{e}");
        assert!(err(NodeFlags::default(), &[("NNODES", "2"), ("NODE_RANK", "0")]).contains("MASTER_ADDR"));
        let e = err(NodeFlags::default(), &[("PET_NNODES", "2"), ("PET_NODE_RANK", "1")]);
        assert!(e.contains("`PET_MASTER_ADDR` or `MASTER_ADDR` is not"), "{e}");
        let e =
            err(NodeFlags::default(), &[("PET_NNODES", "1:4"), ("PET_NODE_RANK", "0"), ("MASTER_ADDR", "m")]);
        assert!(e.contains("`PET_NNODES=1:4` is an elastic range") && e.contains("--nodes N"), "{e}");
    }
}
