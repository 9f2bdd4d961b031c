//! Connections: a cap on open ones (answered 503 beyond it without reading the request, so that idle or slow
//! clients cannot take every socket and task), hyper's HTTP/1.1 with a deadline on request heads, a stall
//! deadline on writes, and a graceful stop.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

const BUSY: &str = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 135\r\n\
                    Connection: close\r\nRetry-After: 1\r\n\r\n{\"error\": {\"message\": \"too many open connections; \
                    retry later\", \"type\": \"server_error\", \"param\": null, \"code\": \"too_many_connections\"}}";

/// How long a connection may take over each thing it must do.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// To send a whole request head, from connecting or from the end of its previous answer (hyper's header
    /// read timeout, whose clock runs from the moment the connection waits for a head: it is also how long an
    /// idle keep-alive connection stays open).
    pub header: Duration,
    /// Any one write may wait this long for the client to read (a stalled reader is cut).
    pub write: Duration,
}

pub struct Capped {
    inner: TcpListener,
    open: Arc<AtomicUsize>,
    max: usize,
}

impl Capped {
    pub fn new(inner: TcpListener, max: usize) -> Self {
        Self { inner, open: Arc::new(AtomicUsize::new(0)), max }
    }

    async fn accept(&self, write_timeout: Duration) -> Conn {
        loop {
            let stream = match self.inner.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors and the like: wait instead of spinning on the error.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if self.open.load(Ordering::Acquire) >= self.max {
                // A fresh socket's send buffer is empty, so this small write does not block.
                let _ = stream.try_write(BUSY.as_bytes());
                continue;
            }
            let _ = stream.set_nodelay(true);
            self.open.fetch_add(1, Ordering::AcqRel);
            return Conn { stream, open: Arc::clone(&self.open), write_timeout, stalled: None };
        }
    }
}

/// Serves `router` on `listener` until `stop` resolves, then stops accepting and waits for the open connections
/// to finish their answers (idle ones close at once).
pub async fn serve(listener: Capped, router: Router, timeouts: Timeouts, stop: impl Future<Output = ()>) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(timeouts.header).keep_alive(true);
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            conn = listener.accept(timeouts.write) => {
                let service = TowerToHyperService::new(router.clone());
                let conn = http.serve_connection(TokioIo::new(conn), service);
                let watched = graceful.watch(conn);
                tokio::spawn(async move {
                    // A client's error (a reset, a bad head, a timeout) ends only its own connection.
                    let _ = watched.await;
                });
            }
            () = &mut stop => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

/// An accepted connection; it frees its place in the cap when hyper drops it.
pub struct Conn<S = TcpStream> {
    stream: S,
    open: Arc<AtomicUsize>,
    write_timeout: Duration,
    /// Armed while a write waits for the client to read.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> Drop for Conn<S> {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<S> Conn<S> {
    /// A write's outcome, with the stall clock: it starts when a write first waits and stops when one goes
    /// through; a write still waiting when it runs out fails with `TimedOut`, which ends the connection.
    fn stall<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let timeout = self.write_timeout;
        let deadline = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", timeout.as_secs_f64()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Conn<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Conn<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.stall(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.stall(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.stall(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A client that stops reading: once the pipe is full, the write that waits longer than the stall deadline
    /// fails with `TimedOut`, and a write that goes through resets the clock.
    #[tokio::test]
    async fn a_stalled_write_times_out() {
        let (server_end, mut client_end) = tokio::io::duplex(64);
        let open = Arc::new(AtomicUsize::new(1));
        let timeout = Duration::from_millis(200);
        let mut conn = Conn { stream: server_end, open: Arc::clone(&open), write_timeout: timeout, stalled: None };
        conn.write_all(&[0; 64]).await.unwrap();
        let mut drained = [0u8; 64];
        tokio::io::AsyncReadExt::read_exact(&mut client_end, &mut drained).await.unwrap();
        conn.write_all(&[1; 64]).await.unwrap();
        let t0 = std::time::Instant::now();
        let e = conn.write_all(&[2; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() >= timeout);
        drop(conn);
        assert_eq!(open.load(Ordering::Acquire), 0, "the connection gave its place back");
    }

    #[test]
    fn the_busy_answer_is_well_formed() {
        let (head, body) = super::BUSY.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
