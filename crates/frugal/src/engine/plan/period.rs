//! Period detection: the learned step is the longest period at which the sequence of
//! tokens (op, shape, type) repeats unbroken (see the plan's module doc).

use super::StepPlan;

/// Length of the token run whose repetition proposes a period.
pub(super) const GRAM: u64 = 16;

/// Shortest period considered (a step creates far more tensors than this).
const MIN_PERIOD: u64 = 2 * GRAM;

/// Candidate periods tracked at once.
const MAX_CANDIDATES: usize = 8;

/// Positions always remembered, so that a step longer than a confirmed shorter period (a
/// layer repeating inside the step) can still be found.
pub(super) const WINDOW: u64 = 1 << 17;

/// A candidate period and how long its match has run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Candidate {
    period: u64,
    /// Consecutive positions at which the token equals the one `period` before.
    run: u64,
}

impl StepPlan {
    fn token_at(&self, ordinal: u64) -> Option<u64> {
        let index = ordinal.checked_sub(self.base)?;
        self.tokens.get(index as usize).copied()
    }

    pub(super) fn update_gram(&mut self, ordinal: u64) {
        let token = self.tokens[(ordinal - self.base) as usize];
        self.gram = self.gram.rotate_left(1) ^ token;
        if let Some(old) = ordinal.checked_sub(GRAM).and_then(|at| self.token_at(at)) {
            // The token leaving the window was rotated GRAM times since it entered.
            self.gram ^= old.rotate_left(GRAM as u32);
        }
    }

    pub(super) fn update_candidates(&mut self, ordinal: u64, token: u64) {
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
    pub(super) fn trim(&mut self, ordinal: u64) {
        let keep = self.period.map_or(WINDOW, |p| (3 * p).max(WINDOW));
        let start = ordinal.saturating_sub(keep);
        // Trim in chunks, so the cost is amortised.
        if start < self.base + keep.max(1024) / 4 {
            return;
        }
        let drop = (start - self.base) as usize;
        self.tokens.drain(..drop);
        self.bytes.drain(..drop);
        self.ops.drain(..drop);
        self.packed.drain(..drop);
        self.shared.drain(..drop);
        self.cost_per_byte.drain(..drop);
        self.live.drain(..drop);
        self.dropped.drain(..drop);
        self.base = start;
        self.grams.retain(|_, at| *at >= start);
        self.reads.retain(|cell, _| *cell >= start);
    }
}
