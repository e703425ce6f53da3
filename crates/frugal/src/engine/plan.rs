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
//! same tensors are dropped and recomputed in the same order each time.
//!
//! Tensors that outlive the step (parameters, optimizer state) stay on the device unless
//! neither a selection (see [`StepRecord::select`]) nor segments fit without moving some of
//! them. Then the plan parks optimizer state: tensors the
//! step made for the next one that the next one first reads only after its forward pass (an
//! optimizer's moments). They go to host memory in one batch when the forward pass begins and
//! come back when the optimizer reads them: one copy each way per step, never bounced per op.
//! The plan parks the fewest bytes (those read last first) with which a selection fits, or
//! else segments.

use std::collections::HashMap;
use std::sync::Arc;

use crate::op::OpId;

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
/// The largest share of the room under the budget (budget minus what is live when the forward
/// pass begins) that one segment's tensors kept for the backward pass may take. The cuts are
/// searched from it downwards (see [`StepRecord::simulate`]): one segment is recomputed at a
/// time in the backward pass, beside the segments' boundaries, the gradients and the backward
/// pass's temporaries.
const SEGMENT_SHARE: f64 = 1.0;
/// The ratio between two segment shares the search tries in turn.
const SEGMENT_SEARCH_STEP: f64 = 0.8;
/// How much smaller segments become when a step under the plan still needed the budget to
/// evict.
const SEGMENT_SHRINK: f64 = 0.6;
/// The smallest segment share tried: below it the boundaries alone crowd the budget.
const MIN_SEGMENT_SHARE: f64 = 1.0 / 32.0;
/// The parkable optimizer state is tried in this many equal parts (see [`StepPlan::cut_segments`]).
const PARK_STEPS: u64 = 8;
/// How much lower a selection (see [`StepRecord::select`]) aims when a step under it still
/// needed the budget to evict: it errs by a few tensors, not by whole segments.
const SELECTION_SHRINK: f64 = 0.95;
/// The share of the room under the budget a selection first aims at: the simulated step
/// counts only the program's tensors, not the buffers ops use inside.
const SELECTION_AIM: f64 = 0.95;
/// A selection whose simulated peak no choosable tensor can lower further is still taken if
/// that peak is within this share of the budget above it: the budget's own evictions cover
/// the few positions over it. Kept small: what the selection leaves over the budget is what
/// its own search could not drop, so the budget mostly offloads it, on the device's one
/// stream, at every step: beyond a few percent that costs more than recomputing segments.
const SELECTION_OVERSHOOT: f64 = 0.05;
/// How many of a step's eviction rounds under a plan the log names the position of.
const PRESSURE_SEEN: usize = 8;
/// Tensors holding less than the room under the budget divided by this are not selected: a
/// recomputation of a few bytes still costs an op.
const SELECTION_MIN_SHARE: u64 = 4096;

/// Bytes of optimizer state away in host memory from the forward pass's start until position
/// `until` of the step (where the first of them is read), for [`StepRecord::simulate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Parked {
    bytes: u64,
    until: u64,
}

impl Parked {
    const NONE: Parked = Parked { bytes: 0, until: 0 };
}

/// One way to cut the forward pass into segments, tried by [`StepPlan::cut_segments`].
struct Cutting {
    /// The step's simulated peak under it.
    peak: u64,
    /// The share of the room each segment keeps.
    share: f64,
    /// Positions where segments begin.
    cuts: Vec<u64>,
    /// See [`StepRecord::last_reads`].
    last_read: Vec<u64>,
}

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
    /// Segments the forward pass is cut into (0: none, the step fits or is not known).
    pub(crate) segments: u64,
    /// Bytes kept for the backward pass per segment the cuts aim at.
    pub(crate) segment_bytes: u64,
    /// The step's peak live bytes as simulated from the recorded step under the segments.
    pub(crate) estimated_peak: u64,
    /// Bytes of optimizer state parked in host memory for each step's forward and backward
    /// passes (0: none).
    pub(crate) parked_bytes: u64,
    /// Bytes of the forward pass's tensors dropped one by one and recomputed alone (a
    /// selection, see [`StepRecord::select`]; 0: none, or whole segments).
    pub(crate) selected_bytes: u64,
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
        /// A selection's cut (see [`StepRecord::select`]): it drops only the chosen tensors
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

/// The forward pass's segments, learned from one recorded step; positions are counted in
/// creations from the forward pass's first tensor, whose ordinal is `anchor` modulo `period`.
#[derive(Clone, Debug)]
struct Segments {
    period: u64,
    anchor: u64,
    /// Positions at which a segment begins, ascending; the first is 0.
    cuts: Vec<u64>,
    /// Position of the forward pass's end (the step's logical peak).
    end: u64,
    /// For each position before `end`: where the forward pass last reads the tensor there
    /// (0: never; `u64::MAX`: a checkpoint, read across a cut); cuts before that keep it.
    last_read: Arc<[u64]>,
    segment_bytes: u64,
    estimated_peak: u64,
    /// Positions, in the step before, of the tensors parked when the forward pass begins
    /// (see the module doc), ascending.
    park: Vec<u64>,
    parked_bytes: u64,
    /// The position the parked state is read again (the simulation's assumption).
    parked_until: u64,
    /// The cuts drop only tensors chosen one by one (see [`StepRecord::select`]), not every
    /// tensor of a closed segment that the backward pass reads.
    selective: bool,
    /// Bytes of the tensors a selection drops (0: segments).
    selected_bytes: u64,
}

impl Segments {
    fn position(&self, ordinal: u64) -> u64 {
        (ordinal % self.period + self.period - self.anchor % self.period) % self.period
    }

    /// Ordinals of the tensors to park when the forward pass begins at `ordinal`.
    fn park_at(&self, ordinal: u64) -> Vec<u64> {
        let Some(step_before) = ordinal.checked_sub(self.period) else {
            return Vec::new();
        };
        self.park.iter().map(|&q| step_before + q).collect()
    }
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
    /// Eviction rounds the budget needed since the forward pass last began.
    pressure: u64,
    /// Positions in the step of the first [`PRESSURE_SEEN`] of those rounds, for the log.
    pressure_at: [u64; PRESSURE_SEEN],
    /// The step length and budget the segments were decided for.
    segments_for: Option<(Option<u64>, Option<u64>)>,
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
            pressure: 0,
            pressure_at: [0; PRESSURE_SEEN],
            segments_for: None,
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

    /// Records a new managed tensor with `token` of `bytes`, made by `op` when `live` bytes
    /// were live on the device; returns its ordinal. `recompute`: what re-running its op
    /// alone would cost (see [`crate::op::cost::op_cost`]), if the tensor could be dropped and
    /// recomputed from its inputs (not a view, not a random draw). `owner`: the ordinal of
    /// the tensor whose buffer it shares, if any: it is recorded as holding no bytes of its
    /// own, and its reads are recorded as the owner's too (see [`Self::on_read`]'s callers).
    pub(crate) fn on_create(
        &mut self,
        token: u64,
        op: OpId,
        bytes: u64,
        live: u64,
        recompute: Option<f64>,
        owner: Option<u64>,
    ) -> u64 {
        let ordinal = self.next_ordinal();
        self.tokens.push(token);
        self.bytes.push(bytes);
        self.shared.push(owner.is_some());
        self.ops.push(op);
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
            .is_some_and(|s| s.selective || s.position(ordinal) > s.end)
        {
            self.count_pressure();
        }
    }

    /// What the creation of the tensor with `ordinal` (just recorded by [`Self::on_create`])
    /// means for the segments under a budget of `limit` (`None`: no budget, no segments).
    /// Segments are cut the first time the step is known, and again when the step or the
    /// budget changes, or when a step under the plan still needed the budget to evict.
    pub(crate) fn segment_event(
        &mut self,
        ordinal: u64,
        limit: Option<u64>,
    ) -> Option<SegmentEvent> {
        let decided_for = (self.period, limit);
        if self.segments_for != Some(decided_for) {
            self.segments_for = Some(decided_for);
            self.segment_share = SEGMENT_SHARE;
            self.settled = false;
            self.before_shrink = None;
            self.segments = limit.and_then(|limit| self.cut_segments(limit));
        }
        let Some(segments) = self.segments.as_ref() else {
            self.segmented_step = false;
            return self.close_open_segment();
        };
        let position = segments.position(ordinal);
        if position == 0 {
            if self.segmented_step && !self.settled {
                self.adapt_segments(limit);
            }
            self.pressure = 0;
            self.segmented_step = self.segments.is_some();
            let was_open = std::mem::replace(&mut self.segment_open, self.segments.is_some());
            return match (was_open, self.segments.as_ref()) {
                (_, Some(segments)) => Some(SegmentEvent::Open {
                    park: segments.park_at(ordinal),
                }),
                (true, None) => Some(SegmentEvent::Close),
                (false, None) => None,
            };
        }
        if !self.segment_open {
            return None;
        }
        if position == segments.end {
            self.segment_open = false;
            return Some(SegmentEvent::Close);
        }
        segments.cuts.binary_search(&position).ok()?;
        Some(SegmentEvent::Cut {
            first: ordinal - position,
            position,
            last_read: segments.last_read.clone(),
            selective: segments.selective,
        })
    }

    /// After a step under the segments: if the budget still had to evict, smaller segments,
    /// as long as they help; then the segments stay as they are, so that every step replays
    /// the same evictions.
    fn adapt_segments(&mut self, limit: Option<u64>) {
        let pressure = self.pressure;
        if pressure > 0 {
            log::debug!(
                "frugal: step plan: the budget evicted {pressure} times in the last step, first \
                 at positions {:?} (the forward pass ends at {})",
                &self.pressure_at[..(pressure as usize).min(PRESSURE_SEEN)],
                self.segments.as_ref().map_or(0, |s| s.end),
            );
        }
        let shrink = match self.before_shrink.take() {
            _ if pressure == 0 => false,
            _ if self.segment_share <= MIN_SEGMENT_SHARE => false,
            Some((before, share, before_pressure)) if pressure >= before_pressure => {
                // Smaller segments did not help: back to the cuts before, and stay there.
                self.segments = Some(before);
                self.segment_share = share;
                false
            }
            _ => true,
        };
        if !shrink {
            self.settled = true;
            return;
        }
        let selective = self.segments.as_ref().is_some_and(|s| s.selective);
        let shrink = match selective {
            true => SELECTION_SHRINK,
            false => SEGMENT_SHRINK,
        };
        let before = self.segment_share;
        self.segment_share = (before * shrink).max(MIN_SEGMENT_SHARE);
        log::debug!(
            "frugal: step plan: the budget still evicted {pressure} times in a step; segments \
             of {:.3} of the room",
            self.segment_share
        );
        let next = limit.and_then(|limit| self.cut_segments(limit));
        if selective && !next.as_ref().is_some_and(|s| s.selective) {
            // No selection aims lower: segments would recompute far more than the budget's
            // own evictions beside this one.
            log::debug!("frugal: step plan: no selection aims lower; the selection stays");
            self.segment_share = before;
            self.settled = true;
            return;
        }
        self.before_shrink = self
            .segments
            .take()
            .map(|segments| (segments, before, pressure));
        self.segments = next;
    }

    fn close_open_segment(&mut self) -> Option<SegmentEvent> {
        std::mem::take(&mut self.segment_open).then_some(SegmentEvent::Close)
    }

    /// Cuts the forward pass of the last fully recorded step into segments for a budget of
    /// `limit`; `None` if no step is known or its peak fits the budget.
    fn cut_segments(&mut self, limit: u64) -> Option<Segments> {
        let period = self.period?;
        let now = self.next_ordinal();
        // The older of the last two periods has every read of the next one recorded.
        let first = now
            .checked_sub(2 * period)
            .filter(|&first| first >= self.base)?;
        let p = period as usize;
        let index = |ordinal: u64| (ordinal - self.base) as usize;
        // A whole training step reads only what it made or what the step before made
        // (parameters and optimizer state); a repeating layer also reads what was made many
        // periods before it (its weights, or the activations its backward pass reads). And a
        // whole step's tensors are all dropped within a step and a half; a forward layer's
        // activations wait for the backward pass.
        let (mut recent, mut old) = (0u64, 0u64);
        for (&ordinal, reads) in &self.reads {
            let bytes = self.bytes[index(ordinal)];
            for &at in reads
                .iter()
                .filter(|&&at| at >= first && at < first + period)
            {
                match at - ordinal > period + period / 2 {
                    true => old += bytes,
                    false => recent += bytes,
                }
            }
        }
        let older = index(first)..index(first) + p / 2;
        let made: u64 = self.bytes[older.clone()].iter().sum();
        let held: u64 = older
            .filter(|&i| !self.dropped[i])
            .map(|i| self.bytes[i])
            .sum();
        if old * 50 > old + recent || held * 20 > made {
            log::debug!(
                "frugal: step plan: a period of {p} tensors is not a whole step (of the bytes \
                 it reads, {old} were made more than 1.5 periods earlier, {recent} later; {held} \
                 of the {made} bytes made in its first half are held a period later): no \
                 segments"
            );
            return None;
        }
        let last_read = |ordinal: u64| self.reads.get(&ordinal).and_then(|r| r.last()).copied();
        // Bytes the step's own tensors hold at each position of the period, up to a constant:
        // each is held from its creation to its last read, around the period's end if need be.
        let mut change = vec![0i64; p + 1];
        for i in 0..p {
            let ordinal = first + i as u64;
            let Some(last) = last_read(ordinal) else {
                continue;
            };
            let length = (last - ordinal) as usize;
            if length >= p {
                continue; // outlives the step
            }
            let bytes = self.bytes[index(ordinal)] as i64;
            change[i] += bytes;
            let end = i + length;
            if end <= p {
                change[end] -= bytes;
            } else {
                change[0] += bytes;
                change[end - p] -= bytes;
            }
        }
        let mut held = Vec::with_capacity(p);
        let mut sum = 0i64;
        for c in &change[..p] {
            sum += c;
            held.push(sum);
        }
        let peak_at = (0..p).max_by_key(|&i| (held[i], std::cmp::Reverse(i)))?;
        // The forward pass begins right after the last lowest point before the peak (the
        // optimizer's tail, where the step's own tensors are all dropped).
        let lowest = (1..=p)
            .map(|k| (peak_at + p - k) % p)
            .min_by_key(|&i| held[i])?;
        let start_at = (lowest + 1) % p;
        let anchor = first + start_at as u64;
        let base_live = self.live[index(anchor)];
        // The tensor made at the peak is the forward pass's last.
        let end = ((peak_at + p - start_at) % p) as u64 + 1;
        // Reads of the tensor at each position, as positions.
        let reads_at = |position: u64| {
            let ordinal = first + (start_at as u64 + position) % period;
            let shift = position as i64 - ordinal as i64;
            self.reads
                .get(&ordinal)
                .map(|reads| reads.iter().map(move |&r| (r as i64 + shift) as u64))
                .into_iter()
                .flatten()
        };
        let record = StepRecord {
            end,
            base_live,
            bytes: (0..period)
                .map(|position| self.bytes[index(first + (start_at as u64 + position) % period)])
                .collect(),
            reads: (0..period)
                .map(|position| reads_at(position).collect())
                .collect(),
            shared: (0..period)
                .map(|position| self.shared[index(first + (start_at as u64 + position) % period)])
                .collect(),
            cost_per_byte: (0..period)
                .map(|position| {
                    self.cost_per_byte[index(first + (start_at as u64 + position) % period)]
                })
                .collect(),
        };
        // How far the simulation was from the step the last cuts ran: where the real step
        // held more than the simulated one, the budget had to make room.
        if log::log_enabled!(log::Level::Debug)
            && let Some(old) = self.segments.as_ref().filter(|old| !old.selective)
        {
            let parked = Parked {
                bytes: old.parked_bytes,
                until: old.parked_until,
            };
            let simulated = record.simulate_curve(&old.cuts, &old.last_read, parked);
            let actual: Vec<u64> = (0..p)
                .map(|k| self.live[index(first + ((start_at + k) % p) as u64)])
                .collect();
            let excess = |k: usize| actual[k] as i64 - simulated[k];
            if let Some(worst) = (0..p).max_by_key(|&k| excess(k)) {
                log::debug!(
                    "frugal: step plan: under the last cuts ({} segments) the step held at most \
                     {} B, the simulation {} B; the real step held {} B more than simulated at \
                     position {worst} (the forward pass ends at {end})",
                    old.cuts.len(),
                    actual.iter().max().unwrap_or(&0),
                    simulated.iter().max().unwrap_or(&0),
                    excess(worst),
                );
                log::trace!(
                    "frugal: step plan: simulated / real live MiB by position: {}",
                    (0..p)
                        .step_by((p / 40).max(1))
                        .map(|k| format!("{k}:{}/{}", simulated[k] >> 20, actual[k] >> 20))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
        }
        let unsegmented = record.simulate(&[0], &[], Parked::NONE);
        if unsegmented <= limit {
            log::debug!(
                "frugal: step plan: the step's estimated peak {unsegmented} B fits the budget; \
                 no segments"
            );
            return None;
        }
        if end < 2 {
            return None;
        }
        // Bytes a cut before each position must keep: made before it, read by the forward
        // pass at or after it. Between a model's blocks that is little more than the residual
        // stream; inside attention it is several tensors.
        let mut crossing_change = vec![0i64; end as usize + 1];
        let mut saved = vec![0u64; end as usize];
        for position in 0..end {
            let reads = &record.reads[position as usize];
            if reads.iter().any(|&r| r >= end) {
                saved[position as usize] = record.bytes[position as usize];
            }
            // A read stamped `r` is made by the op that makes the tensor at `r`: a cut there
            // comes after the read in the forward pass, but recomputing that tensor reads
            // the input again, so the input crosses the cut.
            if let Some(&last) = reads.iter().filter(|&&r| r < end).max()
                && last > position
            {
                let bytes = record.bytes[position as usize] as i64;
                crossing_change[position as usize + 1] += bytes;
                crossing_change[last as usize + 1] -= bytes;
            }
        }
        let mut crossing = Vec::with_capacity(end as usize);
        let mut sum = 0i64;
        for change in &crossing_change[..end as usize] {
            sum += change;
            crossing.push(sum);
        }
        // Recomputing chosen tensors alone, cheapest per byte first, costs far less than
        // replaying whole segments: the plan if it fits.
        let room = limit.saturating_sub(record.base_live);
        let aim = SELECTION_AIM * self.segment_share;
        let target = record.base_live + (room as f64 * aim) as u64;
        let ceiling = limit.saturating_add((limit as f64 * SELECTION_OVERSHOOT) as u64);
        // Parameters and optimizer state stay unless nothing fits without moving some: then
        // the fewest bytes of optimizer state, read last first, with which a selection (or
        // else segments) fits.
        let parkable = record.parkable();
        let total: u64 = parkable.iter().map(|&(_, _, bytes)| bytes).sum();
        // The parkable state's tensors in up to `PARK_STEPS` equal parts: (tensors, bytes and
        // first read) at each level, none first.
        let mut park_levels: Vec<(usize, Parked)> = Vec::new();
        for eighth in 0..=PARK_STEPS {
            let target = total * eighth / PARK_STEPS;
            let mut count = 0;
            let mut parked = Parked::NONE;
            while parked.bytes < target {
                let (first_read, _, bytes) = parkable[count];
                parked.bytes += bytes;
                parked.until = first_read;
                count += 1;
            }
            if park_levels.last().is_none_or(|&(tried, _)| tried != count) {
                park_levels.push((count, parked));
            }
        }
        let park_list = |count: usize| {
            let mut park: Vec<u64> = parkable[..count].iter().map(|&(_, q, _)| q).collect();
            park.sort_unstable();
            park
        };
        // Larger segments keep fewer checkpoints in the forward pass but bring more back at
        // once in the backward pass: the largest share of the room whose simulated step fits
        // the budget, or else the one whose simulated peak is lowest.
        let search = |parked: Parked| {
            let room = limit.saturating_sub(record.base_live.saturating_sub(parked.bytes));
            let mut share = self.segment_share;
            let mut best: Option<Cutting> = None;
            loop {
                let segment_bytes = (room as f64 * share) as u64;
                if segment_bytes > 0 {
                    let cuts = cut_at(&saved, &crossing, end, segment_bytes);
                    let last_read = record.last_reads(&cuts);
                    let peak = record.simulate(&cuts, &last_read, parked);
                    if best.as_ref().is_none_or(|b| peak < b.peak) {
                        best = Some(Cutting {
                            peak,
                            share,
                            cuts,
                            last_read,
                        });
                    }
                    if peak <= limit {
                        break;
                    }
                }
                if share <= MIN_SEGMENT_SHARE {
                    break;
                }
                share = (share * SEGMENT_SEARCH_STEP).max(MIN_SEGMENT_SHARE);
            }
            best.map(|best| (best, room))
        };
        // At each amount of parked state, the fewest first: a selection (it recomputes far
        // less), else segments.
        let mut best: Option<(Cutting, u64, usize, Parked)> = None;
        for &(count, parked) in &park_levels {
            if let Some(selection) =
                record.select(target, ceiling, room / SELECTION_MIN_SHARE, parked)
            {
                if selection.count == 0 && count == 0 {
                    return None; // the step's exact peak fits
                }
                log::debug!(
                    "frugal: step plan: forward pass of {end} tensors, estimated peak \
                     {unsegmented} B over a budget of {limit} B: {} tensors of {} B dropped at \
                     {} cuts and recomputed alone, {} B of optimizer state ({count} tensors) \
                     parked in host memory until position {}, estimated peak {} B (aim \
                     {target} B)",
                    selection.count,
                    selection.bytes,
                    selection.cuts.len() - 1,
                    parked.bytes,
                    parked.until,
                    selection.peak,
                );
                return Some(Segments {
                    period,
                    anchor,
                    cuts: selection.cuts,
                    end,
                    last_read: selection.last_read.into(),
                    segment_bytes: 0,
                    estimated_peak: selection.peak,
                    park: park_list(count),
                    parked_bytes: parked.bytes,
                    parked_until: parked.until,
                    selective: true,
                    selected_bytes: selection.bytes,
                });
            }
            let Some((found, room)) = search(parked) else {
                continue;
            };
            let fits = found.peak <= limit;
            if best.as_ref().is_none_or(|b| found.peak < b.0.peak) {
                best = Some((found, room, count, parked));
            }
            if fits {
                break;
            }
        }
        let (
            Cutting {
                peak: estimated_peak,
                share,
                cuts,
                last_read,
            },
            room,
            count,
            parked,
        ) = best?;
        self.segment_share = share;
        let segment_bytes = (room as f64 * share) as u64;
        let park = park_list(count);
        log::debug!(
            "frugal: step plan: forward pass of {end} tensors, estimated peak {unsegmented} B \
             over a budget of {limit} B: {} segments of about {segment_bytes} B kept for the \
             backward pass, {} B of optimizer state ({count} tensors) parked in host memory \
             until position {}, estimated peak under them {estimated_peak} B",
            cuts.len(),
            parked.bytes,
            parked.until,
        );
        Some(Segments {
            period,
            anchor,
            cuts,
            end,
            last_read: last_read.into(),
            segment_bytes,
            estimated_peak,
            park,
            parked_bytes: parked.bytes,
            parked_until: parked.until,
            selective: false,
            selected_bytes: 0,
        })
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
        let since_start = segments.position(ordinal);
        (ordinal - key <= since_start && self.is_chosen(key)).then_some(key)
    }

    /// Whether the tensor with `ordinal`, made in the current forward pass, is one a selection
    /// drops at a later cut.
    pub(crate) fn is_chosen(&self, ordinal: u64) -> bool {
        let Some(segments) = self.segments.as_ref().filter(|s| s.selective) else {
            return false;
        };
        let position = segments.position(ordinal);
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
            parked_bytes: self.segments.as_ref().map_or(0, |s| s.parked_bytes),
            selected_bytes: self.segments.as_ref().map_or(0, |s| s.selected_bytes),
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
        self.bytes.drain(..drop);
        self.ops.drain(..drop);
        self.shared.drain(..drop);
        self.cost_per_byte.drain(..drop);
        self.live.drain(..drop);
        self.dropped.drain(..drop);
        self.base = start;
        self.grams.retain(|_, at| *at >= start);
        self.reads.retain(|cell, _| *cell >= start);
    }
}

/// What [`StepRecord::select`] chose.
struct Selection {
    /// Positions where chosen tensors are dropped, ascending, the first 0 (the forward pass's
    /// start, where nothing is dropped).
    cuts: Vec<u64>,
    /// For each position before the forward pass's end: the forward pass's last read of a
    /// chosen tensor (at or before the cut that drops it); `u64::MAX` for the others, kept.
    last_read: Vec<u64>,
    /// The simulated step's peak live bytes under the choice.
    peak: u64,
    /// Tensors chosen.
    count: u64,
    /// Bytes they hold.
    bytes: u64,
}

/// One recorded training step seen from its forward pass's first tensor: what the segments are
/// cut from and simulated on. Positions count creations from that tensor.
struct StepRecord {
    /// Position of the forward pass's end.
    end: u64,
    /// Live bytes on the device when the forward pass's first tensor was made.
    base_live: u64,
    /// Bytes of the tensor made at each position of the step.
    bytes: Vec<u64>,
    /// The program's reads of the tensor made at each position, as positions, ascending.
    reads: Vec<Vec<u64>>,
    /// Whether the tensor made at each position shares an earlier one's buffer (a view).
    shared: Vec<bool>,
    /// What recomputing the tensor made at each position alone costs per byte (infinite: it
    /// cannot be).
    cost_per_byte: Vec<f32>,
}

impl StepRecord {
    /// For each position before the forward pass's end: where the forward pass last reads the
    /// tensor made there (0: never; `u64::MAX`: a checkpoint, read across one of `cuts` or by
    /// the op that makes the tensor at a cut, which begins the next segment and is recomputed
    /// from it).
    fn last_reads(&self, cuts: &[u64]) -> Vec<u64> {
        (0..self.end)
            .map(|position| {
                let last = self.reads[position as usize]
                    .iter()
                    .filter(|&&r| r < self.end)
                    .max()
                    .copied()
                    .unwrap_or(0);
                match cuts.iter().find(|&&cut| cut > position) {
                    Some(&cut) if last >= cut => u64::MAX,
                    _ => last,
                }
            })
            .collect()
    }

    /// Changes, by position, of the bytes the step's own tensors hold (length: the step's
    /// plus one). A tensor the step makes and drops is held from its creation to its last
    /// read, inclusive: the op that reads it last holds it beside its output; one read in the
    /// next step (made by the optimizer's tail, read by the next forward pass) is held across
    /// the step's start. A tensor outliving the step is in `base_live`. A view holds no bytes
    /// of its own (its reads are its buffer's first tensor's too) if `exact`; otherwise it is
    /// counted as a buffer of its own, as segments are sized (see [`Self::simulate`]).
    fn lifetimes(&self, exact: bool) -> Vec<i64> {
        let p = self.bytes.len();
        let mut change = vec![0i64; p + 1];
        for (position, (&bytes, reads)) in self.bytes.iter().zip(&self.reads).enumerate() {
            if exact && self.shared[position] {
                continue;
            }
            let last = reads.last().map_or(position, |&r| r as usize);
            if last < position || last - position >= p {
                continue; // outlives the step: counted in `base_live`
            }
            let bytes = bytes as i64;
            change[position] += bytes;
            if last < p {
                change[last + 1] -= bytes;
            } else {
                change[0] += bytes;
                change[last - p + 1] -= bytes;
            }
        }
        change
    }

    /// Selective recomputation, Checkmate's problem solved greedily: which tensors of the
    /// forward pass to drop after its last read of them and recompute alone, from inputs that
    /// are still held, when the backward pass first reads them, so that the simulated step's
    /// peak is at most `target`. While the peak is over, the tensor recomputed most cheaply
    /// per byte among those held across the peak is chosen (an activation's output before a
    /// layer norm's, before a product's). A tensor is dropped as the next tensor after the
    /// forward pass's last read of it is made, and only if each of its inputs the step made
    /// is held by the program until the backward pass reads it and is not dropped itself;
    /// tensors of fewer than `min_bytes` are left. When nothing more can be chosen short of
    /// `target`, the choice so far is taken if its peak is at most `ceiling` (the budget
    /// itself: a step a little over the aim still recomputes far less than under segments);
    /// `None` otherwise. `parked` bytes are away from the step's start until their first read.
    fn select(
        &self,
        target: u64,
        ceiling: u64,
        min_bytes: u64,
        parked: Parked,
    ) -> Option<Selection> {
        let (p, end) = (self.bytes.len(), self.end as usize);
        let last_forward = |i: usize| {
            let forward = self.reads[i].iter().filter(|&&r| (r as usize) < end).max();
            forward.map_or(i as u64, |&r| r)
        };
        // A read stamped `r` was made by the op that made the tensor at `r`.
        let mut inputs: Vec<Vec<usize>> = vec![Vec::new(); end];
        for (j, reads) in self.reads[..end].iter().enumerate() {
            for &r in reads {
                if (r as usize) > j && (r as usize) < end {
                    inputs[r as usize].push(j);
                }
            }
        }
        let held_until = |j: usize| self.reads[j].last().map_or(j as u64, |&r| r);
        struct Candidate {
            position: usize,
            drop_at: u64,
            back: u64,
        }
        let mut candidates: Vec<Candidate> = (0..end)
            .filter(|&i| self.cost_per_byte[i].is_finite() && self.bytes[i] >= min_bytes.max(1))
            .filter_map(|i| {
                // Dropped as the tensor after the forward pass's last read of it is made (a
                // cut is handed out before the cell it is made for exists); a cut at the
                // forward pass's end would be its close.
                let drop_at = last_forward(i).max(i as u64) + 1;
                if drop_at >= self.end {
                    return None;
                }
                let &back = self.reads[i].iter().find(|&&r| r > drop_at)?;
                // An input the program drops before `back` stays for the recomputation, held
                // by the dropped tensor's recipe: only a small one (a row's mean) is worth it.
                inputs[i]
                    .iter()
                    .all(|&j| held_until(j) >= back || self.bytes[j] * 16 <= self.bytes[i])
                    .then_some(Candidate {
                        position: i,
                        drop_at,
                        back,
                    })
            })
            .collect();
        candidates.sort_by(|a, b| {
            let (a_cost, b_cost) = (
                self.cost_per_byte[a.position],
                self.cost_per_byte[b.position],
            );
            a_cost
                .total_cmp(&b_cost)
                .then(self.bytes[b.position].cmp(&self.bytes[a.position]))
        });
        let change = self.lifetimes(true);
        let at_start = change[0];
        let mut held = Vec::with_capacity(p);
        let mut sum = 0i64;
        for (position, c) in change[..p].iter().enumerate() {
            sum += c;
            let away = match (position as u64) < parked.until {
                true => parked.bytes as i64,
                false => 0,
            };
            held.push(sum - away);
        }
        let mut chosen = vec![false; end];
        // Inputs of a chosen tensor: recomputing it needs them, so they stay.
        let mut feeds = vec![false; end];
        let (mut count, mut bytes) = (0u64, 0u64);
        loop {
            let (at, &most) = held
                .iter()
                .enumerate()
                .max_by_key(|&(i, &h)| (h, std::cmp::Reverse(i)))?;
            let peak = self
                .base_live
                .saturating_add((most - at_start).max(0) as u64);
            let pick = candidates.iter().find(|c| {
                let i = c.position;
                !chosen[i]
                    && !feeds[i]
                    && (c.drop_at as usize) < at
                    && at < c.back as usize
                    && inputs[i].iter().all(|&j| !chosen[j])
            });
            if peak <= target || (pick.is_none() && peak <= ceiling) {
                let mut cuts = vec![0];
                cuts.extend(
                    candidates
                        .iter()
                        .filter(|c| chosen[c.position])
                        .map(|c| c.drop_at),
                );
                cuts.sort_unstable();
                cuts.dedup();
                let last_read = (0..end)
                    .map(|i| match chosen[i] {
                        true => last_forward(i),
                        false => u64::MAX,
                    })
                    .collect();
                return Some(Selection {
                    cuts,
                    last_read,
                    peak,
                    count,
                    bytes,
                });
            }
            let Some(pick) = pick else {
                log::debug!(
                    "frugal: step plan: no selection fits: {count} tensors of {bytes} B chosen, \
                     the simulated peak {peak} B at position {at} (the forward pass ends at {}) \
                     is over the ceiling {ceiling} B and no tensor held across it can be dropped",
                    self.end
                );
                return None;
            };
            let i = pick.position;
            chosen[i] = true;
            for &j in &inputs[i] {
                feeds[j] = true;
            }
            for h in &mut held[pick.drop_at as usize + 1..(pick.back as usize).min(p)] {
                *h -= self.bytes[i] as i64;
            }
            for &j in &inputs[i] {
                let kept = held_until(j) as usize + 1..(pick.back as usize).min(p);
                for h in held.get_mut(kept).into_iter().flatten() {
                    *h += self.bytes[j] as i64;
                }
            }
            count += 1;
            bytes += self.bytes[i];
        }
    }

    /// Optimizer state the step makes for the next one, which the next step first reads after
    /// its forward pass: (that read's position in the next step, position, bytes), read last
    /// first. The step itself may read it (an optimizer reads the moments it just made).
    fn parkable(&self) -> Vec<(u64, u64, u64)> {
        let p = self.bytes.len() as u64;
        let mut parkable: Vec<_> = (0..p)
            .filter_map(|position| {
                // Reads before the next step (the optimizer reading the moments it just made)
                // come before the tensor is parked.
                let reads = &self.reads[position as usize];
                let first = *reads.iter().find(|&&read| read >= p)?;
                (first >= p + self.end).then_some((
                    first - p,
                    position,
                    self.bytes[position as usize],
                ))
            })
            .collect();
        parkable.sort_unstable_by(|a, b| b.cmp(a));
        parkable
    }

    /// The step's live bytes at each position under `cuts` (`last_read` from
    /// [`Self::last_reads`]), with `parked` bytes away from its start until their first read.
    ///
    /// A tensor the step makes and drops is held from its creation to its last read,
    /// inclusive: the op that reads it last holds it beside its output. A tensor outliving the
    /// step is in `base_live`. A cut evicts every tensor made in the segment it closes that is
    /// read again only after the cut and is not a checkpoint; the segment's evicted tensors
    /// all come back at the first read of any of them, since recomputing the last of them
    /// (which the backward pass reads first) restores the chain before it; a checkpoint is
    /// held until then for every later segment that reads it. Views count as
    /// buffers of their own: a segment's restore brings back more than its tensors (the
    /// gradients made beside them), and segments sized on the exact count left the budget
    /// evicting on top of them.
    fn simulate_curve(&self, cuts: &[u64], last_read: &[u64], parked: Parked) -> Vec<i64> {
        let p = self.bytes.len();
        let mut change = self.lifetimes(false);
        let mut restore = vec![u64::MAX; cuts.len()];
        let mut evicted = Vec::new();
        for (position, &last) in last_read.iter().enumerate() {
            if last == u64::MAX {
                continue;
            }
            let Some(next) = cuts.iter().position(|&cut| cut > position as u64) else {
                continue;
            };
            let evict_at = cuts[next];
            let Some(&read) = self.reads[position].iter().find(|&&r| r > evict_at) else {
                continue;
            };
            restore[next - 1] = restore[next - 1].min(read);
            evicted.push((position, evict_at, next - 1));
        }
        for (position, evict_at, segment) in evicted {
            let (from, to) = (evict_at as usize + 1, (restore[segment] as usize).min(p));
            if from < to {
                let bytes = self.bytes[position] as i64;
                change[from] -= bytes;
                change[to] += bytes;
            }
        }
        // A checkpoint stays until the later segments that read it are restored, even if the
        // program drops it earlier: their evicted tensors are recomputed from it.
        let segment_of = |at: u64| cuts.iter().rposition(|&cut| cut <= at);
        for (position, &last) in last_read.iter().enumerate() {
            if last != u64::MAX {
                continue;
            }
            let Some(own) = segment_of(position as u64) else {
                continue;
            };
            let reads = &self.reads[position];
            let held_for = reads
                .iter()
                .filter(|&&read| read < self.end)
                .filter_map(|&read| segment_of(read).filter(|&segment| segment > own))
                .map(|segment| restore[segment])
                .filter(|&at| at != u64::MAX)
                .max();
            let program_last = reads.last().map_or(position, |&read| read as usize);
            if let Some(until) = held_for.map(|at| at as usize)
                && until > program_last
                && program_last < p
            {
                let bytes = self.bytes[position] as i64;
                change[program_last + 1] += bytes;
                change[(until + 1).min(p)] -= bytes;
            }
        }
        let at_start = change[0];
        let mut sum = 0i64;
        let mut curve = Vec::with_capacity(p);
        for (position, c) in change[..p].iter().enumerate() {
            sum += c;
            let away = match (position as u64) < parked.until {
                true => parked.bytes as i64,
                false => 0,
            };
            curve.push(self.base_live as i64 + sum - away - at_start);
        }
        curve
    }

    /// The step's peak live bytes under `cuts` (see [`Self::simulate_curve`]), at least
    /// `base_live`.
    fn simulate(&self, cuts: &[u64], last_read: &[u64], parked: Parked) -> u64 {
        let peak = self
            .simulate_curve(cuts, last_read, parked)
            .into_iter()
            .max();
        peak.map_or(self.base_live, |peak| {
            peak.max(self.base_live as i64) as u64
        })
    }
}

/// Cuts a forward pass of `end` tensors into segments that keep about `segment_bytes` each
/// for the backward pass (`saved`, by position), ending only where few bytes cross
/// (`crossing`, by position): within a quarter of the fewest that cross anywhere in the middle
/// half of the forward pass, which in a stack of blocks are the blocks' boundaries (only the
/// residual stream crosses them). A segment ends at the last such place before it would keep
/// more than `segment_bytes`, or at the first one after, if there is none before. Returns the
/// positions where segments begin, the first 0.
fn cut_at(saved: &[u64], crossing: &[i64], end: u64, segment_bytes: u64) -> Vec<u64> {
    let middle = (end / 4).max(1) as usize..(3 * end / 4).max(2) as usize;
    let fewest = crossing[middle.start..middle.end.min(crossing.len())]
        .iter()
        .copied()
        .min()
        .unwrap_or(0)
        .max(0);
    let boundary = |position: u64| crossing[position as usize] <= fewest + fewest / 4;
    log::debug!(
        "frugal: step plan: {} of {end} positions are boundaries ({fewest} B cross the fewest)",
        (1..end).filter(|&p| boundary(p)).count()
    );

    let mut cuts = vec![0u64];
    let mut from = 0u64;
    loop {
        let mut held = 0u64;
        let mut cut: Option<u64> = None;
        for position in from + 1..end {
            held += saved[position as usize - 1];
            if !boundary(position) {
                continue;
            }
            if held <= segment_bytes || cut.is_none() {
                cut = Some(position);
            }
            if held >= segment_bytes {
                break;
            }
        }
        match cut {
            Some(position) if held >= segment_bytes => {
                cuts.push(position);
                from = position;
            }
            _ => break,
        }
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The op of tensors whose op does not matter to a test.
    const OP: OpId = OpId::new(0);

    /// A step of `n` distinct tokens, each read once `gap` creations later.
    fn run_steps(plan: &mut StepPlan, steps: usize, step: &[u64], gap: u64) -> Vec<u64> {
        let mut ordinals = Vec::new();
        for _ in 0..steps {
            for &token in step {
                let ordinal = plan.on_create(token, OP, 4, 0, None, None);
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
    fn the_learned_step_tells_the_op_and_bytes_of_the_next_tensor() {
        let step: Vec<u64> = (0..100).map(|i| i * 7919 + 1).collect();
        let mut plan = StepPlan::default();
        let create = |plan: &mut StepPlan, tokens: &[u64]| {
            for (i, &token) in tokens.iter().enumerate() {
                let ordinal =
                    plan.on_create(token, OpId::new(i as u16), 100 + i as u64, 0, None, None);
                if let Some(read) = ordinal.checked_sub(10) {
                    plan.on_read(read);
                }
            }
        };
        create(&mut plan, &step);
        assert_eq!(plan.next_made(), None, "no step learned yet");
        create(&mut plan, &step);
        create(&mut plan, &step);
        assert_eq!(plan.figures().period, 100);
        assert_eq!(
            plan.next_made(),
            Some((OpId::new(0), 100)),
            "the step's first tensor comes next"
        );
        create(&mut plan, &step[..4]);
        assert_eq!(plan.next_made(), Some((OpId::new(4), 104)));
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
                let ordinal = plan.on_create(token, OP, 4, 0, None, None);
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

    /// A toy training step: `layers` layers of `width` tensors of 100 bytes each in the
    /// forward pass (each read by the next, and once more by the backward pass), the backward
    /// pass in reverse, then one new 10-byte parameter per layer replacing the old one. Every
    /// tensor is dropped after its last read. Returns the segment events of each step, by
    /// position in the step.
    fn training_steps(
        plan: &mut StepPlan,
        steps: usize,
        layers: usize,
        width: usize,
        limit: Option<u64>,
    ) -> Vec<Vec<(usize, SegmentEvent)>> {
        training_steps_with_state(plan, steps, layers, width, limit, 0, &mut Vec::new())
    }

    /// As [`training_steps`], with optimizer state: after each layer's new parameter, a new
    /// state tensor of `state_bytes` (if not 0) replacing the old one, which only this tail of
    /// the step reads. The ordinals of the state tensors are pushed to `states`.
    fn training_steps_with_state(
        plan: &mut StepPlan,
        steps: usize,
        layers: usize,
        width: usize,
        limit: Option<u64>,
        state_bytes: u64,
        states: &mut Vec<u64>,
    ) -> Vec<Vec<(usize, SegmentEvent)>> {
        let steps = vec![StepNoise::default(); steps];
        training_steps_under(plan, &steps, layers, width, limit, state_bytes, states)
    }

    /// What the budget did in one step of [`training_steps_under`].
    #[derive(Clone, Copy, Default)]
    struct StepNoise {
        /// Eviction rounds the budget needed, noted at the step's end.
        pressure: u64,
        /// Bytes live on the device beside the step's own for the whole step (the runtime's
        /// or another tensor's), which the record sees in its live bytes.
        other_live: u64,
    }

    /// As [`training_steps_with_state`], one step per entry of `steps`.
    fn training_steps_under(
        plan: &mut StepPlan,
        steps: &[StepNoise],
        layers: usize,
        width: usize,
        limit: Option<u64>,
        state_bytes: u64,
        states: &mut Vec<u64>,
    ) -> Vec<Vec<(usize, SegmentEvent)>> {
        let mut live = 0u64;
        let mut state: Vec<Option<u64>> = vec![None; layers];
        let mut params: Vec<Option<u64>> = vec![None; layers];
        let mut all = Vec::new();
        for noise in steps {
            live += noise.other_live;
            let mut events = Vec::new();
            let mut position = 0usize;
            let mut create = |plan: &mut StepPlan, token: u64, bytes: u64, live: &mut u64| {
                *live += bytes;
                let ordinal = plan.on_create(token, OP, bytes, *live, None, None);
                if let Some(event) = plan.segment_event(ordinal, limit) {
                    events.push((position, event));
                }
                position += 1;
                ordinal
            };
            let mut saved = vec![Vec::new(); layers];
            let mut previous: Option<u64> = None;
            for (layer, kept) in saved.iter_mut().enumerate() {
                for j in 0..width {
                    if let Some(p) = previous {
                        plan.on_read(p);
                    }
                    if j == 0
                        && let Some(p) = params[layer]
                    {
                        plan.on_read(p);
                    }
                    let t = create(plan, (layer * width + j) as u64 + 1, 100, &mut live);
                    kept.push(t);
                    previous = Some(t);
                }
            }
            let mut grad: Option<u64> = None;
            for layer in (0..layers).rev() {
                for (j, &t) in saved[layer].iter().enumerate().rev() {
                    plan.on_read(t);
                    if let Some(g) = grad {
                        plan.on_read(g);
                        plan.on_drop(g);
                        live -= 100;
                    }
                    plan.on_drop(t);
                    live -= 100;
                    let token = (10_000 + layer * width + j) as u64;
                    grad = Some(create(plan, token, 100, &mut live));
                }
            }
            for (param, state) in params.iter_mut().zip(&mut state) {
                if let Some(s) = *state {
                    plan.on_read(s);
                    plan.on_drop(s);
                    live -= state_bytes;
                }
                if let Some(p) = *param {
                    plan.on_read(p);
                    plan.on_drop(p);
                    live -= 10;
                }
                *param = Some(create(plan, 20_000, 10, &mut live));
                if state_bytes > 0 {
                    let s = create(plan, 30_000, state_bytes, &mut live);
                    states.push(s);
                    *state = Some(s);
                }
            }
            if let Some(g) = grad {
                plan.on_drop(g);
                live -= 100;
            }
            for _ in 0..noise.pressure {
                plan.note_pressure();
            }
            live -= noise.other_live;
            all.push(events);
        }
        all
    }

    #[test]
    fn a_forward_pass_over_the_budget_is_cut_into_the_same_segments_every_step() {
        let (layers, width) = (8, 10);
        let mut plan = StepPlan::default();
        let steps = training_steps(&mut plan, 6, layers, width, Some(4_000));
        assert_eq!(plan.figures().period, (2 * layers * width + layers) as u64);
        let figures = plan.figures();
        assert!(figures.segments >= 2, "{figures:?}");
        let last = &steps[5];
        assert_eq!(
            last.first(),
            Some(&(0, SegmentEvent::Open { park: Vec::new() })),
            "{last:?}"
        );
        assert_eq!(
            last.last(),
            Some(&(layers * width, SegmentEvent::Close)),
            "the forward pass ends at the step's peak: {last:?}"
        );
        let cuts: Vec<usize> = last
            .iter()
            .filter(|(_, e)| matches!(e, SegmentEvent::Cut { .. }))
            .map(|(at, _)| *at)
            .collect();
        assert_eq!(cuts.len() as u64, figures.segments - 1);
        // The same cuts in the step before.
        let before: Vec<usize> = steps[4]
            .iter()
            .filter(|(_, e)| matches!(e, SegmentEvent::Cut { .. }))
            .map(|(at, _)| *at)
            .collect();
        assert_eq!(cuts, before);
        // Each segment keeps at most the bytes the cuts aim at, and at least half of them.
        let mut bounds = vec![0];
        bounds.extend(&cuts);
        for pair in bounds.windows(2) {
            let bytes = (pair[1] - pair[0]) as u64 * 100;
            assert!(bytes <= figures.segment_bytes, "{bytes} {figures:?}");
            assert!(2 * bytes >= figures.segment_bytes, "{bytes} {figures:?}");
        }
        // A cut evicts what the forward pass read before it, but keeps its checkpoints and
        // what the next op reads.
        let Some((
            at,
            SegmentEvent::Cut {
                position,
                last_read,
                ..
            },
        )) = last
            .iter()
            .find(|(_, e)| matches!(e, SegmentEvent::Cut { .. }))
        else {
            unreachable!()
        };
        assert_eq!(*position as usize, *at);
        // In this chain each tensor is read only by the next op (and the backward pass): the
        // one before the cut was read by the op that made the cut's tensor, which will be
        // recomputed from it, so it is the segment's checkpoint; the one before that is
        // evicted.
        assert_eq!(last_read[at - 1], u64::MAX);
        assert_eq!(last_read[at - 2], *position - 1);
    }

    #[test]
    fn smaller_segments_that_evict_no_less_give_way_to_the_very_cuts_before_them() {
        let (layers, width, limit) = (8, 10, 4_000);
        let cuts_of = |events: &[(usize, SegmentEvent)]| -> Vec<usize> {
            let cuts = events
                .iter()
                .filter(|(_, e)| matches!(e, SegmentEvent::Cut { .. }));
            cuts.map(|(at, _)| *at).collect()
        };
        // Without pressure: the step under the first segments.
        let quiet = training_steps(&mut StepPlan::default(), 8, layers, width, Some(limit));
        let first = quiet.iter().position(|e| !e.is_empty()).unwrap();
        // The budget evicts in that step, so the segments shrink; under the smaller ones it
        // evicts more, with more bytes live beside the step: back to the first cuts, not to
        // cuts made anew from the newer record.
        let mut noise = vec![StepNoise::default(); first + 5];
        noise[first].pressure = 3;
        noise[first + 1] = StepNoise {
            pressure: 5,
            other_live: 600,
        };
        let mut plan = StepPlan::default();
        let steps = training_steps_under(
            &mut plan,
            &noise,
            layers,
            width,
            Some(limit),
            0,
            &mut Vec::new(),
        );
        let (before, smaller) = (cuts_of(&steps[first]), cuts_of(&steps[first + 1]));
        assert!(smaller.len() > before.len(), "{before:?} {smaller:?}");
        for later in &steps[first + 2..] {
            assert_eq!(cuts_of(later), before);
        }
    }

    #[test]
    fn a_step_that_fits_or_no_budget_gets_no_segments() {
        let mut plan = StepPlan::default();
        let steps = training_steps(&mut plan, 5, 8, 10, Some(1 << 30));
        assert!(steps.iter().all(|events| events.is_empty()));
        assert_eq!(plan.figures().segments, 0);
        let mut plan = StepPlan::default();
        let steps = training_steps(&mut plan, 5, 8, 10, None);
        assert!(steps.iter().all(|events| events.is_empty()));
    }

    #[test]
    fn segments_follow_a_changed_step() {
        let mut plan = StepPlan::default();
        training_steps(&mut plan, 5, 8, 10, Some(4_000));
        let before = plan.figures();
        assert!(before.segments > 0);
        // Wider layers: the step changes, the segments go, and come back cut for it.
        let steps = training_steps(&mut plan, 6, 8, 14, Some(5_000));
        let after = plan.figures();
        assert_eq!(after.period, 2 * 8 * 14 + 8);
        assert!(after.segments > 0, "{after:?}");
        assert_eq!(
            steps[5].first(),
            Some(&(0, SegmentEvent::Open { park: Vec::new() }))
        );
        assert_eq!(steps[5].last(), Some(&(8 * 14, SegmentEvent::Close)));
    }

    #[test]
    fn the_simulated_step_drops_a_closed_segment_until_its_first_backward_read() {
        // A forward chain of four 10-byte tensors, each read by the next and once by the
        // backward pass (in reverse), then four backward tensors.
        let record = StepRecord {
            end: 4,
            base_live: 10,
            bytes: vec![10; 8],
            reads: vec![
                vec![1, 7],
                vec![2, 6],
                vec![3, 5],
                vec![4],
                vec![5],
                vec![6],
                vec![7],
                vec![],
            ],
            shared: vec![false; 8],
            cost_per_byte: vec![f32::INFINITY; 8],
        };
        // Held from creation to last read, inclusive: five tensors at positions 4 and 5.
        assert_eq!(record.simulate(&[0], &[], Parked::NONE), 50);
        // A cut at 2: the second tensor is read by the op that makes the third, which begins
        // the next segment, so it is a checkpoint; the first is evicted from position 3 until
        // the backward pass reads it, at 7.
        let cuts = [0, 2];
        let last_read = record.last_reads(&cuts);
        assert_eq!(last_read, vec![1, u64::MAX, 3, 0]);
        assert_eq!(record.simulate(&cuts, &last_read, Parked::NONE), 40);
        // Read across the cut as well, the first tensor is a checkpoint too and stays.
        let mut reads = record.reads.clone();
        reads[0] = vec![1, 3, 7];
        let record = StepRecord { reads, ..record };
        let last_read = record.last_reads(&cuts);
        assert_eq!(last_read[..2], [u64::MAX, u64::MAX]);
        assert_eq!(record.simulate(&cuts, &last_read, Parked::NONE), 50);
    }

    #[test]
    fn the_simulated_step_holds_a_dropped_checkpoint_until_the_segment_after_it_comes_back() {
        // A forward chain of five 10-byte tensors cut into three segments at 2 and 4. The
        // second (1) is read only by the third (2), which begins the second segment: a
        // checkpoint the program drops at once. The backward pass (5..) reads the third at 8.
        let record = StepRecord {
            end: 5,
            base_live: 0,
            bytes: vec![10; 10],
            reads: vec![
                vec![1, 9],
                vec![2],
                vec![3, 8],
                vec![4, 7],
                vec![5],
                vec![6],
                vec![7],
                vec![8],
                vec![9],
                vec![],
            ],
            shared: vec![false; 10],
            cost_per_byte: vec![f32::INFINITY; 10],
        };
        let cuts = [0, 2, 4];
        let last_read = record.last_reads(&cuts);
        assert_eq!(last_read[1], u64::MAX);
        let curve = record.simulate_curve(&cuts, &last_read, Parked::NONE);
        // The curve counts from the step's start (the first tensor, read again at its end).
        // The third tensor is evicted from position 5 until 8, when the backward pass
        // recomputes it from the checkpoint, which is held from its creation until then
        // (dropped at its last read, position 2, it would leave 10 bytes less at 3 to 8).
        assert_eq!(curve, vec![0, 10, 20, 20, 30, 30, 30, 30, 30, 20]);
        assert_eq!(record.simulate(&cuts, &last_read, Parked::NONE), 30);
    }

    #[test]
    fn a_selection_drops_the_cheapest_tensor_held_across_the_peak() {
        // Forward: x (0) -> a (1, cheap) -> b (2, a product of a) -> c (3) -> d (4); the
        // backward pass (5..) reads b at 6, a at 7, x at 8.
        let record = |costs: [f32; 2]| StepRecord {
            end: 5,
            base_live: 0,
            bytes: vec![10, 40, 40, 10, 10, 10, 10, 10, 10],
            reads: vec![
                vec![1, 8],
                vec![2, 7],
                vec![3, 6],
                vec![4],
                vec![5],
                vec![6],
                vec![7],
                vec![8],
                vec![],
            ],
            shared: vec![false; 9],
            cost_per_byte: [f32::INFINITY, costs[0], costs[1]]
                .into_iter()
                .chain([f32::INFINITY; 6])
                .collect(),
        };
        // Held from the step's start: 100 bytes at positions 4 to 6 (all of x, a, b).
        let cheap_a = record([2.0, 20.0]);
        assert_eq!(
            cheap_a.select(100, 100, 0, Parked::NONE).map(|s| s.count),
            Some(0)
        );
        let chosen = cheap_a.select(95, 95, 0, Parked::NONE).expect("a fits");
        assert_eq!((chosen.count, chosen.bytes, chosen.peak), (1, 40, 90));
        // `a` goes as `c` is made, after `b` (made at 2) read it; back when the backward
        // pass reads it.
        assert_eq!(chosen.cuts, vec![0, 3]);
        assert_eq!(chosen.last_read[1], 2);
        assert!(
            chosen
                .last_read
                .iter()
                .enumerate()
                .all(|(i, &l)| i == 1 || l == u64::MAX)
        );
        // Position 3 still holds x, a, b and c: nothing held across it can be dropped
        // before it, and `b` may not go beside `a`, its dropped input.
        assert!(cheap_a.select(85, 85, 0, Parked::NONE).is_none());
        // Short of the aim but within the ceiling, the choice that got lowest is taken.
        let short = cheap_a
            .select(85, 90, 0, Parked::NONE)
            .expect("within the ceiling");
        assert_eq!((short.count, short.peak), (1, 90));
        // A cheaper `b` is no help: it goes only as `d` is made (position 4, the peak's
        // first position), so `a` goes all the same.
        let cheap_b = record([30.0, 2.0]);
        let chosen = cheap_b.select(95, 95, 0, Parked::NONE).expect("a fits");
        assert_eq!(chosen.cuts, vec![0, 3]);
        assert_eq!((chosen.last_read[1], chosen.last_read[2]), (2, u64::MAX));
        // Too small to be worth an op.
        assert!(cheap_a.select(95, 95, 41, Parked::NONE).is_none());
        // Optimizer state parked across the peak lowers it by its bytes; back before the
        // peak (position 3, once `a` is chosen) it does not.
        let across = Parked {
            bytes: 10,
            until: 9,
        };
        let parked = cheap_a
            .select(85, 85, 0, across)
            .expect("fits with 10 B away");
        assert_eq!((parked.count, parked.peak), (1, 80));
        let before = Parked {
            bytes: 10,
            until: 3,
        };
        assert!(cheap_a.select(85, 85, 0, before).is_none());
    }

    #[test]
    fn the_segments_are_the_largest_whose_simulated_step_fits() {
        // 80 forward tensors of 100 bytes under a budget of 4,000: segments of the whole
        // room (39 tensors) would bring 3,900 bytes back at once beside the gradients and
        // parameters; the next share (31 tensors) fits.
        let (layers, width) = (8, 10);
        let mut plan = StepPlan::default();
        training_steps(&mut plan, 6, layers, width, Some(4_000));
        let figures = plan.figures();
        assert!(figures.segments >= 2, "{figures:?}");
        assert!(figures.estimated_peak <= 4_000, "{figures:?}");
        assert!(figures.estimated_peak > 3_000, "{figures:?}");
        assert_eq!(plan.segment_share, SEGMENT_SHARE * SEGMENT_SEARCH_STEP);
    }

    #[test]
    fn optimizer_state_is_parked_only_when_no_segments_fit_without_it() {
        let (layers, width) = (8, 10);
        // 3,200 bytes of optimizer state: under 8,000 the segments fit beside it, under
        // 4,000 they do not, and the plan parks some of it for the forward and backward
        // passes.
        let mut plan = StepPlan::default();
        let mut states = Vec::new();
        training_steps_with_state(&mut plan, 6, layers, width, Some(8_000), 400, &mut states);
        let roomy = plan.figures();
        assert!(roomy.segments >= 2, "{roomy:?}");
        assert_eq!(roomy.parked_bytes, 0, "{roomy:?}");

        let mut plan = StepPlan::default();
        let mut states = Vec::new();
        let steps =
            training_steps_with_state(&mut plan, 6, layers, width, Some(4_000), 400, &mut states);
        let tight = plan.figures();
        assert!(tight.parked_bytes > 0, "{tight:?}");
        assert!(
            tight.parked_bytes < 8 * 400,
            "the fewest bytes that fit: {tight:?}"
        );
        assert!(tight.estimated_peak <= 4_000, "{tight:?}");
        // The forward pass's start (here the newest state tensor, after which the step's own
        // tensors are all gone) names state the step before made that the next step reads
        // only in its optimizer tail: the same number of tensors every step, and the layers
        // read last.
        let opens: Vec<&Vec<u64>> = steps[4..]
            .iter()
            .flatten()
            .filter_map(|(_, event)| match event {
                SegmentEvent::Open { park } => Some(park),
                _ => None,
            })
            .collect();
        assert_eq!(opens.len(), 2, "{steps:?}");
        assert_eq!(opens[0].len(), opens[1].len());
        assert_eq!(opens[0].len() as u64 * 400, tight.parked_bytes);
        for park in opens {
            assert!(
                park.iter().all(|ordinal| states.contains(ordinal)),
                "{park:?}"
            );
            let newest = states
                .iter()
                .position(|s| *s > park[park.len() - 1])
                .unwrap();
            let layers_parked: Vec<usize> = park
                .iter()
                .map(|ordinal| states.iter().position(|s| s == ordinal).unwrap() % layers)
                .collect();
            // Ascending ordinals, the layers just before the newest state's.
            let last = newest % layers;
            assert_eq!(
                layers_parked,
                (last - park.len()..last).collect::<Vec<_>>(),
                "{park:?}"
            );
        }
    }
}
