//! Server-sent events: a task fills a channel with `data:` payloads; the response streams
//! them. When the client goes away the channel closes, the task stops reading its
//! scheduler events and drops them, and the scheduler aborts the request.

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
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
