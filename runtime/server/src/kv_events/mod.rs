//! KV cache events for cache-aware routers (`--kv-events-config`, the JSON vLLM and SGLang
//! take): the scheduler's page events, published over ZMQ as vLLM's and SGLang's
//! `ZmqEventPublisher` does, so llm-d's prefix-cache scorer (or any subscriber written for
//! those engines) can index what this server caches.
//!
//! Wire format, per batch: a three-frame message on the PUB socket — the topic, the batch's
//! sequence number (8 bytes, big-endian, from 0), and the msgpack payload. The payload is
//! the array-shaped `EventBatch` of SGLang's `kv_events` module and of vLLM before it
//! switched to maps: `[ts, [event, …], data_parallel_rank]`, each event an array led by its
//! tag — `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//! medium]`, `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`. Decoders of
//! SGLang's classes read it (trailing fields they lack are ignored). One block is one page;
//! block hashes are the low 64 bits of the page hashes (which chain over the model
//! fingerprint and the tokens); `parent_block_hash` is nil at the start of a sequence;
//! `medium` is `"GPU"` for the executor's pool, `"CPU"` for the host tier and `"DISK"` for
//! the disk tier of the hierarchical cache (see [`Announcer`]). The replay socket (ROUTER) answers a request
//! `[start_seq (8 bytes BE)]` with every buffered batch from that sequence on, as
//! `[seq, payload]`, then `[-1, ""]`.
//!
//! Only the default cache namespace is announced: pages of tenants and of requests with a
//! `cache_salt` / `extra_key` hash differently, and a router that matched them by token ids
//! would count them as hits for everyone.

mod announce;
mod wire;

pub use announce::Announcer;
pub use wire::{encode_batch, WireEvent};

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use sglrs_scheduler::kv_events::{KvEvent, KvEventSink, StoreEvent};

/// `--kv-events-config` as vLLM and SGLang define it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KvEventsSpec {
    /// `zmq`, or `null` for none.
    #[serde(default = "null_publisher")]
    pub publisher: String,
    /// The PUB socket: `tcp://*:PORT` (or an address with `*` / `::`) binds, any other
    /// `tcp://HOST:PORT` connects, as those engines decide.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// The replay socket (ROUTER, always bound), if any.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// Messages queued per subscriber before newer ones are dropped.
    #[serde(default = "default_hwm")]
    pub hwm: usize,
    /// Batches waiting to be sent before newer ones are dropped (and counted).
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: usize,
    /// The first frame of every message; subscribers filter on its prefix (llm-d uses
    /// `kv@<pod>@<model>`).
    #[serde(default)]
    pub topic: String,
}

fn null_publisher() -> String {
    "null".into()
}
fn default_endpoint() -> String {
    "tcp://*:5557".into()
}
fn default_buffer_steps() -> usize {
    10_000
}
fn default_hwm() -> usize {
    100_000
}
fn default_max_queue_size() -> usize {
    100_000
}

/// What a `tcp://` endpoint means for a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Listen on this address.
    Bind(String),
    /// Dial this address.
    Connect(String),
}

impl KvEventsSpec {
    /// Parses the flag's JSON; `None` for the `null` publisher. Unknown fields, other
    /// publishers and endpoints that are not `tcp://HOST:PORT` are refused by name.
    pub fn parse(json: &str) -> Result<Option<KvEventsSpec>, String> {
        let spec: KvEventsSpec = serde_json::from_str(json)
            .map_err(|e| format!("--kv-events-config is not valid: {e}"))?;
        match spec.publisher.as_str() {
            "null" => return Ok(None),
            "zmq" => {}
            other => {
                return Err(format!(
                    "--kv-events-config: publisher {:?} is not supported; use \"zmq\" or \"null\"",
                    other.chars().take(64).collect::<String>()
                ))
            }
        }
        spec.pub_endpoint()?;
        spec.replay()?;
        if spec.buffer_steps == 0 || spec.max_queue_size == 0 || spec.hwm == 0 {
            return Err(
                "--kv-events-config: buffer_steps, hwm and max_queue_size must be above 0".into(),
            );
        }
        Ok(Some(spec))
    }

    /// The PUB socket's endpoint.
    pub fn pub_endpoint(&self) -> Result<Endpoint, String> {
        let addr = tcp_addr("endpoint", &self.endpoint)?;
        Ok(
            if self.endpoint.contains('*') || self.endpoint.contains("::") {
                Endpoint::Bind(addr)
            } else {
                Endpoint::Connect(addr)
            },
        )
    }

    /// The replay socket's address, if any (always bound).
    pub fn replay(&self) -> Result<Option<String>, String> {
        self.replay_endpoint
            .as_deref()
            .map(|e| tcp_addr("replay_endpoint", e))
            .transpose()
    }
}

/// `tcp://HOST:PORT` as the socket library takes it (`*` is every interface).
fn tcp_addr(field: &str, endpoint: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "--kv-events-config: {field} {:?} is not tcp://HOST:PORT (only TCP is supported)",
            endpoint.chars().take(64).collect::<String>()
        )
    };
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    let host = match host {
        "*" => "0.0.0.0",
        h => h,
    };
    Ok(format!("tcp://{host}:{port}"))
}

/// Counters of the publisher, for `/get_server_info`.
#[derive(Debug, Default)]
pub struct PublisherStats {
    /// Batches sent on the PUB socket.
    pub batches: AtomicU64,
    /// Events in them.
    pub events: AtomicU64,
    /// Batches dropped because the queue was full.
    pub dropped_batches: AtomicU64,
    /// Replay requests answered.
    pub replays: AtomicU64,
    /// Times the publisher's sockets were set up again after a failure.
    pub restarts: AtomicU64,
}

/// The publisher: the scheduler's sink end, and the thread that owns the sockets.
pub struct KvEventPublisher {
    tx: tokio::sync::mpsc::Sender<Vec<WireEvent>>,
    stats: Arc<PublisherStats>,
    spec: KvEventsSpec,
    announcer: std::sync::Mutex<Announcer>,
}

impl KvEventPublisher {
    /// Binds (or dials) the sockets on a thread of their own and returns once they are set
    /// up, or with the reason they could not be.
    pub fn start(spec: KvEventsSpec) -> Result<Arc<KvEventPublisher>, String> {
        let (tx, rx) = tokio::sync::mpsc::channel(spec.max_queue_size);
        let stats = Arc::new(PublisherStats::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (st, sp) = (stats.clone(), spec.clone());
        std::thread::Builder::new()
            .name("sglrs-kv-events".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("starting the KV event publisher: {e}")));
                        return;
                    }
                };
                rt.block_on(run(sp, rx, st, ready_tx));
            })
            .map_err(|e| format!("starting the KV event publisher: {e}"))?;
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the KV event publisher did not start within 10 s".to_string())??;
        Ok(Arc::new(KvEventPublisher {
            tx,
            stats,
            spec,
            announcer: std::sync::Mutex::new(Announcer::default()),
        }))
    }

    /// The configuration and counters, for `/get_server_info`.
    pub fn info_json(&self) -> serde_json::Value {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "publisher": self.spec.publisher,
            "endpoint": self.spec.endpoint,
            "replay_endpoint": self.spec.replay_endpoint,
            "topic": self.spec.topic,
            "batches": g(&self.stats.batches),
            "events": g(&self.stats.events),
            "dropped_batches": g(&self.stats.dropped_batches),
            "replays": g(&self.stats.replays),
            "restarts": g(&self.stats.restarts),
            "unannounced_pages": self
                .announcer
                .lock()
                .map_or(0, |a| a.unannounced()),
        })
    }
}

impl KvEventSink for KvEventPublisher {
    fn publish(&self, device: Vec<KvEvent>, tiers: Vec<StoreEvent>) {
        let wire = match self.announcer.lock() {
            Ok(mut a) => a.convert(device, tiers),
            Err(_) => return,
        };
        if wire.is_empty() {
            return;
        }
        if self.tx.try_send(wire).is_err() {
            self.stats.dropped_batches.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Replay buffer: the last `buffer_steps` batches, by sequence number.
struct Replay {
    batches: VecDeque<(u64, bytes::Bytes)>,
    cap: usize,
}

async fn bind_sockets(
    spec: &KvEventsSpec,
) -> Result<(zeromq::PubSocket, Option<zeromq::RouterSocket>), String> {
    use zeromq::Socket;
    let mut publ = zeromq::PubSocket::new();
    match spec.pub_endpoint()? {
        Endpoint::Bind(a) => publ
            .bind(&a)
            .await
            .map(|_| ())
            .map_err(|e| format!("--kv-events-config: binding {a}: {e}"))?,
        Endpoint::Connect(a) => publ
            .connect(&a)
            .await
            .map_err(|e| format!("--kv-events-config: connecting to {a}: {e}"))?,
    }
    let replay = match spec.replay()? {
        Some(a) => {
            let mut r = zeromq::RouterSocket::new();
            r.bind(&a)
                .await
                .map_err(|e| format!("--kv-events-config: binding {a}: {e}"))?;
            Some(r)
        }
        None => None,
    };
    Ok((publ, replay))
}

/// What one turn of the publisher loop did.
enum Turn {
    Sent,
    Replayed,
    Closed,
}

/// The publisher thread: sends each batch, keeps it for replay, answers replay requests.
/// The socket library leaves some paths unimplemented (they panic): each turn runs under
/// `catch_unwind`, and a panic sets the sockets up again (the sequence numbers go on).
async fn run(
    spec: KvEventsSpec,
    mut rx: tokio::sync::mpsc::Receiver<Vec<WireEvent>>,
    stats: Arc<PublisherStats>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    use futures_util::FutureExt;
    let mut sockets = match bind_sockets(&spec).await {
        Ok(s) => Some(s),
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let topic = bytes::Bytes::from(spec.topic.clone().into_bytes());
    let mut replay = Replay {
        batches: VecDeque::new(),
        cap: spec.buffer_steps,
    };
    let mut seq = 0u64;
    loop {
        let (mut publ, mut router) = match sockets.take() {
            Some(s) => s,
            None => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                match bind_sockets(&spec).await {
                    Ok(s) => {
                        stats.restarts.fetch_add(1, Ordering::Relaxed);
                        s
                    }
                    Err(_) => continue,
                }
            }
        };
        loop {
            let turn = std::panic::AssertUnwindSafe(turn(
                &mut publ,
                &mut router,
                &mut rx,
                &mut replay,
                &mut seq,
                &topic,
                &stats,
            ))
            .catch_unwind()
            .await;
            match turn {
                Ok(Turn::Sent | Turn::Replayed) => {}
                Ok(Turn::Closed) => return,
                Err(_) => break, // set the sockets up again
            }
        }
    }
}

async fn turn(
    publ: &mut zeromq::PubSocket,
    router: &mut Option<zeromq::RouterSocket>,
    rx: &mut tokio::sync::mpsc::Receiver<Vec<WireEvent>>,
    replay: &mut Replay,
    seq: &mut u64,
    topic: &bytes::Bytes,
    stats: &PublisherStats,
) -> Turn {
    use zeromq::{SocketRecv, SocketSend};
    let request = async {
        match router.as_mut() {
            Some(r) => r.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        batch = rx.recv() => {
            let Some(events) = batch else { return Turn::Closed };
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let payload = bytes::Bytes::from(encode_batch(ts, &events));
            let n = *seq;
            *seq += 1;
            let frames = vec![
                topic.clone(),
                bytes::Bytes::copy_from_slice(&n.to_be_bytes()),
                payload.clone(),
            ];
            if let Ok(msg) = zeromq::ZmqMessage::try_from(frames) {
                // No subscriber, or a full one, drops the message (ZMQ PUB semantics).
                let _ = publ.send(msg).await;
            }
            stats.batches.fetch_add(1, Ordering::Relaxed);
            stats.events.fetch_add(events.len() as u64, Ordering::Relaxed);
            replay.batches.push_back((n, payload));
            while replay.batches.len() > replay.cap {
                replay.batches.pop_front();
            }
            Turn::Sent
        }
        req = request => {
            let Ok(req) = req else { return Turn::Replayed };
            let frames = req.into_vec();
            // [peer, "", start] from REQ sockets, [peer, start] from DEALER ones.
            let (Some(peer), Some(start)) = (frames.first(), frames.last()) else {
                return Turn::Replayed;
            };
            let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
                return Turn::Replayed;
            };
            let start = u64::from_be_bytes(start);
            let r = router.as_mut().expect("a request came from it");
            for (n, payload) in replay.batches.iter().filter(|(n, _)| *n >= start) {
                let frames = vec![
                    peer.clone(),
                    bytes::Bytes::new(),
                    bytes::Bytes::copy_from_slice(&n.to_be_bytes()),
                    payload.clone(),
                ];
                if let Ok(msg) = zeromq::ZmqMessage::try_from(frames) {
                    if r.send(msg).await.is_err() {
                        return Turn::Replayed;
                    }
                }
            }
            let end = vec![
                peer.clone(),
                bytes::Bytes::new(),
                bytes::Bytes::copy_from_slice(&(-1i64).to_be_bytes()),
                bytes::Bytes::new(),
            ];
            if let Ok(msg) = zeromq::ZmqMessage::try_from(end) {
                let _ = r.send(msg).await;
            }
            stats.replays.fetch_add(1, Ordering::Relaxed);
            Turn::Replayed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_is_vllms_and_bad_values_are_named() {
        let on = KvEventsSpec::parse(
            r#"{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv@a@m"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            on.pub_endpoint().unwrap(),
            Endpoint::Bind("tcp://0.0.0.0:5557".into())
        );
        assert_eq!(on.replay().unwrap().as_deref(), Some("tcp://0.0.0.0:5558"));
        assert_eq!(on.buffer_steps, 10_000);
        let dial = KvEventsSpec::parse(r#"{"publisher":"zmq","endpoint":"tcp://10.0.0.1:5557"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(
            dial.pub_endpoint().unwrap(),
            Endpoint::Connect("tcp://10.0.0.1:5557".into())
        );
        assert_eq!(
            KvEventsSpec::parse(r#"{"publisher":"null"}"#).unwrap(),
            None
        );
        assert_eq!(KvEventsSpec::parse("{}").unwrap(), None);
        let err = |j: &str| KvEventsSpec::parse(j).unwrap_err();
        assert!(err(r#"{"publisher":"kafka"}"#).contains("kafka"));
        assert!(err(r#"{"publisher":"zmq","bogus":1}"#).contains("bogus"));
        assert!(err(r#"{"publisher":"zmq","endpoint":"ipc:///tmp/x"}"#).contains("endpoint"));
        assert!(
            err(r#"{"publisher":"zmq","replay_endpoint":"tcp://*:x"}"#).contains("replay_endpoint")
        );
        assert!(err(r#"{"publisher":"zmq","buffer_steps":0}"#).contains("buffer_steps"));
    }
}
