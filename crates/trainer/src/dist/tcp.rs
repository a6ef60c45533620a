//! The `tcp` backend: CPU collectives over plain TCP sockets arranged in a ring, used because
//! libtorch's Gloo cannot be built against the wheel (it ships no gloo headers).
//!
//! Theory of operation. Each rank listens on an ephemeral port, publishes `ip:port` in the
//! [`Store`], connects to the next rank and accepts the previous one, so every rank holds one
//! socket it only writes (to `rank + 1`) and one it only reads (from `rank − 1`); with two ranks
//! these are two distinct connections between the same pair. Every transfer is one *exchange*:
//! write a message to the next rank while reading one from the previous, multiplexed with
//! `poll(2)` on non-blocking sockets so that no rank can block the ring by filling a socket
//! buffer, and bounded by the timeout as a whole.
//!
//! Each message starts with a header (magic, operation, collective sequence number, argument,
//! this message's length, the collective's total size) so that ranks that disagree — different
//! tensor sizes, a skipped collective, another broadcast root — get a [`DistError::Mismatch`]
//! naming both sides instead of garbage or a hang. Payloads are read from and written to the
//! tensors' memory directly.
//!
//! Sums are deterministic: all-reduce is a ring reduce-scatter (chunk `c` is accumulated in the
//! fixed order rank `c`, `c+1`, …) followed by a ring all-gather that copies the final chunk, so
//! every rank ends with the same bits. After any failure the links are shut down (so peers learn
//! at once instead of waiting for their own timeout) and the group refuses further use.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use tch::{Kind, Tensor};

use super::collective::{Collective, Direction, DistError, RawSpan, f32_bytes, f32_bytes_mut};
use super::store::Store;

/// Marks ups-doctor traffic ("UPSd"): a stray connection or a desynchronised stream is caught.
const MAGIC: u32 = u32::from_le_bytes(*b"UPSd");
/// Version of the handshake and header layout below.
const PROTOCOL: u32 = 1;
const HEADER_LEN: usize = 40;
const HELLO_LEN: usize = 24;
/// Broadcast forwards in segments this large, so a long ring pipelines instead of waiting for
/// whole tensors at every hop.
const BROADCAST_SEGMENT: usize = 4 << 20;
/// Upper bound on one `all_gather_bytes` message, far above any shape check.
const MAX_BYTES_MESSAGE: u64 = 1 << 30;
/// Store keys live under this prefix, followed by a generation number (see `connect_tcp`).
const KEY_PREFIX: &str = "ups_doctor/tcp";

/// Connects this rank to the others as a `tcp` process group.
///
/// Each rank listens on an ephemeral port on `bind_host` (an address the other ranks can reach,
/// e.g. `127.0.0.1` on one machine), publishes it in `store`, and connects to its ring
/// neighbours. `timeout` bounds connecting and every later collective's waits; waits on the
/// store are bounded by the store's own timeout. Returns once every rank is connected (a
/// barrier over the new links), after which no rank needs the store for this group. World
/// size 1 needs neither sockets nor the store. Ranks calling this repeatedly on one store get a
/// fresh generation of keys each time, as long as every rank makes the same calls in the same
/// order.
pub fn connect_tcp(
    store: &Store,
    rank: usize,
    world_size: usize,
    bind_host: &str,
    timeout: Duration,
) -> Result<Box<dyn Collective>, DistError> {
    if world_size == 0 || rank >= world_size {
        return Err(DistError::InvalidArgument {
            op: "connect_tcp",
            message: format!("rank {rank} is not in a world of size {world_size}"),
        });
    }
    if world_size == 1 {
        return Ok(Box::new(TcpCollective::new(rank, world_size, timeout, None)));
    }
    let joined = store.add(&format!("{KEY_PREFIX}/joined"), 1)?;
    let generation = u64::try_from((joined - 1).max(0)).unwrap_or(0) / world_size as u64;
    let prefix = format!("{KEY_PREFIX}/{generation}");

    let listener = listen(bind_host)?;
    let my_addr = listener.local_addr().map_err(|source| DistError::Io {
        what: format!("read the address rank {rank} listens on"),
        source,
    })?;
    store.set(&format!("{prefix}/addr/{rank}"), my_addr.to_string().as_bytes())?;

    let next = (rank + 1) % world_size;
    let prev = (rank + world_size - 1) % world_size;
    let next_addr = published_addr(store, &prefix, next)?;
    let prev_addr = published_addr(store, &prefix, prev)?;
    let deadline = Instant::now() + timeout;
    let hello = Hello { rank, world_size, generation };

    // Connect first, accept second: the kernel completes a connection without `accept`, so no
    // rank waits on another in this order.
    let next_stream = connect_next(rank, next, next_addr, deadline, &hello)?;
    let prev_stream = accept_prev(&listener, rank, prev, my_addr, deadline, &hello, timeout)?;
    let ring = Ring {
        next: Link::new(next, next_addr, next_stream)?,
        prev: Link::new(prev, prev_addr, prev_stream)?,
    };
    // A rank whose ring is up may still have neighbours reading addresses from the store. A
    // first barrier over the new links (not over the store, whose own last read would race
    // with rank 0 dropping it) means nobody returns before every rank is done with the store,
    // so rank 0 may drop the store (and its server) once this returns.
    let mut group = TcpCollective::new(rank, world_size, timeout, Some(ring));
    group.barrier()?;
    // Users count collectives from their first one.
    group.seq = 0;
    Ok(Box::new(group))
}

/// Binds an ephemeral port on `bind_host`, refusing addresses peers could not connect to.
fn listen(bind_host: &str) -> Result<TcpListener, DistError> {
    let addr = (bind_host, 0)
        .to_socket_addrs()
        .map_err(|source| DistError::Io { what: format!("resolve bind host `{bind_host}`"), source })?
        .next()
        .ok_or_else(|| DistError::Rendezvous(format!("bind host `{bind_host}` resolves to no address")))?;
    if addr.ip().is_unspecified() {
        return Err(DistError::InvalidArgument {
            op: "connect_tcp",
            message: format!(
                "bind host `{bind_host}` is not an address other ranks can connect to; pass this \
                 machine's address (`127.0.0.1` when every rank runs here)"
            ),
        });
    }
    TcpListener::bind(addr)
        .map_err(|source| DistError::Io { what: format!("listen on {addr} for ring connections"), source })
}

/// Reads rank `peer`'s listening address from the store (waiting for it up to the store timeout).
fn published_addr(store: &Store, prefix: &str, peer: usize) -> Result<SocketAddr, DistError> {
    let raw = store.get(&format!("{prefix}/addr/{peer}"))?;
    let text = String::from_utf8_lossy(&raw);
    text.parse().map_err(|_| {
        DistError::Rendezvous(format!("rank {peer} published `{text}`, which is not an `ip:port` address"))
    })
}

/// What a rank says first on a new connection, so the acceptor can check who called.
struct Hello {
    rank: usize,
    world_size: usize,
    generation: u64,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&PROTOCOL.to_le_bytes());
        b[8..12].copy_from_slice(&(self.rank as u32).to_le_bytes());
        b[12..16].copy_from_slice(&(self.world_size as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b
    }

    /// `None` when the bytes are not an ups-doctor hello of this protocol version.
    fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if word(0) != MAGIC || word(4) != PROTOCOL {
            return None;
        }
        let mut generation = [0u8; 8];
        generation.copy_from_slice(&b[16..24]);
        Some(Hello {
            rank: word(8) as usize,
            world_size: word(12) as usize,
            generation: u64::from_le_bytes(generation),
        })
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
}

fn connect_next(
    rank: usize,
    next: usize,
    addr: SocketAddr,
    deadline: Instant,
    hello: &Hello,
) -> Result<TcpStream, DistError> {
    let what = || format!("connect rank {rank} to rank {next} at {addr}");
    let left = remaining(deadline).ok_or_else(|| {
        DistError::Rendezvous(format!(
            "rank {rank} ran out of time before connecting to rank {next} at {addr}"
        ))
    })?;
    let mut stream =
        TcpStream::connect_timeout(&addr, left).map_err(|source| DistError::Io { what: what(), source })?;
    stream
        .set_write_timeout(Some(left))
        .and_then(|()| stream.write_all(&hello.encode()))
        .map_err(|source| DistError::Io { what: what(), source })?;
    Ok(stream)
}

/// Accepts connections until the previous rank's arrives; strays (no valid hello) are dropped.
fn accept_prev(
    listener: &TcpListener,
    rank: usize,
    prev: usize,
    my_addr: SocketAddr,
    deadline: Instant,
    mine: &Hello,
    timeout: Duration,
) -> Result<TcpStream, DistError> {
    let io = |source| DistError::Io { what: format!("accept rank {prev} on {my_addr}"), source };
    listener.set_nonblocking(true).map_err(io)?;
    loop {
        let Some(left) = remaining(deadline) else {
            return Err(DistError::Rendezvous(format!(
                "rank {rank} waited {}ms for rank {prev} to connect to {my_addr}; is rank {prev} \
                 running, and can it reach this address?",
                timeout.as_millis()
            )));
        };
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream.set_nonblocking(false).map_err(io)?;
                stream.set_read_timeout(Some(left)).map_err(io)?;
                let mut buf = [0u8; HELLO_LEN];
                let Some(theirs) = stream.read_exact(&mut buf).ok().and_then(|()| Hello::decode(&buf)) else {
                    continue;
                };
                if theirs.world_size != mine.world_size {
                    return Err(DistError::Mismatch {
                        rank,
                        peer: theirs.rank,
                        message: format!(
                            "rank {rank} was started with world size {} but rank {} with world size \
                             {}: check WORLD_SIZE of every rank",
                            mine.world_size, theirs.rank, theirs.world_size
                        ),
                    });
                }
                if theirs.rank != prev || theirs.generation != mine.generation {
                    return Err(DistError::Mismatch {
                        rank,
                        peer: theirs.rank,
                        message: format!(
                            "rank {rank} expected rank {prev} (rendezvous #{}) to connect, but rank {} \
                             (rendezvous #{}) did: do two processes share a RANK, or did the ranks \
                             create different numbers of process groups?",
                            mine.generation, theirs.rank, theirs.generation
                        ),
                    });
                }
                return Ok(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_readable(&listener, left.min(Duration::from_millis(100)));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
}

/// Waits until `fd` is readable or `limit` passes (errors count as "go and look").
fn wait_readable(fd: impl AsFd, limit: Duration) {
    let _ = poll(&mut [PollFd::new(fd.as_fd(), PollFlags::POLLIN)], poll_ms(limit));
}

/// A poll(2) timeout in milliseconds, rounded up so a short remainder does not spin.
fn poll_ms(d: Duration) -> PollTimeout {
    let ms = d.as_nanos().div_ceil(1_000_000);
    i32::try_from(ms).ok().and_then(|ms| PollTimeout::try_from(ms).ok()).unwrap_or(PollTimeout::MAX)
}

/// One neighbour: its rank, its published address (what errors name) and the socket.
struct Link {
    rank: usize,
    addr: SocketAddr,
    stream: TcpStream,
}

impl Link {
    fn new(rank: usize, addr: SocketAddr, stream: TcpStream) -> Result<Link, DistError> {
        let io = |source| DistError::Io {
            what: format!("configure the connection to rank {rank} at {addr}"),
            source,
        };
        // Latency of small messages (headers, barriers) matters more than packet counts here.
        stream.set_nodelay(true).map_err(io)?;
        stream.set_read_timeout(None).map_err(io)?;
        stream.set_write_timeout(None).map_err(io)?;
        stream.set_nonblocking(true).map_err(io)?;
        Ok(Link { rank, addr, stream })
    }
}

/// The two sockets of a rank in a ring of two or more.
struct Ring {
    next: Link,
    prev: Link,
}

/// Which collective a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduceSum = 1,
    AllGather = 2,
    ReduceScatterSum = 3,
    Broadcast = 4,
    Barrier = 5,
    AllGatherBytes = 6,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduceSum => "all_reduce_sum",
            Op::AllGather => "all_gather",
            Op::ReduceScatterSum => "reduce_scatter_sum",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
            Op::AllGatherBytes => "all_gather_bytes",
        }
    }

    fn from_code(code: u32) -> Option<Op> {
        [
            Op::AllReduceSum,
            Op::AllGather,
            Op::ReduceScatterSum,
            Op::Broadcast,
            Op::Barrier,
            Op::AllGatherBytes,
        ]
        .into_iter()
        .find(|op| *op as u32 == code)
    }
}

/// Describes one collective call; every message of the call carries it in its header.
#[derive(Debug, Clone, Copy)]
struct Call {
    op: Op,
    /// 1-based number of this collective on this group.
    seq: u64,
    /// Operation argument that all ranks must agree on (the broadcast root), else 0.
    arg: u64,
    /// Total bytes of the collective's buffer on this rank; `None` when ranks may differ.
    total: Option<u64>,
}

/// A message header as it travels.
#[derive(Debug, Clone, Copy)]
struct Header {
    magic: u32,
    op: u32,
    seq: u64,
    arg: u64,
    len: u64,
    total: u64,
}

impl Header {
    fn for_call(call: &Call, len: usize) -> Header {
        Header {
            magic: MAGIC,
            op: call.op as u32,
            seq: call.seq,
            arg: call.arg,
            len: len as u64,
            total: call.total.unwrap_or(u64::MAX),
        }
    }

    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.op.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.arg.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.total.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Header {
            magic: u32_at(0),
            op: u32_at(4),
            seq: u64_at(8),
            arg: u64_at(16),
            len: u64_at(24),
            total: u64_at(32),
        }
    }
}

/// Where an exchange puts what it receives.
enum Recv<'a> {
    /// Nothing is received in this exchange.
    Nothing,
    /// Exactly this many bytes, into this memory.
    Exact(&'a mut [u8]),
    /// Whatever length the sender chose (bounded), into this vector.
    Any(&'a mut Vec<u8>),
}

/// Progress of the receiving half of an exchange.
struct Incoming<'a> {
    target: Recv<'a>,
    header: [u8; HEADER_LEN],
    header_got: usize,
    /// Payload length, once the header has been read and checked.
    payload_len: Option<usize>,
    payload_got: usize,
}

impl Incoming<'_> {
    fn done(&self) -> bool {
        match self.target {
            Recv::Nothing => true,
            _ => self.payload_len == Some(self.payload_got),
        }
    }
}

/// Progress of the sending half of an exchange.
struct Outgoing<'a> {
    header: [u8; HEADER_LEN],
    payload: Option<&'a [u8]>,
    sent: usize,
}

impl Outgoing<'_> {
    fn total(&self) -> usize {
        self.payload.map_or(0, |p| HEADER_LEN + p.len())
    }

    fn done(&self) -> bool {
        self.sent == self.total()
    }
}

fn is_peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
            | io::ErrorKind::UnexpectedEof
    )
}

impl Ring {
    /// Sends `send` (if any) to the next rank while receiving into `recv` from the previous one,
    /// within `timeout` for the whole exchange.
    fn exchange(
        &mut self,
        me: usize,
        timeout: Duration,
        call: &Call,
        send: Option<&[u8]>,
        recv: Recv<'_>,
    ) -> Result<(), DistError> {
        let deadline = Instant::now() + timeout;
        let mut out = Outgoing {
            header: Header::for_call(call, send.map_or(0, <[u8]>::len)).encode(),
            payload: send,
            sent: 0,
        };
        let mut inc = Incoming {
            target: recv,
            header: [0; HEADER_LEN],
            header_got: 0,
            payload_len: None,
            payload_got: 0,
        };

        while !(out.done() && inc.done()) {
            let sending = !out.done();
            let receiving = !inc.done();
            let Some(left) = remaining(deadline) else {
                return Err(self.timeout_error(me, timeout, call, receiving));
            };
            // A finished half is left out of the poll, so that its peer's normal exit after the
            // last message is not mistaken for a failure.
            // An event nix cannot name reads as POLLERR: go and look (the read or write says what).
            let polled = {
                let mut fds = Vec::with_capacity(2);
                if sending {
                    // The next rank never writes to us, so "readable" means it closed (end of file or
                    // a reset). POLLIN, not Linux's POLLRDHUP: nix's PollFlags cannot hold that bit
                    // (`revents()` would read as nothing at all).
                    fds.push(PollFd::new(self.next.stream.as_fd(), PollFlags::POLLOUT | PollFlags::POLLIN));
                }
                if receiving {
                    fds.push(PollFd::new(self.prev.stream.as_fd(), PollFlags::POLLIN));
                }
                poll(&mut fds, poll_ms(left)).map(|n| {
                    (n, fds.iter().map(|p| p.revents().unwrap_or(PollFlags::POLLERR)).collect::<Vec<_>>())
                })
            };
            let (n, revents) = match polled {
                Ok(got) => got,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    return Err(DistError::Io {
                        what: format!("poll the ring sockets of rank {me}"),
                        source: e.into(),
                    });
                }
            };
            if n == 0 {
                return Err(self.timeout_error(me, timeout, call, receiving));
            }
            let none = PollFlags::empty();
            let (send_ev, recv_ev) = match (sending, receiving) {
                (true, true) => (revents[0], revents[1]),
                (true, false) => (revents[0], none),
                _ => (none, revents[0]),
            };
            if sending {
                if send_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP) {
                    return Err(self.closed(me, call, Direction::Send));
                }
                if send_ev.intersects(PollFlags::POLLOUT | PollFlags::POLLERR) {
                    self.write_some(me, call, &mut out)?;
                }
            }
            if receiving && !recv_ev.is_empty() {
                self.read_some(me, call, &mut inc)?;
            }
        }
        Ok(())
    }

    fn write_some(&mut self, me: usize, call: &Call, out: &mut Outgoing<'_>) -> Result<(), DistError> {
        while !out.done() {
            let buf = match out.payload {
                Some(_) if out.sent < HEADER_LEN => &out.header[out.sent..],
                Some(payload) => &payload[out.sent - HEADER_LEN..],
                None => return Ok(()),
            };
            match self.next.stream.write(buf) {
                Ok(0) => return Err(self.closed(me, call, Direction::Send)),
                Ok(n) => out.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_peer_gone(&e) => return Err(self.closed(me, call, Direction::Send)),
                Err(source) => {
                    return Err(DistError::Io {
                        what: format!(
                            "send {} #{} data from rank {me} to rank {} at {}",
                            call.op.name(),
                            call.seq,
                            self.next.rank,
                            self.next.addr
                        ),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    fn read_some(&mut self, me: usize, call: &Call, inc: &mut Incoming<'_>) -> Result<(), DistError> {
        while !inc.done() {
            let result = if inc.header_got < HEADER_LEN {
                self.prev.stream.read(&mut inc.header[inc.header_got..])
            } else {
                let got = inc.payload_got;
                match &mut inc.target {
                    Recv::Nothing => return Ok(()),
                    Recv::Exact(buf) => self.prev.stream.read(&mut buf[got..]),
                    Recv::Any(vec) => self.prev.stream.read(&mut vec[got..]),
                }
            };
            match result {
                Ok(0) => return Err(self.closed(me, call, Direction::Recv)),
                Ok(n) if inc.header_got < HEADER_LEN => {
                    inc.header_got += n;
                    if inc.header_got == HEADER_LEN {
                        let header = Header::decode(&inc.header);
                        let len = self.check_header(me, call, &header, &inc.target)?;
                        if let Recv::Any(vec) = &mut inc.target {
                            vec.clear();
                            vec.resize(len, 0);
                        }
                        inc.payload_len = Some(len);
                    }
                }
                Ok(n) => inc.payload_got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_peer_gone(&e) => return Err(self.closed(me, call, Direction::Recv)),
                Err(source) => {
                    return Err(DistError::Io {
                        what: format!(
                            "receive {} #{} data on rank {me} from rank {} at {}",
                            call.op.name(),
                            call.seq,
                            self.prev.rank,
                            self.prev.addr
                        ),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks that the previous rank is in the same collective with the same sizes; returns the
    /// payload length to read.
    fn check_header(
        &self,
        me: usize,
        call: &Call,
        h: &Header,
        target: &Recv<'_>,
    ) -> Result<usize, DistError> {
        let peer = self.prev.rank;
        let mismatch = |message: String| DistError::Mismatch { rank: me, peer, message };
        if h.magic != MAGIC {
            return Err(mismatch(format!(
                "rank {me} received data from rank {peer} at {} that is not ups-doctor collective \
                 traffic (magic {:#010x}) during {} #{}",
                self.prev.addr,
                h.magic,
                call.op.name(),
                call.seq
            )));
        }
        if h.op != call.op as u32 || h.seq != call.seq {
            let theirs = Op::from_code(h.op)
                .map_or_else(|| format!("unknown operation {}", h.op), |op| op.name().to_string());
            return Err(mismatch(format!(
                "rank {me} is in collective #{} ({}) but rank {peer} sent data for collective #{} \
                 ({theirs}): the ranks are out of step (one of them skipped a collective or ran an \
                 extra one)",
                call.seq,
                call.op.name(),
                h.seq
            )));
        }
        if h.arg != call.arg {
            return Err(mismatch(format!(
                "rank {me} runs {} #{} from root {} but rank {peer} from root {}",
                call.op.name(),
                call.seq,
                call.arg,
                h.arg
            )));
        }
        if let Some(total) = call.total.filter(|&total| total != h.total) {
            return Err(mismatch(format!(
                "rank {me} passed {total} bytes to {} #{} but rank {peer} passed {} bytes: the ranks \
                 disagree about the tensor size",
                call.op.name(),
                call.seq,
                h.total
            )));
        }
        match target {
            Recv::Exact(buf) if h.len != buf.len() as u64 => Err(mismatch(format!(
                "rank {me} expected a {}-byte message from rank {peer} in {} #{} but got {} bytes",
                buf.len(),
                call.op.name(),
                call.seq,
                h.len
            ))),
            Recv::Any(_) if h.len > MAX_BYTES_MESSAGE => Err(mismatch(format!(
                "rank {peer} sent a {}-byte message in {} #{}, more than the {MAX_BYTES_MESSAGE}-byte limit",
                h.len,
                call.op.name(),
                call.seq
            ))),
            _ => usize::try_from(h.len)
                .map_err(|_| mismatch(format!("rank {peer} sent an impossible length {}", h.len))),
        }
    }

    fn timeout_error(&self, me: usize, timeout: Duration, call: &Call, receiving: bool) -> DistError {
        let (direction, link, verb) = if receiving {
            (Direction::Recv, &self.prev, "receiving from")
        } else {
            (Direction::Send, &self.next, "sending to")
        };
        DistError::Timeout {
            ms: timeout.as_millis(),
            direction,
            peer: link.rank,
            context: format!(
                "rank {me} {verb} rank {} at [{}]:{} in {}, collective #{}",
                link.rank,
                link.addr.ip(),
                link.addr.port(),
                call.op.name(),
                call.seq
            ),
        }
    }

    fn closed(&self, me: usize, call: &Call, direction: Direction) -> DistError {
        let (link, verb) = match direction {
            Direction::Recv => (&self.prev, "receiving from"),
            Direction::Send => (&self.next, "sending to"),
        };
        DistError::PeerClosed {
            addr: link.addr,
            peer: link.rank,
            context: format!(
                "rank {me} {verb} rank {} in {}, collective #{}",
                link.rank,
                call.op.name(),
                call.seq
            ),
        }
    }

    /// Closes both directions so the neighbours notice at once.
    fn shutdown(&self) {
        // Errors mean the socket is already unusable, which is the goal.
        let _ = self.next.stream.shutdown(Shutdown::Both);
        let _ = self.prev.stream.shutdown(Shutdown::Both);
    }
}

/// The `tcp` process group of one rank.
struct TcpCollective {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    /// `None` when `world_size` is 1.
    ring: Option<Ring>,
    /// Number of collectives started so far.
    seq: u64,
    /// The first failure, after which the group refuses work.
    broken: Option<String>,
}

/// Element range of chunk `i` when `n` elements are split into `parts` nearly equal chunks (the
/// first `n % parts` get one more).
fn chunk(n: usize, parts: usize, i: usize) -> Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Splits one buffer into a shared part to send and a disjoint mutable part to receive into.
fn send_and_recv<T>(buf: &mut [T], send: Range<usize>, recv: Range<usize>) -> (&[T], &mut [T]) {
    if send.start < recv.start {
        let (lo, hi) = buf.split_at_mut(recv.start);
        (&lo[send], &mut hi[..recv.end - recv.start])
    } else {
        let (lo, hi) = buf.split_at_mut(send.start);
        (&hi[..send.end - send.start], &mut lo[recv])
    }
}

impl TcpCollective {
    fn new(rank: usize, world_size: usize, timeout: Duration, ring: Option<Ring>) -> TcpCollective {
        TcpCollective { rank, world_size, timeout, ring, seq: 0, broken: None }
    }

    /// Starts a collective: refuses a broken group and numbers the call.
    fn begin(&mut self, op: Op, arg: u64, total: Option<u64>) -> Result<Call, DistError> {
        if let Some(first) = &self.broken {
            return Err(DistError::Broken { backend: "tcp", rank: self.rank, first: first.clone() });
        }
        self.seq += 1;
        Ok(Call { op, seq: self.seq, arg, total })
    }

    /// Ends a collective: a failure part-way leaves unread data in the sockets, so the group is
    /// closed for good.
    fn end<T>(&mut self, result: Result<T, DistError>) -> Result<T, DistError> {
        if let Err(e) = &result {
            self.broken = Some(e.to_string());
            if let Some(ring) = &self.ring {
                ring.shutdown();
            }
        }
        result
    }

    /// The ring and the pieces an exchange needs, or `None` for a world of one.
    fn parts(&mut self) -> Option<(&mut Ring, usize, usize, Duration)> {
        let (rank, world, timeout) = (self.rank, self.world_size, self.timeout);
        self.ring.as_mut().map(|ring| (ring, rank, world, timeout))
    }

    fn run_all_reduce(&mut self, call: &Call, data: &mut [f32]) -> Result<(), DistError> {
        let Some((ring, r, n, timeout)) = self.parts() else { return Ok(()) };
        let len = data.len();
        let mut scratch = vec![0f32; chunk(len, n, 0).len()];
        // Reduce-scatter: at step s rank r sends chunk r−s and adds chunk r−s−1 from rank r−1;
        // afterwards rank r holds the full sum of chunk r+1.
        for s in 0..n - 1 {
            let send = chunk(len, n, (r + n - s) % n);
            let recv = chunk(len, n, (r + 2 * n - s - 1) % n);
            let incoming = &mut scratch[..recv.len()];
            ring.exchange(
                r,
                timeout,
                call,
                Some(f32_bytes(&data[send])),
                Recv::Exact(f32_bytes_mut(incoming)),
            )?;
            for (acc, x) in data[recv].iter_mut().zip(incoming.iter()) {
                *acc += *x;
            }
        }
        // All-gather: pass the finished chunks around, copied verbatim.
        for s in 0..n - 1 {
            let send = chunk(len, n, (r + 1 + n - s) % n);
            let recv = chunk(len, n, (r + n - s) % n);
            let (out, into) = send_and_recv(data, send, recv);
            ring.exchange(r, timeout, call, Some(f32_bytes(out)), Recv::Exact(f32_bytes_mut(into)))?;
        }
        Ok(())
    }

    fn run_all_gather(&mut self, call: &Call, out: &mut [u8], block: usize) -> Result<(), DistError> {
        let Some((ring, r, n, timeout)) = self.parts() else { return Ok(()) };
        let blocks = n * block;
        for s in 0..n - 1 {
            let send = chunk(blocks, n, (r + n - s) % n);
            let recv = chunk(blocks, n, (r + 2 * n - s - 1) % n);
            let (from, into) = send_and_recv(out, send, recv);
            ring.exchange(r, timeout, call, Some(from), Recv::Exact(into))?;
        }
        Ok(())
    }

    /// Ring reduce-scatter without touching `input`: at step s rank r sends its partial sum of
    /// chunk r−s−1 and receives chunk r−s−2, adding its own input; it ends with chunk r.
    fn run_reduce_scatter(&mut self, call: &Call, input: &[f32], m: usize) -> Result<Vec<f32>, DistError> {
        let Some((ring, r, n, timeout)) = self.parts() else { return Ok(input.to_vec()) };
        let part = |c: usize| &input[c * m..(c + 1) * m];
        let mut outgoing = vec![0f32; m];
        let mut incoming = vec![0f32; m];
        for s in 0..n - 1 {
            let send: &[f32] = if s == 0 { part((r + n - 1) % n) } else { &outgoing };
            ring.exchange(
                r,
                timeout,
                call,
                Some(f32_bytes(send)),
                Recv::Exact(f32_bytes_mut(&mut incoming)),
            )?;
            for (acc, x) in incoming.iter_mut().zip(part((r + 2 * n - s - 2) % n)) {
                *acc += *x;
            }
            std::mem::swap(&mut outgoing, &mut incoming);
        }
        Ok(outgoing)
    }

    fn run_broadcast(&mut self, call: &Call, data: &mut [u8], root: usize) -> Result<(), DistError> {
        let Some((ring, r, n, timeout)) = self.parts() else { return Ok(()) };
        let len = data.len();
        let segments = len.div_ceil(BROADCAST_SEGMENT).max(1);
        let seg = |k: usize| chunk(len, segments, k);
        let hop = (r + n - root) % n;
        if hop == 0 {
            for k in 0..segments {
                ring.exchange(r, timeout, call, Some(&data[seg(k)]), Recv::Nothing)?;
            }
        } else if hop == n - 1 {
            for k in 0..segments {
                let range = seg(k);
                ring.exchange(r, timeout, call, None, Recv::Exact(&mut data[range]))?;
            }
        } else {
            // Forward segment k−1 while receiving segment k.
            for k in 0..=segments {
                match (k.checked_sub(1), k < segments) {
                    (Some(prev), true) => {
                        let (from, into) = send_and_recv(data, seg(prev), seg(k));
                        ring.exchange(r, timeout, call, Some(from), Recv::Exact(into))?;
                    }
                    (Some(prev), false) => {
                        ring.exchange(r, timeout, call, Some(&data[seg(prev)]), Recv::Nothing)?
                    }
                    (None, _) => {
                        let range = seg(k);
                        ring.exchange(r, timeout, call, None, Recv::Exact(&mut data[range]))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Ring all-gather of variable-length messages.
    fn run_gather_bytes(&mut self, call: &Call, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        let n = self.world_size;
        let mut blocks = vec![Vec::new(); n];
        blocks[self.rank] = bytes.to_vec();
        let Some((ring, r, n, timeout)) = self.parts() else { return Ok(blocks) };
        for s in 0..n - 1 {
            let send = (r + n - s) % n;
            let recv = (r + 2 * n - s - 1) % n;
            let mut into = std::mem::take(&mut blocks[recv]);
            ring.exchange(r, timeout, call, Some(&blocks[send]), Recv::Any(&mut into))?;
            blocks[recv] = into;
        }
        Ok(blocks)
    }
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<(), DistError> {
        let span = RawSpan::of("all_reduce_sum", "t", t, Some(Kind::Float))?;
        let call = self.begin(Op::AllReduceSum, 0, Some(span.len as u64))?;
        // SAFETY: `t` is borrowed mutably for the whole call and no other view is made.
        let data = unsafe { span.f32s_mut() };
        let result = self.run_all_reduce(&call, data);
        self.end(result)
    }

    fn all_gather(&mut self, input: &Tensor, output: &mut Tensor) -> Result<(), DistError> {
        let op = "all_gather";
        let inp = RawSpan::of(op, "input", input, None)?;
        let out = RawSpan::of(op, "output", output, Some(inp.kind))?;
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
        let call = self.begin(Op::AllGather, 0, Some(inp.len as u64))?;
        // The input may share memory with the output (a shard viewing its own slot): copy it
        // into this rank's slot with memmove semantics before any slice of the output exists.
        // SAFETY: the slot lies inside `output`, which has room for world_size × input bytes.
        unsafe { inp.copy_to(out.as_mut_ptr().add(self.rank * inp.len)) };
        // SAFETY: `output` is borrowed mutably; `input` is not read again.
        let data = unsafe { out.bytes_mut() };
        let result = self.run_all_gather(&call, data, inp.len);
        self.end(result)
    }

    fn reduce_scatter_sum(&mut self, input: &Tensor, output: &mut Tensor) -> Result<(), DistError> {
        let op = "reduce_scatter_sum";
        let inp = RawSpan::of(op, "input", input, Some(Kind::Float))?;
        let out = RawSpan::of(op, "output", output, Some(Kind::Float))?;
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
        let call = self.begin(Op::ReduceScatterSum, 0, Some(inp.len as u64))?;
        // SAFETY: no mutable view of `input` exists while this slice is alive (the output is
        // written only below, after the slice's last use).
        let data = unsafe { inp.f32s() };
        let result = self.run_reduce_scatter(&call, data, out.numel);
        let result = self.end(result)?;
        // SAFETY: `output` has room for `numel` f32s; the input slice is no longer used, and
        // `copy` tolerates an output that overlaps the input.
        unsafe { std::ptr::copy(result.as_ptr(), out.as_mut_ptr().cast::<f32>(), out.numel) };
        Ok(())
    }

    fn broadcast(&mut self, t: &mut Tensor, root: usize) -> Result<(), DistError> {
        let op = "broadcast";
        if root >= self.world_size {
            return Err(DistError::InvalidArgument {
                op,
                message: format!("root {root} is not a rank of a world of size {}", self.world_size),
            });
        }
        let span = RawSpan::of(op, "t", t, None)?;
        let call = self.begin(Op::Broadcast, root as u64, Some(span.len as u64))?;
        // SAFETY: `t` is borrowed mutably for the whole call and no other view is made.
        let data = unsafe { span.bytes_mut() };
        let result = self.run_broadcast(&call, data, root);
        self.end(result)
    }

    fn barrier(&mut self) -> Result<(), DistError> {
        // n−1 ring steps: the message rank r receives last left rank r+1 after it had heard,
        // transitively, from every other rank, so all of them have entered.
        let call = self.begin(Op::Barrier, 0, Some(0))?;
        let result = self.run_gather_bytes(&call, &[]).map(drop);
        self.end(result)
    }

    fn all_gather_bytes(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        let call = self.begin(Op::AllGatherBytes, 0, None)?;
        let result = self.run_gather_bytes(&call, bytes);
        self.end(result)
    }
}
