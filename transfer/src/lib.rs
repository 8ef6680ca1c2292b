//! KV page transfer for sglrs: prefill → decode over QUIC, and the shared KV store.
//!
//! A prefill host computes a prompt's KV pages; a decode host continues the request. This
//! crate moves the pages between them over QUIC (quinn: TLS 1.3, multiplexed streams, loss
//! recovery over plain UDP), and reads and writes pages of a shared KV store, the lowest
//! tier of the hierarchical cache. A page travels in the executor's page layout
//! ([`KvLayout`]: per layer, K then V), so neither side reshuffles bytes.
//!
//! # Layers
//!
//! - [`proto`]: the protocols as sans-IO state machines (quinn-proto style: `handle_*(…,
//!   now)` in, `poll_*()` out, no sockets, clocks or async): [`proto::TransferSender`] /
//!   [`proto::TransferReceiver`] for a transfer connection, [`proto::StoreClient`] /
//!   [`proto::StoreServer`] for the store. Versioned hello (version, auth, layout), rooms,
//!   page batches, aux data, `Done` with a checksum, resend, ack, abort; heartbeats and
//!   timeouts driven by `now`. Tested on a virtual clock with loss, reordering and
//!   duplication.
//! - [`quic`]: the tokio driver. [`quic::KvSender`] (prefill) listens and sends rooms;
//!   [`quic::KvReceiver`] (decode) dials, registers rooms and streams pages out;
//!   [`quic::RemoteStore`] is the store client and implements
//!   [`sglrs_radix_cache::KvStore`]. Security: the cluster certificate on both sides (mutual
//!   TLS, [`quic::ClusterIdentity`]) plus a shared secret in every hello.
//! - [`bootstrap`]: SGLang-style `bootstrap_host` / `bootstrap_port` / `bootstrap_room`, and
//!   the rendezvous of a room's registration with its pages.
//! - [`store`]: the KV store server ([`store::serve`]) over a [`store::PageStore`]: pages by
//!   hash in RAM (LRU) with a memory-mapped disk spill that survives restarts; every page
//!   is checked with xxh3 on the wire and on disk, and a corrupted page is a miss.
//!
//! # Usage (`--role prefill|decode`)
//!
//! The router sends a request to both hosts with the same [`bootstrap::BootstrapInfo`]. The
//! decode host allocates destination pages and calls [`quic::KvReceiver::register`], then
//! copies each page of a [`quic::RoomEvent::Pages`] event into its KV pool slot
//! ([`proto::Page::copy_to`]: a received page is the pieces quinn delivered, not gathered
//! into one buffer first) and starts decoding at
//! [`quic::RoomEvent::Done`]. The prefill host runs the prompt and calls
//! [`quic::KvSender::send`] with the pages; it returns once the decode host verified them,
//! or with the reason it failed, and releases the pages either way.
//!
//! ```
//! use bytes::Bytes;
//! use sglrs_transfer::proto::{AuxData, RoomId};
//! use sglrs_transfer::quic::{ClusterIdentity, KvReceiver, KvSender, QuicConfig, Security};
//! use sglrs_transfer::{KvDtype, KvLayout};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layout = KvLayout { num_layers: 2, num_kv_heads: 1, head_dim: 8, page_size: 4, dtype: KvDtype::Bf16 };
//! let security = Security { identity: ClusterIdentity::generate()?, secret: b"cluster secret".to_vec() };
//! let lo = "127.0.0.1:0".parse()?;
//! let prefill = KvSender::bind(lo, layout, &security, QuicConfig::loopback())?;
//! let decode = KvReceiver::bind(lo, layout, &security, QuicConfig::loopback())?;
//!
//! let room = RoomId(42); // from the request's bootstrap_room
//! let stream = decode.register(prefill.local_addr()?, room, vec![7, 8]).await?;
//! let pages = vec![Bytes::from(vec![1u8; layout.page_bytes()]), Bytes::from(vec![2u8; layout.page_bytes()])];
//! let aux = AuxData { first_token: 17, ..AuxData::default() };
//! let (sent, got) = tokio::join!(prefill.send(room, pages, aux), stream.collect());
//! sent?;
//! let got = got?;
//! assert_eq!(got.pages.len(), 2);
//! let (_, page) = got.pages.iter().find(|(dst, _)| *dst == 8).ok_or("page 8 missing")?;
//! let mut slot = vec![0u8; layout.page_bytes()];
//! page.copy_to(&mut slot);
//! assert_eq!(slot, vec![2u8; layout.page_bytes()]);
//! assert_eq!(got.aux.map(|a| a.first_token), Some(17));
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

pub mod bootstrap;
pub mod proto;
pub mod quic;
pub mod store;

/// The page layout is the radix cache's, shared with the executor and the cache tiers.
pub use sglrs_radix_cache::{KvDtype, KvLayout};
