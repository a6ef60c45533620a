//! Gives the `ups-doctor` binary an rpath to libtorch, so it runs without `LD_LIBRARY_PATH`
//! (torch-sys links libtorch but sets no rpath), records the libtorch version for reports, and
//! compiles the C++ shims over libtorch's `c10d::TCPStore` (`csrc/store_shim.cpp`, used by
//! `trainer::dist::store`), its autocast state (`csrc/autocast_shim.cpp`, `trainer::amp`) and its
//! multi-tensor optimizer ops (`csrc/optim_shim.cpp`, `trainer::optim`) against the same
//! libtorch's headers.

use std::env;
use std::fs;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_INCLUDE");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/store_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/autocast_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/optim_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/shim_error.h");
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
    compile_store_shim(Path::new(&lib));
}

/// Builds `csrc/store_shim.cpp`, `csrc/autocast_shim.cpp` and `csrc/optim_shim.cpp` into a static
/// library linked into the crate. Headers come from
/// `LIBTORCH_INCLUDE/include` when set (torch-sys honours the same variable), else from the
/// `include` folder next to libtorch's `lib`. libtorch itself is already linked by torch-sys.
fn compile_store_shim(lib: &Path) {
    let include = match env::var_os("LIBTORCH_INCLUDE") {
        Some(dir) => Path::new(&dir).join("include"),
        None => lib.parent().unwrap_or(lib).join("include"),
    };
    let api_include = include.join("torch/csrc/api/include");
    cc::Build::new()
        .cpp(true)
        .file("csrc/store_shim.cpp")
        .file("csrc/autocast_shim.cpp")
        .file("csrc/optim_shim.cpp")
        // -isystem, not -I: libtorch's headers are not ours to warn about.
        .flag("-isystem")
        .flag(include.to_string_lossy().as_ref())
        .flag("-isystem")
        .flag(api_include.to_string_lossy().as_ref())
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .compile("ups_store_shim");
}
