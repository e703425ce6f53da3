//! The step simulated under cuts: the live bytes at each position of a recorded step when
//! segments or chosen tensors are dropped and brought back, and optimizer state parked.

use super::record::StepRecord;

/// Bytes of optimizer state away in host memory from the forward pass's start until position
/// `until` of the step (where the first of them is read), for [`StepRecord::simulate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Parked {
    pub(super) bytes: u64,
    pub(super) until: u64,
}

impl Parked {
    pub(super) const NONE: Parked = Parked { bytes: 0, until: 0 };
}

impl StepRecord {
    /// The step's live bytes at each position under `cuts` (`last_read` from
    /// [`Self::last_reads`]) in each of its forward passes, with `parked` bytes away from its
    /// start until their first read.
    ///
    /// A tensor the step makes and drops is held from its creation to its last read,
    /// inclusive: the op that reads it last holds it beside its output. A tensor outliving the
    /// step is in `base_live`. A cut evicts every tensor made in the segment it closes that is
    /// read again only after the cut and is not a checkpoint, but for random draws (never
    /// recomputed, they stay; one of only 0 and 1 is packed into booleans until its next
    /// read); the segment's evicted tensors
    /// all come back at the first read of any of them, since recomputing the last of them
    /// (which the backward pass reads first) restores the chain before it; a checkpoint is
    /// held until then for every later segment that reads it. Views count as
    /// buffers of their own: a segment's restore brings back more than its tensors (the
    /// gradients made beside them), and segments sized on the exact count left the budget
    /// evicting on top of them.
    pub(super) fn simulate_curve(
        &self,
        cuts: &[u64],
        last_read: &[u64],
        parked: Parked,
    ) -> Vec<i64> {
        let p = self.bytes.len();
        let mut change = self.lifetimes(false);
        for &pass in &self.passes {
            self.simulate_pass(pass, cuts, last_read, &mut change);
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

    /// Adds to `change` (see [`Self::lifetimes`]) what `cuts` do to the forward pass beginning
    /// at `pass` (see [`Self::simulate_curve`]).
    fn simulate_pass(&self, pass: u64, cuts: &[u64], last_read: &[u64], change: &mut [i64]) {
        let p = self.bytes.len();
        let pass_end = self.pass_end(pass);
        let mut restore = vec![u64::MAX; cuts.len()];
        let mut evicted = Vec::new();
        for (offset, &last) in last_read.iter().enumerate() {
            if last == u64::MAX {
                continue;
            }
            let Some(next) = cuts.iter().position(|&cut| cut > offset as u64) else {
                continue;
            };
            let position = (pass + offset as u64) as usize;
            let evict_at = pass + cuts[next];
            let Some(&read) = self.reads[position].iter().find(|&&r| r > evict_at) else {
                continue;
            };
            // What a random draw made stays where a cut leaves it: the cut evicts only what
            // it can recompute. A draw of only 0 and 1 is packed until its next read.
            if !self.replayable[position] {
                if let Some(packed) = self.packed[position] {
                    let (from, to) = (evict_at as usize + 1, (read as usize).min(p));
                    if from < to {
                        let freed = self.bytes[position].saturating_sub(packed) as i64;
                        change[from] -= freed;
                        change[to] += freed;
                    }
                }
                continue;
            }
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
        let segment_of = |at: u64| cuts.iter().rposition(|&cut| pass + cut <= at);
        for (offset, &last) in last_read.iter().enumerate() {
            if last != u64::MAX {
                continue;
            }
            let position = pass as usize + offset;
            let Some(own) = segment_of(position as u64) else {
                continue;
            };
            let reads = &self.reads[position];
            let held_for = reads
                .iter()
                .filter(|&&read| read < pass_end)
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
    }

    /// The step's peak live bytes under `cuts` (see [`Self::simulate_curve`]), at least
    /// `base_live`.
    pub(super) fn simulate(&self, cuts: &[u64], last_read: &[u64], parked: Parked) -> u64 {
        let peak = self
            .simulate_curve(cuts, last_read, parked)
            .into_iter()
            .max();
        peak.map_or(self.base_live, |peak| {
            peak.max(self.base_live as i64) as u64
        })
    }
}
