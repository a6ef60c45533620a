//! Files written whole: to a temporary file beside the target, synced, then renamed over it, so
//! a crash or a full disk never leaves a torn file where a reader expects a complete one.

use std::fs;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to a temporary file next to `path`, syncs it and renames it over `path`; the
/// temporary file is removed when anything fails.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
