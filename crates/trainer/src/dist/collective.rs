//! The [`Collective`] trait that DDP and FSDP are written against, the [`DistError`] every
//! distributed operation returns, and the checks that turn a tch tensor into the raw memory a
//! backend reads and writes.
//!
//! Errors that users meet in PyTorch keep PyTorch's (Gloo's) wording so they can be searched for;
//! the rest say what failed, between which ranks, at which address.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use tch::{Device, Kind, Tensor};

/// Which half of a transfer was waiting when something went wrong (Gloo's `send`/`recv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Writing to the next rank.
    Send,
    /// Reading from the previous rank.
    Recv,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Send => "send",
            Direction::Recv => "recv",
        })
    }
}

/// Everything that can go wrong in rendezvous or a collective.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A peer did not send (or read) within the timeout. Gloo's wording, then where it happened.
    #[error("Timed out waiting {ms}ms for {direction} operation to complete ({context})")]
    Timeout {
        /// The timeout that ran out, in milliseconds.
        ms: u128,
        /// Whether this rank was receiving or sending.
        direction: Direction,
        /// The rank on the other end.
        peer: usize,
        /// Who was doing what, e.g. `rank 1 receiving from rank 0 at [127.0.0.1]:41234 in
        /// all_reduce_sum, collective #3`.
        context: String,
    },
    /// A peer closed its connection (it exited or crashed). Gloo's wording, then where.
    #[error("Connection closed by peer [{}]:{} ({context})", .addr.ip(), .addr.port())]
    PeerClosed {
        /// The address the peer published at rendezvous.
        addr: SocketAddr,
        /// The rank on the other end.
        peer: usize,
        /// Who was doing what when the connection closed.
        context: String,
    },
    /// Rank 0 could not host the rendezvous store.
    #[error(
        "failed to host the rendezvous store on {addr}: {message}\n\
         hint: is another job already using port {port}? Choose another MASTER_PORT."
    )]
    StoreServe {
        /// `host:port` the store was to listen on.
        addr: String,
        /// The port alone, for the hint.
        port: u16,
        /// libtorch's message.
        message: String,
    },
    /// A rank could not reach the rendezvous store.
    #[error(
        "failed to reach the rendezvous store at {addr} within {} s: {message}; is rank 0 running \
         and is MASTER_ADDR/MASTER_PORT right?",
        .timeout.as_secs_f64()
    )]
    StoreConnect {
        /// `host:port` of the store.
        addr: String,
        /// How long this rank tried.
        timeout: Duration,
        /// libtorch's message.
        message: String,
    },
    /// A store operation failed (for `get`, typically: no rank set the key before the timeout).
    #[error("failed to {op} key `{key}` in the rendezvous store at {addr}: {message}")]
    Store {
        /// `set`, `get` or `add`.
        op: &'static str,
        /// The key.
        key: String,
        /// `host:port` of the store.
        addr: String,
        /// libtorch's message.
        message: String,
    },
    /// Connecting the ranks to each other failed.
    #[error("rendezvous failed: {0}")]
    Rendezvous(String),
    /// A socket operation failed for a reason other than timeout or peer loss.
    #[error("failed to {what}: {source}")]
    Io {
        /// What was being done, e.g. `connect rank 1 to rank 2 at 127.0.0.1:41234`.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The caller passed something the operation cannot take; nothing was sent.
    #[error("invalid arguments to {op}: {message}")]
    InvalidArgument {
        /// The operation, e.g. `all_reduce_sum`.
        op: &'static str,
        /// What is wrong, with the values.
        message: String,
    },
    /// Ranks disagree: different tensor sizes, different collectives, different world sizes.
    #[error("{message}")]
    Mismatch {
        /// This rank.
        rank: usize,
        /// The rank whose data disagreed.
        peer: usize,
        /// Both sides' values.
        message: String,
    },
    /// An earlier collective failed part-way; the links are closed and cannot be trusted.
    #[error("the {backend} process group of rank {rank} is unusable after an earlier error: {first}")]
    Broken {
        /// `tcp` or `nccl`.
        backend: &'static str,
        /// This rank.
        rank: usize,
        /// The first error's message.
        first: String,
    },
    /// The `nccl` backend cannot run here (no NCCL library, no NVIDIA driver, no such GPU);
    /// nothing was sent.
    #[error("the nccl backend cannot run on rank {rank}: {message}\nhint: {hint}")]
    Unavailable {
        /// This rank.
        rank: usize,
        /// What is missing, with the paths or values involved.
        message: String,
        /// What to do about it.
        hint: String,
    },
    /// An NCCL call failed. The message reads like PyTorch's `NCCL error in: …`, with
    /// `ncclGetErrorString`'s text, NCCL's last error and, for errors users meet, an explanation.
    #[error("{message}")]
    Nccl {
        /// This rank.
        rank: usize,
        /// The `ncclResult_t` code.
        code: u32,
        /// The full message.
        message: String,
    },
    /// An NCCL collective did not complete within the timeout, worded like PyTorch's NCCL
    /// watchdog; the communicator was aborted.
    #[error(
        "[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, \
         OpType={op_type}, NumelIn={numel_in}, NumelOut={numel_out}, Timeout(ms)={timeout_ms}) ran for \
         {ran_ms} milliseconds before timing out. {context}"
    )]
    Watchdog {
        /// This rank.
        rank: usize,
        /// 1-based number of the collective on this communicator.
        seq: u64,
        /// PyTorch's `OpType` name, e.g. `ALLREDUCE`.
        op_type: &'static str,
        /// Elements sent and received.
        numel_in: usize,
        numel_out: usize,
        /// The timeout that ran out.
        timeout_ms: u128,
        /// How long the collective had run when it was aborted.
        ran_ms: u128,
        /// What that means and what was done.
        context: String,
    },
}

/// Collective communication among the ranks of one job. Every rank must call the same operations
/// in the same order with tensors of the same sizes; the backends detect and report violations
/// where they can. Results are deterministic: every rank ends with the same bits.
pub trait Collective: Send {
    /// This process's rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// How many ranks take part.
    fn world_size(&self) -> usize;
    /// In place, sum over ranks. `t` is a contiguous CPU f32 tensor (error otherwise).
    fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<(), DistError>;
    /// `output` (world_size × input.numel(), contiguous, same kind as `input`) receives every
    /// rank's `input` in rank order.
    fn all_gather(&mut self, input: &Tensor, output: &mut Tensor) -> Result<(), DistError>;
    /// `input` has world_size × output.numel() elements (both contiguous CPU f32); `output` gets
    /// this rank's chunk of the elementwise sum.
    fn reduce_scatter_sum(&mut self, input: &Tensor, output: &mut Tensor) -> Result<(), DistError>;
    /// Overwrites `t` on every rank with `root`'s `t` (contiguous CPU, any kind).
    fn broadcast(&mut self, t: &mut Tensor, root: usize) -> Result<(), DistError>;
    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<(), DistError>;
    /// Sends/receives small byte messages to/from all (for shape checks): every rank's bytes, in
    /// rank order.
    fn all_gather_bytes(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError>;
}

/// The memory behind a contiguous CPU tensor, as a raw span. Slices are made from it only for as
/// long as they are used, because two tensors handed to one operation may share storage.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawSpan {
    ptr: *mut u8,
    /// Length in bytes.
    pub(crate) len: usize,
    /// Number of elements.
    pub(crate) numel: usize,
    pub(crate) kind: Kind,
}

impl RawSpan {
    /// Checks that `t` is a defined, dense, contiguous CPU tensor (of `kind` when given) and
    /// returns its memory.
    pub(crate) fn of(
        op: &'static str,
        name: &str,
        t: &Tensor,
        kind: Option<Kind>,
    ) -> Result<RawSpan, DistError> {
        RawSpan::on(op, name, t, kind, Device::Cpu)
    }

    /// Like [`RawSpan::of`] for a tensor that must be on `device`. For a CUDA device the span is
    /// device memory: it may be handed to CUDA libraries, never dereferenced on the host.
    pub(crate) fn on(
        op: &'static str,
        name: &str,
        t: &Tensor,
        kind: Option<Kind>,
        device: Device,
    ) -> Result<RawSpan, DistError> {
        let invalid = |message: String| DistError::InvalidArgument { op, message };
        if !t.defined() {
            return Err(invalid(format!("`{name}` is an undefined tensor")));
        }
        if t.is_sparse() || t.is_mkldnn() {
            return Err(invalid(format!("`{name}` must be a dense (strided) tensor")));
        }
        let actual =
            t.f_kind().map_err(|e| invalid(format!("`{name}` has an unsupported element type: {e}")))?;
        match kind {
            Some(kind) if actual != kind => {
                return Err(invalid(format!("`{name}` must be a {kind:?} tensor, got {actual:?}")));
            }
            _ => {}
        }
        if t.device() != device {
            let wanted = match device {
                Device::Cuda(i) => format!("on cuda:{i} (this rank's GPU)"),
                _ => "on the CPU".to_string(),
            };
            return Err(invalid(format!("`{name}` must be {wanted}, got {:?}", t.device())));
        }
        if !t.is_contiguous() {
            return Err(invalid(format!(
                "`{name}` must be contiguous (size {:?}); call `.contiguous()` first",
                t.size()
            )));
        }
        let numel = t.numel();
        let len = numel * actual.elt_size_in_bytes();
        // An empty tensor may have a null data pointer; never build a slice from it, but use a
        // dangling pointer aligned for any element type instead.
        let ptr = if len == 0 {
            std::ptr::NonNull::<u128>::dangling().as_ptr().cast()
        } else {
            t.data_ptr().cast()
        };
        Ok(RawSpan { ptr, len, numel, kind: actual })
    }

    /// The bytes, mutable. The caller guarantees exclusive access meanwhile.
    pub(crate) unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        // SAFETY: `ptr` points at `len` initialised bytes of a live tensor (checked in `of`);
        // exclusivity is promised by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The elements of an f32 span. libtorch allocates f32 data 4-byte aligned (at least). The
    /// caller guarantees that no `&mut` to the same memory is alive meanwhile.
    pub(crate) unsafe fn f32s<'a>(&self) -> &'a [f32] {
        debug_assert_eq!(self.kind, Kind::Float);
        let ptr = self.ptr.cast();
        // SAFETY: `ptr` points at `len` initialised bytes of a live tensor (checked in `of`); the
        // kind is Float, so they are `numel` aligned f32s.
        unsafe { std::slice::from_raw_parts(ptr, self.numel) }
    }

    /// The elements of an f32 span, mutable. The caller guarantees exclusive access meanwhile.
    pub(crate) unsafe fn f32s_mut<'a>(&self) -> &'a mut [f32] {
        debug_assert_eq!(self.kind, Kind::Float);
        let ptr = self.ptr.cast();
        // SAFETY: as for `f32s`, plus exclusivity promised by the caller.
        unsafe { std::slice::from_raw_parts_mut(ptr, self.numel) }
    }

    /// Copies this span's bytes to the start of `dst` with memmove semantics (the two may overlap).
    pub(crate) unsafe fn copy_to(&self, dst: *mut u8) {
        // SAFETY: the caller guarantees `dst` has room for `len` bytes; `copy` allows overlap.
        unsafe { std::ptr::copy(self.ptr as *const u8, dst, self.len) }
    }

    /// The start of the span.
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

/// Views f32s as bytes (native endianness; all ranks run on the same kind of machine).
pub(crate) fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialised bytes, u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Views f32s as mutable bytes; every byte pattern is a valid f32, so writes cannot break it.
pub(crate) fn f32_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as for `f32_bytes`, and every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}
