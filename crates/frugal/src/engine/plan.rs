//! The step plan: learns that training repeats one step's sequence of tensors, records when
//! each tensor is read, and predicts how soon a live tensor will be read again by looking up
//! the same tensor one step earlier.
//!
//! Training steps create the same tensors in the same order. Each managed tensor gets an
//! ordinal (its position in the sequence of managed tensors the program created) and a token
//! (its op, shape and type). A candidate period `p` is any distance at which a recent run of
//! [`GRAM`] tokens repeats; it is confirmed once a whole `p` tokens equal the `p` before them,
//! and the largest confirmed period whose match is unbroken is the step. Once a step is known,
//! the tensor with ordinal `o` is "the same" as the one with ordinal `o - p`, and its next read
//! is predicted from that tensor's recorded reads. The eviction engine then scores a tensor by
//! that predicted distance (Belady's rule, weighted by the cost of bringing it back) instead of
//! by how long it has gone unused, and its choices repeat from one step to the next, so restores
//! replay ops in the same order every step. A step that changes (new shapes, a different op
//! sequence) breaks the match: predictions stop at once and a new period is learned.
//!
//! Reads made while a restore replays recipes are not recorded (they depend on what was
//! evicted, which would make the sequence differ from step to step).

use std::collections::HashMap;

/// Length of the token run whose repetition proposes a period.
const GRAM: u64 = 16;
/// Shortest period considered (a step creates far more tensors than this).
const MIN_PERIOD: u64 = 2 * GRAM;
/// Candidate periods tracked at once.
const MAX_CANDIDATES: usize = 8;
/// Positions always remembered, so that a step longer than a confirmed shorter period (a
/// layer repeating inside the step) can still be found.
const WINDOW: u64 = 1 << 17;
/// The predicted distance of a tensor whose counterpart was not read again.
pub(crate) const NEVER: u64 = 1 << 40;
/// Reads one cell may record (a tensor read more often than this is read all the time).
const MAX_READS: usize = 64;

/// A candidate period and how long its match has run.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    period: u64,
    /// Consecutive positions at which the token equals the one `period` before.
    run: u64,
}

/// What the plan has learned, for [`crate::memory::remat_stats`] and the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PlanFigures {
    /// The current step length in managed tensors (0: none confirmed).
    pub(crate) period: u64,
    /// Times a confirmed step was replaced or broken.
    pub(crate) replans: u64,
}

/// The learned step and the reads recorded under it (see the module doc).
#[derive(Default)]
pub(crate) struct StepPlan {
    /// Ordinal of `tokens[0]`.
    base: u64,
    tokens: Vec<u64>,
    /// Most recent ordinal at which each run of `GRAM` tokens ended.
    grams: HashMap<u64, u64>,
    /// Hash of the last `GRAM` tokens, as a rolling sum of rotated tokens.
    gram: u64,
    candidates: Vec<Candidate>,
    /// The confirmed step length, if any.
    period: Option<u64>,
    replans: u64,
    /// Program reads of each cell, by ordinal: the creation position of each read.
    reads: HashMap<u64, Vec<u64>>,
}

impl StepPlan {
    /// The ordinal the next created tensor gets.
    pub(crate) fn next_ordinal(&self) -> u64 {
        self.base + self.tokens.len() as u64
    }

    /// Records a new managed tensor with `token`; returns its ordinal.
    pub(crate) fn on_create(&mut self, token: u64) -> u64 {
        let ordinal = self.next_ordinal();
        self.tokens.push(token);
        self.update_gram(ordinal);
        self.update_candidates(ordinal, token);
        self.trim(ordinal);
        ordinal
    }

    /// Records a program read of the tensor with `ordinal`, now.
    pub(crate) fn on_read(&mut self, ordinal: u64) {
        let now = self.next_ordinal();
        let reads = self.reads.entry(ordinal).or_default();
        if reads.last() != Some(&now) && reads.len() < MAX_READS {
            reads.push(now);
        }
    }

    /// How many creations from now the tensor with `ordinal` will next be read, predicted
    /// from the same tensor one step earlier; `None` without a confirmed step or a record
    /// of that tensor. A tensor whose counterpart was not read again is predicted at
    /// [`NEVER`].
    pub(crate) fn distance(&self, ordinal: u64) -> Option<u64> {
        let period = self.period?;
        let now = self.next_ordinal();
        let earlier = ordinal.checked_sub(period)?;
        if earlier < self.base {
            return None;
        }
        let then = now - period;
        let Some(reads) = self.reads.get(&earlier) else {
            return Some(NEVER);
        };
        Some(
            reads
                .iter()
                .find(|&&at| at >= then)
                .map_or(NEVER, |&at| at - then),
        )
    }

    /// Whether the tensor with `ordinal` outlives the step (parameters and optimizer state,
    /// which each step replaces by new tensors near the end of the step): its counterpart one
    /// step earlier was last read at least nine tenths of a step after it was created.
    pub(crate) fn outlives_step(&self, ordinal: u64) -> bool {
        let Some(period) = self.period else {
            return false;
        };
        let Some(earlier) = ordinal.checked_sub(period) else {
            return false;
        };
        self.reads
            .get(&earlier)
            .and_then(|reads| reads.last())
            .is_some_and(|&last| (last - earlier) * 10 >= period * 9)
    }

    /// What the plan has learned.
    pub(crate) fn figures(&self) -> PlanFigures {
        PlanFigures {
            period: self.period.unwrap_or(0),
            replans: self.replans,
        }
    }

    fn token_at(&self, ordinal: u64) -> Option<u64> {
        let index = ordinal.checked_sub(self.base)?;
        self.tokens.get(index as usize).copied()
    }

    fn update_gram(&mut self, ordinal: u64) {
        let token = self.tokens[(ordinal - self.base) as usize];
        self.gram = self.gram.rotate_left(1) ^ token;
        if let Some(old) = ordinal.checked_sub(GRAM).and_then(|at| self.token_at(at)) {
            // The token leaving the window was rotated GRAM times since it entered.
            self.gram ^= old.rotate_left(GRAM as u32);
        }
    }

    fn update_candidates(&mut self, ordinal: u64, token: u64) {
        // Extend or end each candidate's run.
        let mut i = 0;
        while i < self.candidates.len() {
            let period = self.candidates[i].period;
            let same = ordinal.checked_sub(period).and_then(|at| self.token_at(at)) == Some(token);
            if same {
                self.candidates[i].run += 1;
                i += 1;
            } else {
                self.candidates.swap_remove(i);
            }
        }
        // A repeated run of GRAM tokens proposes its distance as a period.
        if ordinal + 1 >= self.base + GRAM {
            if let Some(&previous) = self.grams.get(&self.gram) {
                let period = ordinal - previous;
                if period >= MIN_PERIOD
                    && !self.candidates.iter().any(|c| c.period == period)
                    && self.candidates.len() < MAX_CANDIDATES
                {
                    self.candidates.push(Candidate { period, run: GRAM });
                }
            }
            self.grams.insert(self.gram, ordinal);
        }
        // The step: the longest candidate matched over a whole period.
        let confirmed = self
            .candidates
            .iter()
            .filter(|c| c.run >= c.period)
            .map(|c| c.period)
            .max();
        let still = self
            .period
            .filter(|p| self.candidates.iter().any(|c| c.period == *p));
        let period = match (still, confirmed) {
            (Some(p), Some(c)) => Some(p.max(c)),
            (p, c) => p.or(c),
        };
        if period != self.period {
            if self.period.is_some() {
                self.replans += 1;
            }
            // Debug, not info: while a step is first learned, a layer repeating inside it
            // is found and dropped several times.
            log::debug!(
                "frugal: step plan: {} (at tensor {ordinal}, {} re-plans so far)",
                period.map_or("no step".into(), |p| format!("a step of {p} tensors")),
                self.replans
            );
            self.period = period;
        }
    }

    /// Forgets positions no prediction or period search can use: those more than three
    /// steps and [`WINDOW`] back.
    fn trim(&mut self, ordinal: u64) {
        let keep = self.period.map_or(WINDOW, |p| (3 * p).max(WINDOW));
        let start = ordinal.saturating_sub(keep);
        // Trim in chunks, so the cost is amortised.
        if start < self.base + keep.max(1024) / 4 {
            return;
        }
        let drop = (start - self.base) as usize;
        self.tokens.drain(..drop);
        self.base = start;
        self.grams.retain(|_, at| *at >= start);
        self.reads.retain(|cell, _| *cell >= start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of `n` distinct tokens, each read once `gap` creations later.
    fn run_steps(plan: &mut StepPlan, steps: usize, step: &[u64], gap: u64) -> Vec<u64> {
        let mut ordinals = Vec::new();
        for _ in 0..steps {
            for &token in step {
                let ordinal = plan.on_create(token);
                ordinals.push(ordinal);
                if let Some(read) = ordinal.checked_sub(gap) {
                    plan.on_read(read);
                }
            }
        }
        ordinals
    }

    #[test]
    fn a_repeated_step_is_learned_and_predicts_the_next_read() {
        let step: Vec<u64> = (0..100).map(|i| i * 7919 + 1).collect();
        let mut plan = StepPlan::default();
        run_steps(&mut plan, 1, &step, 10);
        assert_eq!(plan.figures().period, 0, "one step is not a repetition");
        run_steps(&mut plan, 2, &step, 10);
        assert_eq!(plan.figures().period, 100);
        // Reads are stamped with the next ordinal: a tensor read just after the creation
        // `gap` later is read at its ordinal + 11. The tensor with ordinal `now - 3` is
        // therefore read at `now + 8`.
        let now = plan.next_ordinal();
        assert_eq!(plan.distance(now - 3), Some(8));
    }

    #[test]
    fn a_tensor_read_until_its_successor_is_made_outlives_the_step() {
        let step: Vec<u64> = (0..100).map(|i| i * 13 + 5).collect();
        let mut plan = StepPlan::default();
        let mut param = None;
        for _ in 0..4 {
            for (i, &token) in step.iter().enumerate() {
                // The last tensor of each step is a parameter, read at the start and near the
                // end of the next step; the others are read two creations later.
                if i == 98
                    && let Some(p) = param
                {
                    plan.on_read(p);
                }
                let ordinal = plan.on_create(token);
                if i == 10
                    && let Some(p) = param
                {
                    plan.on_read(p);
                }
                if i == 99 {
                    param = Some(ordinal);
                } else if let Some(read) = ordinal.checked_sub(2) {
                    plan.on_read(read);
                }
            }
        }
        assert_eq!(plan.figures().period, 100);
        assert!(plan.outlives_step(param.unwrap()));
        assert!(!plan.outlives_step(plan.next_ordinal() - 3));
    }

    #[test]
    fn a_repeating_layer_inside_the_step_gives_way_to_the_whole_step() {
        // Twelve identical layers, then a head: the layer repeats inside a step.
        let layer: Vec<u64> = (0..40).map(|i| i + 1000).collect();
        let mut step: Vec<u64> = layer.iter().cycle().take(40 * 12).copied().collect();
        step.extend((0..50).map(|i| i + 5000));
        let mut plan = StepPlan::default();
        run_steps(&mut plan, 3, &step, 5);
        assert_eq!(plan.figures().period, step.len() as u64);
    }

    #[test]
    fn a_changed_step_stops_predictions_and_learns_again() {
        let a: Vec<u64> = (0..80).map(|i| i + 1).collect();
        let b: Vec<u64> = (0..120).map(|i| i * 3 + 100_000).collect();
        let mut plan = StepPlan::default();
        run_steps(&mut plan, 3, &a, 4);
        assert_eq!(plan.figures().period, 80);
        run_steps(&mut plan, 1, &b[..GRAM as usize], 4);
        assert_eq!(plan.figures().period, 0, "the match broke");
        assert_eq!(plan.distance(plan.next_ordinal() - 1), None);
        run_steps(&mut plan, 3, &b, 4);
        assert_eq!(plan.figures().period, 120);
        assert!(plan.figures().replans >= 1);
    }

    #[test]
    fn memory_stays_bounded_over_many_steps() {
        let step: Vec<u64> = (0..200).map(|i| i + 1).collect();
        let mut plan = StepPlan::default();
        run_steps(&mut plan, 1000, &step, 3);
        assert_eq!(plan.figures().period, 200);
        let bound = (WINDOW + WINDOW / 4 + 1) as usize;
        assert!(plan.tokens.len() <= bound, "{}", plan.tokens.len());
        assert!(plan.reads.len() <= bound, "{}", plan.reads.len());
    }
}
