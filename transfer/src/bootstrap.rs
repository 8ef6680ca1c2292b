//! How a decode host finds the prefill host of a request and agrees on its room.
//!
//! As in SGLang's disaggregation, whoever routes a request (a router or the client) picks a
//! prefill host and a fresh room id, and sends the request to both hosts with three fields:
//! `bootstrap_host`, `bootstrap_port` (the prefill host's [`crate::quic::KvSender`] address)
//! and `bootstrap_room` (see [`BootstrapInfo`]). The decode host dials the prefill host (one
//! QUIC connection per pair of hosts, reused), allocates destination pages and registers the
//! room; the prefill host computes the prompt and submits its pages for the same room.
//! Either may come first: [`Rendezvous`] holds whichever arrives first until the other does.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;

use crate::proto::RoomId;

/// Where a request's KV comes from: SGLang's `bootstrap_host` / `bootstrap_port` /
/// `bootstrap_room`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BootstrapInfo {
    /// The prefill host's name or address.
    pub host: String,
    /// The prefill host's transfer port (UDP, QUIC).
    pub port: u16,
    /// The room of this request.
    pub room: RoomId,
}

/// A bootstrap address could not be parsed or resolved.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The text is not `host:port/room`.
    #[error("bad bootstrap address {0:?}: expected host:port/room")]
    Parse(String),
    /// The host name did not resolve.
    #[error("cannot resolve {host}:{port}: {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// Why.
        reason: String,
    },
}

impl BootstrapInfo {
    /// A new request's bootstrap: the prefill host's address and a fresh random room.
    pub fn new_room(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
            room: RoomId(rand::random::<u64>()),
        }
    }

    /// Resolves the prefill host's socket address.
    pub async fn resolve(&self) -> Result<SocketAddr, BootstrapError> {
        let err = |reason: String| BootstrapError::Resolve {
            host: self.host.clone(),
            port: self.port,
            reason,
        };
        tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|e| err(e.to_string()))?
            .next()
            .ok_or_else(|| err("no address".into()))
    }
}

impl std::fmt::Display for BootstrapInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}/{}", self.host, self.port, self.room.0)
        } else {
            write!(f, "{}:{}/{}", self.host, self.port, self.room.0)
        }
    }
}

impl std::str::FromStr for BootstrapInfo {
    type Err = BootstrapError;

    /// Parses `host:port/room` (IPv6 hosts in brackets).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BootstrapError::Parse(s.to_string());
        let (addr, room) = s.rsplit_once('/').ok_or_else(bad)?;
        let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            host: host.to_string(),
            port: port.parse().map_err(|_| bad())?,
            room: RoomId(room.parse().map_err(|_| bad())?),
        })
    }
}

/// Matches rooms registered by decode hosts (on connection `C`) with pages submitted by the
/// local prefill (payload `P`), whichever comes first. A pure data structure: the driver
/// calls it, it does no I/O.
#[derive(Debug)]
pub struct Rendezvous<C, P> {
    registered: HashMap<RoomId, C>,
    waiting: HashMap<RoomId, (P, Instant)>,
}

impl<C, P> Default for Rendezvous<C, P> {
    fn default() -> Self {
        Self {
            registered: HashMap::new(),
            waiting: HashMap::new(),
        }
    }
}

/// What [`Rendezvous::offer`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer<C, P> {
    /// The room is registered on this connection: send the payload there now.
    Ready(C, P),
    /// Not registered yet: the payload is held until it is, or until its deadline.
    Held,
    /// A payload for this room is already held.
    Duplicate(P),
}

impl<C: Clone + PartialEq, P> Rendezvous<C, P> {
    /// A decode host registered `room` on `conn`. Returns the held payload, if the prefill
    /// side already offered one (send it now).
    pub fn register(&mut self, room: RoomId, conn: C) -> Option<P> {
        if let Some((p, _)) = self.waiting.remove(&room) {
            return Some(p);
        }
        self.registered.insert(room, conn);
        None
    }

    /// The prefill side has `payload` for `room`, to hold until `deadline` at the latest.
    pub fn offer(&mut self, room: RoomId, payload: P, deadline: Instant) -> Offer<C, P> {
        if let Some(c) = self.registered.remove(&room) {
            return Offer::Ready(c, payload);
        }
        if self.waiting.contains_key(&room) {
            return Offer::Duplicate(payload);
        }
        self.waiting.insert(room, (payload, deadline));
        Offer::Held
    }

    /// Withdraws a held payload (the prefill side gave up).
    pub fn withdraw(&mut self, room: RoomId) -> Option<P> {
        self.waiting.remove(&room).map(|(p, _)| p)
    }

    /// Forgets a registration (the room ended or failed on its connection).
    pub fn forget(&mut self, room: RoomId) {
        self.registered.remove(&room);
    }

    /// Forgets every registration made on `conn` (it closed).
    pub fn forget_conn(&mut self, conn: &C) {
        self.registered.retain(|_, c| c != conn);
    }

    /// Removes and returns the payloads whose deadline passed.
    pub fn expire(&mut self, now: Instant) -> Vec<(RoomId, P)> {
        let late: Vec<RoomId> = self
            .waiting
            .iter()
            .filter(|(_, (_, d))| *d <= now)
            .map(|(r, _)| *r)
            .collect();
        late.into_iter()
            .filter_map(|r| self.waiting.remove(&r).map(|(p, _)| (r, p)))
            .collect()
    }

    /// Payloads held, waiting for their registration.
    pub fn held(&self) -> impl Iterator<Item = &P> {
        self.waiting.values().map(|(p, _)| p)
    }

    /// Registrations waiting for their payload.
    pub fn registrations(&self) -> usize {
        self.registered.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bootstrap_info_roundtrips() {
        for s in [
            "prefill-0:8998/12345",
            "[::1]:7000/1",
            "10.0.0.2:1/18446744073709551615",
        ] {
            let b: BootstrapInfo = s.parse().unwrap();
            assert_eq!(b.to_string(), s);
        }
        for bad in ["host", "host:1", ":1/2", "h:x/2", "h:1/x", "h:70000/1"] {
            assert!(bad.parse::<BootstrapInfo>().is_err(), "{bad}");
        }
        assert_ne!(
            BootstrapInfo::new_room("a", 1).room,
            BootstrapInfo::new_room("a", 1).room
        );
    }

    #[test]
    fn registration_first_then_offer() {
        let now = Instant::now();
        let mut r: Rendezvous<u32, &str> = Rendezvous::default();
        assert_eq!(r.register(RoomId(1), 7), None);
        assert_eq!(r.offer(RoomId(1), "pages", now), Offer::Ready(7, "pages"));
        assert_eq!(r.registrations(), 0);
    }

    #[test]
    fn offer_first_then_registration() {
        let now = Instant::now();
        let mut r: Rendezvous<u32, &str> = Rendezvous::default();
        assert_eq!(
            r.offer(RoomId(1), "pages", now + Duration::from_secs(1)),
            Offer::Held
        );
        assert_eq!(r.offer(RoomId(1), "again", now), Offer::Duplicate("again"));
        assert_eq!(r.held().count(), 1);
        assert_eq!(r.register(RoomId(1), 3), Some("pages"));
        assert_eq!(r.held().count(), 0);
    }

    #[test]
    fn held_payloads_expire_and_connections_are_forgotten() {
        let now = Instant::now();
        let mut r: Rendezvous<u32, &str> = Rendezvous::default();
        r.offer(RoomId(1), "a", now + Duration::from_secs(1));
        r.offer(RoomId(2), "b", now + Duration::from_secs(5));
        assert_eq!(
            r.expire(now + Duration::from_secs(2)),
            vec![(RoomId(1), "a")]
        );
        assert_eq!(r.withdraw(RoomId(2)), Some("b"));
        r.register(RoomId(3), 9);
        r.register(RoomId(4), 8);
        r.forget_conn(&9);
        assert_eq!(r.registrations(), 1);
        r.forget(RoomId(4));
        assert_eq!(r.registrations(), 0);
    }
}
