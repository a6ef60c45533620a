//! The `nccl` backend: collectives on CUDA tensors through NCCL, called on the tensors' device
//! memory (`Tensor::data_ptr`), as PyTorch's `ProcessGroupNCCL` does.
//!
//! Theory of operation. Rank 0 asks NCCL for a unique id and publishes it in the [`Store`]; every
//! rank reads it and joins the communicator on its own GPU (`LOCAL_RANK`'s). The communicator is
//! created *non-blocking* (`ncclConfig_t.blocking = 0`) so that no NCCL call can block this
//! thread for ever: every call returns at once, and this module polls `ncclCommGetAsyncError`
//! (and, for collectives, a CUDA event recorded after the kernel) until the work is done, an
//! error is reported, or the scenario's timeout passes. On timeout the communicator is aborted
//! (`ncclCommAbort`, which also releases the kernels of this rank) and the error is worded like
//! PyTorch's NCCL watchdog, so users can search for it.
//!
//! Streams. Kernels are queued on the legacy default stream (a null `cudaStream_t`), which is
//! libtorch's default current stream: the collective is ordered after the kernels that produced
//! its input (the backward pass) and before whatever reads its output, with no extra
//! synchronisation. The trainer never switches libtorch's current stream; if it ever does, the
//! stream handed to NCCL must follow it. Every operation then waits for its kernel (an event on
//! the same stream), so the [`Collective`] trait's blocking semantics hold.
//!
//! Loading. The NCCL that PyPI's torch uses ships only as `libnccl.so.2` in
//! `site-packages/nvidia/nccl/lib`, a name cudarc's loader never tries (its candidates are
//! `libnccl.so`, `libnccl.so.13`, `.12`, …, `.1`; it has no override and panics when none loads).
//! So cudarc's `nccl::sys` *functions* are never called here: [`NcclLib`] opens the library by
//! full path and resolves the few entry points it needs itself, typed with cudarc's bindgen
//! types for NCCL 2.28 (the version torch 2.11 ships). The NCCL results are read as plain
//! integers, so a code newer than those bindings cannot be undefined behaviour. CUDA contexts
//! and events go through cudarc's driver API (`libcuda.so.1`, which its loader does find); its
//! presence is checked before the first call, because cudarc panics when a library is absent.

use std::ffi::{CStr, CString, OsStr, OsString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, DriverError, result as cu, sys as cusys};
use cudarc::nccl::sys::{ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use tch::{Device, Kind, Tensor};

use super::collective::{Collective, DistError, RawSpan};
use super::store::Store;
use crate::cuda;

/// Environment variable naming the NCCL library to use (a full path), instead of searching.
pub const NCCL_LIB_ENV: &str = "UPS_DOCTOR_NCCL_LIB";
/// The file name pip's `nvidia-nccl-cu13` (and every NCCL 2 install) gives the library.
const SONAME: &str = "libnccl.so.2";
/// Store keys live under this prefix, followed by a generation number (see [`connect_nccl`]).
const KEY_PREFIX: &str = "ups_doctor/nccl";

const NCCL_SUCCESS: u32 = 0;
const NCCL_INVALID_USAGE: u32 = 5;
const NCCL_IN_PROGRESS: u32 = 7;
/// `NCCL_CONFIG_UNDEF_INT` of `nccl.h`: "let NCCL choose".
const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `ncclConfig_t.magic` of `nccl.h`.
const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_VERSION(2, 28, 0)`: the `ncclConfig_t` layout of cudarc's `nccl-02028` bindings.
const CONFIG_VERSION: u32 = 22800;

type Stream = cudarc::nccl::sys::cudaStream_t;

/// The NCCL entry points this backend uses, resolved from one loaded `libnccl.so.2`.
pub struct NcclLib {
    /// The file the library was loaded from.
    pub path: PathBuf,
    /// NCCL's version code, e.g. 22809 for 2.28.9.
    pub version: i32,
    get_error_string: unsafe extern "C" fn(u32) -> *const c_char,
    get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> u32,
    comm_init_rank_config:
        unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int, *mut ncclConfig_t) -> u32,
    comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut u32) -> u32,
    comm_finalize: unsafe extern "C" fn(ncclComm_t) -> u32,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> u32,
    comm_abort: unsafe extern "C" fn(ncclComm_t) -> u32,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        Stream,
    ) -> u32,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclComm_t, Stream) -> u32,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        Stream,
    ) -> u32,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        Stream,
    ) -> u32,
}

impl std::fmt::Debug for NcclLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclLib").field("path", &self.path).field("version", &self.version_text()).finish()
    }
}

/// Where to look for NCCL, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// A file, by full path (the override, or next to libtorch in pip's layout).
    File(PathBuf),
    /// The `libnccl.so.2` already in this process: `libtorch_cuda.so` links it, so after the
    /// CUDA probe it is exactly the NCCL libtorch itself uses.
    AlreadyLoaded,
    /// `libnccl.so.2` through the dynamic linker's search (`LD_LIBRARY_PATH`, `ld.so.cache`).
    SearchPath,
}

/// The candidates: only the override when `UPS_DOCTOR_NCCL_LIB` is set (an explicit choice is
/// never second-guessed), else the loaded library, pip's layout next to each libtorch `lib`
/// directory (`<site-packages>/torch/lib` → `<site-packages>/nvidia/nccl/lib/libnccl.so.2`), and
/// the linker's search path.
pub(crate) fn candidates(override_path: Option<OsString>, torch_lib_dirs: &[PathBuf]) -> Vec<Candidate> {
    if let Some(path) = override_path.filter(|p| !p.is_empty()) {
        return vec![Candidate::File(PathBuf::from(path))];
    }
    let mut list = vec![Candidate::AlreadyLoaded];
    for dir in torch_lib_dirs {
        if let Some(site) = dir.parent().and_then(Path::parent) {
            let file = Candidate::File(site.join("nvidia/nccl/lib").join(SONAME));
            if !list.contains(&file) {
                list.push(file);
            }
        }
    }
    list.push(Candidate::SearchPath);
    list
}

impl NcclLib {
    /// The process's NCCL, loaded on first use from [`candidates`] (the environment and the
    /// libtorch in use). The outcome, success or failure, is kept for the life of the process.
    pub fn get() -> Result<&'static NcclLib, String> {
        static LIB: OnceLock<Result<NcclLib, String>> = OnceLock::new();
        LIB.get_or_init(|| {
            NcclLib::load(&candidates(std::env::var_os(NCCL_LIB_ENV), &cuda::torch_lib_dirs()))
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// Tries the candidates in order; the error lists every one with why it failed.
    pub(crate) fn load(candidates: &[Candidate]) -> Result<NcclLib, String> {
        let mut tried = Vec::new();
        for candidate in candidates {
            let opened = match candidate {
                Candidate::File(path) if !path.is_file() => {
                    Err(format!("`{}` (no such file)", path.display()))
                }
                Candidate::File(path) => {
                    cuda::dlopen(path, libc::RTLD_NOW).map_err(|e| format!("`{}` ({e})", path.display()))
                }
                Candidate::AlreadyLoaded => {
                    cuda::dlopen_name(OsStr::new(SONAME), libc::RTLD_NOW | libc::RTLD_NOLOAD)
                        .map_err(|_| format!("`{SONAME}` already loaded by libtorch_cuda.so (it is not)"))
                }
                Candidate::SearchPath => cuda::dlopen_name(OsStr::new(SONAME), libc::RTLD_NOW)
                    .map_err(|e| format!("`{SONAME}` on the library search path ({e})")),
            };
            let origin = match candidate {
                Candidate::File(path) => path.display().to_string(),
                _ => SONAME.to_string(),
            };
            match opened {
                // SAFETY: the handle is live for the life of the process (never closed).
                Ok(handle) => match unsafe { NcclLib::resolve(handle, &origin) } {
                    Ok(lib) => return Ok(lib),
                    Err(e) => tried.push(e),
                },
                Err(e) => tried.push(e),
            }
        }
        Err(format!("no usable NCCL library; tried {}", tried.join(", ")))
    }

    /// Resolves every entry point from `handle`, or says which one is missing. `origin` names
    /// the library in messages until `dladdr` tells its real file.
    unsafe fn resolve(handle: *mut c_void, origin: &str) -> Result<NcclLib, String> {
        const NAMES: [&str; 13] = [
            "ncclGetVersion",
            "ncclGetErrorString",
            "ncclGetLastError",
            "ncclGetUniqueId",
            "ncclCommInitRankConfig",
            "ncclCommGetAsyncError",
            "ncclCommFinalize",
            "ncclCommDestroy",
            "ncclCommAbort",
            "ncclAllReduce",
            "ncclAllGather",
            "ncclReduceScatter",
            "ncclBroadcast",
        ];
        let ptrs: Vec<*mut c_void> = NAMES
            .iter()
            // SAFETY: `handle` is a live dlopen handle; the name is NUL-terminated.
            .map(|name| unsafe { libc::dlsym(handle, c_name(name).as_ptr()) })
            .collect();
        let path = (!ptrs[0].is_null()).then(|| library_file(ptrs[0])).flatten();
        let shown = path.as_ref().map_or_else(|| origin.to_string(), |p| p.display().to_string());
        let missing: Vec<&str> =
            NAMES.iter().zip(&ptrs).filter(|(_, p)| p.is_null()).map(|(name, _)| *name).collect();
        if !missing.is_empty() {
            return Err(format!("`{shown}` (not NCCL 2.28 or later: it lacks {})", missing.join(", ")));
        }
        // SAFETY: each pointer is the NCCL function of that name, whose C signature (nccl.h of
        // NCCL 2.28) the target type spells out.
        let (get_version, lib) = unsafe {
            let get_version: unsafe extern "C" fn(*mut c_int) -> u32 = fn_ptr(ptrs[0]);
            let lib = NcclLib {
                path: path.unwrap_or_else(|| PathBuf::from(origin)),
                version: 0,
                get_error_string: fn_ptr(ptrs[1]),
                get_last_error: fn_ptr(ptrs[2]),
                get_unique_id: fn_ptr(ptrs[3]),
                comm_init_rank_config: fn_ptr(ptrs[4]),
                comm_get_async_error: fn_ptr(ptrs[5]),
                comm_finalize: fn_ptr(ptrs[6]),
                comm_destroy: fn_ptr(ptrs[7]),
                comm_abort: fn_ptr(ptrs[8]),
                all_reduce: fn_ptr(ptrs[9]),
                all_gather: fn_ptr(ptrs[10]),
                reduce_scatter: fn_ptr(ptrs[11]),
                broadcast: fn_ptr(ptrs[12]),
            };
            (get_version, lib)
        };
        let mut version: c_int = 0;
        // SAFETY: ncclGetVersion writes one int.
        let rc = unsafe { get_version(&mut version) };
        if rc != NCCL_SUCCESS || version < CONFIG_VERSION as c_int {
            return Err(format!(
                "`{shown}` (NCCL version code {version}; this backend needs NCCL 2.28 or later)"
            ));
        }
        Ok(NcclLib { version, ..lib })
    }

    /// `2.28.9` for version code 22809.
    pub fn version_text(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    }

    /// `ncclGetErrorString`'s text for a result code.
    pub fn error_string(&self, code: u32) -> String {
        // SAFETY: returns a pointer to a static string for any code.
        let text = unsafe { (self.get_error_string)(code) };
        c_text(text).unwrap_or_else(|| format!("unknown NCCL result {code}"))
    }

    /// NCCL's last warning (what `NCCL_DEBUG=WARN` would print), when there is one.
    fn last_error(&self, comm: ncclComm_t) -> Option<String> {
        // SAFETY: NCCL ignores `comm` (the last error is process-wide) and returns a static buffer.
        c_text(unsafe { (self.get_last_error)(comm) }).filter(|t| !t.trim().is_empty())
    }

    /// A fresh unique id (rank 0's part of the rendezvous). Needs no GPU.
    pub fn unique_id(&self) -> Result<ncclUniqueId, (u32, String)> {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: writes one ncclUniqueId.
        let rc = unsafe { (self.get_unique_id)(&mut id) };
        if rc != NCCL_SUCCESS {
            let last = self.last_error(std::ptr::null_mut()).map(|t| format!(": {t}")).unwrap_or_default();
            return Err((rc, format!("ncclGetUniqueId failed: {}{last}", self.error_string(rc))));
        }
        Ok(id)
    }
}

/// Reinterprets a symbol's address as the function pointer type `F`.
///
/// # Safety
/// `F` must be a function pointer type matching the symbol's C signature.
unsafe fn fn_ptr<F: Copy>(symbol: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>(), "F is a function pointer");
    // SAFETY: same size (checked), and the caller promises the type.
    unsafe { std::mem::transmute_copy(&symbol) }
}

fn c_name(name: &str) -> CString {
    CString::new(name).expect("library and symbol names contain no NUL")
}

fn c_text(ptr: *const c_char) -> Option<String> {
    // SAFETY: NCCL returns NUL-terminated strings or null.
    (!ptr.is_null()).then(|| unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
}

/// The file a loaded symbol comes from (`dladdr`).
fn library_file(symbol: *mut c_void) -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-parameter; dladdr only reads the loader's tables.
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    c_text(info.dli_fname).map(PathBuf::from)
}

/// An explanation of NCCL's last error when it is one users run into, else `None`.
pub(crate) fn explain(last_error: &str) -> Option<&'static str> {
    if last_error.contains("Duplicate GPU detected") {
        return Some(
            "two ranks were given the same GPU: world_size exceeds the GPUs on this machine, or LOCAL_RANK \
             is wrong (NCCL needs one GPU per rank)",
        );
    }
    None
}

/// PyTorch's description of each NCCL result (`getNcclErrorDetailStr`).
fn describe(code: u32) -> &'static str {
    match code {
        1 => "ncclUnhandledCudaError: Call to CUDA function failed.",
        2 => {
            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device \
             error. It can be also caused by unexpected exit of a remote peer."
        }
        3 => "ncclInternalError: Internal check failed.",
        4 => "ncclInvalidArgument: Invalid value for an argument.",
        NCCL_INVALID_USAGE => "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        6 => {
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting \
             prematurely."
        }
        _ => "Unknown NCCL error!",
    }
}

/// The message of a failed NCCL call, laid out like PyTorch's `NCCL error in: …`.
pub(crate) fn nccl_message(
    call: &str,
    rank: usize,
    device: usize,
    text: &str,
    version: &str,
    code: u32,
    last_error: Option<&str>,
) -> String {
    let mut message = format!(
        "NCCL error in {call} on rank {rank} (cuda:{device}): {text}, NCCL version {version}\n{}",
        describe(code)
    );
    if let Some(last) = last_error {
        message.push_str(&format!("\nLast error:\n{}", last.trim_end()));
        if let Some(why) = explain(last) {
            message.push_str(&format!("\nhint: {why}"));
        }
    }
    message
}

/// The NCCL element type of a tensor kind; byte-moving ops use it too, so that counts are
/// elements, as NCCL expects.
fn nccl_type(kind: Kind) -> Option<ncclDataType_t> {
    use ncclDataType_t as T;
    Some(match kind {
        Kind::Float => T::ncclFloat32,
        Kind::Double => T::ncclFloat64,
        Kind::Half => T::ncclFloat16,
        Kind::BFloat16 => T::ncclBfloat16,
        Kind::Int8 => T::ncclInt8,
        Kind::Uint8 | Kind::Bool => T::ncclUint8,
        Kind::Int => T::ncclInt32,
        Kind::Int64 => T::ncclInt64,
        Kind::Float8e4m3fn => T::ncclFloat8e4m3,
        Kind::Float8e5m2 => T::ncclFloat8e5m2,
        _ => return None,
    })
}

/// Connects this rank to the others as an `nccl` process group on GPU `device` (the rank's
/// `LOCAL_RANK`).
///
/// Rank 0 creates NCCL's unique id and sets it in `store`; the others read it (waiting up to the
/// store's timeout). `timeout` bounds joining the communicator and every later collective.
/// Ranks calling this repeatedly on one store get a fresh key each time, as long as every rank
/// makes the same calls in the same order.
pub fn connect_nccl(
    store: &Store,
    rank: usize,
    world_size: usize,
    device: usize,
    timeout: Duration,
) -> Result<Box<dyn Collective>, DistError> {
    if world_size == 0 || rank >= world_size {
        return Err(DistError::InvalidArgument {
            op: "connect_nccl",
            message: format!("rank {rank} is not in a world of size {world_size}"),
        });
    }
    let unavailable =
        |message: String, hint: &str| DistError::Unavailable { rank, message, hint: hint.into() };
    let lib = NcclLib::get().map_err(|e| {
        unavailable(
            e,
            &format!(
                "install NCCL next to torch (`pip install nvidia-nccl-cu13`), or set {NCCL_LIB_ENV} to the \
                 full path of libnccl.so.2"
            ),
        )
    })?;
    // SAFETY: only tries to dlopen libcuda under cudarc's names; no CUDA call is made.
    if !unsafe { cusys::is_culib_present() } {
        return Err(unavailable(
            "there is no NVIDIA driver (libcuda.so.1 cannot be loaded)".into(),
            "run NCCL ranks on a machine with NVIDIA GPUs, or use `backend: tcp` for CPU ranks",
        ));
    }
    let ctx = open_device(device).map_err(|(message, hint)| unavailable(message, &hint))?;

    let joined = store.add(&format!("{KEY_PREFIX}/joined"), 1)?;
    let generation = u64::try_from((joined - 1).max(0)).unwrap_or(0) / world_size as u64;
    let key = format!("{KEY_PREFIX}/{generation}/unique_id");
    let id = if rank == 0 {
        let id = lib.unique_id().map_err(|(code, message)| DistError::Nccl { rank, code, message })?;
        store.set(&key, &id.internal.map(|b| b as u8))?;
        id
    } else {
        let raw = store.get(&key)?;
        let bytes: [u8; 128] = raw.as_slice().try_into().map_err(|_| {
            DistError::Rendezvous(format!(
                "rank 0 published a {}-byte NCCL unique id under `{key}`, expected 128 bytes",
                raw.len()
            ))
        })?;
        ncclUniqueId { internal: bytes.map(|b| b as c_char) }
    };

    let mut config = default_config();
    config.blocking = 0;
    let mut comm: ncclComm_t = std::ptr::null_mut();
    let started = Instant::now();
    // SAFETY: out-pointer and config are valid for the call; the id came from ncclGetUniqueId.
    let rc = unsafe {
        (lib.comm_init_rank_config)(&mut comm, world_size as c_int, id, rank as c_int, &mut config)
    };
    let mut group = NcclCollective {
        lib,
        comm: (!comm.is_null()).then_some(comm),
        ctx,
        event: None,
        rank,
        world_size,
        device,
        timeout,
        seq: 0,
        broken: None,
    };
    let call = "ncclCommInitRankConfig";
    match group.settle(call, rc, started) {
        Ok(()) => {}
        Err(Waited::Failed(e)) => return Err(group.fail(e)),
        Err(Waited::TimedOut) => {
            let e = DistError::Rendezvous(format!(
                "rank {rank} waited {}ms for the other ranks of {world_size} to join the NCCL communicator \
                 on cuda:{device}; is every rank running, and did each get the same unique id from the \
                 store at {}?",
                timeout.as_millis(),
                store.addr()
            ));
            return Err(group.fail(e));
        }
    }
    group.event = Some(
        group.ctx.new_event(None).map_err(|e| group.fail(cuda_error(rank, device, "create an event", e)))?,
    );
    Ok(Box::new(group))
}

/// `NCCL_CONFIG_INITIALIZER` of `nccl.h`: every field "undefined" (NCCL's default).
fn default_config() -> ncclConfig_t {
    ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        version: CONFIG_VERSION,
        blocking: CONFIG_UNDEF_INT,
        cgaClusterSize: CONFIG_UNDEF_INT,
        minCTAs: CONFIG_UNDEF_INT,
        maxCTAs: CONFIG_UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: CONFIG_UNDEF_INT,
        trafficClass: CONFIG_UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: CONFIG_UNDEF_INT,
        CTAPolicy: CONFIG_UNDEF_INT,
        shrinkShare: CONFIG_UNDEF_INT,
        nvlsCTAs: CONFIG_UNDEF_INT,
        nChannelsPerNetPeer: CONFIG_UNDEF_INT,
        nvlinkCentricSched: CONFIG_UNDEF_INT,
    }
}

/// Makes GPU `device`'s primary context (the one libtorch uses) current on this thread, so that
/// NCCL creates the communicator there. The error says which GPU and what to do.
fn open_device(device: usize) -> Result<Arc<CudaContext>, (String, String)> {
    // SAFETY: the driver library is present (checked by the caller).
    let count = cu::init().and_then(|()| cu::device::get_count());
    let count = count.map_err(|e| {
        (format!("the NVIDIA driver cannot be initialised: {}", driver_text(e)), "check `nvidia-smi`".into())
    })?;
    if device >= count as usize {
        return Err((
            format!("this rank's GPU is cuda:{device} (LOCAL_RANK), but CUDA sees {count} GPU(s)"),
            "launch at most one rank per GPU on each machine, and check LOCAL_RANK and CUDA_VISIBLE_DEVICES"
                .into(),
        ));
    }
    CudaContext::new(device)
        .map_err(|e| (format!("cannot use cuda:{device}: {}", driver_text(e)), "check `nvidia-smi`".into()))
}

fn driver_text(e: DriverError) -> String {
    let name =
        e.error_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(text) => format!("{name}: {}", text.to_string_lossy()),
        Err(_) => name,
    }
}

fn cuda_error(rank: usize, device: usize, what: &str, e: DriverError) -> DistError {
    DistError::Nccl {
        rank,
        code: 1,
        message: format!(
            "CUDA error on rank {rank} (cuda:{device}) while trying to {what}: {}",
            driver_text(e)
        ),
    }
}

/// How waiting for NCCL ended, when it did not end well.
enum Waited {
    Failed(DistError),
    TimedOut,
}

/// One rank's NCCL communicator.
struct NcclCollective {
    lib: &'static NcclLib,
    /// `None` once aborted or destroyed.
    comm: Option<ncclComm_t>,
    ctx: Arc<CudaContext>,
    /// Recorded after each collective's kernel; `None` only while connecting.
    event: Option<CudaEvent>,
    rank: usize,
    world_size: usize,
    device: usize,
    timeout: Duration,
    /// Number of collectives started so far.
    seq: u64,
    /// The first failure, after which the communicator is aborted and the group refuses work.
    broken: Option<String>,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls are not concurrent,
// which `&mut self` guarantees; every operation makes the device's context current first.
unsafe impl Send for NcclCollective {}

/// Sleeps between polls: short at first (small collectives finish in microseconds), longer later.
fn backoff(polls: &mut u32) {
    *polls += 1;
    let micros = match *polls {
        0..=100 => return std::hint::spin_loop(),
        101..=1000 => 50,
        _ => 1000,
    };
    std::thread::sleep(Duration::from_micros(micros));
}

impl NcclCollective {
    fn comm(&self) -> ncclComm_t {
        self.comm.unwrap_or(std::ptr::null_mut())
    }

    fn nccl_error(&self, call: &str, code: u32) -> DistError {
        let last = self.lib.last_error(self.comm());
        let message = nccl_message(
            call,
            self.rank,
            self.device,
            &self.lib.error_string(code),
            &self.lib.version_text(),
            code,
            last.as_deref(),
        );
        DistError::Nccl { rank: self.rank, code, message }
    }

    /// Waits for a non-blocking NCCL call that returned `rc` to finish (`ncclCommGetAsyncError`
    /// leaves `ncclInProgress`), bounded by the timeout counted from `started`.
    fn settle(&self, call: &str, rc: u32, started: Instant) -> Result<(), Waited> {
        if rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS {
            return Err(Waited::Failed(self.nccl_error(call, rc)));
        }
        let mut polls = 0;
        loop {
            match self.async_error() {
                NCCL_SUCCESS => return Ok(()),
                NCCL_IN_PROGRESS => {}
                code => return Err(Waited::Failed(self.nccl_error(call, code))),
            }
            if started.elapsed() >= self.timeout {
                return Err(Waited::TimedOut);
            }
            backoff(&mut polls);
        }
    }

    fn async_error(&self) -> u32 {
        let Some(comm) = self.comm else { return NCCL_SUCCESS };
        let mut state = NCCL_SUCCESS;
        // SAFETY: `comm` is live (not aborted); `state` is a valid out-parameter.
        let rc = unsafe { (self.lib.comm_get_async_error)(comm, &mut state) };
        if rc != NCCL_SUCCESS { rc } else { state }
    }

    /// Records the error, aborts the communicator (releasing this rank's kernels and telling
    /// NCCL peers) and returns the error.
    fn fail(&mut self, e: DistError) -> DistError {
        self.broken = Some(e.to_string());
        if let Some(comm) = self.comm.take() {
            // SAFETY: `comm` came from ncclCommInitRankConfig and is released exactly once.
            unsafe { (self.lib.comm_abort)(comm) };
        }
        e
    }

    /// Runs one collective: queues it on the legacy default stream, then waits for its kernel,
    /// watching for NCCL errors, for at most the timeout.
    fn run(
        &mut self,
        op_type: &'static str,
        numel: (usize, usize),
        launch: impl FnOnce(&NcclLib, ncclComm_t, Stream) -> u32,
    ) -> Result<(), DistError> {
        if let Some(first) = &self.broken {
            return Err(DistError::Broken { backend: "nccl", rank: self.rank, first: first.clone() });
        }
        self.seq += 1;
        let call = format!("{op_type} (collective #{})", self.seq);
        let started = Instant::now();
        let (rank, device) = (self.rank, self.device);
        self.ctx.bind_to_thread().map_err(|e| cuda_error(rank, device, "make its GPU current", e))?;
        let rc = launch(self.lib, self.comm(), std::ptr::null_mut());
        let waited = self.settle(&call, rc, started).and_then(|()| self.wait_kernel(&call, started));
        match waited {
            Ok(()) => Ok(()),
            Err(Waited::Failed(e)) => Err(self.fail(e)),
            Err(Waited::TimedOut) => {
                let e = DistError::Watchdog {
                    rank: self.rank,
                    seq: self.seq,
                    op_type,
                    numel_in: numel.0,
                    numel_out: numel.1,
                    timeout_ms: self.timeout.as_millis(),
                    ran_ms: started.elapsed().as_millis(),
                    context: format!(
                        "Rank {} (cuda:{}) of {} waited for the other ranks, which did not join this \
                         collective: one of them is stuck, dead or out of step. The communicator was \
                         aborted.",
                        self.rank, self.device, self.world_size
                    ),
                };
                Err(self.fail(e))
            }
        }
    }

    /// Waits until the kernel queued on the legacy default stream has finished.
    fn wait_kernel(&self, call: &str, started: Instant) -> Result<(), Waited> {
        let event = self.event.as_ref().expect("connected groups have an event").cu_event();
        let (rank, device) = (self.rank, self.device);
        // SAFETY: the event is live; a null stream is the legacy default stream.
        unsafe { cu::event::record(event, std::ptr::null_mut()) }
            .map_err(|e| Waited::Failed(cuda_error(rank, device, "record an event after the kernel", e)))?;
        let mut polls = 0;
        loop {
            // SAFETY: the event is live.
            match unsafe { cu::event::query(event) } {
                Ok(()) => return Ok(()),
                Err(e) if e.0 == cusys::CUresult::CUDA_ERROR_NOT_READY => {}
                Err(e) => {
                    return Err(Waited::Failed(cuda_error(rank, device, &format!("wait for {call}"), e)));
                }
            }
            match self.async_error() {
                NCCL_SUCCESS | NCCL_IN_PROGRESS => {}
                code => return Err(Waited::Failed(self.nccl_error(call, code))),
            }
            if started.elapsed() >= self.timeout {
                return Err(Waited::TimedOut);
            }
            backoff(&mut polls);
        }
    }

    fn span(
        &self,
        op: &'static str,
        name: &str,
        t: &Tensor,
        kind: Option<Kind>,
    ) -> Result<(RawSpan, ncclDataType_t), DistError> {
        let span = RawSpan::on(op, name, t, kind, Device::Cuda(self.device))?;
        let dtype = nccl_type(span.kind).ok_or_else(|| DistError::InvalidArgument {
            op,
            message: format!("`{name}` has element type {:?}, which NCCL cannot move", span.kind),
        })?;
        Ok((span, dtype))
    }

    fn summable(op: &'static str, name: &str, span: &RawSpan) -> Result<(), DistError> {
        if span.kind == Kind::Bool {
            return Err(DistError::InvalidArgument {
                op,
                message: format!("`{name}` is a Bool tensor, which cannot be summed"),
            });
        }
        Ok(())
    }
}

/// Whether two byte ranges overlap.
fn overlaps(a: &RawSpan, b: &RawSpan) -> bool {
    let (a0, b0) = (a.as_mut_ptr() as usize, b.as_mut_ptr() as usize);
    a.len > 0 && b.len > 0 && a0 < b0 + b.len && b0 < a0 + a.len
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<(), DistError> {
        let op = "all_reduce_sum";
        let (span, dtype) = self.span(op, "t", t, None)?;
        Self::summable(op, "t", &span)?;
        let p = span.as_mut_ptr().cast::<c_void>();
        // SAFETY: in place on `numel` elements of device memory that `t` keeps alive.
        self.run("ALLREDUCE", (span.numel, span.numel), |lib, comm, stream| unsafe {
            (lib.all_reduce)(p, p, span.numel, dtype, ncclRedOp_t::ncclSum, comm, stream)
        })
    }

    fn all_gather(&mut self, input: &Tensor, output: &mut Tensor) -> Result<(), DistError> {
        let op = "all_gather";
        let (inp, dtype) = self.span(op, "input", input, None)?;
        let (out, _) = self.span(op, "output", output, Some(inp.kind))?;
        if out.numel != self.world_size * inp.numel {
            return Err(DistError::InvalidArgument {
                op,
                message: format!(
                    "`output` has {} elements, expected world size {} × `input`'s {} = {}",
                    out.numel,
                    self.world_size,
                    inp.numel,
                    self.world_size * inp.numel
                ),
            });
        }
        // NCCL allows the input to be this rank's slot of the output (in place), no other overlap.
        let in_place = inp.as_mut_ptr() as usize == out.as_mut_ptr() as usize + self.rank * inp.len;
        let copy = (overlaps(&inp, &out) && !in_place).then(|| input.copy());
        let src = match &copy {
            Some(c) => self.span(op, "input", c, None)?.0,
            None => inp,
        };
        let (s, d) = (src.as_mut_ptr().cast::<c_void>(), out.as_mut_ptr().cast::<c_void>());
        // SAFETY: device memory of live tensors with the sizes checked above.
        self.run("_ALLGATHER_BASE", (inp.numel, out.numel), |lib, comm, stream| unsafe {
            (lib.all_gather)(s, d, inp.numel, dtype, comm, stream)
        })
    }

    fn reduce_scatter_sum(&mut self, input: &Tensor, output: &mut Tensor) -> Result<(), DistError> {
        let op = "reduce_scatter_sum";
        let (inp, dtype) = self.span(op, "input", input, None)?;
        let (out, _) = self.span(op, "output", output, Some(inp.kind))?;
        Self::summable(op, "input", &inp)?;
        if inp.numel != self.world_size * out.numel {
            return Err(DistError::InvalidArgument {
                op,
                message: format!(
                    "`input` has {} elements, expected world size {} × `output`'s {} = {}",
                    inp.numel,
                    self.world_size,
                    out.numel,
                    self.world_size * out.numel
                ),
            });
        }
        let in_place = out.as_mut_ptr() as usize == inp.as_mut_ptr() as usize + self.rank * out.len;
        let copy = (overlaps(&inp, &out) && !in_place).then(|| input.copy());
        let src = match &copy {
            Some(c) => self.span(op, "input", c, None)?.0,
            None => inp,
        };
        let (s, d) = (src.as_mut_ptr().cast::<c_void>(), out.as_mut_ptr().cast::<c_void>());
        // SAFETY: device memory of live tensors with the sizes checked above.
        self.run("_REDUCE_SCATTER_BASE", (inp.numel, out.numel), |lib, comm, stream| unsafe {
            (lib.reduce_scatter)(s, d, out.numel, dtype, ncclRedOp_t::ncclSum, comm, stream)
        })
    }

    fn broadcast(&mut self, t: &mut Tensor, root: usize) -> Result<(), DistError> {
        let op = "broadcast";
        if root >= self.world_size {
            return Err(DistError::InvalidArgument {
                op,
                message: format!("root {root} is not a rank of a world of size {}", self.world_size),
            });
        }
        let (span, dtype) = self.span(op, "t", t, None)?;
        let p = span.as_mut_ptr().cast::<c_void>();
        // SAFETY: in place on `numel` elements of device memory that `t` keeps alive.
        self.run("BROADCAST", (span.numel, span.numel), |lib, comm, stream| unsafe {
            (lib.broadcast)(p, p, span.numel, dtype, root as c_int, comm, stream)
        })
    }

    fn barrier(&mut self) -> Result<(), DistError> {
        // PyTorch's NCCL barrier is a one-element all-reduce too.
        let mut one = Tensor::ones([1], (Kind::Float, Device::Cuda(self.device)));
        self.all_reduce_sum(&mut one)
    }

    fn all_gather_bytes(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        let dev = Device::Cuda(self.device);
        let n = self.world_size;
        let len = Tensor::from_slice(&[bytes.len() as i64]).to_device(dev);
        let mut lens = Tensor::zeros([n as i64], (Kind::Int64, dev));
        self.all_gather(&len, &mut lens)?;
        let lens: Vec<i64> =
            Vec::try_from(&lens.to_device(Device::Cpu)).map_err(|e| DistError::InvalidArgument {
                op: "all_gather_bytes",
                message: format!("cannot read the gathered lengths: {e}"),
            })?;
        let longest = lens.iter().copied().max().unwrap_or(0).max(0) as usize;
        if longest == 0 {
            return Ok(vec![Vec::new(); n]);
        }
        let mut padded = bytes.to_vec();
        padded.resize(longest, 0);
        let input = Tensor::from_slice(&padded).to_device(dev);
        let mut output = Tensor::zeros([(n * longest) as i64], (Kind::Uint8, dev));
        self.all_gather(&input, &mut output)?;
        let all: Vec<u8> =
            Vec::try_from(&output.to_device(Device::Cpu)).map_err(|e| DistError::InvalidArgument {
                op: "all_gather_bytes",
                message: format!("cannot read the gathered bytes: {e}"),
            })?;
        Ok(all.chunks(longest).zip(&lens).map(|(c, &l)| c[..l.max(0) as usize].to_vec()).collect())
    }
}

impl Drop for NcclCollective {
    fn drop(&mut self) {
        let Some(comm) = self.comm else { return };
        // Finalize flushes outstanding work; a communicator that cannot finish within the
        // timeout is aborted instead, so dropping never hangs.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `comm` is live.
        let rc = unsafe { (self.lib.comm_finalize)(comm) };
        let finished = self.settle("ncclCommFinalize", rc, Instant::now()).is_ok();
        self.comm = None;
        // SAFETY: `comm` is released exactly once.
        unsafe {
            if finished {
                (self.lib.comm_destroy)(comm);
            } else {
                (self.lib.comm_abort)(comm);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;

    /// NCCL's own words when two ranks share a GPU (init.cc, `WARN("Duplicate GPU detected : rank
    /// %d and rank %d both on CUDA device %lx", …)`), and `ncclGetErrorString(ncclInvalidUsage)`.
    const DUPLICATE: &str = "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000";
    const INVALID_USAGE: &str = "invalid usage (run with NCCL_DEBUG=WARN for details)";

    #[test]
    fn duplicate_gpu_is_recognised_in_nccls_own_text_and_explained() {
        let hint = explain(DUPLICATE).expect("recognised");
        assert!(
            hint.starts_with(
                "two ranks were given the same GPU: world_size exceeds the GPUs on this machine, or \
                 LOCAL_RANK is wrong"
            ),
            "{hint}"
        );
        assert_eq!(explain("NET/Socket : Connection closed by remote peer"), None);

        let message = nccl_message(
            "ncclCommInitRankConfig",
            1,
            0,
            INVALID_USAGE,
            "2.28.9",
            NCCL_INVALID_USAGE,
            Some(DUPLICATE),
        );
        assert_eq!(
            message,
            format!(
                "NCCL error in ncclCommInitRankConfig on rank 1 (cuda:0): {INVALID_USAGE}, NCCL version \
                 2.28.9\n\
                 ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n\
                 Last error:\n{DUPLICATE}\nhint: {hint}"
            )
        );
        // Without a last error there is nothing to explain.
        let bare = nccl_message("ncclAllReduce", 0, 0, "unhandled system error", "2.28.9", 2, None);
        assert!(bare.ends_with("unexpected exit of a remote peer.") && !bare.contains("hint"), "{bare}");
    }

    #[test]
    fn a_collective_timeout_reads_like_pytorchs_nccl_watchdog() {
        let e = DistError::Watchdog {
            rank: 0,
            seq: 3,
            op_type: "ALLREDUCE",
            numel_in: 10,
            numel_out: 10,
            timeout_ms: 5000,
            ran_ms: 5001,
            context: "More.".into(),
        };
        assert_eq!(
            e.to_string(),
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, \
             NumelIn=10, NumelOut=10, Timeout(ms)=5000) ran for 5001 milliseconds before timing out. More."
        );
    }

    #[test]
    fn the_override_is_the_only_candidate_and_pip_layout_sits_next_to_torch() {
        let torch = [
            PathBuf::from("/venv/lib/python3.12/site-packages/torch/lib"),
            PathBuf::from("/cache/torch/lib"),
        ];
        assert_eq!(
            candidates(Some("/opt/nccl/libnccl.so.2".into()), &torch),
            [Candidate::File("/opt/nccl/libnccl.so.2".into())]
        );
        assert_eq!(
            candidates(Some("".into()), &torch[1..]),
            candidates(None, &torch[1..]),
            "an empty override is no override"
        );
        assert_eq!(
            candidates(None, &torch),
            [
                Candidate::AlreadyLoaded,
                Candidate::File("/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2".into()),
                Candidate::File("/cache/nvidia/nccl/lib/libnccl.so.2".into()),
                Candidate::SearchPath,
            ]
        );
    }

    #[test]
    fn finding_nothing_names_every_path_tried() {
        let dir = tempfile::tempdir().unwrap();
        let torch_lib = dir.path().join("site-packages/torch/lib");
        let files: Vec<Candidate> =
            candidates(None, &[torch_lib]).into_iter().filter(|c| matches!(c, Candidate::File(_))).collect();
        let err = NcclLib::load(&files).unwrap_err();
        let expected = dir.path().join("site-packages/nvidia/nccl/lib/libnccl.so.2");
        assert_eq!(err, format!("no usable NCCL library; tried `{}` (no such file)", expected.display()));
    }

    #[test]
    fn a_library_that_is_not_nccl_is_refused_naming_what_it_lacks() {
        let not_nccl = crate::cuda::torch_lib_dirs()[0].join("libtorch_cpu.so");
        let err = NcclLib::load(&[Candidate::File(not_nccl.clone())]).unwrap_err();
        assert!(
            err.contains(&format!(
                "`{}` (not NCCL 2.28 or later: it lacks ncclGetVersion, ",
                not_nccl.display()
            )),
            "{err}"
        );
    }

    /// The NCCL next to the libtorch in use, when the machine has one (pip's layout).
    fn pip_nccl() -> Option<PathBuf> {
        candidates(None, &crate::cuda::torch_lib_dirs()).into_iter().find_map(|c| match c {
            Candidate::File(p) if p.is_file() => Some(p),
            _ => None,
        })
    }

    #[test]
    fn the_real_nccl_next_to_torch_is_found_and_answers_without_a_gpu() {
        let Some(expected) = pip_nccl() else {
            // No NCCL on this machine: the search must say where it looked.
            let err = NcclLib::get().unwrap_err();
            assert!(err.contains("nvidia/nccl/lib/libnccl.so.2` (no such file)"), "{err}");
            return;
        };
        let lib = NcclLib::get().expect("the pip-layout NCCL loads");
        // On a GPU machine libtorch_cuda.so has already loaded its own (the same file).
        assert_eq!(lib.path.canonicalize().unwrap(), expected.canonicalize().unwrap());
        assert!(lib.version >= 22800, "{lib:?}");
        assert_eq!(lib.error_string(NCCL_INVALID_USAGE), INVALID_USAGE);
        // Rank 0's part of the rendezvous needs no GPU: two ids differ.
        let (a, b) = (lib.unique_id().unwrap(), lib.unique_id().unwrap());
        assert_ne!(a.internal, b.internal);
    }

    #[test]
    fn without_a_usable_gpu_connecting_says_what_is_missing() {
        if cuda::probe().available() {
            return; // The GPU tests below cover this machine.
        }
        let store = Store::connect("127.0.0.1", 0, true, 1, Duration::from_secs(10)).unwrap();
        let err = connect_nccl(&store, 0, 1, 0, Duration::from_secs(10)).err().expect("no GPU here");
        let text = err.to_string();
        assert!(matches!(err, DistError::Unavailable { rank: 0, .. }), "{err:?}");
        assert!(text.starts_with("the nccl backend cannot run on rank 0: "), "{text}");
        // SAFETY: only tries to dlopen libcuda under cudarc's names; no CUDA call is made.
        if pip_nccl().is_some() && !unsafe { cusys::is_culib_present() } {
            assert_eq!(
                text,
                "the nccl backend cannot run on rank 0: there is no NVIDIA driver (libcuda.so.1 cannot be \
                 loaded)\nhint: run NCCL ranks on a machine with NVIDIA GPUs, or use `backend: tcp` for CPU \
                 ranks"
            );
        }
    }

    /// Runs `world` ranks as threads, all on GPU 0, through a real store; their results in rank order.
    fn on_gpu0<R: Send>(
        world: usize,
        body: impl Fn(Box<dyn Collective>) -> R + Sync,
    ) -> Vec<Result<R, DistError>> {
        let timeout = Duration::from_secs(60);
        let server = Store::connect("127.0.0.1", 0, true, world, timeout).unwrap();
        let port = server.port();
        let mut server = Some(server);
        let body = &body;
        thread::scope(|s| {
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    let hosted = if rank == 0 { server.take() } else { None };
                    s.spawn(move || {
                        let store = hosted.unwrap_or_else(|| {
                            Store::connect("127.0.0.1", port, false, world, timeout).unwrap()
                        });
                        connect_nccl(&store, rank, world, 0, timeout).map(body)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
        })
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn gpu_one_rank_runs_every_collective_on_cuda_tensors() {
        assert!(cuda::probe().available(), "{:?}", cuda::probe());
        let results = on_gpu0(1, |mut c| {
            let dev = Device::Cuda(0);
            let mut t = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).to_device(dev);
            c.all_reduce_sum(&mut t).unwrap();
            assert_eq!(Vec::<f32>::try_from(&t.to_device(Device::Cpu)).unwrap(), [1.0, 2.0, 3.0]);
            let mut half = Tensor::from_slice(&[0.5f32]).to_device(dev).to_kind(Kind::Half);
            c.all_reduce_sum(&mut half).unwrap();
            let mut b = Tensor::from_slice(&[7i64, 8]).to_device(dev);
            c.broadcast(&mut b, 0).unwrap();
            let mut out = Tensor::zeros([3], (Kind::Float, dev));
            c.all_gather(&t, &mut out).unwrap();
            assert_eq!(Vec::<f32>::try_from(&out.to_device(Device::Cpu)).unwrap(), [1.0, 2.0, 3.0]);
            let mut shard = Tensor::zeros([3], (Kind::Float, dev));
            c.reduce_scatter_sum(&t, &mut shard).unwrap();
            assert_eq!(Vec::<f32>::try_from(&shard.to_device(Device::Cpu)).unwrap(), [1.0, 2.0, 3.0]);
            c.barrier().unwrap();
            assert_eq!(c.all_gather_bytes(b"shape").unwrap(), [b"shape".to_vec()]);
            // CPU tensors are refused before anything reaches NCCL.
            let mut cpu = Tensor::from_slice(&[1.0f32]);
            let err = c.all_reduce_sum(&mut cpu).unwrap_err().to_string();
            assert!(err.contains("`t` must be on cuda:0 (this rank's GPU), got Cpu"), "{err}");
        });
        results.into_iter().for_each(|r| r.expect("one rank connects"));
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn gpu_two_ranks_on_one_gpu_fail_with_nccls_duplicate_gpu_error_explained() {
        assert!(cuda::probe().available(), "{:?}", cuda::probe());
        let results = on_gpu0(2, |_| ());
        for (rank, r) in results.into_iter().enumerate() {
            let err = r.expect_err("NCCL refuses two ranks on one GPU");
            let text = err.to_string();
            assert!(matches!(err, DistError::Nccl { code: NCCL_INVALID_USAGE, .. }), "rank {rank}: {text}");
            assert!(text.contains("Duplicate GPU detected : rank"), "rank {rank}: {text}");
            assert!(text.contains("hint: two ranks were given the same GPU"), "rank {rank}: {text}");
        }
    }
}
