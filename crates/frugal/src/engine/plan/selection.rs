//! Selective recomputation: which single tensors of the forward pass to drop and recompute
//! alone, chosen greedily on the recorded step (see [`StepRecord::select`]).

use super::record::StepRecord;
use super::simulation::Parked;

/// How much lower a selection (see [`StepRecord::select`]) aims when a step under it still
/// needed the budget to evict: it errs by a few tensors, not by whole segments.
pub(super) const SELECTION_SHRINK: f64 = 0.95;

/// The share of the room under the budget a selection first aims at: the simulated step
/// counts only the program's tensors, not the buffers ops use inside.
pub(super) const SELECTION_AIM: f64 = 0.95;

/// A selection whose simulated peak no choosable tensor can lower further is still taken if
/// that peak is within this share of the budget above it: the budget's own evictions cover
/// the few positions over it. Kept small: what the selection leaves over the budget is what
/// its own search could not drop, so the budget mostly offloads it, on the device's one
/// stream, at every step: beyond a few percent that costs more than recomputing segments.
pub(super) const SELECTION_OVERSHOOT: f64 = 0.05;

/// Tensors holding less than the room under the budget divided by this are not selected: a
/// recomputation of a few bytes still costs an op.
pub(super) const SELECTION_MIN_SHARE: u64 = 4096;

/// The longest chain of inputs a chosen tensor is recomputed through (see
/// [`StepRecord::select`]): `softmax(mask_fill(q·kᵀ / s))` written out is three links from
/// what attention's backward pass holds, five with dropout on the scores (burn-nn's
/// `MultiHeadAttention`: the product by the mask and by `1 / (1 - p)`).
pub(crate) const CHAIN_DEPTH: usize = 6;

/// What [`StepRecord::select`] chose.
pub(super) struct Selection {
    /// Positions where chosen tensors are dropped, ascending, the first 0 (the forward pass's
    /// start, where nothing is dropped).
    pub(super) cuts: Vec<u64>,
    /// For each position before the forward pass's end: the forward pass's last read of a
    /// chosen tensor or of an input recomputed with one (at or before the cut that drops
    /// it); `u64::MAX` for the others, kept.
    pub(super) last_read: Vec<u64>,
    /// The simulated step's peak live bytes under the choice.
    pub(super) peak: u64,
    /// Tensors chosen.
    pub(super) count: u64,
    /// Bytes they hold.
    pub(super) bytes: u64,
    /// Inputs dropped and recomputed with them (see [`CHAIN_DEPTH`]).
    pub(super) chained: u64,
    /// Chosen tensors packed into booleans rather than dropped (random draws of only 0 and
    /// 1, as dropout's masks).
    pub(super) packed: u64,
    /// What recomputing (or packing) them costs a step, in the cost model's bytes of memory
    /// traffic (see [`crate::vocabulary::cost`]), over every forward pass.
    pub(super) work: f64,
}

impl StepRecord {
    /// Selective recomputation, Checkmate's problem solved greedily: which tensors of the
    /// forward pass to drop after its last read of them and recompute (or, for a random draw
    /// of only 0 and 1, pack into booleans) when the backward pass first reads them, so that
    /// the simulated step's peak is at most `target`. While the peak is over, the tensor
    /// recomputed most cheaply per byte among those held across the peak whose choice lowers
    /// it is chosen (an activation's output before a layer norm's, before a product's); a
    /// choice can raise the step elsewhere, where it brings its chain back. A tensor is
    /// dropped as the next tensor after the forward pass's last read of it is made. Each of
    /// its inputs the step made is either held by the program until the backward pass reads
    /// it (and not dropped itself), or small (held for it by its recipe), or recomputed with
    /// it: an input the program drops before then (`softmax`'s input, when `mask_fill`,
    /// `div` and `q·kᵀ` are written out) is dropped too and recomputed first, through at most
    /// [`CHAIN_DEPTH`] such links, its cost counted with the tensor's, its bytes held while
    /// the tensor is read back. An input chosen itself is recomputed with it if the backward
    /// pass reads that input later (it is then held from here), and a packed one is unpacked
    /// here. Whether a tensor can be recomputed is its op's (see [`StepRecord::cost_per_byte`]),
    /// not whether the recorded step kept a recipe: under a selection the chosen tensors and
    /// their chains keep theirs. Tensors of fewer than `min_bytes` are left. When nothing more
    /// can be chosen short of `target`, the choice so far is taken if its peak is at most
    /// `ceiling` (the budget itself: a step a little over the aim still recomputes far less
    /// than under segments); `None` otherwise. `parked` bytes are away from the step's start
    /// until their first read. A step of several forward passes (micro-batches) drops the same
    /// tensors in each.
    pub(super) fn select(
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
        // What recomputing the tensor at `i` (of the first pass) in the pass at `pass`, read
        // back at `back`, needs beside the inputs the program holds: the inputs recomputed
        // with it and the small ones its recipe holds (positions in the pass), or `None` if
        // an input it needs can be neither.
        let links = |i: usize, pass: usize, back: u64| -> Option<Chain> {
            let mut chain = Chain::default();
            let mut frontier = vec![(i, 0usize)];
            while let Some((t, depth)) = frontier.pop() {
                for &j in &inputs[t] {
                    let at = pass + j;
                    if held_until(at) >= back || chain.members.contains(&j) {
                        continue;
                    }
                    // An input the program drops before `back` stays for the recomputation,
                    // held by the recipe: only a small one (a row's mean) is worth it.
                    if self.bytes[at] * 16 <= self.bytes[pass + i] {
                        chain.small.push(j);
                        continue;
                    }
                    if depth >= CHAIN_DEPTH || !self.cost_per_byte[j].is_finite() {
                        return None;
                    }
                    chain.members.push(j);
                    frontier.push((j, depth + 1));
                }
            }
            Some(chain)
        };
        // A random draw of only 0 and 1 is packed rather than dropped: it frees all but its
        // packed bytes, and costs the traffic of packing and unpacking it.
        let packs = |i: usize| !self.cost_per_byte[i].is_finite() && self.packed[i].is_some();
        let freed = |i: usize, at: usize| match packs(i) {
            true => self.bytes[at].saturating_sub(self.packed[at].unwrap_or(0)),
            false => self.bytes[at],
        };
        let mut candidates: Vec<Candidate> = (0..end)
            .filter(|&i| self.cost_per_byte[i].is_finite() || packs(i))
            .filter(|&i| freed(i, i) >= min_bytes.max(1))
            .filter_map(|i| {
                // Dropped as the tensor after the forward pass's last read of it is made (a
                // cut is handed out before the cell it is made for exists); a cut at the
                // forward pass's end would be its close.
                let drop_at = last_forward(i).max(i as u64) + 1;
                if drop_at >= self.end {
                    return None;
                }
                let spans = self
                    .passes
                    .iter()
                    .map(|&pass| {
                        let (at, dropped) = (pass as usize + i, pass + drop_at);
                        let &back = self.reads[at].iter().find(|&&r| r > dropped)?;
                        let chain = match packs(i) {
                            true => Chain::default(),
                            false => links(i, pass as usize, back)?,
                        };
                        Some(Span {
                            dropped,
                            back,
                            chain,
                        })
                    })
                    .collect::<Option<Vec<_>>>()?;
                let members = &spans.first()?.chain.members;
                let work = |j: usize| self.cost_per_byte[j] as f64 * self.bytes[j] as f64;
                let cost = match members.is_empty() {
                    true if packs(i) => {
                        let (bytes, packed) = (self.bytes[i], self.packed[i].unwrap_or(0));
                        2.0 * (bytes + packed) as f64 / freed(i, i) as f64
                    }
                    true => self.cost_per_byte[i] as f64,
                    false => {
                        (work(i) + members.iter().map(|&j| work(j)).sum::<f64>())
                            / self.bytes[i] as f64
                    }
                };
                Some(Candidate {
                    position: i,
                    drop_at,
                    cost,
                    spans,
                })
            })
            .collect();
        candidates.sort_by(|a, b| {
            a.cost
                .total_cmp(&b.cost)
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
        // Inputs recomputed with a chosen tensor: dropped with it.
        let mut chained = vec![false; end];
        // Inputs of a chosen tensor or of its chain: recomputing it needs them, so they stay.
        let mut feeds = vec![false; end];
        let (mut count, mut bytes, mut packed, mut work) = (0u64, 0u64, 0u64, 0f64);
        let mut sim = Sim {
            held,
            back_at: vec![vec![0u64; end]; self.passes.len()],
        };
        // Each chosen recomputation: what it reads (the tensor and its chain) and where it
        // runs in each pass.
        let mut recomputed: Vec<(Vec<usize>, Vec<u64>)> = Vec::new();
        // Where each position's candidate is in `candidates`.
        let mut by_position = vec![None; end];
        for (at, c) in candidates.iter().enumerate() {
            by_position[c.position] = Some(at);
        }
        loop {
            let (at, &most) = sim
                .held
                .iter()
                .enumerate()
                .max_by_key(|&(i, &h)| (h, std::cmp::Reverse(i)))?;
            let peak = self
                .base_live
                .saturating_add((most - at_start).max(0) as u64);
            // A chosen input without a chain of its own that the backward pass reads after
            // this tensor is recomputed with it, and stays until then.
            let comes_back_after = |j: usize, c: &Candidate| {
                by_position[j].is_some_and(|at| {
                    let input = &candidates[at];
                    input.spans[0].chain.members.is_empty()
                        && input
                            .spans
                            .iter()
                            .zip(&c.spans)
                            .all(|(input, span)| input.back >= span.back)
                })
            };
            let eligible = |c: &&Candidate| {
                let i = c.position;
                let members = &c.spans[0].chain.members;
                let needs = || std::iter::once(i).chain(members.iter().copied());
                // A packed input is unpacked by the recomputation that reads it: packing
                // and recomputing do not exclude each other.
                !chosen[i]
                    && (!feeds[i] || packs(i))
                    && !chained[i]
                    && c.spans
                        .iter()
                        .any(|s| (s.dropped as usize) < at && at < s.back as usize)
                    && members.iter().all(|&j| !chosen[j] && !feeds[j])
                    && needs().all(|t| {
                        inputs[t]
                            .iter()
                            .all(|&j| !chosen[j] || packs(j) || comes_back_after(j, c))
                    })
            };
            // What choosing `pick` does to the simulated step (its position is `i`; `needs`:
            // the tensor and its chain).
            let apply = |sim: &mut Sim, pick: &Candidate, needs: &[usize]| {
                let i = pick.position;
                for (k, (&pass, span)) in self.passes.iter().zip(&pick.spans).enumerate() {
                    let (pass, back) = (pass as usize, span.back as usize);
                    let at = pass + i;
                    if packs(i) {
                        // Packed until the first recomputation that reads it, if one comes first.
                        let until = recomputed
                            .iter()
                            .filter(|(needs, _)| needs.iter().any(|&t| inputs[t].contains(&i)))
                            .map(|(_, backs)| backs[k])
                            .fold(span.back, u64::min);
                        for h in &mut sim.held[span.dropped as usize + 1..(until as usize).min(p)] {
                            *h -= freed(i, at) as i64;
                        }
                        sim.back_at[k][i] = until;
                        continue;
                    }
                    for h in &mut sim.held[span.dropped as usize + 1..back.min(p)] {
                        *h -= freed(i, at) as i64;
                    }
                    sim.back_at[k][i] = span.back;
                    // A chosen input comes back (recomputed, or unpacked) with this
                    // recomputation, and stays until the backward pass reads it.
                    for &t in needs {
                        for &j in inputs[t].iter().filter(|&&j| chosen[j]) {
                            let until = sim.back_at[k][j];
                            if until > span.back {
                                for h in sim
                                    .held
                                    .get_mut(back..(until as usize).min(p))
                                    .into_iter()
                                    .flatten()
                                {
                                    *h += freed(j, pass + j) as i64;
                                }
                                sim.back_at[k][j] = span.back;
                            }
                        }
                    }
                    for &j in &span.chain.small {
                        let j = pass + j;
                        let kept = held_until(j) as usize + 1..back.min(p);
                        for h in sim.held.get_mut(kept).into_iter().flatten() {
                            *h += self.bytes[j] as i64;
                        }
                    }
                    // The chain is recomputed when the tensor is read back and held with it until
                    // the program drops the tensor.
                    let chain: u64 = span
                        .chain
                        .members
                        .iter()
                        .map(|&j| self.bytes[pass + j])
                        .sum();
                    let until = (held_until(at) as usize + 1).max(back + 1).min(p);
                    for h in sim.held.get_mut(back..until).into_iter().flatten() {
                        *h += chain as i64;
                    }
                }
            };
            let needs_of = |c: &Candidate| -> Vec<usize> {
                std::iter::once(c.position)
                    .chain(c.spans[0].chain.members.iter().copied())
                    .collect()
            };
            // The first eligible tensor, cheapest first, whose choice lowers the peak: a
            // recomputation brings its chain back at once, which may make a new peak there.
            // Only a choice that brings bytes back (its chain, small inputs, chosen inputs) is
            // tried on a copy first: a plain drop lowers every position it spans.
            let brings_back = |c: &Candidate| {
                c.spans
                    .iter()
                    .any(|s| !s.chain.members.is_empty() || !s.chain.small.is_empty())
                    || needs_of(c)
                        .iter()
                        .any(|&t| inputs[t].iter().any(|&j| chosen[j]))
            };
            let mut tried = 0;
            let pick = candidates.iter().filter(eligible).find_map(|c| {
                if !brings_back(c) {
                    return Some((c, None));
                }
                tried += 1;
                if tried > PICK_TRIALS {
                    return None;
                }
                let mut trial = sim.clone();
                apply(&mut trial, c, &needs_of(c));
                (trial.held.iter().copied().max() < Some(most)).then_some((c, Some(trial)))
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
                    .map(|i| match chosen[i] || chained[i] {
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
                    chained: chained.iter().filter(|&&c| c).count() as u64,
                    packed,
                    work,
                });
            }
            let Some((pick, trial)) = pick else {
                log::debug!(
                    "frugal: step plan: no selection fits: {count} tensors of {bytes} B chosen, \
                     the simulated peak {peak} B at position {at} (the forward pass ends at {}) \
                     is over the ceiling {ceiling} B and no tensor held across it can be dropped",
                    self.end
                );
                return None;
            };
            let needs = needs_of(pick);
            match trial {
                Some(trial) => sim = trial,
                None => apply(&mut sim, pick, &needs),
            }
            let i = pick.position;
            chosen[i] = true;
            for span in &pick.spans {
                for &j in &span.chain.members {
                    chained[j] = true;
                }
            }
            for t in std::iter::once(i).chain(pick.spans[0].chain.members.iter().copied()) {
                for &j in &inputs[t] {
                    if !chained[j] {
                        feeds[j] = true;
                    }
                }
            }
            if !packs(i) {
                recomputed.push((needs, pick.spans.iter().map(|span| span.back).collect()));
            }
            count += 1;
            bytes += self.bytes[i];
            packed += packs(i) as u64;
            // A candidate's cost is per byte it frees (packed) or holds (recomputed).
            let per = match packs(i) {
                true => freed(i, i),
                false => self.bytes[i],
            };
            work += pick.cost * per as f64 * self.passes.len() as f64;
        }
    }
}

/// How many of the eligible tensors that bring bytes back when recomputed (a chain, a chosen
/// input), cheapest first, [`StepRecord::select`] tries on a copy of the simulated step before
/// it gives up lowering the peak.
const PICK_TRIALS: usize = 32;

/// The simulated step under a selection being made (see [`StepRecord::select`]).
#[derive(Clone)]
struct Sim {
    /// The bytes held at each position of the step, beside `base_live`.
    held: Vec<i64>,
    /// For each forward pass, where each chosen tensor comes back whole (recomputed, or
    /// unpacked): at the backward pass's first read of it, or earlier, with a recomputation
    /// that reads it.
    back_at: Vec<Vec<u64>>,
}

/// What recomputing a chosen tensor needs beside the inputs the program holds (positions in
/// a forward pass).
#[derive(Default)]
struct Chain {
    /// Inputs the program drops before the tensor is read back, dropped and recomputed with it.
    members: Vec<usize>,
    /// Small inputs the program drops before then, held for it by its recipe.
    small: Vec<usize>,
}

/// One forward pass's drop of a candidate tensor, as positions in the step.
struct Span {
    /// Where it is dropped.
    dropped: u64,
    /// Where the backward pass first reads it.
    back: u64,
    chain: Chain,
}

/// A tensor [`StepRecord::select`] may choose.
struct Candidate {
    /// Its position in a forward pass.
    position: usize,
    /// Where it is dropped, in a forward pass.
    drop_at: u64,
    /// What recomputing it and its chain costs per byte it holds.
    cost: f64,
    /// Its drop in each forward pass.
    spans: Vec<Span>,
}
