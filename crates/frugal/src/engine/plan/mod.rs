//! The step plan: learns that training repeats one step's sequence of tensors, records when
//! each tensor is read, and predicts how soon a live tensor will be read again by looking up
//! the same tensor one step earlier.
//!
//! Training steps create the same tensors in the same order. Each managed tensor gets an
//! ordinal (its position in the sequence of managed tensors the program created) and a token
//! (its op, shape and type). A candidate period `p` is any distance at which a recent run of
//! [`GRAM`](period::GRAM) tokens repeats; it is confirmed once a whole `p` tokens equal the `p` before them,
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
//!
//! Under a budget the plan also cuts the step's forward pass into segments, as Chen et al.'s
//! checkpointing does by hand (see [`Segments`]): from one recorded step it finds where the
//! forward pass begins and ends (the lowest and highest of the bytes the step's own tensors
//! hold between their creation and last read). If that peak would not fit the budget, it cuts
//! the forward pass only where the fewest bytes cross (in a stack of blocks, the blocks'
//! boundaries, where the residual stream is the checkpoint), and sizes the segments by
//! simulating the recorded step under them (a closed segment's tensors are gone from its end
//! until the backward pass first reads one of them, then all come back): the largest segments
//! whose simulated peak fits. The ends of segments fall on the same tensors every step, so the
//! same tensors are dropped and recomputed in the same order each time. A step that
//! accumulates gradients over micro-batches runs one forward pass per micro-batch, each the
//! same sequence of tensors: the cuts found on the first are made in every one (see
//! [`forward_passes`](record::forward_passes)).
//!
//! Tensors that outlive the step (parameters, optimizer state) stay on the device unless
//! neither a selection (see [`StepRecord::select`](record::StepRecord::select)) nor segments fit without moving some of
//! them. Then the plan parks optimizer state: tensors the
//! step made for the next one that the next one first reads only after its forward pass (an
//! optimizer's moments). They go to host memory in one batch when the forward pass begins and
//! come back when the optimizer reads them: one copy each way per step, never bounced per op.
//! Of the plans that fit, a selection with each amount of state parked (the state read last
//! parked first) or segments with the least, the plan takes the one that costs a step least
//! in the cost model's terms: recomputed traffic and multiply-adds, and the parked bytes'
//! copies out and back (see [`PARK_COST_PER_BYTE`](crate::vocabulary::cost::PARK_COST_PER_BYTE)).
//! If none fits, the segments that simulate lowest.
//!
//! By role: this file holds the plan's state and what the engine asks of it (ordinals,
//! predicted reads, the chosen tensors); `period.rs` finds the step; `record.rs` reads the
//! last whole step into a [`StepRecord`](record::StepRecord); `simulation.rs` replays a
//! record under cuts; `selection.rs` chooses single tensors to recompute; `segments.rs`
//! decides the cuts, hands out their events and adapts them.

mod period;
mod record;
mod segments;
mod selection;
mod simulation;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use super::Made;
use crate::vocabulary::OpId;

use period::Candidate;
use record::OpFloor;
use segments::{SEGMENT_SHARE, Segments};
pub(crate) use selection::CHAIN_DEPTH;

/// The predicted distance of a tensor whose counterpart was not read again.
pub(crate) const NEVER: u64 = 1 << 40;

/// Reads one cell may record (a tensor read more often than this is read all the time).
const MAX_READS: usize = 64;

/// How many of a step's eviction rounds under a plan the log names the position of.
const PRESSURE_SEEN: usize = 8;

/// What the plan has learned, for [`crate::memory::remat_stats`] and the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PlanFigures {
    /// The current step length in managed tensors (0: none confirmed).
    pub(crate) period: u64,
    /// Times a confirmed step was replaced or broken.
    pub(crate) replans: u64,
    /// Segments the forward pass is cut into (0: none, the step fits or is not known).
    pub(crate) segments: u64,
    /// Bytes kept for the backward pass per segment the cuts aim at.
    pub(crate) segment_bytes: u64,
    /// The step's peak live bytes as simulated from the recorded step under the segments.
    pub(crate) estimated_peak: u64,
    /// The most bytes live when a tensor was made, over the first step made wholly under the
    /// current cuts (0: none has run yet).
    pub(crate) measured_peak: u64,
    /// Bytes of optimizer state parked in host memory for each step's forward and backward
    /// passes (0: none).
    pub(crate) parked_bytes: u64,
    /// Bytes of the forward pass's tensors dropped one by one and recomputed alone (a
    /// selection, see [`StepRecord::select`](record::StepRecord::select); 0: none, or whole segments).
    pub(crate) selected_bytes: u64,
    /// The most bytes one op of the recorded step holds at once, its inputs and output (0:
    /// not computed, the step's peak fits the budget): no eviction brings the step below it.
    pub(crate) op_floor: u64,
    /// Steps begun under cuts (segments or a selection).
    pub(crate) planned_steps: u64,
    /// Of those, steps begun under cuts that had stopped adapting: each repeats the one
    /// before, so what it costs (the allocator's misses among it) is what the run's steps cost.
    pub(crate) settled_steps: u64,
}

/// What the creation of a tensor means for the forward pass's segments: the cell layer opens
/// and closes checkpoint scopes on these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SegmentEvent {
    /// The forward pass begins: the new tensor opens the first segment, and the tensors with
    /// ordinals `park` (ascending; optimizer state the forward and backward passes do not read)
    /// go to host memory until read.
    Open { park: Vec<u64> },
    /// The new tensor, at `position` in the forward pass, begins a segment and the one before
    /// it closes. Of the forward pass's tensors so far (ordinals from `first`), those whose
    /// last read by the forward pass (`last_read`, by position) is behind are read again only
    /// by the backward pass and are evicted, to be recomputed then (again, if a read of a
    /// view restored them since an earlier cut).
    Cut {
        first: u64,
        position: u64,
        last_read: Arc<[u64]>,
        /// A selection's cut (see [`StepRecord::select`](record::StepRecord::select)): it drops only the chosen tensors
        /// (see [`StepPlan::is_chosen`]) whose last forward read is behind, and marks no
        /// checkpoints, as every chosen tensor's inputs stay. A segment's cut drops every
        /// tensor of the closed segment read only after it, and the kept ones are checkpoints
        /// (recomputing one would replay the closed segment).
        selective: bool,
    },
    /// The forward pass ends (or the plan was dropped while a segment was open): the last
    /// segment closes without evicting, as the backward pass reads it first.
    Close,
}

/// The learned step and the reads recorded under it (see the module doc).
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
    /// Bytes of each tensor in `tokens`.
    bytes: Vec<u64>,
    /// Whether each tensor in `tokens` shares the buffer of an earlier one (a view).
    shared: Vec<bool>,
    /// The op that made each tensor in `tokens`.
    ops: Vec<OpId>,
    /// The bytes each tensor in `tokens` would hold packed into booleans, if it can be (see
    /// [`crate::engine::CellInfo::packed`]).
    packed: Vec<Option<u64>>,
    /// What recomputing each tensor in `tokens` from its inputs costs per byte it holds
    /// (infinite: it cannot be recomputed alone).
    cost_per_byte: Vec<f32>,
    /// Live bytes on the device when each tensor in `tokens` was made.
    live: Vec<u64>,
    /// Whether the program has dropped each tensor in `tokens`.
    dropped: Vec<bool>,

    /// The forward pass's segments, if the budget needs them.
    segments: Option<Segments>,
    /// A segment is open (an `Open` or `Cut` was handed out and no `Close` since).
    segment_open: bool,
    /// The current step's forward pass ran under the segments.
    segmented_step: bool,
    /// The share of the room one segment may take (or a selection aims at); lowered under
    /// pressure.
    segment_share: f64,
    /// The segments and share before the last shrink, and the budget's eviction rounds in
    /// the step under them: if smaller segments evict no less, the plan goes back to exactly
    /// these cuts, whose fused kernels are compiled already (cut again from a newer record,
    /// they could differ by a segment and compile anew).
    before_shrink: Option<(Segments, f64, u64)>,
    /// The segments stopped adapting (see [`Self::adapt_segments`]).
    settled: bool,
    /// See [`PlanFigures::planned_steps`].
    planned_steps: u64,
    /// See [`PlanFigures::settled_steps`].
    settled_steps: u64,
    /// Eviction rounds the budget needed since the forward pass last began.
    pressure: u64,
    /// Positions in the step of the first [`PRESSURE_SEEN`] of those rounds, for the log.
    pressure_at: [u64; PRESSURE_SEEN],
    /// The step length and budget the segments were decided for.
    segments_for: Option<(Option<u64>, Option<u64>)>,
    /// The ordinal of the first forward pass that began under the current segments: a
    /// recorded step made before it ran under other cuts, or under none.
    segments_began: Option<u64>,
    /// A step made wholly under the current segments was measured (and compared with their
    /// simulation).
    simulation_compared: bool,
    /// See [`PlanFigures::measured_peak`].
    measured_peak: u64,
    /// The last recorded step's largest op and the budget it was compared with, when the
    /// step's peak did not fit one.
    op_floor: Option<(OpFloor, u64)>,
}

impl Default for StepPlan {
    fn default() -> Self {
        Self {
            base: 0,
            tokens: Vec::new(),
            grams: HashMap::new(),
            gram: 0,
            candidates: Vec::new(),
            period: None,
            replans: 0,
            reads: HashMap::new(),
            bytes: Vec::new(),
            ops: Vec::new(),
            packed: Vec::new(),
            shared: Vec::new(),
            cost_per_byte: Vec::new(),
            live: Vec::new(),
            dropped: Vec::new(),
            segments: None,
            segment_open: false,
            segmented_step: false,
            segment_share: SEGMENT_SHARE,
            before_shrink: None,
            settled: false,
            planned_steps: 0,
            settled_steps: 0,
            pressure: 0,
            pressure_at: [0; PRESSURE_SEEN],
            segments_for: None,
            segments_began: None,
            simulation_compared: false,
            measured_peak: 0,
            op_floor: None,
        }
    }
}

impl StepPlan {
    /// The ordinal the next created tensor gets.
    pub(crate) fn next_ordinal(&self) -> u64 {
        self.base + self.tokens.len() as u64
    }

    /// Where the program is in the learned step (the next tensor's position from the forward
    /// pass's start), if segments are cut.
    pub(crate) fn position(&self) -> Option<u64> {
        let ordinal = self.next_ordinal();
        self.segments.as_ref().map(|s| s.position(ordinal))
    }

    /// Records a new managed tensor (see [`Made`]); returns its ordinal. A tensor that shares
    /// an earlier one's buffer (`owner`) is recorded as holding no bytes of its own, and its
    /// reads are recorded as the owner's too (see [`Self::on_read`]'s callers); one with no
    /// `recompute` cost cannot be dropped and recomputed (a view, a random draw).
    pub(crate) fn on_create(&mut self, made: &Made) -> u64 {
        let &Made {
            token,
            op,
            bytes,
            live,
            recompute,
            owner,
            packed,
            ..
        } = made;
        let ordinal = self.next_ordinal();
        self.tokens.push(token);
        self.bytes.push(bytes);
        self.shared.push(owner.is_some());
        self.ops.push(op);
        self.packed.push(packed);
        self.cost_per_byte.push(match recompute {
            Some(cost) if bytes > 0 && owner.is_none() => (cost / bytes as f64) as f32,
            _ => f32::INFINITY,
        });
        self.live.push(live);
        self.dropped.push(false);
        self.update_gram(ordinal);
        self.update_candidates(ordinal, token);
        self.trim(ordinal);
        ordinal
    }

    /// The op and bytes of the tensor the program will make next, as its counterpart one
    /// step earlier (no bytes if that shared an earlier tensor's buffer: a view allocates
    /// nothing); `None` without a confirmed step.
    pub(crate) fn next_made(&self) -> Option<(OpId, u64)> {
        let period = self.period?;
        let index = self
            .next_ordinal()
            .checked_sub(period)?
            .checked_sub(self.base)? as usize;
        let bytes = match *self.shared.get(index)? {
            true => 0,
            false => *self.bytes.get(index)?,
        };
        Some((*self.ops.get(index)?, bytes))
    }

    /// Records that the program dropped the tensor with `ordinal`.
    pub(crate) fn on_drop(&mut self, ordinal: u64) {
        if let Some(dropped) = ordinal
            .checked_sub(self.base)
            .and_then(|i| self.dropped.get_mut(i as usize))
        {
            *dropped = true;
        }
    }

    /// Notes that the budget had to evict: the segments, if any, were not enough.
    pub(crate) fn note_pressure(&mut self) {
        self.count_pressure();
    }

    fn count_pressure(&mut self) {
        let ordinal = self.next_ordinal();
        let position = self.segments.as_ref().map_or(0, |s| s.position(ordinal));
        if let Some(at) = self.pressure_at.get_mut(self.pressure as usize) {
            *at = position;
        }
        self.pressure += 1;
    }

    /// Notes that the budget evicted to make room before an op. Under a selection that is
    /// pressure too: the choice was meant to leave room for every op, and what the budget
    /// evicts then by score may be recomputed at a far higher cost than the cheap tensors a
    /// lower aim would drop. Under segments, so is room made after the forward pass: a
    /// segment brought back whole did not fit beside the gradients, and what the budget
    /// evicts among its tensors is recomputed again, segment and all, when next read.
    pub(crate) fn note_room(&mut self) {
        let ordinal = self.next_ordinal();
        if self
            .segments
            .as_ref()
            .is_some_and(|s| s.selective || s.in_pass(ordinal).1 > s.end)
        {
            self.count_pressure();
        }
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

    /// Whether a forward pass under a selection is under way: its tensors need no history
    /// kept for recomputation beyond the chosen tensors' own inputs, which the program holds.
    pub(crate) fn under_selection(&self) -> bool {
        self.segment_open && self.segments.as_ref().is_some_and(|s| s.selective)
    }

    /// For the tensor just made with `ordinal`, sharing the buffer of the tensor with `owner`
    /// if it is a view: the ordinal of the chosen tensor it is dropped with (its own, or its
    /// buffer's if that was made in this forward pass and is chosen), if any.
    pub(crate) fn chosen_key(&self, ordinal: u64, owner: Option<u64>) -> Option<u64> {
        let key = owner.unwrap_or(ordinal);
        let segments = self.segments.as_ref()?;
        let since_start = segments.in_pass(ordinal).1;
        (ordinal - key <= since_start && self.is_chosen(key)).then_some(key)
    }

    /// Whether the tensor with `ordinal`, made in the current forward pass, is one a selection
    /// drops at a later cut.
    pub(crate) fn is_chosen(&self, ordinal: u64) -> bool {
        let Some(segments) = self.segments.as_ref().filter(|s| s.selective) else {
            return false;
        };
        let position = segments.in_pass(ordinal).1;
        self.segment_open
            && position < segments.end
            && segments.last_read.get(position as usize) != Some(&u64::MAX)
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
            segments: self.segments.as_ref().map_or(0, |s| s.cuts.len() as u64),
            segment_bytes: self.segments.as_ref().map_or(0, |s| s.segment_bytes),
            estimated_peak: self.segments.as_ref().map_or(0, |s| s.estimated_peak),
            measured_peak: self.measured_peak,
            parked_bytes: self.segments.as_ref().map_or(0, |s| s.parked_bytes),
            selected_bytes: self.segments.as_ref().map_or(0, |s| s.selected_bytes),
            op_floor: self.op_floor.map_or(0, |(floor, _)| floor.bytes),
            planned_steps: self.planned_steps,
            settled_steps: self.settled_steps,
        }
    }
}
