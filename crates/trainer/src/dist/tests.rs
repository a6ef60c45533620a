//! Tests of the store and the `tcp` backend with real sockets: every rank is a thread of the test
//! process, rank 0 hosts a real `c10d::TCPStore` on an ephemeral port.
//!
//! Timeouts are short where a test waits for one to fire and generous everywhere else; no test
//! asserts on elapsed time.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::Duration;

use tch::{Kind, Tensor};

use super::{Collective, DistError, Store, connect_tcp};

/// Long enough never to fire in a passing test.
const GENEROUS: Duration = Duration::from_secs(60);

/// Runs `body` on `world` ranks, one thread each, and returns their results in rank order.
fn run_world<R: Send>(
    world: usize,
    timeout: Duration,
    body: impl Fn(&Store, Box<dyn Collective>) -> R + Sync,
) -> Vec<R> {
    let server = Store::connect("127.0.0.1", 0, true, world, GENEROUS).expect("rank 0 hosts the store");
    let port = server.port();
    let mut server = Some(server);
    let body = &body;
    thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let hosted = if rank == 0 { server.take() } else { None };
                s.spawn(move || {
                    let store = hosted.unwrap_or_else(|| {
                        Store::connect("127.0.0.1", port, false, world, GENEROUS)
                            .expect("rank joins the store")
                    });
                    let c = connect_tcp(&store, rank, world, "127.0.0.1", timeout).expect("ring connects");
                    assert_eq!((c.rank(), c.world_size()), (rank, world));
                    body(&store, c)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
    })
}

/// Deterministic pseudo-random values: in [-1, 1), or integers in [-1000, 1000] (whose sums
/// are exact in f32).
fn values(seed: u64, n: usize, integers: bool) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if integers {
                ((x >> 40) % 2001) as f32 - 1000.0
            } else {
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            }
        })
        .collect()
}

fn seed(rank: usize, n: usize) -> u64 {
    (rank as u64 + 1) * 1_000_003 + n as u64
}

fn to_vec(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t).expect("f32 tensor to Vec")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_close(got: &[f32], expected: &[f64], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((*g as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()), "{what}: element {i} is {g}, expected {e}");
    }
}

#[test]
fn store_set_get_and_add_work_across_connections() {
    let server = Store::connect("127.0.0.1", 0, true, 2, GENEROUS).expect("host");
    assert_ne!(server.port(), 0, "port 0 asks for an ephemeral port, and the store reports it");
    let client = Store::connect("127.0.0.1", server.port(), false, 2, GENEROUS).expect("join");
    let setter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        client.set("late", b"value\0with nul").expect("set");
        client.set("empty", b"").expect("set empty");
        client.add("counter", 3).expect("add")
    });
    // `get` blocks until the other connection sets the key.
    assert_eq!(server.get("late").expect("get"), b"value\0with nul");
    assert_eq!(server.get("empty").expect("get empty"), b"");
    let after_client = setter.join().expect("setter thread");
    assert_eq!(after_client, 3);
    assert_eq!(server.add("counter", 2).expect("add"), 5);
}

#[test]
fn store_get_of_a_key_nobody_sets_times_out_naming_the_key() {
    let store = Store::connect("127.0.0.1", 0, true, 1, Duration::from_millis(300)).expect("host");
    let err = store.get("nobody/sets/this").expect_err("get must time out");
    let text = err.to_string();
    assert!(matches!(err, DistError::Store { op: "get", .. }), "{err:?}");
    assert!(text.contains("`nobody/sets/this`") && text.contains(store.addr()), "{text}");
}

#[test]
fn store_connect_to_a_port_nobody_listens_on_fails_naming_address_and_timeout() {
    let port = {
        let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe");
        probe.local_addr().expect("probe address").port()
    };
    let err =
        Store::connect("127.0.0.1", port, false, 2, Duration::from_secs(1)).expect_err("nobody listens");
    let text = err.to_string();
    assert!(matches!(err, DistError::StoreConnect { .. }), "{err:?}");
    assert!(
        text.starts_with(&format!("failed to reach the rendezvous store at 127.0.0.1:{port} within 1 s: ")),
        "{text}"
    );
    assert!(text.ends_with("is rank 0 running and is MASTER_ADDR/MASTER_PORT right?"), "{text}");
}

#[test]
fn store_client_started_before_rank_0_waits_for_it() {
    let port = {
        let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe");
        probe.local_addr().expect("probe address").port()
    };
    let early = thread::spawn(move || Store::connect("127.0.0.1", port, false, 2, GENEROUS));
    thread::sleep(Duration::from_millis(300));
    let server = Store::connect("127.0.0.1", port, true, 2, GENEROUS).expect("host on the chosen port");
    let client = early.join().expect("client thread").expect("the early client connects once rank 0 is up");
    client.set("hello", b"from the early rank").expect("set");
    assert_eq!(server.get("hello").expect("get"), b"from the early rank");
}

#[test]
fn store_host_on_a_busy_port_fails_naming_the_port() {
    let busy = TcpListener::bind("0.0.0.0:0").expect("occupy a port");
    let port = busy.local_addr().expect("busy address").port();
    let err = Store::connect("127.0.0.1", port, true, 2, Duration::from_secs(2)).expect_err("port is taken");
    assert!(matches!(err, DistError::StoreServe { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
}

/// Local addresses of the listening TCP sockets on `port`, from the kernel's tables, as
/// `(hex address, is IPv6)`.
fn listening_on(port: u16) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let table = std::fs::read_to_string(file).unwrap_or_default();
        for line in table.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (cols.get(1), cols.get(3)) else { continue };
            let Some((addr, p)) = local.split_once(':') else { continue };
            if *state == "0A" && u16::from_str_radix(p, 16) == Ok(port) {
                found.push((addr.to_string(), v6));
            }
        }
    }
    found
}

#[test]
fn the_store_listens_on_the_given_host_only() {
    let store = Store::connect("127.0.0.1", 0, true, 1, Duration::from_secs(5)).expect("host the store");
    let listening = listening_on(store.port());
    // 127.0.0.1 in /proc/net/tcp's little-endian hex; never the wildcard 0.0.0.0 or `::`.
    assert_eq!(listening, vec![("0100007F".to_string(), false)], "port {}", store.port());
}

#[test]
fn all_reduce_sum_is_the_sum_and_bit_identical_on_every_rank() {
    let sizes = [0usize, 1, 2, 3, 5, 7, 64, 1001, 300_007];
    for world in 1..=3 {
        let results = run_world(world, GENEROUS, |_, mut c| {
            sizes
                .iter()
                .map(|&n| {
                    let mut t = Tensor::from_slice(&values(seed(c.rank(), n), n, false));
                    c.all_reduce_sum(&mut t).expect("all_reduce_sum");
                    to_vec(&t)
                })
                .collect::<Vec<_>>()
        });
        for (i, &n) in sizes.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| values(seed(r, n), n, false)).collect();
            let expected: Vec<f64> = (0..n).map(|j| inputs.iter().map(|v| v[j] as f64).sum()).collect();
            assert_close(&results[0][i], &expected, &format!("world {world}, {n} elements"));
            for (r, result) in results.iter().enumerate() {
                assert_eq!(
                    bits(&result[i]),
                    bits(&results[0][i]),
                    "world {world}, {n} elements: rank {r} differs"
                );
            }
        }
    }
}

#[test]
fn large_all_reduce_of_integers_is_exact() {
    // 12 MB per rank: far more than socket buffers, so sends and receives interleave.
    let n = 3_000_001;
    let world = 3;
    let results = run_world(world, GENEROUS, |_, mut c| {
        let mut t = Tensor::from_slice(&values(seed(c.rank(), n), n, true));
        c.all_reduce_sum(&mut t).expect("all_reduce_sum");
        to_vec(&t)
    });
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| values(seed(r, n), n, true)).collect();
    let expected: Vec<f32> = (0..n).map(|j| inputs.iter().map(|v| v[j]).sum()).collect();
    for result in &results {
        assert!(result == &expected, "integer sums must be exact on every rank");
    }
}

#[test]
fn all_gather_concatenates_every_rank_in_rank_order() {
    for world in 1..=3 {
        for n in [0usize, 1, 4, 1001] {
            let results = run_world(world, GENEROUS, |_, mut c| {
                let input = Tensor::from_slice(&values(seed(c.rank(), n), n, false));
                let mut output =
                    Tensor::full([(world * n) as i64], f64::NAN, (Kind::Float, tch::Device::Cpu));
                c.all_gather(&input, &mut output).expect("all_gather");
                to_vec(&output)
            });
            let expected: Vec<f32> = (0..world).flat_map(|r| values(seed(r, n), n, false)).collect();
            for (r, result) in results.iter().enumerate() {
                assert_eq!(bits(result), bits(&expected), "world {world}, {n} elements, rank {r}");
            }
        }
    }
}

#[test]
fn all_gather_takes_other_kinds_and_an_input_that_is_its_own_output_slot() {
    let world = 3;
    let n = 5;
    let results = run_world(world, GENEROUS, |_, mut c| {
        let r = c.rank() as i64;
        let mut output = Tensor::zeros([world as i64 * n], (Kind::Int64, tch::Device::Cpu));
        // The shard is a view of this rank's slot, as in FSDP's flat parameters.
        let mut shard = output.narrow(0, r * n, n);
        shard
            .f_copy_(&(Tensor::arange(n, (Kind::Int64, tch::Device::Cpu)) + 100 * r))
            .expect("fill the shard");
        c.all_gather(&shard, &mut output).expect("all_gather");
        Vec::<i64>::try_from(&output).expect("i64 tensor to Vec")
    });
    let expected: Vec<i64> = (0..world as i64).flat_map(|r| (0..n).map(move |i| 100 * r + i)).collect();
    for result in results {
        assert_eq!(result, expected);
    }
}

#[test]
fn reduce_scatter_sum_gives_each_rank_its_chunk_of_the_sum() {
    for world in 1..=3 {
        for m in [0usize, 1, 3, 1000] {
            let results = run_world(world, GENEROUS, |_, mut c| {
                let input = Tensor::from_slice(&values(seed(c.rank(), m), world * m, false));
                let mut output = Tensor::full([m as i64], f64::NAN, (Kind::Float, tch::Device::Cpu));
                c.reduce_scatter_sum(&input, &mut output).expect("reduce_scatter_sum");
                to_vec(&output)
            });
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| values(seed(r, m), world * m, false)).collect();
            for (r, result) in results.iter().enumerate() {
                let expected: Vec<f64> =
                    (r * m..(r + 1) * m).map(|j| inputs.iter().map(|v| v[j] as f64).sum()).collect();
                assert_close(result, &expected, &format!("world {world}, chunk {m}, rank {r}"));
            }
        }
    }
}

#[test]
fn broadcast_copies_the_root_tensor_to_every_rank() {
    // 2.5 M floats = 10 MB: several forwarding segments.
    for world in 1..=3 {
        for root in 0..world {
            for n in [0usize, 5, 2_500_000] {
                let results = run_world(world, GENEROUS, |_, mut c| {
                    let mut t = Tensor::from_slice(&values(seed(c.rank(), n), n, false));
                    c.broadcast(&mut t, root).expect("broadcast");
                    to_vec(&t)
                });
                let expected = values(seed(root, n), n, false);
                for (r, result) in results.iter().enumerate() {
                    assert!(
                        bits(result) == bits(&expected),
                        "world {world}, root {root}, {n} elements: rank {r} differs"
                    );
                }
            }
        }
    }
}

#[test]
fn barrier_returns_only_after_every_rank_arrived() {
    for world in 1..=3 {
        let arrived: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        run_world(world, GENEROUS, |_, mut c| {
            for round in &arrived {
                // Late arrivals make an early exit from the barrier visible.
                thread::sleep(Duration::from_millis(20 * c.rank() as u64));
                round.fetch_add(1, Ordering::SeqCst);
                c.barrier().expect("barrier");
                assert_eq!(round.load(Ordering::SeqCst), world, "left the barrier before every rank arrived");
            }
        });
    }
}

#[test]
fn all_gather_bytes_returns_every_rank_message_in_rank_order() {
    for world in 1..=3 {
        let results = run_world(world, GENEROUS, |_, mut c| {
            let r = c.rank();
            let small = c.all_gather_bytes(&vec![r as u8; 3 * r]).expect("all_gather_bytes");
            let large = c.all_gather_bytes(&vec![r as u8 + 7; 100_000 + r]).expect("all_gather_bytes");
            (small, large)
        });
        for (small, large) in results {
            assert_eq!(small, (0..world).map(|r| vec![r as u8; 3 * r]).collect::<Vec<_>>());
            assert_eq!(large, (0..world).map(|r| vec![r as u8 + 7; 100_000 + r]).collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_second_group_on_the_same_store_gets_its_own_rendezvous() {
    let world = 3;
    let results = run_world(world, GENEROUS, |store, mut first| {
        let mut second =
            connect_tcp(store, first.rank(), world, "127.0.0.1", GENEROUS).expect("second group");
        let mut a = Tensor::from_slice(&[1f32]);
        let mut b = Tensor::from_slice(&[10f32, 20.0]);
        second.all_reduce_sum(&mut b).expect("second group all_reduce");
        first.all_reduce_sum(&mut a).expect("first group all_reduce");
        (to_vec(&a), to_vec(&b))
    });
    for (a, b) in results {
        assert_eq!((a, b), (vec![3.0], vec![30.0, 60.0]));
    }
}

#[test]
fn invalid_tensors_are_refused_before_anything_is_sent() {
    let results = run_world(2, GENEROUS, |_, mut c| {
        let mut double = Tensor::zeros([4], (Kind::Double, tch::Device::Cpu));
        let mut strided = Tensor::zeros([4, 4], (Kind::Float, tch::Device::Cpu)).transpose(0, 1);
        let input = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
        let mut short = Tensor::zeros([5], (Kind::Float, tch::Device::Cpu));
        let errors = [
            c.all_reduce_sum(&mut double).expect_err("f64"),
            c.all_reduce_sum(&mut strided).expect_err("non-contiguous"),
            c.all_gather(&input, &mut short).expect_err("wrong output size"),
            c.reduce_scatter_sum(&short, &mut double).expect_err("wrong kind"),
            c.broadcast(&mut short, 2).expect_err("root out of range"),
        ];
        // Nothing was sent, so the group still works.
        let mut t = Tensor::from_slice(&[1f32, 2.0]);
        c.all_reduce_sum(&mut t).expect("all_reduce after refusals");
        (errors.map(|e| e.to_string()), to_vec(&t))
    });
    for (errors, sum) in results {
        assert!(errors.iter().all(|e| e.starts_with("invalid arguments to ")), "{errors:?}");
        assert!(errors[0].contains("Float") && errors[0].contains("Double"), "{}", errors[0]);
        assert!(errors[1].contains("contiguous"), "{}", errors[1]);
        assert!(errors[2].contains("expected world size 2 × `input`'s 3 = 6"), "{}", errors[2]);
        assert!(errors[4].contains("root 2"), "{}", errors[4]);
        assert_eq!(sum, vec![2.0, 4.0]);
    }
}

#[test]
fn unreachable_bind_host_is_refused() {
    let store = Store::connect("127.0.0.1", 0, true, 2, GENEROUS).expect("host");
    let err = connect_tcp(&store, 0, 2, "0.0.0.0", GENEROUS).err().expect("0.0.0.0 cannot be published");
    assert!(err.to_string().contains("`0.0.0.0` is not an address other ranks can connect to"), "{err}");
}

fn is_peer_closed(e: &DistError) -> bool {
    matches!(e, DistError::PeerClosed { .. })
        && e.to_string().starts_with("Connection closed by peer [127.0.0.1]:")
}

#[test]
fn a_peer_that_drops_its_connections_is_reported_as_connection_closed_by_peer() {
    let results = run_world(2, GENEROUS, |_, mut c| {
        if c.rank() == 1 {
            drop(c);
            return None;
        }
        let mut t = Tensor::from_slice(&[1f32; 1000]);
        let first = c.all_reduce_sum(&mut t).expect_err("peer is gone");
        let later = c.barrier().expect_err("group is broken");
        Some((first, later))
    });
    let Some((first, later)) = &results[0] else { panic!("rank 0 returns its errors") };
    assert!(is_peer_closed(first), "{first}");
    assert!(matches!(first, DistError::PeerClosed { peer: 1, .. }), "{first:?}");
    assert!(matches!(later, DistError::Broken { rank: 0, .. }), "{later:?}");
    assert!(later.to_string().contains("Connection closed by peer"), "{later}");
}

#[test]
fn when_one_rank_of_three_dies_every_survivor_learns_it_from_a_closed_connection() {
    let results = run_world(3, GENEROUS, |_, mut c| {
        if c.rank() == 2 {
            drop(c);
            return None;
        }
        let mut t = Tensor::from_slice(&[1f32; 100_000]);
        Some(c.all_reduce_sum(&mut t).expect_err("rank 2 is gone"))
    });
    for err in results.iter().take(2) {
        let err = err.as_ref().expect("survivors return their error");
        assert!(is_peer_closed(err), "{err}");
    }
}

#[test]
fn a_peer_that_never_sends_times_out_with_gloo_wording() {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let done_tx = Mutex::new(done_tx);
    let done_rx = Mutex::new(done_rx);
    let results = run_world(2, Duration::from_millis(300), |_, mut c| {
        if c.rank() == 1 {
            // Stall (holding the connections open) until rank 0 has seen its timeout.
            let rx = done_rx.lock().expect("receiver lock");
            let _ = rx.recv_timeout(GENEROUS);
            return None;
        }
        let mut t = Tensor::from_slice(&[1f32; 10]);
        let err = c.all_reduce_sum(&mut t).expect_err("rank 1 never sends");
        let _ = done_tx.lock().expect("sender lock").send(());
        Some(err)
    });
    let err = results[0].as_ref().expect("rank 0 returns its error");
    assert!(err.to_string().starts_with("Timed out waiting 300ms for recv operation to complete ("), "{err}");
    assert!(matches!(err, DistError::Timeout { peer: 1, .. }), "{err:?}");
}

/// Each rank's error or its absence; at least one rank must see `want`, and the other may see
/// the first one's shutdown instead.
fn assert_one_reports(results: &[Result<(), DistError>], want: &str) {
    assert!(results.iter().any(|r| matches!(r, Err(e) if e.to_string().contains(want))), "{results:?}");
    for r in results {
        let e = r.as_ref().expect_err("every rank fails");
        assert!(e.to_string().contains(want) || is_peer_closed(e), "{e}");
    }
}

#[test]
fn ranks_with_different_tensor_sizes_get_a_mismatch_naming_both_sizes() {
    let results = run_world(2, GENEROUS, |_, mut c| {
        let n = if c.rank() == 0 { 10 } else { 12 };
        let mut t = Tensor::zeros([n], (Kind::Float, tch::Device::Cpu));
        c.all_reduce_sum(&mut t)
    });
    assert_one_reports(&results, "disagree about the tensor size");
    let text = format!("{results:?}");
    assert!(text.contains("40 bytes") || text.contains("48 bytes"), "{text}");
}

#[test]
fn ranks_running_different_collectives_are_reported_out_of_step() {
    let results = run_world(2, GENEROUS, |_, mut c| {
        if c.rank() == 0 {
            c.barrier()
        } else {
            let mut t = Tensor::zeros([4], (Kind::Float, tch::Device::Cpu));
            c.all_reduce_sum(&mut t)
        }
    });
    assert_one_reports(&results, "the ranks are out of step");
}

#[test]
fn auto_resolves_to_nccl_on_cuda_and_tcp_elsewhere_explicit_choices_stay() {
    use super::{Backend, resolve};
    use crate::scenario::Backend as Requested;
    use tch::Device;
    assert_eq!(resolve(Requested::Auto, Device::Cuda(0)), Backend::Nccl);
    assert_eq!(resolve(Requested::Auto, Device::Cuda(3)), Backend::Nccl);
    assert_eq!(resolve(Requested::Auto, Device::Cpu), Backend::Tcp);
    assert_eq!(resolve(Requested::Tcp, Device::Cuda(0)), Backend::Tcp);
    assert_eq!(resolve(Requested::Nccl, Device::Cpu), Backend::Nccl);
    assert_eq!(resolve(Requested::Tcp, Device::Cpu), Backend::Tcp);
}
