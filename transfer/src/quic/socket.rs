//! A UDP socket wrapper that keeps quinn's GSO batches under the kernel's 64 KiB limit.
//!
//! quinn batches up to 10 datagrams of one MTU into a single `sendmsg` with UDP GSO. The whole
//! batch is one UDP payload to the kernel, so it must fit in 65,507 bytes (IPv4: 65,535 less
//! the IP and UDP headers). With datagrams of 8 KiB and more a batch can pass that size; the
//! kernel refuses it with `EMSGSIZE`, and quinn-udp drops that error silently (it expects it
//! from MTU probes, see quinn-rs/quinn#2199 and #2653), so every large batch is lost and the
//! connection crawls along on loss timers. Advertising at most `65,507 / mtu` segments keeps
//! every batch sendable.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// The largest UDP payload one `sendmsg` may carry over IPv4 (65,535 − 20 − 8).
pub(crate) const MAX_SEND_BYTES: usize = 65_507;

/// GSO segments of `mtu` bytes that fit in one send.
pub(crate) fn segments_for(mtu: u16) -> usize {
    (MAX_SEND_BYTES / usize::from(mtu.max(1))).max(1)
}

/// An [`AsyncUdpSocket`] that advertises no more GSO segments than fit in one send.
pub(crate) struct CappedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    max_segments: usize,
}

impl CappedSocket {
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>, mtu: u16) -> Arc<Self> {
        Arc::new(Self {
            inner,
            max_segments: segments_for(mtu),
        })
    }
}

impl fmt::Debug for CappedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CappedSocket")
            .field("inner", &self.inner)
            .field("max_segments", &self.max_segments)
            .finish()
    }
}

impl AsyncUdpSocket for CappedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments().min(self.max_segments)
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_fit_one_send() {
        for mtu in [1200u16, 1452, 4096, 8192, 16384, 32000, 32768, 60000, 65000] {
            let n = segments_for(mtu);
            assert!(n >= 1);
            assert!(
                n == 1 || n * usize::from(mtu) <= MAX_SEND_BYTES,
                "{mtu}: {n}"
            );
        }
        assert_eq!(segments_for(8192), 7);
        assert_eq!(segments_for(1452), 45);
    }
}
