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
/// The panic hook is the process's: calls on different threads take turns (the second waits
/// for the first to return), and a call inside another on the same thread nests.
pub fn catch_quietly<T, S: Send + 'static>(
    work: impl FnOnce() -> T,
    at_panic: impl Fn() -> S + Send + Sync + 'static,
) -> Result<T, CaughtPanic<S>> {
    thread_local! {
        static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    static TURN: Mutex<()> = Mutex::new(());
    let _turn = (DEPTH.get() == 0).then(|| TURN.lock().unwrap_or_else(|e| e.into_inner()));
    DEPTH.set(DEPTH.get() + 1);
    let result = with_quiet_hook(work, at_panic);
    DEPTH.set(DEPTH.get() - 1);
    result
}

fn with_quiet_hook<T, S: Send + 'static>(
    work: impl FnOnce() -> T,
    at_panic: impl Fn() -> S + Send + Sync + 'static,
) -> Result<T, CaughtPanic<S>> {
    let previous: Arc<PanicHook> = Arc::new(std::panic::take_hook());
    let quiet = std::thread::current().id();
    let others = Arc::new(Mutex::new(Others::default()));
    let read = Arc::new(Mutex::new(None));
    let (sink, read_sink) = (others.clone(), read.clone());
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() == quiet {
            let mut read = read_sink.lock().unwrap_or_else(|e| e.into_inner());
            if read.is_none() {
                *read = Some(at_panic());
            }
        } else {
            let mut others = sink.lock().unwrap_or_else(|e| e.into_inner());
            others.count += 1;
            if others.messages.len() < OTHER_MESSAGES {
                others.messages.push(panic_message(info.payload()));
            }
        }
    }));
    let result = catch_unwind(AssertUnwindSafe(work));
    // Ours is dropped here, releasing its share of the previous hook.
    drop(std::panic::take_hook());
    match Arc::try_unwrap(previous) {
        Ok(hook) => std::panic::set_hook(hook),
        Err(shared) => std::panic::set_hook(Box::new(move |info| shared(info))),
    }
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
}
