//! What a launcher's own flags say about the job it starts: how many ranks (torchrun's
//! `--nproc_per_node` × `--nnodes`, …) and how many nodes. Pure.

use std::path::Path;

/// The ranks a launcher's own flags declare, with the flag that says so: torchrun's (and
/// `python -m torch.distributed.run`'s) `--nproc_per_node` × `--nnodes`, `accelerate launch
/// --num_processes`, `deepspeed --num_gpus` × `--num_nodes`, `srun -n`/`--ntasks`, `mpirun
/// -np`/`-n`. `None` where the command names none (a plain script, Lightning, `mp.spawn`).
pub fn declared_ranks(argv: &[String]) -> Option<(u32, String)> {
    let (per, nodes) = rank_flags(argv)?;
    let (count, flag) = flag_value(argv, per)?;
    let count: u32 = count.parse().ok()?;
    let nodes = flag_value(argv, nodes).and_then(|(v, _)| v.parse::<u32>().ok()).unwrap_or(1);
    Some((count * nodes, flag))
}

/// The value of the launcher's per-node rank flag as written (`{ranks}` in `--nproc_per_node
/// {ranks}`), where the command has one.
pub fn rank_flag_value(argv: &[String]) -> Option<String> {
    let (per, _) = rank_flags(argv)?;
    flag_value(argv, per).map(|(value, _)| value)
}

/// The launcher's flags for ranks per node and for nodes.
pub fn rank_flags(argv: &[String]) -> Option<(&'static [&'static str], &'static [&'static str])> {
    let name =
        |a: &str| Path::new(a).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let program = name(argv.first()?);
    let module = argv.windows(2).find(|w| w[0] == "-m").map(|w| w[1].clone()).unwrap_or_default();
    let (per, nodes): (&[&str], &[&str]) = if program == "torchrun" || module == "torch.distributed.run" {
        (&["--nproc_per_node", "--nproc-per-node"], &["--nnodes"])
    } else if program == "accelerate" {
        (&["--num_processes", "--num-processes"], &[])
    } else if program == "deepspeed" {
        (&["--num_gpus", "--num-gpus"], &["--num_nodes", "--num-nodes"])
    } else if program == "srun" {
        (&["-n", "--ntasks"], &[])
    } else if program == "mpirun" || program == "mpiexec" {
        (&["-np", "-n"], &[])
    } else {
        return None;
    };
    Some((per, nodes))
}

/// The value of the first of `flags` in `argv` (`--flag V` or `--flag=V`), and how it was written.
pub fn flag_value(argv: &[String], flags: &[&str]) -> Option<(String, String)> {
    for (i, arg) in argv.iter().enumerate() {
        for flag in flags {
            if arg == flag {
                let value = argv.get(i + 1)?.clone();
                return Some((value.clone(), format!("{flag} {value}")));
            }
            if let Some(value) = arg.strip_prefix(&format!("{flag}=")) {
                return Some((value.to_string(), arg.clone()));
            }
        }
    }
    None
}

/// The nodes a launcher's own flags say it waits for, when more than one, with the flag as
/// written: torchrun's `--nnodes N` (an elastic `MIN:MAX`, its minimum), `deepspeed --num_nodes N`.
pub fn declared_nodes(argv: &[String]) -> Option<(u32, String)> {
    let (_, nodes) = rank_flags(argv)?;
    let (value, flag) = flag_value(argv, nodes)?;
    let min: u32 = value.split(':').next()?.parse().ok()?;
    (min > 1).then_some((min, flag))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    #[test]
    fn the_launchers_own_flags_give_the_rank_count() {
        for (line, want) in [
            ("torchrun --nproc_per_node 2 train.py", Some(2)),
            ("torchrun --nproc-per-node=4 --nnodes 2 train.py", Some(8)),
            ("python -m torch.distributed.run --nproc_per_node=3 t.py", Some(3)),
            ("accelerate launch --num_processes 2 t.py", Some(2)),
            ("deepspeed --num_gpus 2 --num_nodes 1 t.py", Some(2)),
            ("srun -n 4 python t.py", Some(4)),
            ("mpirun -np 2 python t.py", Some(2)),
            ("python train.py --nproc_per_node 9", None),
            ("torchrun --nproc_per_node gpu train.py", None),
        ] {
            assert_eq!(declared_ranks(&words(line)).map(|(n, _)| n), want, "{line}");
        }
        assert_eq!(
            declared_ranks(&words("torchrun --nproc-per-node=4 t.py")).unwrap().1,
            "--nproc-per-node=4"
        );
    }

    #[test]
    fn the_launchers_own_flags_give_the_nodes_it_waits_for() {
        for (line, want) in [
            ("torchrun --nnodes 2 --nproc_per_node 2 t.py", Some(2)),
            ("torchrun --nnodes=2:4 t.py", Some(2)),
            ("torchrun --nnodes 1 t.py", None),
            ("deepspeed --num_nodes 3 t.py", Some(3)),
            ("python t.py --nnodes 2", None),
        ] {
            assert_eq!(declared_nodes(&words(line)).map(|(n, _)| n), want, "{line}");
        }
        assert_eq!(declared_nodes(&words("torchrun --nnodes=2:4 t.py")).unwrap().1, "--nnodes=2:4");
    }
}
