//! The recorded step: the last whole step's tensors seen from its forward pass's first tensor
//! (bytes, reads, views, recomputation costs), what segments and selections are cut from and
//! simulated on, and the forward passes in it: one, or one per micro-batch when a step
//! accumulates gradients over several.

use super::StepPlan;
use crate::vocabulary::OpId;

/// The most bytes one op of a step holds at once (see [`StepRecord::op_floor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpFloor {
    /// Its inputs' and its output's bytes.
    pub(crate) bytes: u64,
    /// The op.
    pub(crate) op: OpId,
}

/// One recorded training step seen from its forward pass's first tensor: what the segments are
/// cut from and simulated on. Positions count creations from that tensor.
#[derive(Clone)]
pub(super) struct StepRecord {
    /// The step's length in tensors.
    pub(super) period: u64,
    /// The ordinal of the earliest tensor in the record. Positions count from the forward
    /// pass's first tensor and wrap around the period, so the tensors after the optimizer's
    /// tail are those of the step before, made from this ordinal on.
    pub(super) first: u64,
    /// Length of each forward pass in tensors: a pass beginning at position `b` ends at
    /// `b + end`.
    pub(super) end: u64,
    /// Positions where the step's forward passes begin, ascending, the first 0: one per
    /// micro-batch when the step accumulates gradients over several, each the same sequence
    /// of tensors (see [`forward_passes`]). The cuts found on the first are made in every
    /// one.
    pub(super) passes: Vec<u64>,
    /// Live bytes on the device when the forward pass's first tensor was made.
    pub(super) base_live: u64,
    /// Live bytes on the device when the tensor at each position was made (to compare a
    /// simulation with the step that ran).
    pub(super) live: Vec<u64>,
    /// Bytes of the tensor made at each position of the step.
    pub(super) bytes: Vec<u64>,
    /// The program's reads of the tensor made at each position, as positions, ascending.
    pub(super) reads: Vec<Vec<u64>>,
    /// Whether the tensor made at each position shares an earlier one's buffer (a view).
    pub(super) shared: Vec<bool>,
    /// What recomputing the tensor made at each position alone costs per byte (infinite: it
    /// cannot be: a view, a random draw, an upload). Its op's: a tensor made from an input
    /// the program had dropped kept no recipe in the recorded step, yet under a selection
    /// it is recomputed with that input.
    pub(super) cost_per_byte: Vec<f32>,
    /// The op that made the tensor at each position.
    pub(super) ops: Vec<OpId>,
    /// Whether the op that made the tensor at each position replays identically (a random
    /// draw or an upload does not, and no cut can evict what it made).
    pub(super) replayable: Vec<bool>,
    /// The bytes the tensor made at each position would hold packed into booleans, if it can
    /// be (a random draw of only 0 and 1, as dropout's mask: see
    /// [`crate::engine::CellInfo::packed`]).
    pub(super) packed: Vec<Option<u64>>,
}

impl StepRecord {
    /// The op of the step that holds the most bytes at once: its inputs and its output (the
    /// first, for an op of several), all resident while it runs. No eviction brings a step
    /// below it; only a smaller op (a smaller batch, a chunked loss) does. A tensor read more
    /// often than a cell records (see `MAX_READS`) may be missed as an input: the floor is
    /// then lower than the op's own. `None` for an empty record.
    pub(super) fn op_floor(&self) -> Option<OpFloor> {
        let p = self.bytes.len();
        let mut held = vec![0u64; p];
        for (position, reads) in self.reads.iter().enumerate() {
            // A view's bytes and reads are its buffer's first tensor's.
            if self.shared[position] {
                continue;
            }
            let bytes = self.bytes[position];
            held[position] += bytes;
            let mut last = None;
            for &read in reads {
                // Read in the next step: by the op at the same position of this one (an
                // optimizer's moment, read by the op that makes its next value).
                let at = read as usize % p;
                if read as usize != position && last != Some(at) {
                    held[at] += bytes;
                }
                last = Some(at);
            }
        }
        let (position, &bytes) = held
            .iter()
            .enumerate()
            .max_by_key(|&(position, &bytes)| (bytes, std::cmp::Reverse(position)))?;
        Some(OpFloor {
            bytes,
            op: self.ops[position],
        })
    }

    /// What segments beginning at `cuts` cost a step to recompute, in the cost model's bytes
    /// of memory traffic (see [`crate::vocabulary::cost`]): every closed segment (all but the
    /// last) is replayed once in the backward pass, in every forward pass. Views and random
    /// draws are not replayed.
    pub(super) fn replay_work(&self, cuts: &[u64]) -> f64 {
        let last = cuts.last().copied().unwrap_or(0).min(self.end) as usize;
        let once: f64 = (0..last)
            .filter(|&i| self.cost_per_byte[i].is_finite())
            .map(|i| self.cost_per_byte[i] as f64 * self.bytes[i] as f64)
            .sum();
        once * self.passes.len() as f64
    }

    /// Where the forward pass beginning at `pass` ends.
    pub(super) fn pass_end(&self, pass: u64) -> u64 {
        pass + self.end
    }

    /// The forward pass's reads of the tensor at `position` of the first forward pass,
    /// ascending (every pass reads its own tensors at the same distances).
    pub(super) fn forward_reads(&self, position: u64) -> impl Iterator<Item = u64> + '_ {
        self.reads[position as usize]
            .iter()
            .copied()
            .filter(|&r| r < self.end)
    }

    /// For each position before the forward pass's end: where the forward pass last reads the
    /// tensor made there (0: never; `u64::MAX`: a checkpoint, read across one of `cuts` or by
    /// the op that makes the tensor at a cut, which begins the next segment and is recomputed
    /// from it). Positions count from a forward pass's start, and hold for every pass.
    pub(super) fn last_reads(&self, cuts: &[u64]) -> Vec<u64> {
        (0..self.end)
            .map(|position| {
                let last = self.forward_reads(position).max().unwrap_or(0);
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
    pub(super) fn lifetimes(&self, exact: bool) -> Vec<i64> {
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

    /// Optimizer state the step makes for the next one, which the next step first reads after
    /// its last forward pass: (that read's position in the next step, position, bytes), read
    /// last first. The step itself may read it (an optimizer reads the moments it just made).
    pub(super) fn parkable(&self) -> Vec<(u64, u64, u64)> {
        let p = self.bytes.len() as u64;
        let forward_end = self.pass_end(*self.passes.last().unwrap_or(&0));
        let mut parkable: Vec<_> = (0..p)
            .filter_map(|position| {
                // Reads before the next step (the optimizer reading the moments it just made)
                // come before the tensor is parked.
                let reads = &self.reads[position as usize];
                let first = *reads.iter().find(|&&read| read >= p)?;
                (first >= p + forward_end).then_some((
                    first - p,
                    position,
                    self.bytes[position as usize],
                ))
            })
            .collect();
        parkable.sort_unstable_by(|a, b| b.cmp(a));
        parkable
    }
}

impl StepPlan {
    /// The last fully recorded step, seen from its forward pass's first tensor, and that
    /// tensor's ordinal (the segments' anchor); `None` if no step is known, or if the period
    /// is not a whole step (a layer repeating inside it).
    pub(super) fn last_step(&self) -> Option<(StepRecord, u64)> {
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
        let held_from_start = |position: u64| held[(start_at + position as usize) % p];
        let token_from_start =
            |position: u64| self.tokens[index(first + (start_at as u64 + position) % period)];
        let (passes, end) = forward_passes(end, held_from_start, token_from_start);
        if passes.len() > 1 {
            log::debug!(
                "frugal: step plan: the step runs {} forward passes of {end} tensors (one per \
                 micro-batch), at positions {passes:?}",
                passes.len()
            );
        }
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
            period,
            first,
            end,
            passes,
            base_live,
            live: (0..period)
                .map(|position| self.live[index(first + (start_at as u64 + position) % period)])
                .collect(),
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
            ops: (0..period)
                .map(|position| self.ops[index(first + (start_at as u64 + position) % period)])
                .collect(),
            replayable: (0..period)
                .map(|position| {
                    let op = self.ops[index(first + (start_at as u64 + position) % period)];
                    op.facts().replayable
                })
                .collect(),
            packed: (0..period)
                .map(|position| self.packed[index(first + (start_at as u64 + position) % period)])
                .collect(),
        };
        Some((record, anchor))
    }
}

/// The forward passes of a step whose forward pass, seen from the step's lowest point, ends at
/// `end` (the peak): its starts, ascending (the first 0), and their length. A step that
/// accumulates gradients over micro-batches runs a forward and a backward pass per micro-batch,
/// so the span up to the peak holds every earlier micro-batch's forward and backward passes
/// and the last one's forward pass. Walking back from the peak, the last pass begins near the
/// lowest point before `held` (the step's own bytes, by position) climbs again by half of the
/// step's swing (the previous micro-batch's backward pass), where the step's first tokens
/// (by position) begin again; the earlier passes are the places before it where the same
/// sequence of tokens begins. If none does, the step has one forward pass: `([0], end)`.
pub(super) fn forward_passes(
    end: u64,
    held: impl Fn(u64) -> i64,
    token: impl Fn(u64) -> u64,
) -> (Vec<u64>, u64) {
    let single = (vec![0], end);
    if end < 2 {
        return single;
    }
    let top = held(end - 1);
    let swing = top - (0..end).map(&held).min().unwrap_or(top);
    let mut lowest = (end - 1, top);
    let mut climbed = false;
    for position in (0..end - 1).rev() {
        let bytes = held(position);
        if bytes < lowest.1 {
            lowest = (position, bytes);
        } else if 2 * (bytes - lowest.1) > swing {
            climbed = true;
            break;
        }
    }
    if !climbed {
        return single;
    }
    // The last pass begins near the lowest point (a tensor or two of the previous backward
    // pass may come after it): where the step's first tokens begin again.
    let trough = lowest.0 + 1;
    let near = (end / 16).max(4);
    let repeats_start = |from: u64| (0..end - from).all(|k| token(k) == token(from + k));
    let Some(last) = (0..=near)
        .flat_map(|d| [trough.checked_add(d), trough.checked_sub(d)])
        .flatten()
        .filter(|&from| from > 0 && from + 2 <= end)
        .find(|&from| repeats_start(from))
    else {
        return single;
    };
    let length = end - last;
    let mut passes = Vec::new();
    let mut at = 0;
    while at + length <= last {
        if (0..length).all(|k| token(at + k) == token(last + k)) {
            passes.push(at);
            at += length;
        } else {
            at += 1;
        }
    }
    if passes.first() != Some(&0) {
        return single;
    }
    passes.push(last);
    (passes, length)
}
