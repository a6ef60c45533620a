//! Gives the `ups-doctor` binary an rpath to libtorch, so it runs without `LD_LIBRARY_PATH`
//! (torch-sys links libtorch but sets no rpath), and records the libtorch version for reports.

use std::env;
use std::fs;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let lib = env::var("DEP_TCH_LIBTORCH_LIB")
        .expect("torch-sys did not export DEP_TCH_LIBTORCH_LIB: is torch-sys a direct dependency?");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // pip's torch keeps its version in torch/version.py, one folder above torch/lib.
    let version = Path::new(&lib)
        .parent()
        .map(|torch| torch.join("version.py"))
        .and_then(|p| fs::read_to_string(p).ok())
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("__version__ = "))
                .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=UPS_DOCTOR_LIBTORCH_VERSION={version}");
    println!("cargo:rustc-env=UPS_DOCTOR_LIBTORCH_LIB={lib}");
}
