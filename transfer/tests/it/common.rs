use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use sglrs_transfer::quic::{ClusterIdentity, QuicConfig, Security};

use sglrs_transfer::{KvDtype, KvLayout};

pub fn identity() -> ClusterIdentity {
    static ID: OnceLock<ClusterIdentity> = OnceLock::new();
    ID.get_or_init(|| ClusterIdentity::generate().unwrap())
        .clone()
}

pub fn security(secret: &[u8]) -> Security {
    Security {
        identity: identity(),
        secret: secret.to_vec(),
    }
}

pub fn any_port() -> SocketAddr {
    ([127, 0, 0, 1], 0).into()
}

pub fn small_layout() -> KvLayout {
    KvLayout {
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 8,
        page_size: 2,
        dtype: KvDtype::F16,
    }
}

pub fn fast_config() -> QuicConfig {
    let mut c = QuicConfig::loopback();
    c.proto.idle_timeout = std::time::Duration::from_secs(2);
    c.proto.heartbeat_interval = std::time::Duration::from_millis(300);
    c
}

/// Page `i` of a room: a byte pattern that differs per page and per position.
pub fn page_bytes(len: usize, i: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    v
}

/// A page buffer that counts how many of its kind are alive, to prove none is leaked.
pub struct Tracked {
    data: Vec<u8>,
    live: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

pub fn tracked(data: Vec<u8>, live: &Arc<AtomicUsize>) -> Bytes {
    live.fetch_add(1, Ordering::SeqCst);
    Bytes::from_owner(Tracked {
        data,
        live: live.clone(),
    })
}
