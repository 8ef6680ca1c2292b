//! Round trips and malformed input of the wire format.

use super::*;

fn roundtrip(m: Message) {
    let parts = encode(&m);
    let mut all = Vec::new();
    for p in &parts {
        all.extend_from_slice(p);
    }
    let n = frame_len([all[0], all[1], all[2], all[3]]).unwrap();
    assert_eq!(n, all.len() - 4);
    let back = decode(Bytes::from(all[4..].to_vec())).unwrap();
    assert_eq!(back, m);
}

#[test]
fn every_message_roundtrips() {
    let layout = KvLayout::smollm2_135m();
    let page = |b: u8| Bytes::from(vec![b; 32]);
    let sp = |b: u8| StorePage {
        hash: PageHash(b as u128 * 7),
        checksum: b as u64,
        data: page(b),
    };
    for m in [
        Message::Hello(Hello {
            version: 1,
            auth: [7; 32],
            layout,
        }),
        Message::HelloAck,
        Message::Ping,
        Message::Abort {
            room: None,
            reason: AbortReason::AuthFailed,
        },
        Message::Abort {
            room: Some(RoomId(3)),
            reason: AbortReason::LayoutMismatch {
                ours: layout,
                theirs: layout,
            },
        },
        Message::Abort {
            room: Some(RoomId(3)),
            reason: AbortReason::Protocol("x".into()),
        },
        Message::Abort {
            room: None,
            reason: AbortReason::VersionMismatch { ours: 1, theirs: 2 },
        },
        Message::Abort {
            room: None,
            reason: AbortReason::ChecksumMismatch {
                expected: 1,
                got: 2,
            },
        },
        Message::Abort {
            room: None,
            reason: AbortReason::PageCountMismatch {
                expected: 1,
                got: 2,
            },
        },
        Message::Abort {
            room: None,
            reason: AbortReason::Cancelled("bye".into()),
        },
        Message::Abort {
            room: None,
            reason: AbortReason::Timeout,
        },
        Message::Abort {
            room: None,
            reason: AbortReason::UnknownRoom,
        },
        Message::Register {
            room: RoomId(9),
            dst_pages: vec![1, 2, 3],
        },
        Message::Registered { room: RoomId(9) },
        Message::Pages {
            room: RoomId(9),
            first: 4,
            pages: vec![page(1).into(), page(2).into()],
        },
        Message::Aux {
            room: RoomId(9),
            aux: AuxData {
                first_token: 5,
                first_logprob: -0.5,
                top_logprobs: vec![(5, -0.5), (6, -2.0)],
                extra: Bytes::from_static(b"{\"rng\":7}"),
            },
        },
        Message::Done {
            room: RoomId(9),
            num_pages: 2,
            checksum: 0xdead,
        },
        Message::Resend {
            room: RoomId(9),
            missing: vec![0, 1],
        },
        Message::Ack { room: RoomId(9) },
        Message::Exists {
            id: 1,
            hashes: vec![PageHash(1), PageHash(u128::MAX)],
        },
        Message::ExistsOk { id: 1, hits: 1 },
        Message::Get {
            id: 2,
            hashes: vec![PageHash(1)],
        },
        Message::GetOk {
            id: 2,
            pages: vec![Some(sp(1)), None, Some(sp(2))],
        },
        Message::Put {
            id: 3,
            pages: vec![sp(3), sp(4)],
        },
        Message::PutOk {
            id: 3,
            stored: 2,
            rejected: 0,
        },
        Message::StoreFailed {
            id: 3,
            reason: "disk full".into(),
        },
    ] {
        roundtrip(m);
    }
}

#[test]
fn bad_frames_are_errors_not_panics() {
    assert_eq!(decode(Bytes::new()), Err(WireError::Truncated));
    assert_eq!(
        decode(Bytes::from_static(&[200])),
        Err(WireError::UnknownTag(200))
    );
    // A register claiming 2^32-1 pages in a tiny frame.
    let mut f = vec![tag::REGISTER];
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode(Bytes::from(f)), Err(WireError::Truncated));
    assert_eq!(
        decode(Bytes::from_static(&[tag::PING, 0])),
        Err(WireError::Trailing(1))
    );
    assert!(frame_len([0xff; 4]).is_err());
    // Every truncation of a valid frame is an error.
    let parts = encode(&Message::Done {
        room: RoomId(1),
        num_pages: 1,
        checksum: 2,
    });
    let full = parts[0].slice(4..);
    for cut in 0..full.len() {
        assert!(decode(full.slice(..cut)).is_err());
    }
}

fn pages_frame(count: u32, page_len: u32, data: usize) -> Vec<u8> {
    let mut f = vec![tag::PAGES];
    f.extend_from_slice(&5u64.to_le_bytes());
    f.extend_from_slice(&2u32.to_le_bytes());
    f.extend_from_slice(&count.to_le_bytes());
    f.extend_from_slice(&page_len.to_le_bytes());
    f.resize(f.len() + data, 9);
    f
}

/// The header a streaming driver parses agrees with `decode`, and both refuse page data
/// that does not fill the frame and empty pages (a count of 2^32-1 empty pages would
/// otherwise be accepted in a 21-byte frame).
#[test]
fn pages_header_matches_decode_and_refuses_bad_batches() {
    let head = |f: &[u8]| -> [u8; PAGES_HEADER] { f[..PAGES_HEADER].try_into().unwrap() };
    let f = pages_frame(3, 4, 12);
    assert_eq!(
        pages_header(&head(&f), f.len()),
        Ok(Some(PagesHeader {
            room: RoomId(5),
            first: 2,
            count: 3,
            page_len: 4
        }))
    );
    match decode(Bytes::from(f)) {
        Ok(Message::Pages { room, first, pages }) => {
            assert_eq!((room, first, pages.len()), (RoomId(5), 2, 3));
            assert!(pages.iter().all(|p| *p == [9u8; 4][..]));
        }
        other => panic!("{other:?}"),
    }
    for (count, len, data) in [(3, 4, 11), (3, 4, 13), (u32::MAX, 0, 0), (2, u32::MAX, 8)] {
        let f = pages_frame(count, len, data);
        let bad = WireError::BadField("page batch length");
        assert_eq!(pages_header(&head(&f), f.len()), Err(bad.clone()));
        assert_eq!(decode(Bytes::from(f)), Err(bad));
    }
    let f = pages_frame(0, 0, 0);
    assert!(matches!(pages_header(&head(&f), f.len()), Ok(Some(_))));
    let done = encode(&Message::Ack { room: RoomId(1) })[0]
        .slice(4..)
        .to_vec();
    let mut h = [0u8; PAGES_HEADER];
    h[..done.len()].copy_from_slice(&done);
    assert_eq!(pages_header(&h, done.len()), Ok(None));
}
