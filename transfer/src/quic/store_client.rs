//! The client of a remote KV store, usable from async code and, through the
//! [`KvStore`] trait, from the runtime's blocking cache I/O thread.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use sglrs_radix_cache::{KvStore, PageHash, StoreError};
use tokio::sync::oneshot;

use super::{drive, QuicConfig, QuicError, Security, Shared, ALPN_STORE, CLUSTER_NAME};
use crate::proto::{StoreClient, StoreClientEvent, StoreRequestError, TransferError};
use sglrs_radix_cache::KvLayout;

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<StoreClientEvent>>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection to a KV store server.
pub struct RemoteStore {
    shared: Arc<Shared<StoreClient>>,
    waiters: Waiters,
    closed: Arc<Mutex<Option<TransferError>>>,
    endpoint: quinn::Endpoint,
    handle: tokio::runtime::Handle,
    /// Set when the store was opened with [`connect_blocking`](Self::connect_blocking).
    _runtime: Option<tokio::runtime::Runtime>,
}

impl RemoteStore {
    /// Dials the store at `addr` from a client endpoint bound to `bind` (port 0).
    pub async fn connect(
        bind: SocketAddr,
        addr: SocketAddr,
        layout: KvLayout,
        security: &Security,
        cfg: QuicConfig,
    ) -> Result<Self, QuicError> {
        let endpoint = cfg.endpoint(bind, None)?;
        let client = cfg.client(&security.identity, ALPN_STORE)?;
        let conn = endpoint.connect_with(client, addr, CLUSTER_NAME)?.await?;
        let (send, recv) = conn.open_bi().await?;
        let shared = Shared::new(StoreClient::new(
            cfg.proto.clone(),
            layout,
            &security.auth(),
            Instant::now(),
        ));
        let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(Mutex::new(None));
        let (w, why) = (waiters.clone(), closed.clone());
        let on_event = move |e: StoreClientEvent| {
            let id = match &e {
                StoreClientEvent::Exists { id, .. }
                | StoreClientEvent::Got { id, .. }
                | StoreClientEvent::Put { id, .. }
                | StoreClientEvent::Failed { id, .. } => *id,
                StoreClientEvent::Connected => return,
                StoreClientEvent::Closed { error } => {
                    lock(&why).get_or_insert(error.clone());
                    lock(&w).clear();
                    return;
                }
            };
            if let Some(tx) = lock(&w).remove(&id) {
                let _ = tx.send(e);
            }
        };
        tokio::spawn(drive(
            conn,
            send,
            recv,
            shared.clone(),
            on_event,
            cfg.data_streams,
        ));
        Ok(Self {
            shared,
            waiters,
            closed,
            endpoint,
            handle: tokio::runtime::Handle::current(),
            _runtime: None,
        })
    }

    /// Like [`connect`](Self::connect), for callers outside any async runtime: the
    /// connection runs on a small runtime of its own.
    pub fn connect_blocking(
        addr: SocketAddr,
        layout: KvLayout,
        security: &Security,
        cfg: QuicConfig,
    ) -> Result<Self, QuicError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sglrs-kv-store")
            .enable_all()
            .build()?;
        let bind: SocketAddr = if addr.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            ([0u16; 8], 0).into()
        };
        let mut store = rt.block_on(Self::connect(bind, addr, layout, security, cfg))?;
        store._runtime = Some(rt);
        Ok(store)
    }

    async fn request(
        &self,
        issue: impl FnOnce(&mut StoreClient, Instant) -> Result<u64, StoreRequestError>,
    ) -> Result<StoreClientEvent, QuicError> {
        let (tx, rx) = oneshot::channel();
        {
            // Hold the waiter map while issuing, so the answer cannot arrive before its waiter.
            let mut w = lock(&self.waiters);
            let id = match self.shared.with(issue) {
                Ok(id) => id,
                // A connection refused at hello (wrong secret, other layout) says why.
                Err(StoreRequestError::Closed) if lock(&self.closed).is_some() => {
                    return Err(lock(&self.closed)
                        .clone()
                        .map_or(QuicError::Shutdown, QuicError::Transfer));
                }
                Err(e) => return Err(e.into()),
            };
            w.insert(id, tx);
        }
        match rx.await {
            Ok(StoreClientEvent::Failed { error, .. }) => Err(error.into()),
            Ok(e) => Ok(e),
            Err(_) => Err(QuicError::Shutdown),
        }
    }

    /// How many of `hashes`, from the first, the store holds.
    pub async fn exists_async(&self, hashes: Vec<PageHash>) -> Result<usize, QuicError> {
        match self.request(|c, now| c.exists(hashes, now)).await? {
            StoreClientEvent::Exists { hits, .. } => Ok(hits),
            e => Err(QuicError::Config(format!("unexpected answer {e:?}"))),
        }
    }

    /// The pages; `None` for a miss or a page that failed its integrity check.
    pub async fn get_async(&self, hashes: Vec<PageHash>) -> Result<Vec<Option<Bytes>>, QuicError> {
        match self.request(|c, now| c.get(hashes, now)).await? {
            StoreClientEvent::Got { pages, .. } => Ok(pages),
            e => Err(QuicError::Config(format!("unexpected answer {e:?}"))),
        }
    }

    /// Stores pages; returns how many the store holds now of those sent.
    pub async fn put_async(&self, pages: Vec<(PageHash, Bytes)>) -> Result<usize, QuicError> {
        match self.request(|c, now| c.put(pages, now)).await? {
            StoreClientEvent::Put { stored, .. } => Ok(stored),
            e => Err(QuicError::Config(format!("unexpected answer {e:?}"))),
        }
    }

    /// Runs `fut` on the connection's runtime and blocks this thread for its result.
    fn block<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T, QuicError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        match rx.recv() {
            Ok(r) => r.map_err(to_store_error),
            Err(_) => Err(StoreError::Unavailable("store runtime stopped".into())),
        }
    }

    fn detached(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            waiters: self.waiters.clone(),
            closed: self.closed.clone(),
            endpoint: self.endpoint.clone(),
            handle: self.handle.clone(),
            _runtime: None,
        }
    }

    /// Why the connection ended, once it has (`None` while it is open).
    pub fn closed_reason(&self) -> Option<String> {
        if let Some(e) = lock(&self.closed).as_ref() {
            return Some(e.to_string());
        }
        self.shared
            .with(|c, _| c.is_closed())
            .then(|| "connection closed".to_string())
    }

    /// Closes the connection.
    pub fn close(&self) {
        self.shared.with(|c, now| c.close("client closing", now));
    }
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        if self._runtime.is_some() {
            self.close();
            self.endpoint.close(0u32.into(), b"bye");
        }
    }
}

fn to_store_error(e: QuicError) -> StoreError {
    match e {
        QuicError::Transfer(t) => StoreError::Protocol(t.to_string()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

impl KvStore for RemoteStore {
    fn exists(&self, hashes: &[PageHash]) -> Result<usize, StoreError> {
        let (me, hashes) = (self.detached(), hashes.to_vec());
        self.block(async move { me.exists_async(hashes).await })
    }

    fn get(&self, hashes: &[PageHash]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let (me, hashes) = (self.detached(), hashes.to_vec());
        self.block(async move { me.get_async(hashes).await })
    }

    fn put(&self, pages: &[(PageHash, Bytes)]) -> Result<(), StoreError> {
        let (me, pages) = (self.detached(), pages.to_vec());
        self.block(async move { me.put_async(pages).await.map(|_| ()) })
    }
}
