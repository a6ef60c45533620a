//! Rendezvous through libtorch's own `c10d::TCPStore`, the key-value store torchrun and
//! `torch.distributed` use, reached through the `extern "C"` shim in `csrc/store_shim.cpp`.
//!
//! Using libtorch's store (rather than one written here) keeps the wire protocol, the
//! `MASTER_ADDR`/`MASTER_PORT` semantics and the error texts those of PyTorch. The shim catches
//! every C++ exception and hands back its message; nothing unwinds across the boundary.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::net::{TcpStream, ToSocketAddrs};
use std::ptr::{self, NonNull};
use std::thread;
use std::time::{Duration, Instant};

use super::collective::DistError;

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    // Implemented in csrc/store_shim.cpp. Each fallible call returns 0 on success and -1 on
    // failure with `*err` set to a malloc'd message (released with `ups_store_free_string`).
    unsafe extern "C" {
        pub fn ups_store_new(
            host: *const c_char,
            port: u16,
            is_server: c_int,
            world_size: u64,
            timeout_ms: i64,
            use_libuv: c_int,
            listen_fd: c_int,
            out: *mut *mut c_void,
            out_port: *mut u16,
            err: *mut *mut c_char,
        ) -> c_int;
        pub fn ups_store_free(store: *mut c_void);
        pub fn ups_store_set(
            store: *mut c_void,
            key: *const c_char,
            key_len: usize,
            value: *const u8,
            value_len: usize,
            err: *mut *mut c_char,
        ) -> c_int;
        pub fn ups_store_get(
            store: *mut c_void,
            key: *const c_char,
            key_len: usize,
            out: *mut *mut u8,
            out_len: *mut usize,
            err: *mut *mut c_char,
        ) -> c_int;
        pub fn ups_store_add(
            store: *mut c_void,
            key: *const c_char,
            key_len: usize,
            delta: i64,
            out: *mut i64,
            err: *mut *mut c_char,
        ) -> c_int;
        pub fn ups_store_is_libuv(store: *mut c_void) -> c_int;
        pub fn ups_store_free_buf(buf: *mut u8);
        pub fn ups_store_free_string(s: *mut c_char);
    }
}

/// A connection to (and on rank 0, the host of) a `c10d::TCPStore`. Dropping it closes the
/// connection; rank 0's drop also stops the server, so rank 0 should keep it until the other
/// ranks are done with rendezvous.
pub struct Store {
    raw: NonNull<c_void>,
    /// `host:port` as given (with the real port when rank 0 asked for port 0), for messages.
    addr: String,
    port: u16,
}

// SAFETY: TCPStore serialises its operations with an internal mutex and holds no thread-affine
// state; moving the handle to another thread is what PyTorch does with it too.
unsafe impl Send for Store {}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("addr", &self.addr).field("libuv", &self.uses_libuv()).finish()
    }
}

impl Store {
    /// Rank 0 (`is_server`) hosts the store on `host:port` (port 0: an ephemeral port, see
    /// [`Store::port`]); the others connect, waiting for rank 0 to come up. `timeout` bounds
    /// connecting and every later [`Store::get`]. Fails after `timeout` with a message naming
    /// the address and the timeout. Rank 0 does not wait for the others here.
    pub fn connect(
        host: &str,
        port: u16,
        is_server: bool,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Store, DistError> {
        let addr = format!("{host}:{port}");
        let c_host = CString::new(host).map_err(|_| DistError::InvalidArgument {
            op: "Store::connect",
            message: format!("host `{}` contains a NUL byte", host.escape_debug()),
        })?;
        if !is_server {
            wait_until_listening(host, port, timeout).map_err(|message| DistError::StoreConnect {
                addr: addr.clone(),
                timeout,
                message,
            })?;
        }
        // Rank 0 binds the listening socket itself, on `host` only (loopback by default), and
        // hands it to the store, whose server would otherwise listen on every interface.
        let listen_fd =
            if is_server {
                let listener = std::net::TcpListener::bind((host, port)).map_err(|e| {
                    DistError::StoreServe { addr: addr.clone(), port, message: e.to_string() }
                })?;
                std::os::fd::IntoRawFd::into_raw_fd(listener)
            } else {
                -1
            };
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let mut raw: *mut c_void = ptr::null_mut();
        let mut actual_port: u16 = 0;
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: all pointers are valid for the call; the shim catches every C++ exception.
        let rc = unsafe {
            ffi::ups_store_new(
                c_host.as_ptr(),
                port,
                c_int::from(is_server),
                world_size as u64,
                timeout_ms,
                // libuv is TCPStore's default server backend since PyTorch 2.4 and is built into
                // the wheel's libtorch_cpu; keep what Python users get.
                1,
                listen_fd,
                &mut raw,
                &mut actual_port,
                &mut err,
            )
        };
        match NonNull::new(raw) {
            Some(raw) if rc == 0 => {
                Ok(Store { raw, addr: format!("{host}:{actual_port}"), port: actual_port })
            }
            _ => {
                let message = take_error(err);
                Err(if is_server {
                    DistError::StoreServe { addr, port, message }
                } else {
                    DistError::StoreConnect { addr, timeout, message }
                })
            }
        }
    }

    /// The store's port: the one asked for, or the ephemeral one rank 0 got for port 0.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host:port` of the store.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the server side runs libtorch's libuv backend (meaningful on rank 0).
    pub fn uses_libuv(&self) -> bool {
        // SAFETY: `raw` is a live TCPStore; the call cannot throw.
        unsafe { ffi::ups_store_is_libuv(self.raw.as_ptr()) != 0 }
    }

    /// Sets `key` to `value`, waking ranks blocked in [`Store::get`] on it.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), DistError> {
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: `raw` is live; key and value are valid for their lengths during the call.
        let rc = unsafe {
            ffi::ups_store_set(
                self.raw.as_ptr(),
                key.as_ptr().cast(),
                key.len(),
                value.as_ptr(),
                value.len(),
                &mut err,
            )
        };
        self.check("set", key, rc, err)
    }

    /// The value of `key`; blocks until some rank sets it or the store's timeout passes.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, DistError> {
        let mut buf: *mut u8 = ptr::null_mut();
        let mut len: usize = 0;
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: `raw` is live; out-pointers are valid for the call.
        let rc = unsafe {
            ffi::ups_store_get(
                self.raw.as_ptr(),
                key.as_ptr().cast(),
                key.len(),
                &mut buf,
                &mut len,
                &mut err,
            )
        };
        self.check("get", key, rc, err)?;
        if buf.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: on success the shim hands back a malloc'd buffer of `len` bytes, ours to free.
        let value = unsafe { std::slice::from_raw_parts(buf, len) }.to_vec();
        // SAFETY: `buf` came from the shim and is released exactly once.
        unsafe { ffi::ups_store_free_buf(buf) };
        Ok(value)
    }

    /// Adds `delta` to the integer stored at `key` (0 when absent) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, DistError> {
        let mut out: i64 = 0;
        let mut err: *mut c_char = ptr::null_mut();
        // SAFETY: `raw` is live; out-pointers are valid for the call.
        let rc = unsafe {
            ffi::ups_store_add(self.raw.as_ptr(), key.as_ptr().cast(), key.len(), delta, &mut out, &mut err)
        };
        self.check("add", key, rc, err)?;
        Ok(out)
    }

    fn check(&self, op: &'static str, key: &str, rc: c_int, err: *mut c_char) -> Result<(), DistError> {
        if rc == 0 {
            return Ok(());
        }
        Err(DistError::Store { op, key: key.to_string(), addr: self.addr.clone(), message: take_error(err) })
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ups_store_new` and is freed exactly once.
        unsafe { ffi::ups_store_free(self.raw.as_ptr()) }
    }
}

/// Waits until something accepts TCP connections on `host:port`, for at most `timeout`.
///
/// TCPStore's client retries on its own, but overshoots its timeout by a whole second attempt
/// plus a back-off (measured with libtorch 2.11: 1 s → 1.7 s, 3 s → 7.5 s), which would let a
/// hang detector mistake a missing rank 0 for a hang. Probing first keeps the bound; TCPStore
/// then connects at once and still validates that it is talking to a store.
fn wait_until_listening(host: &str, port: u16, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(20);
    loop {
        let last_error = match (host, port).to_socket_addrs() {
            Ok(addrs) => {
                let mut last = format!("`{host}` resolves to no address");
                for addr in addrs {
                    let left =
                        deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                    match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
                        Ok(_) => return Ok(()),
                        Err(e) => last = format!("cannot connect to {addr}: {e}"),
                    }
                }
                last
            }
            Err(e) => format!("cannot resolve `{host}`: {e}"),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(last_error);
        }
        thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// Reads and releases an error message from the shim.
fn take_error(err: *mut c_char) -> String {
    if err.is_null() {
        return "unknown error (the shim could not allocate its message)".to_string();
    }
    // SAFETY: the shim hands back a NUL-terminated malloc'd string, ours to free once.
    // Messages are quoted mid-sentence: drop libtorch's final full stop.
    let message =
        unsafe { CStr::from_ptr(err) }.to_string_lossy().trim_end().trim_end_matches('.').to_string();
    // SAFETY: as above.
    unsafe { ffi::ups_store_free_string(err) };
    message
}
