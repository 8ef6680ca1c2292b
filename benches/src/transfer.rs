//! `sglrs bench transfer`: KV pages over encrypted QUIC against plain TCP and memcpy.
//!
//! Moves `pages` pages of the default model's layout (SmolLM2-135M: 30 layers × K,V × 3 KV
//! heads × 64 dims × 16 tokens, bf16 = 368,640 bytes per page) over loopback, three ways,
//! in the same run:
//!
//! - **quic**: a prefill [`KvSender`] and a decode [`KvReceiver`] (TLS 1.3, mutual
//!   certificates, shared secret, per-page xxh3 and room checksum), one room with every
//!   page; the decode side copies each page into its slot of a KV pool, as the runtime does.
//! - **tcp**: one plain TCP connection, the same bytes written page by page and read
//!   straight into the pool slots (no encryption, no integrity check, no framing).
//! - **memcpy**: each page copied into its pool slot in memory.
//!
//! The source holds at most 256 distinct pages and the pool 256 slots (page `i` uses slot
//! `i % 256`), so memory stays bounded at any `--pages`. Each way runs `rounds` times; the
//! best round counts (the machine may be shared). Besides wall-clock GB/s, each way reports
//! GB per CPU-second of the whole process (user + system, from `/proc/self/stat`), which
//! other processes on a busy machine do not inflate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use serde_json::{json, Value};
use sglrs_transfer::proto::{AuxData, RoomId};
use sglrs_transfer::quic::{
    ClusterIdentity, Congestion, KvReceiver, KvSender, QuicConfig, RoomEvent, Security,
};
use sglrs_transfer::KvLayout;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Knobs of `sglrs bench transfer` (`--json` is the CLI's).
#[derive(clap::Args, Debug, Clone)]
pub struct TransferArgs {
    /// Pages moved per round (368,640 bytes each).
    #[arg(long, default_value_t = 2000)]
    pub pages: usize,
    /// Rounds per way; the best counts.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// QUIC UDP payload size (loopback takes large datagrams).
    #[arg(long, default_value_t = QuicConfig::loopback().mtu)]
    pub mtu: u16,
    /// Page streams in flight per QUIC connection.
    #[arg(long, default_value_t = QuicConfig::loopback().data_streams)]
    pub streams: usize,
    /// Pages per QUIC stream.
    #[arg(long, default_value_t = QuicConfig::loopback().proto.batch_pages)]
    pub batch: usize,
    /// tokio worker threads (per side with `--split`).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Run the QUIC sender on its own runtime (its own threads), as on a separate host.
    #[arg(long, default_value_t = false)]
    pub split: bool,
    /// UDP GSO on (`true`) or off.
    #[arg(long, default_value_t = QuicConfig::loopback().gso, action = clap::ArgAction::Set)]
    pub gso: bool,
    /// Congestion controller: `cubic` or `bbr`.
    #[arg(long, default_value = "cubic")]
    pub cc: String,
    /// Initial congestion window in bytes (0: ten datagrams).
    #[arg(long, default_value_t = QuicConfig::loopback().congestion.initial_window())]
    pub init_window: u64,
    /// Connection flow-control window in bytes (0: the loopback default).
    #[arg(long, default_value_t = 0)]
    pub conn_window: u64,
    /// Send window in bytes (0: the loopback default).
    #[arg(long, default_value_t = 0)]
    pub send_window: u64,
    /// Stream flow-control window in bytes (0: the loopback default).
    #[arg(long, default_value_t = 0)]
    pub stream_window: u64,
    /// UDP socket buffer request in bytes (0: the loopback default).
    #[arg(long, default_value_t = 0)]
    pub socket_buffer: usize,
    /// Run only the QUIC way (for profiling); the other figures are then 0.
    #[arg(long, default_value_t = false)]
    pub quic_only: bool,
}

impl TransferArgs {
    /// The QUIC configuration these arguments ask for.
    pub fn quic_config(&self) -> anyhow::Result<QuicConfig> {
        let mut cfg = QuicConfig::loopback();
        cfg.mtu = self.mtu;
        cfg.data_streams = self.streams;
        cfg.proto.batch_pages = self.batch;
        cfg.gso = self.gso;
        cfg.congestion = match self.cc.as_str() {
            "cubic" => Congestion::Cubic {
                initial_window: self.init_window,
            },
            "bbr" => Congestion::Bbr {
                initial_window: self.init_window,
            },
            other => anyhow::bail!("--cc {other}: expected cubic or bbr"),
        };
        if self.conn_window > 0 {
            cfg.connection_window = self.conn_window;
        }
        if self.send_window > 0 {
            cfg.send_window = self.send_window;
        }
        if self.stream_window > 0 {
            cfg.stream_window = self.stream_window;
        }
        if self.socket_buffer > 0 {
            cfg.socket_buffer = self.socket_buffer;
        }
        Ok(cfg)
    }
}

impl Default for TransferArgs {
    fn default() -> Self {
        let q = QuicConfig::loopback();
        Self {
            pages: 2000,
            rounds: 3,
            mtu: q.mtu,
            streams: q.data_streams,
            batch: q.proto.batch_pages,
            threads: 2,
            split: false,
            gso: q.gso,
            cc: "cubic".into(),
            init_window: q.congestion.initial_window(),
            conn_window: 0,
            send_window: 0,
            stream_window: 0,
            socket_buffer: 0,
            quic_only: false,
        }
    }
}

const SLOTS: usize = 256;

/// Process CPU time (user + system) in seconds, `None` off Linux.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Wall and CPU seconds of one round.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    /// Wall-clock seconds.
    pub wall: f64,
    /// Process CPU seconds (0 when unknown).
    pub cpu: f64,
}

fn timed<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, Round)> {
    let (c0, t0) = (cpu_seconds(), Instant::now());
    let r = f()?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = match (c0, cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => 0.0,
    };
    Ok((r, Round { wall, cpu }))
}

/// The distinct source pages: a byte pattern per page.
pub fn source_pages(layout: &KvLayout, n: usize) -> Vec<Bytes> {
    (0..n.min(SLOTS))
        .map(|i| {
            let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (0..layout.page_bytes())
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect::<Vec<u8>>()
                .into()
        })
        .collect()
}

/// A prefill and a decode endpoint connected over loopback QUIC.
pub struct QuicPair {
    sender: Arc<KvSender>,
    receiver: KvReceiver,
    addr: SocketAddr,
    layout: KvLayout,
    next_room: u64,
    /// The sender's own runtime when it runs apart from the receiver.
    sender_rt: Option<tokio::runtime::Runtime>,
}

impl QuicPair {
    /// Binds both endpoints (inside a tokio runtime), both on the current runtime.
    pub fn new(layout: KvLayout, cfg: QuicConfig) -> anyhow::Result<Self> {
        Self::build(layout, cfg, None)
    }

    /// Binds the receiver on the current runtime and the sender on a runtime of its own
    /// with `threads` worker threads, as if prefill and decode ran on different hosts.
    pub fn split(layout: KvLayout, cfg: QuicConfig, threads: usize) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("bench-sender")
            .enable_all()
            .build()?;
        Self::build(layout, cfg, Some(rt))
    }

    fn build(
        layout: KvLayout,
        cfg: QuicConfig,
        sender_rt: Option<tokio::runtime::Runtime>,
    ) -> anyhow::Result<Self> {
        let security = Security {
            identity: ClusterIdentity::generate()?,
            secret: b"bench secret".to_vec(),
        };
        let lo: SocketAddr = ([127, 0, 0, 1], 0).into();
        let sender = {
            let _in_sender_rt = sender_rt.as_ref().map(|rt| rt.enter());
            Arc::new(KvSender::bind(lo, layout, &security, cfg.clone())?)
        };
        let receiver = KvReceiver::bind(lo, layout, &security, cfg)?;
        let addr = sender.local_addr()?;
        Ok(Self {
            sender,
            receiver,
            addr,
            layout,
            next_room: 1,
            sender_rt,
        })
    }

    /// Moves `n` pages (cycling through `src`) as one room, copying each into `pool`.
    pub async fn transfer(
        &mut self,
        src: &[Bytes],
        n: usize,
        pool: &mut [u8],
    ) -> anyhow::Result<()> {
        let room = RoomId(self.next_room);
        self.next_room += 1;
        let pb = self.layout.page_bytes();
        let dst: Vec<u32> = (0..n as u32).collect();
        let mut stream = self.receiver.register(self.addr, room, dst).await?;
        let pages: Vec<Bytes> = (0..n).map(|i| src[i % src.len()].clone()).collect();
        let sender = self.sender.clone();
        let send = async move { sender.send(room, pages, AuxData::default()).await };
        let sender_rt = self.sender_rt.as_ref();
        let send = async move {
            match sender_rt {
                Some(rt) => Ok(rt.spawn(send).await??),
                None => Ok(send.await?),
            }
        };
        let recv = async {
            loop {
                match stream.next().await {
                    Some(RoomEvent::Pages { dst_pages, pages }) => {
                        for (d, p) in dst_pages.iter().zip(&pages) {
                            let slot = *d as usize % SLOTS;
                            p.copy_to(&mut pool[slot * pb..(slot + 1) * pb]);
                        }
                    }
                    Some(RoomEvent::Aux(_)) => {}
                    Some(RoomEvent::Done) => return Ok(()),
                    Some(RoomEvent::Failed(e)) => {
                        return Err(anyhow::anyhow!("transfer failed: {e}"));
                    }
                    None => return Err(anyhow::anyhow!("room stream ended")),
                }
            }
        };
        let (s, r): (
            anyhow::Result<sglrs_transfer::quic::SendReport>,
            anyhow::Result<()>,
        ) = tokio::join!(send, recv);
        s?;
        r
    }
}

impl Drop for QuicPair {
    fn drop(&mut self) {
        self.sender.close();
        self.receiver.close();
        if let Some(rt) = self.sender_rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A plain TCP connection over loopback.
pub struct TcpPair {
    tx: tokio::net::TcpStream,
    rx: tokio::net::TcpStream,
}

impl TcpPair {
    /// Connects a pair (inside a tokio runtime).
    pub async fn new() -> anyhow::Result<Self> {
        let l = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let tx = tokio::net::TcpStream::connect(l.local_addr()?).await?;
        let (rx, _) = l.accept().await?;
        Ok(Self { tx, rx })
    }

    /// Writes `n` pages (cycling through `src`) and reads them straight into `pool`.
    pub async fn transfer(
        &mut self,
        src: &[Bytes],
        n: usize,
        pool: &mut [u8],
    ) -> anyhow::Result<()> {
        let pb = src.first().map_or(0, Bytes::len);
        let (tx, rx) = (&mut self.tx, &mut self.rx);
        let write = async {
            for i in 0..n {
                tx.write_all(&src[i % src.len()]).await?;
            }
            tx.flush().await?;
            anyhow::Ok(())
        };
        let read = async {
            for i in 0..n {
                let slot = i % SLOTS;
                rx.read_exact(&mut pool[slot * pb..(slot + 1) * pb]).await?;
            }
            anyhow::Ok(())
        };
        let (w, r) = tokio::join!(write, read);
        w?;
        r
    }
}

/// Copies `n` pages (cycling through `src`) into `pool`.
pub fn memcpy(src: &[Bytes], n: usize, pool: &mut [u8]) {
    let pb = src.first().map_or(0, Bytes::len);
    for i in 0..n {
        let slot = i % SLOTS;
        pool[slot * pb..(slot + 1) * pb].copy_from_slice(&src[i % src.len()]);
    }
}

fn best(rounds: &[Round], bytes: f64) -> (f64, f64) {
    let gb_s = rounds
        .iter()
        .map(|r| bytes / 1e9 / r.wall)
        .fold(0.0, f64::max);
    let gb_cpu = rounds
        .iter()
        .filter(|r| r.cpu > 0.0)
        .map(|r| bytes / 1e9 / r.cpu)
        .fold(0.0, f64::max);
    (gb_s, gb_cpu)
}

/// Runs the benchmark, printing a report; returns `{"quic_gb_s", "tcp_gb_s", "memcpy_gb_s", …}`.
pub fn run(args: &TransferArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.pages > 0 && args.rounds > 0,
        "--pages and --rounds must be positive"
    );
    let layout = KvLayout::smollm2_135m();
    let pb = layout.page_bytes();
    let bytes = (args.pages * pb) as f64;
    let cfg = args.quic_config()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    let src = source_pages(&layout, args.pages);
    let mut pool = vec![0u8; SLOTS.min(args.pages) * pb];
    println!(
        "transfer: {} pages x {} bytes = {:.2} GB per round, {} rounds, loopback (mtu {}, {} streams, {} pages/stream, gso {}, {:?}, {} threads{})",
        args.pages,
        pb,
        bytes / 1e9,
        args.rounds,
        args.mtu,
        args.streams,
        args.batch,
        cfg.gso,
        cfg.congestion,
        args.threads,
        if args.split { " per side" } else { "" },
    );

    let mut tcp_pair = rt.block_on(TcpPair::new()).context("tcp loopback")?;
    let mut quic_pair = rt
        .block_on(async {
            if args.split {
                QuicPair::split(layout, cfg.clone(), args.threads)
            } else {
                QuicPair::new(layout, cfg.clone())
            }
        })
        .context("quic endpoints")?;
    // The ways take turns round by round, so that a busy moment on a shared machine hits
    // all of them alike.
    let (mut mem, mut tcp, mut quic) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        if !args.quic_only {
            mem.push(
                timed(|| {
                    memcpy(&src, args.pages, &mut pool);
                    Ok(())
                })?
                .1,
            );
            tcp.push(timed(|| rt.block_on(tcp_pair.transfer(&src, args.pages, &mut pool)))?.1);
        }
        quic.push(timed(|| rt.block_on(quic_pair.transfer(&src, args.pages, &mut pool)))?.1);
    }
    drop(tcp_pair);
    drop(quic_pair);

    let (mem_gb_s, mem_cpu) = best(&mem, bytes);
    let (tcp_gb_s, tcp_cpu) = best(&tcp, bytes);
    let (quic_gb_s, quic_cpu) = best(&quic, bytes);
    println!("  memcpy  {mem_gb_s:7.2} GB/s   {mem_cpu:7.2} GB per CPU-second");
    println!(
        "  tcp     {tcp_gb_s:7.2} GB/s   {tcp_cpu:7.2} GB per CPU-second  (plain, unencrypted)"
    );
    println!(
        "  quic    {quic_gb_s:7.2} GB/s   {quic_cpu:7.2} GB per CPU-second  (TLS 1.3, checksummed)"
    );
    if !args.quic_only {
        println!(
            "  quic / tcp = {:.2} (wall), {:.2} (CPU)",
            quic_gb_s / tcp_gb_s,
            quic_cpu / tcp_cpu.max(f64::MIN_POSITIVE)
        );
    }
    Ok(json!({
        "quic_gb_s": quic_gb_s,
        "tcp_gb_s": tcp_gb_s,
        "memcpy_gb_s": mem_gb_s,
        "quic_vs_tcp": quic_gb_s / tcp_gb_s,
        "quic_gb_per_cpu_s": quic_cpu,
        "tcp_gb_per_cpu_s": tcp_cpu,
        "memcpy_gb_per_cpu_s": mem_cpu,
        "pages": args.pages,
        "page_bytes": pb,
        "rounds": args.rounds,
        "mtu": args.mtu,
        "streams": args.streams,
        "batch_pages": args.batch,
        "gso": cfg.gso,
        "congestion": format!("{:?}", cfg.congestion),
        "split": args.split,
        "threads": args.threads,
    }))
}
