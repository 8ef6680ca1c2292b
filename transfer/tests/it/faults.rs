//! Transfers through a faulty UDP relay on loopback: real sockets on both ends, and between
//! them a relay that drops, duplicates and delays datagrams (a delay longer than the gap to
//! the next datagram reorders them), from a fixed seed, in both directions — or stops
//! forwarding altogether for a while, as a peer stopped with SIGSTOP or behind a dead link
//! would look from the other end.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sglrs_transfer::proto::{AuxData, RoomId, TransferError};
use sglrs_transfer::quic::{KvReceiver, KvSender, QuicConfig, QuicError, RoomEvent};
use sglrs_transfer::KvLayout;
use tokio::net::UdpSocket;

use crate::common::*;

/// What the relay does to each datagram.
#[derive(Clone, Copy, Debug)]
struct Faults {
    drop: f64,
    duplicate: f64,
    /// Each datagram waits 0..=max_delay_ms before it is sent on.
    max_delay_ms: u64,
    seed: u64,
}

#[derive(Default, Debug)]
struct Counts {
    forwarded: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    delayed: AtomicU64,
    /// Dropped while stalled.
    stalled: AtomicU64,
}

/// A two-way UDP relay: the client talks to `addr`, the relay talks to `target`.
struct Relay {
    addr: SocketAddr,
    stall: Arc<AtomicBool>,
    counts: Arc<Counts>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Sends `data` to `to` on `sock` through the faults (drop, duplicate, delay).
fn forward(
    sock: &Arc<UdpSocket>,
    to: SocketAddr,
    data: Vec<u8>,
    f: &Faults,
    rng: &Mutex<StdRng>,
    counts: &Arc<Counts>,
) {
    let (dropped, copies, delays) = {
        let mut r = rng.lock().unwrap();
        let dropped = r.random_bool(f.drop);
        let copies = if r.random_bool(f.duplicate) { 2 } else { 1 };
        let delays: Vec<u64> = (0..copies)
            .map(|_| r.random_range(0..=f.max_delay_ms))
            .collect();
        (dropped, copies, delays)
    };
    if dropped {
        counts.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if copies > 1 {
        counts.duplicated.fetch_add(1, Ordering::Relaxed);
    }
    for d in delays {
        counts.forwarded.fetch_add(1, Ordering::Relaxed);
        let (sock, data) = (sock.clone(), data.clone());
        if d == 0 {
            let _ = sock.try_send_to(&data, to);
            continue;
        }
        counts.delayed.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(d)).await;
            let _ = sock.send_to(&data, to).await;
        });
    }
}

async fn relay(target: SocketAddr, f: Faults) -> Relay {
    let front = Arc::new(UdpSocket::bind(any_port()).await.unwrap());
    let back = Arc::new(UdpSocket::bind(any_port()).await.unwrap());
    let addr = front.local_addr().unwrap();
    let stall = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let mut tasks = Vec::new();
    for dir in 0..2u64 {
        let (from, to_sock) = if dir == 0 {
            (front.clone(), back.clone())
        } else {
            (back.clone(), front.clone())
        };
        let (stall, counts, client) = (stall.clone(), counts.clone(), client.clone());
        let rng = Mutex::new(StdRng::seed_from_u64(f.seed.wrapping_add(dir)));
        tasks.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            loop {
                let Ok((n, peer)) = from.recv_from(&mut buf).await else {
                    return;
                };
                let to = if dir == 0 {
                    *client.lock().unwrap() = Some(peer);
                    target
                } else {
                    match *client.lock().unwrap() {
                        Some(c) => c,
                        None => continue,
                    }
                };
                if stall.load(Ordering::Relaxed) {
                    counts.stalled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                forward(&to_sock, to, buf[..n].to_vec(), &f, &rng, &counts);
            }
        }));
    }
    Relay {
        addr,
        stall,
        counts,
        tasks,
    }
}

/// A WAN-like configuration: 1,200-byte datagrams (no path MTU probing through the relay),
/// the protocol's default timeouts (5 s idle, a heartbeat every second). The other tests'
/// 2 s idle timeout is shorter than QUIC's own recovery from a lossy burst: after several
/// probe timeouts in a row its retransmissions back off exponentially.
fn wan_config() -> QuicConfig {
    QuicConfig {
        mtu: 1200,
        mtu_discovery: false,
        gso: false,
        send_window: 4 << 20,
        congestion: sglrs_transfer::quic::Congestion::Cubic { initial_window: 0 },
        ..QuicConfig::default()
    }
}

/// Moves `n` pages from a sender to a receiver that reaches it through `relay_faults`;
/// returns the receiver's verdict, the sender's result and the relay's counts. `stall`:
/// (after this many received pages, for this long) the relay forwards nothing.
async fn transfer_through(
    n: u64,
    faults: Faults,
    stall: Option<(usize, Duration)>,
) -> (
    Result<(), TransferError>,
    Result<(), QuicError>,
    Arc<Counts>,
    Arc<KvSender>,
) {
    let layout = KvLayout::smollm2_135m();
    let sec = security(b"faulty path");
    let sender = Arc::new(KvSender::bind(any_port(), layout, &sec, wan_config()).unwrap());
    let receiver = KvReceiver::bind(any_port(), layout, &sec, wan_config()).unwrap();
    let relay = relay(sender.local_addr().unwrap(), faults).await;
    let pages: Vec<Bytes> = (0..n)
        .map(|i| Bytes::from(page_bytes(layout.page_bytes(), i)))
        .collect();
    let expect = pages.clone();
    let room = RoomId(4242);
    let dst: Vec<u32> = (0..n as u32).map(|i| 100 + i).collect();
    let mut stream = receiver.register(relay.addr, room, dst).await.unwrap();
    let aux = AuxData {
        first_token: 17,
        first_logprob: -0.5,
        ..AuxData::default()
    };
    let send = {
        let sender = sender.clone();
        tokio::spawn(async move { sender.send(room, pages, aux).await.map(|_| ()) })
    };
    let mut seen = vec![false; n as usize];
    let mut got_aux = false;
    let mut slot = vec![0u8; layout.page_bytes()];
    let mut received = 0usize;
    let verdict = loop {
        match stream.next().await {
            Some(RoomEvent::Pages { dst_pages, pages }) => {
                for (d, p) in dst_pages.iter().zip(&pages) {
                    let i = (*d - 100) as usize;
                    assert!(!seen[i], "page {i} delivered twice");
                    seen[i] = true;
                    slot.fill(0);
                    p.copy_to(&mut slot);
                    assert!(slot[..] == expect[i][..], "page {i} differs");
                    received += 1;
                }
                if let Some((after, pause)) = stall {
                    if received >= after && !relay.stall.swap(true, Ordering::Relaxed) {
                        let flag = relay.stall.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(pause).await;
                            flag.store(false, Ordering::Relaxed);
                        });
                    }
                }
            }
            Some(RoomEvent::Aux(a)) => {
                assert_eq!((a.first_token, a.first_logprob), (17, -0.5));
                got_aux = true;
            }
            Some(RoomEvent::Done) => {
                assert!(seen.iter().all(|s| *s), "done with pages missing");
                assert!(got_aux, "done without the aux data");
                break Ok(());
            }
            Some(RoomEvent::Failed(e)) => break Err(e),
            None => break Err(TransferError::ConnectionLost("stream ended".into())),
        }
    };
    let sent = send.await.unwrap();
    let counts = relay.counts.clone();
    (verdict, sent, counts, sender)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_cross_a_lossy_duplicating_reordering_path_bit_identical() {
    let t0 = Instant::now();
    let faults = Faults {
        drop: 0.03,
        duplicate: 0.03,
        max_delay_ms: 8,
        seed: 0x5eed,
    };
    let (verdict, sent, c, sender) =
        tokio::time::timeout(Duration::from_secs(120), transfer_through(8, faults, None))
            .await
            .expect("the transfer is bounded");
    verdict.unwrap();
    sent.unwrap();
    assert_eq!(sender.held_pages(), 0);
    let (fw, dr, du, de) = (
        c.forwarded.load(Ordering::Relaxed),
        c.dropped.load(Ordering::Relaxed),
        c.duplicated.load(Ordering::Relaxed),
        c.delayed.load(Ordering::Relaxed),
    );
    eprintln!(
        "8 pages ({:.1} MB) in {:.2} s through the relay: {fw} datagrams forwarded, \
         {dr} dropped, {du} duplicated, {de} delayed (0-8 ms, reordering)",
        8.0 * KvLayout::smollm2_135m().page_bytes() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    // The faults happened (thousands of datagrams at 3%).
    assert!(dr > 20 && du > 20 && de > 500, "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_for_less_than_the_idle_timeout_is_waited_for() {
    let faults = Faults {
        drop: 0.0,
        duplicate: 0.0,
        max_delay_ms: 0,
        seed: 1,
    };
    // 1 s of silence; the idle timeout is 2 s, with heartbeats every 300 ms.
    let (verdict, sent, c, sender) = tokio::time::timeout(
        Duration::from_secs(60),
        transfer_through(16, faults, Some((4, Duration::from_secs(1)))),
    )
    .await
    .expect("the transfer is bounded");
    verdict.unwrap();
    sent.unwrap();
    assert!(c.stalled.load(Ordering::Relaxed) > 0, "{c:?}");
    assert_eq!(sender.held_pages(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_silent_past_the_idle_timeout_fails_both_ends_and_frees_the_pages() {
    let faults = Faults {
        drop: 0.0,
        duplicate: 0.0,
        max_delay_ms: 0,
        seed: 2,
    };
    let t0 = Instant::now();
    let (verdict, sent, _, sender) = tokio::time::timeout(
        Duration::from_secs(60),
        transfer_through(16, faults, Some((4, Duration::from_secs(30)))),
    )
    .await
    .expect("both ends give up on their own");
    let waited = t0.elapsed();
    let e = verdict.unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::PeerTimeout(_) | TransferError::ConnectionLost(_)
        ),
        "{e:?}"
    );
    let e = sent.unwrap_err();
    assert!(
        matches!(
            e,
            QuicError::Transfer(
                TransferError::PeerTimeout(_)
                    | TransferError::ConnectionLost(_)
                    | TransferError::Local(_)
            )
        ),
        "{e:?}"
    );
    assert_eq!(sender.held_pages(), 0);
    // Within the idle timeout (2 s) and some slack, not the 30 s of the stall.
    assert!(waited < Duration::from_secs(15), "{waited:?}");
}
