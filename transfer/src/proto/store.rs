//! The store protocol: a client asks a KV store server whether pages exist (leading hits),
//! gets and puts pages by hash. Every page carries its xxh3-64 on the wire; a page that fails
//! its check is never handed out: the client reports it as a miss, the server refuses to
//! store it.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;
use sglrs_radix_cache::PageHash;

use super::sender::name;
use super::{
    check_hello, make_hello, min_deadline, page_checksum, AbortReason, AuthKey, Config, HelloRetry,
    Liveness, Message, StorePage, TransferError,
};
use sglrs_radix_cache::KvLayout;

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum State {
    Handshake,
    Open,
    Closed,
}

/// What a [`StoreClient`] reports to its application.
#[derive(Clone, Debug, PartialEq)]
pub enum StoreClientEvent {
    /// The store accepted the hello.
    Connected,
    /// Answer to [`StoreClient::exists`].
    Exists {
        /// The request.
        id: u64,
        /// How many hashes, from the first, the store holds.
        hits: usize,
    },
    /// Answer to [`StoreClient::get`]: one entry per hash, `None` for a miss or a page that
    /// failed its integrity check.
    Got {
        /// The request.
        id: u64,
        /// The pages.
        pages: Vec<Option<Bytes>>,
        /// How many pages were dropped because their checksum did not match.
        corrupted: usize,
    },
    /// Answer to [`StoreClient::put`].
    Put {
        /// The request.
        id: u64,
        /// Pages stored or already present.
        stored: usize,
        /// Pages the store refused (failed checksum).
        rejected: usize,
    },
    /// A request failed.
    Failed {
        /// The request.
        id: u64,
        /// Why.
        error: TransferError,
    },
    /// The connection ended; every pending request failed.
    Closed {
        /// Why.
        error: TransferError,
    },
}

/// Why a store request could not be issued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreRequestError {
    /// The connection has closed.
    #[error("store connection is closed")]
    Closed,
    /// The request names more pages than allowed.
    #[error("{got} pages in one request, at most {max}")]
    TooManyPages {
        /// Pages in the request.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// A page to put is not one layout page long.
    #[error("page of {got} bytes, the layout's page has {want}")]
    PageSize {
        /// Its length.
        got: usize,
        /// The layout's page length.
        want: usize,
    },
}

#[derive(Debug)]
enum Kind {
    Exists,
    Get(Vec<PageHash>),
    Put,
}

#[derive(Debug)]
struct Pending {
    kind: Kind,
    deadline: Instant,
}

/// The client end of a store connection (sans-IO).
#[derive(Debug)]
pub struct StoreClient {
    cfg: Config,
    layout: KvLayout,
    state: State,
    now: Instant,
    live: Liveness,
    hello: HelloRetry,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    /// Requests made before the hello was accepted.
    waiting: VecDeque<Message>,
    control: VecDeque<Message>,
    data: VecDeque<Message>,
    events: VecDeque<StoreClientEvent>,
}

impl StoreClient {
    /// A new dialing end; its hello is the first message to transmit.
    pub fn new(cfg: Config, layout: KvLayout, auth: &AuthKey, now: Instant) -> Self {
        let hello = make_hello(&layout, auth);
        let retry = HelloRetry::new(hello.clone(), &cfg, now);
        Self {
            cfg,
            layout,
            state: State::Handshake,
            now,
            live: Liveness::new(now),
            control: VecDeque::from([hello.clone()]),
            hello: retry,
            next_id: 1,
            pending: HashMap::new(),
            waiting: VecDeque::new(),
            data: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Whether the connection ended.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Requests in flight.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn issue(
        &mut self,
        n: usize,
        kind: Kind,
        msg: Message,
        now: Instant,
    ) -> Result<u64, StoreRequestError> {
        self.now = now;
        if self.state == State::Closed {
            return Err(StoreRequestError::Closed);
        }
        if n > self.cfg.max_pages {
            return Err(StoreRequestError::TooManyPages {
                got: n,
                max: self.cfg.max_pages,
            });
        }
        let id = request_id(&msg);
        self.pending.insert(
            id,
            Pending {
                kind,
                deadline: now + self.cfg.request_timeout,
            },
        );
        if self.state == State::Open {
            self.queue(msg);
        } else {
            self.waiting.push_back(msg);
        }
        Ok(id)
    }

    fn queue(&mut self, msg: Message) {
        if msg.is_bulk() {
            self.data.push_back(msg);
        } else {
            self.control.push_back(msg);
        }
    }

    fn next(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Asks how many of `hashes`, from the first, the store holds.
    pub fn exists(
        &mut self,
        hashes: Vec<PageHash>,
        now: Instant,
    ) -> Result<u64, StoreRequestError> {
        let id = self.next();
        self.issue(
            hashes.len(),
            Kind::Exists,
            Message::Exists { id, hashes },
            now,
        )
    }

    /// Asks for the pages named by `hashes`.
    pub fn get(&mut self, hashes: Vec<PageHash>, now: Instant) -> Result<u64, StoreRequestError> {
        let id = self.next();
        self.issue(
            hashes.len(),
            Kind::Get(hashes.clone()),
            Message::Get { id, hashes },
            now,
        )
    }

    /// Stores pages (each one layout page, in the executor's layout).
    pub fn put(
        &mut self,
        pages: Vec<(PageHash, Bytes)>,
        now: Instant,
    ) -> Result<u64, StoreRequestError> {
        let want = self.layout.page_bytes();
        if let Some((_, p)) = pages.iter().find(|(_, p)| p.len() != want) {
            return Err(StoreRequestError::PageSize { got: p.len(), want });
        }
        let id = self.next();
        let pages = pages
            .into_iter()
            .map(|(hash, data)| StorePage {
                hash,
                checksum: page_checksum(&data),
                data,
            })
            .collect::<Vec<_>>();
        self.issue(pages.len(), Kind::Put, Message::Put { id, pages }, now)
    }

    /// Feeds one message from the store.
    pub fn handle_message(&mut self, msg: Message, now: Instant) {
        self.now = now;
        if self.state == State::Closed {
            return;
        }
        self.live.last_recv = now;
        match (self.state, msg) {
            (State::Handshake, Message::HelloAck) => {
                self.state = State::Open;
                while let Some(m) = self.waiting.pop_front() {
                    self.queue(m);
                }
                self.events.push_back(StoreClientEvent::Connected);
            }
            (State::Open, Message::HelloAck) | (_, Message::Ping) => {}
            (_, Message::Abort { room: None, reason }) => self.shut(TransferError::Remote(reason)),
            (State::Open, Message::ExistsOk { id, hits }) => {
                if let Some(p) = self.take(id, |k| matches!(k, Kind::Exists)) {
                    drop(p);
                    self.events.push_back(StoreClientEvent::Exists {
                        id,
                        hits: hits as usize,
                    });
                }
            }
            (State::Open, Message::GetOk { id, pages }) => {
                let Some(Kind::Get(hashes)) = self.take(id, |k| matches!(k, Kind::Get(_))) else {
                    return;
                };
                if pages.len() != hashes.len() {
                    let reason = format!(
                        "get answer has {} pages for {} hashes",
                        pages.len(),
                        hashes.len()
                    );
                    self.refuse(AbortReason::Protocol(reason));
                    return;
                }
                let mut corrupted = 0;
                let pages = pages
                    .into_iter()
                    .zip(&hashes)
                    .map(|(p, h)| {
                        let p = p?;
                        if p.hash != *h
                            || p.data.len() != self.layout.page_bytes()
                            || page_checksum(&p.data) != p.checksum
                        {
                            corrupted += 1;
                            return None;
                        }
                        Some(p.data)
                    })
                    .collect();
                self.events.push_back(StoreClientEvent::Got {
                    id,
                    pages,
                    corrupted,
                });
            }
            (
                State::Open,
                Message::PutOk {
                    id,
                    stored,
                    rejected,
                },
            ) => {
                if self.take(id, |k| matches!(k, Kind::Put)).is_some() {
                    self.events.push_back(StoreClientEvent::Put {
                        id,
                        stored: stored as usize,
                        rejected: rejected as usize,
                    });
                }
            }
            (State::Open, Message::StoreFailed { id, reason }) => {
                if self.pending.remove(&id).is_some() {
                    self.events.push_back(StoreClientEvent::Failed {
                        id,
                        error: TransferError::Remote(AbortReason::Protocol(reason)),
                    });
                }
            }
            (State::Handshake, _) => {}
            (_, other) => self.refuse(AbortReason::Protocol(format!(
                "unexpected {} message",
                name(&other)
            ))),
        }
    }

    /// Removes a pending request if it has the expected kind; a late answer to a request
    /// that already timed out is ignored.
    fn take(&mut self, id: u64, ok: impl Fn(&Kind) -> bool) -> Option<Kind> {
        match self.pending.get(&id) {
            Some(p) if ok(&p.kind) => self.pending.remove(&id).map(|p| p.kind),
            Some(_) => {
                self.refuse(AbortReason::Protocol(format!(
                    "answer of the wrong kind for request {id}"
                )));
                None
            }
            None => None,
        }
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
        let mut ids: Vec<u64> = self.pending.keys().copied().collect();
        ids.sort();
        for id in ids {
            self.events.push_back(StoreClientEvent::Failed {
                id,
                error: error.clone(),
            });
        }
        self.pending.clear();
        self.waiting.clear();
        self.data.clear();
        self.control
            .retain(|m| matches!(m, Message::Abort { room: None, .. }));
        self.events.push_back(StoreClientEvent::Closed { error });
    }

    /// Closes the connection from this end, failing every pending request.
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

    /// The driver lost the connection below the protocol (reset, unreachable, closed):
    /// everything on it fails and every buffer is released.
    pub fn handle_connection_lost(&mut self, reason: String, now: Instant) {
        self.now = now;
        if self.state != State::Closed {
            self.shut(TransferError::ConnectionLost(reason));
        }
    }

    /// Advances timers: idle timeout, heartbeats, hello retransmission, request deadlines.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.state == State::Closed {
            return;
        }
        if self.live.silent(&self.cfg, now) {
            self.shut(TransferError::PeerTimeout(self.cfg.idle_timeout));
            return;
        }
        if self.state == State::Handshake && !self.hello.tick(&self.cfg, now, &mut self.control) {
            self.shut(TransferError::Local(AbortReason::Timeout));
            return;
        }
        self.live.heartbeat(&self.cfg, now, &mut self.control);
        let mut late: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.deadline)
            .map(|(&id, _)| id)
            .collect();
        late.sort();
        for id in late {
            self.pending.remove(&id);
            self.events.push_back(StoreClientEvent::Failed {
                id,
                error: TransferError::Local(AbortReason::Timeout),
            });
        }
    }

    /// The next instant [`handle_timeout`](Self::handle_timeout) must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        let mut t = Some(self.live.next(&self.cfg));
        if self.state == State::Handshake {
            t = min_deadline(t, self.hello.deadline());
        }
        for p in self.pending.values() {
            t = min_deadline(t, p.deadline);
        }
        t
    }

    /// The next small message for the ordered control stream.
    pub fn poll_transmit_control(&mut self) -> Option<Message> {
        let m = self.control.pop_front()?;
        self.live.last_sent = self.now;
        Some(m)
    }

    /// The next bulk message (`Put`), which a driver may send on its own stream.
    pub fn poll_transmit_data(&mut self) -> Option<Message> {
        let m = self.data.pop_front()?;
        self.live.last_sent = self.now;
        Some(m)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<StoreClientEvent> {
        self.events.pop_front()
    }
}

fn request_id(m: &Message) -> u64 {
    match m {
        Message::Exists { id, .. } | Message::Get { id, .. } | Message::Put { id, .. } => *id,
        _ => 0,
    }
}

/// A validated store request for the server's backend.
#[derive(Clone, Debug, PartialEq)]
pub enum StoreOp {
    /// Count leading hits.
    Exists(Vec<PageHash>),
    /// Read pages.
    Get(Vec<PageHash>),
    /// Write pages (each already checked against its checksum).
    Put(Vec<(PageHash, Bytes)>),
}

/// The backend's answer to a [`StoreOp`], given to [`StoreServer::respond`].
#[derive(Clone, Debug, PartialEq)]
pub enum StoreReply {
    /// Leading hits.
    Exists(usize),
    /// One entry per requested hash.
    Get(Vec<Option<Bytes>>),
    /// Pages stored or already present.
    Put(usize),
    /// The backend failed.
    Failed(String),
}

/// What a [`StoreServer`] reports to its backend driver.
#[derive(Clone, Debug, PartialEq)]
pub enum StoreServerEvent {
    /// The client's hello was accepted.
    Connected,
    /// A request to execute; answer it with [`StoreServer::respond`].
    Request {
        /// The request.
        id: u64,
        /// What to do.
        op: StoreOp,
    },
    /// The connection ended.
    Closed {
        /// Why.
        error: TransferError,
    },
}

#[derive(Debug)]
struct Served {
    hashes: Option<Vec<PageHash>>,
    rejected: u32,
}

/// The server end of a store connection (sans-IO): validates requests, hands them to the
/// backend and encodes its answers.
#[derive(Debug)]
pub struct StoreServer {
    cfg: Config,
    layout: KvLayout,
    auth: AuthKey,
    state: State,
    now: Instant,
    live: Liveness,
    pending: HashMap<u64, Served>,
    control: VecDeque<Message>,
    data: VecDeque<Message>,
    events: VecDeque<StoreServerEvent>,
}

impl StoreServer {
    /// A new accepting end, waiting for the client's hello.
    pub fn new(cfg: Config, layout: KvLayout, auth: AuthKey, now: Instant) -> Self {
        Self {
            cfg,
            layout,
            auth,
            state: State::Handshake,
            now,
            live: Liveness::new(now),
            pending: HashMap::new(),
            control: VecDeque::new(),
            data: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Whether the connection ended.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Feeds one message from the client.
    pub fn handle_message(&mut self, msg: Message, now: Instant) {
        self.now = now;
        if self.state == State::Closed {
            return;
        }
        self.live.last_recv = now;
        match (self.state, msg) {
            (_, Message::Hello(h)) => match check_hello(&h, &self.layout, &self.auth) {
                Ok(()) => {
                    self.control.push_back(Message::HelloAck);
                    if self.state == State::Handshake {
                        self.state = State::Open;
                        self.events.push_back(StoreServerEvent::Connected);
                    }
                }
                Err(reason) => self.refuse(reason),
            },
            (_, Message::Ping) => {}
            (_, Message::Abort { room: None, reason }) => self.shut(TransferError::Remote(reason)),
            (State::Open, Message::Exists { id, hashes }) => {
                if self.admit(id, hashes.len(), None) {
                    self.events.push_back(StoreServerEvent::Request {
                        id,
                        op: StoreOp::Exists(hashes),
                    });
                }
            }
            (State::Open, Message::Get { id, hashes }) => {
                if self.admit(id, hashes.len(), Some(hashes.clone())) {
                    self.events.push_back(StoreServerEvent::Request {
                        id,
                        op: StoreOp::Get(hashes),
                    });
                }
            }
            (State::Open, Message::Put { id, pages }) => {
                if self.admit(id, pages.len(), None) {
                    let want = self.layout.page_bytes();
                    let n = pages.len();
                    let good: Vec<(PageHash, Bytes)> = pages
                        .into_iter()
                        .filter(|p| p.data.len() == want && page_checksum(&p.data) == p.checksum)
                        .map(|p| (p.hash, p.data))
                        .collect();
                    if let Some(s) = self.pending.get_mut(&id) {
                        s.rejected = (n - good.len()) as u32;
                    }
                    self.events.push_back(StoreServerEvent::Request {
                        id,
                        op: StoreOp::Put(good),
                    });
                }
            }
            (State::Handshake, _) => {
                self.refuse(AbortReason::Protocol("request before hello".into()))
            }
            (_, other) => self.refuse(AbortReason::Protocol(format!(
                "unexpected {} message",
                name(&other)
            ))),
        }
    }

    fn admit(&mut self, id: u64, n: usize, hashes: Option<Vec<PageHash>>) -> bool {
        if n > self.cfg.max_pages {
            self.control.push_back(Message::StoreFailed {
                id,
                reason: format!("{n} pages in one request, at most {}", self.cfg.max_pages),
            });
            return false;
        }
        if self.pending.contains_key(&id) {
            self.refuse(AbortReason::Protocol(format!(
                "request id {id} reused while in flight"
            )));
            return false;
        }
        self.pending.insert(
            id,
            Served {
                hashes,
                rejected: 0,
            },
        );
        true
    }

    /// Answers request `id` with the backend's reply. Pages of a `Get` get their checksums
    /// here. Unknown ids (the connection closed meanwhile) are ignored.
    pub fn respond(&mut self, id: u64, reply: StoreReply, now: Instant) {
        self.now = now;
        if self.state == State::Closed {
            return;
        }
        let Some(served) = self.pending.remove(&id) else {
            return;
        };
        match reply {
            StoreReply::Exists(hits) => self.control.push_back(Message::ExistsOk {
                id,
                hits: hits as u32,
            }),
            StoreReply::Put(stored) => self.control.push_back(Message::PutOk {
                id,
                stored: stored as u32,
                rejected: served.rejected,
            }),
            StoreReply::Failed(reason) => {
                self.control.push_back(Message::StoreFailed { id, reason })
            }
            StoreReply::Get(pages) => {
                let hashes = served.hashes.unwrap_or_default();
                if pages.len() != hashes.len() {
                    let reason = format!(
                        "backend answered {} pages for {} hashes",
                        pages.len(),
                        hashes.len()
                    );
                    self.control.push_back(Message::StoreFailed { id, reason });
                    return;
                }
                let pages = pages
                    .into_iter()
                    .zip(hashes)
                    .map(|(p, hash)| {
                        p.map(|data| StorePage {
                            hash,
                            checksum: page_checksum(&data),
                            data,
                        })
                    })
                    .collect();
                self.data.push_back(Message::GetOk { id, pages });
            }
        }
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
        self.pending.clear();
        self.data.clear();
        self.control
            .retain(|m| matches!(m, Message::Abort { room: None, .. }));
        self.events.push_back(StoreServerEvent::Closed { error });
    }

    /// The driver lost the connection below the protocol (reset, unreachable, closed):
    /// everything on it fails and every buffer is released.
    pub fn handle_connection_lost(&mut self, reason: String, now: Instant) {
        self.now = now;
        if self.state != State::Closed {
            self.shut(TransferError::ConnectionLost(reason));
        }
    }

    /// Closes the connection from this end (the client is told why).
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

    /// Advances timers: idle timeout and heartbeats.
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
    }

    /// The next instant [`handle_timeout`](Self::handle_timeout) must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        (self.state != State::Closed).then(|| self.live.next(&self.cfg))
    }

    /// The next small message for the ordered control stream.
    pub fn poll_transmit_control(&mut self) -> Option<Message> {
        let m = self.control.pop_front()?;
        self.live.last_sent = self.now;
        Some(m)
    }

    /// The next bulk message (`GetOk`), which a driver may send on its own stream.
    pub fn poll_transmit_data(&mut self) -> Option<Message> {
        let m = self.data.pop_front()?;
        self.live.last_sent = self.now;
        Some(m)
    }

    /// The next event for the backend driver.
    pub fn poll_event(&mut self) -> Option<StoreServerEvent> {
        self.events.pop_front()
    }
}
