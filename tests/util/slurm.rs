//! The one-host Slurm cluster of scripts/slurm-one-host.sh, for tests that go through real `srun`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use super::repo;

/// The folder of the one-host cluster, as scripts/slurm-one-host.sh names it.
pub fn cluster_dir() -> PathBuf {
    std::env::var_os("UPS_DOCTOR_SLURM_DIR")
        .map_or_else(|| PathBuf::from("/tmp/ups-doctor-slurm"), PathBuf::from)
}

/// `SLURM_CONF` of the one-host cluster when its node answers; `None` (after saying why) when
/// there is none and none was promised.
pub fn cluster(test: &str) -> Option<OsString> {
    let dir = cluster_dir();
    let up = Command::new(repo().join("scripts/slurm-one-host.sh"))
        .arg("status")
        .env("UPS_DOCTOR_SLURM_DIR", &dir)
        .status()
        .is_ok_and(|s| s.success());
    if up {
        return Some(dir.join("slurm.conf").into_os_string());
    }
    assert!(
        std::env::var_os("UPS_DOCTOR_SLURM").is_none_or(|v| v != "1"),
        "./x test started the one-host Slurm cluster in {}, but its node does not answer: see its log/ folder",
        dir.display()
    );
    eprintln!(
        "{test}: skipped: no one-host Slurm cluster answers in {} (`./x test` starts one when it runs as \
         root and apt works; by hand: scripts/slurm-one-host.sh start)",
        dir.display()
    );
    None
}
