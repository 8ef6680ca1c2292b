//! The store protocol: round trips, corrupted pages in transit, bad `Put` checksums,
//! refused secrets and request timeouts.

use super::*;

struct StorePair {
    now: Instant,
    client: StoreClient,
    server: StoreServer,
    backend: HashMap<PageHash, Bytes>,
    tamper_get: bool,
    events: Vec<StoreClientEvent>,
}

impl StorePair {
    fn new(c_secret: &[u8]) -> Self {
        let now = Instant::now();
        Self {
            now,
            client: StoreClient::new(cfg(), small_layout(), &AuthKey::new(c_secret), now),
            server: StoreServer::new(cfg(), small_layout(), AuthKey::new(b"store"), now),
            backend: HashMap::new(),
            tamper_get: false,
            events: Vec::new(),
        }
    }

    /// Delivers everything until both ends are quiet (no loss: QUIC streams are reliable).
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(m) = self
                .client
                .poll_transmit_control()
                .or_else(|| self.client.poll_transmit_data())
            {
                moved = true;
                self.server.handle_message(m, self.now);
            }
            while let Some(e) = self.server.poll_event() {
                if let StoreServerEvent::Request { id, op } = e {
                    let reply = match op {
                        StoreOp::Exists(h) => StoreReply::Exists(
                            h.iter()
                                .take_while(|h| self.backend.contains_key(h))
                                .count(),
                        ),
                        StoreOp::Get(h) => StoreReply::Get(
                            h.iter().map(|h| self.backend.get(h).cloned()).collect(),
                        ),
                        StoreOp::Put(pages) => {
                            let n = pages.len();
                            self.backend.extend(pages);
                            StoreReply::Put(n)
                        }
                    };
                    self.server.respond(id, reply, self.now);
                }
            }
            while let Some(m) = self
                .server
                .poll_transmit_control()
                .or_else(|| self.server.poll_transmit_data())
            {
                moved = true;
                let m = match m {
                    Message::GetOk { id, mut pages } if self.tamper_get => {
                        if let Some(Some(p)) = pages.first_mut() {
                            let mut v = p.data.to_vec();
                            v[0] ^= 1;
                            p.data = v.into();
                        }
                        Message::GetOk { id, pages }
                    }
                    m => m,
                };
                self.client.handle_message(m, self.now);
            }
            self.events
                .extend(std::iter::from_fn(|| self.client.poll_event()));
            if !moved {
                return;
            }
        }
    }
}

#[test]
fn store_put_exists_get_roundtrip() {
    let mut s = StorePair::new(b"store");
    let layout = small_layout();
    let pages: Vec<(PageHash, Bytes)> = (0..10)
        .map(|i| (PageHash(i as u128 + 1), page(&layout, i)))
        .collect();
    let put = s.client.put(pages[..6].to_vec(), s.now).unwrap();
    s.pump();
    assert!(s.events.contains(&StoreClientEvent::Put {
        id: put,
        stored: 6,
        rejected: 0
    }));
    let hashes: Vec<PageHash> = pages.iter().map(|p| p.0).collect();
    let ex = s.client.exists(hashes.clone(), s.now).unwrap();
    let get = s.client.get(hashes, s.now).unwrap();
    s.pump();
    assert!(s
        .events
        .contains(&StoreClientEvent::Exists { id: ex, hits: 6 }));
    let got = s.events.iter().find_map(|e| match e {
        StoreClientEvent::Got {
            id,
            pages,
            corrupted,
        } if *id == get => Some((pages.clone(), *corrupted)),
        _ => None,
    });
    let (got, corrupted) = got.unwrap();
    assert_eq!(corrupted, 0);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref(), (i < 6).then_some(&pages[i].1));
    }
    assert_eq!(s.client.pending(), 0);
}

#[test]
fn store_corrupted_page_in_transit_is_a_miss() {
    let mut s = StorePair::new(b"store");
    let layout = small_layout();
    s.client
        .put(
            vec![
                (PageHash(1), page(&layout, 1)),
                (PageHash(2), page(&layout, 2)),
            ],
            s.now,
        )
        .unwrap();
    s.pump();
    s.tamper_get = true;
    let get = s.client.get(vec![PageHash(1), PageHash(2)], s.now).unwrap();
    s.pump();
    assert!(s.events.contains(&StoreClientEvent::Got {
        id: get,
        pages: vec![None, Some(page(&layout, 2))],
        corrupted: 1
    }));
}

#[test]
fn store_rejects_a_put_with_a_bad_checksum() {
    let now = Instant::now();
    let layout = small_layout();
    let auth = AuthKey::new(b"k");
    let mut srv = StoreServer::new(cfg(), layout, auth.clone(), now);
    srv.handle_message(make_hello(&layout, &auth), now);
    let good = page(&layout, 1);
    let bad = StorePage {
        hash: PageHash(2),
        checksum: 12345,
        data: page(&layout, 2),
    };
    srv.handle_message(
        Message::Put {
            id: 1,
            pages: vec![
                StorePage {
                    hash: PageHash(1),
                    checksum: page_checksum(&good),
                    data: good.clone(),
                },
                bad,
            ],
        },
        now,
    );
    assert_eq!(srv.poll_event(), Some(StoreServerEvent::Connected));
    assert_eq!(
        srv.poll_event(),
        Some(StoreServerEvent::Request {
            id: 1,
            op: StoreOp::Put(vec![(PageHash(1), good)])
        })
    );
    srv.respond(1, StoreReply::Put(1), now);
    assert_eq!(srv.poll_transmit_control(), Some(Message::HelloAck));
    assert_eq!(
        srv.poll_transmit_control(),
        Some(Message::PutOk {
            id: 1,
            stored: 1,
            rejected: 1
        })
    );
}

#[test]
fn store_wrong_secret_fails_pending_requests() {
    let mut s = StorePair::new(b"intruder");
    let id = s.client.exists(vec![PageHash(1)], s.now).unwrap();
    s.pump();
    assert!(s.client.is_closed() && s.server.is_closed());
    assert!(s.events.contains(&StoreClientEvent::Failed {
        id,
        error: TransferError::Remote(AbortReason::AuthFailed)
    }));
    assert_eq!(
        s.client.exists(vec![], s.now),
        Err(StoreRequestError::Closed)
    );
}

#[test]
fn store_request_times_out_when_the_server_never_answers() {
    let mut s = StorePair::new(b"store");
    s.pump();
    let id = s.client.exists(vec![PageHash(1)], s.now).unwrap();
    // The request leaves, but the server is gone: nothing ever comes back.
    while s.client.poll_transmit_control().is_some() {}
    let mut now = s.now;
    while !s.client.is_closed() {
        now = s.client.poll_timeout().unwrap();
        s.client.handle_timeout(now);
        while s.client.poll_transmit_control().is_some() {}
    }
    let events: Vec<_> = std::iter::from_fn(|| s.client.poll_event()).collect();
    assert!(events.contains(&StoreClientEvent::Failed {
        id,
        error: TransferError::PeerTimeout(cfg().idle_timeout)
    }));
    assert!(now - s.now <= cfg().idle_timeout);
    assert_eq!(s.client.pending(), 0);
}
