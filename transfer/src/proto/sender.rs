//! The prefill end of a transfer connection: accepts the decode host's hello and room
//! registrations, sends each room's pages, aux data and `Done`, and holds the pages until
//! the room is acknowledged (or fails), never longer.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;

use super::{
    check_hello, min_deadline, page_checksum, room_checksum, AbortReason, AuthKey, AuxData, Config,
    Liveness, Message, Page, RoomId, TransferError,
};
use sglrs_radix_cache::KvLayout;

/// What the prefill end reports to its application.
#[derive(Clone, Debug, PartialEq)]
pub enum SenderEvent {
    /// The decode host's hello was accepted.
    Connected,
    /// The decode host registered a room for this many pages; [`TransferSender::submit`]
    /// may now be called for it.
    RoomRegistered {
        /// The room.
        room: RoomId,
        /// Pages the decode host expects.
        num_pages: u32,
    },
    /// The room arrived complete and verified; its pages were released.
    RoomDone {
        /// The room.
        room: RoomId,
    },
    /// The room failed; its pages were released.
    RoomFailed {
        /// The room.
        room: RoomId,
        /// Why.
        error: TransferError,
    },
    /// The connection ended; every room on it failed and was released.
    Closed {
        /// Why.
        error: TransferError,
    },
}

/// Why [`TransferSender::submit`] refused a room's pages.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The connection is not open (hello pending, or closed).
    #[error("connection is not open")]
    NotOpen,
    /// The decode host has not registered this room on this connection.
    #[error("room {0} is not registered")]
    UnknownRoom(u64),
    /// Pages for this room were already submitted.
    #[error("room {0} was already submitted")]
    AlreadySubmitted(u64),
    /// The number of pages differs from the registration (the room is aborted).
    #[error("{got} pages submitted, {expected} registered (room aborted)")]
    PageCount {
        /// Pages registered.
        expected: u32,
        /// Pages submitted.
        got: u32,
    },
    /// A page is not exactly one layout page long.
    #[error("page {index} has {got} bytes, the layout's page has {want}")]
    PageSize {
        /// Index of the page.
        index: usize,
        /// Its length.
        got: usize,
        /// The layout's page length.
        want: usize,
    },
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    AwaitHello,
    Open,
    Closed,
}

#[derive(Debug)]
struct OutRoom {
    num_pages: u32,
    pages: Option<Vec<Bytes>>,
    aux: AuxData,
    /// Page checksums, computed as each page is first handed to the driver (so hashing
    /// overlaps sending instead of delaying the first page), or by the driver itself.
    sums: Vec<Sum>,
    /// Pages handed to the driver to hash whose checksums have not come back yet.
    with_driver: usize,
    /// When the `Done` handed to the driver counts as unanswered.
    ack_deadline: Option<Instant>,
    retries: u32,
}

/// What is known of one page's checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sum {
    /// Nobody hashed the page yet.
    Unknown,
    /// The driver is hashing it (see [`TransferSender::poll_transmit_data_unhashed`]).
    WithDriver,
    /// The checksum.
    Known(u64),
}

impl OutRoom {
    /// Records the checksums of `pages`, the room's pages from index `first` on.
    fn hash(&mut self, first: usize, pages: &[Page]) {
        for (sum, p) in self.sums.iter_mut().skip(first).zip(pages) {
            if !matches!(sum, Sum::Known(_)) {
                if *sum == Sum::WithDriver {
                    self.with_driver -= 1;
                }
                *sum = Sum::Known(p.checksum());
            }
        }
    }

    /// Notes that the driver hashes the `n` pages from index `first` on.
    fn lend(&mut self, first: usize, n: usize) {
        for sum in self.sums.iter_mut().skip(first).take(n) {
            if *sum == Sum::Unknown {
                *sum = Sum::WithDriver;
                self.with_driver += 1;
            }
        }
    }

    /// Records the driver's checksum of page `index`.
    fn record(&mut self, index: usize, checksum: u64) {
        if let Some(sum) = self.sums.get_mut(index) {
            if *sum == Sum::WithDriver {
                self.with_driver -= 1;
            }
            *sum = Sum::Known(checksum);
        }
    }

    /// The room checksum, hashing whatever page was not hashed yet.
    fn checksum(&mut self) -> u64 {
        if let Some(pages) = &self.pages {
            for (sum, p) in self.sums.iter_mut().zip(pages) {
                if !matches!(sum, Sum::Known(_)) {
                    *sum = Sum::Known(page_checksum(p));
                }
            }
        }
        self.with_driver = 0;
        room_checksum(self.sums.iter().map(|s| match s {
            Sum::Known(c) => *c,
            Sum::Unknown | Sum::WithDriver => 0,
        }))
    }
}

/// The prefill end of one transfer connection (sans-IO).
#[derive(Debug)]
pub struct TransferSender {
    cfg: Config,
    layout: KvLayout,
    auth: AuthKey,
    state: State,
    now: Instant,
    live: Liveness,
    rooms: HashMap<RoomId, OutRoom>,
    tombstones: HashMap<RoomId, Instant>,
    control: VecDeque<Message>,
    data: VecDeque<Message>,
    events: VecDeque<SenderEvent>,
}

impl TransferSender {
    /// A new accepting end, waiting for the peer's hello.
    pub fn new(cfg: Config, layout: KvLayout, auth: AuthKey, now: Instant) -> Self {
        Self {
            cfg,
            layout,
            auth,
            state: State::AwaitHello,
            now,
            live: Liveness::new(now),
            rooms: HashMap::new(),
            tombstones: HashMap::new(),
            control: VecDeque::new(),
            data: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Whether the connection ended (after which only a final `Abort` may still be polled).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Pages this end holds for rooms not yet acknowledged.
    pub fn held_pages(&self) -> usize {
        self.rooms
            .values()
            .filter_map(|r| r.pages.as_ref())
            .map(Vec::len)
            .sum()
    }

    /// Messages queued for the driver.
    pub fn queued(&self) -> usize {
        self.control.len() + self.data.len()
    }

    /// Rooms open on this connection.
    pub fn open_rooms(&self) -> usize {
        self.rooms.len()
    }

    /// Pages the decode host registered for `room` (`None`: not registered here).
    pub fn registered_pages(&self, room: RoomId) -> Option<u32> {
        self.rooms.get(&room).map(|r| r.num_pages)
    }

    /// Hands over the pages (in the executor's page layout, one `Bytes` per page), the aux
    /// data of a registered room and starts sending them.
    pub fn submit(
        &mut self,
        room: RoomId,
        pages: Vec<Bytes>,
        aux: AuxData,
        now: Instant,
    ) -> Result<(), SubmitError> {
        self.now = now;
        if self.state != State::Open {
            return Err(SubmitError::NotOpen);
        }
        let want = self.layout.page_bytes();
        let r = self
            .rooms
            .get(&room)
            .ok_or(SubmitError::UnknownRoom(room.0))?;
        if r.pages.is_some() {
            return Err(SubmitError::AlreadySubmitted(room.0));
        }
        if pages.len() != r.num_pages as usize {
            let (expected, got) = (r.num_pages, pages.len() as u32);
            self.fail_room(room, AbortReason::PageCountMismatch { expected, got }, true);
            return Err(SubmitError::PageCount { expected, got });
        }
        if let Some((index, p)) = pages.iter().enumerate().find(|(_, p)| p.len() != want) {
            return Err(SubmitError::PageSize {
                index,
                got: p.len(),
                want,
            });
        }
        let r = self
            .rooms
            .get_mut(&room)
            .ok_or(SubmitError::UnknownRoom(room.0))?;
        r.sums = vec![Sum::Unknown; pages.len()];
        r.with_driver = 0;
        r.aux = aux;
        for (i, chunk) in pages.chunks(self.cfg.batch_pages.max(1)).enumerate() {
            let first = (i * self.cfg.batch_pages.max(1)) as u32;
            self.data.push_back(Message::Pages {
                room,
                first,
                pages: chunk.iter().cloned().map(Page::from).collect(),
            });
        }
        r.pages = Some(pages);
        self.queue_tail(room);
        Ok(())
    }

    /// Aborts a room from this end: the peer is told why, the pages are released.
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

    /// Queues the aux data and `Done` after a room's pages.
    fn queue_tail(&mut self, room: RoomId) {
        if let Some(r) = self.rooms.get(&room) {
            self.data.push_back(Message::Aux {
                room,
                aux: r.aux.clone(),
            });
            // The checksum is filled in when the driver takes the message.
            self.data.push_back(Message::Done {
                room,
                num_pages: r.num_pages,
                checksum: 0,
            });
        }
    }

    /// Feeds one message from the peer.
    pub fn handle_message(&mut self, msg: Message, now: Instant) {
        self.now = now;
        if self.state == State::Closed {
            return;
        }
        self.live.last_recv = now;
        match (&self.state, msg) {
            (State::AwaitHello, Message::Hello(h)) => {
                match check_hello(&h, &self.layout, &self.auth) {
                    Ok(()) => {
                        self.state = State::Open;
                        self.control.push_back(Message::HelloAck);
                        self.events.push_back(SenderEvent::Connected);
                    }
                    Err(reason) => self.refuse(reason),
                }
            }
            // A retransmitted hello (its ack was lost): answer it again.
            (State::Open, Message::Hello(h)) => match check_hello(&h, &self.layout, &self.auth) {
                Ok(()) => self.control.push_back(Message::HelloAck),
                Err(reason) => self.refuse(reason),
            },
            // Overtook the hello on a lossy, reordering path; the peer will send it again.
            (State::AwaitHello, _) => {}
            (_, Message::Ping) => {}
            (_, Message::Abort { room: None, reason }) => self.shut(TransferError::Remote(reason)),
            (State::Open, Message::Register { room, dst_pages }) => {
                self.on_register(room, dst_pages.len())
            }
            (State::Open, Message::Resend { room, missing }) => self.on_resend(room, missing),
            (State::Open, Message::Ack { room }) => {
                if self.rooms.remove(&room).is_some() {
                    self.purge(room);
                    self.tombstones.insert(room, now + self.cfg.linger);
                    self.events.push_back(SenderEvent::RoomDone { room });
                }
            }
            (
                State::Open,
                Message::Abort {
                    room: Some(room),
                    reason,
                },
            ) => {
                if self.rooms.remove(&room).is_some() {
                    self.purge(room);
                    self.tombstones.insert(room, now + self.cfg.linger);
                    self.events.push_back(SenderEvent::RoomFailed {
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

    fn on_register(&mut self, room: RoomId, n: usize) {
        if self.tombstones.contains_key(&room) {
            return; // a late duplicate of a finished room
        }
        if let Some(r) = self.rooms.get(&room) {
            if r.num_pages as usize == n {
                self.control.push_back(Message::Registered { room });
            } else {
                let reason =
                    AbortReason::Protocol(format!("{room} registered twice with different pages"));
                self.fail_room(room, reason, true);
            }
            return;
        }
        if n > self.cfg.max_pages || self.rooms.len() >= self.cfg.max_rooms {
            let reason = AbortReason::Protocol(format!(
                "{room}: over the limit of {} rooms or {} pages",
                self.cfg.max_rooms, self.cfg.max_pages
            ));
            self.control.push_back(Message::Abort {
                room: Some(room),
                reason,
            });
            return;
        }
        self.rooms.insert(
            room,
            OutRoom {
                num_pages: n as u32,
                pages: None,
                aux: AuxData::default(),
                sums: Vec::new(),
                with_driver: 0,
                ack_deadline: None,
                retries: 0,
            },
        );
        self.control.push_back(Message::Registered { room });
        self.events.push_back(SenderEvent::RoomRegistered {
            room,
            num_pages: n as u32,
        });
    }

    fn on_resend(&mut self, room: RoomId, missing: Vec<u32>) {
        let Some(r) = self.rooms.get_mut(&room) else {
            return;
        };
        let Some(pages) = &r.pages else { return };
        if let Some(bad) = missing.iter().find(|&&i| i as usize >= pages.len()) {
            let reason = AbortReason::Protocol(format!("resend of page {bad} of {}", pages.len()));
            self.fail_room(room, reason, true);
            return;
        }
        // The peer is alive and working on the room: that is progress, not silence.
        r.ack_deadline = None;
        r.retries = 0;
        for &i in &missing {
            self.data.push_back(Message::Pages {
                room,
                first: i,
                pages: vec![pages[i as usize].clone().into()],
            });
        }
        self.queue_tail(room);
    }

    /// Drops queued messages of a finished room, so no page buffer outlives it.
    fn purge(&mut self, room: RoomId) {
        self.data.retain(|m| room_of(m) != Some(room));
    }

    fn fail_room(&mut self, room: RoomId, reason: AbortReason, tell_peer: bool) {
        if self.rooms.remove(&room).is_none() {
            return;
        }
        self.purge(room);
        if tell_peer {
            self.control.push_back(Message::Abort {
                room: Some(room),
                reason: reason.clone(),
            });
        }
        self.tombstones.insert(room, self.now + self.cfg.linger);
        self.events.push_back(SenderEvent::RoomFailed {
            room,
            error: TransferError::Local(reason),
        });
    }

    /// Refuses the peer: tell it why and close.
    fn refuse(&mut self, reason: AbortReason) {
        self.control.push_back(Message::Abort {
            room: None,
            reason: reason.clone(),
        });
        self.shut(TransferError::Local(reason));
    }

    /// Ends the connection: every room fails, every buffer is released.
    fn shut(&mut self, error: TransferError) {
        self.state = State::Closed;
        let mut rooms: Vec<RoomId> = self.rooms.keys().copied().collect();
        rooms.sort();
        for room in rooms {
            self.events.push_back(SenderEvent::RoomFailed {
                room,
                error: error.clone(),
            });
        }
        self.rooms.clear();
        self.data.clear();
        self.tombstones.clear();
        self.control
            .retain(|m| matches!(m, Message::Abort { room: None, .. }));
        self.events.push_back(SenderEvent::Closed { error });
    }

    /// The driver lost the connection below the protocol (reset, unreachable, closed):
    /// everything on it fails and every buffer is released.
    pub fn handle_connection_lost(&mut self, reason: String, now: Instant) {
        self.now = now;
        if self.state != State::Closed {
            self.shut(TransferError::ConnectionLost(reason));
        }
    }

    /// Advances timers: idle timeout, heartbeats, `Done` retransmission.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.state == State::Closed {
            return;
        }
        if self.live.silent(&self.cfg, now) {
            self.shut(TransferError::PeerTimeout(self.cfg.idle_timeout));
            return;
        }
        self.live.heartbeat(&self.cfg, now, &mut self.control);
        let mut expired = Vec::new();
        let mut again = Vec::new();
        for (&room, r) in &mut self.rooms {
            if let Some(d) = r.ack_deadline {
                if now >= d {
                    if r.retries >= self.cfg.max_retransmits {
                        expired.push(room);
                    } else {
                        r.retries += 1;
                        r.ack_deadline = None;
                        again.push(room);
                    }
                }
            }
        }
        again.sort();
        for room in again {
            if let Some(r) = self.rooms.get(&room) {
                self.data.push_back(Message::Done {
                    room,
                    num_pages: r.num_pages,
                    checksum: 0,
                });
            }
        }
        expired.sort();
        for room in expired {
            self.fail_room(room, AbortReason::Timeout, true);
        }
        self.tombstones.retain(|_, t| *t > now);
    }

    /// The next instant [`handle_timeout`](Self::handle_timeout) must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        let mut t = Some(self.live.next(&self.cfg));
        for r in self.rooms.values() {
            if let Some(d) = r.ack_deadline {
                t = min_deadline(t, d);
            }
        }
        for &d in self.tombstones.values() {
            t = min_deadline(t, d);
        }
        t
    }

    /// The next small message to send, in order, on the control stream.
    pub fn poll_transmit_control(&mut self) -> Option<Message> {
        let m = self.control.pop_front()?;
        self.live.last_sent = self.now;
        Some(m)
    }

    /// The next message of the data queue (pages, aux, done). Drivers may send `Pages` on
    /// parallel streams; `Aux` and `Done` belong on the control stream.
    pub fn poll_transmit_data(&mut self) -> Option<Message> {
        self.poll_data(true)
    }

    /// [`poll_transmit_data`](Self::poll_transmit_data) for a driver that hashes the pages
    /// of `Pages` messages itself, each just before it hands the page to its transport
    /// (while the bytes are in cache for the transport's copy), and reports every page's
    /// [`page_checksum`](super::page_checksum) with
    /// [`record_checksum`](Self::record_checksum). A room's `Done` waits until every
    /// checksum it needs came back.
    pub fn poll_transmit_data_unhashed(&mut self) -> Option<Message> {
        self.poll_data(false)
    }

    /// The checksum of page `index` of `room`, computed by the driver (see
    /// [`poll_transmit_data_unhashed`](Self::poll_transmit_data_unhashed)). Ignored for a
    /// room that is gone.
    pub fn record_checksum(&mut self, room: RoomId, index: u32, checksum: u64) {
        if let Some(r) = self.rooms.get_mut(&room) {
            r.record(index as usize, checksum);
        }
    }

    fn poll_data(&mut self, hash_here: bool) -> Option<Message> {
        if self.state != State::Open {
            return None;
        }
        // A `Done` waits while the driver still hashes pages of its room; what is behind it
        // (other rooms) may go.
        let rooms = &self.rooms;
        let next = self.data.iter().position(|m| match m {
            Message::Done { room, .. } => rooms.get(room).is_none_or(|r| r.with_driver == 0),
            _ => true,
        })?;
        let mut m = self.data.remove(next)?;
        match &mut m {
            Message::Pages { room, first, pages } => {
                if let Some(r) = self.rooms.get_mut(room) {
                    if hash_here {
                        r.hash(*first as usize, pages);
                    } else {
                        r.lend(*first as usize, pages.len());
                    }
                }
            }
            Message::Done { room, checksum, .. } => {
                if let Some(r) = self.rooms.get_mut(room) {
                    r.ack_deadline = Some(self.now + self.cfg.retransmit_timeout);
                    *checksum = r.checksum();
                }
            }
            _ => {}
        }
        self.live.last_sent = self.now;
        Some(m)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }
}

/// The room a message belongs to, if any.
pub(crate) fn room_of(m: &Message) -> Option<RoomId> {
    match m {
        Message::Register { room, .. }
        | Message::Registered { room }
        | Message::Pages { room, .. }
        | Message::Aux { room, .. }
        | Message::Done { room, .. }
        | Message::Resend { room, .. }
        | Message::Ack { room } => Some(*room),
        Message::Abort { room, .. } => *room,
        _ => None,
    }
}

/// A short name of a message kind for error texts.
pub(crate) fn name(m: &Message) -> &'static str {
    match m {
        Message::Hello(_) => "Hello",
        Message::HelloAck => "HelloAck",
        Message::Ping => "Ping",
        Message::Abort { .. } => "Abort",
        Message::Register { .. } => "Register",
        Message::Registered { .. } => "Registered",
        Message::Pages { .. } => "Pages",
        Message::Aux { .. } => "Aux",
        Message::Done { .. } => "Done",
        Message::Resend { .. } => "Resend",
        Message::Ack { .. } => "Ack",
        Message::Exists { .. } => "Exists",
        Message::ExistsOk { .. } => "ExistsOk",
        Message::Get { .. } => "Get",
        Message::GetOk { .. } => "GetOk",
        Message::Put { .. } => "Put",
        Message::PutOk { .. } => "PutOk",
        Message::StoreFailed { .. } => "StoreFailed",
    }
}
