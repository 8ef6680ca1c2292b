use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sglrs_transfer::proto::{AbortReason, AuxData, Page, RoomId, TransferError};
use sglrs_transfer::quic::{
    ClusterIdentity, KvReceiver, KvSender, QuicConfig, QuicError, RoomEvent, RoomStream, Security,
};
use sglrs_transfer::{KvDtype, KvLayout};

use crate::common::*;

/// Moves `n` pages of the default model's layout from a prefill endpoint to a decode
/// endpoint over encrypted QUIC and checks every byte.
async fn move_pages(n: u64) {
    let layout = KvLayout::smollm2_135m();
    let sec = security(b"cluster secret");
    let sender = KvSender::bind(any_port(), layout, &sec, QuicConfig::loopback()).unwrap();
    let receiver = KvReceiver::bind(any_port(), layout, &sec, QuicConfig::loopback()).unwrap();
    let addr = sender.local_addr().unwrap();
    let pages: Vec<Bytes> = (0..n)
        .map(|i| Bytes::from(page_bytes(layout.page_bytes(), i)))
        .collect();
    let expect = pages.clone();
    let room = RoomId(77);
    let dst: Vec<u32> = (0..n as u32).map(|i| 5000 + i).collect();
    let t0 = Instant::now();
    let mut stream = receiver.register(addr, room, dst).await.unwrap();
    let aux = AuxData {
        first_token: 9,
        first_logprob: -0.1,
        ..AuxData::default()
    };
    let send = tokio::spawn(async move {
        let r = sender.send(room, pages, aux).await;
        (r, sender)
    });
    let mut seen = vec![false; n as usize];
    let mut got_aux = None;
    let mut slot = vec![0u8; layout.page_bytes()];
    loop {
        match stream.next().await {
            Some(RoomEvent::Pages { dst_pages, pages }) => {
                for (d, p) in dst_pages.iter().zip(&pages) {
                    let i = (*d - 5000) as usize;
                    assert!(!seen[i], "page {i} delivered twice");
                    seen[i] = true;
                    // Into a KV pool slot, as the decode runtime does.
                    slot.fill(0);
                    p.copy_to(&mut slot);
                    assert!(slot[..] == expect[i][..], "page {i} differs");
                }
            }
            Some(RoomEvent::Aux(a)) => got_aux = Some(a),
            Some(RoomEvent::Done) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    let (r, sender) = send.await.unwrap();
    r.unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let bytes = n as f64 * layout.page_bytes() as f64;
    eprintln!(
        "moved {n} pages ({:.2} GB) in {secs:.2}s: {:.2} GB/s",
        bytes / 1e9,
        bytes / 1e9 / secs
    );
    assert!(seen.iter().all(|s| *s));
    assert_eq!(got_aux.unwrap().first_token, 9);
    assert_eq!(sender.held_pages(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_moves_1000_default_pages_and_verifies_every_byte() {
    move_pages(1000).await;
}

/// The full acceptance run: 10,000 pages, ~3.7 GB held by the sender (about 4 s on loopback
/// on a 2-core box, part of the normal suite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_moves_10000_default_pages_and_verifies_every_byte() {
    move_pages(10_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_receiver_fails_the_sender_and_frees_every_buffer() {
    let layout = KvLayout::smollm2_135m();
    let sec = security(b"s");
    let sender = KvSender::bind(any_port(), layout, &sec, fast_config()).unwrap();
    let addr = sender.local_addr().unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    let n = 3000u64;
    let pages: Vec<Bytes> = (0..n)
        .map(|i| tracked(page_bytes(layout.page_bytes(), i), &live))
        .collect();
    assert_eq!(live.load(Ordering::SeqCst), n as usize);
    // The decode host runs on its own runtime, which we kill mid-transfer: no goodbye, its
    // tasks and sockets simply vanish.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let decode = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let receiver =
                KvReceiver::bind(any_port(), layout, &security(b"s"), fast_config()).unwrap();
            let mut stream = receiver
                .register(addr, RoomId(1), (0..n as u32).collect())
                .await
                .unwrap();
            let mut got = 0;
            while let Some(RoomEvent::Pages { pages, .. }) = stream.next().await {
                got += pages.len();
                if got >= 100 {
                    break;
                }
            }
            let _ = started_tx.send(got);
            std::mem::forget(stream); // no cancel message: the host just dies
            std::mem::forget(receiver);
        });
        rt.shutdown_background();
    });
    let send = sender.send(RoomId(1), pages, AuxData::default());
    let (r, got) = tokio::join!(send, started_rx);
    decode.join().unwrap();
    let got = got.unwrap();
    assert!(
        got >= 100 && got < n as usize,
        "the receiver died mid-transfer after {got} pages"
    );
    let err = r.unwrap_err();
    assert!(
        matches!(
            err,
            QuicError::Transfer(
                TransferError::PeerTimeout(_)
                    | TransferError::ConnectionLost(_)
                    | TransferError::Local(AbortReason::Timeout)
            )
        ),
        "{err:?}"
    );
    assert_eq!(sender.held_pages(), 0);
    let t = Instant::now();
    while live.load(Ordering::SeqCst) > 0 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "page buffers still alive after the failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_submitted_before_registration_wait_for_it() {
    let layout = small_layout();
    let sec = security(b"s");
    let sender = Arc::new(KvSender::bind(any_port(), layout, &sec, fast_config()).unwrap());
    let addr = sender.local_addr().unwrap();
    let pages: Vec<Bytes> = (0..50)
        .map(|i| Bytes::from(page_bytes(layout.page_bytes(), i)))
        .collect();
    let s = sender.clone();
    let p = pages.clone();
    let send = tokio::spawn(async move { s.send(RoomId(5), p, AuxData::default()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sender.held_pages(), 50);
    let receiver = KvReceiver::bind(any_port(), layout, &sec, fast_config()).unwrap();
    let t = Instant::now();
    let room = receiver
        .register(addr, RoomId(5), (0..50).collect())
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    send.await.unwrap().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "no retransmission needed: {:?}",
        t.elapsed()
    );
    let got: HashMap<u32, Page> = room.pages.into_iter().collect();
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(&got[&(i as u32)], p);
    }
    // Several rooms share the one connection.
    let mut handles = Vec::new();
    for r in 10..20u64 {
        let s = sender.clone();
        let p = pages[..5].to_vec();
        handles.push(tokio::spawn(async move {
            s.send(RoomId(r), p, AuxData::default()).await
        }));
        let got = receiver
            .register(addr, RoomId(r), (0..5).collect())
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(got.pages.len(), 5);
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
    assert_eq!(receiver.connections(), 1);
    assert_eq!(sender.held_pages(), 0);
}

/// The error a refused connection reports: at registration when the refusal came first,
/// else through the room.
async fn transfer_error(r: Result<RoomStream, QuicError>) -> TransferError {
    match r {
        Ok(stream) => stream.collect().await.unwrap_err(),
        Err(QuicError::Transfer(e)) => e,
        Err(e) => panic!("{e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_is_refused_over_quic() {
    let layout = small_layout();
    let sender = KvSender::bind(any_port(), layout, &security(b"right"), fast_config()).unwrap();
    let receiver =
        KvReceiver::bind(any_port(), layout, &security(b"wrong"), fast_config()).unwrap();
    let err = transfer_error(
        receiver
            .register(sender.local_addr().unwrap(), RoomId(1), vec![1])
            .await,
    )
    .await;
    assert_eq!(err, TransferError::Remote(AbortReason::AuthFailed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_mismatch_is_refused_over_quic() {
    let theirs = KvLayout {
        dtype: KvDtype::F32,
        ..small_layout()
    };
    let sender =
        KvSender::bind(any_port(), small_layout(), &security(b"s"), fast_config()).unwrap();
    let receiver = KvReceiver::bind(any_port(), theirs, &security(b"s"), fast_config()).unwrap();
    let err = transfer_error(
        receiver
            .register(sender.local_addr().unwrap(), RoomId(1), vec![1])
            .await,
    )
    .await;
    assert_eq!(
        err,
        TransferError::Remote(AbortReason::LayoutMismatch {
            ours: small_layout(),
            theirs
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_the_cluster_certificate_cannot_connect() {
    let layout = small_layout();
    let sender = KvSender::bind(any_port(), layout, &security(b"s"), fast_config()).unwrap();
    let stranger = Security {
        identity: ClusterIdentity::generate().unwrap(),
        secret: b"s".to_vec(),
    };
    let receiver = KvReceiver::bind(any_port(), layout, &stranger, fast_config()).unwrap();
    let err = receiver
        .register(sender.local_addr().unwrap(), RoomId(1), vec![1])
        .await
        .err()
        .expect("TLS must refuse");
    assert!(matches!(err, QuicError::Connection(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_nobody_registers_times_out_and_is_released() {
    let layout = small_layout();
    let mut cfg = fast_config();
    cfg.proto.room_timeout = Duration::from_millis(300);
    let sender = KvSender::bind(any_port(), layout, &security(b"s"), cfg).unwrap();
    let pages = vec![Bytes::from(page_bytes(layout.page_bytes(), 0))];
    let err = sender
        .send(RoomId(3), pages, AuxData::default())
        .await
        .unwrap_err();
    assert!(matches!(err, QuicError::NotRegistered(3, _)), "{err:?}");
    assert_eq!(sender.held_pages(), 0);
}

/// A decode host that holds the first pages of a prompt in its own cache registers only
/// the rest: it gets the trailing pages (and the aux data's extra bytes), and the sender
/// reports how many it skipped; a host that holds every page registers none and still
/// gets the aux data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_host_registers_only_the_pages_it_lacks() {
    let layout = KvLayout::smollm2_135m();
    let sec = security(b"suffix");
    let sender = KvSender::bind(any_port(), layout, &sec, QuicConfig::loopback()).unwrap();
    let receiver = KvReceiver::bind(any_port(), layout, &sec, QuicConfig::loopback()).unwrap();
    let addr = sender.local_addr().unwrap();
    let pages: Vec<Bytes> = (0..5)
        .map(|i| Bytes::from(page_bytes(layout.page_bytes(), i)))
        .collect();
    for (room, want) in [(RoomId(11), 3usize), (RoomId(12), 0)] {
        let dst: Vec<u32> = (0..want as u32).map(|i| 100 + i).collect();
        let stream = receiver.register(addr, room, dst).await.unwrap();
        let aux = AuxData {
            first_token: 4,
            extra: Bytes::from_static(b"{\"k\":1}"),
            ..AuxData::default()
        };
        let (sent, got) = tokio::join!(sender.send(room, pages.clone(), aux), stream.collect());
        let report = sent.unwrap();
        assert_eq!((report.sent, report.skipped), (want, 5 - want));
        let got = got.unwrap();
        assert_eq!(got.pages.len(), want);
        for (dst, page) in &got.pages {
            let i = (*dst - 100) as usize + (5 - want);
            assert!(page.to_bytes()[..] == pages[i][..], "page {i} differs");
        }
        let aux = got.aux.expect("aux data");
        assert_eq!((aux.first_token, &aux.extra[..]), (4, &b"{\"k\":1}"[..]));
    }
    assert_eq!(sender.held_pages(), 0);
    assert_eq!(sender.open_rooms(), 0);
}

/// A prefill that failed tells its decode host why, whether the room was registered before
/// or after the failure, well within the room timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prefill_fails_its_room_on_the_decode_host_with_the_reason() {
    let layout = KvLayout::smollm2_135m();
    let sec = security(b"fail");
    let sender = KvSender::bind(any_port(), layout, &sec, QuicConfig::loopback()).unwrap();
    let receiver = KvReceiver::bind(any_port(), layout, &sec, QuicConfig::loopback()).unwrap();
    let addr = sender.local_addr().unwrap();
    let t0 = Instant::now();
    // Registered first, failed next.
    let stream = receiver
        .register(addr, RoomId(21), vec![1, 2])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    sender.fail(RoomId(21), "prompt too long for prefill");
    let err = stream.collect().await.unwrap_err();
    assert!(
        err.to_string().contains("prompt too long for prefill"),
        "{err}"
    );
    // Failed first, registered next.
    sender.fail(RoomId(22), "grammar rejected");
    let stream = receiver.register(addr, RoomId(22), vec![1]).await.unwrap();
    let err = stream.collect().await.unwrap_err();
    assert!(err.to_string().contains("grammar rejected"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(sender.held_pages(), 0);
}
