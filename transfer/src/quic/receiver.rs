//! The decode host's endpoint: dials prefill hosts (one connection per host, reused),
//! registers rooms and streams their pages to the caller.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::mpsc;

use super::{drive, QuicConfig, QuicError, Security, Shared, ALPN_KV, CLUSTER_NAME};
use crate::proto::{
    AuthKey, AuxData, Page, ReceiverEvent, RoomId, TransferError, TransferReceiver,
};
use sglrs_radix_cache::KvLayout;

/// What a [`RoomStream`] yields.
#[derive(Clone, Debug, PartialEq)]
pub enum RoomEvent {
    /// Pages arrived: write `pages[i]` into destination page `dst_pages[i]`.
    Pages {
        /// Destination page ids.
        dst_pages: Vec<u32>,
        /// Page bytes, in the executor's layout, as the pieces they arrived in: copy each
        /// into its slot with [`Page::copy_to`].
        pages: Vec<Page>,
    },
    /// The first token and logprobs from prefill.
    Aux(AuxData),
    /// Every page arrived and was verified: the request can start decoding.
    Done,
    /// The room failed; the pages it delivered must not be used.
    Failed(TransferError),
}

/// A room's pages and aux data, gathered by [`RoomStream::collect`].
#[derive(Clone, Debug, Default)]
pub struct ReceivedRoom {
    /// `(destination page id, bytes)` in arrival order.
    pub pages: Vec<(u32, Page)>,
    /// The aux data.
    pub aux: Option<AuxData>,
}

type RoomTx = mpsc::UnboundedSender<RoomEvent>;

struct Conn {
    shared: Arc<Shared<TransferReceiver>>,
    rooms: Mutex<HashMap<RoomId, RoomTx>>,
    /// Why the connection closed, once it has.
    closed: Mutex<Option<TransferError>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Conn {
    fn on_event(&self, e: ReceiverEvent) {
        let (room, ev, last) = match e {
            ReceiverEvent::Pages {
                room,
                dst_pages,
                pages,
            } => (room, RoomEvent::Pages { dst_pages, pages }, false),
            ReceiverEvent::Aux { room, aux } => (room, RoomEvent::Aux(aux), false),
            ReceiverEvent::RoomDone { room } => (room, RoomEvent::Done, true),
            ReceiverEvent::RoomFailed { room, error } => (room, RoomEvent::Failed(error), true),
            ReceiverEvent::Closed { error } => {
                lock(&self.closed).get_or_insert(error.clone());
                for (_, tx) in lock(&self.rooms).drain() {
                    let _ = tx.send(RoomEvent::Failed(error.clone()));
                }
                return;
            }
            ReceiverEvent::Connected => return,
        };
        let mut rooms = lock(&self.rooms);
        if let Some(tx) = rooms.get(&room) {
            let _ = tx.send(ev);
        }
        if last {
            rooms.remove(&room);
        }
    }
}

/// One registered room's incoming pages. Dropping it before `Done` cancels the room.
pub struct RoomStream {
    room: RoomId,
    rx: mpsc::UnboundedReceiver<RoomEvent>,
    conn: Weak<Conn>,
    finished: bool,
}

impl RoomStream {
    /// The room.
    pub fn room(&self) -> RoomId {
        self.room
    }

    /// The next event; `None` after `Done` or `Failed`.
    pub async fn next(&mut self) -> Option<RoomEvent> {
        if self.finished {
            return None;
        }
        let e = self.rx.recv().await;
        match &e {
            Some(RoomEvent::Done | RoomEvent::Failed(_)) | None => self.finished = true,
            _ => {}
        }
        e
    }

    /// Waits for the whole room and returns its pages and aux data.
    pub async fn collect(mut self) -> Result<ReceivedRoom, TransferError> {
        let mut out = ReceivedRoom::default();
        while let Some(e) = self.next().await {
            match e {
                RoomEvent::Pages { dst_pages, pages } => {
                    out.pages.extend(dst_pages.into_iter().zip(pages))
                }
                RoomEvent::Aux(a) => out.aux = Some(a),
                RoomEvent::Done => return Ok(out),
                RoomEvent::Failed(e) => return Err(e),
            }
        }
        Err(TransferError::ConnectionLost(
            "transfer endpoint shut down".into(),
        ))
    }
}

impl Drop for RoomStream {
    fn drop(&mut self) {
        if !self.finished {
            if let Some(c) = self.conn.upgrade() {
                lock(&c.rooms).remove(&self.room);
                c.shared
                    .with(|core, now| core.cancel(self.room, "decode side dropped the room", now));
            }
        }
    }
}

/// The decode host's transfer endpoint.
pub struct KvReceiver {
    endpoint: quinn::Endpoint,
    client: quinn::ClientConfig,
    cfg: QuicConfig,
    layout: KvLayout,
    auth: AuthKey,
    conns: Arc<Mutex<HashMap<SocketAddr, Arc<Conn>>>>,
    dial: tokio::sync::Mutex<()>,
}

impl KvReceiver {
    /// A dialing endpoint bound to `bind` (use port 0). Must be called inside a tokio runtime.
    pub fn bind(
        bind: SocketAddr,
        layout: KvLayout,
        security: &Security,
        cfg: QuicConfig,
    ) -> Result<Self, QuicError> {
        let endpoint = cfg.endpoint(bind, None)?;
        let client = cfg.client(&security.identity, ALPN_KV)?;
        Ok(Self {
            endpoint,
            client,
            cfg,
            layout,
            auth: security.auth(),
            conns: Arc::new(Mutex::new(HashMap::new())),
            dial: tokio::sync::Mutex::new(()),
        })
    }

    async fn conn(&self, prefill: SocketAddr) -> Result<Arc<Conn>, QuicError> {
        let _dialing = self.dial.lock().await;
        if let Some(c) = lock(&self.conns).get(&prefill) {
            if !c.shared.lock().is_closed() {
                return Ok(c.clone());
            }
        }
        let conn = self
            .endpoint
            .connect_with(self.client.clone(), prefill, CLUSTER_NAME)?
            .await?;
        let (send, recv) = conn.open_bi().await?;
        let now = std::time::Instant::now();
        let shared = Shared::new(TransferReceiver::new(
            self.cfg.proto.clone(),
            self.layout,
            &self.auth,
            now,
        ));
        let c = Arc::new(Conn {
            shared: shared.clone(),
            rooms: Mutex::new(HashMap::new()),
            closed: Mutex::new(None),
        });
        lock(&self.conns).insert(prefill, c.clone());
        let (ev, conns, streams) = (c.clone(), self.conns.clone(), self.cfg.data_streams);
        tokio::spawn(async move {
            drive(conn, send, recv, shared, |e| ev.on_event(e), streams).await;
            let mut map = lock(&conns);
            if map.get(&prefill).is_some_and(|x| Arc::ptr_eq(x, &ev)) {
                map.remove(&prefill);
            }
            drop(map);
            ev.on_event(ReceiverEvent::Closed {
                error: TransferError::ConnectionLost("connection ended".into()),
            });
        });
        Ok(c)
    }

    /// Registers `room` with the prefill host at `prefill` (dialing it if needed): its pages
    /// will land in `dst_pages`, one destination page per page, in order.
    pub async fn register(
        &self,
        prefill: SocketAddr,
        room: RoomId,
        dst_pages: Vec<u32>,
    ) -> Result<RoomStream, QuicError> {
        let c = self.conn(prefill).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&c.rooms).insert(room, tx);
        if let Err(e) = c
            .shared
            .with(|core, now| core.register(room, dst_pages, now))
        {
            lock(&c.rooms).remove(&room);
            // A connection refused at hello (wrong secret, other layout) says why.
            return Err(match lock(&c.closed).clone() {
                Some(reason) => reason.into(),
                None => e.into(),
            });
        }
        Ok(RoomStream {
            room,
            rx,
            conn: Arc::downgrade(&c),
            finished: false,
        })
    }

    /// Prefill hosts connected now.
    pub fn connections(&self) -> usize {
        lock(&self.conns).len()
    }

    /// Closes every connection.
    pub fn close(&self) {
        let conns: Vec<_> = lock(&self.conns).values().cloned().collect();
        for c in conns {
            c.shared
                .with(|core, now| core.close("decode host shutting down", now));
        }
        self.endpoint.close(0u32.into(), b"shutdown");
    }
}

impl Drop for KvReceiver {
    fn drop(&mut self) {
        self.close();
    }
}
