//! A future that shares its task with a busier one and is polled only when
//! its own waker fired. `tokio::select!` polls every branch on every wake of
//! the task: a client connection's idle timer and shutdown signal were
//! polled (a timer-state check, a lock of the signal's waiter list) on each
//! of the several wakes of every request, though each wakes at most a few
//! times in a connection's life.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

pub(super) struct WhenWoken<F> {
    future: F,
    flag: Arc<Flag>,
    /// Wakes `flag`, then the task: what `future` is polled with.
    waker: Waker,
    /// The task waker last registered in `flag`, which stays there until a
    /// wake takes it (and sets `woken` first).
    registered: Option<Waker>,
}

struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future + Unpin> WhenWoken<F> {
    pub(super) fn new(future: F) -> Self {
        // Woken to begin with: the first poll starts the future.
        let flag = Arc::new(Flag { woken: AtomicBool::new(true), task: AtomicWaker::new() });
        WhenWoken { future, waker: Waker::from(flag.clone()), flag, registered: None }
    }
}

impl<F: Future + Unpin> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Not woken, and the task's waker still registered: nothing to do (a
        // wake from here on sets `woken`, then wakes the task with it). The
        // usual case, as the connection's task wakes often and this rarely.
        let same_task = this.registered.as_ref().is_some_and(|registered| registered.will_wake(cx.waker()));
        if same_task && !this.flag.woken.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        // The task's waker first: a wake between the two is then not lost.
        this.flag.task.register(cx.waker());
        if !same_task {
            this.registered = Some(cx.waker().clone());
        }
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        Pin::new(&mut this.future).poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts its polls and keeps the waker of the last one; never ready.
    struct Counting<'a> {
        polls: &'a AtomicUsize,
        waker: &'a std::sync::Mutex<Option<Waker>>,
    }

    impl Future for Counting<'_> {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    struct TaskWoken(AtomicUsize);

    impl Wake for TaskWoken {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn polled_once_and_then_only_after_its_own_wake_which_wakes_the_task() {
        let (polls, waker) = (AtomicUsize::new(0), std::sync::Mutex::new(None));
        let mut gated = WhenWoken::new(Counting { polls: &polls, waker: &waker });
        let task = Arc::new(TaskWoken(AtomicUsize::new(0)));
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        for _ in 0..3 {
            assert!(Pin::new(&mut gated).poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1, "polled on the first poll only");

        waker.lock().unwrap().take().expect("the future kept a waker").wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "its wake wakes the task");
        assert!(Pin::new(&mut gated).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut gated).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 2, "polled again once per wake");

        // A wake takes the task's waker: it is registered again for the next.
        waker.lock().unwrap().take().expect("the future kept a waker").wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 2, "a second wake wakes the task too");
        assert!(Pin::new(&mut gated).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 3);

        // Polled from another task: that one is woken from then on.
        let other = Arc::new(TaskWoken(AtomicUsize::new(0)));
        let other_waker = Waker::from(other.clone());
        assert!(Pin::new(&mut gated).poll(&mut Context::from_waker(&other_waker)).is_pending());
        waker.lock().unwrap().take().expect("the future kept a waker").wake();
        assert_eq!((task.0.load(Ordering::Relaxed), other.0.load(Ordering::Relaxed)), (2, 1));
    }
}
