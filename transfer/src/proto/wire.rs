//! Versioned messages of the transfer and store protocols and their byte encoding.
//!
//! A frame is `[u32 length (LE)][u8 tag][fields]`, where `length` counts everything after
//! itself. Page data is never copied by the encoder: [`encode`] returns the header as one
//! buffer followed by the pages' own [`Bytes`], and [`decode`] slices pages out of the
//! received frame without copying.

use bytes::{BufMut, Bytes, BytesMut};
use sglrs_radix_cache::PageHash;

use super::Page;
use sglrs_radix_cache::{KvDtype, KvLayout};

/// Version of the wire protocol carried in [`Hello`]; peers with another version are refused.
pub const PROTOCOL_VERSION: u16 = 2;

/// Largest frame accepted from a peer (256 MiB), so a hostile length cannot exhaust memory.
pub const MAX_FRAME: usize = 256 << 20;

/// Identifies one transfer (one request's KV) between a prefill and a decode host; agreed
/// through the bootstrap (`bootstrap_room` in SGLang).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoomId(pub u64);

impl std::fmt::Display for RoomId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "room {}", self.0)
    }
}

/// First message of every connection, sent by the side that dials.
#[derive(Clone, Debug, PartialEq)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the sender.
    pub version: u16,
    /// Authentication tag derived from the cluster secret (see [`crate::proto::AuthKey`]).
    pub auth: [u8; 32],
    /// The sender's KV page layout; the peer refuses a different one.
    pub layout: KvLayout,
}

/// Data that travels with a request's KV besides the pages: what prefill sampled.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct AuxData {
    /// The first generated token.
    pub first_token: u32,
    /// Its log-probability.
    pub first_logprob: f32,
    /// Top log-probabilities at the first position, `(token, logprob)`.
    pub top_logprobs: Vec<(u32, f32)>,
    /// Whatever else the application sends along (the runtime: the sampler's position and
    /// the prompt's logprobs, as JSON); at most [`MAX_AUX_EXTRA`] bytes.
    pub extra: Bytes,
}

/// Largest [`AuxData::extra`] accepted (16 MiB: the logprobs of a long prompt with top-k).
pub const MAX_AUX_EXTRA: usize = 16 << 20;

/// One page in a store request or answer, with its integrity checksum.
#[derive(Clone, Debug, PartialEq)]
pub struct StorePage {
    /// The page's name.
    pub hash: PageHash,
    /// xxh3-64 of `data`.
    pub checksum: u64,
    /// The page bytes in the executor's layout.
    pub data: Bytes,
}

/// Why a room or a whole connection was aborted; carried by [`Message::Abort`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AbortReason {
    /// The peers speak different protocol versions.
    #[error("protocol version mismatch: ours {ours}, theirs {theirs}")]
    VersionMismatch {
        /// The refusing side's version.
        ours: u16,
        /// The version it was offered.
        theirs: u16,
    },
    /// The peer's authentication tag does not match the cluster secret.
    #[error("authentication failed: wrong cluster secret")]
    AuthFailed,
    /// The peers store KV pages in different layouts.
    #[error("KV layout mismatch: ours is {ours}, theirs is {theirs}")]
    LayoutMismatch {
        /// The refusing side's layout.
        ours: KvLayout,
        /// The layout it was offered.
        theirs: KvLayout,
    },
    /// The pages received do not match the checksum in `Done`.
    #[error("checksum mismatch: expected {expected:#018x}, computed {got:#018x}")]
    ChecksumMismatch {
        /// The checksum the sender announced.
        expected: u64,
        /// The checksum of what arrived.
        got: u64,
    },
    /// The room is not known to the side that got a message for it.
    #[error("unknown room")]
    UnknownRoom,
    /// The number of pages offered differs from the number registered.
    #[error("page count mismatch: {expected} registered, {got} offered")]
    PageCountMismatch {
        /// Pages the receiver registered.
        expected: u32,
        /// Pages the sender has.
        got: u32,
    },
    /// The peer broke the protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The transfer did not finish in time.
    #[error("timed out")]
    Timeout,
    /// The local application cancelled the transfer.
    #[error("cancelled: {0}")]
    Cancelled(String),
}

/// Every message of the transfer protocol (decode ⇄ prefill) and of the store protocol
/// (client ⇄ store server).
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// Opens a connection: version, auth and layout.
    Hello(Hello),
    /// The hello was accepted.
    HelloAck,
    /// Heartbeat: sent when nothing else was sent for a heartbeat interval.
    Ping,
    /// Ends a room (`Some`) or the whole connection (`None`) with a reason.
    Abort {
        /// The room, or `None` for the connection.
        room: Option<RoomId>,
        /// Why.
        reason: AbortReason,
    },
    /// Decode → prefill: expect this room's KV into these destination pages.
    Register {
        /// The room.
        room: RoomId,
        /// Destination page ids in the decode host's KV pool, one per page to send.
        dst_pages: Vec<u32>,
    },
    /// Prefill → decode: the registration arrived (stops its retransmission).
    Registered {
        /// The room.
        room: RoomId,
    },
    /// Prefill → decode: a batch of consecutive pages of a room.
    Pages {
        /// The room.
        room: RoomId,
        /// Index (within the room) of the first page of the batch.
        first: u32,
        /// The pages, each exactly one layout page.
        pages: Vec<Page>,
    },
    /// Prefill → decode: what prefill sampled.
    Aux {
        /// The room.
        room: RoomId,
        /// The data.
        aux: AuxData,
    },
    /// Prefill → decode: every page of the room was sent.
    Done {
        /// The room.
        room: RoomId,
        /// Number of pages in the room.
        num_pages: u32,
        /// xxh3-64 over the little-endian xxh3-64 of every page, in page order.
        checksum: u64,
    },
    /// Decode → prefill: these page indices are missing, send them again.
    Resend {
        /// The room.
        room: RoomId,
        /// Missing page indices.
        missing: Vec<u32>,
    },
    /// Decode → prefill: the room arrived complete and verified.
    Ack {
        /// The room.
        room: RoomId,
    },
    /// Store client → server: how many of these pages, from the first, are present?
    Exists {
        /// Request id chosen by the client.
        id: u64,
        /// Page names.
        hashes: Vec<PageHash>,
    },
    /// Store server → client: answer to `Exists`.
    ExistsOk {
        /// The request.
        id: u64,
        /// Leading hits.
        hits: u32,
    },
    /// Store client → server: send these pages.
    Get {
        /// Request id chosen by the client.
        id: u64,
        /// Page names.
        hashes: Vec<PageHash>,
    },
    /// Store server → client: answer to `Get`, `None` for a miss.
    GetOk {
        /// The request.
        id: u64,
        /// One entry per requested hash.
        pages: Vec<Option<StorePage>>,
    },
    /// Store client → server: store these pages.
    Put {
        /// Request id chosen by the client.
        id: u64,
        /// The pages.
        pages: Vec<StorePage>,
    },
    /// Store server → client: answer to `Put`.
    PutOk {
        /// The request.
        id: u64,
        /// Pages stored (or already present).
        stored: u32,
        /// Pages refused because they failed their checksum.
        rejected: u32,
    },
    /// Store server → client: a request failed.
    StoreFailed {
        /// The request.
        id: u64,
        /// Why.
        reason: String,
    },
}

impl Message {
    /// Whether the message carries page data (the driver gives each such message its own
    /// stream; everything else goes on the connection's ordered control stream).
    pub fn is_bulk(&self) -> bool {
        matches!(
            self,
            Message::Pages { .. } | Message::GetOk { .. } | Message::Put { .. }
        )
    }
}

/// A frame could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame ended before a field.
    #[error("truncated frame")]
    Truncated,
    /// The frame has bytes after its last field.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// The message tag is unknown.
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    /// A field has a value outside its domain.
    #[error("bad field: {0}")]
    BadField(&'static str),
    /// The frame is larger than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
}

mod tag {
    pub const HELLO: u8 = 1;
    pub const HELLO_ACK: u8 = 2;
    pub const PING: u8 = 3;
    pub const ABORT: u8 = 4;
    pub const REGISTER: u8 = 5;
    pub const REGISTERED: u8 = 6;
    pub const PAGES: u8 = 7;
    pub const AUX: u8 = 8;
    pub const DONE: u8 = 9;
    pub const RESEND: u8 = 10;
    pub const ACK: u8 = 11;
    pub const EXISTS: u8 = 20;
    pub const EXISTS_OK: u8 = 21;
    pub const GET: u8 = 22;
    pub const GET_OK: u8 = 23;
    pub const PUT: u8 = 24;
    pub const PUT_OK: u8 = 25;
    pub const STORE_FAILED: u8 = 26;
}

fn put_layout(b: &mut BytesMut, l: &KvLayout) {
    b.put_u32_le(l.num_layers as u32);
    b.put_u32_le(l.num_kv_heads as u32);
    b.put_u32_le(l.head_dim as u32);
    b.put_u32_le(l.page_size as u32);
    b.put_u8(l.dtype.code());
}

fn put_str(b: &mut BytesMut, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    b.put_u16_le(s.len() as u16);
    b.put_slice(s);
}

fn put_reason(b: &mut BytesMut, r: &AbortReason) {
    match r {
        AbortReason::VersionMismatch { ours, theirs } => {
            b.put_u8(1);
            b.put_u16_le(*ours);
            b.put_u16_le(*theirs);
        }
        AbortReason::AuthFailed => b.put_u8(2),
        AbortReason::LayoutMismatch { ours, theirs } => {
            b.put_u8(3);
            put_layout(b, ours);
            put_layout(b, theirs);
        }
        AbortReason::ChecksumMismatch { expected, got } => {
            b.put_u8(4);
            b.put_u64_le(*expected);
            b.put_u64_le(*got);
        }
        AbortReason::UnknownRoom => b.put_u8(5),
        AbortReason::PageCountMismatch { expected, got } => {
            b.put_u8(6);
            b.put_u32_le(*expected);
            b.put_u32_le(*got);
        }
        AbortReason::Protocol(s) => {
            b.put_u8(7);
            put_str(b, s);
        }
        AbortReason::Timeout => b.put_u8(8),
        AbortReason::Cancelled(s) => {
            b.put_u8(9);
            put_str(b, s);
        }
    }
}

fn put_hashes(b: &mut BytesMut, hashes: &[PageHash]) {
    b.put_u32_le(hashes.len() as u32);
    for h in hashes {
        b.put_slice(&h.to_bytes());
    }
}

/// Encodes `msg` as one frame: the header (length, tag, fields) followed by the page data
/// buffers of bulk messages, shared rather than copied. Write the returned buffers in order.
pub fn encode(msg: &Message) -> Vec<Bytes> {
    let mut b = BytesMut::with_capacity(64);
    b.put_u32_le(0); // length, patched below
    let mut data: Vec<Bytes> = Vec::new();
    match msg {
        Message::Hello(h) => {
            b.put_u8(tag::HELLO);
            b.put_u16_le(h.version);
            b.put_slice(&h.auth);
            put_layout(&mut b, &h.layout);
        }
        Message::HelloAck => b.put_u8(tag::HELLO_ACK),
        Message::Ping => b.put_u8(tag::PING),
        Message::Abort { room, reason } => {
            b.put_u8(tag::ABORT);
            match room {
                Some(r) => {
                    b.put_u8(1);
                    b.put_u64_le(r.0);
                }
                None => b.put_u8(0),
            }
            put_reason(&mut b, reason);
        }
        Message::Register { room, dst_pages } => {
            b.put_u8(tag::REGISTER);
            b.put_u64_le(room.0);
            b.put_u32_le(dst_pages.len() as u32);
            for p in dst_pages {
                b.put_u32_le(*p);
            }
        }
        Message::Registered { room } => {
            b.put_u8(tag::REGISTERED);
            b.put_u64_le(room.0);
        }
        Message::Pages { room, first, pages } => {
            b.put_u8(tag::PAGES);
            b.put_u64_le(room.0);
            b.put_u32_le(*first);
            b.put_u32_le(pages.len() as u32);
            b.put_u32_le(pages.first().map_or(0, |p| p.len() as u32));
            data.extend(pages.iter().flat_map(|p| p.chunks().iter().cloned()));
        }
        Message::Aux { room, aux } => {
            b.put_u8(tag::AUX);
            b.put_u64_le(room.0);
            b.put_u32_le(aux.first_token);
            b.put_f32_le(aux.first_logprob);
            b.put_u32_le(aux.top_logprobs.len() as u32);
            for (t, lp) in &aux.top_logprobs {
                b.put_u32_le(*t);
                b.put_f32_le(*lp);
            }
            b.put_u32_le(aux.extra.len() as u32);
            b.extend_from_slice(&aux.extra);
        }
        Message::Done {
            room,
            num_pages,
            checksum,
        } => {
            b.put_u8(tag::DONE);
            b.put_u64_le(room.0);
            b.put_u32_le(*num_pages);
            b.put_u64_le(*checksum);
        }
        Message::Resend { room, missing } => {
            b.put_u8(tag::RESEND);
            b.put_u64_le(room.0);
            b.put_u32_le(missing.len() as u32);
            for m in missing {
                b.put_u32_le(*m);
            }
        }
        Message::Ack { room } => {
            b.put_u8(tag::ACK);
            b.put_u64_le(room.0);
        }
        Message::Exists { id, hashes } => {
            b.put_u8(tag::EXISTS);
            b.put_u64_le(*id);
            put_hashes(&mut b, hashes);
        }
        Message::ExistsOk { id, hits } => {
            b.put_u8(tag::EXISTS_OK);
            b.put_u64_le(*id);
            b.put_u32_le(*hits);
        }
        Message::Get { id, hashes } => {
            b.put_u8(tag::GET);
            b.put_u64_le(*id);
            put_hashes(&mut b, hashes);
        }
        Message::GetOk { id, pages } => {
            b.put_u8(tag::GET_OK);
            b.put_u64_le(*id);
            b.put_u32_le(pages.len() as u32);
            for p in pages {
                match p {
                    Some(p) => {
                        b.put_u8(1);
                        b.put_slice(&p.hash.to_bytes());
                        b.put_u64_le(p.checksum);
                        b.put_u32_le(p.data.len() as u32);
                        data.push(p.data.clone());
                    }
                    None => b.put_u8(0),
                }
            }
        }
        Message::Put { id, pages } => {
            b.put_u8(tag::PUT);
            b.put_u64_le(*id);
            b.put_u32_le(pages.len() as u32);
            for p in pages {
                b.put_slice(&p.hash.to_bytes());
                b.put_u64_le(p.checksum);
                b.put_u32_le(p.data.len() as u32);
                data.push(p.data.clone());
            }
        }
        Message::PutOk {
            id,
            stored,
            rejected,
        } => {
            b.put_u8(tag::PUT_OK);
            b.put_u64_le(*id);
            b.put_u32_le(*stored);
            b.put_u32_le(*rejected);
        }
        Message::StoreFailed { id, reason } => {
            b.put_u8(tag::STORE_FAILED);
            b.put_u64_le(*id);
            put_str(&mut b, reason);
        }
    }
    let total = b.len() - 4 + data.iter().map(Bytes::len).sum::<usize>();
    b[..4].copy_from_slice(&(total as u32).to_le_bytes());
    let mut out = Vec::with_capacity(1 + data.len());
    out.push(b.freeze());
    out.extend(data);
    out
}

/// Bytes of a `Pages` frame body before its page data: tag, room, first page, page count,
/// page length. A driver that receives a frame in pieces can read this much, parse it with
/// [`pages_header`] and take the pages one by one as they arrive.
pub const PAGES_HEADER: usize = 21;

/// The fixed fields of a `Pages` frame, as read by [`pages_header`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagesHeader {
    /// The room.
    pub room: RoomId,
    /// Index of the first page.
    pub first: u32,
    /// Number of pages.
    pub count: usize,
    /// Bytes per page.
    pub page_len: usize,
}

/// Parses the first [`PAGES_HEADER`] bytes of a frame body of `frame_len` bytes; `Ok(None)`
/// when the frame is not a `Pages` message. Refuses page data that does not fill the frame
/// exactly, and empty pages (a hostile count of them could not be bounded otherwise).
pub fn pages_header(
    head: &[u8; PAGES_HEADER],
    frame_len: usize,
) -> Result<Option<PagesHeader>, WireError> {
    if head[0] != tag::PAGES {
        return Ok(None);
    }
    let mut r = Reader {
        buf: Bytes::copy_from_slice(&head[1..]),
        pos: 0,
    };
    let room = RoomId(r.u64()?);
    let first = r.u32()?;
    let count = r.u32()? as usize;
    let page_len = r.u32()? as usize;
    check_batch(count, page_len, frame_len.saturating_sub(PAGES_HEADER))?;
    Ok(Some(PagesHeader {
        room,
        first,
        count,
        page_len,
    }))
}

/// A batch of `count` pages of `page_len` bytes must fill `data` bytes exactly, and a
/// non-empty batch has non-empty pages.
fn check_batch(count: usize, page_len: usize, data: usize) -> Result<(), WireError> {
    if count.saturating_mul(page_len) != data || (count > 0 && page_len == 0) {
        return Err(WireError::BadField("page batch length"));
    }
    Ok(())
}

/// Reads the frame length from the 4-byte prefix, refusing frames over [`MAX_FRAME`].
pub fn frame_len(prefix: [u8; 4]) -> Result<usize, WireError> {
    let n = u32::from_le_bytes(prefix) as usize;
    if n > MAX_FRAME {
        return Err(WireError::TooLarge(n));
    }
    if n == 0 {
        return Err(WireError::Truncated);
    }
    Ok(n)
}

struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> Result<&[u8], WireError> {
        if self.buf.len() - self.pos < n {
            return Err(WireError::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn bytes(&mut self, n: usize) -> Result<Bytes, WireError> {
        if self.buf.len() - self.pos < n {
            return Err(WireError::Truncated);
        }
        let s = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn f32(&mut self) -> Result<f32, WireError> {
        Ok(f32::from_bits(self.u32()?))
    }
    fn hash(&mut self) -> Result<PageHash, WireError> {
        let mut a = [0u8; 16];
        a.copy_from_slice(self.take(16)?);
        Ok(PageHash::from_bytes(a))
    }
    /// A count of items each at least `item` bytes long, checked against what is left so a
    /// hostile count cannot make us allocate.
    fn count(&mut self, item: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item) > self.buf.len() - self.pos {
            return Err(WireError::Truncated);
        }
        Ok(n)
    }
    fn str(&mut self) -> Result<String, WireError> {
        let n = self.u16()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    fn layout(&mut self) -> Result<KvLayout, WireError> {
        Ok(KvLayout {
            num_layers: self.u32()? as usize,
            num_kv_heads: self.u32()? as usize,
            head_dim: self.u32()? as usize,
            page_size: self.u32()? as usize,
            dtype: KvDtype::from_code(self.u8()?).ok_or(WireError::BadField("dtype"))?,
        })
    }
    fn reason(&mut self) -> Result<AbortReason, WireError> {
        Ok(match self.u8()? {
            1 => AbortReason::VersionMismatch {
                ours: self.u16()?,
                theirs: self.u16()?,
            },
            2 => AbortReason::AuthFailed,
            3 => AbortReason::LayoutMismatch {
                ours: self.layout()?,
                theirs: self.layout()?,
            },
            4 => AbortReason::ChecksumMismatch {
                expected: self.u64()?,
                got: self.u64()?,
            },
            5 => AbortReason::UnknownRoom,
            6 => AbortReason::PageCountMismatch {
                expected: self.u32()?,
                got: self.u32()?,
            },
            7 => AbortReason::Protocol(self.str()?),
            8 => AbortReason::Timeout,
            9 => AbortReason::Cancelled(self.str()?),
            _ => return Err(WireError::BadField("abort reason")),
        })
    }
    fn hashes(&mut self) -> Result<Vec<PageHash>, WireError> {
        let n = self.count(16)?;
        (0..n).map(|_| self.hash()).collect()
    }
}

/// Decodes one frame body (everything after the 4-byte length). Page data are slices of
/// `frame`, not copies.
pub fn decode(frame: Bytes) -> Result<Message, WireError> {
    let mut r = Reader { buf: frame, pos: 0 };
    let msg = match r.u8()? {
        tag::HELLO => {
            let version = r.u16()?;
            let mut auth = [0u8; 32];
            auth.copy_from_slice(r.take(32)?);
            Message::Hello(Hello {
                version,
                auth,
                layout: r.layout()?,
            })
        }
        tag::HELLO_ACK => Message::HelloAck,
        tag::PING => Message::Ping,
        tag::ABORT => {
            let room = match r.u8()? {
                0 => None,
                1 => Some(RoomId(r.u64()?)),
                _ => return Err(WireError::BadField("abort room flag")),
            };
            Message::Abort {
                room,
                reason: r.reason()?,
            }
        }
        tag::REGISTER => {
            let room = RoomId(r.u64()?);
            let n = r.count(4)?;
            let dst_pages = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
            Message::Register { room, dst_pages }
        }
        tag::REGISTERED => Message::Registered {
            room: RoomId(r.u64()?),
        },
        tag::PAGES => {
            let room = RoomId(r.u64()?);
            let first = r.u32()?;
            let n = r.u32()? as usize;
            let len = r.u32()? as usize;
            check_batch(n, len, r.buf.len() - r.pos)?;
            let pages = (0..n)
                .map(|_| r.bytes(len).map(Page::from))
                .collect::<Result<_, _>>()?;
            Message::Pages { room, first, pages }
        }
        tag::AUX => {
            let room = RoomId(r.u64()?);
            let first_token = r.u32()?;
            let first_logprob = r.f32()?;
            let n = r.count(8)?;
            let top_logprobs = (0..n)
                .map(|_| Ok((r.u32()?, r.f32()?)))
                .collect::<Result<_, _>>()?;
            let len = r.u32()? as usize;
            if len > MAX_AUX_EXTRA {
                return Err(WireError::BadField(
                    "aux extra data larger than MAX_AUX_EXTRA",
                ));
            }
            let extra = r.bytes(len)?;
            Message::Aux {
                room,
                aux: AuxData {
                    first_token,
                    first_logprob,
                    top_logprobs,
                    extra,
                },
            }
        }
        tag::DONE => Message::Done {
            room: RoomId(r.u64()?),
            num_pages: r.u32()?,
            checksum: r.u64()?,
        },
        tag::RESEND => {
            let room = RoomId(r.u64()?);
            let n = r.count(4)?;
            let missing = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
            Message::Resend { room, missing }
        }
        tag::ACK => Message::Ack {
            room: RoomId(r.u64()?),
        },
        tag::EXISTS => Message::Exists {
            id: r.u64()?,
            hashes: r.hashes()?,
        },
        tag::EXISTS_OK => Message::ExistsOk {
            id: r.u64()?,
            hits: r.u32()?,
        },
        tag::GET => Message::Get {
            id: r.u64()?,
            hashes: r.hashes()?,
        },
        tag::GET_OK => {
            let id = r.u64()?;
            let n = r.count(1)?;
            let mut heads = Vec::with_capacity(n);
            for _ in 0..n {
                heads.push(match r.u8()? {
                    0 => None,
                    1 => Some((r.hash()?, r.u64()?, r.u32()? as usize)),
                    _ => return Err(WireError::BadField("page present flag")),
                });
            }
            let pages = heads
                .into_iter()
                .map(|h| {
                    h.map(|(hash, checksum, len)| {
                        Ok(StorePage {
                            hash,
                            checksum,
                            data: r.bytes(len)?,
                        })
                    })
                    .transpose()
                })
                .collect::<Result<_, WireError>>()?;
            Message::GetOk { id, pages }
        }
        tag::PUT => {
            let id = r.u64()?;
            let n = r.count(28)?;
            let heads = (0..n)
                .map(|_| Ok((r.hash()?, r.u64()?, r.u32()? as usize)))
                .collect::<Result<Vec<_>, WireError>>()?;
            let pages = heads
                .into_iter()
                .map(|(hash, checksum, len)| {
                    Ok(StorePage {
                        hash,
                        checksum,
                        data: r.bytes(len)?,
                    })
                })
                .collect::<Result<_, WireError>>()?;
            Message::Put { id, pages }
        }
        tag::PUT_OK => Message::PutOk {
            id: r.u64()?,
            stored: r.u32()?,
            rejected: r.u32()?,
        },
        tag::STORE_FAILED => Message::StoreFailed {
            id: r.u64()?,
            reason: r.str()?,
        },
        t => return Err(WireError::UnknownTag(t)),
    };
    if r.pos != r.buf.len() {
        return Err(WireError::Trailing(r.buf.len() - r.pos));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests;
