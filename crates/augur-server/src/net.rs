//! The listener under axum: a cap on open connections, answered 503 beyond it without reading the request, so
//! that idle or slow clients cannot take every socket and task.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

const BUSY: &str = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 135\r\n\
                    Connection: close\r\nRetry-After: 1\r\n\r\n{\"error\": {\"message\": \"too many open connections; \
                    retry later\", \"type\": \"server_error\", \"param\": null, \"code\": \"too_many_connections\"}}";

pub struct Capped {
    inner: TcpListener,
    open: Arc<AtomicUsize>,
    max: usize,
}

impl Capped {
    pub fn new(inner: TcpListener, max: usize) -> Self {
        Self { inner, open: Arc::new(AtomicUsize::new(0)), max }
    }
}

/// An accepted connection; it frees its place in the cap when hyper drops it.
pub struct Conn {
    stream: TcpStream,
    open: Arc<AtomicUsize>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl axum::serve::Listener for Capped {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: wait instead of spinning on the error.
                    eprintln!("augur serve: accept failed: {e}");
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
            return (Conn { stream, open: Arc::clone(&self.open) }, addr);
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_busy_answer_is_well_formed() {
        let (head, body) = super::BUSY.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
