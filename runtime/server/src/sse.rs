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

/// The last event of a stream whose task panicked: OpenAI's error shape, naming the panic.
fn panic_event(payload: &(dyn std::any::Any + Send)) -> String {
    serde_json::json!({"error": {
        "message": format!(
            "internal error while streaming this request: {}",
            sglrs_scheduler::panic_message(payload)
        ),
        "type": "internal_error",
        "code": 500,
    }})
    .to_string()
}

/// Spawns the task that fills a stream. A panic inside it ends the stream with an error
/// event and `[DONE]`, as the HTTP layer answers a panicking handler with a 500, instead of
/// cutting the stream short; the request's event receiver is dropped with the task, which
/// aborts the request.
pub fn spawn<F>(tx: SseTx, fut: F) -> tokio::task::JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    use futures_util::FutureExt;
    tokio::spawn(async move {
        if let Err(payload) = std::panic::AssertUnwindSafe(fut).catch_unwind().await {
            let _ = tx.send(panic_event(payload.as_ref())).await;
            let _ = tx.send("[DONE]".to_string()).await;
        }
    })
}

/// The error event for a stream's sub-task that panicked (`join`: its join result).
pub async fn report_panic(tx: &SseTx, join: Result<(), tokio::task::JoinError>) {
    if let Err(e) = join {
        if e.is_panic() {
            let payload = e.into_panic();
            let _ = tx.send(panic_event(payload.as_ref())).await;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_stream_task_ends_with_an_error_event_and_done() {
        let (tx, resp) = channel();
        let t = tx.clone();
        spawn(tx, async move {
            let _ = t.send("{\"text\": \"a\"}".to_string()).await;
            panic!("boom in a stream");
        });
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let events: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(events.len(), 3, "{text}");
        assert_eq!(events[0], "{\"text\": \"a\"}");
        let err: serde_json::Value = serde_json::from_str(events[1]).unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .contains("boom in a stream"),
            "{err}"
        );
        assert_eq!(err["error"]["code"], 500);
        assert_eq!(events[2], "[DONE]");
    }
}
