//! Both ends of each protocol driven on a virtual clock through a lossy, reordering,
//! duplicating network (in the spirit of quinn-proto's `Pair` harness). This file holds the
//! harness; `transfer.rs` and `store.rs` the tests of each protocol.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sglrs_radix_cache::PageHash;

use super::*;
use sglrs_radix_cache::{KvDtype, KvLayout};

fn small_layout() -> KvLayout {
    KvLayout {
        num_layers: 2,
        num_kv_heads: 1,
        head_dim: 4,
        page_size: 2,
        dtype: KvDtype::F16,
    }
}

fn page(layout: &KvLayout, seed: u32) -> Bytes {
    (0..layout.page_bytes())
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(seed.wrapping_mul(7919)) as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

fn cfg() -> Config {
    Config {
        retransmit_timeout: Duration::from_millis(200),
        batch_pages: 4,
        ..Config::default()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum To {
    Sender,
    Receiver,
}

/// A virtual network: each message is delivered after a latency, maybe dropped, maybe
/// duplicated, maybe delayed past later ones.
struct Net {
    rng: StdRng,
    loss: f64,
    dup: f64,
    jitter_ms: u64,
    queue: Vec<(Instant, u64, To, Message)>,
    seq: u64,
}

impl Net {
    fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            loss: 0.0,
            dup: 0.0,
            jitter_ms: 0,
            queue: Vec::new(),
            seq: 0,
        }
    }
    fn send(&mut self, now: Instant, to: To, m: Message) {
        if self.rng.random::<f64>() < self.loss {
            return;
        }
        let m = self.split_pages(m);
        let copies = if self.rng.random::<f64>() < self.dup {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let jitter = if self.jitter_ms > 0 {
                self.rng.random_range(0..self.jitter_ms)
            } else {
                0
            };
            let at = now + Duration::from_millis(1 + jitter);
            self.seq += 1;
            self.queue.push((at, self.seq, to, m.clone()));
        }
    }
    /// Delivers every other page in random pieces, as the QUIC driver does.
    fn split_pages(&mut self, m: Message) -> Message {
        let Message::Pages { room, first, pages } = m else {
            return m;
        };
        let pages = pages
            .into_iter()
            .map(|p| {
                let b = p.to_bytes();
                if b.len() < 2 || self.rng.random::<bool>() {
                    return p;
                }
                let mut cuts: Vec<usize> = (0..self.rng.random_range(1..4))
                    .map(|_| self.rng.random_range(1..b.len()))
                    .collect();
                cuts.sort_unstable();
                let mut at = 0;
                let mut pieces = Vec::new();
                for c in cuts.into_iter().chain([b.len()]) {
                    pieces.push(b.slice(at..c));
                    at = c;
                }
                Page::from_chunks(pieces)
            })
            .collect();
        Message::Pages { room, first, pages }
    }

    fn next_at(&self) -> Option<Instant> {
        self.queue.iter().map(|q| q.0).min()
    }
    fn due(&mut self, now: Instant) -> Vec<(To, Message)> {
        self.queue.sort_by_key(|q| (q.0, q.1));
        let n = self.queue.iter().take_while(|q| q.0 <= now).count();
        self.queue.drain(..n).map(|q| (q.2, q.3)).collect()
    }
}

struct Pair {
    start: Instant,
    now: Instant,
    sender: TransferSender,
    receiver: TransferReceiver,
    net: Net,
    sender_alive: bool,
    receiver_alive: bool,
    /// Corrupts a message on its way (for checksum tests).
    tamper: Option<Box<dyn FnMut(Message) -> Message>>,
    s_events: Vec<SenderEvent>,
    r_events: Vec<ReceiverEvent>,
    /// Destination page id → bytes, as the receiver reported them.
    written: HashMap<u32, Page>,
    /// `Some`: the sender's pages come unhashed and the "driver" reports their checksums
    /// one flush later (as the QUIC page writers do, after a while); these wait.
    driver_sums: Option<Vec<(RoomId, u32, u64)>>,
}

impl Pair {
    fn new(
        seed: u64,
        cfg: Config,
        s_layout: KvLayout,
        r_layout: KvLayout,
        s_secret: &[u8],
        r_secret: &[u8],
    ) -> Self {
        let now = Instant::now();
        Self {
            start: now,
            now,
            sender: TransferSender::new(cfg.clone(), s_layout, AuthKey::new(s_secret), now),
            receiver: TransferReceiver::new(cfg, r_layout, &AuthKey::new(r_secret), now),
            net: Net::new(seed),
            sender_alive: true,
            receiver_alive: true,
            tamper: None,
            s_events: Vec::new(),
            r_events: Vec::new(),
            written: HashMap::new(),
            driver_sums: None,
        }
    }

    fn default_pair(seed: u64) -> Self {
        Self::new(
            seed,
            cfg(),
            small_layout(),
            small_layout(),
            b"secret",
            b"secret",
        )
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Moves every queued message into the network and collects events.
    fn flush(&mut self) {
        if self.sender_alive {
            let late = self.driver_sums.as_mut().map(std::mem::take);
            for (room, i, sum) in late.into_iter().flatten() {
                self.sender.record_checksum(room, i, sum);
            }
            while let Some(m) = match self.driver_sums {
                None => self
                    .sender
                    .poll_transmit_control()
                    .or_else(|| self.sender.poll_transmit_data()),
                Some(_) => self
                    .sender
                    .poll_transmit_control()
                    .or_else(|| self.sender.poll_transmit_data_unhashed()),
            } {
                if let (Some(sums), Message::Pages { room, first, pages }) =
                    (&mut self.driver_sums, &m)
                {
                    for (i, p) in pages.iter().enumerate() {
                        sums.push((*room, first + i as u32, p.checksum()));
                    }
                }
                let m = match &mut self.tamper {
                    Some(t) => t(m),
                    None => m,
                };
                self.net.send(self.now, To::Receiver, m);
            }
            while let Some(e) = self.sender.poll_event() {
                if let SenderEvent::RoomRegistered { .. } = e {}
                self.s_events.push(e);
            }
        }
        if self.receiver_alive {
            while let Some(m) = self.receiver.poll_transmit_control() {
                self.net.send(self.now, To::Sender, m);
            }
            while let Some(e) = self.receiver.poll_event() {
                if let ReceiverEvent::Pages {
                    dst_pages, pages, ..
                } = &e
                {
                    for (d, p) in dst_pages.iter().zip(pages) {
                        assert!(
                            self.written.insert(*d, p.clone()).is_none(),
                            "page {d} reported twice"
                        );
                    }
                }
                self.r_events.push(e);
            }
        }
    }

    /// One step of virtual time: to the next delivery or timer.
    fn step(&mut self) -> bool {
        self.flush();
        let mut next = self.net.next_at();
        if self.sender_alive {
            next = [next, self.sender.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
        }
        if self.receiver_alive {
            next = [next, self.receiver.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
        }
        let Some(next) = next else { return false };
        self.now = self.now.max(next);
        for (to, m) in self.net.due(self.now) {
            match to {
                To::Sender if self.sender_alive => self.sender.handle_message(m, self.now),
                To::Receiver if self.receiver_alive => self.receiver.handle_message(m, self.now),
                _ => {}
            }
        }
        if self.sender_alive && self.sender.poll_timeout().is_some_and(|t| t <= self.now) {
            self.sender.handle_timeout(self.now);
        }
        if self.receiver_alive && self.receiver.poll_timeout().is_some_and(|t| t <= self.now) {
            self.receiver.handle_timeout(self.now);
        }
        self.flush();
        true
    }

    fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Pair) -> bool) -> bool {
        while self.elapsed() < limit {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    fn registered(&self, room: RoomId) -> bool {
        self.s_events
            .iter()
            .any(|e| matches!(e, SenderEvent::RoomRegistered { room: r, .. } if *r == room))
    }

    fn connect(&mut self) {
        assert!(self.run_until(Duration::from_secs(30), |p| p
            .s_events
            .contains(&SenderEvent::Connected)
            && p.r_events.contains(&ReceiverEvent::Connected)));
    }

    /// Registers `room` with `n` pages at destinations 1000+i, waits for the sender to see
    /// it, submits the pages and returns them.
    fn start_room(&mut self, room: RoomId, n: u32) -> Vec<Bytes> {
        let layout = small_layout();
        let dst: Vec<u32> = (0..n).map(|i| 1000 + i).collect();
        self.receiver.register(room, dst, self.now).unwrap();
        assert!(
            self.run_until(Duration::from_secs(30), |p| p.registered(room)),
            "room never registered"
        );
        let pages: Vec<Bytes> = (0..n)
            .map(|i| page(&layout, i + room.0 as u32 * 1000))
            .collect();
        let aux = AuxData {
            first_token: 42,
            first_logprob: -0.25,
            top_logprobs: vec![(42, -0.25), (7, -3.0)],
            extra: bytes::Bytes::from_static(b"x"),
        };
        self.sender
            .submit(room, pages.clone(), aux, self.now)
            .unwrap();
        pages
    }

    fn room_done(&self, room: RoomId) -> bool {
        self.s_events.contains(&SenderEvent::RoomDone { room })
            && self.r_events.contains(&ReceiverEvent::RoomDone { room })
    }

    fn check_pages(&self, pages: &[Bytes]) {
        assert_eq!(self.written.len(), pages.len());
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(&self.written[&(1000 + i as u32)], p, "page {i} differs");
        }
    }

    fn assert_nothing_held(&self) {
        assert_eq!(self.sender.held_pages(), 0);
        assert_eq!(self.sender.open_rooms(), 0);
        assert_eq!(self.receiver.open_rooms(), 0);
    }
}

/// A default pair over a network with this loss, duplication and jitter (not yet connected).
fn pair_on_net(seed: u64, loss: f64, dup: f64, jitter_ms: u64) -> Pair {
    let mut p = Pair::default_pair(seed);
    p.net.loss = loss;
    p.net.dup = dup;
    p.net.jitter_ms = jitter_ms;
    p
}

fn transfer_with(seed: u64, loss: f64, dup: f64, jitter_ms: u64) -> Pair {
    let mut p = pair_on_net(seed, loss, dup, jitter_ms);
    p.connect();
    let room = RoomId(7);
    let pages = p.start_room(room, 37);
    assert!(
        p.run_until(Duration::from_secs(60), |p| p.room_done(room)),
        "room did not complete: {:?} / {:?}",
        p.s_events,
        p.r_events
    );
    p.check_pages(&pages);
    assert!(p
        .r_events
        .iter()
        .any(|e| matches!(e, ReceiverEvent::Aux { aux, .. } if aux.first_token == 42)));
    p.assert_nothing_held();
    p
}

mod store;
mod transfer;
