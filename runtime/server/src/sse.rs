//! Server-sent events: a task fills a channel with `data:` payloads; the response streams
//! them. When the client goes away the channel closes; the task, waiting on its scheduler
//! events and on that close at once ([`recv`]), stops at once and drops its event receiver,
//! and the scheduler aborts the request — before its prefill when it is still queued.

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sglrs_scheduler::SchedEvent;
use std::convert::Infallible;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// A sender of SSE payloads (each one `data: <payload>`).
pub type SseTx = mpsc::Sender<String>;

/// A channel whose receiving end is the SSE response.
pub fn channel() -> (SseTx, Response) {
    let (tx, rx) = mpsc::channel::<String>(64);
    let stream =
        ReceiverStream::new(rx).map(|data| Ok::<_, Infallible>(Event::default().data(data)));
    (tx, Sse::new(stream).into_response())
}

/// The client of an SSE response went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;

/// The next scheduler event of a streamed request (`None` once the scheduler closed its
/// channel), or [`ClientGone`] as soon as the response's receiving end is dropped, even
/// while no event comes (a request still waiting in the queue). The caller then returns,
/// dropping `rx`, which aborts the request.
pub async fn recv(
    rx: &mut mpsc::UnboundedReceiver<SchedEvent>,
    tx: &SseTx,
) -> Result<Option<SchedEvent>, ClientGone> {
    tokio::select! {
        ev = rx.recv() => Ok(ev),
        () = tx.closed() => Err(ClientGone),
    }
}
