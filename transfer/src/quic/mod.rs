//! The QUIC driver (quinn on tokio) for the sans-IO protocol ends.
//!
//! One QUIC connection per pair of hosts. The dialing side opens one bidirectional control
//! stream and sends its hello on it; every message without page data travels there, in
//! order. Each message carrying pages (`Pages`, `Put`, `GetOk`) gets its own unidirectional
//! stream, and up to [`QuicConfig::data_streams`] of them are in flight at once. Page data
//! stays in [`bytes::Bytes`] from the caller to quinn's send buffer; the receiving side reads
//! each frame into one buffer (or takes quinn's chunk as it is when a frame arrives in one
//! piece) and slices pages out of it.
//!
//! Security: TLS 1.3 with the cluster certificate on both sides (mutual TLS, see
//! [`ClusterIdentity`]) plus the shared secret checked by the protocol's hello.

mod conn;
mod receiver;
mod sender;
mod socket;
mod store_client;
mod store_set;
mod tls;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use receiver::{KvReceiver, ReceivedRoom, RoomEvent, RoomStream};
pub use sender::{KvSender, SendReport};
pub use store_client::RemoteStore;
pub use store_set::{StoreSet, StoreSetConfig, StoreSetStats, StoreStatus};
pub use tls::{ClusterIdentity, TlsError, CLUSTER_NAME};

pub(crate) use conn::{drive, Shared};

use crate::proto::{self, AuthKey, RegisterError, StoreRequestError, SubmitError, TransferError};

/// ALPN of the transfer protocol.
pub(crate) const ALPN_KV: &[u8] = b"sglrs-kv/1";
/// ALPN of the store protocol.
pub(crate) const ALPN_STORE: &[u8] = b"sglrs-store/1";

/// The largest `min_mtu` quinn can pad a handshake packet to (see `QuicConfig::transport`).
const MAX_MIN_MTU: u16 = 16_000;

/// [`QuicConfig::loopback`]'s send window. Loopback loses datagrams only when the receiving
/// socket's buffer overflows; with at most this much unacknowledged, what waits in that
/// buffer stays far below its size (the kernel grants twice the request up to
/// `net.core.rmem_max`: 8 MiB on the 4 MiB maximum here). With 256 MiB in flight a few
/// hundred datagrams per 0.74 GB were dropped on a busy machine, and every loss cut Cubic's
/// window; with 2 MiB none were, and the page writers' hashing stays this close ahead of
/// quinn's copy (the bytes are still in cache).
const LOOPBACK_SEND_WINDOW: u64 = 2 << 20;

/// Tuning of the QUIC transport around the protocol's own [`proto::Config`].
#[derive(Clone, Debug)]
pub struct QuicConfig {
    /// Protocol timers and limits.
    pub proto: proto::Config,
    /// UDP payload size: with [`QuicConfig::mtu_discovery`] the most path MTU discovery
    /// goes up to, else the size used after the handshake. 1200 is safe on any IP path;
    /// loopback and jumbo-frame LANs take far more (see [`QuicConfig::loopback`]). GSO
    /// batches are capped to fit one 65,507-byte send whatever the size.
    pub mtu: u16,
    /// Start at 1,200 bytes (what every IPv4/IPv6 path carries: a tunnel or a small-MTU
    /// link must not stall the handshake) and probe up to [`QuicConfig::mtu`]; quinn also
    /// falls back when the path shrinks. Off: every packet after the handshake is `mtu`
    /// bytes (loopback, where the size is known).
    pub mtu_discovery: bool,
    /// Flow-control window of one stream, bytes.
    pub stream_window: u64,
    /// Flow-control window of one connection, bytes.
    pub connection_window: u64,
    /// Bytes quinn may hold unacknowledged (sent or waiting to be sent) per connection. The
    /// page writers hash each page just before quinn takes it and wait for room here first,
    /// so this also bounds how far hashing runs ahead of quinn's copy into packets.
    pub send_window: u64,
    /// Page-carrying streams in flight per connection: a stream counts until the peer has
    /// acknowledged all of it, so this also bounds the frames the peer assembles at once.
    pub data_streams: usize,
    /// Requested UDP socket send and receive buffer size, bytes (the OS may cap it).
    pub socket_buffer: usize,
    /// Let the OS split large sends into datagrams (UDP GSO).
    pub gso: bool,
    /// Congestion controller and its initial window.
    pub congestion: Congestion,
}

/// Congestion control of the data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Congestion {
    /// CUBIC (quinn's default) starting at `initial_window` bytes (0: ten datagrams).
    Cubic {
        /// Initial congestion window, bytes.
        initial_window: u64,
    },
    /// BBR (quinn's experimental model-based controller) starting at `initial_window` bytes.
    Bbr {
        /// Initial congestion window, bytes (0: ten datagrams).
        initial_window: u64,
    },
}

impl Congestion {
    /// The initial window asked for (0: ten datagrams).
    pub fn initial_window(&self) -> u64 {
        match *self {
            Self::Cubic { initial_window } | Self::Bbr { initial_window } => initial_window,
        }
    }
}

impl Default for QuicConfig {
    fn default() -> Self {
        Self {
            proto: proto::Config {
                batch_pages: 16,
                ..proto::Config::default()
            },
            mtu: 1452,
            mtu_discovery: true,
            stream_window: 16 << 20,
            connection_window: 256 << 20,
            send_window: 256 << 20,
            data_streams: 8,
            socket_buffer: 8 << 20,
            gso: true,
            congestion: Congestion::Cubic { initial_window: 0 },
        }
    }
}

impl QuicConfig {
    /// Settings for loopback (tests, benchmarks, co-located roles): 60,000-byte datagrams
    /// (one per send: against 16,000-byte ones in four-segment GSO sends, about 10% less CPU
    /// per byte, from fewer packets to seal, open and acknowledge), a 4 MiB initial
    /// congestion window, since loopback needs no slow start, and a 2 MiB send window, so
    /// the receiving socket's buffer never overflows.
    pub fn loopback() -> Self {
        Self {
            mtu: 60_000,
            mtu_discovery: false,
            send_window: LOOPBACK_SEND_WINDOW,
            congestion: Congestion::Cubic {
                initial_window: 4 << 20,
            },
            ..Self::default()
        }
    }

    fn transport(&self) -> Result<quinn::TransportConfig, QuicError> {
        let mut t = quinn::TransportConfig::default();
        let var = |v: u64| {
            quinn::VarInt::from_u64(v).map_err(|_| QuicError::Config(format!("{v} out of range")))
        };
        // `min_mtu` is also the size the first Initial packet is padded to, and a long-header
        // packet's length field holds at most 16,383 bytes (quinn-proto asserts it), so it
        // stays below that; `initial_mtu` is what every packet after the handshake uses.
        // With discovery both are 1,200: a path that carries less than `mtu` (a tunnel, a
        // small-MTU link) must not drop the padded handshake packets.
        if self.mtu_discovery {
            let mut d = quinn::MtuDiscoveryConfig::default();
            d.upper_bound(self.mtu.max(1200));
            t.initial_mtu(1200)
                .min_mtu(1200)
                .mtu_discovery_config(Some(d));
        } else {
            t.initial_mtu(self.mtu.max(1200))
                .min_mtu(self.mtu.clamp(1200, MAX_MIN_MTU))
                .mtu_discovery_config(None);
        }
        t.stream_receive_window(var(self.stream_window)?)
            .receive_window(var(self.connection_window)?)
            .send_window(self.send_window)
            .max_concurrent_uni_streams(var(self.data_streams as u64 * 4 + 16)?)
            .max_concurrent_bidi_streams(var(4)?)
            .datagram_receive_buffer_size(None)
            .enable_segmentation_offload(self.gso)
            // The protocol's heartbeats keep the connection alive; quinn's idle timeout is a
            // backstop well past the protocol's own.
            .keep_alive_interval(Some(self.proto.heartbeat_interval))
            .max_idle_timeout(Some(
                quinn::IdleTimeout::try_from(self.proto.idle_timeout * 2 + Duration::from_secs(1))
                    .map_err(|e| QuicError::Config(e.to_string()))?,
            ));
        // quinn's default initial window (14,720 bytes) holds not even one 16 KiB datagram, and
        // a window smaller than one datagram never sends anything: start at ten datagrams.
        let default_window = (10 * u64::from(self.mtu)).max(14_720);
        let window = |w: u64| if w > 0 { w } else { default_window };
        match self.congestion {
            Congestion::Cubic { initial_window } => {
                let mut c = quinn::congestion::CubicConfig::default();
                c.initial_window(window(initial_window));
                t.congestion_controller_factory(Arc::new(c));
            }
            Congestion::Bbr { initial_window } => {
                let mut c = quinn::congestion::BbrConfig::default();
                c.initial_window(window(initial_window));
                t.congestion_controller_factory(Arc::new(c));
            }
        }
        Ok(t)
    }

    /// A quinn endpoint on `addr`, serving `server` (with ALPN) if given.
    pub(crate) fn endpoint(
        &self,
        addr: SocketAddr,
        server: Option<(&ClusterIdentity, &[u8])>,
    ) -> Result<quinn::Endpoint, QuicError> {
        let socket = UdpSocket::bind(addr)?;
        let sock = socket2::SockRef::from(&socket);
        // Best effort: the OS caps these at its configured maximum.
        let _ = sock.set_recv_buffer_size(self.socket_buffer);
        let _ = sock.set_send_buffer_size(self.socket_buffer);
        let mut ep = quinn::EndpointConfig::default();
        ep.max_udp_payload_size(self.mtu.max(1200))
            .map_err(|e| QuicError::Config(e.to_string()))?;
        let server_config = match server {
            Some((id, alpn)) => {
                let crypto =
                    quinn::crypto::rustls::QuicServerConfig::try_from(id.server_config(alpn)?)
                        .map_err(|e| QuicError::Config(e.to_string()))?;
                let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
                sc.transport_config(Arc::new(self.transport()?));
                Some(sc)
            }
            None => None,
        };
        let runtime =
            quinn::default_runtime().ok_or_else(|| QuicError::Config("no tokio runtime".into()))?;
        // Keep GSO batches within one UDP payload (see `socket`).
        let socket = socket::CappedSocket::new(runtime.wrap_udp_socket(socket)?, self.mtu);
        Ok(quinn::Endpoint::new_with_abstract_socket(
            ep,
            server_config,
            socket,
            runtime,
        )?)
    }

    /// Client configuration for dialing with `alpn`.
    pub(crate) fn client(
        &self,
        id: &ClusterIdentity,
        alpn: &[u8],
    ) -> Result<quinn::ClientConfig, QuicError> {
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(id.client_config(alpn)?)
            .map_err(|e| QuicError::Config(e.to_string()))?;
        let mut cc = quinn::ClientConfig::new(Arc::new(crypto));
        cc.transport_config(Arc::new(self.transport()?));
        Ok(cc)
    }
}

/// Files of a cluster identity folder.
const CERT_FILE: &str = "cert.pem";
const KEY_FILE: &str = "key.pem";
const SECRET_FILE: &str = "secret";

/// Writes a fresh cluster identity into `dir` (created if missing): a self-signed
/// certificate and key, and a random 32-byte shared secret, readable by the owner only.
pub fn write_identity(dir: &Path) -> Result<(), String> {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let id = ClusterIdentity::generate().map_err(|e| e.to_string())?;
    let (cert, key) = id.to_pem();
    let mut secret = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut secret))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    for (name, text, mode) in [
        (CERT_FILE, cert, 0o644),
        (KEY_FILE, key, 0o600),
        (SECRET_FILE, hex + "\n", 0o600),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("setting the mode of {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Reads a cluster identity folder (as [`write_identity`] writes it).
pub fn read_identity(dir: &Path) -> Result<Security, String> {
    let identity = ClusterIdentity::from_pem_files(&dir.join(CERT_FILE), &dir.join(KEY_FILE))
        .map_err(|e| format!("cluster identity {}: {e}", dir.display()))?;
    let path = dir.join(SECRET_FILE);
    let secret = std::fs::read_to_string(&path)
        .map_err(|e| format!("cluster identity: reading {}: {e}", path.display()))?
        .trim()
        .as_bytes()
        .to_vec();
    if secret.len() < 16 {
        return Err(format!(
            "cluster identity: {} holds fewer than 16 bytes",
            path.display()
        ));
    }
    Ok(Security { identity, secret })
}

/// Who may talk to whom: the cluster certificate and the shared secret.
#[derive(Clone, Debug)]
pub struct Security {
    /// The cluster certificate and key (the same on every host).
    pub identity: ClusterIdentity,
    /// The shared secret checked in every hello.
    pub secret: Vec<u8>,
}

impl Security {
    pub(crate) fn auth(&self) -> AuthKey {
        AuthKey::new(&self.secret)
    }
}

/// Why a QUIC-level operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    /// TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A socket could not be bound.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A setting is out of range.
    #[error("bad configuration: {0}")]
    Config(String),
    /// Dialing failed before the handshake.
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The QUIC handshake or connection failed (unreachable, refused by TLS, …).
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// The protocol ended the transfer or request with an error.
    #[error(transparent)]
    Transfer(#[from] TransferError),
    /// The room could not be registered.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// The pages could not be submitted.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// A store request could not be issued.
    #[error(transparent)]
    Store(#[from] StoreRequestError),
    /// A room is already being sent from this host.
    #[error("room {0} is already being sent")]
    DuplicateRoom(u64),
    /// No decode host registered the room in time.
    #[error("room {0} was not registered within {1:?}")]
    NotRegistered(u64, Duration),
    /// The local endpoint was shut down.
    #[error("endpoint shut down")]
    Shutdown,
}
