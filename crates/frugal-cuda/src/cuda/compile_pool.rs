//! Threads that compile kernels while the server goes on queuing work.
//!
//! A first training step launches its kernels one after another without waiting for the
//! device, and each new kernel used to hold the server until NVRTC had compiled it. NVRTC is
//! thread-safe per program, so the server hands each new kernel's [`CompileJob`] to a pool of
//! threads and queues the launches behind it (`server/deferred.rs`); independent kernels then
//! compile side by side. [`COMPILE_THREADS_ENV`] sets the number of threads; 1 compiles on the
//! server's own thread, as before.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use cubecl_core::prelude::LaunchError;

use super::compiler::{CompileJob, CompiledImage};

/// Environment variable: threads compiling kernels (default: the machine's cores, at most 16;
/// `1` compiles each kernel on the server's thread when it is first launched).
pub const COMPILE_THREADS_ENV: &str = "FRUGAL_CUDA_COMPILE_THREADS";

/// Threads by default, at most: NVRTC's own work per kernel is single-threaded, and a first
/// step rarely has more independent kernels waiting at once.
const MAX_DEFAULT_THREADS: usize = 16;

/// What a compile thread sends back.
pub(crate) type CompileResult = Result<CompiledImage, LaunchError>;

type Task = (CompileJob, Sender<CompileResult>);

/// The compile threads, started at the first job.
pub(crate) struct CompilePool {
    threads: usize,
    tasks: Option<Sender<Task>>,
}

impl std::fmt::Debug for CompilePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompilePool")
            .field("threads", &self.threads)
            .field("started", &self.tasks.is_some())
            .finish()
    }
}

impl CompilePool {
    /// A pool of the threads [`COMPILE_THREADS_ENV`] asks for (see [`compile_threads`]).
    pub(crate) fn from_env() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            threads: compile_threads(std::env::var(COMPILE_THREADS_ENV).ok().as_deref(), cores),
            tasks: None,
        }
    }

    /// Whether jobs run on threads of their own (else the caller runs them).
    pub(crate) fn is_parallel(&self) -> bool {
        self.threads > 1
    }

    /// Queues `job`; its result arrives on the receiver. The threads start at the first job.
    pub(crate) fn submit(&mut self, job: CompileJob) -> Receiver<CompileResult> {
        let (done, result) = mpsc::channel();
        if self.tasks.is_none() {
            self.tasks = start(self.threads);
            if self.tasks.is_none() {
                self.threads = 1;
            }
        }
        let sent = match &self.tasks {
            Some(tasks) => tasks.send((job, done)),
            None => Err(mpsc::SendError((job, done))),
        };
        if let Err(mpsc::SendError((job, done))) = sent {
            // No thread could start, or all are gone: compile here.
            let _ = done.send(job.run());
        }
        result
    }
}

/// Threads for `setting` (the environment variable's value, if set) on a machine of `cores`:
/// a positive number as given, else the cores, at most [`MAX_DEFAULT_THREADS`]. An unreadable
/// value is reported once and treated as unset.
pub(crate) fn compile_threads(setting: Option<&str>, cores: usize) -> usize {
    let default = cores.clamp(1, MAX_DEFAULT_THREADS);
    match setting.map(str::trim) {
        None | Some("") => default,
        Some(text) => match text.parse::<usize>() {
            Ok(threads) if threads > 0 => threads,
            _ => {
                log::warn!(
                    "frugal-cuda: {COMPILE_THREADS_ENV}={text} is not a positive number of \
                     threads; compiling on {default}"
                );
                default
            }
        },
    }
}

/// Starts `threads` compile threads; `None` if none could start.
fn start(threads: usize) -> Option<Sender<Task>> {
    let (tasks, queue) = mpsc::channel::<Task>();
    let queue = Arc::new(Mutex::new(queue));
    let mut started = 0;
    for index in 0..threads {
        let queue = Arc::clone(&queue);
        let spawned = std::thread::Builder::new()
            .name(format!("frugal-cuda-compile-{index}"))
            .spawn(move || {
                loop {
                    let task = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok((job, done)) = task else {
                        return;
                    };
                    // The server may have stopped waiting (its device was dropped).
                    let _ = done.send(job.run());
                }
            });
        match spawned {
            Ok(_) => started += 1,
            Err(e) => log::warn!("frugal-cuda: cannot start a compile thread ({e})"),
        }
    }
    (started > 0).then_some(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_default_to_the_cores_up_to_sixteen() {
        assert_eq!(compile_threads(None, 2), 2);
        assert_eq!(compile_threads(None, 64), MAX_DEFAULT_THREADS);
        assert_eq!(compile_threads(Some(""), 8), 8);
        assert_eq!(compile_threads(None, 0), 1);
    }

    #[test]
    fn a_setting_is_taken_as_given_and_a_bad_one_ignored() {
        assert_eq!(compile_threads(Some("1"), 16), 1);
        assert_eq!(compile_threads(Some(" 32 "), 16), 32);
        assert_eq!(compile_threads(Some("0"), 16), 16);
        assert_eq!(compile_threads(Some("many"), 4), 4);
    }
}
