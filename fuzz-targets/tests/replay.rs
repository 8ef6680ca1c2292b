//! Replays every corpus input of every fuzz target (`fuzz/corpus/<target>/`, crashes found
//! and fixed included) through the same function cargo-fuzz runs, so `make test` keeps them
//! passing on stable.

use std::path::{Path, PathBuf};
use std::time::Instant;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn replay(target: &str, f: fn(&[u8])) {
    let dir = corpus(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    let start = Instant::now();
    for p in &files {
        let data = std::fs::read(p).expect("read a corpus file");
        let r = std::panic::catch_unwind(|| f(&data));
        assert!(r.is_ok(), "{target}: {} fails", p.display());
    }
    eprintln!(
        "{target}: {} inputs in {:.2} s",
        files.len(),
        start.elapsed().as_secs_f64()
    );
}

macro_rules! replay_tests {
    ($($name:ident => $f:path),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                replay(stringify!($name), $f);
            }
        )*

        #[test]
        fn every_target_has_a_replay_test() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in sglrs_fuzz_targets::TARGETS {
                assert!(tested.contains(name), "{name} has no replay test");
            }
        }
    };
}

replay_tests! {
    wire_decode => sglrs_fuzz_targets::wire::wire_decode,
    transfer_proto => sglrs_fuzz_targets::proto::transfer_proto,
    store_segment => sglrs_fuzz_targets::store::store_segment,
    grammar => sglrs_fuzz_targets::grammar::grammar,
    request => sglrs_fuzz_targets::request::request,
    gguf => sglrs_fuzz_targets::gguf::gguf,
    chat_template => sglrs_fuzz_targets::chat::chat_template,
}

/// Crashes found whose fix is not in yet (`fuzz/pending/<target>/`, see docs/reliability.md,
/// Fuzzing): run by name; once it passes, move the inputs into the corpus.
#[test]
#[ignore]
fn pending_crashes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/pending");
    for (name, f) in sglrs_fuzz_targets::TARGETS {
        let dir = root.join(name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for p in entries.map(|e| e.expect("a directory entry").path()) {
            let data = std::fs::read(&p).expect("read a pending input");
            let r = std::panic::catch_unwind(|| f(&data));
            assert!(r.is_ok(), "{name}: {} still fails", p.display());
        }
    }
}

/// The seeds built in code (`gguf::tiny_model`) are in the corpus as they are built now.
#[test]
fn generated_seeds_are_current() {
    let got = std::fs::read(corpus("gguf").join("seed-tiny-model.gguf"))
        .expect("fuzz/corpus/gguf/seed-tiny-model.gguf");
    assert!(
        got == sglrs_fuzz_targets::gguf::tiny_model(),
        "regenerate it: cargo test -p sglrs-fuzz-targets --test replay -- --ignored write_generated_seeds"
    );
}

/// Writes the seeds built in code into the corpus: the tiny GGUF model, one frame of every
/// message kind (their encoder's bytes, less the length prefix) and a segment file written
/// by the page store itself.
#[test]
#[ignore]
fn write_generated_seeds() {
    use bytes::Bytes;
    use sglrs_radix_cache::store::{segment_path, DiskConfig, PageStore, PageStoreConfig};
    use sglrs_radix_cache::{KvDtype, KvLayout, PageHash};
    use sglrs_transfer::proto::wire::encode;
    use sglrs_transfer::proto::*;

    std::fs::write(
        corpus("gguf").join("seed-tiny-model.gguf"),
        sglrs_fuzz_targets::gguf::tiny_model(),
    )
    .expect("write the seed");

    let layout = KvLayout {
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 2,
        page_size: 2,
        dtype: KvDtype::Bf16,
    };
    let page = |b: u8| Bytes::from(vec![b; 16]);
    let hash = |h: u128| PageHash(h);
    let msgs = [
        Message::Hello(Hello {
            version: PROTOCOL_VERSION,
            auth: AuthKey::new(b"s").tag(),
            layout,
        }),
        Message::HelloAck,
        Message::Ping,
        Message::Abort {
            room: Some(RoomId(3)),
            reason: AbortReason::LayoutMismatch {
                ours: layout,
                theirs: layout,
            },
        },
        Message::Abort {
            room: None,
            reason: AbortReason::Protocol("bad".into()),
        },
        Message::Register {
            room: RoomId(1),
            dst_pages: vec![4, 5, 6],
        },
        Message::Registered { room: RoomId(1) },
        Message::Pages {
            room: RoomId(1),
            first: 0,
            pages: vec![Page::from(page(1)), Page::from(page(2))],
        },
        Message::Aux {
            room: RoomId(1),
            aux: AuxData {
                first_token: 7,
                first_logprob: -0.5,
                top_logprobs: vec![(7, -0.5), (8, f32::NAN)],
                extra: Bytes::from_static(b"{\"pos\":3}"),
            },
        },
        Message::Done {
            room: RoomId(1),
            num_pages: 2,
            checksum: 99,
        },
        Message::Resend {
            room: RoomId(1),
            missing: vec![1],
        },
        Message::Ack { room: RoomId(1) },
        Message::Exists {
            id: 1,
            hashes: vec![hash(1), hash(2)],
        },
        Message::ExistsOk { id: 1, hits: 1 },
        Message::Get {
            id: 2,
            hashes: vec![hash(1)],
        },
        Message::GetOk {
            id: 2,
            pages: vec![
                Some(StorePage {
                    hash: hash(1),
                    checksum: page_checksum(&page(1)),
                    data: page(1),
                }),
                None,
            ],
        },
        Message::Put {
            id: 3,
            pages: vec![StorePage {
                hash: hash(2),
                checksum: page_checksum(&page(2)),
                data: page(2),
            }],
        },
        Message::PutOk {
            id: 3,
            stored: 1,
            rejected: 0,
        },
        Message::StoreFailed {
            id: 4,
            reason: "disk full".into(),
        },
    ];
    for (i, m) in msgs.iter().enumerate() {
        let frame: Vec<u8> = encode(m).iter().flat_map(|b| b.iter().copied()).collect();
        std::fs::write(
            corpus("wire_decode").join(format!("seed-{i:02}")),
            &frame[4..],
        )
        .expect("write the seed");
    }

    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = PageStore::open(PageStoreConfig {
        ram_bytes: 0,
        disk: Some(DiskConfig {
            dir: dir.path().to_path_buf(),
            max_bytes: 1 << 20,
            segment_bytes: 512,
        }),
        disk_write_through: true,
    })
    .expect("open a store");
    store
        .put((1..=4u8).map(|i| (hash(u128::from(i)), page(i))).collect())
        .expect("put");
    drop(store);
    let seg = std::fs::read(segment_path(dir.path(), 0)).expect("read the segment");
    for (flags, name) in [
        (0u8, "seed-segment"),
        (1 | 4, "seed-segment-two"),
        (2 | 8 | 0x30, "seed-segment-ram0"),
    ] {
        let mut data = vec![flags];
        data.extend(&seg);
        std::fs::write(corpus("store_segment").join(name), data).expect("write the seed");
    }
}
