//! The shared KV store (the remote tier of HiCache): a QUIC server in front of a
//! [`PageStore`]. Start it with [`serve`]; reach it with [`crate::quic::RemoteStore`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

pub use sglrs_radix_cache::store::{
    segment_path, DiskConfig, PageStore, PageStoreConfig, StoreStats,
};

use crate::proto::{StoreOp, StoreReply, StoreServer, StoreServerEvent};
use crate::quic::{drive, QuicConfig, QuicError, Security, Shared, ALPN_STORE};
use sglrs_radix_cache::KvLayout;

/// Everything [`serve`] needs.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// UDP address to listen on.
    pub addr: SocketAddr,
    /// The page layout every client must use.
    pub layout: KvLayout,
    /// Cluster certificate and shared secret.
    pub security: Security,
    /// Transport tuning and protocol timers.
    pub quic: QuicConfig,
    /// RAM budget and disk spill.
    pub pages: PageStoreConfig,
}

/// A running store server. Dropping it stops accepting; [`shutdown`](Self::shutdown) also
/// spills RAM to disk.
pub struct StoreHandle {
    endpoint: quinn::Endpoint,
    store: Arc<PageStore>,
    accept: tokio::task::JoinHandle<()>,
    conns: Arc<Mutex<HashMap<u64, Arc<Shared<StoreServer>>>>>,
}

/// Opens the page store (scanning its disk spill) and starts serving it. Must be called
/// inside a tokio runtime.
pub fn serve(config: StoreConfig) -> Result<StoreHandle, QuicError> {
    let store = Arc::new(PageStore::open(config.pages.clone())?);
    let endpoint = config
        .quic
        .endpoint(config.addr, Some((&config.security.identity, ALPN_STORE)))?;
    let conns = Arc::new(Mutex::new(HashMap::new()));
    let accept = tokio::spawn(accept_loop(
        endpoint.clone(),
        store.clone(),
        config,
        conns.clone(),
    ));
    Ok(StoreHandle {
        endpoint,
        store,
        accept,
        conns,
    })
}

impl StoreHandle {
    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr, QuicError> {
        Ok(self.endpoint.local_addr()?)
    }

    /// The page store behind the server.
    pub fn store(&self) -> &Arc<PageStore> {
        &self.store
    }

    /// Clients connected now.
    pub fn connections(&self) -> usize {
        self.conns.lock().map_or(0, |c| c.len())
    }

    /// Stops serving, closes every connection and spills RAM pages to disk.
    pub async fn shutdown(self) -> Result<(), QuicError> {
        self.accept.abort();
        let conns: Vec<_> = self
            .conns
            .lock()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default();
        for c in conns {
            c.with(|c, now| c.close("store shutting down", now));
        }
        self.endpoint.close(0u32.into(), b"shutdown");
        self.endpoint.wait_idle().await;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.flush())
            .await
            .map_err(|e| QuicError::Config(e.to_string()))??;
        Ok(())
    }
}

impl Drop for StoreHandle {
    fn drop(&mut self) {
        self.accept.abort();
        self.endpoint.close(0u32.into(), b"shutdown");
    }
}

fn execute(store: &PageStore, op: StoreOp) -> StoreReply {
    match op {
        StoreOp::Exists(h) => StoreReply::Exists(store.exists(&h)),
        StoreOp::Get(h) => StoreReply::Get(store.get(&h)),
        StoreOp::Put(pages) => match store.put(pages) {
            Ok(n) => StoreReply::Put(n),
            Err(e) => StoreReply::Failed(format!("store i/o error: {e}")),
        },
    }
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    store: Arc<PageStore>,
    cfg: StoreConfig,
    conns: Arc<Mutex<HashMap<u64, Arc<Shared<StoreServer>>>>>,
) {
    let mut next = 0u64;
    let auth = cfg.security.auth();
    while let Some(incoming) = endpoint.accept().await {
        next += 1;
        let id = next;
        let (store, cfg, auth, conns) = (store.clone(), cfg.clone(), auth.clone(), conns.clone());
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            let Ok(Ok((send, recv))) =
                tokio::time::timeout(cfg.quic.proto.idle_timeout, conn.accept_bi()).await
            else {
                conn.close(1u32.into(), b"no control stream");
                return;
            };
            let now = std::time::Instant::now();
            let shared = Shared::new(StoreServer::new(
                cfg.quic.proto.clone(),
                cfg.layout,
                auth,
                now,
            ));
            if let Ok(mut c) = conns.lock() {
                c.insert(id, shared.clone());
            }
            let ev_shared = shared.clone();
            let on_event = move |e: StoreServerEvent| {
                if let StoreServerEvent::Request { id, op } = e {
                    let (store, shared) = (store.clone(), ev_shared.clone());
                    tokio::spawn(async move {
                        let reply = tokio::task::spawn_blocking(move || execute(&store, op))
                            .await
                            .unwrap_or_else(|e| {
                                StoreReply::Failed(format!("store task failed: {e}"))
                            });
                        shared.with(|c, now| c.respond(id, reply, now));
                    });
                }
            };
            drive(conn, send, recv, shared, on_event, cfg.quic.data_streams).await;
            if let Ok(mut c) = conns.lock() {
                c.remove(&id);
            }
        });
    }
}
