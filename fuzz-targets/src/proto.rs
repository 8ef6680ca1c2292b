//! The transfer and store protocols' sans-IO state machines (`sglrs_transfer::proto`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use sglrs_radix_cache::{KvDtype, KvLayout, PageHash};
use sglrs_transfer::proto::wire::{decode, encode};
use sglrs_transfer::proto::{
    page_checksum, room_checksum, AbortReason, AuthKey, AuxData, Config, Hello, Message, Page,
    RoomId, StoreClient, StoreOp, StorePage, StoreReply, StoreServer, StoreServerEvent,
    TransferReceiver, TransferSender, PROTOCOL_VERSION,
};

use crate::input::Input;

/// Steps of one input.
const MAX_STEPS: usize = 64;

const SECRET: &[u8] = b"fuzz secret";

fn layout() -> KvLayout {
    KvLayout {
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 2,
        page_size: 2,
        dtype: KvDtype::F16,
    }
}

fn cfg() -> Config {
    Config {
        heartbeat_interval: Duration::from_millis(100),
        idle_timeout: Duration::from_millis(500),
        retransmit_timeout: Duration::from_millis(50),
        max_retransmits: 3,
        room_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(1),
        batch_pages: 2,
        max_rooms: 4,
        max_pages: 8,
        linger: Duration::from_millis(300),
    }
}

/// Page `i` of room `room`: what both ends of a fuzzed transfer agree a page holds, so that
/// the fuzzer can produce a `Done` whose checksum matches.
fn page(room: u64, i: u32) -> Bytes {
    let fill = (room as u32).wrapping_mul(31).wrapping_add(i) as u8;
    Bytes::from(vec![fill; layout().page_bytes()])
}

/// One of the four protocol ends, fuzzed.
enum End {
    Sender(TransferSender),
    Receiver(TransferReceiver),
    Client(StoreClient),
    Server(StoreServer, Vec<(u64, StoreOp)>),
}

/// Drives one protocol end (the first byte picks which: transfer sender or receiver, store
/// client or server) with a sequence of steps read from the input: a message from the peer
/// (built field by field, so that a valid hello, a matching checksum or a known room are
/// reachable), a raw frame through the decoder, time passing, a local call (register,
/// submit, cancel, a store request or a backend answer), a lost connection, a close.
/// Asserts that nothing panics, that every message an end emits survives the wire (encodes,
/// decodes and re-encodes to the same bytes) and that an end is closed once closed or
/// disconnected.
pub fn transfer_proto(data: &[u8]) {
    let mut inp = Input::new(data);
    let t0 = Instant::now();
    let mut now = t0;
    let auth = AuthKey::new(SECRET);
    let mut end = match inp.u8() % 4 {
        0 => End::Sender(TransferSender::new(cfg(), layout(), auth.clone(), now)),
        1 => End::Receiver(TransferReceiver::new(cfg(), layout(), &auth, now)),
        2 => End::Client(StoreClient::new(cfg(), layout(), &auth, now)),
        _ => End::Server(
            StoreServer::new(cfg(), layout(), auth.clone(), now),
            Vec::new(),
        ),
    };
    for _ in 0..MAX_STEPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 8 {
            0..=2 => {
                let m = message(&mut inp, &auth);
                end.handle(m, &mut inp, now);
            }
            3 => {
                let n = usize::from(inp.u8());
                if let Ok(m) = decode(Bytes::copy_from_slice(inp.bytes(n))) {
                    end.handle(m, &mut inp, now);
                }
            }
            4 => {
                now += Duration::from_millis(u64::from(inp.u16() % 4096));
                end.timeout(now);
            }
            5 => end.local(&mut inp, now),
            6 => {
                end.lost(now);
                assert!(end.is_closed(), "open after its connection was lost");
            }
            _ => {
                end.close(now);
                assert!(end.is_closed(), "open after close");
            }
        }
        end.drain();
    }
}

impl End {
    fn handle(&mut self, m: Message, inp: &mut Input, now: Instant) {
        match self {
            End::Sender(s) => s.handle_message(m, now),
            End::Receiver(r) => {
                let sums = match (&m, inp.u8() % 3) {
                    (Message::Pages { pages, .. }, 0) => {
                        Some(pages.iter().map(Page::checksum).collect())
                    }
                    (Message::Pages { .. }, 1) => Some(vec![0; usize::from(inp.u8() % 4)]),
                    _ => None,
                };
                r.handle_message_hashed(m, sums, now)
            }
            End::Client(c) => c.handle_message(m, now),
            End::Server(s, _) => s.handle_message(m, now),
        }
    }

    fn timeout(&mut self, now: Instant) {
        match self {
            End::Sender(s) => s.handle_timeout(now),
            End::Receiver(r) => r.handle_timeout(now),
            End::Client(c) => c.handle_timeout(now),
            End::Server(s, _) => s.handle_timeout(now),
        }
    }

    fn lost(&mut self, now: Instant) {
        let why = "fuzz: connection lost".to_string();
        match self {
            End::Sender(s) => s.handle_connection_lost(why, now),
            End::Receiver(r) => r.handle_connection_lost(why, now),
            End::Client(c) => c.handle_connection_lost(why, now),
            End::Server(s, _) => s.handle_connection_lost(why, now),
        }
    }

    fn close(&mut self, now: Instant) {
        match self {
            End::Sender(s) => s.close("fuzz", now),
            End::Receiver(r) => r.close("fuzz", now),
            End::Client(c) => c.close("fuzz", now),
            End::Server(s, _) => s.close("fuzz", now),
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            End::Sender(s) => s.is_closed(),
            End::Receiver(r) => r.is_closed(),
            End::Client(c) => c.is_closed(),
            End::Server(s, _) => s.is_closed(),
        }
    }

    fn local(&mut self, inp: &mut Input, now: Instant) {
        match self {
            End::Sender(s) => {
                let room = RoomId(u64::from(inp.u8() % 4));
                if inp.one_in(4) {
                    s.cancel(room, "fuzz", now);
                    return;
                }
                let n = u32::from(inp.u8() % 9);
                let mut pages: Vec<Bytes> = (0..n).map(|i| page(room.0, i)).collect();
                if inp.one_in(8) {
                    pages.push(Bytes::from_static(b"short"));
                }
                let _ = s.submit(room, pages, aux(inp), now);
                let _ = s.registered_pages(room);
                let _ = (s.held_pages(), s.queued(), s.open_rooms());
            }
            End::Receiver(r) => {
                let room = RoomId(u64::from(inp.u8() % 4));
                match inp.u8() % 4 {
                    0 => r.cancel(room, "fuzz", now),
                    _ => {
                        let n = usize::from(inp.u8() % 10);
                        let _ = r.register(room, (0..n as u32).collect(), now);
                    }
                }
                let _ = r.open_rooms();
            }
            End::Client(c) => {
                let hashes = hashes(inp);
                let _ = match inp.u8() % 3 {
                    0 => c.exists(hashes, now),
                    1 => c.get(hashes, now),
                    _ => {
                        let pages = hashes
                            .into_iter()
                            .map(|h| (h, page(h.0 as u64, 0)))
                            .collect();
                        c.put(pages, now)
                    }
                };
                let _ = c.pending();
            }
            End::Server(s, pending) => {
                if pending.is_empty() {
                    return;
                }
                let (id, op) = pending.remove(usize::from(inp.u8()) % pending.len());
                let reply = match (op, inp.u8() % 4) {
                    (_, 0) => StoreReply::Failed("fuzz".into()),
                    (StoreOp::Exists(h), _) => {
                        StoreReply::Exists(usize::from(inp.u8()) % (h.len() + 2))
                    }
                    (StoreOp::Get(h), k) => {
                        let n = if k == 1 { h.len() + 1 } else { h.len() };
                        StoreReply::Get(
                            (0..n)
                                .map(|i| inp.one_in(2).then(|| page(i as u64, 0)))
                                .collect(),
                        )
                    }
                    (StoreOp::Put(p), _) => StoreReply::Put(p.len()),
                };
                s.respond(id, reply, now);
            }
        }
    }

    /// Takes every output, checking that each message survives the wire.
    fn drain(&mut self) {
        let mut out = Vec::new();
        match self {
            End::Sender(s) => {
                out.extend(std::iter::from_fn(|| s.poll_transmit_control()));
                out.extend(std::iter::from_fn(|| s.poll_transmit_data()));
                while s.poll_event().is_some() {}
                let _ = s.poll_timeout();
            }
            End::Receiver(r) => {
                out.extend(std::iter::from_fn(|| r.poll_transmit_control()));
                while r.poll_event().is_some() {}
                let _ = r.poll_timeout();
            }
            End::Client(c) => {
                out.extend(std::iter::from_fn(|| c.poll_transmit_control()));
                out.extend(std::iter::from_fn(|| c.poll_transmit_data()));
                while c.poll_event().is_some() {}
                let _ = c.poll_timeout();
            }
            End::Server(s, pending) => {
                out.extend(std::iter::from_fn(|| s.poll_transmit_control()));
                out.extend(std::iter::from_fn(|| s.poll_transmit_data()));
                while let Some(e) = s.poll_event() {
                    if let StoreServerEvent::Request { id, op } = e {
                        pending.push((id, op));
                    }
                }
                let _ = s.poll_timeout();
            }
        }
        for m in out {
            let once: Vec<u8> = encode(&m).iter().flat_map(|b| b.iter().copied()).collect();
            let back = decode(Bytes::copy_from_slice(&once[4..]))
                .unwrap_or_else(|e| panic!("emitted {m:?} does not decode: {e}"));
            let again: Vec<u8> = encode(&back)
                .iter()
                .flat_map(|b| b.iter().copied())
                .collect();
            assert_eq!(once, again, "emitted {m:?} does not round-trip");
        }
    }
}

fn hashes(inp: &mut Input) -> Vec<PageHash> {
    (0..inp.u8() % 6)
        .map(|_| PageHash(u128::from(inp.u8() % 8)))
        .collect()
}

fn aux(inp: &mut Input) -> AuxData {
    let extra = usize::from(inp.u8() % 16);
    AuxData {
        first_token: inp.u32(),
        first_logprob: f32::from_bits(inp.u32()),
        top_logprobs: (0..inp.u8() % 3).map(|_| (inp.u32(), -1.0)).collect(),
        extra: Bytes::copy_from_slice(inp.bytes(extra)),
    }
}

fn reason(inp: &mut Input) -> AbortReason {
    match inp.u8() % 9 {
        0 => AbortReason::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: inp.u16(),
        },
        1 => AbortReason::AuthFailed,
        2 => AbortReason::LayoutMismatch {
            ours: layout(),
            theirs: layout(),
        },
        3 => AbortReason::ChecksumMismatch {
            expected: inp.u64(),
            got: inp.u64(),
        },
        4 => AbortReason::UnknownRoom,
        5 => AbortReason::PageCountMismatch {
            expected: inp.u32(),
            got: inp.u32(),
        },
        6 => AbortReason::Protocol("fuzz".into()),
        7 => AbortReason::Timeout,
        _ => AbortReason::Cancelled("fuzz".into()),
    }
}

/// A message from the peer, field by field: small room ids, pages of the agreed contents,
/// and (on a flag) the right auth tag and room checksum.
fn message(inp: &mut Input, auth: &AuthKey) -> Message {
    let room = RoomId(u64::from(inp.u8() % 4));
    match inp.u8() % 18 {
        0 => {
            let flags = inp.u8();
            let mut l = layout();
            if flags & 4 != 0 {
                l.page_size = usize::from(inp.u8());
            }
            Message::Hello(Hello {
                version: if flags & 1 == 0 {
                    PROTOCOL_VERSION
                } else {
                    inp.u16()
                },
                auth: if flags & 2 == 0 {
                    auth.tag()
                } else {
                    [inp.u8(); 32]
                },
                layout: l,
            })
        }
        1 => Message::HelloAck,
        2 => Message::Ping,
        3 => Message::Abort {
            room: inp.one_in(2).then_some(room),
            reason: reason(inp),
        },
        4 => Message::Register {
            room,
            dst_pages: (0..inp.u8() % 10).map(u32::from).collect(),
        },
        5 => Message::Registered { room },
        6 => {
            let first = u32::from(inp.u8() % 10);
            let n = u32::from(inp.u8() % 4);
            let short = inp.one_in(8);
            Message::Pages {
                room,
                first,
                pages: (first..first + n)
                    .map(|i| {
                        let p = page(room.0, i);
                        Page::from(if short { p.slice(1..) } else { p })
                    })
                    .collect(),
            }
        }
        7 => Message::Aux {
            room,
            aux: aux(inp),
        },
        8 => {
            let num_pages = u32::from(inp.u8() % 10);
            let checksum = if inp.one_in(4) {
                inp.u64()
            } else {
                room_checksum((0..num_pages).map(|i| page_checksum(&page(room.0, i))))
            };
            Message::Done {
                room,
                num_pages,
                checksum,
            }
        }
        9 => Message::Resend {
            room,
            missing: (0..inp.u8() % 4)
                .map(|_| u32::from(inp.u8() % 12))
                .collect(),
        },
        10 => Message::Ack { room },
        11 => Message::Exists {
            id: u64::from(inp.u8() % 8),
            hashes: hashes(inp),
        },
        12 => Message::ExistsOk {
            id: u64::from(inp.u8() % 8),
            hits: u32::from(inp.u8() % 8),
        },
        13 => Message::Get {
            id: u64::from(inp.u8() % 8),
            hashes: hashes(inp),
        },
        14 => Message::GetOk {
            id: u64::from(inp.u8() % 8),
            pages: (0..inp.u8() % 6)
                .map(|_| (!inp.one_in(3)).then(|| store_page(inp)))
                .collect(),
        },
        15 => Message::Put {
            id: u64::from(inp.u8() % 8),
            pages: (0..inp.u8() % 6).map(|_| store_page(inp)).collect(),
        },
        16 => Message::PutOk {
            id: u64::from(inp.u8() % 8),
            stored: u32::from(inp.u8() % 8),
            rejected: u32::from(inp.u8() % 8),
        },
        _ => Message::StoreFailed {
            id: u64::from(inp.u8() % 8),
            reason: "fuzz".into(),
        },
    }
}

fn store_page(inp: &mut Input) -> StorePage {
    let h = inp.u8() % 8;
    let mut data = page(u64::from(h), 0);
    if inp.one_in(8) {
        data = data.slice(1..);
    }
    let checksum = if inp.one_in(4) {
        inp.u64()
    } else {
        page_checksum(&data)
    };
    StorePage {
        hash: PageHash(u128::from(h)),
        checksum,
        data,
    }
}
