//! Layer 0: running work that may fail for memory and catching its panic without a backtrace.
//!
//! A device out-of-memory, or an op that cannot fit a budget, surfaces as a panic deep inside
//! a backend. A training loop that recovers from it (a smaller micro-batch, a larger budget)
//! wants the panic as a value, not printed; panics of other threads still print as before.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

/// How many other threads' panic messages a [`CaughtPanic`] keeps.
const OTHER_MESSAGES: usize = 8;

/// A panic caught by [`catch_quietly`], with what its `at_panic` read (`S`).
#[derive(Debug)]
pub struct CaughtPanic<S = ()> {
    /// The panic of the thread that ran the work.
    pub payload: Box<dyn std::any::Any + Send>,
    /// What `at_panic` returned when the work panicked, before unwinding dropped anything
    /// (`None` if the panic hook did not run: a panic resumed with `resume_unwind`).
    pub at_panic: Option<S>,
    /// The first messages of panics on other threads while the work ran (a backend's device
    /// threads: on CUDA they carry the device's own error, where the caller sees only that the
    /// device stopped answering), at most eight.
    pub other_threads: Vec<String>,
    /// How many panics other threads had while the work ran.
    pub other_thread_panics: usize,
}

impl<S> CaughtPanic<S> {
    /// The caller's panic message.
    pub fn message(&self) -> String {
        panic_message(self.payload.as_ref())
    }

    /// Every message, the caller's first.
    pub fn messages(&self) -> impl Iterator<Item = String> + '_ {
        std::iter::once(self.message()).chain(self.other_threads.iter().cloned())
    }
}

#[derive(Default)]
struct Others {
    messages: Vec<String>,
    count: usize,
}

/// Runs `work`, catching its panic without printing it. While it runs, panics of other
/// threads (a backend's device threads failing with it) are not printed either but kept in
/// the [`CaughtPanic`]. `at_panic` runs on this thread when `work` panics, before unwinding
/// drops anything: the moment to read what holds memory (e.g. [`crate::memory::holders`]);
/// the caught panic carries what it returned (its first call's, if the work panicked again
/// while unwinding).
///
/// Calls on different threads run side by side (one per device under data parallelism): the
/// process's panic hook is replaced while any call runs and answers each thread for itself; a
/// panic on a thread without a call of its own is kept by every call running then. A call
/// inside another on the same thread nests: the inner one catches.
pub fn catch_quietly<T, S: Send + 'static>(
    work: impl FnOnce() -> T,
    at_panic: impl Fn() -> S + Send + Sync + 'static,
) -> Result<T, CaughtPanic<S>> {
    let read: Arc<Mutex<Option<S>>> = Arc::new(Mutex::new(None));
    let slot = read.clone();
    let others = Arc::new(Mutex::new(Others::default()));
    let entry = quiet::enter(
        Box::new(move || {
            let mut read = slot.lock().unwrap_or_else(|e| e.into_inner());
            if read.is_none() {
                *read = Some(at_panic());
            }
        }),
        others.clone(),
    );
    let result = catch_unwind(AssertUnwindSafe(work));
    drop(entry);
    result.map_err(|payload| {
        let others = std::mem::take(&mut *others.lock().unwrap_or_else(|e| e.into_inner()));
        CaughtPanic {
            payload,
            at_panic: read.lock().unwrap_or_else(|e| e.into_inner()).take(),
            other_threads: others.messages,
            other_thread_panics: others.count,
        }
    })
}

/// The panic hook while any [`catch_quietly`] runs: which threads are quiet, and where other
/// threads' panics go.
mod quiet {
    use super::{OTHER_MESSAGES, Others, PanicHook, panic_message};
    use std::cell::RefCell;
    use std::sync::{Arc, Mutex};

    type AtPanic = Box<dyn Fn()>;

    thread_local! {
        /// This thread's calls, innermost last: a panic here runs the innermost's `at_panic`.
        static CALLS: RefCell<Vec<AtPanic>> = const { RefCell::new(Vec::new()) };
    }

    /// The calls running in the process and the hook that was in place before the first.
    struct Running {
        /// Where other threads' panics go: one sink per running call, with its thread.
        sinks: Vec<(std::thread::ThreadId, Arc<Mutex<Others>>)>,
        previous: Option<PanicHook>,
    }

    static RUNNING: Mutex<Running> = Mutex::new(Running {
        sinks: Vec::new(),
        previous: None,
    });

    fn running() -> std::sync::MutexGuard<'static, Running> {
        RUNNING.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call's registration, undone when dropped.
    pub(super) struct Entry {
        sink: Arc<Mutex<Others>>,
    }

    pub(super) fn enter(at_panic: AtPanic, sink: Arc<Mutex<Others>>) -> Entry {
        CALLS.with(|calls| calls.borrow_mut().push(at_panic));
        let mut running = running();
        if running.sinks.is_empty() {
            running.previous = Some(std::panic::take_hook());
            std::panic::set_hook(Box::new(hook));
        }
        running
            .sinks
            .push((std::thread::current().id(), sink.clone()));
        Entry { sink }
    }

    impl Drop for Entry {
        fn drop(&mut self) {
            CALLS.with(|calls| calls.borrow_mut().pop());
            let mut running = running();
            running.sinks.retain(|(_, s)| !Arc::ptr_eq(s, &self.sink));
            if running.sinks.is_empty()
                && let Some(previous) = running.previous.take()
            {
                // Ours is dropped here.
                drop(std::panic::take_hook());
                std::panic::set_hook(previous);
            }
        }
    }

    fn hook(info: &std::panic::PanicHookInfo<'_>) {
        let handled = CALLS.with(|calls| match calls.try_borrow() {
            Ok(calls) => match calls.last() {
                Some(at_panic) => {
                    at_panic();
                    true
                }
                None => false,
            },
            Err(_) => true,
        });
        if handled {
            return;
        }
        let running = running();
        if running.sinks.is_empty() {
            if let Some(previous) = &running.previous {
                previous(info);
            }
            return;
        }
        let message = panic_message(info.payload());
        let this = std::thread::current().id();
        for (thread, sink) in &running.sinks {
            // A thread whose own calls have all returned while the hook was still ours.
            if *thread == this {
                continue;
            }
            let mut others = sink.lock().unwrap_or_else(|e| e.into_inner());
            others.count += 1;
            if others.messages.len() < OTHER_MESSAGES {
                others.messages.push(message.clone());
            }
        }
    }
}

/// The text of a panic's payload (`String` or `&str`).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_panic_becomes_a_value_with_what_was_read_before_unwinding() {
        static DROPPED: AtomicBool = AtomicBool::new(false);
        struct Tensor;
        impl Drop for Tensor {
            fn drop(&mut self) {
                DROPPED.store(true, Ordering::SeqCst);
            }
        }
        let result = catch_quietly(
            || -> u32 {
                let _held = Tensor;
                panic!("out of memory: 5 GiB")
            },
            || DROPPED.load(Ordering::SeqCst),
        );
        let panic = result.unwrap_err();
        assert_eq!(panic.message(), "out of memory: 5 GiB");
        assert_eq!(
            panic.at_panic,
            Some(false),
            "read before the tensor was dropped"
        );
        assert!(DROPPED.load(Ordering::SeqCst));
        assert_eq!(catch_quietly(|| 7, || ()).unwrap(), 7);
    }

    #[test]
    fn panics_of_other_threads_meanwhile_are_kept_not_printed() {
        let caught = catch_quietly(
            || {
                let device_thread = std::thread::spawn(|| panic!("cannot allocate 5 GiB"));
                assert!(device_thread.join().is_err());
                panic!("the device stopped answering: CallError")
            },
            || (),
        )
        .unwrap_err();
        // Other tests of this binary may panic meanwhile too: look for ours.
        assert!(
            caught
                .other_threads
                .contains(&"cannot allocate 5 GiB".to_string()),
            "{caught:?}"
        );
        assert!(caught.other_thread_panics >= 1);
        assert_eq!(
            caught.messages().next().as_deref(),
            Some("the device stopped answering: CallError")
        );
    }

    #[test]
    fn calls_on_two_threads_run_side_by_side_and_each_catches_its_own() {
        use std::sync::mpsc::channel;
        use std::time::Duration;
        let (a_in, a_seen) = channel();
        let (b_in, b_seen) = channel();
        let wait = Duration::from_secs(20);
        let a = std::thread::spawn(move || {
            catch_quietly(
                || {
                    a_in.send(()).unwrap();
                    // Waits inside its call for the other thread to be inside its own.
                    b_seen
                        .recv_timeout(wait)
                        .expect("the other call did not start");
                    panic!("device 0: out of memory")
                },
                || 0u8,
            )
        });
        let b = std::thread::spawn(move || {
            catch_quietly(
                || {
                    b_in.send(()).unwrap();
                    a_seen
                        .recv_timeout(wait)
                        .expect("the other call did not start");
                    panic!("device 1: out of memory")
                },
                || 1u8,
            )
        });
        let a = a.join().expect("caught, not propagated").unwrap_err();
        let b = b.join().expect("caught, not propagated").unwrap_err();
        assert_eq!(a.message(), "device 0: out of memory");
        assert_eq!(a.at_panic, Some(0));
        assert_eq!(b.message(), "device 1: out of memory");
        assert_eq!(b.at_panic, Some(1));
    }
}
