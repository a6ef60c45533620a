//! Checkpoints: parameters, optimizer state and the position in the data, saved so that a resumed
//! run continues with the same loss trajectory.
//!
//! Layout: `<dir>/step-000020/` holds `meta.json` and one tensor file per writer: `rank0.ot` for
//! single and DDP (rank 0 saves the whole model), `rank<r>.ot` from every rank under FSDP (each
//! its shards). A save writes everything into `<dir>/.step-000020.tmp/` and renames that directory
//! into place last (rank 0, after every rank wrote its file), so a rank killed mid-save leaves
//! only a temporary directory behind, never a `step-N` that looks complete but is not.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::optim::AdamW;

/// What `meta.json` records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub format: u32,
    /// Optimizer steps completed; the resumed run starts at this step.
    pub step: u64,
    /// `single`, `ddp` or `fsdp`.
    pub mode: String,
    pub world_size: u32,
    /// Tensor files in the directory (`rank0.ot`, …).
    pub files: Vec<String>,
    /// Micro-batches drawn from the sampler so far.
    pub batches_drawn: u64,
    /// The loss of every completed step, so the resumed run's report shows the whole curve.
    pub losses: Vec<f64>,
}

pub const FORMAT: u32 = 1;

/// Why a checkpoint could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint `{path}`: {what}")]
    Io { path: PathBuf, what: String },
    #[error("checkpoint `{path}` does not fit this run: {what}")]
    Mismatch { path: PathBuf, what: String },
}

fn io(path: &Path, e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Io { path: path.to_path_buf(), what: e.to_string() }
}

/// The directory name of the checkpoint taken after `step` completed steps.
pub fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:06}"))
}

fn tmp_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!(".step-{step:06}.tmp"))
}

/// Prepares the temporary directory of a save (rank 0 only, before any rank writes): a stale
/// one from an interrupted save is removed first.
pub fn begin_save(dir: &Path, step: u64) -> Result<PathBuf, CheckpointError> {
    let tmp = tmp_dir(dir, step);
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    Ok(tmp)
}

/// Writes one rank's tensors (parameters and optimizer moments) into the save in progress.
pub fn write_rank_file(
    dir: &Path,
    step: u64,
    rank: u32,
    params: &[(String, Tensor)],
    opt: &AdamW,
) -> Result<(), CheckpointError> {
    let tmp = tmp_dir(dir, step);
    let path = tmp.join(format!("rank{rank}.ot"));
    let mut named: Vec<(String, Tensor)> =
        params.iter().map(|(n, t)| (format!("param/{n}"), t.detach())).collect();
    for (i, (m, v)) in opt.exp_avg.iter().zip(&opt.exp_avg_sq).enumerate() {
        named.push((format!("exp_avg/{i}"), m.shallow_clone()));
        named.push((format!("exp_avg_sq/{i}"), v.shallow_clone()));
    }
    named.push(("optimizer_step".into(), Tensor::from(opt.step)));
    Tensor::save_multi(&named, &path).map_err(|e| io(&path, e))?;
    fs::File::open(&path).and_then(|f| f.sync_all()).map_err(|e| io(&path, e))
}

/// Writes `meta.json` and renames the save into place (rank 0, after every rank wrote its file).
pub fn commit(dir: &Path, meta: &Meta) -> Result<PathBuf, CheckpointError> {
    let tmp = tmp_dir(dir, meta.step);
    for f in &meta.files {
        if !tmp.join(f).is_file() {
            return Err(io(&tmp.join(f), "missing: a rank did not write its file"));
        }
    }
    let meta_path = tmp.join("meta.json");
    let json = serde_json::to_string_pretty(meta).expect("meta always serialises");
    fs::write(&meta_path, json + "\n").map_err(|e| io(&meta_path, e))?;
    fs::File::open(&meta_path).and_then(|f| f.sync_all()).map_err(|e| io(&meta_path, e))?;
    let done = step_dir(dir, meta.step);
    if done.exists() {
        fs::remove_dir_all(&done).map_err(|e| io(&done, e))?;
    }
    fs::rename(&tmp, &done).map_err(|e| io(&done, e))?;
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io(dir, e))?;
    Ok(done)
}

/// The checkpoint `path` names: itself when it holds a `meta.json`, else the latest complete
/// `step-N` inside it.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    if path.join("meta.json").is_file() {
        return Ok(path.to_path_buf());
    }
    let entries = fs::read_dir(path).map_err(|e| io(path, e))?;
    let latest = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name().to_string_lossy().starts_with("step-") && e.path().join("meta.json").is_file()
        })
        .map(|e| e.path())
        .max();
    latest.ok_or_else(|| {
        io(path, "holds no complete checkpoint (a `step-N` directory with a `meta.json`); incomplete saves are `.step-N.tmp`")
    })
}

/// Reads `meta.json` and checks that the checkpoint was saved by a run of the same shape.
pub fn read_meta(path: &Path, mode: &str, world_size: u32) -> Result<Meta, CheckpointError> {
    let meta_path = path.join("meta.json");
    let text = fs::read_to_string(&meta_path).map_err(|e| io(&meta_path, e))?;
    let meta: Meta = serde_json::from_str(&text).map_err(|e| io(&meta_path, e))?;
    if meta.format != FORMAT {
        return Err(CheckpointError::Mismatch {
            path: path.into(),
            what: format!("format {} (this ups-doctor reads format {FORMAT})", meta.format),
        });
    }
    if meta.mode != mode || meta.world_size != world_size {
        return Err(CheckpointError::Mismatch {
            path: path.into(),
            what: format!(
                "saved by `mode: {}` with `world_size: {}`, but this run is `mode: {mode}` with `world_size: {world_size}`",
                meta.mode, meta.world_size
            ),
        });
    }
    Ok(meta)
}

/// One rank's tensors from a checkpoint: parameters by name, then the optimizer state (moments
/// in place, step count), checked against what this run built.
pub fn read_rank_file(
    path: &Path,
    rank: u32,
    params: &[(String, Tensor)],
    opt: &mut AdamW,
) -> Result<(), CheckpointError> {
    let file = path.join(format!("rank{rank}.ot"));
    let loaded = Tensor::load_multi(&file).map_err(|e| io(&file, e))?;
    let mut by_name: std::collections::HashMap<String, Tensor> = loaded.into_iter().collect();
    let mut take = |name: &str, like: &Tensor| -> Result<Tensor, CheckpointError> {
        let t = by_name.remove(name).ok_or_else(|| CheckpointError::Mismatch {
            path: file.clone(),
            what: format!("`{name}` is missing (was the model changed since it was saved?)"),
        })?;
        if t.size() != like.size() {
            return Err(CheckpointError::Mismatch {
                path: file.clone(),
                what: format!("`{name}` has shape {:?}, this run's has {:?}", t.size(), like.size()),
            });
        }
        Ok(t)
    };
    let mut staged = Vec::new();
    for (name, p) in params {
        staged.push((p.shallow_clone(), take(&format!("param/{name}"), p)?));
    }
    for i in 0..opt.exp_avg.len() {
        staged.push((opt.exp_avg[i].shallow_clone(), take(&format!("exp_avg/{i}"), &opt.exp_avg[i])?));
        staged
            .push((opt.exp_avg_sq[i].shallow_clone(), take(&format!("exp_avg_sq/{i}"), &opt.exp_avg_sq[i])?));
    }
    let step = take("optimizer_step", &Tensor::from(0i64))?;
    if let Some(extra) = by_name.keys().next() {
        return Err(CheckpointError::Mismatch {
            path: file.clone(),
            what: format!("`{extra}` is not part of this run's model"),
        });
    }
    tch::no_grad(|| {
        for (mut dst, src) in staged {
            dst.copy_(&src);
        }
    });
    opt.step = i64::try_from(step).map_err(|e| io(&file, e))?;
    Ok(())
}
