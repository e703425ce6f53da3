//! How many micro-batches a step is split into under a budget, chosen from what the steps
//! that ran cost.
//!
//! A budget keeps live bytes under it by dropping tensors and recomputing them when read.
//! While it recomputes less than the forward pass's work (checkpointing, as the step plan's
//! segments do, recomputes each forward op at most once), that is cheap. When a step is so far
//! over the budget that the kept tensors themselves do not fit, it recomputes the same ops
//! again and again, and splitting the batch into micro-batches (which recompute nothing, and
//! whose gradients [`GradientAccumulation`](crate::GradientAccumulation) sums into the whole
//! batch's) is faster. [`MicroBatching`] reads both figures off the budget's counters
//! ([`RematStats::recompute_ratio`]) after each step, splits further while a step under the
//! budget's learned plan recomputes more than its forward pass, and goes back to the split
//! before if the split's steps under their plan turn out slower. A planned step that
//! recomputes less, but still a fair share of its forward pass
//! ([`TRIAL_RECOMPUTE_RATIO`]), tries the next split once, judged the same way: whether a
//! micro-batch's smaller batch or the whole batch's recomputation costs more depends on the
//! device (small micro-batches leave a large GPU idle), so it is measured rather than
//! predicted. A step whose largest op alone holds more than the budget (the plan's op floor:
//! that op's inputs and output, which no eviction lowers while it runs) splits too, for good:
//! only a smaller batch keeps such a budget.
//!
//! Steps the plan did not run from their start (a run's first three, and the first three at
//! a new split, whose shapes the plan learns anew) are judged only against a far higher
//! limit: before the plan, eviction ranks tensors by how long they went unread and
//! recomputes more than the plan will. On the reference GPT step at a quarter of its peak
//! such steps recompute 1.5x, and the plan's 1.16x; split on them, the step ran as four
//! micro-batches at 2.5x the time of the whole batch.

use std::time::Duration;

use burn_backend::DeviceOps;

use crate::engine::RematStats;
use crate::memory;
use crate::training::accumulate::{AccumulationError, micro_batch_size};

/// A step under the budget's plan recomputing more than this many times its forward pass's
/// work is split further: checkpointing recomputes each forward op at most once.
pub const RECOMPUTE_RATIO_LIMIT: f64 = 1.0;

/// A step under the budget's plan recomputing more than this many times its forward pass's
/// work (but not more than [`RECOMPUTE_RATIO_LIMIT`]) tries the next split, and goes back if
/// that split's steps are slower: a large model's micro-batches keep the GPU busy and
/// recompute nothing, a small model's leave it idle, and which costs more than the
/// recomputation is measured rather than predicted.
pub const TRIAL_RECOMPUTE_RATIO: f64 = 0.3;

/// The same limit for a step the budget's plan did not run from its start (see the module
/// doc): only a step far over it splits at once.
pub const UNPLANNED_RECOMPUTE_RATIO_LIMIT: f64 = 3.0;

/// Steps under the plan at a split, after the first (which compiles the plan's new orders),
/// before its recompute ratio is judged and its time compared with the split before. The
/// second may still compile: Burn's fusion meets the plan's op orders over more than one step
/// (burn-nn's TransformerEncoder at half its peak compiles kernels in its first two planned
/// steps, the second taking twice the later ones), and a split judged on it looks better than
/// the whole batch it replaced.
const STEADY_STEPS: u32 = 2;

/// A loop that retries a step with smaller micro-batches may make a backward pass that
/// recomputes more than this many times its forward pass's work fail at once
/// ([`crate::memory::set_recompute_limit`]): such a step would take minutes, and the split
/// after it is decided already.
pub const PASS_RECOMPUTE_RATIO_LIMIT: f64 = UNPLANNED_RECOMPUTE_RATIO_LIMIT;

/// Why [`MicroBatching`] changed the split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MicroBatchReason {
    /// The step recomputed `ratio` times its forward pass's work under the budget.
    Recomputing {
        /// Recomputed work over the forward pass's work (the cost model's estimates).
        ratio: f64,
    },
    /// The step recomputed `ratio` times its forward pass's work, under
    /// [`RECOMPUTE_RATIO_LIMIT`] but over [`TRIAL_RECOMPUTE_RATIO`]: the next split is tried,
    /// and left if its steps are slower.
    Trying {
        /// Recomputed work over the forward pass's work (the cost model's estimates).
        ratio: f64,
    },
    /// The step's largest op holds `op_bytes` at once, more than the `budget`: no eviction keeps
    /// live bytes within the budget while it runs. Such a split is not undone.
    OpOverBudget {
        /// What that op holds: its inputs and its output ([`RematStats::plan_op_floor`]).
        op_bytes: u64,
        /// The device's budget.
        budget: u64,
    },
    /// The split step took `split` against `before` for the split it replaced: back to that
    /// one, for good.
    Slower {
        /// The split step's time (its fastest under the plan, after the first).
        split: Duration,
        /// The time of the split before (its fastest under the plan after the first, else
        /// its fastest).
        before: Duration,
    },
}

/// A change of the split, for the next step on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MicroBatchChange {
    /// Micro-batches of the step that just ran.
    pub from: usize,
    /// Micro-batches from the next step on.
    pub to: usize,
    /// Items in the whole batch.
    pub batch: usize,
    /// Why.
    pub reason: MicroBatchReason,
}

impl std::fmt::Display for MicroBatchChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (from, to) = (self.batch / self.from, self.batch / self.to);
        match self.reason {
            MicroBatchReason::Recomputing { ratio } => write!(
                f,
                "the budget recomputed {ratio:.1}x the forward pass's work: splitting the batch \
                 of {} into {} micro-batches of {to} (was {} of {from})",
                self.batch, self.to, self.from
            ),
            MicroBatchReason::Trying { ratio } => write!(
                f,
                "the budget recomputed {ratio:.2}x the forward pass's work: trying {} \
                 micro-batches of {to} (was {} of {from}), back if slower",
                self.to, self.from
            ),
            MicroBatchReason::OpOverBudget { op_bytes, budget } => write!(
                f,
                "the step's largest op holds {op_bytes} B at once, more than the budget of \
                 {budget} B, which no eviction lowers: splitting the batch of {} into {} \
                 micro-batches of {to} (was {} of {from})",
                self.batch, self.to, self.from
            ),
            MicroBatchReason::Slower { split, before } => write!(
                f,
                "{} micro-batches of {from} took {:.1} ms a step against {:.1} ms for {} of \
                 {to}: back to {} of {to}",
                self.from,
                split.as_secs_f64() * 1e3,
                before.as_secs_f64() * 1e3,
                self.to,
                self.to
            ),
        }
    }
}

/// Steps seen at one micro-batch count.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Seen {
    micro_batches: usize,
    /// Steps the budget's plan ran from their start.
    planned: u32,
    /// The fastest of those after the first (which compiles the plan's new orders).
    steady: Option<Duration>,
    /// The fastest step of any kind.
    fastest: Option<Duration>,
}

impl Seen {
    /// The best time known: a steady one, else the fastest.
    fn best(&self) -> Option<Duration> {
        self.steady.or(self.fastest)
    }
}

/// Chooses the micro-batch count of a training loop's steps under a budget (see the module
/// doc). Without a budget on the device it keeps the count it was given.
///
/// ```
/// use std::time::Instant;
/// use burn::backend::ndarray::NdArrayDevice;
/// use frugal::MicroBatching;
///
/// let device = NdArrayDevice::Cpu;
/// let mut split = MicroBatching::new(64, 1).unwrap();
/// for _step in 0..3 {
///     split.begin_step(&device);
///     let started = Instant::now();
///     // ... run the step as `split.micro_batches()` micro-batches of 64 / that many ...
///     if let Some(change) = split.end_step(&device, started.elapsed()) {
///         println!("{change}");
///     }
/// }
/// // No budget on the device: the split stays as given.
/// assert_eq!(split.micro_batches(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct MicroBatching {
    batch: usize,
    micro_batches: usize,
    start: Option<RematStats>,
    seen: Vec<Seen>,
    /// The split the current one replaced, if this planner chose it.
    split_from: Option<usize>,
    settled: bool,
}

impl MicroBatching {
    /// A planner for steps of `batch` items, starting at `micro_batches` (which must divide
    /// it).
    pub fn new(batch: usize, micro_batches: usize) -> Result<Self, AccumulationError> {
        micro_batch_size(batch, micro_batches)?;
        Ok(Self {
            batch,
            micro_batches,
            start: None,
            seen: Vec::new(),
            split_from: None,
            settled: false,
        })
    }

    /// Micro-batches to run the next step as.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Whether the split is decided for good (a split turned out slower than the one before).
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// Sets the split from outside (an out-of-memory retry chose it); the planner goes on from
    /// there, never back above it.
    pub fn set_micro_batches(&mut self, micro_batches: usize) -> Result<(), AccumulationError> {
        micro_batch_size(self.batch, micro_batches)?;
        self.micro_batches = micro_batches;
        self.split_from = None;
        self.start = None;
        Ok(())
    }

    /// Call as a step begins: reads the budget's counters.
    pub fn begin_step<D: DeviceOps + 'static>(&mut self, device: &D) {
        self.start = Some(memory::remat_stats(device));
    }

    /// Call when the step that [`Self::begin_step`] began is done, with its wall time; returns
    /// the change of split for the next step, if any.
    pub fn end_step<D: DeviceOps + 'static>(
        &mut self,
        device: &D,
        elapsed: Duration,
    ) -> Option<MicroBatchChange> {
        let start = self.start.take()?;
        let now = memory::remat_stats(device);
        // The plan ran the whole step if it had learned the step when the step began and did
        // not learn another since.
        let planned = start.plan_period > 0 && now.replans == start.replans;
        let step = now.since(&start);
        self.decide(&step, planned, elapsed, memory::budget(device))
    }

    /// [`Self::end_step`] on the step's counters; `planned`: the budget's plan ran the step
    /// from its start.
    fn decide(
        &mut self,
        step: &RematStats,
        planned: bool,
        elapsed: Duration,
        budget: Option<u64>,
    ) -> Option<MicroBatchChange> {
        let seen = self.note(elapsed, planned);
        let budget = budget?;
        if self.settled {
            return None;
        }
        // The first planned step at a split compiles the plan's orders and may still adapt
        // its cuts; from the next one the op floor is the plan's reading of a step at this
        // split, and no eviction helps an op over the budget.
        let op_bytes = step.plan_op_floor;
        if planned
            && seen.planned > 1
            && op_bytes > budget
            && let Some(next) = self.next_split()
        {
            return Some(self.change(next, MicroBatchReason::OpOverBudget { op_bytes, budget }));
        }
        let ratio = step.recompute_ratio();
        let steady = planned && seen.planned > STEADY_STEPS;
        let limit = match steady {
            true => RECOMPUTE_RATIO_LIMIT,
            false => UNPLANNED_RECOMPUTE_RATIO_LIMIT,
        };
        if ratio > limit
            && let Some(next) = self.next_split()
        {
            return Some(self.change(next, MicroBatchReason::Recomputing { ratio }));
        }
        // A trial only from a split whose own time is known, and not while the split before
        // it is still to be compared.
        if steady
            && ratio > TRIAL_RECOMPUTE_RATIO
            && self.split_from.is_none()
            && let Some(next) = self.next_split()
        {
            return Some(self.change(next, MicroBatchReason::Trying { ratio }));
        }
        // Keeping this split: compare it with the one it replaced, once, when it has run
        // [`STEADY_STEPS`] steps under its plan after the first.
        let before = self.split_from?;
        let split = seen.steady.filter(|_| seen.planned > STEADY_STEPS)?;
        self.split_from = None;
        let before_time = self.seen_at(before).best()?;
        (split > before_time).then(|| {
            self.change(
                before,
                MicroBatchReason::Slower {
                    split,
                    before: before_time,
                },
            )
        })
    }

    /// Counts a step at the current split; returns what is now known of that split.
    fn note(&mut self, elapsed: Duration, planned: bool) -> Seen {
        let micro_batches = self.micro_batches;
        let at = match self
            .seen
            .iter()
            .position(|s| s.micro_batches == micro_batches)
        {
            Some(at) => at,
            None => {
                self.seen.push(Seen {
                    micro_batches,
                    ..Seen::default()
                });
                self.seen.len() - 1
            }
        };
        let seen = &mut self.seen[at];
        seen.fastest = Some(seen.fastest.map_or(elapsed, |f| f.min(elapsed)));
        if planned {
            seen.planned += 1;
            if seen.planned > 1 {
                seen.steady = Some(seen.steady.map_or(elapsed, |s| s.min(elapsed)));
            }
        }
        *seen
    }

    fn seen_at(&self, micro_batches: usize) -> Seen {
        self.seen
            .iter()
            .find(|s| s.micro_batches == micro_batches)
            .copied()
            .unwrap_or_default()
    }

    /// The next count that divides the batch, at least twice the current one.
    fn next_split(&self) -> Option<usize> {
        (self.micro_batches * 2..=self.batch).find(|n| self.batch.is_multiple_of(*n))
    }

    fn change(&mut self, to: usize, reason: MicroBatchReason) -> MicroBatchChange {
        let from = self.micro_batches;
        match reason {
            MicroBatchReason::Recomputing { .. } | MicroBatchReason::Trying { .. } => {
                self.split_from = Some(from)
            }
            MicroBatchReason::OpOverBudget { .. } => self.split_from = None,
            MicroBatchReason::Slower { .. } => {
                self.split_from = None;
                self.settled = true;
            }
        }
        self.micro_batches = to;
        MicroBatchChange {
            from,
            to,
            batch: self.batch,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(forward: u64, recomputed: u64) -> RematStats {
        RematStats {
            made_cost: 3 * forward,
            forward_cost: forward,
            recomputed_cost: recomputed,
            ..RematStats::default()
        }
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    const BUDGET: u64 = 1 << 30;

    #[test]
    fn splits_for_good_where_one_op_holds_more_than_the_budget() {
        let over = |op_bytes| RematStats {
            plan_op_floor: op_bytes,
            ..step(100, 0)
        };
        let mut split = MicroBatching::new(32, 1).unwrap();
        // Before the plan, and in its first step, the floor is not read.
        assert_eq!(split.decide(&over(0), false, ms(900), Some(BUDGET)), None);
        assert_eq!(
            split.decide(&over(BUDGET + 1), true, ms(500), Some(BUDGET)),
            None
        );
        let change = split
            .decide(&over(BUDGET + 1), true, ms(400), Some(BUDGET))
            .unwrap();
        assert_eq!((change.from, change.to, change.batch), (1, 2, 32));
        assert_eq!(
            change.reason,
            MicroBatchReason::OpOverBudget {
                op_bytes: BUDGET + 1,
                budget: BUDGET
            }
        );
        assert!(
            change.to_string().contains("2 micro-batches of 16"),
            "{change}"
        );
        // At 2 the largest op fits; steps at 2 slower than the whole batch's do not go back.
        for elapsed in [2000, 900, 800, 800] {
            assert_eq!(
                split.decide(&over(0), true, ms(elapsed), Some(BUDGET)),
                None
            );
        }
        assert_eq!(split.micro_batches(), 2);
        // An op at the budget itself fits it.
        let mut split = MicroBatching::new(32, 1).unwrap();
        for _ in 0..3 {
            assert_eq!(
                split.decide(&over(BUDGET), true, ms(400), Some(BUDGET)),
                None
            );
        }
    }

    #[test]
    fn splits_while_a_planned_step_recomputes_more_than_its_forward_pass() {
        let mut split = MicroBatching::new(64, 1).unwrap();
        // Before the plan, 2.5x stays; so does the plan's first step, which compiles its
        // orders.
        assert_eq!(
            split.decide(&step(100, 250), false, ms(9000), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 250), false, ms(9000), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 150), true, ms(6000), Some(BUDGET)),
            None
        );
        // So does its second, which may still compile; its third recomputes 1.5x: split.
        assert_eq!(
            split.decide(&step(100, 150), true, ms(5000), Some(BUDGET)),
            None
        );
        let change = split
            .decide(&step(100, 150), true, ms(5000), Some(BUDGET))
            .unwrap();
        assert_eq!((change.from, change.to, change.batch), (1, 2, 64));
        assert_eq!(
            change.reason,
            MicroBatchReason::Recomputing { ratio: 1.5 },
            "{change}"
        );
        // Before the plan at 2, a step far over the limit splits at once.
        let change = split
            .decide(&step(100, 350), false, ms(8000), Some(BUDGET))
            .unwrap();
        assert_eq!((change.from, change.to), (2, 4));
        assert_eq!(split.micro_batches(), 4);
        // Four fit: a step before the plan, then the plan's; its steady steps are faster than
        // any step at 2, so the split stays.
        assert_eq!(
            split.decide(&step(100, 0), false, ms(6000), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 0), true, ms(2500), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 0), true, ms(2000), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 0), true, ms(2000), Some(BUDGET)),
            None
        );
        assert!(!split.is_settled());
        // A later planned step that recomputes again (the plan cut it worse) splits further.
        let change = split
            .decide(&step(100, 400), true, ms(5000), Some(BUDGET))
            .unwrap();
        assert_eq!((change.from, change.to), (4, 8));
    }

    #[test]
    fn a_split_is_judged_against_the_whole_batchs_settled_steps() {
        // burn-nn's TransformerEncoder at half its peak on an H200: the plan's first two steps
        // compile (1,095 and 107 ms), the later ones take 50 ms; two micro-batches of 16
        // settle at 73 ms. Judged on the second planned step, 73 ms looked faster.
        let mut split = MicroBatching::new(32, 1).unwrap();
        for (planned, elapsed) in [(false, 1749), (false, 165), (false, 104), (true, 1095)] {
            assert_eq!(
                split.decide(&step(100, 120), planned, ms(elapsed), Some(BUDGET)),
                None
            );
        }
        assert_eq!(
            split.decide(&step(100, 120), true, ms(107), Some(BUDGET)),
            None
        );
        let change = split
            .decide(&step(100, 120), true, ms(50), Some(BUDGET))
            .unwrap();
        assert_eq!(change.to, 2);
        for (planned, elapsed) in [(false, 1321), (false, 347), (false, 160), (true, 80)] {
            assert_eq!(
                split.decide(&step(100, 0), planned, ms(elapsed), Some(BUDGET)),
                None
            );
        }
        assert_eq!(
            split.decide(&step(100, 0), true, ms(76), Some(BUDGET)),
            None
        );
        let change = split
            .decide(&step(100, 0), true, ms(74), Some(BUDGET))
            .unwrap();
        assert_eq!((change.from, change.to), (2, 1));
        assert_eq!(
            change.reason,
            MicroBatchReason::Slower {
                split: ms(74),
                before: ms(50)
            }
        );
    }

    #[test]
    fn steps_before_the_plan_do_not_split_below_the_higher_limit() {
        // The reference step at a quarter of its peak: 1.5x before the plan, 1.16x under it.
        let mut split = MicroBatching::new(8, 1).unwrap();
        for _ in 0..3 {
            assert_eq!(
                split.decide(&step(100, 150), false, ms(500), Some(BUDGET)),
                None
            );
        }
        assert_eq!(split.micro_batches(), 1);
    }

    #[test]
    fn goes_back_when_the_split_step_is_slower() {
        let mut split = MicroBatching::new(8, 1).unwrap();
        assert_eq!(
            split.decide(&step(100, 50), false, ms(900), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 120), true, ms(150), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 120), true, ms(100), Some(BUDGET)),
            None
        );
        let change = split
            .decide(&step(100, 120), true, ms(110), Some(BUDGET))
            .unwrap();
        assert_eq!(change.to, 2);
        // At 2: a step before its plan, the plan's first, then its steady steps, slower than
        // the whole batch's.
        assert_eq!(
            split.decide(&step(100, 0), false, ms(400), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 0), true, ms(150), Some(BUDGET)),
            None
        );
        assert_eq!(
            split.decide(&step(100, 0), true, ms(140), Some(BUDGET)),
            None
        );
        let change = split
            .decide(&step(100, 0), true, ms(130), Some(BUDGET))
            .unwrap();
        assert_eq!((change.from, change.to), (2, 1));
        assert_eq!(
            change.reason,
            MicroBatchReason::Slower {
                split: ms(130),
                before: ms(100)
            }
        );
        assert!(change.to_string().contains("back to 1 of 8"), "{change}");
        assert!(split.is_settled());
        assert_eq!(
            split.decide(&step(100, 500), true, ms(100), Some(BUDGET)),
            None
        );
        assert_eq!(split.micro_batches(), 1);
    }

    #[test]
    fn a_planned_step_recomputing_a_third_of_its_forward_pass_tries_the_next_split() {
        // The 1.2 B GPT on an 80 GB H100 at two micro-batches of 32: 0.37x recomputed.
        let mut split = MicroBatching::new(64, 2).unwrap();
        for (planned, elapsed) in [(false, 9000), (true, 6000), (true, 4500)] {
            assert_eq!(
                split.decide(&step(100, 37), planned, ms(elapsed), Some(BUDGET)),
                None
            );
        }
        let change = split
            .decide(&step(100, 37), true, ms(4480), Some(BUDGET))
            .unwrap();
        assert_eq!((change.from, change.to), (2, 4));
        assert_eq!(change.reason, MicroBatchReason::Trying { ratio: 0.37 });
        assert!(change.to_string().contains("back if slower"), "{change}");
        // At 4 the plan recomputes 0.1x and its steady steps are faster: kept, and no further
        // trial below the ratio.
        for (planned, elapsed) in [(false, 7000), (true, 5000), (true, 4100), (true, 4000)] {
            assert_eq!(
                split.decide(&step(100, 10), planned, ms(elapsed), Some(BUDGET)),
                None
            );
        }
        for _ in 0..4 {
            assert_eq!(
                split.decide(&step(100, 10), true, ms(4000), Some(BUDGET)),
                None
            );
        }
        assert_eq!(split.micro_batches(), 4);
        assert!(!split.is_settled());

        // A trial whose steps are slower goes back for good, although the whole batch still
        // recomputes more than the trial ratio.
        let mut split = MicroBatching::new(8, 1).unwrap();
        for (planned, elapsed) in [(false, 900), (true, 150), (true, 100)] {
            assert_eq!(
                split.decide(&step(100, 50), planned, ms(elapsed), Some(BUDGET)),
                None
            );
        }
        let change = split
            .decide(&step(100, 50), true, ms(100), Some(BUDGET))
            .unwrap();
        assert_eq!(change.to, 2);
        for (planned, elapsed) in [(false, 400), (true, 150), (true, 140)] {
            assert_eq!(
                split.decide(&step(100, 40), planned, ms(elapsed), Some(BUDGET)),
                None
            );
        }
        let change = split
            .decide(&step(100, 40), true, ms(130), Some(BUDGET))
            .unwrap();
        assert_eq!((change.from, change.to), (2, 1));
        assert!(split.is_settled());
        assert_eq!(
            split.decide(&step(100, 50), true, ms(100), Some(BUDGET)),
            None
        );
        assert_eq!(split.micro_batches(), 1);
        // At or under the trial ratio the split stays.
        let mut split = MicroBatching::new(8, 1).unwrap();
        for planned in [false, true, true, true, true] {
            assert_eq!(
                split.decide(&step(100, 30), planned, ms(100), Some(BUDGET)),
                None
            );
        }
    }

    #[test]
    fn keeps_its_split_without_a_budget_or_a_smaller_micro_batch() {
        let mut split = MicroBatching::new(6, 1).unwrap();
        assert_eq!(split.decide(&step(100, 900), false, ms(10), None), None);
        assert_eq!(split.micro_batches(), 1);
        // 6 splits into 2, 3 (not twice 2) skipped, then 6; never past one item each.
        let mut split = MicroBatching::new(6, 2).unwrap();
        split
            .decide(&step(100, 900), false, ms(10), Some(BUDGET))
            .unwrap();
        assert_eq!(split.micro_batches(), 6);
        assert_eq!(
            split.decide(&step(100, 900), false, ms(10), Some(BUDGET)),
            None
        );
        assert_eq!(split.micro_batches(), 6);
        assert!(MicroBatching::new(6, 4).is_err());
        assert!(split.set_micro_batches(5).is_err());
    }

    #[test]
    fn the_ratio_falls_back_to_a_third_of_the_step_without_phases() {
        let unmarked = RematStats {
            made_cost: 300,
            recomputed_cost: 150,
            ..RematStats::default()
        };
        assert_eq!(unmarked.recompute_ratio(), 1.5);
        assert_eq!(RematStats::default().recompute_ratio(), 0.0);
    }
}
