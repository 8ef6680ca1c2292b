//! Sans-IO state machines of the transfer and store protocols.
//!
//! Each end of a connection is a deterministic state machine in the style of quinn-proto:
//! inputs arrive through `handle_message(msg, now)`, `handle_timeout(now)` and a few
//! application calls (`register`, `submit`, `get`, …); outputs leave through
//! `poll_transmit_control()` (small, ordered messages), `poll_transmit_data()` (messages
//! carrying pages, which a driver may send on parallel streams), `poll_event()` and
//! `poll_timeout()`. There are no sockets, clocks, threads or async inside, so the tests
//! drive both ends on a virtual clock with loss, reordering and duplication.
//!
//! | end | dials? | role |
//! |---|---|---|
//! | [`TransferReceiver`] | yes | decode host: registers rooms, receives pages |
//! | [`TransferSender`] | no | prefill host: accepts registrations, sends pages |
//! | [`StoreClient`] | yes | any host: exists / get / put pages by hash |
//! | [`StoreServer`] | no | the KV store: validates and answers requests |
//!
//! Liveness: each end sends [`Message::Ping`] when it sent nothing for
//! [`Config::heartbeat_interval`], and fails the connection with
//! [`TransferError::PeerTimeout`] when it heard nothing for [`Config::idle_timeout`].

mod page;
mod receiver;
mod sender;
mod store;
pub mod wire;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use receiver::{ReceiverEvent, RegisterError, TransferReceiver};
pub use sender::{SenderEvent, SubmitError, TransferSender};
pub use store::{
    StoreClient, StoreClientEvent, StoreOp, StoreReply, StoreRequestError, StoreServer,
    StoreServerEvent,
};
pub use wire::{
    AbortReason, AuxData, Hello, Message, RoomId, StorePage, WireError, PROTOCOL_VERSION,
};

use sglrs_radix_cache::KvLayout;

/// Timing and size limits shared by every protocol end.
#[derive(Clone, Debug)]
pub struct Config {
    /// Send a `Ping` when nothing was sent for this long.
    pub heartbeat_interval: Duration,
    /// Fail the connection when nothing was received for this long (also bounds the hello).
    pub idle_timeout: Duration,
    /// Wait this long for an answer (`Registered`, `Ack`, missing pages) before asking again.
    pub retransmit_timeout: Duration,
    /// Give up on a room after this many unanswered retransmissions.
    pub max_retransmits: u32,
    /// A room that is not complete this long after it was registered fails with a timeout.
    pub room_timeout: Duration,
    /// A store request not answered this long after it was sent fails with a timeout.
    pub request_timeout: Duration,
    /// Pages per `Pages` message.
    pub batch_pages: usize,
    /// Rooms open at once on one connection.
    pub max_rooms: usize,
    /// Pages in one room or one store request.
    pub max_pages: usize,
    /// How long a finished room is remembered, so late duplicates are recognised.
    pub linger: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
            retransmit_timeout: Duration::from_secs(10),
            max_retransmits: 5,
            room_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(30),
            batch_pages: 16,
            max_rooms: 4096,
            max_pages: 1 << 20,
            linger: Duration::from_secs(30),
        }
    }
}

/// The cluster's shared secret, as an HMAC-SHA256 key. Every `Hello` carries the tag of a
/// fixed context string; the accepting end verifies it in constant time. It rides inside TLS,
/// so it is never visible on the network.
#[derive(Clone)]
pub struct AuthKey(ring::hmac::Key);

const AUTH_CONTEXT: &[u8] = b"sglrs-transfer hello v1";

impl AuthKey {
    /// Derives the key from the shared secret.
    pub fn new(secret: &[u8]) -> Self {
        Self(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret))
    }

    /// The tag a `Hello` carries.
    pub fn tag(&self) -> [u8; 32] {
        let t = ring::hmac::sign(&self.0, AUTH_CONTEXT);
        let mut out = [0u8; 32];
        out.copy_from_slice(t.as_ref());
        out
    }

    /// Whether `tag` was made with the same secret (constant time).
    pub fn verify(&self, tag: &[u8; 32]) -> bool {
        ring::hmac::verify(&self.0, AUTH_CONTEXT, tag).is_ok()
    }
}

impl std::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthKey(..)")
    }
}

/// Why a connection, a room or a store request failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TransferError {
    /// This end aborted (it refused the peer's hello, found a bad checksum, …).
    #[error("aborted locally: {0}")]
    Local(AbortReason),
    /// The peer aborted and said why.
    #[error("aborted by peer: {0}")]
    Remote(AbortReason),
    /// Nothing was heard from the peer within the idle timeout.
    #[error("peer silent for {0:?}: timed out")]
    PeerTimeout(Duration),
    /// The connection was lost below the protocol (reported by the driver).
    #[error("connection lost: {0}")]
    ConnectionLost(String),
}

pub use page::Page;
pub use sglrs_radix_cache::checksum::{page_checksum, PageHasher};

/// Checksum of a room, as carried by `Done`: xxh3-64 over the little-endian page checksums
/// in page order.
pub fn room_checksum(page_checksums: impl IntoIterator<Item = u64>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for c in page_checksums {
        h.update(&c.to_le_bytes());
    }
    h.digest()
}

/// Makes the `Hello` a dialing end sends.
fn make_hello(layout: &KvLayout, auth: &AuthKey) -> Message {
    Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        auth: auth.tag(),
        layout: *layout,
    })
}

/// The accepting end's check of a `Hello`: version first, then auth, then layout.
fn check_hello(hello: &Hello, layout: &KvLayout, auth: &AuthKey) -> Result<(), AbortReason> {
    if hello.version != PROTOCOL_VERSION {
        return Err(AbortReason::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: hello.version,
        });
    }
    if !auth.verify(&hello.auth) {
        return Err(AbortReason::AuthFailed);
    }
    if hello.layout != *layout {
        return Err(AbortReason::LayoutMismatch {
            ours: *layout,
            theirs: hello.layout,
        });
    }
    Ok(())
}

/// Heartbeat and idle bookkeeping shared by every end.
#[derive(Debug)]
struct Liveness {
    last_recv: Instant,
    last_sent: Instant,
}

impl Liveness {
    fn new(now: Instant) -> Self {
        Self {
            last_recv: now,
            last_sent: now,
        }
    }
    fn idle_deadline(&self, cfg: &Config) -> Instant {
        self.last_recv + cfg.idle_timeout
    }
    fn ping_deadline(&self, cfg: &Config) -> Instant {
        self.last_sent + cfg.heartbeat_interval
    }
    fn next(&self, cfg: &Config) -> Instant {
        self.idle_deadline(cfg).min(self.ping_deadline(cfg))
    }
    /// Whether the peer has been silent for the idle timeout (the connection must fail).
    fn silent(&self, cfg: &Config, now: Instant) -> bool {
        now >= self.idle_deadline(cfg)
    }
    /// Queues a `Ping` when nothing was sent for a heartbeat interval and nothing else is
    /// queued on `control`.
    fn heartbeat(&self, cfg: &Config, now: Instant, control: &mut VecDeque<Message>) {
        if now >= self.ping_deadline(cfg) && control.is_empty() {
            control.push_back(Message::Ping);
        }
    }
}

/// A dialing end's hello, sent again until the peer answers, a bounded number of times.
#[derive(Debug)]
struct HelloRetry {
    hello: Message,
    at: Instant,
    retries: u32,
}

impl HelloRetry {
    /// `hello`, to be queued now by the caller and again from `now + retransmit_timeout`.
    fn new(hello: Message, cfg: &Config, now: Instant) -> Self {
        Self {
            hello,
            at: now + cfg.retransmit_timeout,
            retries: 0,
        }
    }
    /// When the next retransmission is due.
    fn deadline(&self) -> Instant {
        self.at
    }
    /// Queues the hello again on `control` if it is due; `false` once the retransmissions
    /// are used up (the connection must fail).
    fn tick(&mut self, cfg: &Config, now: Instant, control: &mut VecDeque<Message>) -> bool {
        if now < self.at {
            return true;
        }
        if self.retries >= cfg.max_retransmits {
            return false;
        }
        self.retries += 1;
        self.at = now + cfg.retransmit_timeout;
        control.push_back(self.hello.clone());
        true
    }
}

fn min_deadline(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

#[cfg(test)]
mod tests;
