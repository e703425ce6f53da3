//! Auto-fit: for a fixed effective batch and a memory limit, the micro-batch, accumulation and
//! memory policy that fit with the best measured throughput.
//!
//! Choices are read off the ledger's peak during a few probe steps, never off a device
//! out-of-memory: for the policies without a budget, the peak is measured at the two smallest
//! micro-batches and extrapolated (peak grows linearly with the micro-batch: fixed bytes for
//! parameters and optimizer state, a per-item share for activations), and only a micro-batch
//! predicted to fit is probed. A budget keeps live bytes under it after every op, but an op's
//! inputs and output are live together while it runs: a budget probe that peaks over the
//! limit is probed again with the budget lowered by the excess, and a
//! probe either completes or fails because one op alone does not fit.

use std::time::Duration;

use burn_backend::DeviceOps;

use crate::catch::catch_quietly;
use crate::memory;
use crate::precision::LowPrecision;
use crate::units::format_bytes;

/// A way to bring a step's memory down, from cheapest to dearest in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FitPolicy {
    /// Nothing: every activation is kept for the backward pass.
    Plain,
    /// The model's blocks in checkpoint scopes ([`crate::checkpoint()`]): their activations are
    /// recomputed in the backward pass. The probe applies them; Frugal cannot.
    Scopes,
    /// A budget at or just under the limit: it evicts what does not fit (recompute or
    /// offload).
    Budget,
    /// A budget as [`FitPolicy::Budget`] that may also keep evicted f32 tensors compressed in
    /// this type.
    BudgetCompressed(LowPrecision),
}

impl FitPolicy {
    /// Whether this policy sets a budget (and so keeps the peak under the limit by itself).
    pub fn uses_budget(self) -> bool {
        matches!(self, FitPolicy::Budget | FitPolicy::BudgetCompressed(_))
    }

    /// A short name, as printed.
    pub fn label(self) -> String {
        match self {
            FitPolicy::Plain => "none".into(),
            FitPolicy::Scopes => "scopes".into(),
            FitPolicy::Budget => "budget".into(),
            FitPolicy::BudgetCompressed(LowPrecision::BF16) => "budget+bf16".into(),
            FitPolicy::BudgetCompressed(LowPrecision::F16) => "budget+f16".into(),
        }
    }
}

/// One configuration to probe: `accumulation` micro-batches of `micro_batch` items per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitCandidate {
    /// Items per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per optimizer step.
    pub accumulation: usize,
    /// How memory is brought down.
    pub policy: FitPolicy,
    /// The budget the probe ran under (`None` for the policies without one).
    pub budget: Option<u64>,
}

/// What one probe runs: `steps` optimizer steps of `candidate`, one after the other, each of
/// only `micro_batches` of its micro-batches (at most two: the peak of an accumulated step is
/// reached by its second micro-batch, while the first one's gradients are held, and the time
/// of the rest is that of the ones run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitProbe {
    /// The configuration probed.
    pub candidate: FitCandidate,
    /// Optimizer steps to run; the last is timed (the first pays for kernel compilation).
    pub steps: usize,
    /// Micro-batches per probe step: the candidate's accumulation, or fewer.
    pub micro_batches: usize,
}

/// What is known of one candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum FitOutcome {
    /// Probed: the ledger's peak and the time of one whole step (after the first probe step,
    /// which pays for kernel compilation).
    Measured {
        /// Peak live tensor bytes during the probe.
        peak_bytes: u64,
        /// Time of one optimizer step: measured on the probe's micro-batches and scaled to the
        /// candidate's accumulation (which counts the optimizer update that many times over,
        /// a bias towards fewer, larger micro-batches).
        step: Duration,
    },
    /// Not probed: the peak extrapolated from smaller micro-batches is over the limit.
    Predicted {
        /// The extrapolated peak.
        peak_bytes: u64,
    },
    /// Not probed under a budget: without one, the peak extrapolated from the plain probes is
    /// more than [`AutoFit::max_oversubscription`] times the limit, so a budget would spend
    /// the step recomputing.
    Oversubscribed {
        /// The extrapolated peak without a budget.
        peak_bytes: u64,
    },
    /// The probe failed (e.g. one op alone does not fit the budget); the message says why.
    Failed(String),
}

/// A candidate and what the probes found.
#[derive(Clone, Debug, PartialEq)]
pub struct FitRow {
    /// The configuration.
    pub candidate: FitCandidate,
    /// What was measured or predicted.
    pub outcome: FitOutcome,
    /// Whether it ran within the limit.
    pub fits: bool,
}

impl FitRow {
    /// Items per second of a measured row.
    pub fn items_per_second(&self, effective_batch: usize) -> Option<f64> {
        match self.outcome {
            FitOutcome::Measured { step, .. } => {
                Some(effective_batch as f64 / step.as_secs_f64().max(1e-12))
            }
            _ => None,
        }
    }
}

/// The chosen configuration and the measurements behind the choice. `Display` prints them
/// as a table.
#[derive(Clone, Debug, PartialEq)]
pub struct FitChoice {
    /// The fastest measured configuration that fits.
    pub chosen: FitCandidate,
    /// Every configuration looked at, in the order probed.
    pub rows: Vec<FitRow>,
    /// The limit the peak had to stay under.
    pub limit: u64,
    /// The effective batch (items per optimizer step).
    pub effective_batch: usize,
}

impl std::fmt::Display for FitChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "auto-fit: effective batch {} under {}",
            self.effective_batch,
            format_bytes(self.limit)
        )?;
        write_rows(f, &self.rows, self.effective_batch, Some(self.chosen))
    }
}

/// The rows as a table, the chosen one marked.
fn write_rows(
    f: &mut std::fmt::Formatter<'_>,
    rows: &[FitRow],
    effective_batch: usize,
    chosen: Option<FitCandidate>,
) -> std::fmt::Result {
    writeln!(
        f,
        "  {:>6} {:>6} {:<12} {:>12} {:>12} {:>10} {:>12}  result",
        "micro", "accum", "policy", "budget", "peak", "step", "items/s"
    )?;
    for row in rows {
        let c = row.candidate;
        let (peak, step, rate, result) = match &row.outcome {
            FitOutcome::Measured { peak_bytes, step } => (
                format_bytes(*peak_bytes),
                format!("{:.1} ms", step.as_secs_f64() * 1e3),
                format!(
                    "{:.1}",
                    row.items_per_second(effective_batch).unwrap_or(0.0)
                ),
                if Some(c) == chosen {
                    "chosen".to_string()
                } else if row.fits {
                    "fits".to_string()
                } else {
                    "over the limit".to_string()
                },
            ),
            FitOutcome::Predicted { peak_bytes } => (
                format!("~{}", format_bytes(*peak_bytes)),
                "-".into(),
                "-".into(),
                "predicted over the limit, not run".into(),
            ),
            FitOutcome::Oversubscribed { peak_bytes } => (
                format!("~{}", format_bytes(*peak_bytes)),
                "-".into(),
                "-".into(),
                "predicted too far over the budget to recompute, not run".into(),
            ),
            FitOutcome::Failed(why) => (
                "-".into(),
                "-".into(),
                "-".into(),
                format!("failed: {}", first_line(why, 160)),
            ),
        };
        writeln!(
            f,
            "  {:>6} {:>6} {:<12} {:>12} {:>12} {:>10} {:>12}  {result}",
            c.micro_batch,
            c.accumulation,
            c.policy.label(),
            c.budget.map_or("-".to_string(), format_bytes),
            peak,
            step,
            rate
        )?;
    }
    Ok(())
}

fn first_line(text: &str, max: usize) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(max)
        .collect()
}

/// Why no configuration was chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum FitError {
    /// The request itself cannot be searched (a zero batch, no policies, a zero limit).
    Request(String),
    /// Nothing fits: every row, with what it found.
    NothingFits {
        /// The limit asked for.
        limit: u64,
        /// The effective batch asked for.
        effective_batch: usize,
        /// What each configuration tried found.
        rows: Vec<FitRow>,
    },
}

impl std::fmt::Display for FitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FitError::Request(why) => write!(f, "auto-fit: {why}"),
            FitError::NothingFits {
                limit,
                effective_batch,
                rows,
            } => {
                let smallest = rows
                    .iter()
                    .filter_map(|r| match r.outcome {
                        FitOutcome::Measured { peak_bytes, .. }
                        | FitOutcome::Predicted { peak_bytes } => Some(peak_bytes),
                        FitOutcome::Oversubscribed { .. } | FitOutcome::Failed(_) => None,
                    })
                    .min();
                writeln!(
                    f,
                    "auto-fit: none of {} configurations of an effective batch of \
                     {effective_batch} fits under {}{}; raise the limit, use a smaller model or \
                     sequence, or allow more policies",
                    rows.len(),
                    format_bytes(*limit),
                    smallest.map_or(String::new(), |b| format!(
                        " (the smallest peak seen was {})",
                        format_bytes(b)
                    ))
                )?;
                write_rows(f, rows, *effective_batch, None)
            }
        }
    }
}

impl std::error::Error for FitError {}

/// A search for the micro-batch, accumulation and policy that fit `limit` fastest. Peaks are
/// read off the ledger during probe steps, never off a device out-of-memory: without a
/// budget, the peak is measured at the two smallest micro-batches and extrapolated linearly,
/// and only micro-batches predicted to fit are probed; under a budget (set to the limit) a
/// probe either completes within it or fails because one op alone does not fit.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoFit {
    /// Items per optimizer step, kept whatever the micro-batch.
    pub effective_batch: usize,
    /// The peak live tensor bytes a configuration may reach.
    pub limit: u64,
    /// Policies to consider, cheapest first.
    pub policies: Vec<FitPolicy>,
    /// Probe steps per configuration, run one after the other; the last is timed (the first
    /// pays for compilation, and AdamW's state exists from the second on).
    pub probe_steps: usize,
    /// Micro-batches run per probe step, at most (see [`FitProbe`]).
    pub probe_micro_batches: usize,
    /// Budgeted candidates whose peak without a budget (extrapolated from the plain probes)
    /// is more than this many times the limit are not probed.
    pub max_oversubscription: f64,
    /// Share of the limit kept free when choosing a micro-batch by extrapolation, for the
    /// error of the linear fit.
    pub margin: f64,
}

impl AutoFit {
    /// A search over every policy that needs no compression, with two probe steps of at most
    /// two micro-batches, a 5% margin, and budgets not probed where the plain peak would be
    /// more than twice the limit.
    pub fn new(effective_batch: usize, limit: u64) -> Self {
        Self {
            effective_batch,
            limit,
            policies: vec![FitPolicy::Plain, FitPolicy::Scopes, FitPolicy::Budget],
            probe_steps: 2,
            probe_micro_batches: 2,
            max_oversubscription: 2.0,
            margin: 0.05,
        }
    }

    /// The same search over `policies`.
    pub fn with_policies(mut self, policies: Vec<FitPolicy>) -> Self {
        self.policies = policies;
        self
    }

    /// The same search with `steps` probe steps per configuration (at least 1).
    pub fn with_probe_steps(mut self, steps: usize) -> Self {
        self.probe_steps = steps;
        self
    }

    /// The same search running at most `micro_batches` micro-batches per probe step (at least
    /// 1; `usize::MAX` probes whole steps).
    pub fn with_probe_micro_batches(mut self, micro_batches: usize) -> Self {
        self.probe_micro_batches = micro_batches;
        self
    }

    /// Runs the search on `device`. `probe(p)` runs `p.steps` optimizer steps of
    /// `p.candidate` (each `p.micro_batches` of its micro-batches and the update), one after
    /// the other, on a throwaway copy of the model and optimizer, applying the policy's scopes
    /// or compression, drops the copies, and returns the time of the last step (the first
    /// pays for kernel compilation). Frugal sets the candidate's budget around it, reads the
    /// peak and scales the time to the whole accumulation. A probe that panics or returns an
    /// error counts as not fitting; its panic message is kept, not printed. A probe that
    /// failed in its forward pass leaves that pass's graph in burn-autodiff, with the
    /// activations it saved, until a backward pass through the parameters: the next probe
    /// should begin with [`crate::release_abandoned_graph`] (as `gpt --fit` does), or it runs
    /// beside them. Each probe's outcome is logged at debug level as it ends.
    pub fn run<D: DeviceOps + 'static>(
        &self,
        device: &D,
        mut probe: impl FnMut(&FitProbe) -> Result<Duration, String>,
    ) -> Result<FitChoice, FitError> {
        if self.effective_batch == 0 {
            return Err(FitError::Request("the effective batch is 0".into()));
        }
        if self.limit == 0 {
            return Err(FitError::Request("the memory limit is 0 bytes".into()));
        }
        if self.policies.is_empty() {
            return Err(FitError::Request("no policy to try".into()));
        }
        if self.probe_steps == 0 {
            return Err(FitError::Request("probe steps must be at least 1".into()));
        }
        if self.probe_micro_batches == 0 {
            return Err(FitError::Request(
                "micro-batches per probe step must be at least 1".into(),
            ));
        }
        let micro: Vec<usize> = (1..=self.effective_batch)
            .filter(|m| self.effective_batch.is_multiple_of(*m))
            .collect();
        let mut rows = Vec::new();
        for &policy in &self.policies {
            if policy.uses_budget() {
                let plain_peak = plain_peak_line(&rows);
                self.search_budget(device, policy, &micro, plain_peak, &mut probe, &mut rows);
            } else {
                self.search_unbudgeted(device, policy, &micro, &mut probe, &mut rows);
            }
        }
        let best = rows
            .iter()
            .filter(|row| row.fits)
            .filter_map(|row| Some((row, row.items_per_second(self.effective_batch)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(row, _)| row.candidate);
        match best {
            Some(chosen) => Ok(FitChoice {
                chosen,
                rows,
                limit: self.limit,
                effective_batch: self.effective_batch,
            }),
            None => Err(FitError::NothingFits {
                limit: self.limit,
                effective_batch: self.effective_batch,
                rows,
            }),
        }
    }

    fn candidate(&self, micro_batch: usize, policy: FitPolicy) -> FitCandidate {
        FitCandidate {
            micro_batch,
            accumulation: self.effective_batch / micro_batch,
            policy,
            budget: policy.uses_budget().then_some(self.limit),
        }
    }

    /// Measures the two smallest micro-batches, extrapolates, then measures the largest one
    /// predicted to fit, stepping down while a measurement comes out over the limit.
    fn search_unbudgeted<D: DeviceOps + 'static>(
        &self,
        device: &D,
        policy: FitPolicy,
        micro: &[usize],
        probe: &mut impl FnMut(&FitProbe) -> Result<Duration, String>,
        rows: &mut Vec<FitRow>,
    ) {
        let mut measured: Vec<(usize, u64)> = Vec::new();
        for &m in micro.iter().take(2) {
            let row = self.measure(device, self.candidate(m, policy), probe);
            if let FitOutcome::Measured { peak_bytes, .. } = row.outcome {
                measured.push((m, peak_bytes));
            }
            let fits = row.fits;
            rows.push(row);
            if !fits {
                return;
            }
        }
        let allowed = (self.limit as f64 * (1.0 - self.margin)) as u64;
        let line = PeakLine::through(&measured);
        let predict = |m: usize| -> u64 { line.map_or(u64::MAX, |line| line.at(m)) };
        let mut larger: Vec<usize> = micro.iter().skip(2).copied().collect();
        larger.reverse();
        let mut tried_fit = false;
        for m in larger {
            let predicted = predict(m);
            if predicted > allowed && !tried_fit {
                rows.push(FitRow {
                    candidate: self.candidate(m, policy),
                    outcome: FitOutcome::Predicted {
                        peak_bytes: predicted,
                    },
                    fits: false,
                });
                continue;
            }
            tried_fit = true;
            let row = self.measure(device, self.candidate(m, policy), probe);
            let fits = row.fits;
            rows.push(row);
            if fits {
                return;
            }
        }
    }

    /// Measures from the whole batch down, under a budget at the limit, until a micro-batch
    /// runs and the next smaller one is no faster. Micro-batches whose peak without a budget
    /// (`plain_peak`, when the plain probes measured it) is too far over the limit are skipped.
    fn search_budget<D: DeviceOps + 'static>(
        &self,
        device: &D,
        policy: FitPolicy,
        micro: &[usize],
        plain_peak: Option<PeakLine>,
        probe: &mut impl FnMut(&FitProbe) -> Result<Duration, String>,
        rows: &mut Vec<FitRow>,
    ) {
        let mut best: Option<f64> = None;
        let too_far = self.limit as f64 * self.max_oversubscription;
        for &m in micro.iter().rev() {
            if let Some(line) = plain_peak
                && line.at(m) as f64 > too_far
            {
                rows.push(FitRow {
                    candidate: self.candidate(m, policy),
                    outcome: FitOutcome::Oversubscribed {
                        peak_bytes: line.at(m),
                    },
                    fits: false,
                });
                continue;
            }
            let row = self.measure(device, self.candidate(m, policy), probe);
            // Ran, but an op's inputs and output together went over: again, that much lower.
            let row = match row.outcome {
                FitOutcome::Measured { peak_bytes, .. } if peak_bytes > self.limit => {
                    let lower = self.limit.saturating_sub(peak_bytes - self.limit);
                    rows.push(row);
                    if lower == 0 {
                        continue;
                    }
                    let mut candidate = self.candidate(m, policy);
                    candidate.budget = Some(lower);
                    self.measure(device, candidate, probe)
                }
                _ => row,
            };
            let rate = row
                .fits
                .then(|| row.items_per_second(self.effective_batch))
                .flatten();
            rows.push(row);
            match (best, rate) {
                (Some(b), Some(r)) if r <= b => return,
                (_, Some(r)) => best = Some(best.map_or(r, |b: f64| b.max(r))),
                (Some(_), None) => return,
                (None, None) => {}
            }
        }
    }

    /// Runs the probe under the candidate's budget (if any), reading the peak.
    fn measure<D: DeviceOps + 'static>(
        &self,
        device: &D,
        candidate: FitCandidate,
        probe: &mut impl FnMut(&FitProbe) -> Result<Duration, String>,
    ) -> FitRow {
        let budget_before = memory::budget(device);
        memory::set_budget(device, candidate.budget);
        memory::reset_peak(device);
        let run = FitProbe {
            candidate,
            steps: self.probe_steps,
            micro_batches: candidate.accumulation.min(self.probe_micro_batches),
        };
        let result = catch_quietly(|| probe(&run), || ());
        let peak_bytes = memory::peak_bytes(device);
        // The probe's copies are gone: what is left is what was there before.
        memory::set_budget(device, budget_before);
        let outcome = match result {
            Ok(Ok(step)) => {
                Ok(step.mul_f64(candidate.accumulation as f64 / run.micro_batches as f64))
            }
            Ok(Err(why)) => Err(why),
            Err(panic) => Err(panic.message()),
        };
        let row = match outcome {
            Ok(step) => FitRow {
                candidate,
                fits: peak_bytes <= self.limit,
                outcome: FitOutcome::Measured { peak_bytes, step },
            },
            Err(why) => FitRow {
                candidate,
                fits: false,
                outcome: FitOutcome::Failed(why),
            },
        };
        // The table comes at the end; a search cut short (a time limit) says this much.
        log::debug!(
            "auto-fit probe: {candidate:?}: {:?} (peak {peak_bytes} B)",
            row.outcome
        );
        row
    }
}

/// A peak linear in the micro-batch, through two measurements.
#[derive(Clone, Copy, Debug)]
struct PeakLine {
    micro_batch: usize,
    peak: f64,
    slope: f64,
}

impl PeakLine {
    /// The line through the first two `(micro-batch, peak)` points; `None` with fewer. A
    /// falling line (noise) is taken as flat.
    fn through(points: &[(usize, u64)]) -> Option<Self> {
        match points {
            [(m0, p0), (m1, p1), ..] if m1 != m0 => Some(Self {
                micro_batch: *m0,
                peak: *p0 as f64,
                slope: ((*p1 as f64 - *p0 as f64) / (*m1 as f64 - *m0 as f64)).max(0.0),
            }),
            _ => None,
        }
    }

    /// The predicted peak at micro-batch `m`.
    fn at(&self, m: usize) -> u64 {
        (self.peak + self.slope * (m as f64 - self.micro_batch as f64)).max(0.0) as u64
    }
}

/// The plain policy's peak line, from its rows measured so far.
fn plain_peak_line(rows: &[FitRow]) -> Option<PeakLine> {
    let points: Vec<(usize, u64)> = rows
        .iter()
        .filter(|row| row.candidate.policy == FitPolicy::Plain)
        .filter_map(|row| match row.outcome {
            FitOutcome::Measured { peak_bytes, .. } => {
                Some((row.candidate.micro_batch, peak_bytes))
            }
            _ => None,
        })
        .collect();
    PeakLine::through(&points)
}
