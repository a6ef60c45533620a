//! The data loader: turns the dataset cache into batches, in the trainer (`workers: 0`) or in
//! worker processes started by `fork` or `spawn`, like PyTorch's DataLoader.
//!
//! Theory of operation:
//! - The trainer decides every batch ([`batch::Sampler`]); batch `k` goes to worker `k mod N`,
//!   and is consumed in order, so every worker count gives the same batches.
//! - The ring is one `/dev/shm` segment with `workers × prefetch` slots; worker `w` owns slots
//!   `w·prefetch ..`, so at most `prefetch` of its batches are in flight. A slot is a 64-byte
//!   header (the batch's seq) and the four batch tensors back to back.
//! - Per worker, two pipes: tasks (spec + slot) from the trainer, done records (seq + slot) back.
//!   The trainer waits for a slot with `poll` on every worker's done pipe; a worker holds the only
//!   write end of its pipe, so its death reads as end-of-file at once, whoever was being waited
//!   for. The trainer then reaps it and fails with PyTorch's words for how it died.
//! - A ready slot is wrapped with `Tensor::from_blob` and copied out (the worker may refill it
//!   as soon as it is released), then the next task goes to that worker at once. On a CUDA rank
//!   that copy goes into pinned (page-locked) host memory, and the batch moves to the GPU with a
//!   non-blocking copy, as `DataLoader(pin_memory=True)` and `.to(device, non_blocking=True)` do. Workers live until the loader drops (they persist across
//!   epochs); dropping it closes the task pipes and reaps the workers.
//! - The ring's and a file cache's names are removed as soon as every worker has them (forked
//!   workers inherit the mappings, spawned ones an open descriptor), so a SIGKILL of the whole
//!   run leaves nothing in `/dev/shm`; the memory goes with the last mapping.

pub mod batch;
pub mod cache;
pub mod shm;
pub mod worker;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, pipe2};

use crate::protocol::Marker;
use crate::scenario::{Scenario, StartMethod};

use super::burgers::Trajectories;
use super::markers;
use batch::{Batch, DatasetView, Dims, Sampler, make_batch};
use shm::{Mapping, Unlink};
use worker::{CacheSource, DONE_RECORD, ERROR_SEQ, ForkContext, SlotLayout, WorkerConfig};

/// Why the loader cannot deliver a batch.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// PyTorch's text for the death, then which worker it was and what `/dev/shm` held when the
    /// rank noticed (the rank removes its ring right after, so the harness cannot see it later).
    #[error("{text} [data-loader worker {id} of rank {rank}, {method}{shm}]")]
    WorkerDied { id: u32, pid: u32, rank: u32, method: &'static str, text: String, shm: String },
    #[error("failed to {what}: {source}")]
    Io { what: String, source: io::Error },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> LoaderError {
    let what = what.into();
    move |source| LoaderError::Io { what, source }
}

/// PyTorch's DataLoader message for a worker that ended with this wait status.
pub fn death_text(pid: u32, status: WaitStatus) -> String {
    match status {
        WaitStatus::Signaled(_, Signal::SIGBUS, _) => format!(
            "DataLoader worker (pid {pid}) is killed by signal: Bus error. It is possible that dataloader's \
             workers are out of shared memory. Please try to raise your shared memory limit."
        ),
        // PyTorch words the signal with strsignal(3): `Killed`, `Segmentation fault`.
        WaitStatus::Signaled(_, sig, _) => {
            format!(
                "DataLoader worker (pid {pid}) is killed by signal: {}.",
                super::os::signal_description(sig)
            )
        }
        WaitStatus::Exited(_, code) => {
            format!("DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}.")
        }
        other => format!("DataLoader worker (pid {pid}) ended unexpectedly ({other:?})."),
    }
}

/// Delivers this rank's batches.
pub struct Loader {
    sampler: Sampler,
    dims: Dims,
    /// The rank's device: every batch is handed out there.
    device: tch::Device,
    /// `(grid,)` positions of the grid points, the model's input coordinates.
    x: tch::Tensor,
    // Field order is drop order: workers stop before the view and the cache they read go away.
    pool: Option<Pool>,
    view: DatasetView,
    _cache: cache::Cache,
}

impl Loader {
    /// Builds the cache and starts the workers. `accum` micro-batches make one step; `total` is
    /// how many batches the run consumes at most; the first `skip` of them were consumed by the
    /// run this one resumes (their decisions are replayed, nothing is built).
    pub fn start(
        scenario: &Scenario,
        rank: u32,
        world: u32,
        data: &Trajectories,
        total: u64,
        skip: u64,
        device: tch::Device,
    ) -> Result<Loader, LoaderError> {
        let d = &scenario.data;
        let dims = Dims::of(d);
        let what = format!("create the `{}` dataset cache", cache_name(scenario));
        let cache_on = match (d.cache_device, device) {
            (crate::scenario::CacheDevice::Cuda, tch::Device::Cuda(_)) => device,
            (crate::scenario::CacheDevice::Cuda, _) => {
                println!(
                    "`data.cache_device: cuda`, but this rank trains on the CPU: the cache stays on the CPU"
                );
                tch::Device::Cpu
            }
            _ => tch::Device::Cpu,
        };
        let (mut cache, view, bytes) =
            cache::build(d.cache, data, dims, rank, cache_on).map_err(io_err(what))?;
        markers::emit(&Marker::Dataset { bytes, cache: cache_name(scenario).into() });
        let mut sampler = Sampler::new(dims, rank, world, scenario.train.seed, scenario.train.accum_steps);
        for _ in 0..skip {
            sampler.next_spec();
        }
        let x = tch::Tensor::arange(dims.grid, (tch::Kind::Float, device)) / dims.grid as f64;
        let pool = if d.workers == 0 {
            None
        } else {
            Some(Pool::start(scenario, rank, &view, &cache, dims, total, skip)?)
        };
        // Every process that maps the cache file has it now (spawned workers through an inherited
        // descriptor): its name can go.
        cache.unlink_name();
        Ok(Loader { sampler, dims, device, x, pool, view, _cache: cache })
    }

    /// The grid coordinates.
    pub fn x(&self) -> &tch::Tensor {
        &self.x
    }

    /// The next batch, in order, on the rank's device.
    pub fn next_batch(&mut self) -> Result<Batch, LoaderError> {
        let batch = match self.pool.as_mut() {
            None => make_batch(&self.view, &self.dims, &self.sampler.next_spec()),
            Some(pool) => pool.next(&mut self.sampler, self.device)?,
        };
        Ok(to_device(batch, self.device))
    }

    /// Sends SIGKILL to worker `id` (the `worker_kill` fault: like the OOM killer choosing it).
    pub fn kill_worker(&self, id: u32) {
        if let Some(w) = self.pool.as_ref().and_then(|p| p.workers.get(id as usize)) {
            eprintln!("ups-doctor: sending SIGKILL to data-loader worker {id} (pid {})", w.pid);
            // Our own child, not yet reaped: its pid cannot have been reused.
            let _ = kill(Pid::from_raw(w.pid as i32), Signal::SIGKILL);
        }
    }
}

/// Moves a batch to `device`: from pinned host memory with non-blocking copies on CUDA (the
/// pinned block is not reused before its copy is done: libtorch's pinned-memory allocator records
/// the copy), as it is when it is already there.
fn to_device(batch: Batch, device: tch::Device) -> Batch {
    if batch.u.device() == device {
        return batch;
    }
    let move_one = |t: tch::Tensor| {
        let host = if device.is_cuda() && !t.is_pinned(device) { t.pin_memory(device) } else { t };
        host.to_device_(device, tch::Kind::Float, true, false)
    };
    Batch {
        u: move_one(batch.u),
        nu: move_one(batch.nu),
        xq: move_one(batch.xq),
        target: move_one(batch.target),
    }
}

fn cache_name(s: &Scenario) -> &'static str {
    match s.data.cache {
        crate::scenario::Cache::Memory => "memory",
        crate::scenario::Cache::Disk => "disk",
        crate::scenario::Cache::Shm => "shm",
    }
}

struct WorkerHandle {
    pid: u32,
    /// Closed to tell the worker to exit.
    tasks: Option<File>,
    done: File,
    /// Bytes of a done record that arrived split.
    partial: Vec<u8>,
    /// The error the worker sent before it exited (an error record), if it sent one.
    error: Option<String>,
    reaped: bool,
}

/// The worker processes and the ring they fill.
struct Pool {
    workers: Vec<WorkerHandle>,
    layout: SlotLayout,
    prefetch: u64,
    rank: u32,
    method: StartMethod,
    /// Next batch to hand out, next to issue, and how many the run needs.
    consumed: u64,
    issued: u64,
    total: u64,
    /// Finished batches not yet consumed: seq → slot.
    ready: HashMap<u64, u32>,
    // Dropped after the workers are reaped (see `Drop`).
    ring: Mapping,
    /// Removes the ring's name; dropped as soon as every worker has the ring.
    ring_name: Option<Unlink>,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(pipe2(OFlag::O_CLOEXEC)?)
}

impl Pool {
    fn start(
        scenario: &Scenario,
        rank: u32,
        view: &DatasetView,
        cache: &cache::Cache,
        dims: Dims,
        total: u64,
        first: u64,
    ) -> Result<Pool, LoaderError> {
        let d = &scenario.data;
        let layout = SlotLayout::new(dims);
        let slots = d.workers as usize * d.prefetch as usize;
        let ring_path = shm::segment_path(rank, "ring");
        let ring = Mapping::create(&ring_path, slots * layout.slot_bytes)
            .map_err(io_err(format!("create the batch ring `{}`", ring_path.display())))?;
        let ring_file = Unlink::new(ring_path.clone());
        // Spawned workers map the ring through this descriptor, inherited, not by its name.
        let ring_fd = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&ring_path)
            .map_err(io_err(format!("open the batch ring `{}`", ring_path.display())))?;
        let mut pool = Pool {
            workers: Vec::new(),
            layout,
            prefetch: d.prefetch.into(),
            rank,
            method: d.start_method,
            consumed: first,
            issued: first,
            total,
            ready: HashMap::new(),
            ring,
            ring_name: Some(ring_file),
        };
        let method = match d.start_method {
            StartMethod::Fork => "fork",
            StartMethod::Spawn => "spawn",
        };
        for id in 0..d.workers {
            let (task_r, task_w) = pipe().map_err(io_err("create a worker's task pipe"))?;
            let (done_r, done_w) = pipe().map_err(io_err("create a worker's done pipe"))?;
            let started = match d.start_method {
                StartMethod::Fork => {
                    let ctx = ForkContext { scenario, rank, view, layout, ring: pool.ring.ptr() };
                    worker::fork_worker(&ctx, id, (task_r.as_raw_fd(), done_w.as_raw_fd()))
                }
                StartMethod::Spawn => worker::spawn_worker(&WorkerConfig {
                    id,
                    rank,
                    scenario: scenario.clone(),
                    layout,
                    ring: ring_path.clone(),
                    ring_fd: ring_fd.as_raw_fd(),
                    cache: match (cache, view.frames.device()) {
                        (cache::Cache::Memory, tch::Device::Cuda(gpu)) => CacheSource::RegenerateOnGpu(gpu),
                        (cache::Cache::Memory, _) => CacheSource::Regenerate,
                        (cache::Cache::File { path, fd, .. }, _) => {
                            CacheSource::File { path: path.clone(), fd: fd.as_raw_fd() }
                        }
                    },
                    mean: view.mean,
                    std: view.std,
                    task_fd: task_r.as_raw_fd(),
                    done_fd: done_w.as_raw_fd(),
                }),
            };
            // The worker has its own copies of its ends; ours close here.
            drop((task_r, done_w));
            let (tasks, done) = (File::from(task_w), File::from(done_r));
            let pid = started.map_err(io_err(format!("start data-loader worker {id} by {method}")))?;
            markers::emit(&Marker::Worker { id, pid, start_method: method.into() });
            pool.workers.push(WorkerHandle {
                pid,
                tasks: Some(tasks),
                done,
                partial: Vec::new(),
                error: None,
                reaped: false,
            });
        }
        // Every worker has the ring now (forked ones mapped it, spawned ones hold its
        // descriptor from before their exec): its name goes, so a SIGKILL of the whole run
        // leaves nothing in /dev/shm.
        pool.ring_name = None;
        drop(ring_fd);
        Ok(pool)
    }

    fn method_name(&self) -> &'static str {
        match self.method {
            StartMethod::Fork => "fork",
            StartMethod::Spawn => "spawn",
        }
    }

    /// Keeps every worker `prefetch` batches ahead of the trainer.
    fn fill(&mut self, sampler: &mut Sampler) -> Result<(), LoaderError> {
        let n = self.workers.len() as u64;
        while self.issued < self.total && self.issued < self.consumed + n * self.prefetch {
            let spec = sampler.next_spec();
            debug_assert_eq!(spec.seq, self.issued);
            let w = (spec.seq % n) as usize;
            let slot = (w as u64 * self.prefetch + (spec.seq / n) % self.prefetch) as u32;
            let task = worker::encode_task(&spec, slot);
            let pipe = self.workers[w].tasks.as_mut().expect("open until drop");
            if pipe.write_all(&task).is_err() {
                // EPIPE: the worker is gone; its done pipe says how.
                return Err(self.wait_for_death(w));
            }
            self.issued += 1;
        }
        Ok(())
    }

    /// The next batch from the ring, copied out of its slot: into pinned memory for a CUDA rank.
    fn next(&mut self, sampler: &mut Sampler, device: tch::Device) -> Result<Batch, LoaderError> {
        self.fill(sampler)?;
        // A worker that died while the trainer computed is reported now, even if this batch
        // is ready.
        self.poll(0)?;
        let seq = self.consumed;
        let slot = loop {
            if let Some(slot) = self.ready.remove(&seq) {
                break slot;
            }
            self.poll(-1)?;
        };
        let (written, [u, nu, xq, target]) = self.layout.copy_out(&self.ring, slot, device);
        assert_eq!(written, seq, "slot {slot} holds batch {written}, expected {seq}");
        let batch = Batch { u, nu, xq, target };
        self.consumed += 1;
        self.fill(sampler)?;
        Ok(batch)
    }

    /// Waits up to `timeout_ms` (-1: until something happens) for done records or deaths.
    fn poll(&mut self, timeout_ms: i32) -> Result<(), LoaderError> {
        let timeout = if timeout_ms < 0 {
            PollTimeout::NONE
        } else {
            PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::MAX)
        };
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd> =
                self.workers.iter().map(|w| PollFd::new(w.done.as_fd(), PollFlags::POLLIN)).collect();
            loop {
                match poll(&mut fds, timeout) {
                    Ok(_) => break,
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(io_err("wait for data-loader workers")(e.into())),
                }
            }
            // An event nix cannot name counts too: the read says what it was.
            fds.iter().map(|p| p.revents().is_none_or(|r| !r.is_empty())).collect()
        };
        for (w, ready) in ready.into_iter().enumerate() {
            if ready {
                self.drain(w)?;
            }
        }
        Ok(())
    }

    /// Reads what worker `w` sent; end of file means it died.
    fn drain(&mut self, w: usize) -> Result<(), LoaderError> {
        let mut buf = [0u8; DONE_RECORD * 64];
        let worker = &mut self.workers[w];
        // Poll said it is readable (or hung up): one read(2), which does not block.
        let n = match (&worker.done).read(&mut buf) {
            Ok(0) => return Err(self.wait_for_death(w)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(io_err("read a done pipe")(e)),
        };
        worker.partial.extend_from_slice(&buf[..n]);
        self.parse_records(w);
        Ok(())
    }

    /// Takes the complete records out of worker `w`'s buffer: done records make slots ready, an
    /// error record (seq [`ERROR_SEQ`], then its message) is kept for [`Pool::wait_for_death`].
    fn parse_records(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        let mut at = 0;
        while worker.partial.len() - at >= DONE_RECORD {
            let record = &worker.partial[at..at + DONE_RECORD];
            let seq = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
            let slot = u32::from_le_bytes(record[8..12].try_into().expect("4 bytes"));
            if seq == ERROR_SEQ {
                let end = at + DONE_RECORD + slot as usize;
                if worker.partial.len() < end {
                    break; // the message is still on its way
                }
                worker.error =
                    Some(String::from_utf8_lossy(&worker.partial[at + DONE_RECORD..end]).into_owned());
                at = end;
            } else {
                self.ready.insert(seq, slot);
                at += DONE_RECORD;
            }
        }
        worker.partial.drain(..at);
    }

    /// Reads what a dead worker left in its pipe (its error record), without ever blocking.
    fn drain_dead(&mut self, w: usize) {
        let mut buf = [0u8; 4096];
        for _ in 0..64 {
            let done = &self.workers[w].done;
            let mut p = [PollFd::new(done.as_fd(), PollFlags::POLLIN)];
            if !matches!(poll(&mut p, PollTimeout::ZERO), Ok(n) if n > 0) {
                break;
            }
            let n = match (&*done).read(&mut buf) {
                Ok(n) if n > 0 => n,
                _ => break,
            };
            self.workers[w].partial.extend_from_slice(&buf[..n]);
        }
        self.parse_records(w);
    }

    /// Reaps worker `w`, which closed its pipe, and words its death like PyTorch.
    fn wait_for_death(&mut self, w: usize) -> LoaderError {
        let pid = self.workers[w].pid;
        // It closed its pipe because it is exiting; give the kernel a moment to finish that.
        let status = wait_pid(pid, Duration::from_secs(5));
        self.workers[w].reaped = status.is_some();
        self.drain_dead(w);
        let text = match (status, self.workers[w].error.take()) {
            // PyTorch re-raises a worker's exception in the main process: "Caught RuntimeError in
            // DataLoader worker process 0."
            (_, Some(error)) => {
                format!("Caught an error in DataLoader worker process {w} (pid {pid}): {error}")
            }
            (Some(status), None) => death_text(pid, status),
            (None, None) => format!("DataLoader worker (pid {pid}) closed its pipe but did not exit."),
        };
        let bus_error = matches!(status, Some(WaitStatus::Signaled(_, Signal::SIGBUS, _)));
        let shm = nix::sys::statvfs::statvfs("/dev/shm")
            .ok()
            .filter(|_| bus_error)
            .map(|st| {
                let frsize = st.fragment_size() as u64;
                let total = st.blocks() as u64 * frsize;
                let used = total.saturating_sub(st.blocks_free() as u64 * frsize);
                format!("; {} {used} of {total} bytes", crate::protocol::SHM_HELD)
            })
            .unwrap_or_default();
        LoaderError::WorkerDied { id: w as u32, pid, rank: self.rank, method: self.method_name(), text, shm }
    }
}

/// `waitpid` for up to `limit`; the wait status, or `None` if it is still running.
fn wait_pid(pid: u32, limit: Duration) -> Option<WaitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {}
            Ok(WaitStatus::StillAlive) | Err(_) => return None,
            Ok(status) => return Some(status),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Drop for Pool {
    /// Closes every task pipe (workers exit at end of file), reaps the workers (SIGKILL for one
    /// that does not leave within 2 s, e.g. deadlocked), then the ring goes.
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.tasks = None;
        }
        for w in self.workers.iter_mut().filter(|w| !w.reaped) {
            if wait_pid(w.pid, Duration::from_secs(2)).is_none() {
                // Our own unreaped child: its pid names it until the wait below.
                let pid = Pid::from_raw(w.pid as i32);
                let _ = kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
            }
            w.reaped = true;
        }
    }
}
