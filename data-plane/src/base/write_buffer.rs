//! The bytes of a message being written to a connection, on both HTTP/1.1
//! legs, held in one buffer per proxy worker thread: lent to the connection
//! about to encode a message and given back once it is written out.
//!
//! Why: a buffer kept by every connection is written to once per message,
//! and under a few hundred connections those buffers outgrow the core's
//! cache, so each head and body copied into one met lines fetched from
//! memory. A message is nearly always written out in the poll that encodes
//! it, so one buffer per thread is hot in the cache for all of them; one
//! whose write has to wait keeps what it holds until it is out, and the next
//! writer meanwhile gets a new buffer. Idle connections then hold none.

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWrite;

/// A buffer grown past this by a large message is freed, not kept as the spare.
const KEEP: usize = 16 * 1024;

thread_local! {
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// A connection's message bytes gathered and not written yet.
#[derive(Debug, Default)]
pub struct WriteBuffer {
    bytes: Vec<u8>,
    /// How many of `bytes` are written already.
    written: usize,
}

impl WriteBuffer {
    /// Where to append a message's bytes: this thread's spare buffer, when
    /// the connection holds none of its own.
    pub fn fill(&mut self) -> &mut Vec<u8> {
        if self.bytes.capacity() == 0 {
            self.bytes = SPARE.take();
        }
        &mut self.bytes
    }

    /// The bytes gathered since the buffer was last written out, written or not.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether everything gathered has been written out.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Writes what is gathered to `io`; `Ready(Ok)` once all of it is out and
    /// flushed, when the buffer goes back to the thread (see [`give_back`]).
    pub fn poll_write_out<W: AsyncWrite + Unpin>(&mut self, io: &mut W, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.bytes.len() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.bytes[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.written = 0;
        give_back(std::mem::take(&mut self.bytes));
        Pin::new(io).poll_flush(cx)
    }
}

/// Keeps `buffer`, all written, as this thread's spare, unless the thread
/// has one already or it grew past [`KEEP`]: then it is freed.
fn give_back(mut buffer: Vec<u8>) {
    if buffer.capacity() == 0 || buffer.capacity() > KEEP {
        return;
    }
    buffer.clear();
    let spare = SPARE.take();
    SPARE.set(if spare.capacity() == 0 { buffer } else { spare });
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    /// A socket that takes what is written while `open`, and makes the writer wait otherwise.
    #[derive(Default)]
    struct Socket {
        open: bool,
        received: Vec<u8>,
    }

    impl AsyncWrite for Socket {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            if !self.open {
                return Poll::Pending;
            }
            self.received.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn write_out(buffer: &mut WriteBuffer, socket: &mut Socket) -> Poll<io::Result<()>> {
        buffer.poll_write_out(socket, &mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn one_buffer_goes_from_writer_to_writer_on_a_thread() {
        // A thread of its own: the spare is per thread, and other tests run on theirs.
        std::thread::spawn(|| {
            let mut socket = Socket { open: true, ..Socket::default() };
            let mut first = WriteBuffer::default();
            first.fill().extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
            let at = first.bytes.as_ptr();
            assert!(write_out(&mut first, &mut socket).is_ready());
            assert_eq!(socket.received, b"HTTP/1.1 200 OK\r\n\r\n");
            assert_eq!(first.bytes.capacity(), 0, "an idle writer holds no buffer");

            let request = b"GET / HTTP/1.1\r\n\r\n";
            let mut second = WriteBuffer::default();
            second.fill().extend_from_slice(request);
            assert_eq!(second.bytes.as_ptr(), at, "the next writer gets the same memory");
            // A write that has to wait keeps its bytes, and the next writer gets a buffer of its own.
            socket.open = false;
            assert!(write_out(&mut second, &mut socket).is_pending());
            assert_eq!(second.len(), request.len());
            let mut third = WriteBuffer::default();
            third.fill().push(b'x');
            assert_ne!(third.bytes.as_ptr(), at);
            // A writer that holds a buffer appends to it (which may move it).
            second.fill().extend_from_slice(b"more");
            let at = second.bytes.as_ptr();
            socket.open = true;
            assert!(write_out(&mut second, &mut socket).is_ready());
            assert!(socket.received.ends_with(b"GET / HTTP/1.1\r\n\r\nmore"));
            // With a spare already kept, a second one given back is freed, not kept.
            assert!(write_out(&mut third, &mut socket).is_ready());
            let (mut fourth, mut fifth) = (WriteBuffer::default(), WriteBuffer::default());
            assert_eq!(fourth.fill().as_ptr(), at);
            assert_eq!(fifth.fill().capacity(), 0, "only one spare per thread");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_buffer_grown_by_a_large_message_is_not_kept() {
        std::thread::spawn(|| {
            let mut socket = Socket { open: true, ..Socket::default() };
            let mut large = WriteBuffer::default();
            large.fill().resize(KEEP + 1, b'x');
            assert!(write_out(&mut large, &mut socket).is_ready());
            assert_eq!(socket.received.len(), KEEP + 1);
            assert_eq!(WriteBuffer::default().fill().capacity(), 0);
        })
        .join()
        .unwrap();
    }
}
