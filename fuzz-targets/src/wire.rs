//! The transfer and store protocols' frame decoder (`sglrs_transfer::proto::wire`).

use bytes::Bytes;
use sglrs_transfer::proto::wire::{
    decode, encode, frame_len, pages_header, Message, MAX_FRAME, PAGES_HEADER,
};

/// Largest frame body tried (frames of real pages are larger, but their decoding is the
/// same slicing).
const MAX_INPUT: usize = 64 << 10;

/// One frame body (what follows the 4-byte length) to [`decode`]. Asserts, when it decodes:
/// re-encoding gives a frame whose length prefix is right and that decodes to a message
/// encoding to the same bytes (byte equality: NaN logprobs are not `==`); the streaming
/// `pages_header` agrees with `decode` on `Pages` frames; and `frame_len` accepts the
/// frame's length.
pub fn wire_decode(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let frame = Bytes::copy_from_slice(data);
    let decoded = decode(frame.clone());
    if data.len() >= PAGES_HEADER {
        let head: [u8; PAGES_HEADER] = data[..PAGES_HEADER].try_into().expect("length checked");
        match (pages_header(&head, data.len()), &decoded) {
            (Ok(Some(h)), Ok(Message::Pages { room, first, pages })) => {
                assert_eq!((h.room, h.first, h.count), (*room, *first, pages.len()));
                assert!(pages.iter().all(|p| p.len() == h.page_len));
            }
            (Ok(Some(_)), Ok(other)) => panic!("pages_header read a Pages frame, decode {other:?}"),
            (Err(e), Ok(m @ Message::Pages { .. })) => {
                panic!("pages_header refused ({e}) a frame decode accepted: {m:?}")
            }
            _ => {}
        }
    }
    let Ok(msg) = decoded else { return };
    let once = flatten(&encode(&msg));
    let len = frame_len(once[..4].try_into().expect("a frame has a prefix"))
        .expect("an encoded frame has a valid length");
    assert_eq!(len, once.len() - 4, "length prefix of {msg:?}");
    assert!(len <= MAX_FRAME);
    let again = decode(Bytes::copy_from_slice(&once[4..]))
        .unwrap_or_else(|e| panic!("re-encoded {msg:?} does not decode: {e}"));
    assert_eq!(
        flatten(&encode(&again)),
        once,
        "{msg:?} does not round-trip"
    );
}

fn flatten(parts: &[Bytes]) -> Vec<u8> {
    parts.iter().flat_map(|b| b.iter().copied()).collect()
}
