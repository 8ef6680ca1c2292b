//! One task per QUIC connection drives one sans-IO protocol end: it feeds received messages
//! and timeouts into the core, writes what the core emits (control messages in order on the
//! control stream, page messages each on its own stream), and hands events to a callback.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::proto::wire::{decode, encode, frame_len};
use crate::proto::Message;

/// The uniform face of the four protocol ends, for the driver.
pub(crate) trait Core: Send + 'static {
    type Event: Send + 'static;
    fn handle_message(&mut self, m: Message, now: Instant);
    fn handle_timeout(&mut self, now: Instant);
    fn handle_connection_lost(&mut self, reason: String, now: Instant);
    fn poll_timeout(&self) -> Option<Instant>;
    fn poll_control(&mut self) -> Option<Message>;
    fn poll_data(&mut self) -> Option<Message>;
    fn poll_event(&mut self) -> Option<Self::Event>;
    fn is_closed(&self) -> bool;
}

macro_rules! impl_core {
    ($t:ty, $e:ty, $data:expr) => {
        impl Core for $t {
            type Event = $e;
            fn handle_message(&mut self, m: Message, now: Instant) {
                <$t>::handle_message(self, m, now)
            }
            fn handle_timeout(&mut self, now: Instant) {
                <$t>::handle_timeout(self, now)
            }
            fn handle_connection_lost(&mut self, reason: String, now: Instant) {
                <$t>::handle_connection_lost(self, reason, now)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                <$t>::poll_timeout(self)
            }
            fn poll_control(&mut self) -> Option<Message> {
                <$t>::poll_transmit_control(self)
            }
            fn poll_data(&mut self) -> Option<Message> {
                let f: fn(&mut $t) -> Option<Message> = $data;
                f(self)
            }
            fn poll_event(&mut self) -> Option<$e> {
                <$t>::poll_event(self)
            }
            fn is_closed(&self) -> bool {
                <$t>::is_closed(self)
            }
        }
    };
}

use crate::proto::{
    ReceiverEvent, SenderEvent, StoreClient, StoreClientEvent, StoreServer, StoreServerEvent,
    TransferReceiver, TransferSender,
};
impl_core!(
    TransferSender,
    SenderEvent,
    TransferSender::poll_transmit_data
);
impl_core!(TransferReceiver, ReceiverEvent, |_| None);
impl_core!(
    StoreClient,
    StoreClientEvent,
    StoreClient::poll_transmit_data
);
impl_core!(
    StoreServer,
    StoreServerEvent,
    StoreServer::poll_transmit_data
);

/// A protocol end shared between its driver task and the application.
pub(crate) struct Shared<C> {
    core: Mutex<C>,
    wake: Notify,
}

impl<C: Core> Shared<C> {
    pub(crate) fn new(core: C) -> Arc<Self> {
        Arc::new(Self {
            core: Mutex::new(core),
            wake: Notify::new(),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, C> {
        // A panic elsewhere must not wedge the transfer: the core's state stays consistent
        // between calls, so keep using it.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the core and wakes the driver to send what it queued.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut C, Instant) -> R) -> R {
        let r = f(&mut self.lock(), Instant::now());
        self.wake.notify_one();
        r
    }
}

/// Reads one length-prefixed frame; `Ok(None)` at a clean end of stream.
async fn read_frame(recv: &mut quinn::RecvStream) -> Result<Option<Bytes>, String> {
    let mut len = [0u8; 4];
    match recv.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    }
    let n = frame_len(len).map_err(|e| e.to_string())?;
    let first = match recv.read_chunk(n, true).await {
        Ok(Some(c)) => c.bytes,
        Ok(None) => return Err("stream ended inside a frame".into()),
        Err(e) => return Err(e.to_string()),
    };
    if first.len() == n {
        return Ok(Some(first)); // the whole frame in one piece: no copy
    }
    let mut buf = BytesMut::with_capacity(n);
    buf.extend_from_slice(&first);
    while buf.len() < n {
        match recv.read_chunk(n - buf.len(), true).await {
            Ok(Some(c)) => buf.extend_from_slice(&c.bytes),
            Ok(None) => return Err("stream ended inside a frame".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(Some(buf.freeze()))
}

type Incoming = mpsc::Sender<Result<Message, String>>;

async fn read_control(mut recv: quinn::RecvStream, tx: Incoming) {
    loop {
        let r = match read_frame(&mut recv).await {
            Ok(Some(f)) => decode(f).map_err(|e| format!("bad frame: {e}")),
            Ok(None) => return,
            Err(e) => Err(e),
        };
        let stop = r.is_err();
        if tx.send(r).await.is_err() || stop {
            return;
        }
    }
}

async fn accept_data(conn: quinn::Connection, tx: Incoming) {
    let mut readers = JoinSet::new();
    while let Ok(mut recv) = conn.accept_uni().await {
        let tx = tx.clone();
        readers.spawn(async move {
            let r = match read_frame(&mut recv).await {
                Ok(Some(f)) => decode(f).map_err(|e| format!("bad frame: {e}")),
                Ok(None) => Err("empty data stream".into()),
                Err(e) => Err(e),
            };
            let _ = tx.send(r).await;
        });
        while readers.try_join_next().is_some() {}
    }
}

async fn write_control(mut send: quinn::SendStream, mut rx: mpsc::UnboundedReceiver<Message>) {
    while let Some(m) = rx.recv().await {
        let mut bufs = encode(&m);
        // Coalesce whatever else is queued into the same write.
        while let Ok(m) = rx.try_recv() {
            bufs.extend(encode(&m));
        }
        if send.write_all_chunks(&mut bufs).await.is_err() {
            return;
        }
    }
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_secs(2), send.stopped()).await;
}

async fn write_data<C: Core>(
    conn: quinn::Connection,
    m: Message,
    permit: OwnedSemaphorePermit,
    shared: Arc<Shared<C>>,
) {
    let mut bufs = encode(&m);
    drop(m);
    if let Ok(mut s) = conn.open_uni().await {
        if s.write_all_chunks(&mut bufs).await.is_ok() {
            let _ = s.finish();
        }
    }
    drop(bufs);
    drop(permit);
    shared.wake.notify_one();
}

/// Drives `shared`'s core over `conn` until the core closes or the connection is lost.
/// Events go to `on_event` (called without the core's lock held). When this returns, every
/// task it started has ended and every page buffer it held is dropped.
pub(crate) async fn drive<C: Core>(
    conn: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    shared: Arc<Shared<C>>,
    mut on_event: impl FnMut(C::Event) + Send,
    data_streams: usize,
) {
    let (in_tx, mut in_rx) = mpsc::channel(256);
    let mut tasks = JoinSet::new();
    tasks.spawn(read_control(recv, in_tx.clone()));
    tasks.spawn(accept_data(conn.clone(), in_tx));
    let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_control(send, ctl_rx));
    let permits = Arc::new(Semaphore::new(data_streams.max(1)));
    let mut events = Vec::new();
    let mut said_goodbye = false;
    loop {
        let (closed, timeout) = {
            let mut core = shared.lock();
            let now = Instant::now();
            if core.poll_timeout().is_some_and(|t| t <= now) {
                core.handle_timeout(now);
            }
            while let Some(m) = core.poll_control() {
                said_goodbye |= matches!(m, Message::Abort { room: None, .. });
                let _ = ctl_tx.send(m);
            }
            while let Ok(permit) = permits.clone().try_acquire_owned() {
                let Some(m) = core.poll_data() else { break };
                if m.is_bulk() {
                    tasks.spawn(write_data(conn.clone(), m, permit, shared.clone()));
                } else {
                    let _ = ctl_tx.send(m);
                }
            }
            events.extend(std::iter::from_fn(|| core.poll_event()));
            (core.is_closed(), core.poll_timeout())
        };
        for e in events.drain(..) {
            on_event(e);
        }
        while tasks.try_join_next().is_some() {}
        if closed {
            break;
        }
        let sleep = tokio::time::sleep_until(timeout.map_or_else(
            || tokio::time::Instant::now() + Duration::from_secs(3600),
            Into::into,
        ));
        tokio::select! {
            biased;
            m = in_rx.recv() => {
                let mut core = shared.lock();
                let mut next = m;
                // Take everything already received in one go.
                for _ in 0..64 {
                    match next {
                        Some(Ok(m)) => core.handle_message(m, Instant::now()),
                        Some(Err(e)) => { core.handle_connection_lost(e, Instant::now()); break; }
                        None => break,
                    }
                    next = match in_rx.try_recv() { Ok(m) => Some(m), Err(_) => break };
                }
            }
            _ = shared.wake.notified() => {}
            _ = sleep => {}
            e = conn.closed() => shared.lock().handle_connection_lost(e.to_string(), Instant::now()),
        }
    }
    // Let a final abort reach the peer before closing; it closes the connection on reading it.
    drop(ctl_tx);
    if said_goodbye {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = writer.await;
            conn.closed().await
        })
        .await;
    } else {
        writer.abort();
    }
    conn.close(0u32.into(), b"done");
    tasks.shutdown().await;
}
