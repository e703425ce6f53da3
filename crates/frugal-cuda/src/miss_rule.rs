//! When the growth limit gives way to misses, and when it is taken back.
//!
//! [`MissRule`] sees the marked steps and the host time of the misses after which the device
//! had run out of work (see [`crate::storage::HandleRegistry`]). Where such misses took more
//! than their share of a settled step, it raises the growth limit by an eighth. The measure can
//! overstate what the misses cost (the device may have had nothing to do for other reasons),
//! so a raise is a trial, judged against the fastest of the step it was judged on and the
//! [`BASELINE_STEPS`] settled steps before it (a raise waits for them): after it, the rule
//! skips one step (it maps the new memory) and then times [`TRIAL_STEPS`] settled steps.
//! Unless the fastest of them beats that baseline by at least half the share, the raise did
//! not pay for the memory it took: the limit goes back where it was (the registry gives the
//! cached memory above it back) and is not raised again until the limit is set anew. Raises in
//! a row, while the misses still take their share, are one trial. A step that begins unsettled
//! (the caller's plan adapts) ends the steps of the baseline, and a trial under way: its raises
//! are taken back, since what they are judged against has changed, but the new plan's misses
//! may raise the limit again.
//!
//! The allocator lifts its growth limit by itself where an allocation had to grow past it, and
//! the steps before a plan settles pass it for reasons the settled steps do not share: kernels
//! compiled and autotuned on trial buffers, the plan learned by running without it. So when a
//! settled step begins after unsettled ones, the limit goes back to where it was set (with the
//! raises of trials that paid off), and the cached memory above it is given back. A settled
//! step can still pass it once for such a reason (a kernel compiled or autotuned late, in a
//! process whose kernel cache was partial): the first time a settled step outside a trial
//! lifts the limit, it goes back where that step began, and the cached memory above it is
//! given back; that step is neither judged nor timed. Where the next settled step lifts it
//! again, the plan needs the memory, and the limit stays where it was lifted until the plan
//! changes.
//!
//! The rule is pure bookkeeping over times it is handed, so it is tested with made-up times.

use std::time::Instant;

/// The share of a marked step the misses after which the device had run out of work may take
/// before the growth limit is raised by an eighth (see
/// [`crate::storage::HandleRegistry::set_miss_time_share`]).
pub const MISS_TIME_SHARE: f64 = 0.05;

/// Settled steps timed after a raise (and the one step skipped) to see whether it paid off.
pub const TRIAL_STEPS: usize = 3;

/// Settled steps of the same plan a raise waits for before the step it is judged on; their
/// fastest, with that step, is the trial's baseline.
pub const BASELINE_STEPS: usize = 2;

/// What the registry should do with the growth limit at a step's mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Leave it.
    Keep,
    /// Raise it to `limit`: the device waited `waited_nanos` of the `step_nanos` step for misses.
    Raise {
        /// The new limit.
        limit: u64,
        /// Host time of the misses after which the device had run out of work.
        waited_nanos: u64,
        /// The step's duration.
        step_nanos: u64,
    },
    /// The raises of the trial did not make steps faster: set it back to `limit` and give the
    /// cached memory above it back.
    Revert {
        /// The limit before the trial's first raise.
        limit: u64,
        /// The fastest settled step before the trial.
        baseline_nanos: u64,
        /// The fastest of the trial's steps.
        trial_nanos: u64,
    },
    /// A step began unsettled during the trial: set the limit back to `limit` and give the
    /// cached memory above it back (what the raises were to be judged against has changed).
    Abandon {
        /// The limit before the trial's first raise.
        limit: u64,
    },
    /// A settled step begins after unsettled ones, with the limit above where the settled
    /// steps begin (the steps before passed it), or a settled step outside a trial lifted the
    /// limit for the first time under its plan: set it back to `limit` and give the cached
    /// memory above it back.
    Settle {
        /// The limit as set, with the raises of trials that paid off (after unsettled steps),
        /// or where the lifting step began.
        limit: u64,
    },
    /// The trial's steps were faster: the raises stay.
    PaidOff {
        /// The fastest settled step before the trial.
        baseline_nanos: u64,
        /// The fastest of the trial's steps.
        trial_nanos: u64,
    },
}

/// The step being timed: when it began (its mark), the misses' host time since, and whether
/// it is one to judge.
#[derive(Debug, Clone, Copy)]
struct StepMisses {
    since: Instant,
    waited_nanos: u64,
    settled: bool,
    /// Begun with raises on trial (or as the step a raise skips).
    on_trial: bool,
}

/// Raises under trial: the limit and the fastest step before the first of them, and the
/// steps timed since the last.
#[derive(Debug, Clone, Copy)]
struct Trial {
    limit_before: u64,
    baseline_nanos: u64,
    skip: usize,
    timed: usize,
    fastest_nanos: u64,
}

/// The growth limit's rule over marked steps; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct MissRule {
    share: Option<f64>,
    step: Option<StepMisses>,
    /// The durations of the last settled steps since one began unsettled (a ring).
    recent_nanos: [u64; BASELINE_STEPS],
    /// How many of `recent_nanos` hold a step, and where the next goes.
    recent_len: usize,
    recent_next: usize,
    trial: Option<Trial>,
    /// A trial did not pay off: no raise until [`Self::reset`].
    refuted: bool,
    /// Where the steps of a settled plan begin: the limit as set, with the raises of trials
    /// that paid off (`None`: no limit set).
    settled_limit: Option<u64>,
    /// The limit as the last mark left it (its verdict applied): a higher limit at the next
    /// mark was lifted by the allocator during the step.
    limit_after_mark: Option<u64>,
    /// A settled step's lift was taken back under this plan: the next one stays.
    lift_taken_back: bool,
}

impl Default for MissRule {
    fn default() -> Self {
        Self {
            share: Some(MISS_TIME_SHARE),
            step: None,
            recent_nanos: [0; BASELINE_STEPS],
            recent_len: 0,
            recent_next: 0,
            trial: None,
            refuted: false,
            settled_limit: None,
            limit_after_mark: None,
            lift_taken_back: false,
        }
    }
}

impl MissRule {
    /// Sets the share (`None`: never raise); a trial under way is dropped, its raises kept.
    pub fn set_share(&mut self, share: Option<f64>) {
        self.share = share;
        self.trial = None;
    }

    /// Forgets trials and refutations: the limit was set anew, to `limit`.
    pub fn reset(&mut self, limit: Option<u64>) {
        self.trial = None;
        self.refuted = false;
        self.recent_len = 0;
        self.settled_limit = limit;
        self.limit_after_mark = limit;
        self.lift_taken_back = false;
    }

    /// Whether a raise was taken back since the limit was last set (then none follows).
    pub fn refuted(&self) -> bool {
        self.refuted
    }

    /// Adds a miss's host time, after which the device had run out of work, to the step.
    pub fn add_wait(&mut self, nanos: u64) {
        if let Some(step) = self.step.as_mut() {
            step.waited_nanos += nanos;
        }
    }

    /// Marks a step's beginning at `now` (the end of the one before), `settled` if it repeats
    /// the ones that follow, with the growth limit at `limit`; says what to do with the limit.
    pub fn mark(&mut self, now: Instant, settled: bool, limit: Option<u64>) -> Verdict {
        let ended = self.step.replace(StepMisses {
            since: now,
            waited_nanos: 0,
            settled,
            on_trial: false,
        });
        let settling = settled && ended.is_none_or(|step| !step.settled);
        let ended = ended.filter(|step| step.settled);
        let mut verdict = Verdict::Keep;
        if settling
            && let (Some(limit), Some(settled_limit)) = (limit, self.settled_limit)
            && limit > settled_limit
        {
            verdict = Verdict::Settle {
                limit: settled_limit,
            };
        }
        let lifted_from = self.limit_after_mark.filter(|&before| {
            settled
                && ended.is_some()
                && self.trial.is_none()
                && !self.lift_taken_back
                && limit.is_some_and(|limit| limit > before)
        });
        if let Some(before) = lifted_from {
            // The step that lifted it is not timed: it compiled or autotuned, most likely.
            self.lift_taken_back = true;
            verdict = Verdict::Settle { limit: before };
        } else if let (Some(ended), Some(limit), Some(allowed)) = (ended, limit, self.share) {
            let step_nanos = (now.saturating_duration_since(ended.since).as_nanos() as u64).max(1);
            if settled {
                verdict = self.judge(ended.waited_nanos, step_nanos, limit, allowed);
                self.recent_nanos[self.recent_next] = step_nanos;
                self.recent_next = (self.recent_next + 1) % BASELINE_STEPS;
                self.recent_len = (self.recent_len + 1).min(BASELINE_STEPS);
            }
        }
        if !settled {
            self.recent_len = 0;
            self.lift_taken_back = false;
            if let Some(trial) = self.trial.take() {
                verdict = Verdict::Abandon {
                    limit: trial.limit_before,
                };
            }
        }
        self.limit_after_mark = match verdict {
            Verdict::Raise { limit, .. }
            | Verdict::Revert { limit, .. }
            | Verdict::Abandon { limit }
            | Verdict::Settle { limit } => Some(limit),
            Verdict::Keep | Verdict::PaidOff { .. } => limit,
        };
        let on_trial = self.trial.is_some();
        if let Some(step) = self.step.as_mut() {
            step.on_trial = on_trial;
        }
        verdict
    }

    /// Whether the step under way began settled with no raise on trial: a step whose
    /// reserved bytes the growth limit it began under should bound.
    pub fn step_is_settled_off_trial(&self) -> bool {
        self.step.is_some_and(|step| step.settled && !step.on_trial)
    }

    fn judge(&mut self, waited_nanos: u64, step_nanos: u64, limit: u64, allowed: f64) -> Verdict {
        let missing = waited_nanos as f64 > allowed * step_nanos as f64;
        if missing && !self.refuted && (self.trial.is_some() || self.recent_len == BASELINE_STEPS) {
            let baseline_nanos = self.recent_nanos[..self.recent_len]
                .iter()
                .copied()
                .fold(step_nanos, u64::min);
            let trial = self.trial.get_or_insert(Trial {
                limit_before: limit,
                baseline_nanos,
                skip: 0,
                timed: 0,
                fastest_nanos: u64::MAX,
            });
            trial.skip = 1;
            trial.timed = 0;
            trial.fastest_nanos = u64::MAX;
            return Verdict::Raise {
                limit: limit.saturating_add(limit / 8),
                waited_nanos,
                step_nanos,
            };
        }
        let Some(trial) = self.trial.as_mut() else {
            return Verdict::Keep;
        };
        if trial.skip > 0 {
            trial.skip -= 1;
            return Verdict::Keep;
        }
        trial.timed += 1;
        trial.fastest_nanos = trial.fastest_nanos.min(step_nanos);
        if trial.timed < TRIAL_STEPS {
            return Verdict::Keep;
        }
        let trial = self.trial.take().expect("a trial under way");
        let needed = trial.baseline_nanos as f64 * (1.0 - allowed / 2.0);
        if trial.fastest_nanos as f64 <= needed {
            self.settled_limit = Some(limit);
            Verdict::PaidOff {
                baseline_nanos: trial.baseline_nanos,
                trial_nanos: trial.fastest_nanos,
            }
        } else {
            self.refuted = true;
            Verdict::Revert {
                limit: trial.limit_before,
                baseline_nanos: trial.baseline_nanos,
                trial_nanos: trial.fastest_nanos,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: u64 = 1_000_000;
    const LIMIT: u64 = 800 * MS;

    /// A rule fed made-up steps: a clock, the limit as the verdicts leave it.
    struct Steps {
        rule: MissRule,
        now: Instant,
        limit: u64,
    }

    impl Steps {
        /// A rule whose first step (settled or not) begins now.
        fn new(rule: MissRule, settled: bool) -> Self {
            let mut steps = Self {
                rule,
                now: Instant::now(),
                limit: LIMIT,
            };
            assert_eq!(
                steps.rule.mark(steps.now, settled, Some(LIMIT)),
                Verdict::Keep
            );
            steps
        }

        /// Runs the open step for `ms`, the device waiting `waited` ms of it for misses, and
        /// begins the next one (`settled` or not); the verdict at that mark.
        fn step(&mut self, ms: u64, waited: u64, settled: bool) -> Verdict {
            self.rule.add_wait(waited * MS);
            self.now += Duration::from_millis(ms);
            let verdict = self.rule.mark(self.now, settled, Some(self.limit));
            if let Verdict::Raise { limit, .. }
            | Verdict::Revert { limit, .. }
            | Verdict::Abandon { limit }
            | Verdict::Settle { limit } = verdict
            {
                self.limit = limit;
            }
            verdict
        }

        /// Settled steps of the given (ms, waited ms).
        fn settled(&mut self, spans: &[(u64, u64)]) -> Vec<Verdict> {
            spans
                .iter()
                .map(|&(ms, waited)| self.step(ms, waited, true))
                .collect()
        }
    }

    fn raises(verdicts: &[Verdict]) -> usize {
        verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Raise { .. }))
            .count()
    }

    #[test]
    fn a_raise_after_which_steps_are_faster_stays() {
        let mut run = Steps::new(MissRule::default(), true);
        let verdicts = run.settled(&[
            (50, 1),
            (50, 1),
            (50, 10),
            (52, 0),
            (40, 0),
            (41, 0),
            (40, 0),
        ]);
        assert_eq!(raises(&verdicts), 1);
        assert_eq!(
            verdicts.last(),
            Some(&Verdict::PaidOff {
                baseline_nanos: 50 * MS,
                trial_nanos: 40 * MS
            })
        );
        assert_eq!(run.limit, LIMIT + LIMIT / 8);
    }

    #[test]
    fn a_raise_after_which_steps_are_no_faster_is_taken_back_and_not_tried_again() {
        let mut run = Steps::new(MissRule::default(), true);
        let verdicts = run.settled(&[
            (45, 0),
            (46, 0),
            (45, 4),
            (50, 0),
            (44, 0),
            (46, 0),
            (45, 0),
            (45, 5),
            (45, 5),
        ]);
        assert_eq!(raises(&verdicts), 1);
        assert_eq!(
            verdicts[6],
            Verdict::Revert {
                limit: LIMIT,
                baseline_nanos: 45 * MS,
                trial_nanos: 44 * MS
            },
            "44 ms is not 2.5% faster than 45 ms"
        );
        assert_eq!(run.limit, LIMIT);
        assert!(run.rule.refuted());
        assert_eq!(raises(&verdicts[7..]), 0, "{verdicts:?}");
        run.rule.reset(Some(run.limit));
        assert!(!run.rule.refuted());
        assert_eq!(
            raises(&run.settled(&[(45, 0), (45, 0), (45, 5)])),
            1,
            "a limit set anew may be raised again"
        );
    }

    #[test]
    fn a_raise_waits_for_settled_steps_to_judge_it_against() {
        let mut run = Steps::new(MissRule::default(), true);
        let verdicts = run.settled(&[(50, 20), (50, 20), (50, 20)]);
        assert_eq!(
            raises(&verdicts[..BASELINE_STEPS]),
            0,
            "no steps before: {verdicts:?}"
        );
        assert!(matches!(verdicts[BASELINE_STEPS], Verdict::Raise { .. }));
    }

    #[test]
    fn raises_in_a_row_are_one_trial_judged_against_the_steps_before_the_first() {
        let mut run = Steps::new(MissRule::default(), true);
        let verdicts = run.settled(&[
            (60, 0),
            (60, 0),
            (50, 20),
            (45, 15),
            (40, 10),
            (35, 0),
            (30, 0),
            (30, 0),
            (31, 0),
        ]);
        assert_eq!(raises(&verdicts), 3);
        assert_eq!(run.limit, (0..3).fold(LIMIT, |l, _| l + l / 8));
        assert_eq!(
            verdicts.last(),
            Some(&Verdict::PaidOff {
                baseline_nanos: 50 * MS,
                trial_nanos: 30 * MS
            })
        );
    }

    #[test]
    fn a_step_begun_unsettled_abandons_the_trial_and_starts_a_new_baseline() {
        let mut run = Steps::new(MissRule::default(), false);
        assert_eq!(run.step(40, 30, true), Verdict::Keep, "began unsettled");
        let verdicts = run.settled(&[(40, 0), (40, 0), (40, 10)]);
        assert!(matches!(verdicts[2], Verdict::Raise { .. }), "{verdicts:?}");
        // The plan adapts again: the raise goes, not refuted.
        assert_eq!(run.step(40, 0, false), Verdict::Abandon { limit: LIMIT });
        assert_eq!(run.limit, LIMIT);
        assert!(!run.rule.refuted());
        for _ in 0..TRIAL_STEPS {
            assert_eq!(run.step(5, 30, false), Verdict::Keep, "not judged");
        }
        assert_eq!(run.step(5, 30, true), Verdict::Keep, "began unsettled");
        // The new plan's steps are a new baseline, and may raise the limit again.
        let verdicts = run.settled(&[(40, 10), (40, 10), (40, 10)]);
        assert_eq!(raises(&verdicts[..BASELINE_STEPS]), 0, "{verdicts:?}");
        assert!(matches!(verdicts[BASELINE_STEPS], Verdict::Raise { .. }));
    }

    #[test]
    fn a_settled_step_after_unsettled_ones_takes_back_what_they_passed() {
        let mut rule = MissRule::default();
        rule.reset(Some(LIMIT));
        let mut run = Steps::new(rule, false);
        // The warm-up's allocations grew past the limit, and the allocator lifted it.
        run.limit = 3 * LIMIT;
        assert_eq!(run.step(400, 0, false), Verdict::Keep);
        assert_eq!(run.step(400, 0, true), Verdict::Settle { limit: LIMIT });
        assert_eq!(run.limit, LIMIT);
        run.step(40, 0, true);
        // A trial that paid off moves where settled steps begin.
        let verdicts = run.settled(&[(40, 0), (40, 10), (40, 0), (30, 0), (30, 0), (30, 0)]);
        assert!(
            matches!(verdicts[5], Verdict::PaidOff { .. }),
            "{verdicts:?}"
        );
        let paid = run.limit;
        run.step(40, 0, false);
        run.limit = 2 * paid;
        assert_eq!(run.step(400, 0, true), Verdict::Settle { limit: paid });
    }

    #[test]
    fn a_settled_steps_lift_is_taken_back_once_per_plan() {
        let mut rule = MissRule::default();
        rule.reset(Some(LIMIT));
        let mut run = Steps::new(rule, true);
        run.settled(&[(40, 0), (40, 0)]);
        // A kernel compiled late: the allocator lifted the limit during a settled step.
        run.limit = 2 * LIMIT;
        assert_eq!(run.step(900, 30, true), Verdict::Settle { limit: LIMIT });
        assert_eq!(
            raises(&run.settled(&[(40, 0), (40, 0)])),
            0,
            "the lifting step is not judged"
        );
        run.limit = LIMIT + 1;
        assert_eq!(
            run.step(40, 0, true),
            Verdict::Keep,
            "a second lift under the plan stays: the plan needs the memory"
        );
        assert_eq!(run.settled(&[(40, 0)]), [Verdict::Keep]);
        // A new plan may have its lift taken back again.
        run.step(400, 0, false);
        run.step(400, 0, true);
        run.limit += 1;
        assert_eq!(run.step(40, 0, true), Verdict::Settle { limit: LIMIT });
    }

    #[test]
    fn steps_on_trial_are_told_apart_from_settled_ones() {
        let mut run = Steps::new(MissRule::default(), false);
        assert!(!run.rule.step_is_settled_off_trial(), "began unsettled");
        run.step(40, 0, true);
        assert!(run.rule.step_is_settled_off_trial());
        let verdicts = run.settled(&[(40, 0), (40, 0), (40, 10)]);
        assert!(matches!(verdicts[2], Verdict::Raise { .. }), "{verdicts:?}");
        assert!(!run.rule.step_is_settled_off_trial(), "the skipped step");
        let verdicts = run.settled(&[(40, 0); 1 + TRIAL_STEPS]);
        assert!(
            matches!(verdicts[TRIAL_STEPS], Verdict::Revert { .. }),
            "{verdicts:?}"
        );
        assert!(run.rule.step_is_settled_off_trial(), "the trial is over");
    }

    #[test]
    fn without_a_share_or_a_limit_nothing_is_raised() {
        let mut rule = MissRule::default();
        rule.set_share(None);
        let mut run = Steps::new(rule, true);
        assert_eq!(raises(&run.settled(&[(40, 30), (40, 30)])), 0);
        let mut rule = MissRule::default();
        let now = Instant::now();
        rule.mark(now, true, None);
        rule.add_wait(30 * MS);
        assert_eq!(
            rule.mark(now + Duration::from_millis(40), true, None),
            Verdict::Keep
        );
    }
}
