//! Both ends of each protocol driven on a virtual clock through a lossy, reordering,
//! duplicating network (in the spirit of quinn-proto's `Pair` harness).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sglrs_radix_cache::PageHash;

use super::*;
use crate::layout::{KvDtype, KvLayout};

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
    written: HashMap<u32, Bytes>,
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
            while let Some(m) = self
                .sender
                .poll_transmit_control()
                .or_else(|| self.sender.poll_transmit_data())
            {
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

fn transfer_with(seed: u64, loss: f64, dup: f64, jitter_ms: u64) -> Pair {
    let mut p = Pair::default_pair(seed);
    p.net.loss = loss;
    p.net.dup = dup;
    p.net.jitter_ms = jitter_ms;
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

#[test]
fn clean_transfer_completes() {
    let p = transfer_with(1, 0.0, 0.0, 0);
    assert!(
        p.elapsed() < Duration::from_millis(100),
        "no retransmission needed: {:?}",
        p.elapsed()
    );
}

#[test]
fn transfer_survives_loss() {
    for seed in 0..20 {
        transfer_with(seed, 0.2, 0.0, 0);
    }
}

#[test]
fn transfer_survives_reordering() {
    for seed in 0..20 {
        transfer_with(seed, 0.0, 0.0, 50);
    }
}

#[test]
fn transfer_survives_duplicates() {
    for seed in 0..20 {
        transfer_with(seed, 0.0, 0.5, 0);
    }
}

#[test]
fn transfer_survives_loss_reordering_and_duplicates_together() {
    for seed in 0..20 {
        transfer_with(seed, 0.15, 0.3, 30);
    }
}

#[test]
fn many_rooms_interleave() {
    let mut p = Pair::default_pair(3);
    p.net.jitter_ms = 5;
    p.connect();
    let layout = small_layout();
    for r in 0..10u32 {
        let dst: Vec<u32> = (0..5).map(|i| r * 100 + i).collect();
        p.receiver.register(RoomId(r as u64), dst, p.now).unwrap();
    }
    assert!(p.run_until(Duration::from_secs(5), |p| (0..10)
        .all(|r| p.registered(RoomId(r)))));
    for r in 0..10u32 {
        let pages = (0..5).map(|i| page(&layout, r * 100 + i)).collect();
        p.sender
            .submit(RoomId(r as u64), pages, AuxData::default(), p.now)
            .unwrap();
    }
    assert!(p.run_until(Duration::from_secs(5), |p| (0..10)
        .all(|r| p.room_done(RoomId(r)))));
    for r in 0..10u32 {
        for i in 0..5 {
            assert_eq!(p.written[&(r * 100 + i)], page(&layout, r * 100 + i));
        }
    }
    p.assert_nothing_held();
}

#[test]
fn receiver_vanishing_mid_transfer_fails_sender_within_idle_timeout() {
    let mut p = Pair::default_pair(4);
    p.net.jitter_ms = 100;
    p.connect();
    let room = RoomId(1);
    p.start_room(room, 40);
    // A few steps of transfer, then the decode host disappears.
    for _ in 0..3 {
        p.step();
    }
    assert!(p.sender.held_pages() > 0);
    p.receiver_alive = false;
    let t0 = p.now;
    let idle = cfg().idle_timeout;
    assert!(p.run_until(Duration::from_secs(60), |p| p.sender.is_closed()));
    // Messages already in flight (up to 100 ms of jitter) still arrive after the peer died.
    assert!(
        p.now - t0 <= idle + Duration::from_millis(110),
        "took {:?}",
        p.now - t0
    );
    // The room fails first (its retransmissions run out), or with the connection.
    assert!(p.s_events.iter().any(|e| matches!(e, SenderEvent::RoomFailed { room: r, error: TransferError::PeerTimeout(_) | TransferError::Local(AbortReason::Timeout) } if *r == room)));
    assert!(p.s_events.contains(&SenderEvent::Closed {
        error: TransferError::PeerTimeout(idle)
    }));
    assert_eq!(p.sender.held_pages(), 0);
    assert_eq!(p.sender.queued(), 0);
    assert_eq!(p.sender.poll_timeout(), None);
}

#[test]
fn sender_vanishing_mid_transfer_fails_receiver_within_idle_timeout() {
    let mut p = Pair::default_pair(5);
    p.net.jitter_ms = 100;
    p.connect();
    let room = RoomId(1);
    p.start_room(room, 40);
    for _ in 0..3 {
        p.step();
    }
    // The prefill host dies with its unsent packets.
    p.sender_alive = false;
    p.net.queue.retain(|q| q.2 != To::Receiver);
    assert!(p.receiver.open_rooms() == 1);
    let t0 = p.now;
    let idle = cfg().idle_timeout;
    assert!(p.run_until(Duration::from_secs(60), |p| p.receiver.is_closed()));
    assert!(
        p.now - t0 <= idle + Duration::from_millis(110),
        "took {:?}",
        p.now - t0
    );
    assert!(p.r_events.iter().any(|e| matches!(e, ReceiverEvent::RoomFailed { room: r, error: TransferError::PeerTimeout(_) | TransferError::Local(AbortReason::Timeout) } if *r == room)), "{:?}", &p.r_events[p.r_events.len() - 2..]);
    assert!(
        p.r_events.contains(&ReceiverEvent::Closed {
            error: TransferError::PeerTimeout(idle)
        }),
        "{:?}",
        &p.r_events[p.r_events.len() - 2..]
    );
    assert_eq!(p.receiver.open_rooms(), 0);
    assert_eq!(p.receiver.poll_timeout(), None);
}

#[test]
fn heartbeats_keep_an_idle_connection_alive() {
    let mut p = Pair::default_pair(6);
    p.connect();
    p.run_until(Duration::from_secs(60), |_| false);
    assert!(!p.sender.is_closed() && !p.receiver.is_closed());
}

#[test]
fn corrupted_page_fails_the_checksum_on_both_sides() {
    let mut p = Pair::default_pair(7);
    let mut hit = false;
    p.tamper = Some(Box::new(move |m| match m {
        Message::Pages {
            room,
            first,
            mut pages,
        } if !hit => {
            hit = true;
            let mut v = pages[0].to_vec();
            v[3] ^= 0x40;
            pages[0] = v.into();
            Message::Pages { room, first, pages }
        }
        m => m,
    }));
    p.connect();
    let room = RoomId(9);
    p.start_room(room, 10);
    assert!(p.run_until(Duration::from_secs(30), |p| p
        .s_events
        .iter()
        .any(|e| matches!(e, SenderEvent::RoomFailed { .. }))));
    assert!(p.r_events.iter().any(|e| matches!(e,
        ReceiverEvent::RoomFailed { room: r, error: TransferError::Local(AbortReason::ChecksumMismatch { .. }) } if *r == room)));
    assert!(p.s_events.iter().any(|e| matches!(e,
        SenderEvent::RoomFailed { room: r, error: TransferError::Remote(AbortReason::ChecksumMismatch { .. }) } if *r == room)));
    assert!(!p.r_events.contains(&ReceiverEvent::RoomDone { room }));
    p.assert_nothing_held();
    // The connection itself stays usable.
    p.written.clear();
    let pages = p.start_room(RoomId(10), 3);
    assert!(p.run_until(Duration::from_secs(30), |p| p.room_done(RoomId(10))));
    for (i, pg) in pages.iter().enumerate() {
        assert_eq!(&p.written[&(1000 + i as u32)], pg);
    }
}

#[test]
fn wrong_secret_is_refused() {
    let mut p = Pair::new(8, cfg(), small_layout(), small_layout(), b"right", b"wrong");
    assert!(
        p.run_until(Duration::from_secs(10), |p| p.sender.is_closed()
            && p.receiver.is_closed())
    );
    assert!(p.s_events.contains(&SenderEvent::Closed {
        error: TransferError::Local(AbortReason::AuthFailed)
    }));
    assert!(p.r_events.contains(&ReceiverEvent::Closed {
        error: TransferError::Remote(AbortReason::AuthFailed)
    }));
    assert!(!p.s_events.contains(&SenderEvent::Connected));
    assert_eq!(
        p.receiver.register(RoomId(1), vec![1], p.now),
        Err(RegisterError::Closed)
    );
}

#[test]
fn layout_mismatch_is_refused_with_both_layouts() {
    let other = KvLayout {
        dtype: KvDtype::F32,
        ..small_layout()
    };
    let mut p = Pair::new(9, cfg(), small_layout(), other, b"s", b"s");
    assert!(p.run_until(Duration::from_secs(10), |p| p.receiver.is_closed()));
    let want = TransferError::Remote(AbortReason::LayoutMismatch {
        ours: small_layout(),
        theirs: other,
    });
    assert!(p.r_events.contains(&ReceiverEvent::Closed {
        error: want.clone()
    }));
    let text = want.to_string();
    assert!(text.contains("f16") && text.contains("f32"), "{text}");
    assert!(p.sender.is_closed());
}

#[test]
fn version_mismatch_is_refused() {
    let now = Instant::now();
    let auth = AuthKey::new(b"s");
    let mut s = TransferSender::new(cfg(), small_layout(), auth.clone(), now);
    s.handle_message(
        Message::Hello(Hello {
            version: 99,
            auth: auth.tag(),
            layout: small_layout(),
        }),
        now,
    );
    assert_eq!(
        s.poll_transmit_control(),
        Some(Message::Abort {
            room: None,
            reason: AbortReason::VersionMismatch {
                ours: 1,
                theirs: 99
            }
        })
    );
    assert!(s.is_closed());
}

#[test]
fn page_count_mismatch_aborts_the_room() {
    let mut p = Pair::default_pair(10);
    p.connect();
    let room = RoomId(2);
    p.receiver.register(room, vec![1, 2, 3], p.now).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.registered(room)));
    let layout = small_layout();
    let err = p
        .sender
        .submit(room, vec![page(&layout, 1)], AuxData::default(), p.now)
        .unwrap_err();
    assert_eq!(
        err,
        SubmitError::PageCount {
            expected: 3,
            got: 1
        }
    );
    assert!(p.run_until(Duration::from_secs(5), |p| p.receiver.open_rooms() == 0));
    assert!(p.r_events.iter().any(|e| matches!(
        e,
        ReceiverEvent::RoomFailed {
            error: TransferError::Remote(AbortReason::PageCountMismatch { .. }),
            ..
        }
    )));
    p.assert_nothing_held();
}

#[test]
fn submit_errors_are_reported() {
    let mut p = Pair::default_pair(11);
    let layout = small_layout();
    assert_eq!(
        p.sender
            .submit(RoomId(1), vec![], AuxData::default(), p.now),
        Err(SubmitError::NotOpen)
    );
    p.connect();
    assert_eq!(
        p.sender
            .submit(RoomId(1), vec![], AuxData::default(), p.now),
        Err(SubmitError::UnknownRoom(1))
    );
    p.receiver.register(RoomId(1), vec![5], p.now).unwrap();
    assert_eq!(
        p.receiver.register(RoomId(1), vec![5], p.now),
        Err(RegisterError::Duplicate(1))
    );
    assert!(p.run_until(Duration::from_secs(5), |p| p.registered(RoomId(1))));
    let short = Bytes::from_static(b"short");
    assert!(matches!(
        p.sender
            .submit(RoomId(1), vec![short], AuxData::default(), p.now),
        Err(SubmitError::PageSize { .. })
    ));
    p.sender
        .submit(RoomId(1), vec![page(&layout, 0)], AuxData::default(), p.now)
        .unwrap();
    assert_eq!(
        p.sender
            .submit(RoomId(1), vec![page(&layout, 0)], AuxData::default(), p.now),
        Err(SubmitError::AlreadySubmitted(1))
    );
    assert!(p.run_until(Duration::from_secs(5), |p| p.room_done(RoomId(1))));
}

#[test]
fn cancel_by_receiver_releases_sender_pages() {
    let mut p = Pair::default_pair(12);
    p.net.jitter_ms = 100;
    p.connect();
    let room = RoomId(3);
    p.start_room(room, 50);
    p.step();
    assert!(p.sender.held_pages() > 0);
    p.receiver.cancel(room, "client went away", p.now);
    assert!(p.run_until(Duration::from_secs(5), |p| p.sender.open_rooms() == 0));
    assert!(p.s_events.iter().any(|e| matches!(
        e,
        SenderEvent::RoomFailed {
            error: TransferError::Remote(AbortReason::Cancelled(_)),
            ..
        }
    )));
    p.assert_nothing_held();
    assert_eq!(p.sender.queued(), 0);
}

#[test]
fn room_that_never_gets_pages_times_out() {
    let mut p = Pair::new(
        13,
        Config {
            room_timeout: Duration::from_secs(3),
            ..cfg()
        },
        small_layout(),
        small_layout(),
        b"s",
        b"s",
    );
    p.connect();
    p.receiver.register(RoomId(4), vec![1, 2], p.now).unwrap();
    assert!(p.run_until(Duration::from_secs(10), |p| p.receiver.open_rooms() == 0));
    assert!(p.r_events.contains(&ReceiverEvent::RoomFailed {
        room: RoomId(4),
        error: TransferError::Local(AbortReason::Timeout)
    }));
    assert!(p.run_until(Duration::from_secs(10), |p| p.sender.open_rooms() == 0));
    assert!(!p.sender.is_closed());
}

#[test]
fn pages_outside_the_room_are_a_protocol_error() {
    let now = Instant::now();
    let auth = AuthKey::new(b"s");
    let layout = small_layout();
    let mut r = TransferReceiver::new(cfg(), layout, &auth, now);
    r.handle_message(Message::HelloAck, now);
    r.register(RoomId(1), vec![1, 2], now).unwrap();
    r.handle_message(
        Message::Pages {
            room: RoomId(1),
            first: 1,
            pages: vec![page(&layout, 0), page(&layout, 1)],
        },
        now,
    );
    assert!(matches!(r.poll_event(), Some(ReceiverEvent::Connected)));
    assert!(matches!(
        r.poll_event(),
        Some(ReceiverEvent::RoomFailed {
            error: TransferError::Local(AbortReason::Protocol(_)),
            ..
        })
    ));
    assert_eq!(r.open_rooms(), 0);
    // Pages for a room never registered get an UnknownRoom abort.
    r.handle_message(
        Message::Pages {
            room: RoomId(99),
            first: 0,
            pages: vec![page(&layout, 0)],
        },
        now,
    );
    let sent: Vec<Message> = std::iter::from_fn(|| r.poll_transmit_control()).collect();
    assert!(sent.contains(&Message::Abort {
        room: Some(RoomId(99)),
        reason: AbortReason::UnknownRoom
    }));
}

// ---- store protocol ----

struct StorePair {
    now: Instant,
    client: StoreClient,
    server: StoreServer,
    backend: HashMap<PageHash, Bytes>,
    tamper_get: bool,
    events: Vec<StoreClientEvent>,
}

impl StorePair {
    fn new(c_secret: &[u8]) -> Self {
        let now = Instant::now();
        Self {
            now,
            client: StoreClient::new(cfg(), small_layout(), &AuthKey::new(c_secret), now),
            server: StoreServer::new(cfg(), small_layout(), AuthKey::new(b"store"), now),
            backend: HashMap::new(),
            tamper_get: false,
            events: Vec::new(),
        }
    }

    /// Delivers everything until both ends are quiet (no loss: QUIC streams are reliable).
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(m) = self
                .client
                .poll_transmit_control()
                .or_else(|| self.client.poll_transmit_data())
            {
                moved = true;
                self.server.handle_message(m, self.now);
            }
            while let Some(e) = self.server.poll_event() {
                if let StoreServerEvent::Request { id, op } = e {
                    let reply = match op {
                        StoreOp::Exists(h) => StoreReply::Exists(
                            h.iter()
                                .take_while(|h| self.backend.contains_key(h))
                                .count(),
                        ),
                        StoreOp::Get(h) => StoreReply::Get(
                            h.iter().map(|h| self.backend.get(h).cloned()).collect(),
                        ),
                        StoreOp::Put(pages) => {
                            let n = pages.len();
                            self.backend.extend(pages);
                            StoreReply::Put(n)
                        }
                    };
                    self.server.respond(id, reply, self.now);
                }
            }
            while let Some(m) = self
                .server
                .poll_transmit_control()
                .or_else(|| self.server.poll_transmit_data())
            {
                moved = true;
                let m = match m {
                    Message::GetOk { id, mut pages } if self.tamper_get => {
                        if let Some(Some(p)) = pages.first_mut() {
                            let mut v = p.data.to_vec();
                            v[0] ^= 1;
                            p.data = v.into();
                        }
                        Message::GetOk { id, pages }
                    }
                    m => m,
                };
                self.client.handle_message(m, self.now);
            }
            self.events
                .extend(std::iter::from_fn(|| self.client.poll_event()));
            if !moved {
                return;
            }
        }
    }
}

#[test]
fn store_put_exists_get_roundtrip() {
    let mut s = StorePair::new(b"store");
    let layout = small_layout();
    let pages: Vec<(PageHash, Bytes)> = (0..10)
        .map(|i| (PageHash(i as u128 + 1), page(&layout, i)))
        .collect();
    let put = s.client.put(pages[..6].to_vec(), s.now).unwrap();
    s.pump();
    assert!(s.events.contains(&StoreClientEvent::Put {
        id: put,
        stored: 6,
        rejected: 0
    }));
    let hashes: Vec<PageHash> = pages.iter().map(|p| p.0).collect();
    let ex = s.client.exists(hashes.clone(), s.now).unwrap();
    let get = s.client.get(hashes, s.now).unwrap();
    s.pump();
    assert!(s
        .events
        .contains(&StoreClientEvent::Exists { id: ex, hits: 6 }));
    let got = s.events.iter().find_map(|e| match e {
        StoreClientEvent::Got {
            id,
            pages,
            corrupted,
        } if *id == get => Some((pages.clone(), *corrupted)),
        _ => None,
    });
    let (got, corrupted) = got.unwrap();
    assert_eq!(corrupted, 0);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref(), (i < 6).then_some(&pages[i].1));
    }
    assert_eq!(s.client.pending(), 0);
}

#[test]
fn store_corrupted_page_in_transit_is_a_miss() {
    let mut s = StorePair::new(b"store");
    let layout = small_layout();
    s.client
        .put(
            vec![
                (PageHash(1), page(&layout, 1)),
                (PageHash(2), page(&layout, 2)),
            ],
            s.now,
        )
        .unwrap();
    s.pump();
    s.tamper_get = true;
    let get = s.client.get(vec![PageHash(1), PageHash(2)], s.now).unwrap();
    s.pump();
    assert!(s.events.contains(&StoreClientEvent::Got {
        id: get,
        pages: vec![None, Some(page(&layout, 2))],
        corrupted: 1
    }));
}

#[test]
fn store_rejects_a_put_with_a_bad_checksum() {
    let now = Instant::now();
    let layout = small_layout();
    let auth = AuthKey::new(b"k");
    let mut srv = StoreServer::new(cfg(), layout, auth.clone(), now);
    srv.handle_message(make_hello(&layout, &auth), now);
    let good = page(&layout, 1);
    let bad = StorePage {
        hash: PageHash(2),
        checksum: 12345,
        data: page(&layout, 2),
    };
    srv.handle_message(
        Message::Put {
            id: 1,
            pages: vec![
                StorePage {
                    hash: PageHash(1),
                    checksum: page_checksum(&good),
                    data: good.clone(),
                },
                bad,
            ],
        },
        now,
    );
    assert_eq!(srv.poll_event(), Some(StoreServerEvent::Connected));
    assert_eq!(
        srv.poll_event(),
        Some(StoreServerEvent::Request {
            id: 1,
            op: StoreOp::Put(vec![(PageHash(1), good)])
        })
    );
    srv.respond(1, StoreReply::Put(1), now);
    assert_eq!(srv.poll_transmit_control(), Some(Message::HelloAck));
    assert_eq!(
        srv.poll_transmit_control(),
        Some(Message::PutOk {
            id: 1,
            stored: 1,
            rejected: 1
        })
    );
}

#[test]
fn store_wrong_secret_fails_pending_requests() {
    let mut s = StorePair::new(b"intruder");
    let id = s.client.exists(vec![PageHash(1)], s.now).unwrap();
    s.pump();
    assert!(s.client.is_closed() && s.server.is_closed());
    assert!(s.events.contains(&StoreClientEvent::Failed {
        id,
        error: TransferError::Remote(AbortReason::AuthFailed)
    }));
    assert_eq!(
        s.client.exists(vec![], s.now),
        Err(StoreRequestError::Closed)
    );
}

#[test]
fn store_request_times_out_when_the_server_never_answers() {
    let mut s = StorePair::new(b"store");
    s.pump();
    let id = s.client.exists(vec![PageHash(1)], s.now).unwrap();
    // The request leaves, but the server is gone: nothing ever comes back.
    while s.client.poll_transmit_control().is_some() {}
    let mut now = s.now;
    while !s.client.is_closed() {
        now = s.client.poll_timeout().unwrap();
        s.client.handle_timeout(now);
        while s.client.poll_transmit_control().is_some() {}
    }
    let events: Vec<_> = std::iter::from_fn(|| s.client.poll_event()).collect();
    assert!(events.contains(&StoreClientEvent::Failed {
        id,
        error: TransferError::PeerTimeout(cfg().idle_timeout)
    }));
    assert!(now - s.now <= cfg().idle_timeout);
    assert_eq!(s.client.pending(), 0);
}

#[test]
fn pages_overtaking_the_hello_ack_are_accepted() {
    let now = Instant::now();
    let auth = AuthKey::new(b"s");
    let layout = small_layout();
    let mut r = TransferReceiver::new(cfg(), layout, &auth, now);
    r.register(RoomId(1), vec![8], now).unwrap();
    r.handle_message(
        Message::Pages {
            room: RoomId(1),
            first: 0,
            pages: vec![page(&layout, 0)],
        },
        now,
    );
    r.handle_message(Message::HelloAck, now);
    assert_eq!(r.poll_event(), Some(ReceiverEvent::Connected));
    assert_eq!(
        r.poll_event(),
        Some(ReceiverEvent::Pages {
            room: RoomId(1),
            dst_pages: vec![8],
            pages: vec![page(&layout, 0)]
        })
    );
    assert_eq!(r.poll_event(), None);
}
