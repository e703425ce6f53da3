//! Kernels compiling while a step runs: the progress line says so ("compiling kernels: 143
//! done, 21 s") instead of waiting in silence for the step to end, and the closing report says
//! how much of the first step compilation took.
//!
//! The counts are frugal-cuda's compiler's (`frugal_cuda::kernel_loads`, process-wide); other
//! backends compile inside CubeCL's own runtimes and count nothing, so there a first step that
//! runs long says only how long it has run, and why ([`SlowFirstStep`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

/// What the process has compiled and loaded so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounts {
    /// Kernels compiled (code generation and NVRTC).
    pub compiled: u64,
    /// Kernels loaded from the on-disk kernel cache instead.
    pub from_disk: u64,
    /// Time spent generating code and compiling, summed over the compile threads.
    pub compiling: Duration,
    /// The part of `compiling` spent in NVRTC.
    pub nvrtc: Duration,
    /// Time spent loading kernels into the device's context.
    pub loading: Duration,
    /// Time the device's work waited for kernels to compile (less than `compiling` where
    /// kernels compiled side by side, or beside the work queued before them).
    pub waited: Duration,
}

impl KernelCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &KernelCounts) -> KernelCounts {
        KernelCounts {
            compiled: self.compiled.saturating_sub(earlier.compiled),
            from_disk: self.from_disk.saturating_sub(earlier.from_disk),
            compiling: self.compiling.saturating_sub(earlier.compiling),
            nvrtc: self.nvrtc.saturating_sub(earlier.nvrtc),
            loading: self.loading.saturating_sub(earlier.loading),
            waited: self.waited.saturating_sub(earlier.waited),
        }
    }
}

/// Reads the process's counts.
pub type CountsReader = fn() -> KernelCounts;

/// The reader of `device`'s compiler counts, if it has one (frugal-cuda).
#[allow(unused_variables)]
pub fn reader<D: 'static>(device: &D) -> Option<CountsReader> {
    #[cfg(feature = "frugal-cuda")]
    if (device as &dyn std::any::Any)
        .downcast_ref::<frugal_cuda::FrugalCudaDevice>()
        .is_some()
    {
        return Some(|| {
            let loads = frugal_cuda::kernel_loads();
            KernelCounts {
                compiled: loads.compiled,
                from_disk: loads.from_disk,
                compiling: Duration::from_nanos(loads.compile_nanos),
                nvrtc: Duration::from_nanos(loads.nvrtc_nanos),
                loading: Duration::from_nanos(loads.load_nanos),
                waited: Duration::from_nanos(loads.wait_nanos),
            }
        });
    }
    None
}

/// How long compilation must have run before a text line is printed, and how often after.
const FIRST_LINE_AFTER: Duration = Duration::from_secs(3);
const LINE_EVERY: Duration = Duration::from_secs(10);

/// Turns successive counts into progress messages: a message whenever kernels were compiled
/// since the last look (with the seconds since the run started, the time a user has waited),
/// and a "line" (for a log without a drawn bar) only after compilation has gone on for a
/// while, then at most every ten seconds, so a warm run prints nothing.
#[derive(Debug)]
pub struct CompileMessages {
    base: KernelCounts,
    last: KernelCounts,
    started: Instant,
    /// When compilation was first seen growing, and when a line was last printed.
    began: Option<Instant>,
    last_line: Option<Instant>,
}

/// What one look at the counts produced.
#[derive(Debug, PartialEq, Eq)]
pub struct Look {
    /// The progress bar's new message, if kernels were compiled since the last look.
    pub message: Option<String>,
    /// Whether that message is also due as a printed line.
    pub line_due: bool,
}

impl CompileMessages {
    /// Starts counting from `base` (what was compiled before the run, which started at
    /// `started`).
    pub fn new(base: KernelCounts, started: Instant) -> Self {
        CompileMessages {
            base,
            last: base,
            started,
            began: None,
            last_line: None,
        }
    }

    /// Looks at `now`'s counts, at time `at`.
    pub fn look(&mut self, now: KernelCounts, at: Instant) -> Look {
        if now.compiled <= self.last.compiled {
            return Look {
                message: None,
                line_due: false,
            };
        }
        self.last = now;
        let began = *self.began.get_or_insert(at);
        let run = now.since(&self.base);
        let message = format!(
            "compiling kernels: {} done, {:.0} s",
            run.compiled,
            at.saturating_duration_since(self.started).as_secs_f64()
        );
        let line_due = match self.last_line {
            None => at.duration_since(began) >= FIRST_LINE_AFTER,
            Some(printed) => at.duration_since(printed) >= LINE_EVERY,
        };
        if line_due {
            self.last_line = Some(at);
        }
        Look {
            message: Some(message),
            line_due,
        }
    }
}

/// A thread that calls `look` every [`LOOK_EVERY`] until dropped.
struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    fn spawn(name: &str, mut look: impl FnMut() + Send + 'static) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    while !stop.load(Relaxed) {
                        std::thread::park_timeout(LOOK_EVERY);
                        if !stop.load(Relaxed) {
                            look();
                        }
                    }
                })
                .ok()
        };
        Watcher { stop, thread }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// How often a watch looks.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// A thread that shows compilation on the progress bar while the run goes on; stops when
/// dropped.
pub struct CompileWatch {
    _watcher: Watcher,
}

impl CompileWatch {
    /// Starts watching `read`'s counts for `bar`; with `print_lines` (the bar is not drawn and
    /// the run is not `--quiet`) messages that are due are printed to stderr as well.
    pub fn start(bar: &ProgressBar, read: CountsReader, print_lines: bool) -> CompileWatch {
        let bar = bar.clone();
        let mut messages = CompileMessages::new(read(), Instant::now());
        CompileWatch {
            _watcher: Watcher::spawn("gpt-compile-progress", move || {
                let look = messages.look(read(), Instant::now());
                if let Some(message) = look.message {
                    if look.line_due && print_lines {
                        eprintln!("{message}");
                    }
                    bar.set_message(message);
                }
            }),
        }
    }
}

/// When a first step without compile counts has run long enough to say so, and how often
/// after.
const FIRST_STEP_NOTICE_AFTER: Duration = Duration::from_secs(15);
const FIRST_STEP_NOTICE_EVERY: Duration = Duration::from_secs(60);

/// The seconds of a first step at which [`SlowFirstStep`] prints, up to `ran`: 15 s, then
/// every minute.
fn first_step_notices(ran: Duration) -> u64 {
    if ran < FIRST_STEP_NOTICE_AFTER {
        return 0;
    }
    1 + (ran - FIRST_STEP_NOTICE_AFTER).as_secs() / FIRST_STEP_NOTICE_EVERY.as_secs()
}

/// A thread that, where the backend counts no compilation, prints how long the first step
/// has run once it has run 15 s, then every minute, until dropped: a GPU backend's first step
/// compiles its kernels, for minutes on a fresh machine, and should not look like a hang.
pub struct SlowFirstStep {
    _watcher: Watcher,
}

impl SlowFirstStep {
    /// Starts the clock for step `step`; `why` ends each line (what the step is likely doing).
    pub fn start(bar: &ProgressBar, step: u64, why: &'static str) -> SlowFirstStep {
        let bar = bar.clone();
        let started = Instant::now();
        let mut printed = 0;
        SlowFirstStep {
            _watcher: Watcher::spawn("gpt-first-step", move || {
                let ran = started.elapsed();
                if first_step_notices(ran) > printed {
                    printed = first_step_notices(ran);
                    let line = format!(
                        "step {}: still running after {} s ({why})",
                        step + 1,
                        ran.as_secs()
                    );
                    bar.suspend(|| eprintln!("{line}"));
                }
            }),
        }
    }
}

/// The closing report's line: what the run compiled and loaded, and how much of the run's
/// first step (its wall time in ms, and what compiled while it ran) waited for compilation.
pub fn summary(run: &KernelCounts, first_step: Option<(f64, KernelCounts)>) -> Option<String> {
    if run.compiled == 0 && run.from_disk == 0 {
        return None;
    }
    let mut line = format!(
        "kernels: {} compiled ({:.1} s of compile threads' time, {:.1} s of it in NVRTC), {} \
         loaded from the kernel cache, {:.1} s loading",
        run.compiled,
        run.compiling.as_secs_f64(),
        run.nvrtc.as_secs_f64(),
        run.from_disk,
        run.loading.as_secs_f64()
    );
    if let Some((first_ms, during)) = first_step.filter(|(_, during)| during.compiled > 0) {
        let waited = during.waited.as_secs_f64();
        let first = first_ms / 1e3;
        line.push_str(&format!(
            "; first step {first:.1} s: {:.1} s waiting for its {} kernels to compile, {:.1} s \
             the rest (autotune trials, the step itself)",
            waited,
            during.compiled,
            (first - waited).max(0.0)
        ));
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(compiled: u64, compiling_s: u64) -> KernelCounts {
        KernelCounts {
            compiled,
            compiling: Duration::from_secs(compiling_s),
            ..KernelCounts::default()
        }
    }

    #[test]
    fn a_slow_first_step_is_told_after_15_s_then_every_minute() {
        let at = |s: u64| first_step_notices(Duration::from_secs(s));
        assert_eq!((at(0), at(14)), (0, 0), "a quick first step says nothing");
        assert_eq!((at(15), at(74)), (1, 1));
        assert_eq!((at(75), at(134), at(135)), (2, 2, 3));
    }

    #[test]
    fn nothing_compiled_shows_nothing() {
        let start = Instant::now();
        let mut messages = CompileMessages::new(counts(5, 2), start);
        for tick in 0..100 {
            let look = messages.look(counts(5, 2), start + Duration::from_secs(tick));
            assert_eq!(look.message, None);
            assert!(!look.line_due);
        }
    }

    #[test]
    fn messages_count_from_the_runs_start_and_lines_wait_then_space_out() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut messages = CompileMessages::new(counts(10, 4), at(0));
        let look = messages.look(counts(12, 5), at(1));
        assert_eq!(
            look.message.as_deref(),
            Some("compiling kernels: 2 done, 1 s")
        );
        assert!(!look.line_due, "a short burst prints no line");
        assert!(messages.look(counts(13, 6), at(2)).message.is_some());
        assert!(messages.look(counts(14, 7), at(4)).line_due);
        let look = messages.look(counts(20, 9), at(8));
        assert!(look.message.is_some() && !look.line_due);
        // No growth: no message, even when a line would be due.
        assert_eq!(messages.look(counts(20, 9), at(20)).message, None);
        let look = messages.look(counts(25, 12), at(21));
        assert_eq!(
            look.message.as_deref(),
            Some("compiling kernels: 15 done, 21 s")
        );
        assert!(look.line_due);
    }

    #[test]
    fn the_summary_splits_the_first_step() {
        assert_eq!(
            summary(
                &KernelCounts::default(),
                Some((10.0, KernelCounts::default()))
            ),
            None
        );
        let run = KernelCounts {
            compiled: 161,
            from_disk: 3,
            compiling: Duration::from_millis(80_500),
            nvrtc: Duration::from_millis(61_200),
            loading: Duration::from_millis(400),
            waited: Duration::from_millis(31_000),
        };
        let during = KernelCounts {
            compiled: 150,
            compiling: Duration::from_millis(78_000),
            waited: Duration::from_millis(30_100),
            ..run
        };
        assert_eq!(
            summary(&run, Some((88_600.0, during))).unwrap(),
            "kernels: 161 compiled (80.5 s of compile threads' time, 61.2 s of it in NVRTC), 3 \
             loaded from the kernel cache, 0.4 s loading; \
             first step 88.6 s: 30.1 s waiting for its 150 kernels to compile, 58.5 s the rest \
             (autotune trials, the step itself)"
        );
        let warm = KernelCounts {
            compiled: 0,
            from_disk: 90,
            ..run
        };
        let line = summary(&warm, Some((400.0, warm))).unwrap();
        assert!(!line.contains("first step"), "{line}");
    }
}
