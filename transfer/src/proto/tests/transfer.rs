//! The transfer protocol: delivery under loss, reordering and duplication, peers that
//! vanish, refused hellos, bad checksums, limits and timeouts.

use super::*;

#[test]
fn clean_transfer_completes() {
    let p = transfer_with(1, 0.0, 0.0, 0);
    assert!(
        p.elapsed() < Duration::from_millis(100),
        "no retransmission needed: {:?}",
        p.elapsed()
    );
}

#[test]
fn transfer_survives_loss() {
    for seed in 0..20 {
        transfer_with(seed, 0.2, 0.0, 0);
    }
}

#[test]
fn transfer_survives_reordering() {
    for seed in 0..20 {
        transfer_with(seed, 0.0, 0.0, 50);
    }
}

#[test]
fn transfer_survives_duplicates() {
    for seed in 0..20 {
        transfer_with(seed, 0.0, 0.5, 0);
    }
}

#[test]
fn transfer_survives_loss_reordering_and_duplicates_together() {
    for seed in 0..20 {
        transfer_with(seed, 0.15, 0.3, 30);
    }
}

/// A driver that hashes the pages itself (as the QUIC page writers do) and reports the
/// checksums late: `Done` waits for them, under loss, reordering and duplication too.
#[test]
fn driver_hashed_pages_hold_done_until_every_checksum_is_in() {
    for (seed, loss, dup, jitter) in [(1, 0.0, 0.0, 0), (2, 0.15, 0.3, 30), (3, 0.2, 0.0, 0)] {
        let mut p = pair_on_net(seed, loss, dup, jitter);
        p.driver_sums = Some(Vec::new());
        p.connect();
        let room = RoomId(5);
        let pages = p.start_room(room, 37);
        assert!(p.run_until(Duration::from_secs(120), |p| p.room_done(room)));
        p.check_pages(&pages);
        p.assert_nothing_held();
    }
    // Done is not handed out while a checksum is missing; a wrong one fails the room.
    let mut p = Pair::default_pair(4);
    p.connect();
    let room = RoomId(6);
    let layout = small_layout();
    p.receiver.register(room, vec![1, 2], p.now).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.registered(room)));
    let now = p.now;
    let pages = vec![page(&layout, 1), page(&layout, 2)];
    p.sender
        .submit(room, pages.clone(), AuxData::default(), now)
        .unwrap();
    let mut out = Vec::new();
    while let Some(m) = p.sender.poll_transmit_data_unhashed() {
        out.push(m);
    }
    assert!(out.iter().all(|m| !matches!(m, Message::Done { .. })));
    p.sender.record_checksum(room, 0, page_checksum(&pages[0]));
    assert_eq!(p.sender.poll_transmit_data_unhashed(), None);
    p.sender.record_checksum(room, 1, page_checksum(&pages[0])); // wrong: page 0's
    let done = p.sender.poll_transmit_data_unhashed();
    assert!(matches!(done, Some(Message::Done { num_pages: 2, .. })));
    for m in out.into_iter().chain(done) {
        p.net.send(now, To::Receiver, m);
    }
    assert!(p.run_until(Duration::from_secs(30), |p| p
        .s_events
        .iter()
        .any(|e| matches!(e, SenderEvent::RoomFailed { .. }))));
    assert!(p.r_events.iter().any(|e| matches!(
        e,
        ReceiverEvent::RoomFailed {
            error: TransferError::Local(AbortReason::ChecksumMismatch { .. }),
            ..
        }
    )));
    p.assert_nothing_held();
}

#[test]
fn many_rooms_interleave() {
    let mut p = Pair::default_pair(3);
    p.net.jitter_ms = 5;
    p.connect();
    let layout = small_layout();
    for r in 0..10u32 {
        let dst: Vec<u32> = (0..5).map(|i| r * 100 + i).collect();
        p.receiver.register(RoomId(r as u64), dst, p.now).unwrap();
    }
    assert!(p.run_until(Duration::from_secs(5), |p| (0..10)
        .all(|r| p.registered(RoomId(r)))));
    for r in 0..10u32 {
        let pages = (0..5).map(|i| page(&layout, r * 100 + i)).collect();
        p.sender
            .submit(RoomId(r as u64), pages, AuxData::default(), p.now)
            .unwrap();
    }
    assert!(p.run_until(Duration::from_secs(5), |p| (0..10)
        .all(|r| p.room_done(RoomId(r)))));
    for r in 0..10u32 {
        for i in 0..5 {
            assert_eq!(p.written[&(r * 100 + i)], page(&layout, r * 100 + i));
        }
    }
    p.assert_nothing_held();
}

#[test]
fn receiver_vanishing_mid_transfer_fails_sender_within_idle_timeout() {
    let mut p = Pair::default_pair(4);
    p.net.jitter_ms = 100;
    p.connect();
    let room = RoomId(1);
    p.start_room(room, 40);
    // A few steps of transfer, then the decode host disappears.
    for _ in 0..3 {
        p.step();
    }
    assert!(p.sender.held_pages() > 0);
    p.receiver_alive = false;
    let t0 = p.now;
    let idle = cfg().idle_timeout;
    assert!(p.run_until(Duration::from_secs(60), |p| p.sender.is_closed()));
    // Messages already in flight (up to 100 ms of jitter) still arrive after the peer died.
    assert!(
        p.now - t0 <= idle + Duration::from_millis(110),
        "took {:?}",
        p.now - t0
    );
    // The room fails first (its retransmissions run out), or with the connection.
    assert!(p.s_events.iter().any(|e| matches!(e, SenderEvent::RoomFailed { room: r, error: TransferError::PeerTimeout(_) | TransferError::Local(AbortReason::Timeout) } if *r == room)));
    assert!(p.s_events.contains(&SenderEvent::Closed {
        error: TransferError::PeerTimeout(idle)
    }));
    assert_eq!(p.sender.held_pages(), 0);
    assert_eq!(p.sender.queued(), 0);
    assert_eq!(p.sender.poll_timeout(), None);
}

#[test]
fn sender_vanishing_mid_transfer_fails_receiver_within_idle_timeout() {
    let mut p = Pair::default_pair(5);
    p.net.jitter_ms = 100;
    p.connect();
    let room = RoomId(1);
    p.start_room(room, 40);
    for _ in 0..3 {
        p.step();
    }
    // The prefill host dies with its unsent packets.
    p.sender_alive = false;
    p.net.queue.retain(|q| q.2 != To::Receiver);
    assert!(p.receiver.open_rooms() == 1);
    let t0 = p.now;
    let idle = cfg().idle_timeout;
    assert!(p.run_until(Duration::from_secs(60), |p| p.receiver.is_closed()));
    assert!(
        p.now - t0 <= idle + Duration::from_millis(110),
        "took {:?}",
        p.now - t0
    );
    assert!(p.r_events.iter().any(|e| matches!(e, ReceiverEvent::RoomFailed { room: r, error: TransferError::PeerTimeout(_) | TransferError::Local(AbortReason::Timeout) } if *r == room)), "{:?}", &p.r_events[p.r_events.len() - 2..]);
    assert!(
        p.r_events.contains(&ReceiverEvent::Closed {
            error: TransferError::PeerTimeout(idle)
        }),
        "{:?}",
        &p.r_events[p.r_events.len() - 2..]
    );
    assert_eq!(p.receiver.open_rooms(), 0);
    assert_eq!(p.receiver.poll_timeout(), None);
}

#[test]
fn heartbeats_keep_an_idle_connection_alive() {
    let mut p = Pair::default_pair(6);
    p.connect();
    p.run_until(Duration::from_secs(60), |_| false);
    assert!(!p.sender.is_closed() && !p.receiver.is_closed());
}

#[test]
fn corrupted_page_fails_the_checksum_on_both_sides() {
    let mut p = Pair::default_pair(7);
    let mut hit = false;
    p.tamper = Some(Box::new(move |m| match m {
        Message::Pages {
            room,
            first,
            mut pages,
        } if !hit => {
            hit = true;
            let mut v = pages[0].to_bytes().to_vec();
            v[3] ^= 0x40;
            pages[0] = v.into();
            Message::Pages { room, first, pages }
        }
        m => m,
    }));
    p.connect();
    let room = RoomId(9);
    p.start_room(room, 10);
    assert!(p.run_until(Duration::from_secs(30), |p| p
        .s_events
        .iter()
        .any(|e| matches!(e, SenderEvent::RoomFailed { .. }))));
    assert!(p.r_events.iter().any(|e| matches!(e,
        ReceiverEvent::RoomFailed { room: r, error: TransferError::Local(AbortReason::ChecksumMismatch { .. }) } if *r == room)));
    assert!(p.s_events.iter().any(|e| matches!(e,
        SenderEvent::RoomFailed { room: r, error: TransferError::Remote(AbortReason::ChecksumMismatch { .. }) } if *r == room)));
    assert!(!p.r_events.contains(&ReceiverEvent::RoomDone { room }));
    p.assert_nothing_held();
    // The connection itself stays usable.
    p.written.clear();
    let pages = p.start_room(RoomId(10), 3);
    assert!(p.run_until(Duration::from_secs(30), |p| p.room_done(RoomId(10))));
    for (i, pg) in pages.iter().enumerate() {
        assert_eq!(&p.written[&(1000 + i as u32)], pg);
    }
}

#[test]
fn wrong_secret_is_refused() {
    let mut p = Pair::new(8, cfg(), small_layout(), small_layout(), b"right", b"wrong");
    assert!(
        p.run_until(Duration::from_secs(10), |p| p.sender.is_closed()
            && p.receiver.is_closed())
    );
    assert!(p.s_events.contains(&SenderEvent::Closed {
        error: TransferError::Local(AbortReason::AuthFailed)
    }));
    assert!(p.r_events.contains(&ReceiverEvent::Closed {
        error: TransferError::Remote(AbortReason::AuthFailed)
    }));
    assert!(!p.s_events.contains(&SenderEvent::Connected));
    assert_eq!(
        p.receiver.register(RoomId(1), vec![1], p.now),
        Err(RegisterError::Closed)
    );
}

#[test]
fn layout_mismatch_is_refused_with_both_layouts() {
    let other = KvLayout {
        dtype: KvDtype::F32,
        ..small_layout()
    };
    let mut p = Pair::new(9, cfg(), small_layout(), other, b"s", b"s");
    assert!(p.run_until(Duration::from_secs(10), |p| p.receiver.is_closed()));
    let want = TransferError::Remote(AbortReason::LayoutMismatch {
        ours: small_layout(),
        theirs: other,
    });
    assert!(p.r_events.contains(&ReceiverEvent::Closed {
        error: want.clone()
    }));
    let text = want.to_string();
    assert!(text.contains("f16") && text.contains("f32"), "{text}");
    assert!(p.sender.is_closed());
}

#[test]
fn version_mismatch_is_refused() {
    let now = Instant::now();
    let auth = AuthKey::new(b"s");
    let mut s = TransferSender::new(cfg(), small_layout(), auth.clone(), now);
    s.handle_message(
        Message::Hello(Hello {
            version: 99,
            auth: auth.tag(),
            layout: small_layout(),
        }),
        now,
    );
    assert_eq!(
        s.poll_transmit_control(),
        Some(Message::Abort {
            room: None,
            reason: AbortReason::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: 99
            }
        })
    );
    assert!(s.is_closed());
}

#[test]
fn page_count_mismatch_aborts_the_room() {
    let mut p = Pair::default_pair(10);
    p.connect();
    let room = RoomId(2);
    p.receiver.register(room, vec![1, 2, 3], p.now).unwrap();
    assert!(p.run_until(Duration::from_secs(5), |p| p.registered(room)));
    let layout = small_layout();
    let err = p
        .sender
        .submit(room, vec![page(&layout, 1)], AuxData::default(), p.now)
        .unwrap_err();
    assert_eq!(
        err,
        SubmitError::PageCount {
            expected: 3,
            got: 1
        }
    );
    assert!(p.run_until(Duration::from_secs(5), |p| p.receiver.open_rooms() == 0));
    assert!(p.r_events.iter().any(|e| matches!(
        e,
        ReceiverEvent::RoomFailed {
            error: TransferError::Remote(AbortReason::PageCountMismatch { .. }),
            ..
        }
    )));
    p.assert_nothing_held();
}

#[test]
fn submit_errors_are_reported() {
    let mut p = Pair::default_pair(11);
    let layout = small_layout();
    assert_eq!(
        p.sender
            .submit(RoomId(1), vec![], AuxData::default(), p.now),
        Err(SubmitError::NotOpen)
    );
    p.connect();
    assert_eq!(
        p.sender
            .submit(RoomId(1), vec![], AuxData::default(), p.now),
        Err(SubmitError::UnknownRoom(1))
    );
    p.receiver.register(RoomId(1), vec![5], p.now).unwrap();
    assert_eq!(
        p.receiver.register(RoomId(1), vec![5], p.now),
        Err(RegisterError::Duplicate(1))
    );
    assert!(p.run_until(Duration::from_secs(5), |p| p.registered(RoomId(1))));
    let short = Bytes::from_static(b"short");
    assert!(matches!(
        p.sender
            .submit(RoomId(1), vec![short], AuxData::default(), p.now),
        Err(SubmitError::PageSize { .. })
    ));
    p.sender
        .submit(RoomId(1), vec![page(&layout, 0)], AuxData::default(), p.now)
        .unwrap();
    assert_eq!(
        p.sender
            .submit(RoomId(1), vec![page(&layout, 0)], AuxData::default(), p.now),
        Err(SubmitError::AlreadySubmitted(1))
    );
    assert!(p.run_until(Duration::from_secs(5), |p| p.room_done(RoomId(1))));
}

#[test]
fn cancel_by_receiver_releases_sender_pages() {
    let mut p = Pair::default_pair(12);
    p.net.jitter_ms = 100;
    p.connect();
    let room = RoomId(3);
    p.start_room(room, 50);
    p.step();
    assert!(p.sender.held_pages() > 0);
    p.receiver.cancel(room, "client went away", p.now);
    assert!(p.run_until(Duration::from_secs(5), |p| p.sender.open_rooms() == 0));
    assert!(p.s_events.iter().any(|e| matches!(
        e,
        SenderEvent::RoomFailed {
            error: TransferError::Remote(AbortReason::Cancelled(_)),
            ..
        }
    )));
    p.assert_nothing_held();
    assert_eq!(p.sender.queued(), 0);
}

#[test]
fn room_that_never_gets_pages_times_out() {
    let mut p = Pair::new(
        13,
        Config {
            room_timeout: Duration::from_secs(3),
            ..cfg()
        },
        small_layout(),
        small_layout(),
        b"s",
        b"s",
    );
    p.connect();
    p.receiver.register(RoomId(4), vec![1, 2], p.now).unwrap();
    assert!(p.run_until(Duration::from_secs(10), |p| p.receiver.open_rooms() == 0));
    assert!(p.r_events.contains(&ReceiverEvent::RoomFailed {
        room: RoomId(4),
        error: TransferError::Local(AbortReason::Timeout)
    }));
    assert!(p.run_until(Duration::from_secs(10), |p| p.sender.open_rooms() == 0));
    assert!(!p.sender.is_closed());
}

#[test]
fn pages_outside_the_room_are_a_protocol_error() {
    let now = Instant::now();
    let auth = AuthKey::new(b"s");
    let layout = small_layout();
    let mut r = TransferReceiver::new(cfg(), layout, &auth, now);
    r.handle_message(Message::HelloAck, now);
    r.register(RoomId(1), vec![1, 2], now).unwrap();
    r.handle_message(
        Message::Pages {
            room: RoomId(1),
            first: 1,
            pages: vec![page(&layout, 0).into(), page(&layout, 1).into()],
        },
        now,
    );
    assert!(matches!(r.poll_event(), Some(ReceiverEvent::Connected)));
    assert!(matches!(
        r.poll_event(),
        Some(ReceiverEvent::RoomFailed {
            error: TransferError::Local(AbortReason::Protocol(_)),
            ..
        })
    ));
    assert_eq!(r.open_rooms(), 0);
    // Pages for a room never registered get an UnknownRoom abort.
    r.handle_message(
        Message::Pages {
            room: RoomId(99),
            first: 0,
            pages: vec![page(&layout, 0).into()],
        },
        now,
    );
    let sent: Vec<Message> = std::iter::from_fn(|| r.poll_transmit_control()).collect();
    assert!(sent.contains(&Message::Abort {
        room: Some(RoomId(99)),
        reason: AbortReason::UnknownRoom
    }));
}

#[test]
fn pages_overtaking_the_hello_ack_are_accepted() {
    let now = Instant::now();
    let auth = AuthKey::new(b"s");
    let layout = small_layout();
    let mut r = TransferReceiver::new(cfg(), layout, &auth, now);
    r.register(RoomId(1), vec![8], now).unwrap();
    r.handle_message(
        Message::Pages {
            room: RoomId(1),
            first: 0,
            pages: vec![page(&layout, 0).into()],
        },
        now,
    );
    r.handle_message(Message::HelloAck, now);
    assert_eq!(r.poll_event(), Some(ReceiverEvent::Connected));
    assert_eq!(
        r.poll_event(),
        Some(ReceiverEvent::Pages {
            room: RoomId(1),
            dst_pages: vec![8],
            pages: vec![page(&layout, 0).into()]
        })
    );
    assert_eq!(r.poll_event(), None);
}
