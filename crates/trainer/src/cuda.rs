//! CUDA at run time: one binary serves CPU and GPU machines.
//!
//! rustc links with `--as-needed`, which drops `libtorch_cuda.so` because no symbol of it is
//! referenced, so libtorch's CUDA hooks are never registered and `tch::Cuda::is_available()` is
//! false even on a GPU machine. [`probe`] loads `libtorch_cuda.so` with `RTLD_NOW | RTLD_GLOBAL`
//! from the directory libtorch was really loaded from (its static initialisers register the
//! hooks), then asks libtorch how many GPUs it sees. When CUDA cannot be used it says exactly why:
//! no `libtorch_cuda.so` (a CPU-only libtorch), a `libtorch_cuda.so` whose own CUDA libraries are
//! missing (the CUDA wheel installed without its `nvidia-*` dependencies, as on CPU machines
//! here), no NVIDIA driver, or a driver that reports no GPU.
//!
//! This module also finds libtorch's `lib` directory at run time ([`torch_lib_dirs`]), which the
//! NCCL loader needs: the binary's rpath names the directory it was built against, but on GPU
//! machines it runs against another libtorch through `LD_LIBRARY_PATH`.

use std::ffi::{OsStr, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
use procfs::process::{MMapPath, MemoryMaps, Process};

/// What this process can do with CUDA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaProbe {
    /// The `libtorch_cuda.so` that was loaded, when one was.
    pub libtorch_cuda: Option<PathBuf>,
    /// GPUs libtorch sees (0 when CUDA is unusable).
    pub device_count: usize,
    /// Why CUDA is unusable, in a sentence; `None` when `device_count > 0`.
    pub why_not: Option<String>,
}

impl CudaProbe {
    /// Whether at least one GPU can be used.
    pub fn available(&self) -> bool {
        self.device_count > 0
    }
}

/// Loads libtorch's CUDA part once per process and reports what CUDA offers. Later calls return
/// the first answer.
pub fn probe() -> &'static CudaProbe {
    static PROBE: OnceLock<CudaProbe> = OnceLock::new();
    PROBE.get_or_init(|| probe_in(&torch_lib_dirs()))
}

/// The CUDA runtime libtorch loaded (`libcudart`, which even its CPU library links), as `13.0`;
/// `None` for a libtorch without one. Needs no driver.
pub fn runtime_version() -> Option<String> {
    // The libraries already loaded (dlopen of no file): nothing is opened or initialised.
    let this = Library::this();
    // SAFETY: `cudaError_t cudaRuntimeGetVersion(int*)` from cuda_runtime_api.h is the symbol's
    // C signature.
    let get =
        unsafe { this.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"cudaRuntimeGetVersion") }.ok()?;
    let mut v: c_int = 0;
    // SAFETY: a valid out-pointer; the call needs no driver.
    (unsafe { get(&mut v) } == 0 && v > 0).then(|| format!("{}.{}", v / 1000, v % 1000 / 10))
}

fn probe_in(dirs: &[PathBuf]) -> CudaProbe {
    let unavailable =
        |libtorch_cuda, why: String| CudaProbe { libtorch_cuda, device_count: 0, why_not: Some(why) };
    let Some(path) = dirs.iter().map(|d| d.join("libtorch_cuda.so")).find(|p| p.is_file()) else {
        return unavailable(
            None,
            format!("libtorch was built without CUDA: there is no libtorch_cuda.so in {}", show_dirs(dirs)),
        );
    };
    if let Err(e) = dlopen(&path, RTLD_NOW | RTLD_GLOBAL) {
        return unavailable(
            None,
            format!(
                "{} is present but cannot be loaded: {e}; the CUDA libraries it links against are not \
                 installed next to it (as when the CUDA wheel of torch is installed without its nvidia-* \
                 dependencies on a CPU machine)",
                path.display()
            ),
        );
    }
    let count = usize::try_from(tch::Cuda::device_count()).unwrap_or(0);
    if count > 0 {
        return CudaProbe { libtorch_cuda: Some(path), device_count: count, why_not: None };
    }
    // SAFETY: only tries to dlopen libcuda under cudarc's candidate names; no CUDA call is made.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    let why = if !driver {
        "libtorch_cuda.so is loaded, but there is no NVIDIA driver (libcuda.so.1 cannot be loaded), so \
         CUDA sees no GPU"
            .to_string()
    } else {
        match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(v) => format!(
                "libtorch_cuda.so and the NVIDIA driver are loaded, but CUDA sees no GPU \
                 (CUDA_VISIBLE_DEVICES=`{v}`)"
            ),
            Err(_) => "libtorch_cuda.so and the NVIDIA driver are loaded, but CUDA sees no GPU".to_string(),
        }
    };
    unavailable(Some(path), why)
}

fn show_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "no libtorch directory (none found)".to_string();
    }
    dirs.iter().map(|d| format!("`{}`", d.display())).collect::<Vec<_>>().join(", ")
}

/// libtorch's `lib` directories, best first: the one `libtorch_cpu.so` was actually loaded from
/// in this process (read from `/proc/self/maps`), then the one the binary was built against.
pub(crate) fn torch_lib_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(maps) = Process::myself().and_then(|me| me.maps())
        && let Some(dir) = loaded_library_dir(&maps, "libtorch_cpu.so")
    {
        dirs.push(dir);
    }
    let built = PathBuf::from(env!("UPS_DOCTOR_LIBTORCH_LIB"));
    if !dirs.contains(&built) {
        dirs.push(built);
    }
    dirs
}

/// The directory of the first mapping of a file named `file_name` in a `/proc/<pid>/maps`.
pub(crate) fn loaded_library_dir(maps: &MemoryMaps, file_name: &str) -> Option<PathBuf> {
    maps.iter().find_map(|m| match &m.pathname {
        MMapPath::Path(path) if path.is_absolute() && path.file_name() == Some(OsStr::new(file_name)) => {
            path.parent().map(Path::to_path_buf)
        }
        _ => None,
    })
}

/// `dlopen` with `flags` (libloading's `RTLD_*` values); the handle is kept for the life of the
/// process (never closed). The error is `dlerror()`'s text.
pub(crate) fn dlopen(path: &Path, flags: c_int) -> Result<*mut c_void, String> {
    dlopen_name(path.as_os_str(), flags)
}

/// `dlopen` of a bare name (searched for as the dynamic linker does) or a path.
pub(crate) fn dlopen_name(name: &OsStr, flags: c_int) -> Result<*mut c_void, String> {
    // SAFETY: loading runs the library's initialisers, which is the point (libtorch_cuda's
    // register CUDA with libtorch; NCCL's and the others' have no preconditions).
    match unsafe { Library::open(Some(name), flags) } {
        Ok(lib) => Ok(lib.into_raw()),
        // libloading's own text is only "dlopen failed"; dlerror's is its source.
        Err(e) => Err(std::error::Error::source(&e).map_or_else(|| e.to_string(), |why| why.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_library_dir_reads_the_path_column_of_proc_maps() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 r-xp 00001000 08:01 456 /opt/venv/site-packages/torch/lib/libtorch_cpu.so
7f0000004000-7f0000005000 rw-p 00000000 00:00 0 
7f0000006000-7f0000007000 r--p 00000000 08:01 789 /tmp/dir with space/lib/libtorch_cpu.so
";
        let parse = |text: &str| {
            use procfs::FromBufRead;
            MemoryMaps::from_buf_read(text.as_bytes()).unwrap()
        };
        assert_eq!(
            loaded_library_dir(&parse(maps), "libtorch_cpu.so"),
            Some(PathBuf::from("/opt/venv/site-packages/torch/lib"))
        );
        assert_eq!(
            loaded_library_dir(
                &parse(&maps.lines().skip(2).collect::<Vec<_>>().join("\n")),
                "libtorch_cpu.so"
            ),
            Some(PathBuf::from("/tmp/dir with space/lib"))
        );
        assert_eq!(loaded_library_dir(&parse(maps), "libtorch_cuda.so"), None);
    }

    #[test]
    fn this_process_finds_the_libtorch_it_really_loaded() {
        // The test binary links libtorch, so its directory is in our own maps.
        let dirs = torch_lib_dirs();
        assert!(dirs[0].join("libtorch_cpu.so").is_file(), "{dirs:?}");
    }

    #[test]
    fn a_libtorch_without_cuda_is_reported_as_such() {
        let empty = tempfile::tempdir().unwrap();
        let p = probe_in(&[empty.path().to_path_buf()]);
        assert!(!p.available() && p.libtorch_cuda.is_none());
        let why = p.why_not.unwrap();
        assert!(
            why.starts_with("libtorch was built without CUDA: there is no libtorch_cuda.so in `"),
            "{why}"
        );
        assert!(why.contains(&empty.path().display().to_string()), "{why}");
    }

    #[test]
    fn libtorchs_cuda_runtime_is_known_without_a_driver() {
        // PyPI's torch 2.11 is the CUDA 13.0 build; its CPU library links libcudart.so.13.
        let v = runtime_version().expect("libtorch_cpu links libcudart");
        assert!(v.starts_with("13."), "{v}");
    }

    #[test]
    fn the_probe_says_why_cuda_is_unusable_or_counts_the_gpus() {
        let p = probe();
        match &p.why_not {
            // A GPU machine.
            None => assert!(p.available() && tch::Cuda::is_available(), "{p:?}"),
            Some(why) => {
                assert_eq!(p.device_count, 0, "{p:?}");
                // Every explanation names the library it is about.
                assert!(why.contains("libtorch_cuda.so"), "{why}");
                // The CPU machines of this project have the CUDA wheel without its nvidia-* libraries:
                // dlopen must fail naming the missing library, not pretend there is no CUDA build.
                let present = torch_lib_dirs()[0].join("libtorch_cuda.so").is_file();
                if present && p.libtorch_cuda.is_none() {
                    assert!(why.contains("is present but cannot be loaded: lib"), "{why}");
                    assert!(why.contains("cannot open shared object file"), "{why}");
                }
            }
        }
    }
}
