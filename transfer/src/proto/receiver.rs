//! The decode end of a transfer connection: dials, says hello, registers rooms with their
//! destination pages, receives pages (in any order, duplicates ignored), asks again for
//! what is missing, verifies the room checksum and acknowledges.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::sender::name;
use super::{
    make_hello, min_deadline, room_checksum, AbortReason, AuthKey, AuxData, Config, HelloRetry,
    Liveness, Message, Page, RoomId, TransferError,
};
use sglrs_radix_cache::KvLayout;

/// Largest number of page indices one `Resend` asks for.
const MAX_RESEND: usize = 4096;

/// What the decode end reports to its application.
#[derive(Clone, Debug, PartialEq)]
pub enum ReceiverEvent {
    /// The prefill host accepted the hello.
    Connected,
    /// Pages arrived: write `pages[i]` into destination page `dst_pages[i]`. Each page is
    /// reported once.
    Pages {
        /// The room.
        room: RoomId,
        /// Destination page ids, as registered.
        dst_pages: Vec<u32>,
        /// The page bytes in the executor's layout.
        pages: Vec<Page>,
    },
    /// The aux data (first token, logprobs) arrived.
    Aux {
        /// The room.
        room: RoomId,
        /// The data.
        aux: AuxData,
    },
    /// Every page arrived and the room checksum matched; the room was acknowledged.
    RoomDone {
        /// The room.
        room: RoomId,
    },
    /// The room failed; pages it reported must not be used.
    RoomFailed {
        /// The room.
        room: RoomId,
        /// Why.
        error: TransferError,
    },
    /// The connection ended; every room on it failed.
    Closed {
        /// Why.
        error: TransferError,
    },
}

/// Why [`TransferReceiver::register`] refused a room.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The connection has closed.
    #[error("connection is closed")]
    Closed,
    /// The room is already registered on this connection.
    #[error("room {0} is already registered")]
    Duplicate(u64),
    /// Too many rooms or pages.
    #[error("over the limit of {rooms} rooms or {pages} pages per room")]
    Limit {
        /// Rooms allowed at once.
        rooms: usize,
        /// Pages allowed per room.
        pages: usize,
    },
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    AwaitHelloAck,
    Open,
    Closed,
}

#[derive(Debug)]
struct InRoom {
    dst: Vec<u32>,
    checksums: Vec<u64>,
    have: Vec<bool>,
    received: usize,
    aux: bool,
    registered: bool,
    register_at: Instant,
    register_retries: u32,
    done: Option<u64>,
    resend_at: Option<Instant>,
    resend_retries: u32,
    deadline: Instant,
}

/// The decode end of one transfer connection (sans-IO).
#[derive(Debug)]
pub struct TransferReceiver {
    cfg: Config,
    layout: KvLayout,
    state: State,
    now: Instant,
    live: Liveness,
    hello: HelloRetry,
    rooms: HashMap<RoomId, InRoom>,
    /// Finished rooms: expiry and whether they completed (then a repeated `Done` is re-acked).
    tombstones: HashMap<RoomId, (Instant, bool)>,
    control: VecDeque<Message>,
    events: VecDeque<ReceiverEvent>,
}

impl TransferReceiver {
    /// A new dialing end; its hello is the first message to transmit.
    pub fn new(cfg: Config, layout: KvLayout, auth: &AuthKey, now: Instant) -> Self {
        let hello = make_hello(&layout, auth);
        let mut control = VecDeque::new();
        control.push_back(hello.clone());
        let retry = HelloRetry::new(hello.clone(), &cfg, now);
        Self {
            cfg,
            layout,
            state: State::AwaitHelloAck,
            now,
            live: Liveness::new(now),
            hello: retry,
            rooms: HashMap::new(),
            tombstones: HashMap::new(),
            control,
            events: VecDeque::new(),
        }
    }

    /// Whether the connection ended.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Rooms waiting for pages.
    pub fn open_rooms(&self) -> usize {
        self.rooms.len()
    }

    /// Expects a room's pages into `dst_pages` (one destination page id per page).
    pub fn register(
        &mut self,
        room: RoomId,
        dst_pages: Vec<u32>,
        now: Instant,
    ) -> Result<(), RegisterError> {
        self.now = now;
        if self.state == State::Closed {
            return Err(RegisterError::Closed);
        }
        if self.rooms.contains_key(&room) || self.tombstones.contains_key(&room) {
            return Err(RegisterError::Duplicate(room.0));
        }
        if dst_pages.len() > self.cfg.max_pages || self.rooms.len() >= self.cfg.max_rooms {
            return Err(RegisterError::Limit {
                rooms: self.cfg.max_rooms,
                pages: self.cfg.max_pages,
            });
        }
        let n = dst_pages.len();
        self.control.push_back(Message::Register {
            room,
            dst_pages: dst_pages.clone(),
        });
        self.rooms.insert(
            room,
            InRoom {
                dst: dst_pages,
                checksums: vec![0; n],
                have: vec![false; n],
                received: 0,
                aux: false,
                registered: false,
                register_at: now + self.cfg.retransmit_timeout,
                register_retries: 0,
                done: None,
                resend_at: None,
                resend_retries: 0,
                deadline: now + self.cfg.room_timeout,
            },
        );
        Ok(())
    }

    /// Aborts a room from this end; the peer is told why.
    pub fn cancel(&mut self, room: RoomId, reason: &str, now: Instant) {
        self.now = now;
        if self.rooms.contains_key(&room) {
            self.fail_room(room, AbortReason::Cancelled(reason.to_string()), true);
        }
    }

    /// Closes the connection from this end, failing every room.
    pub fn close(&mut self, reason: &str, now: Instant) {
        self.now = now;
        if self.state != State::Closed {
            let r = AbortReason::Cancelled(reason.to_string());
            self.control.push_back(Message::Abort {
                room: None,
                reason: r.clone(),
            });
            self.shut(TransferError::Local(r));
        }
    }

    /// Feeds one message from the peer.
    pub fn handle_message(&mut self, msg: Message, now: Instant) {
        self.handle_message_hashed(msg, None, now)
    }

    /// [`handle_message`](Self::handle_message) for a driver that already computed the
    /// [`page_checksum`](super::page_checksum) of every page of a `Pages` message (off the
    /// thread that runs this end): `checksums[i]` belongs to page `i`. A list of the wrong
    /// length is ignored and the pages are hashed here.
    pub fn handle_message_hashed(
        &mut self,
        msg: Message,
        checksums: Option<Vec<u64>>,
        now: Instant,
    ) {
        self.now = now;
        if self.state == State::Closed {
            return;
        }
        self.live.last_recv = now;
        if self.state == State::AwaitHelloAck && room_message(&msg) {
            // The peer only speaks about rooms after accepting our hello; its data streams
            // can overtake the `HelloAck` on the control stream.
            self.state = State::Open;
            self.events.push_back(ReceiverEvent::Connected);
        }
        match (&self.state, msg) {
            (State::AwaitHelloAck, Message::HelloAck) => {
                self.state = State::Open;
                self.events.push_back(ReceiverEvent::Connected);
            }
            (State::Open, Message::HelloAck) => {}
            (_, Message::Ping) => {}
            (_, Message::Abort { room: None, reason }) => self.shut(TransferError::Remote(reason)),
            (State::AwaitHelloAck, _) => {}
            (State::Open, Message::Registered { room }) => {
                if let Some(r) = self.rooms.get_mut(&room) {
                    r.registered = true;
                }
            }
            (State::Open, Message::Pages { room, first, pages }) => {
                let checksums = checksums.filter(|c| c.len() == pages.len());
                self.on_pages(room, first, pages, checksums)
            }
            (State::Open, Message::Aux { room, aux }) => {
                if let Some(r) = self.rooms.get_mut(&room) {
                    r.registered = true;
                    if !r.aux {
                        r.aux = true;
                        self.events.push_back(ReceiverEvent::Aux { room, aux });
                    }
                    self.try_finish(room);
                } else {
                    self.unknown_room(room);
                }
            }
            (
                State::Open,
                Message::Done {
                    room,
                    num_pages,
                    checksum,
                },
            ) => self.on_done(room, num_pages, checksum),
            (
                State::Open,
                Message::Abort {
                    room: Some(room),
                    reason,
                },
            ) => {
                if self.rooms.remove(&room).is_some() {
                    self.tombstones.insert(room, (now + self.cfg.linger, false));
                    self.events.push_back(ReceiverEvent::RoomFailed {
                        room,
                        error: TransferError::Remote(reason),
                    });
                }
            }
            (_, other) => self.refuse(AbortReason::Protocol(format!(
                "unexpected {} message",
                name(&other)
            ))),
        }
    }

    fn unknown_room(&mut self, room: RoomId) {
        if !self.tombstones.contains_key(&room) {
            self.control.push_back(Message::Abort {
                room: Some(room),
                reason: AbortReason::UnknownRoom,
            });
        }
    }

    fn on_pages(
        &mut self,
        room: RoomId,
        first: u32,
        pages: Vec<Page>,
        checksums: Option<Vec<u64>>,
    ) {
        let want = self.layout.page_bytes();
        let Some(r) = self.rooms.get_mut(&room) else {
            self.unknown_room(room);
            return;
        };
        r.registered = true;
        let end = first as usize + pages.len();
        if end > r.dst.len() {
            let reason = AbortReason::Protocol(format!(
                "pages {first}..{end} of a {}-page room",
                r.dst.len()
            ));
            self.fail_room(room, reason, true);
            return;
        }
        if let Some(p) = pages.iter().find(|p| p.len() != want) {
            let reason =
                AbortReason::Protocol(format!("page of {} bytes, layout page is {want}", p.len()));
            self.fail_room(room, reason, true);
            return;
        }
        let mut dst = Vec::with_capacity(pages.len());
        let mut fresh = Vec::with_capacity(pages.len());
        for (i, p) in pages.into_iter().enumerate() {
            let idx = first as usize + i;
            if !r.have[idx] {
                r.have[idx] = true;
                r.checksums[idx] = match &checksums {
                    Some(c) => c[i],
                    None => p.checksum(),
                };
                r.received += 1;
                dst.push(r.dst[idx]);
                fresh.push(p);
            }
        }
        if fresh.is_empty() {
            return; // all duplicates
        }
        if r.resend_at.is_some() {
            // Progress: whatever is still missing gets a fresh grace period.
            r.resend_at = Some(self.now + self.cfg.retransmit_timeout);
            r.resend_retries = 0;
        }
        self.events.push_back(ReceiverEvent::Pages {
            room,
            dst_pages: dst,
            pages: fresh,
        });
        self.try_finish(room);
    }

    fn on_done(&mut self, room: RoomId, num_pages: u32, checksum: u64) {
        let Some(r) = self.rooms.get_mut(&room) else {
            match self.tombstones.get(&room) {
                Some((_, true)) => self.control.push_back(Message::Ack { room }),
                Some((_, false)) => {}
                None => self.unknown_room(room),
            }
            return;
        };
        r.registered = true;
        if num_pages as usize != r.dst.len() {
            let reason = AbortReason::PageCountMismatch {
                expected: r.dst.len() as u32,
                got: num_pages,
            };
            self.fail_room(room, reason, true);
            return;
        }
        r.done = Some(checksum);
        if r.resend_at.is_none() {
            r.resend_at = Some(self.now + self.cfg.retransmit_timeout);
        }
        self.try_finish(room);
    }

    /// Completes a room once every page, the aux data and `Done` are in.
    fn try_finish(&mut self, room: RoomId) {
        let Some(r) = self.rooms.get(&room) else {
            return;
        };
        let Some(expected) = r.done else { return };
        if r.received < r.dst.len() || !r.aux {
            return;
        }
        let got = room_checksum(r.checksums.iter().copied());
        if got != expected {
            self.fail_room(room, AbortReason::ChecksumMismatch { expected, got }, true);
            return;
        }
        self.rooms.remove(&room);
        self.tombstones
            .insert(room, (self.now + self.cfg.linger, true));
        self.control.push_back(Message::Ack { room });
        self.events.push_back(ReceiverEvent::RoomDone { room });
    }

    fn fail_room(&mut self, room: RoomId, reason: AbortReason, tell_peer: bool) {
        if self.rooms.remove(&room).is_none() {
            return;
        }
        if tell_peer {
            self.control.push_back(Message::Abort {
                room: Some(room),
                reason: reason.clone(),
            });
        }
        self.tombstones
            .insert(room, (self.now + self.cfg.linger, false));
        self.events.push_back(ReceiverEvent::RoomFailed {
            room,
            error: TransferError::Local(reason),
        });
    }

    fn refuse(&mut self, reason: AbortReason) {
        self.control.push_back(Message::Abort {
            room: None,
            reason: reason.clone(),
        });
        self.shut(TransferError::Local(reason));
    }

    fn shut(&mut self, error: TransferError) {
        self.state = State::Closed;
        let mut rooms: Vec<RoomId> = self.rooms.keys().copied().collect();
        rooms.sort();
        for room in rooms {
            self.events.push_back(ReceiverEvent::RoomFailed {
                room,
                error: error.clone(),
            });
        }
        self.rooms.clear();
        self.tombstones.clear();
        self.control
            .retain(|m| matches!(m, Message::Abort { room: None, .. }));
        self.events.push_back(ReceiverEvent::Closed { error });
    }

    /// The driver lost the connection below the protocol (reset, unreachable, closed):
    /// everything on it fails and every buffer is released.
    pub fn handle_connection_lost(&mut self, reason: String, now: Instant) {
        self.now = now;
        if self.state != State::Closed {
            self.shut(TransferError::ConnectionLost(reason));
        }
    }

    /// Advances timers: idle timeout, heartbeats, register and resend retransmission, room
    /// deadlines.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.state == State::Closed {
            return;
        }
        if self.live.silent(&self.cfg, now) {
            self.shut(TransferError::PeerTimeout(self.cfg.idle_timeout));
            return;
        }
        if self.state == State::AwaitHelloAck && !self.hello.tick(&self.cfg, now, &mut self.control)
        {
            self.shut(TransferError::Local(AbortReason::Timeout));
            return;
        }
        self.live.heartbeat(&self.cfg, now, &mut self.control);
        let mut failed = Vec::new();
        let mut rooms: Vec<RoomId> = self.rooms.keys().copied().collect();
        rooms.sort();
        for room in rooms {
            let Some(r) = self.rooms.get_mut(&room) else {
                continue;
            };
            if now >= r.deadline {
                failed.push(room);
                continue;
            }
            if !r.registered && now >= r.register_at {
                if r.register_retries >= self.cfg.max_retransmits {
                    failed.push(room);
                    continue;
                }
                r.register_retries += 1;
                r.register_at = now + self.cfg.retransmit_timeout;
                self.control.push_back(Message::Register {
                    room,
                    dst_pages: r.dst.clone(),
                });
            }
            if let Some(t) = r.resend_at {
                if now >= t {
                    if r.resend_retries >= self.cfg.max_retransmits {
                        failed.push(room);
                        continue;
                    }
                    r.resend_retries += 1;
                    r.resend_at = Some(now + self.cfg.retransmit_timeout);
                    let missing: Vec<u32> = r
                        .have
                        .iter()
                        .enumerate()
                        .filter(|(_, h)| !**h)
                        .map(|(i, _)| i as u32)
                        .take(MAX_RESEND)
                        .collect();
                    self.control.push_back(Message::Resend { room, missing });
                }
            }
        }
        for room in failed {
            self.fail_room(room, AbortReason::Timeout, true);
        }
        self.tombstones.retain(|_, (t, _)| *t > now);
    }

    /// The next instant [`handle_timeout`](Self::handle_timeout) must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        let mut t = Some(self.live.next(&self.cfg));
        if self.state == State::AwaitHelloAck {
            t = min_deadline(t, self.hello.deadline());
        }
        for r in self.rooms.values() {
            t = min_deadline(t, r.deadline);
            if !r.registered {
                t = min_deadline(t, r.register_at);
            }
            if let Some(d) = r.resend_at {
                t = min_deadline(t, d);
            }
        }
        for (d, _) in self.tombstones.values() {
            t = min_deadline(t, *d);
        }
        t
    }

    /// The next message to send, in order, on the control stream (this end sends no bulk
    /// data).
    pub fn poll_transmit_control(&mut self) -> Option<Message> {
        let m = self.control.pop_front()?;
        self.live.last_sent = self.now;
        Some(m)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        self.events.pop_front()
    }
}

/// Messages a prefill end sends only once it accepted the hello.
fn room_message(m: &Message) -> bool {
    matches!(
        m,
        Message::Registered { .. }
            | Message::Pages { .. }
            | Message::Aux { .. }
            | Message::Done { .. }
            | Message::Abort { room: Some(_), .. }
    )
}
