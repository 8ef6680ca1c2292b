//! The prefill host's endpoint: accepts decode hosts, matches their room registrations with
//! locally computed pages, and sends them.

use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

use super::{drive, QuicConfig, QuicError, Security, Shared, ALPN_KV};
use crate::bootstrap::{Offer, Rendezvous};
use crate::proto::{
    AbortReason, AuthKey, AuxData, RoomId, SenderEvent, TransferError, TransferSender,
};
use sglrs_radix_cache::KvLayout;

type ConnId = u64;

#[derive(Debug)]
struct Payload {
    pages: Vec<Bytes>,
    aux: AuxData,
    /// The prefill failed: the room is refused with this reason when it registers.
    failed: Option<String>,
}

type Waiter = oneshot::Sender<Result<(), TransferError>>;

struct Inner {
    cfg: QuicConfig,
    layout: KvLayout,
    auth: AuthKey,
    next_conn: AtomicU64,
    rendezvous: Mutex<Rendezvous<ConnId, Payload>>,
    conns: Mutex<HashMap<ConnId, Arc<Shared<TransferSender>>>>,
    waiters: Mutex<HashMap<RoomId, Waiter>>,
    /// Leading pages of each room in flight that its decode host did not ask for.
    skipped: Mutex<HashMap<RoomId, usize>>,
}

/// What [`KvSender::send`] moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendReport {
    /// Pages sent.
    pub sent: usize,
    /// Leading pages not sent: the decode host had them already (its own prefix cache) and
    /// registered only the rest.
    pub skipped: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn finish(&self, room: RoomId, r: Result<(), TransferError>) {
        lock(&self.rendezvous).forget(room);
        if let Some(w) = lock(&self.waiters).remove(&room) {
            let _ = w.send(r);
        }
    }

    /// Submits a room's payload on the connection its decode host registered it on. A
    /// decode host that already holds a prefix of the prompt's pages registers fewer pages
    /// than the prompt has: it gets the trailing ones.
    fn submit(&self, shared: &Shared<TransferSender>, room: RoomId, mut p: Payload) {
        if let Some(reason) = p.failed.take() {
            shared.with(|c, now| c.cancel(room, &reason, now));
            self.finish(
                room,
                Err(TransferError::Local(AbortReason::Cancelled(reason))),
            );
            return;
        }
        let want = shared.lock().registered_pages(room).map(|n| n as usize);
        if let Some(want) = want.filter(|&w| w < p.pages.len()) {
            let skip = p.pages.len() - want;
            p.pages.drain(..skip);
            lock(&self.skipped).insert(room, skip);
        }
        if let Err(e) = shared.with(|c, now| c.submit(room, p.pages, p.aux, now)) {
            let reason = AbortReason::Cancelled(format!("submit refused: {e}"));
            shared.with(|c, now| c.cancel(room, &e.to_string(), now));
            self.finish(room, Err(TransferError::Local(reason)));
        }
    }

    fn on_event(&self, conn: ConnId, shared: &Shared<TransferSender>, e: SenderEvent) {
        match e {
            SenderEvent::RoomRegistered { room, .. } => {
                let held = lock(&self.rendezvous).register(room, conn);
                if let Some(p) = held {
                    self.submit(shared, room, p);
                }
            }
            SenderEvent::RoomDone { room } => self.finish(room, Ok(())),
            SenderEvent::RoomFailed { room, error } => self.finish(room, Err(error)),
            SenderEvent::Connected | SenderEvent::Closed { .. } => {}
        }
    }
}

/// The prefill host's transfer endpoint. Decode hosts dial it (its address is the request's
/// `bootstrap_host:bootstrap_port`); [`send`](Self::send) hands over a room's pages.
pub struct KvSender {
    inner: Arc<Inner>,
    endpoint: quinn::Endpoint,
    accept: tokio::task::JoinHandle<()>,
}

impl KvSender {
    /// Listens on `addr` (UDP). Must be called inside a tokio runtime.
    pub fn bind(
        addr: SocketAddr,
        layout: KvLayout,
        security: &Security,
        cfg: QuicConfig,
    ) -> Result<Self, QuicError> {
        let endpoint = cfg.endpoint(addr, Some((&security.identity, ALPN_KV)))?;
        let inner = Arc::new(Inner {
            cfg,
            layout,
            auth: security.auth(),
            next_conn: AtomicU64::new(1),
            rendezvous: Mutex::new(Rendezvous::default()),
            conns: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
            skipped: Mutex::new(HashMap::new()),
        });
        let accept = tokio::spawn(accept_loop(endpoint.clone(), inner.clone()));
        Ok(Self {
            inner,
            endpoint,
            accept,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr, QuicError> {
        Ok(self.endpoint.local_addr()?)
    }

    /// Sends a room's pages (one `Bytes` per page, in the executor's page layout) and aux
    /// data to the decode host that registers (or registered) the room, and waits until it
    /// acknowledged them. Fails when no decode host registers the room, the decode host
    /// aborts or dies, or the room does not finish within the room timeout; in every case
    /// the pages are released before this returns.
    ///
    /// A decode host may register fewer pages than `pages` holds (it has the leading ones
    /// in its own cache): only the trailing ones are sent, and the report says how many
    /// were skipped.
    pub async fn send(
        &self,
        room: RoomId,
        pages: Vec<Bytes>,
        aux: AuxData,
    ) -> Result<SendReport, QuicError> {
        let total = pages.len();
        let r = self.send_inner(room, pages, aux).await;
        let skipped = lock(&self.inner.skipped).remove(&room).unwrap_or(0);
        r.map(|()| SendReport {
            sent: total - skipped,
            skipped,
        })
    }

    async fn send_inner(
        &self,
        room: RoomId,
        pages: Vec<Bytes>,
        aux: AuxData,
    ) -> Result<(), QuicError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut w = lock(&self.inner.waiters);
            if w.contains_key(&room) {
                return Err(QuicError::DuplicateRoom(room.0));
            }
            w.insert(room, tx);
        }
        let timeout = self.inner.cfg.proto.room_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let payload = Payload {
            pages,
            aux,
            failed: None,
        };
        let offer = {
            let mut r = lock(&self.inner.rendezvous);
            // Failures offered by `fail` whose room never registered.
            r.expire(std::time::Instant::now());
            r.offer(room, payload, deadline.into_std())
        };
        match offer {
            Offer::Ready(conn, p) => {
                let shared = lock(&self.inner.conns).get(&conn).cloned();
                match shared {
                    Some(s) => self.inner.submit(&s, room, p),
                    None => self.inner.finish(
                        room,
                        Err(TransferError::ConnectionLost(
                            "decode host disconnected".into(),
                        )),
                    ),
                }
            }
            Offer::Held => {}
            Offer::Duplicate(_) => {
                lock(&self.inner.waiters).remove(&room);
                return Err(QuicError::DuplicateRoom(room.0));
            }
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(r)) => Ok(r?),
            Ok(Err(_)) => Err(QuicError::Shutdown),
            Err(_) => {
                lock(&self.inner.waiters).remove(&room);
                if lock(&self.inner.rendezvous).withdraw(room).is_some() {
                    return Err(QuicError::NotRegistered(room.0, timeout));
                }
                let conns: Vec<_> = lock(&self.inner.conns).values().cloned().collect();
                for c in conns {
                    c.with(|c, now| c.cancel(room, "timed out", now));
                }
                Err(TransferError::Local(AbortReason::Timeout).into())
            }
        }
    }

    /// Pages held for rooms not yet acknowledged (waiting for registration or in transfer).
    pub fn held_pages(&self) -> usize {
        let waiting: usize = lock(&self.inner.rendezvous)
            .held()
            .map(|p| p.pages.len())
            .sum();
        let conns: Vec<_> = lock(&self.inner.conns).values().cloned().collect();
        waiting + conns.iter().map(|c| c.lock().held_pages()).sum::<usize>()
    }

    /// The prefill of `room` failed: its decode host is told why (at once if it registered
    /// the room, else when it does, within the room timeout), so it fails the request
    /// instead of waiting for pages that will not come.
    pub fn fail(&self, room: RoomId, reason: &str) {
        let timeout = self.inner.cfg.proto.room_timeout;
        let now = std::time::Instant::now();
        let payload = Payload {
            pages: Vec::new(),
            aux: AuxData::default(),
            failed: Some(reason.to_string()),
        };
        let offer = {
            let mut r = lock(&self.inner.rendezvous);
            r.expire(now);
            r.offer(room, payload, now + timeout)
        };
        if let Offer::Ready(conn, p) = offer {
            let shared = lock(&self.inner.conns).get(&conn).cloned();
            if let Some(s) = shared {
                self.inner.submit(&s, room, p);
            }
        }
    }

    /// Rooms waiting for their registration or in transfer.
    pub fn open_rooms(&self) -> usize {
        lock(&self.inner.waiters).len()
    }

    /// Decode hosts connected now.
    pub fn connections(&self) -> usize {
        lock(&self.inner.conns).len()
    }

    /// Stops accepting and closes every connection.
    pub fn close(&self) {
        self.accept.abort();
        let conns: Vec<_> = lock(&self.inner.conns).values().cloned().collect();
        for c in conns {
            c.with(|c, now| c.close("prefill host shutting down", now));
        }
        self.endpoint.close(0u32.into(), b"shutdown");
    }
}

impl Drop for KvSender {
    fn drop(&mut self) {
        self.close();
    }
}

async fn accept_loop(endpoint: quinn::Endpoint, inner: Arc<Inner>) {
    while let Some(incoming) = endpoint.accept().await {
        let inner = inner.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            let idle = inner.cfg.proto.idle_timeout;
            let Ok(Ok((send, recv))) = tokio::time::timeout(idle, conn.accept_bi()).await else {
                conn.close(1u32.into(), b"no control stream");
                return;
            };
            let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
            let now = std::time::Instant::now();
            let shared = Shared::new(TransferSender::new(
                inner.cfg.proto.clone(),
                inner.layout,
                inner.auth.clone(),
                now,
            ));
            lock(&inner.conns).insert(id, shared.clone());
            let (ev_inner, ev_shared) = (inner.clone(), shared.clone());
            drive(
                conn,
                send,
                recv,
                shared,
                move |e| ev_inner.on_event(id, &ev_shared, e),
                inner.cfg.data_streams,
            )
            .await;
            lock(&inner.conns).remove(&id);
            lock(&inner.rendezvous).forget_conn(&id);
        });
    }
}
