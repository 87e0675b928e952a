//! One write buffer per proxy worker thread, lent to the connection about
//! to encode a message's bytes and given back once they are written out
//! (`http1_wire::poll_write_out`), on both legs.
//!
//! Why: a buffer kept by every connection is written to once per message,
//! and under a few hundred connections those buffers outgrow the core's
//! cache, so each head and body copied into one met lines fetched from
//! memory. A message is nearly always written out in the poll that encodes
//! it, so one buffer per thread is hot in the cache for all of them; one
//! whose write has to wait keeps what it holds until it is out, and the next
//! writer meanwhile gets a new buffer. Idle connections then hold none.

use std::cell::Cell;

/// A buffer grown past this by a large message is freed, not kept as the spare.
const KEEP: usize = 16 * 1024;

thread_local! {
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Gives `buffer` this thread's spare when it holds nothing of its own.
pub fn lend(buffer: &mut Vec<u8>) {
    if buffer.capacity() == 0 {
        *buffer = SPARE.take();
    }
}

/// Takes `buffer` back as this thread's spare once all it held is written
/// (it is empty), unless the thread has one already or it grew past [`KEEP`]:
/// then it is freed. A buffer still holding bytes stays with its writer.
pub fn give_back(buffer: &mut Vec<u8>) {
    if !buffer.is_empty() || buffer.capacity() == 0 {
        return;
    }
    let returned = std::mem::take(buffer);
    if returned.capacity() <= KEEP {
        let spare = SPARE.take();
        SPARE.set(if spare.capacity() == 0 { returned } else { spare });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_buffer_goes_from_writer_to_writer_on_a_thread() {
        // A thread of its own: the spare is per thread, and other tests run on theirs.
        std::thread::spawn(|| {
            let mut first = Vec::new();
            lend(&mut first);
            first.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
            let at = first.as_ptr();
            // Not given back while it holds bytes not written yet.
            give_back(&mut first);
            assert!(!first.is_empty());
            first.clear();
            give_back(&mut first);
            assert_eq!(first.capacity(), 0, "an idle writer holds no buffer");
            let mut second = Vec::new();
            lend(&mut second);
            assert_eq!(second.as_ptr(), at, "the next writer gets the same memory");
            // A writer that has a buffer keeps it.
            let mut third = Vec::with_capacity(64);
            let own = third.as_ptr();
            lend(&mut third);
            assert_eq!(third.as_ptr(), own);
            // With a spare already kept, a second one returned is freed, not kept.
            give_back(&mut second);
            give_back(&mut third);
            let mut fourth = Vec::new();
            lend(&mut fourth);
            assert_eq!(fourth.as_ptr(), at);
            let mut fifth = Vec::new();
            lend(&mut fifth);
            assert_eq!(fifth.capacity(), 0, "only one spare per thread");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_buffer_grown_by_a_large_message_is_not_kept() {
        std::thread::spawn(|| {
            let mut large = vec![0; KEEP + 1];
            large.clear();
            give_back(&mut large);
            let mut next = Vec::new();
            lend(&mut next);
            assert_eq!(next.capacity(), 0);
        })
        .join()
        .unwrap();
    }
}
