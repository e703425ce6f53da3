//! When the training loop saves: every `--save-every` steps, and by default every few minutes
//! (`--save-minutes`), so that a run the device cannot continue (a CUDA out-of-memory ends
//! Burn's device thread) goes on from a state at most that old.
//!
//! The training thread only reads the state into host memory ([`checkpoint::snapshot`]); a
//! thread of its own writes the files, beside the next steps. A timed save is put off while
//! the last one is still being written, and until at least [`STALL_FACTOR`] times the training
//! thread's share of the last save has passed, so saving never takes more than 1/50 of the
//! run's time, however large the model.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use frugal::GradScaler;

use crate::Ad;
use crate::checkpoint::{self, Snapshot};
use crate::cli::TrainArgs;
use crate::model::Gpt;
use crate::report::StepLog;
use crate::train::GptOptimizer;

/// A timed save waits at least this many times the training thread's time in the last one.
pub const STALL_FACTOR: u32 = 50;

/// A checkpoint being written, or written.
struct Write {
    /// The step a run resumed from it runs first.
    next_step: u64,
    /// Whether `--save-every` asked for it (kept), rather than the clock (replaced by the next).
    timed: bool,
    thread: JoinHandle<Result<PathBuf, String>>,
}

/// Saves checkpoints during a run: by step count and by time, written in the background.
pub struct Autosave {
    every_steps: u64,
    every: Option<Duration>,
    /// When the last save's state was read (the run's start before the first).
    last: Instant,
    /// The training thread's time in the last save.
    stall: Duration,
    /// The training thread's time in all saves.
    stalled: Duration,
    /// Saves begun during the run.
    saves: u32,
    writing: Option<Write>,
    /// The newest checkpoint written by the clock, removed when the next one is in place.
    timed_on_disk: Option<PathBuf>,
}

impl Autosave {
    /// A saver for `args`' `--save-every` and `--save-minutes`, its clock starting now.
    pub fn new(args: &TrainArgs) -> Self {
        Autosave {
            every_steps: args.save_every,
            every: (args.save_minutes > 0.0)
                .then(|| Duration::from_secs_f64(args.save_minutes * 60.0)),
            last: Instant::now(),
            stall: Duration::ZERO,
            stalled: Duration::ZERO,
            saves: 0,
            writing: None,
            timed_on_disk: None,
        }
    }

    /// Whether a timed save is due: the interval has passed, and [`STALL_FACTOR`] times the
    /// last save's stall.
    fn timed_due(&self) -> bool {
        self.every
            .is_some_and(|every| self.last.elapsed() >= every.max(self.stall * STALL_FACTOR))
    }

    /// Called after step `done - 1`: saves if `--save-every` or the clock asks for it (never
    /// after the last step, which the run saves itself). A write that failed is reported as a
    /// warning and the run goes on; the next save tries again.
    #[allow(clippy::too_many_arguments)]
    pub fn after_step<B: Backend>(
        &mut self,
        args: &TrainArgs,
        model: &Gpt<Ad<B>>,
        optim: &GptOptimizer<Ad<B>>,
        scaler: Option<&GradScaler>,
        done: u64,
        log: &[StepLog],
    ) {
        if done >= args.steps {
            return;
        }
        let by_steps = self.every_steps > 0 && done.is_multiple_of(self.every_steps);
        if !by_steps && !self.timed_due() {
            return;
        }
        if !by_steps
            && self
                .writing
                .as_ref()
                .is_some_and(|write| !write.thread.is_finished())
        {
            // The disk is slower than the clock: wait for the next step rather than queue.
            return;
        }
        self.wait();
        let started = Instant::now();
        let snapshot = checkpoint::snapshot::<B>(args, model, optim, scaler, done, log);
        self.stall = started.elapsed();
        self.stalled += self.stall;
        self.saves += 1;
        self.last = started;
        self.spawn(snapshot, !by_steps);
    }

    fn spawn(&mut self, snapshot: Snapshot, timed: bool) {
        let next_step = snapshot.next_step();
        let thread = std::thread::Builder::new()
            .name("checkpoint writer".into())
            .spawn(move || snapshot.write())
            .expect("a thread can be started");
        self.writing = Some(Write {
            next_step,
            timed,
            thread,
        });
    }

    /// Waits for the write in flight, if any; the checkpoint it replaces by the clock goes once
    /// the new one is in place.
    pub fn wait(&mut self) {
        let Some(write) = self.writing.take() else {
            return;
        };
        match write.thread.join() {
            Ok(Ok(dir)) => {
                if let Some(old) = self.timed_on_disk.take().filter(|old| *old != dir)
                    && let Err(e) = std::fs::remove_dir_all(&old)
                {
                    log::warn!("cannot remove the older checkpoint {}: {e}", old.display());
                }
                if write.timed {
                    self.timed_on_disk = Some(dir);
                }
            }
            Ok(Err(e)) => log::warn!(
                "the checkpoint before step {} was not written: {e}; training goes on",
                write.next_step
            ),
            Err(_) => log::warn!(
                "the checkpoint before step {} was not written (its writer panicked)",
                write.next_step
            ),
        }
    }

    /// One line on the saves during the run, if there were any: how many, and the training
    /// thread's time in them as a share of `run`.
    pub fn summary(&self, run: Duration) -> Option<String> {
        (self.saves > 0).then(|| {
            format!(
                "checkpoints during the run: {}, written beside training; the steps waited {} \
                 for their reads ({:.2}% of the run)",
                self.saves,
                crate::report::format_duration(self.stalled),
                100.0 * self.stalled.as_secs_f64() / run.as_secs_f64().max(1e-9)
            )
        })
    }
}

impl Drop for Autosave {
    /// A run that ends early (an error) still leaves its last checkpoint whole.
    fn drop(&mut self) {
        self.wait();
    }
}
