//! One task per QUIC connection drives one sans-IO protocol end: it feeds received messages
//! and timeouts into the core, writes what the core emits (control messages in order on the
//! control stream, page messages each on its own stream), and hands events to a callback.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::proto::wire::{decode, encode, frame_len, pages_header, PAGES_HEADER};
use crate::proto::{Message, Page, PageHasher, RoomId};

/// Bytes of received frame buffers a connection keeps for reuse (see [`FramePool`]).
const FRAME_POOL_BYTES: usize = 64 << 20;

/// The uniform face of the four protocol ends, for the driver.
pub(crate) trait Core: Send + 'static {
    type Event: Send + 'static;
    /// Whether the stream readers should hash the pages of `Pages` messages for
    /// [`handle_message_hashed`](Core::handle_message_hashed), in parallel with the core.
    const PREHASH: bool = false;
    fn handle_message(&mut self, m: Message, now: Instant);
    fn handle_message_hashed(&mut self, m: Message, _sums: Option<Vec<u64>>, now: Instant) {
        self.handle_message(m, now)
    }
    /// Whether the page writers hash each page of a `Pages` message just before handing it
    /// to quinn and report it with [`record_checksum`](Core::record_checksum) (data
    /// messages then come from [`poll_data_unhashed`](Core::poll_data_unhashed)).
    const HASH_ON_WRITE: bool = false;
    fn poll_data_unhashed(&mut self) -> Option<Message> {
        self.poll_data()
    }
    fn record_checksum(&mut self, _room: RoomId, _index: u32, _checksum: u64) {}
    fn handle_timeout(&mut self, now: Instant);
    fn handle_connection_lost(&mut self, reason: String, now: Instant);
    fn poll_timeout(&self) -> Option<Instant>;
    fn poll_control(&mut self) -> Option<Message>;
    fn poll_data(&mut self) -> Option<Message>;
    fn poll_event(&mut self) -> Option<Self::Event>;
    fn is_closed(&self) -> bool;
}

macro_rules! impl_core {
    ($t:ty, $e:ty, $data:expr, hash_on_write) => {
        impl_core!($t, $e, $data, {
            const HASH_ON_WRITE: bool = true;
            fn poll_data_unhashed(&mut self) -> Option<Message> {
                <$t>::poll_transmit_data_unhashed(self)
            }
            fn record_checksum(&mut self, room: RoomId, index: u32, checksum: u64) {
                <$t>::record_checksum(self, room, index, checksum)
            }
        });
    };
    ($t:ty, $e:ty, $data:expr, prehash) => {
        impl_core!($t, $e, $data, {
            const PREHASH: bool = true;
            fn handle_message_hashed(&mut self, m: Message, sums: Option<Vec<u64>>, now: Instant) {
                <$t>::handle_message_hashed(self, m, sums, now)
            }
        });
    };
    ($t:ty, $e:ty, $data:expr) => {
        impl_core!($t, $e, $data, {});
    };
    ($t:ty, $e:ty, $data:expr, { $($extra:tt)* }) => {
        impl Core for $t {
            type Event = $e;
            $($extra)*
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
    TransferSender::poll_transmit_data,
    hash_on_write
);
impl_core!(TransferReceiver, ReceiverEvent, |_| None, prehash);
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

/// Frame buffers handed out before, kept for reuse once the application has dropped every
/// page sliced out of them. A reused buffer's memory is already mapped, so gathering a frame
/// into it costs no page faults (a fresh multi-megabyte allocation faults on every page).
pub(crate) struct FramePool {
    bufs: Mutex<Vec<Bytes>>,
    max_bytes: usize,
}

impl FramePool {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            bufs: Mutex::new(Vec::new()),
            max_bytes,
        }
    }

    fn bufs(&self) -> MutexGuard<'_, Vec<Bytes>> {
        self.bufs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty buffer with room for `n` bytes, reused when one is free.
    fn take(&self, n: usize) -> BytesMut {
        let mut bufs = self.bufs();
        if let Some(i) = bufs.iter().position(|b| b.len() >= n && b.is_unique()) {
            if let Ok(mut b) = bufs.swap_remove(i).try_into_mut() {
                b.clear();
                if b.capacity() >= n {
                    return b;
                }
            }
        }
        drop(bufs);
        BytesMut::with_capacity(n)
    }

    /// Remembers `frame` (whose pages the application may still hold) for reuse.
    fn keep(&self, frame: &Bytes) {
        let mut bufs = self.bufs();
        // Buffers nobody uses any more go first when the pool is full.
        let mut held: usize = bufs.iter().map(Bytes::len).sum();
        while held + frame.len() > self.max_bytes {
            match bufs.iter().position(Bytes::is_unique) {
                Some(i) => held -= bufs.swap_remove(i).len(),
                None => return,
            }
        }
        bufs.push(frame.clone());
    }
}

/// Reads one length-prefixed frame into one buffer; `Ok(None)` at a clean end of stream.
async fn read_frame(
    recv: &mut quinn::RecvStream,
    pool: &FramePool,
) -> Result<Option<Bytes>, String> {
    let Some(n) = read_len(recv).await? else {
        return Ok(None);
    };
    read_body(recv, pool, n, &[]).await.map(Some)
}

/// Reads a frame's length prefix; `Ok(None)` at a clean end of stream.
async fn read_len(recv: &mut quinn::RecvStream) -> Result<Option<usize>, String> {
    let mut len = [0u8; 4];
    match recv.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    }
    frame_len(len).map(Some).map_err(|e| e.to_string())
}

/// Reads the rest of a frame body of `n` bytes whose first bytes, `head`, were read already.
async fn read_body(
    recv: &mut quinn::RecvStream,
    pool: &FramePool,
    n: usize,
    head: &[u8],
) -> Result<Bytes, String> {
    let first = match recv.read_chunk(n - head.len(), true).await {
        Ok(Some(c)) => c.bytes,
        Ok(None) => return Err("stream ended inside a frame".into()),
        Err(e) => return Err(e.to_string()),
    };
    if head.is_empty() && first.len() == n {
        return Ok(first); // the whole frame in one piece: no copy
    }
    let mut buf = pool.take(n);
    buf.extend_from_slice(head);
    buf.extend_from_slice(&first);
    drop(first);
    while buf.len() < n {
        match recv.read_chunk(n - buf.len(), true).await {
            Ok(Some(c)) => buf.extend_from_slice(&c.bytes),
            Ok(None) => return Err("stream ended inside a frame".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
    let frame = buf.freeze();
    pool.keep(&frame);
    Ok(frame)
}

/// Takes the next `n` bytes of the stream as the pieces quinn holds them in (no copy),
/// feeding each to `hasher` while it is fresh in cache.
async fn read_pieces(
    recv: &mut quinn::RecvStream,
    n: usize,
    mut hasher: Option<&mut PageHasher>,
) -> Result<Vec<Bytes>, String> {
    let mut pieces = Vec::with_capacity(n / 8192 + 2);
    let mut left = n;
    while left > 0 {
        match recv.read_chunk(left, true).await {
            Ok(Some(c)) => {
                if let Some(h) = hasher.as_deref_mut() {
                    h.update(&c.bytes);
                }
                left -= c.bytes.len();
                pieces.push(c.bytes);
            }
            Ok(None) => return Err("stream ended inside a frame".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(pieces)
}

/// A received message, with its page checksums when the reader computed them.
type Received = Result<(Message, Option<Vec<u64>>), String>;
type Incoming = mpsc::Sender<Received>;

/// Decodes a frame; for a core that wants it, hashes a `Pages` message's pages here, in
/// the reader task, instead of in the core.
fn decode_hashed<C: Core>(frame: Bytes) -> Received {
    let m = decode(frame).map_err(|e| format!("bad frame: {e}"))?;
    let sums = match &m {
        Message::Pages { pages, .. } if C::PREHASH => {
            Some(pages.iter().map(Page::checksum).collect())
        }
        _ => None,
    };
    Ok((m, sums))
}

async fn read_control<C: Core>(mut recv: quinn::RecvStream, tx: Incoming, pool: Arc<FramePool>) {
    loop {
        let r = match read_frame(&mut recv, &pool).await {
            Ok(Some(f)) => decode_hashed::<C>(f),
            Ok(None) => return,
            Err(e) => Err(e),
        };
        let stop = r.is_err();
        if tx.send(r).await.is_err() || stop {
            return;
        }
    }
}

/// Reads the one frame of a data stream and hands it on. A `Pages` frame is not gathered:
/// each page goes on as its own one-page message as soon as its bytes are in, made of the
/// pieces quinn delivered and (for a core that wants it) hashed piece by piece on the way.
async fn read_data_stream<C: Core>(
    mut recv: quinn::RecvStream,
    tx: Incoming,
    pool: Arc<FramePool>,
) {
    let r = async {
        let Some(n) = read_len(&mut recv).await? else {
            return Err("empty data stream".to_string());
        };
        let mut head = [0u8; PAGES_HEADER];
        let head_len = n.min(PAGES_HEADER);
        recv.read_exact(&mut head[..head_len])
            .await
            .map_err(|e| e.to_string())?;
        let batch = match head_len {
            PAGES_HEADER => pages_header(&head, n).map_err(|e| format!("bad frame: {e}"))?,
            _ => None,
        };
        let Some(h) = batch else {
            let frame = if head_len < n {
                read_body(&mut recv, &pool, n, &head[..head_len]).await?
            } else {
                Bytes::copy_from_slice(&head[..head_len])
            };
            return Ok(Some(decode_hashed::<C>(frame)?));
        };
        for i in 0..h.count {
            let mut hasher = C::PREHASH.then(PageHasher::new);
            let pieces = read_pieces(&mut recv, h.page_len, hasher.as_mut()).await?;
            let m = Message::Pages {
                room: h.room,
                first: h.first.saturating_add(i as u32),
                pages: vec![Page::from_chunks(pieces)],
            };
            let sums = hasher.map(|h| vec![h.finish()]);
            if tx.send(Ok((m, sums))).await.is_err() {
                return Ok(None);
            }
        }
        Ok(None)
    }
    .await;
    match r {
        Ok(Some(m)) => {
            let _ = tx.send(Ok(m)).await;
        }
        Ok(None) => {}
        Err(e) => {
            let _ = tx.send(Err(e)).await;
        }
    }
}

async fn accept_data<C: Core>(conn: quinn::Connection, tx: Incoming, pool: Arc<FramePool>) {
    let mut readers = JoinSet::new();
    while let Ok(recv) = conn.accept_uni().await {
        readers.spawn(read_data_stream::<C>(recv, tx.clone(), pool.clone()));
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

/// Writes a `Pages` message page by page, hashing each page for the core just before quinn
/// takes it: the wait for room in quinn's send window comes first, so the bytes the hash
/// pulls into cache are the ones quinn copies into packets next. Every page is hashed and
/// reported even when the stream fails, so the room's `Done` never waits for a checksum.
async fn write_pages<C: Core>(
    s: &mut quinn::SendStream,
    m: Message,
    shared: &Shared<C>,
) -> Result<(), quinn::WriteError> {
    let mut header = encode(&m);
    header.truncate(1);
    let Message::Pages { room, first, pages } = m else {
        return Ok(());
    };
    let mut result = s.write_all_chunks(&mut header).await;
    for (i, page) in pages.into_iter().enumerate() {
        if result.is_ok() {
            // Zero bytes: waits until quinn's send window has room.
            result = s.write(&[]).await.map(drop);
        }
        let sum = page.checksum();
        let index = first.saturating_add(i as u32);
        shared.with(|c, _| c.record_checksum(room, index, sum));
        if result.is_ok() {
            let mut chunks = page.chunks().to_vec();
            drop(page);
            result = s.write_all_chunks(&mut chunks).await;
        }
    }
    result
}

async fn write_data<C: Core>(
    conn: quinn::Connection,
    m: Message,
    permit: OwnedSemaphorePermit,
    shared: Arc<Shared<C>>,
) {
    let hash_here = C::HASH_ON_WRITE && matches!(m, Message::Pages { .. });
    let mut bufs = if hash_here { Vec::new() } else { encode(&m) };
    let mut m = Some(m);
    let stream = conn.open_uni().await;
    if let Ok(mut s) = stream {
        let written = match m.take() {
            Some(m) if hash_here => write_pages(&mut s, m, &shared).await,
            _ => s.write_all_chunks(&mut bufs).await,
        };
        if written.is_ok() {
            drop(bufs);
            // Hold the permit until the peer has every byte of the stream: `data_streams`
            // bounds the streams the peer is gathering at once (and its memory), not just
            // the ones still being handed to quinn's send buffer.
            if s.finish().is_ok() {
                let _ = s.stopped().await;
            }
        }
    }
    if let Some(Message::Pages { room, first, pages }) = m.filter(|_| hash_here) {
        // The stream could not be opened: the pages still need their checksums.
        for (i, p) in pages.iter().enumerate() {
            let sum = p.checksum();
            shared.with(|c, _| c.record_checksum(room, first.saturating_add(i as u32), sum));
        }
    }
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
    let pool = Arc::new(FramePool::new(FRAME_POOL_BYTES));
    tasks.spawn(read_control::<C>(recv, in_tx.clone(), pool.clone()));
    tasks.spawn(accept_data::<C>(conn.clone(), in_tx, pool));
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
                let m = if C::HASH_ON_WRITE {
                    core.poll_data_unhashed()
                } else {
                    core.poll_data()
                };
                let Some(m) = m else { break };
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
                        Some(Ok((m, sums))) => core.handle_message_hashed(m, sums, Instant::now()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_pool_reuses_a_buffer_once_its_pages_are_dropped() {
        let pool = FramePool::new(1 << 20);
        let mut b = pool.take(1000);
        b.extend_from_slice(&[7u8; 1000]);
        let frame = b.freeze();
        let ptr = frame.as_ptr();
        pool.keep(&frame);
        let page = frame.slice(10..20);
        drop(frame);
        // A page is still held: the buffer is not handed out again.
        let other = pool.take(1000);
        assert_ne!(other.as_ptr(), ptr);
        drop(page);
        let again = pool.take(1000);
        assert_eq!(again.as_ptr(), ptr);
        assert!(again.is_empty() && again.capacity() >= 1000);
    }

    #[test]
    fn frame_pool_stays_within_its_budget() {
        let pool = FramePool::new(3000);
        let frames: Vec<Bytes> = (0..5)
            .map(|_| {
                let mut b = pool.take(1000);
                b.extend_from_slice(&[1u8; 1000]);
                let f = b.freeze();
                pool.keep(&f);
                f
            })
            .collect();
        // All five still in use: only three fit.
        assert_eq!(pool.bufs().len(), 3);
        drop(frames);
        let mut b = pool.take(1000);
        b.extend_from_slice(&[2u8; 1000]);
        pool.keep(&b.freeze());
        assert!(pool.bufs().iter().map(Bytes::len).sum::<usize>() <= 3000);
    }
}
