//! torchrun's per-node form: on node R of N, `torchrun … script.py` becomes
//! `torchrun --nnodes N --node-rank R --nproc-per-node LOCAL --rdzv-backend c10d
//! --rdzv-endpoint NODE0:PORT --rdzv-id ID --rdzv-conf is_host=… … script.py`. ups-doctor owns
//! the node count, node rank and ranks per node (they follow from `--nodes` and
//! `launch.world_size`): the command's own values of those, and `--standalone`, are replaced. The
//! rendezvous flags the command gives are kept.

use super::placement::NodePlacement;

/// torchrun options that take no value.
const SWITCHES: [&str; 7] =
    ["--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"];
/// The options ups-doctor sets on every node, in both spellings.
const OWNED: [&str; 6] =
    ["--nnodes", "--node-rank", "--node_rank", "--nproc-per-node", "--nproc_per_node", "--standalone"];

/// Where torchrun's own options start: after `torchrun`, or after `python -m torch.distributed.run`.
fn options_start(argv: &[String]) -> Option<usize> {
    let launcher = crate::scenario::launcher::of_command(argv).filter(|l| l.torchrun_form)?;
    let name = |s: &String| std::path::Path::new(s).file_name().map(|n| n.to_string_lossy().into_owned());
    match argv.first().and_then(name) {
        Some(p) if launcher.programs.contains(&p.as_str()) => Some(1),
        // `python -m torch.distributed.run`: from after the module.
        _ => argv.iter().position(|a| a == "-m").map(|m| m + 2),
    }
}

/// The command as node `p.node` runs it; anything that is not torchrun is left as it is (its
/// ranks get the global `RANK`, `WORLD_SIZE`, `MASTER_ADDR` from ups-doctor).
pub fn per_node(argv: &[String], p: &NodePlacement) -> Vec<String> {
    let Some(start) = options_start(argv) else { return argv.to_vec() };
    // torchrun's options run up to the script: the first word that is neither an option nor an
    // option's value.
    let mut end = start;
    while end < argv.len() && argv[end].starts_with('-') {
        let takes_value = !argv[end].contains('=') && !SWITCHES.contains(&argv[end].as_str());
        end += if takes_value { 2 } else { 1 };
    }
    let end = end.min(argv.len());
    let key = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    let given = |names: &[&str]| argv[start..end].iter().any(|a| names.contains(&key(a).as_str()));
    let mut options: Vec<String> = Vec::new();
    let mut i = start;
    while i < end {
        let a = &argv[i];
        let value = !a.contains('=') && !SWITCHES.contains(&a.as_str());
        let width = if value { 2 } else { 1 };
        if !OWNED.contains(&key(a).as_str()) {
            options.extend(argv[i..(i + width).min(end)].iter().cloned());
        }
        i += width;
    }
    let mut ours = vec![
        "--nnodes".to_string(),
        p.nodes.to_string(),
        "--node-rank".into(),
        p.node.to_string(),
        "--nproc-per-node".into(),
        p.local_world.to_string(),
    ];
    if !given(&["--rdzv-backend", "--rdzv_backend"]) {
        ours.extend(["--rdzv-backend".into(), "c10d".into()]);
    }
    if !given(&["--rdzv-endpoint", "--rdzv_endpoint"]) {
        ours.extend([
            "--rdzv-endpoint".into(),
            format!("{}:{}", host_for_url(&p.master_addr), p.master_port),
        ]);
    }
    if !given(&["--rdzv-id", "--rdzv_id"]) {
        ours.extend(["--rdzv-id".into(), format!("ups-doctor-{}", p.master_port)]);
    }
    if !given(&["--rdzv-conf", "--rdzv_conf"]) {
        // Node 0 hosts the rendezvous store; said outright, so that nodes sharing a host (tests,
        // a one-host Slurm) do not each take themselves for its host.
        ours.extend(["--rdzv-conf".into(), format!("is_host={}", u8::from(p.node == 0))]);
    }
    argv[..start].iter().cloned().chain(ours).chain(options).chain(argv[end..].iter().cloned()).collect()
}

fn host_for_url(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn node(n: u32) -> NodePlacement {
        NodePlacement {
            node: n,
            nodes: 2,
            local_world: 2,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            first_rank: None,
        }
    }

    #[test]
    fn torchrun_gets_the_node_its_ranks_and_node_0s_rendezvous() {
        let got = per_node(
            &argv("torchrun --standalone --nproc_per_node 4 --max-restarts=0 train.py --nproc_per_node 9"),
            &node(1),
        );
        assert_eq!(
            got.join(" "),
            "torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29500 \
             --rdzv-id ups-doctor-29500 --rdzv-conf is_host=0 --max-restarts=0 train.py --nproc_per_node 9"
        );
        let got = per_node(
            &argv("python3 -m torch.distributed.run --nnodes=1 --rdzv-endpoint h:1 --rdzv-id x -m pkg.train"),
            &node(0),
        );
        assert_eq!(
            got.join(" "),
            "python3 -m torch.distributed.run --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-backend c10d \
             --rdzv-conf is_host=1 --rdzv-endpoint h:1 --rdzv-id x -m pkg.train"
        );
    }

    #[test]
    fn other_commands_are_left_alone() {
        let a = argv("python train.py --nnodes 3");
        assert_eq!(per_node(&a, &node(1)), a);
        let a = argv("srun -n 2 python train.py");
        assert_eq!(per_node(&a, &node(1)), a);
    }
}
