//! The transfer endpoints of both roles (QUIC, `sglrs-transfer`).

use super::{Bootstrap, DisaggArgs, DisaggMode, PdStats};
use sglrs_executor::kv::PageIo;
use sglrs_scheduler::{
    AbortReason, FinishReason, ImportJob, KvImport, KvImporter, RequestId, SchedEvent,
    SchedulerHandle,
};
use sglrs_transfer::bootstrap::BootstrapInfo;
use sglrs_transfer::proto::{AuxData, RoomId};
use sglrs_transfer::quic::{read_identity, KvReceiver, KvSender, QuicConfig};
use sglrs_transfer::KvLayout;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most transfer reports kept for answers that have not taken theirs (a client gone
/// before its answer leaves its report behind; the oldest are dropped past this).
const REPORTS: usize = 4096;

/// The server's disaggregation state (absent in unified mode).
pub struct Pd {
    mode: DisaggMode,
    bootstrap_port: u16,
    /// Prefill: the transfer endpoint decode hosts dial.
    sender: Option<Arc<KvSender>>,
    /// Decode: the dialing endpoint.
    receiver: Option<Arc<KvReceiver>>,
    /// Decode: where each submitted request's KV comes from, until its import starts.
    pending: Mutex<HashMap<RequestId, BootstrapInfo>>,
    /// Decode: the pool's page copier.
    page_io: Option<PageIo>,
    /// Decode: the scheduler, set once it runs.
    sched: OnceLock<SchedulerHandle>,
    timeout: Duration,
    runtime: tokio::runtime::Handle,
    /// Each recent request's transfer, until its answer takes it
    /// (`meta_info.disaggregation`); bounded by [`REPORTS`].
    reports: Mutex<HashMap<RequestId, serde_json::Value>>,
    stats: PdStats,
}

impl Pd {
    /// Binds the role's transfer endpoint (inside a tokio runtime). `host` is the address
    /// the server listens on: loopback gets the loopback transport settings.
    pub fn start(
        args: &DisaggArgs,
        host: Option<&str>,
        layout: KvLayout,
        page_io: Option<PageIo>,
    ) -> Result<Option<Arc<Pd>>, String> {
        if args.disaggregation_mode == DisaggMode::Null {
            return Ok(None);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            "--disaggregation-mode needs the server's runtime (it is not available in process)"
                .to_string()
        })?;
        let dir = args
            .cluster_identity
            .clone()
            .or_else(|| std::env::var_os("SGLRS_CLUSTER_IDENTITY").map(PathBuf::from))
            .ok_or_else(|| {
                "--disaggregation-mode needs --cluster-identity DIR (or SGLRS_CLUSTER_IDENTITY); \
                 make one with `sglrs cluster-identity --out DIR` and give every host the same"
                    .to_string()
            })?;
        let security = read_identity(&dir)?;
        let host = host.unwrap_or("0.0.0.0");
        let ip: std::net::IpAddr = host.parse().map_err(|_| {
            format!("--host {host:?} is not an IP address (the KV endpoint binds it)")
        })?;
        let mut quic = if ip.is_loopback() {
            QuicConfig::loopback()
        } else {
            QuicConfig::default()
        };
        let timeout = Duration::from_secs(args.disaggregation_timeout.max(1));
        quic.proto.room_timeout = timeout;
        let _guard = runtime.enter();
        let (sender, receiver) = match args.disaggregation_mode {
            DisaggMode::Prefill => {
                let addr = SocketAddr::new(ip, args.disaggregation_bootstrap_port);
                let s = KvSender::bind(addr, layout, &security, quic)
                    .map_err(|e| format!("binding the KV transfer endpoint on UDP {addr}: {e}"))?;
                (Some(Arc::new(s)), None)
            }
            DisaggMode::Decode => {
                let any = SocketAddr::new(
                    if ip.is_ipv6() {
                        std::net::Ipv6Addr::UNSPECIFIED.into()
                    } else {
                        std::net::Ipv4Addr::UNSPECIFIED.into()
                    },
                    0,
                );
                let r = KvReceiver::bind(any, layout, &security, quic)
                    .map_err(|e| format!("binding the KV transfer endpoint: {e}"))?;
                if page_io.is_none() {
                    return Err("this executor cannot write pages from another thread".into());
                }
                (None, Some(Arc::new(r)))
            }
            DisaggMode::Null => unreachable!("returned above"),
        };
        Ok(Some(Arc::new(Pd {
            mode: args.disaggregation_mode,
            bootstrap_port: args.disaggregation_bootstrap_port,
            sender,
            receiver,
            pending: Mutex::new(HashMap::new()),
            page_io,
            sched: OnceLock::new(),
            timeout,
            runtime,
            reports: Mutex::new(HashMap::new()),
            stats: PdStats::default(),
        })))
    }

    /// The role.
    pub fn mode(&self) -> DisaggMode {
        self.mode
    }

    /// The prefill role's transfer port.
    pub fn bootstrap_port(&self) -> u16 {
        self.bootstrap_port
    }

    /// Counters.
    pub fn stats(&self) -> &PdStats {
        &self.stats
    }

    /// Decode: the scheduler the importer reports to.
    pub fn set_scheduler(&self, sched: SchedulerHandle) {
        let _ = self.sched.set(sched);
    }

    /// The KV transfer endpoint's address (prefill).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.sender.as_ref().and_then(|s| s.local_addr().ok())
    }

    /// Pages held for rooms not yet acknowledged (prefill).
    pub fn held_pages(&self) -> usize {
        self.sender.as_ref().map_or(0, |s| s.held_pages())
    }

    /// Decode: remembers where request `id`'s KV comes from (before it is submitted).
    pub fn expect(&self, id: RequestId, from: &Bootstrap) {
        let info = BootstrapInfo {
            host: from.host.clone(),
            port: from.port,
            room: RoomId(from.room),
        };
        if let Ok(mut p) = self.pending.lock() {
            p.insert(id, info);
        }
    }

    /// Decode: forgets a request that was not submitted after all.
    pub fn forget(&self, id: RequestId) {
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&id);
        }
    }

    /// Request `id`'s transfer (`meta_info.disaggregation`): role, room, pages moved and
    /// skipped, seconds; `None` when it had none here.
    pub fn take_report(&self, id: RequestId) -> Option<serde_json::Value> {
        self.reports.lock().ok()?.remove(&id)
    }

    fn report(&self, id: RequestId, v: serde_json::Value) {
        if let Ok(mut r) = self.reports.lock() {
            if r.len() >= REPORTS {
                let oldest = *r.keys().min().expect("not empty");
                r.remove(&oldest);
            }
            r.insert(id, v);
        }
    }

    /// The state as `/get_server_info` shows it.
    pub fn info_json(&self) -> serde_json::Value {
        let mut v = self.stats.json();
        v["mode"] = self.mode.as_str().into();
        v["bootstrap_port"] = self.bootstrap_port.into();
        v["held_pages"] = self.held_pages().into();
        v["awaiting_import"] = self.pending.lock().map_or(0, |p| p.len()).into();
        v
    }

    /// Decode: wraps a request's event stream so that its bootstrap entry goes when the
    /// request ends, also when it ends before its import started (aborted while queued).
    pub fn track_import(
        self: &Arc<Self>,
        id: RequestId,
        mut rx: mpsc::UnboundedReceiver<SchedEvent>,
    ) -> mpsc::UnboundedReceiver<SchedEvent> {
        let (tx, out) = mpsc::unbounded_channel();
        let pd = self.clone();
        self.runtime.spawn(async move {
            loop {
                let ev = tokio::select! {
                    ev = rx.recv() => ev,
                    // The client is gone (also while the request is queued): dropping `rx`
                    // aborts the request at the scheduler's next step.
                    () = tx.closed() => None,
                };
                let Some(ev) = ev else { break };
                let last = matches!(ev, SchedEvent::Finished { .. });
                if tx.send(ev).is_err() || last {
                    break;
                }
            }
            pd.forget(id);
        });
        out
    }

    /// Prefill: wraps a request's event stream. The prompt's pages (`KvExport`) are sent to
    /// the room's decode host once the request ends; its `Finished` is held back until the
    /// transfer did (or failed: then it becomes an abort naming the cause). The transfer
    /// goes on when the client is gone.
    pub fn export(
        self: &Arc<Self>,
        room: u64,
        mut rx: mpsc::UnboundedReceiver<SchedEvent>,
    ) -> mpsc::UnboundedReceiver<SchedEvent> {
        let room = RoomId(room);
        let (tx, out) = mpsc::unbounded_channel();
        let pd = self.clone();
        self.runtime.spawn(async move {
            let mut pages = None;
            let mut imp = KvImport::default();
            let mut first = None;
            while let Some(mut ev) = rx.recv().await {
                if let SchedEvent::Finished { id, reason, .. } = &mut ev {
                    let id = *id;
                    let t = Instant::now();
                    let ended = std::mem::replace(reason, FinishReason::Length(0));
                    let sent = pd
                        .send(room, pages.take(), first, std::mem::take(&mut imp), &ended)
                        .await;
                    *reason = match (sent, ended) {
                        (Ok(rep), r) => {
                            pd.report(
                                id,
                                serde_json::json!({
                                    "role": "prefill",
                                    "bootstrap_room": room.0,
                                    "pages_sent": rep.sent,
                                    "pages_skipped": rep.skipped,
                                    "transfer_ms": t.elapsed().as_secs_f64() * 1e3,
                                }),
                            );
                            r
                        }
                        (Err(_), r @ FinishReason::Abort(_)) => r,
                        (Err(e), _) => FinishReason::Abort(AbortReason::Transfer(e)),
                    };
                    let _ = tx.send(ev);
                    return;
                }
                match ev {
                    SchedEvent::KvExport {
                        pages: p,
                        rng_position,
                        ..
                    } => {
                        pages = Some(p);
                        imp.rng_position = rng_position;
                        continue;
                    }
                    SchedEvent::Delta {
                        ref tokens,
                        ref logprobs,
                        ..
                    } => {
                        if first.is_none() && !tokens.is_empty() {
                            first = Some(tokens[0]);
                            imp.first_logprob = logprobs.first().cloned();
                        }
                    }
                    SchedEvent::InputLogprobs { ref logprobs, .. } => {
                        imp.input_logprobs = logprobs.clone();
                    }
                    // Ended above.
                    SchedEvent::Finished { .. } => {}
                }
                let _ = tx.send(ev);
            }
            // The scheduler stopped without ending the request.
            if let Some(s) = &pd.sender {
                s.fail(
                    room,
                    "prefill failed: the prefill server's scheduler stopped",
                );
            }
        });
        out
    }

    /// Prefill: sends one room's pages, or tells the decode host why there are none.
    async fn send(
        &self,
        room: RoomId,
        pages: Option<Result<Vec<bytes::Bytes>, String>>,
        first: Option<u32>,
        mut imp: KvImport,
        ended: &FinishReason,
    ) -> Result<sglrs_transfer::quic::SendReport, String> {
        let Some(sender) = &self.sender else {
            return Err("not a prefill server".into());
        };
        let (pages, first) = match (pages, first) {
            (Some(Ok(p)), Some(f)) => (p, f),
            (Some(Err(e)), _) => {
                let msg = format!("prefill failed: {e}");
                sender.fail(room, &msg);
                self.stats.fail(&msg);
                return Err(msg);
            }
            _ => {
                // The decode host hears why (a grammar that rejected every token, a pool too
                // small for the prompt, …).
                let why = match ended {
                    FinishReason::Abort(a) => a.to_string(),
                    other => format!("it ended ({other:?}) before its first token"),
                };
                let msg = format!("prefill failed: {why}");
                sender.fail(room, &msg);
                self.stats.fail(&msg);
                return Err(msg);
            }
        };
        imp.first_token = first;
        imp.page_format = sglrs_executor::kv::POOL_PAGE_FORMAT;
        let aux = AuxData {
            first_token: first,
            first_logprob: imp
                .first_logprob
                .as_ref()
                .and_then(|l| l.logprob)
                .unwrap_or(0.0),
            top_logprobs: imp
                .first_logprob
                .as_ref()
                .map(|l| l.top.clone())
                .unwrap_or_default(),
            extra: serde_json::to_vec(&imp).unwrap_or_default().into(),
        };
        let t = Instant::now();
        self.stats.rooms_open.fetch_add(1, Ordering::Relaxed);
        let r = sender.send(room, pages, aux).await;
        self.stats.rooms_open.fetch_sub(1, Ordering::Relaxed);
        match r {
            Ok(rep) => {
                self.stats.latency.observe(t.elapsed().as_secs_f64());
                self.stats.transfers.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .pages_sent
                    .fetch_add(rep.sent as u64, Ordering::Relaxed);
                self.stats
                    .pages_skipped
                    .fetch_add(rep.skipped as u64, Ordering::Relaxed);
                Ok(rep)
            }
            Err(e) => {
                let msg = format!("sending the KV of {room}: {e}");
                self.stats.fail(&msg);
                Err(msg)
            }
        }
    }

    /// Decode: receives one import's pages into the pool.
    async fn import(&self, job: &ImportJob, from: BootstrapInfo) -> Result<KvImport, String> {
        let receiver = self.receiver.as_ref().ok_or("not a decode server")?;
        let io = self.page_io.as_ref().ok_or("no page writer")?;
        let addr = from
            .resolve()
            .await
            .map_err(|e| format!("prefill host {from}: {e}"))?;
        let t = Instant::now();
        let mut stream = receiver
            .register(addr, RoomId(from.room.0), job.dst_pages.clone())
            .await
            .map_err(|e| format!("prefill host {addr}: {e}"))?;
        let mut aux = None;
        let mut written = 0u64;
        let mut first_byte = None;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let ev = stream.next().await;
            first_byte.get_or_insert_with(Instant::now);
            match ev {
                Some(sglrs_transfer::quic::RoomEvent::Pages { dst_pages, pages }) => {
                    for (dst, page) in dst_pages.iter().zip(&pages) {
                        if !job.dst_pages.contains(dst) {
                            return Err(format!("prefill host {addr} sent page {dst} unasked"));
                        }
                        let pb = io.layout().page_bytes();
                        if page.len() != pb {
                            return Err(format!(
                                "prefill host {addr} sent a page of {} bytes, not {pb}",
                                page.len(),
                            ));
                        }
                        // From the transport's buffers into one page, then its per-head
                        // shares into the pool (the pages travel in the raw order).
                        buf.resize(pb, 0);
                        page.copy_to(&mut buf);
                        // SAFETY: the destination pages belong to this import's sequence,
                        // which is in no forward pass and keeps them until this task
                        // reports back (`Phase::Receiving`, the scheduler's invariant).
                        unsafe { io.write_pages_raw(&[*dst], &buf) }
                            .map_err(|e| format!("writing page {dst}: {e}"))?;
                        written += 1;
                    }
                }
                Some(sglrs_transfer::quic::RoomEvent::Aux(a)) => aux = Some(a),
                Some(sglrs_transfer::quic::RoomEvent::Done) => break,
                Some(sglrs_transfer::quic::RoomEvent::Failed(e)) => {
                    return Err(format!("from prefill host {addr}: {e}"))
                }
                None => return Err(format!("prefill host {addr}: the transfer endpoint closed")),
            }
        }
        // Transfer time: from the first message of the room to the last page written (the
        // wait before it is the prefill computing the prompt).
        let first_byte = first_byte.unwrap_or(t);
        let secs = first_byte.elapsed().as_secs_f64();
        let wait = first_byte.duration_since(t).as_secs_f64();
        self.stats.latency.observe(secs);
        self.stats.transfers.fetch_add(1, Ordering::Relaxed);
        self.stats
            .pages_received
            .fetch_add(written, Ordering::Relaxed);
        self.report(
            job.id,
            serde_json::json!({
                "role": "decode",
                "bootstrap_room": from.room.0,
                "pages_received": written,
                "pages_skipped": job.skip_pages,
                "transfer_ms": secs * 1e3,
                "wait_ms": wait * 1e3,
            }),
        );
        self.stats
            .pages_skipped
            .fetch_add(job.skip_pages as u64, Ordering::Relaxed);
        let aux = aux.ok_or_else(|| format!("prefill host {addr} sent no first token"))?;
        let mut imp: KvImport = serde_json::from_slice(&aux.extra)
            .map_err(|e| format!("prefill host {addr}: bad aux data: {e}"))?;
        if imp.page_format != sglrs_executor::kv::POOL_PAGE_FORMAT {
            return Err(format!(
                "prefill host {addr} sends KV pages in format {}, this host keeps format {}: \
                 run the same sglrs version on both",
                imp.page_format,
                sglrs_executor::kv::POOL_PAGE_FORMAT
            ));
        }
        imp.first_token = aux.first_token;
        Ok(imp)
    }
}

/// The decode host's [`KvImporter`]: one task per import, bounded by the timeout, always
/// reporting back once.
pub struct Importer(pub Arc<Pd>);

impl KvImporter for Importer {
    fn start(&self, job: ImportJob) {
        let pd = self.0.clone();
        let from = pd.pending.lock().ok().and_then(|mut p| p.remove(&job.id));
        self.0.runtime.spawn(async move {
            pd.stats.rooms_open.fetch_add(1, Ordering::Relaxed);
            let result = match from {
                None => Err("no bootstrap_host/bootstrap_room known for this request".into()),
                Some(from) => {
                    let shown = from.to_string();
                    // Dropping the import on time-out stops its writes (they happen inside
                    // it) and cancels the room.
                    match tokio::time::timeout(pd.timeout, pd.import(&job, from)).await {
                        Ok(r) => r,
                        Err(_) => Err(format!(
                            "the KV from {shown} did not arrive within {:?} \
                             (--disaggregation-timeout)",
                            pd.timeout
                        )),
                    }
                }
            };
            pd.stats.rooms_open.fetch_sub(1, Ordering::Relaxed);
            if let Err(e) = &result {
                pd.stats.fail(e);
            }
            if let Some(s) = pd.sched.get() {
                s.kv_imported(job.id, result);
            }
        });
    }
}
