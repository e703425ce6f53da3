//! The forward pass cut into segments under a budget (see the plan's module doc): when to
//! cut, how the cuts adapt to a step that still needed the budget to evict, and the search
//! for cuts on the recorded step.

use std::sync::Arc;

use super::record::StepRecord;
use super::selection::{
    SELECTION_AIM, SELECTION_MIN_SHARE, SELECTION_OVERSHOOT, SELECTION_SHRINK, Selection,
};
use super::simulation::Parked;
use super::{PRESSURE_SEEN, SegmentEvent, StepPlan};
use crate::units::format_bytes;
use crate::vocabulary::cost::PARK_COST_PER_BYTE;

/// The largest share of the room under the budget (budget minus what is live when the forward
/// pass begins) that one segment's tensors kept for the backward pass may take. The cuts are
/// searched from it downwards (see [`StepRecord::simulate`](super::record::StepRecord::simulate)): one segment is recomputed at a
/// time in the backward pass, beside the segments' boundaries, the gradients and the backward
/// pass's temporaries.
pub(super) const SEGMENT_SHARE: f64 = 1.0;

/// The ratio between two segment shares the search tries in turn.
pub(super) const SEGMENT_SEARCH_STEP: f64 = 0.8;

/// How much smaller segments become when a step under the plan still needed the budget to
/// evict.
const SEGMENT_SHRINK: f64 = 0.6;

/// The smallest segment share tried: below it the boundaries alone crowd the budget.
const MIN_SEGMENT_SHARE: f64 = 1.0 / 32.0;

/// The parkable optimizer state is tried in this many equal parts (see [`StepPlan::cut_segments`]).
const PARK_STEPS: u64 = 8;

/// One way to cut the forward pass into segments, tried by [`StepPlan::cut_segments`].
struct Cutting {
    /// The step's simulated peak under it.
    peak: u64,
    /// The share of the room each segment keeps.
    share: f64,
    /// Positions where segments begin.
    cuts: Vec<u64>,
    /// See [`StepRecord::last_reads`](super::record::StepRecord::last_reads).
    last_read: Vec<u64>,
}

/// The forward pass's segments, learned from one recorded step; positions are counted in
/// creations from the forward pass's first tensor, whose ordinal is `anchor` modulo `period`.
#[derive(Clone, Debug)]
pub(super) struct Segments {
    pub(super) period: u64,
    pub(super) anchor: u64,
    /// Positions at which a segment begins, ascending; the first is 0.
    pub(super) cuts: Vec<u64>,
    /// Length of each forward pass: a pass beginning at `b` ends at `b + end` (the last
    /// pass's end is the step's logical peak).
    pub(super) end: u64,
    /// Positions where the step's forward passes begin (one per micro-batch), ascending, the
    /// first 0; the cuts, relative to a pass's start, are made in each.
    pub(super) passes: Vec<u64>,
    /// For each position before `end`: where the forward pass last reads the tensor there
    /// (0: never; `u64::MAX`: a checkpoint, read across a cut); cuts before that keep it.
    pub(super) last_read: Arc<[u64]>,
    pub(super) segment_bytes: u64,
    pub(super) estimated_peak: u64,
    /// Positions, in the step before, of the tensors parked when the forward pass begins
    /// (see the module doc), ascending.
    pub(super) park: Vec<u64>,
    pub(super) parked_bytes: u64,
    /// The position the parked state is read again (the simulation's assumption).
    pub(super) parked_until: u64,
    /// The cuts drop only tensors chosen one by one (see [`StepRecord::select`](super::record::StepRecord::select)), not every
    /// tensor of a closed segment that the backward pass reads.
    pub(super) selective: bool,
    /// Bytes of the tensors a selection drops (0: segments).
    pub(super) selected_bytes: u64,
}

impl Segments {
    pub(super) fn position(&self, ordinal: u64) -> u64 {
        (ordinal % self.period + self.period - self.anchor % self.period) % self.period
    }

    /// The forward pass the tensor with `ordinal` is made in or after (its index), and the
    /// tensor's position from that pass's start.
    pub(super) fn in_pass(&self, ordinal: u64) -> (usize, u64) {
        let position = self.position(ordinal);
        let pass = self.passes.partition_point(|&start| start <= position) - 1;
        (pass, position - self.passes[pass])
    }

    /// Ordinals of the tensors to park when the forward pass begins at `ordinal`.
    fn park_at(&self, ordinal: u64) -> Vec<u64> {
        let Some(step_before) = ordinal.checked_sub(self.period) else {
            return Vec::new();
        };
        self.park.iter().map(|&q| step_before + q).collect()
    }
}

impl StepPlan {
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
            let segments = limit.and_then(|limit| self.cut_segments(limit));
            self.set_segments(segments);
        }
        let Some(segments) = self.segments.as_ref() else {
            self.segmented_step = false;
            return self.close_open_segment();
        };
        let (pass, position) = segments.in_pass(ordinal);
        if position == 0 && pass > 0 {
            // A later micro-batch's forward pass: cut like the first, nothing parked again.
            self.segment_open = true;
            return Some(SegmentEvent::Open { park: Vec::new() });
        }
        if position == 0 {
            // Once per set of cuts: a step's record is built at each step's start until one
            // made wholly under them is found.
            if !self.simulation_compared {
                self.simulation_compared = self.measure_step_under_cuts();
            }
            if self.segmented_step && !self.settled {
                self.adapt_segments(limit);
            }
            if self.segments.is_some() {
                self.planned_steps += 1;
                self.settled_steps += u64::from(self.settled);
            }
            self.pressure = 0;
            self.segmented_step = self.segments.is_some();
            if self.segments.is_some() && self.segments_began.is_none() {
                self.segments_began = Some(ordinal);
            }
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
                self.set_segments(Some(before));
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
        self.set_segments(next);
    }

    /// Puts `segments` in place: no step has begun under them yet, nor been measured.
    fn set_segments(&mut self, segments: Option<Segments>) {
        self.segments = segments;
        self.segments_began = None;
        self.simulation_compared = false;
        self.measured_peak = 0;
    }

    /// Measures the last recorded step's peak (see [`PlanFigures::measured_peak`](super::PlanFigures::measured_peak)) if that
    /// whole step ran under the current cuts (the record can begin inside the step before:
    /// see [`StepRecord::first`](super::record::StepRecord::first)); whether it did. With
    /// the debug log on, segments' cuts also log how far their simulation was from it: where
    /// the real step held more than the simulated one, the budget had to make room.
    fn measure_step_under_cuts(&mut self) -> bool {
        let Some(old) = self.segments.as_ref() else {
            return false;
        };
        let Some((record, _)) = self.last_step() else {
            return false;
        };
        if self.segments_began.is_none_or(|began| record.first < began) {
            return false;
        }
        let measured = record.live.iter().copied().max().unwrap_or(0);
        if old.selective || !log::log_enabled!(log::Level::Debug) {
            self.measured_peak = measured;
            return true;
        }
        let (p, end) = (record.period as usize, record.end);
        let parked = Parked {
            bytes: old.parked_bytes,
            until: old.parked_until,
        };
        let simulated = record.simulate_curve(&old.cuts, &old.last_read, parked);
        let actual = &record.live;
        let excess = |k: usize| actual[k] as i64 - simulated[k];
        // The forward pass's first tensor is counted before the parked state leaves.
        let worst = (1..p).max_by_key(|&k| excess(k)).unwrap_or(0);
        log::debug!(
            "frugal: step plan: under the cuts ({} segments) the step held at most {measured} B, \
             the simulation {} B; the real step held {} B more than simulated at position \
             {worst} (the forward pass ends at {end})",
            old.cuts.len(),
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
        self.measured_peak = measured;
        true
    }

    /// Keeps the record's [`OpFloor`](super::record::OpFloor) for the figures and, when it
    /// is over `limit` and was not said for this budget already, says so once: live bytes go
    /// over the budget while that op runs, whatever is evicted.
    fn note_op_floor(&mut self, record: &StepRecord, limit: u64) {
        let floor = record.op_floor();
        let said = self.op_floor.is_some_and(|(was, for_limit)| {
            for_limit == limit && floor.is_some_and(|f| f.bytes == was.bytes)
        });
        if let Some(floor) = floor
            && floor.bytes > limit
            && !said
        {
            log::warn!(
                "frugal: the memory budget of {} is below what one op of the step holds at \
                 once: {} takes {} for its inputs and output, so live bytes go over the \
                 budget while it runs. Give a budget of at least that, or make the op smaller \
                 (a smaller batch, or micro-batches through `frugal::GradientAccumulation`).",
                format_bytes(limit),
                floor.op.name(),
                format_bytes(floor.bytes),
            );
        }
        self.op_floor = floor.map(|floor| (floor, limit));
    }

    fn close_open_segment(&mut self) -> Option<SegmentEvent> {
        std::mem::take(&mut self.segment_open).then_some(SegmentEvent::Close)
    }

    /// Cuts the forward pass of the last fully recorded step into segments for a budget of
    /// `limit`; `None` if no step is known or its peak fits the budget.
    fn cut_segments(&mut self, limit: u64) -> Option<Segments> {
        let (record, anchor) = self.last_step()?;
        let (period, end) = (record.period, record.end);
        let unsegmented = record.simulate(&[0], &[], Parked::NONE);
        if unsegmented <= limit {
            log::debug!(
                "frugal: step plan: the step's estimated peak {unsegmented} B fits the budget; \
                 no segments"
            );
            return None;
        }
        self.note_op_floor(&record, limit);
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
        let boundary = boundaries(&crossing, end);
        let boundary_near = std::cell::OnceCell::new();
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
        let search_at = |boundary: &[bool], parked: Parked| {
            let room = limit.saturating_sub(record.base_live.saturating_sub(parked.bytes));
            let mut share = self.segment_share;
            let mut best: Option<Cutting> = None;
            loop {
                let segment_bytes = (room as f64 * share) as u64;
                if segment_bytes > 0 {
                    let cuts = cut_at(&saved, boundary, end, segment_bytes);
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
        // Cuts where the fewest bytes cross first; where none of those fits, cuts in every
        // stage as well, if they simulate lower.
        let search = |parked: Parked| {
            let found = search_at(&boundary, parked)?;
            if found.0.peak <= limit {
                return Some(found);
            }
            let near = boundary_near.get_or_init(|| boundaries_near(&crossing, end));
            match search_at(near, parked) {
                Some(nearer) if nearer.0.peak < found.0.peak => Some(nearer),
                _ => Some(found),
            }
        };
        // At each amount of parked state, the fewest first: a selection, and segments until
        // some fit. Of those that fit, the plan that costs a step the least: what it
        // recomputes, and the parked state's copies to host memory and back. A selection
        // usually recomputes far less than segments, so parking some state to make one fit
        // often beats segments that fit without parking.
        let park_work = |parked: Parked| parked.bytes as f64 * PARK_COST_PER_BYTE;
        let mut best: Option<(Cutting, u64, usize, Parked)> = None;
        let mut segments_fit = false;
        let mut chosen: Option<(Selection, usize, Parked, f64)> = None;
        for &(count, parked) in &park_levels {
            let cheapest = chosen.as_ref().map(|c| c.3).into_iter().chain(
                best.as_ref()
                    .filter(|_| segments_fit)
                    .map(|(found, _, _, at)| record.replay_work(&found.cuts) + park_work(*at)),
            );
            if cheapest.fold(f64::INFINITY, f64::min) <= park_work(parked) {
                break; // more parking alone costs more than a plan found
            }
            if let Some(selection) =
                record.select(target, ceiling, room / SELECTION_MIN_SHARE, parked)
            {
                if selection.count == 0 && count == 0 {
                    return None; // the step's exact peak fits
                }
                let work = selection.work + park_work(parked);
                if chosen.as_ref().is_none_or(|c| work < c.3) {
                    chosen = Some((selection, count, parked, work));
                }
                continue;
            }
            if segments_fit || chosen.is_some() {
                continue;
            }
            let Some((found, room)) = search(parked) else {
                continue;
            };
            segments_fit = found.peak <= limit;
            if best.as_ref().is_none_or(|b| found.peak < b.0.peak) {
                best = Some((found, room, count, parked));
            }
        }
        let segments_work = best
            .as_ref()
            .filter(|_| segments_fit)
            .map(|(found, _, _, parked)| record.replay_work(&found.cuts) + park_work(*parked));
        if let Some((selection, count, parked, work)) = chosen
            && segments_work.is_none_or(|segments| work <= segments)
        {
            log::debug!(
                "frugal: step plan: forward pass of {end} tensors, estimated peak \
                 {unsegmented} B over a budget of {limit} B: {} tensors of {} B dropped at \
                 {} cuts and recomputed ({} of their inputs with them; {} random draws \
                 packed instead), {} B of optimizer state ({count} tensors) parked in host \
                 memory until position {}, estimated peak {} B (aim {target} B); it costs \
                 {:.3e} B of traffic a step{}",
                selection.count,
                selection.bytes,
                selection.cuts.len() - 1,
                selection.chained,
                selection.packed,
                parked.bytes,
                parked.until,
                selection.peak,
                work,
                segments_work.map_or(String::new(), |s| format!(", segments that fit {s:.3e} B")),
            );
            return Some(Segments {
                period,
                anchor,
                cuts: selection.cuts,
                end,
                passes: record.passes.clone(),
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
            passes: record.passes.clone(),
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
}

/// How far, as a share of the forward pass, the neighbourhood reaches on each side of a
/// position when [`boundaries_near`] looks for the fewest bytes crossing near it: about one
/// block of a model a dozen blocks deep.
const NEIGHBOURHOOD: u64 = 12;

/// The fewest bytes that cross any position in the middle half of the forward pass of `end`
/// tensors (`crossing`, by position).
fn fewest_crossing(crossing: &[i64], end: u64) -> i64 {
    let middle = (end / 4).max(1) as usize..(3 * end / 4).max(2) as usize;
    crossing[middle.start..middle.end.min(crossing.len())]
        .iter()
        .copied()
        .min()
        .unwrap_or(0)
        .max(0)
}

/// Where the forward pass of `end` tensors may be cut: positions where at most a quarter more
/// bytes cross (`crossing`, by position) than the fewest that cross anywhere in the middle half
/// of the forward pass. In a stack of blocks those are the blocks' boundaries (only the
/// residual stream crosses them).
pub(super) fn boundaries(crossing: &[i64], end: u64) -> Vec<bool> {
    let fewest = fewest_crossing(crossing, end);
    let boundary: Vec<bool> = crossing.iter().map(|&c| c <= fewest + fewest / 4).collect();
    log::debug!(
        "frugal: step plan: {} of {end} positions are boundaries ({fewest} B cross the fewest)",
        boundary.iter().skip(1).filter(|&&b| b).count()
    );
    boundary
}

/// [`boundaries`] and, besides them, positions where at most a quarter more bytes cross than
/// the fewest that cross in their neighbourhood (see [`NEIGHBOURHOOD`]). In a network whose
/// stages shrink its activations (a ResNet's) those are each stage's own block boundaries, not
/// only the smallest stage's; in a stack of equal blocks they include the insides of blocks
/// longer than the neighbourhood (attention's scores), so the plan tries them only when cuts at
/// [`boundaries`] do not fit.
pub(super) fn boundaries_near(crossing: &[i64], end: u64) -> Vec<bool> {
    let fewest = fewest_crossing(crossing, end);
    // The fewest on each side, and the more of the two: where a stage of larger activations
    // ends beside a smaller one, the smaller stage's crossings must not hide its boundaries.
    // A side cut short by the forward pass's start or end is left out: it may hold no
    // boundary at all.
    let n = crossing.len();
    let reach = (end / NEIGHBOURHOOD).max(1) as usize;
    let before = sliding_min(crossing, reach, 0);
    let after = sliding_min(crossing, 0, reach);
    let boundary: Vec<bool> = (0..n)
        .map(|position| {
            let near = match (position >= reach, position + reach < n) {
                (true, true) => before[position].max(after[position]),
                (true, false) => before[position],
                (false, true) => after[position],
                (false, false) => before[position].min(after[position]),
            };
            let around = near.max(fewest);
            crossing[position] <= around + around / 4
        })
        .collect();
    log::debug!(
        "frugal: step plan: {} of {end} positions are boundaries in their neighbourhood",
        boundary.iter().skip(1).filter(|&&b| b).count()
    );
    boundary
}

/// The least of `values` from `before` positions before each position to `after` positions
/// after it, in one pass (a queue of the positions that may still be a window's least).
pub(super) fn sliding_min(values: &[i64], before: usize, after: usize) -> Vec<i64> {
    let n = values.len();
    let mut least = Vec::with_capacity(n);
    let mut queue: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    let mut next = 0;
    for position in 0..n {
        let last = (position + after).min(n - 1);
        while next <= last {
            while queue.back().is_some_and(|&b| values[b] >= values[next]) {
                queue.pop_back();
            }
            queue.push_back(next);
            next += 1;
        }
        while queue.front().is_some_and(|&f| f + before < position) {
            queue.pop_front();
        }
        least.push(values[queue[0]]);
    }
    least
}

/// Cuts a forward pass of `end` tensors into segments that keep about `segment_bytes` each
/// for the backward pass (`saved`, by position), ending only at `boundary` positions (see
/// [`boundaries`]). A segment ends at the last boundary before it would keep more than
/// `segment_bytes`, or at the first one after, if there is none before. Returns the positions
/// where segments begin, the first 0.
fn cut_at(saved: &[u64], boundary: &[bool], end: u64, segment_bytes: u64) -> Vec<u64> {
    let boundary = |position: u64| boundary[position as usize];
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
