//! Reclaiming memory under the budget. Every reason to free memory is a [`Reclaim`], and
//! [`Budget::reclaim`] is the one way in: one target arithmetic ([`Reclaim::target`]), one
//! ranking of candidates ([`Candidate::cmp_rank`](super::Candidate::cmp_rank)), one ladder
//! of searches, as PyTorch's caching allocator climbs one retry ladder whatever the
//! allocation.
//!
//! The searches, cheapest first: with a learned step, every cell scored by its predicted next
//! read in one deterministic pass; without one, a random sample of about √n cells per eviction
//! (as DTR does), then one scan of every cell. Within a scan: recomputable (or compressible)
//! tensors first, then buffers shared by recomputable views, then offloads, read to host
//! memory in one batch.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};

use super::{Action, Budget, Counter, Evictable, EvictionMode, HostBatch, Policy, unpack_next};
use crate::ledger::Ledger;
use crate::units::format_bytes;
use crate::vocabulary::OpId;

/// Why memory is reclaimed: it decides how far live bytes must come down and what may be
/// done to get there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reclaim {
    /// `op` ran (`None`: the budget itself changed) and needed `needed` bytes for its inputs,
    /// output and what it restored: live bytes must be back within the budget, or the step
    /// cannot go on and the reclaim panics with the figures (Burn's ops have no error
    /// channel).
    AfterOp { op: Option<OpId>, needed: u64 },
    /// `op` is about to run with its inputs resident and held: room under the budget for its
    /// output, rather than live bytes over it until the op has run. The output's size is the
    /// one the learned step says comes next, if it says `op` comes next; otherwise (no step
    /// learned yet, or the program left the learned order, as a layer mistaken for a step or
    /// autodiff recomputing in another order) the op's largest input, `largest_input`, as for
    /// element-wise ops and their gradients, the largest outputs of a step.
    BeforeOp { op: OpId, largest_input: u64 },
    /// A tensor of `bytes` is about to be made (restored, or an output whose size is known):
    /// room for it under the budget, if it can be had.
    Room { bytes: u64 },
    /// Between the restores of a chain, whose op has not finished: back towards the budget,
    /// as far as it goes.
    Relieve,
    /// An allocation of `bytes` failed on the device: free that much and a sixteenth of the
    /// budget more (so the next allocations do not each fail again) from inside the
    /// allocator, on the device's own thread: only tensors whose drop gives memory back at
    /// once, no kernel launched (so no compression and no offload), no call to the device,
    /// and a cell another thread is using skipped, never waited for.
    Allocation { bytes: u64 },
}

/// How far a reclaim goes (see [`Reclaim::target`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// Live bytes back within the budget, `limit`: a round of the budget's pressure.
    Within(u64),
    /// Live bytes at most `live_limit`, so that a tensor of `bytes` about to be made fits: a
    /// room round.
    Room { live_limit: u64, bytes: u64 },
    /// This many bytes freed without device work.
    Free(u64),
}

impl Reclaim {
    /// What this reclaim asks for under a budget of `limit` bytes with `live` bytes live;
    /// `learned`: the op and bytes the learned step says come next. `None`: nothing to do.
    fn target(self, limit: u64, live: u64, learned: Option<(OpId, u64)>) -> Option<Target> {
        // Room for a tensor as large as the budget is not to be had by evicting.
        let room = |bytes: u64| {
            (live.saturating_add(bytes) > limit && bytes < limit).then(|| Target::Room {
                live_limit: limit - bytes,
                bytes,
            })
        };
        match self {
            Reclaim::AfterOp { .. } | Reclaim::Relieve => {
                (live > limit).then_some(Target::Within(limit))
            }
            Reclaim::BeforeOp { op, largest_input } => {
                let bytes = match learned {
                    Some((learned_op, bytes)) if learned_op == op => bytes,
                    _ => largest_input,
                };
                if bytes == 0 { None } else { room(bytes) }
            }
            Reclaim::Room { bytes } => room(bytes),
            Reclaim::Allocation { bytes } => Some(Target::Free(bytes.saturating_add(limit / 16))),
        }
    }
}

impl Budget {
    /// Frees memory for `request` (see [`Reclaim`]); the bytes freed. Without a budget, or
    /// when live bytes already allow what `request` asks for, it returns at once: it runs
    /// before and after every op.
    #[inline]
    pub(crate) fn reclaim(&self, ledger: &Ledger, request: Reclaim) -> u64 {
        let Some(limit) = self.limit() else { return 0 };
        let learned = match request {
            Reclaim::BeforeOp { .. } => unpack_next(self.next_made.load(Relaxed)),
            _ => None,
        };
        match request.target(limit, ledger.live_bytes(), learned) {
            Some(target) => self.reclaim_to(ledger, request, target),
            None => 0,
        }
    }

    fn reclaim_to(&self, ledger: &Ledger, request: Reclaim, target: Target) -> u64 {
        let before = ledger.live_bytes();
        match target {
            Target::Within(limit) => {
                self.evict_down(ledger, limit);
                if let Reclaim::AfterOp { op, needed } = request
                    && ledger.live_bytes() > limit
                {
                    self.cannot_keep(ledger, limit, op, needed);
                }
            }
            Target::Room { live_limit, bytes } => self.make_room(ledger, live_limit, bytes),
            Target::Free(bytes) => return self.free_without_device_work(ledger, bytes),
        }
        before.saturating_sub(ledger.live_bytes())
    }

    /// Live bytes stay over `limit` after `op`, which needed `needed` bytes, and nothing more
    /// can be evicted: the step cannot go on.
    fn cannot_keep(&self, ledger: &Ledger, limit: u64, op: Option<OpId>, needed: u64) -> ! {
        let live = ledger.live_bytes();
        let holders = ledger
            .holders()
            .into_iter()
            .take(5)
            .map(|(op, bytes, n)| format!("{} {} in {n}", op.name(), format_bytes(bytes)))
            .collect::<Vec<_>>()
            .join(", ");
        let after = op.map_or("changing the budget".to_string(), |op| {
            op.name().to_string()
        });
        let host = self
            .host_limit()
            .map(|host_limit| {
                format!(
                    " Offloads hold {} of the host memory they may use ({}; \
                     `memory::set_host_limit`).",
                    format_bytes(self.host_held()),
                    format_bytes(host_limit)
                )
            })
            .unwrap_or_default();
        panic!(
            "frugal: the memory budget of {} on {} cannot be kept after {after}: {} are live \
             and nothing more can be evicted (the op's inputs, output and the tensors it \
             restored take {}). Biggest holders: {holders}.{host} Raise the budget \
             (accepted: at least the largest op's inputs and output plus what cannot be \
             recomputed or offloaded).",
            format_bytes(limit),
            ledger.label,
            format_bytes(live),
            format_bytes(needed),
        );
    }

    /// Evicts down to `live_limit` live bytes so that a tensor of `bytes` about to be made
    /// fits under the budget; does not fail.
    fn make_room(&self, ledger: &Ledger, live_limit: u64, bytes: u64) {
        self.counters.add(Counter::room_rounds, 1);
        let position = {
            let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
            plan.note_room();
            log::log_enabled!(log::Level::Trace).then(|| plan.position())
        };
        let before = position.map(|_| (ledger.live_bytes(), self.stats()));
        self.evict_down_to(ledger, live_limit);
        if let (Some(position), Some((live, was))) = (position, before) {
            let now = self.stats();
            log::trace!(
                "frugal: room for {bytes} B at step position {position:?}: live {live} -> {} B \
                 ({} recomputable dropped, {} offloaded)",
                ledger.live_bytes(),
                now.evictions.saturating_sub(was.evictions),
                now.offloads.saturating_sub(was.offloads),
            );
        }
    }

    /// The resident cells of each buffer that several cells share, for the buffers whose every
    /// holder is a cell (no tensor outside the budget's view also points into them).
    fn shared_buffers(&self) -> Vec<Vec<Arc<dyn Evictable>>> {
        let mut groups: std::collections::HashMap<usize, (usize, Vec<Arc<dyn Evictable>>)> =
            Default::default();
        for cell in self.cells() {
            if let Some((storage, holders)) = cell.storage_holders()
                && holders > 1
            {
                groups
                    .entry(storage)
                    .or_insert((holders, Vec::new()))
                    .1
                    .push(cell);
            }
        }
        let mut groups: Vec<_> = groups
            .into_values()
            .filter(|(holders, cells)| *holders == cells.len())
            .map(|(_, cells)| cells)
            .collect();
        // In creation order, so that ties are broken the same way every step.
        groups.sort_by_key(|cells| cells.iter().map(|c| c.info().ordinal).min());
        groups
    }

    /// The cheapest of `groups` (see [`Self::shared_buffers`]) whose cells can all be
    /// recomputed, taken out of the list.
    fn shared_group(
        groups: &mut Vec<Vec<Arc<dyn Evictable>>>,
        now: u64,
        policy: &Policy,
    ) -> Option<Vec<Arc<dyn Evictable>>> {
        let (index, _) = groups
            .iter()
            .enumerate()
            .filter_map(|(index, cells)| {
                let mut score = 0.0;
                for cell in cells {
                    let candidate = cell.candidate(now, policy, true)?;
                    (candidate.action == Action::Recompute).then_some(())?;
                    score += candidate.score;
                }
                Some((index, score))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        Some(groups.swap_remove(index))
    }

    /// The cheapest of `groups` held by one tensor that can be offloaded (not strided, not
    /// recomputable) and by views of it that can all be recomputed: the views, and the tensor,
    /// taken out of the list.
    fn offloadable_group(
        groups: &mut Vec<Vec<Arc<dyn Evictable>>>,
        now: u64,
        policy: &Policy,
    ) -> Option<OffloadableGroup> {
        if policy.mode == EvictionMode::RecomputeOnly {
            return None;
        }
        let (index, _, root) = groups
            .iter()
            .enumerate()
            .filter_map(|(index, cells)| {
                let mut root = None;
                let mut score = 0.0;
                for (at, cell) in cells.iter().enumerate() {
                    match cell.candidate(now, policy, true) {
                        Some(c) if c.action == Action::Recompute && cell.info().strided => {
                            score += c.score;
                        }
                        _ if root.is_none() && !cell.info().strided => root = Some(at),
                        _ => return None,
                    }
                }
                let root = root?;
                score += policy.host_cost_per_byte;
                Some((index, score, root))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        let mut views = groups.swap_remove(index);
        let root = views.swap_remove(root);
        Some(OffloadableGroup { views, root })
    }

    /// Frees at least `bytes` if it can, by evicting tensors it can recompute and whose drop
    /// gives their memory back at once (alone, then buffers shared with views); returns the
    /// bytes freed. This is what an allocator's
    /// out-of-memory handler may do from inside an allocation, on the device's own thread:
    /// no kernel may be launched there (so no compression and no offload) and no call made to
    /// the device, and a cell that another thread is using is skipped, never waited for.
    pub(super) fn free_without_device_work(&self, ledger: &Ledger, bytes: u64) -> u64 {
        self.counters.add(Counter::allocation_rescues, 1);
        let before = ledger.live_bytes();
        let now = self.clock.load(Relaxed);
        let policy = self.policy();
        let mut ranked: Vec<_> = self
            .cells()
            .into_iter()
            .filter(|cell| cell.drop_frees_at_once())
            .filter_map(|cell| Some((cell.candidate(now, &policy, false)?, cell)))
            .collect();
        ranked.sort_by(|a, b| a.0.cmp_rank(&b.0));
        let enough = || before.saturating_sub(ledger.live_bytes()) >= bytes;
        for (_, cell) in ranked {
            if enough() {
                break;
            }
            cell.evict();
        }
        // Buffers shared by a tensor and its views (a product's output split into heads) are
        // freed only when every one of them goes.
        let mut groups = self.shared_buffers();
        groups.retain(|cells| cells.iter().all(|cell| cell.drop_frees_at_once()));
        while !enough()
            && let Some(group) = Self::shared_group(&mut groups, now, &policy)
        {
            group.iter().for_each(|cell| {
                cell.evict();
            });
        }
        let freed = before.saturating_sub(ledger.live_bytes());
        self.counters.add(Counter::rescued_bytes, freed);
        log::info!(
            "frugal: out of device memory on {} asking for {}: the budget dropped {} of \
             recomputable tensors for the allocator to try again",
            ledger.label,
            format_bytes(bytes),
            format_bytes(freed)
        );
        freed
    }

    fn evict_down(&self, ledger: &Ledger, limit: u64) {
        self.counters.add(Counter::budget_rounds, 1);
        self.plan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note_pressure();
        let before =
            log::log_enabled!(log::Level::Debug).then(|| (ledger.live_bytes(), self.stats()));
        self.evict_down_to(ledger, limit);
        if let Some((before, was)) = before {
            let now = self.stats();
            log::debug!(
                "frugal: budget {} on {}: live {} -> {} ({} recomputable dropped, {} compressed, \
                 {} offloaded to the host)",
                format_bytes(limit),
                ledger.label,
                format_bytes(before),
                format_bytes(ledger.live_bytes()),
                now.evictions.saturating_sub(was.evictions),
                now.compressions.saturating_sub(was.compressions),
                now.offloads.saturating_sub(was.offloads),
            );
        }
    }

    fn evict_down_to(&self, ledger: &Ledger, limit: u64) {
        let started = std::time::Instant::now();
        let now = self.clock.load(Relaxed);
        let policy = self.policy();
        // With a learned step, every cell is scored by its predicted next read, in one
        // deterministic pass: the same choices every step.
        if self.predict_all(policy.planned) {
            // Tensors to recompute exactly to the limit: what goes beyond is read soon (under
            // segments, often a tensor of the segment just brought back, whose recomputation
            // replays the segment), and the next search is cheap beside that. Offloads, each
            // batch a wait for the queue to drain, a little below it.
            let waited = self.evict_from_all(ledger, [limit, limit - limit / 16], now, &policy);
            let elapsed = started.elapsed().as_nanos() as u64;
            self.counters
                .add(Counter::search_nanos, elapsed.saturating_sub(waited));
            self.counters.add(Counter::planned_rounds, 1);
            return;
        }
        // Evict a little below the limit, so the next few ops do not each search again.
        let target = limit - limit / 16;
        let best = |cells: Vec<Arc<dyn Evictable>>| {
            cells
                .into_iter()
                .filter_map(|cell| Some((cell.candidate(now, &policy, false)?, cell)))
                .min_by(|a, b| a.0.cmp_rank(&b.0))
        };
        // As DTR does, score a random sample of about sqrt(n) tensors per eviction rather
        // than all n, as long as the sample holds one to recompute.
        let mut round = 0u64;
        let mut failures = 0;
        while ledger.live_bytes() > target && failures < 8 {
            round += 1;
            match best(self.sample(now ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15))) {
                Some((candidate, cell)) if candidate.action != Action::Offload => {
                    match apply(candidate.action, &cell) {
                        true => failures = 0,
                        // Another thread may be using the cell; try others a few times.
                        false => failures += 1,
                    }
                }
                _ => break,
            }
        }
        let waited = if ledger.live_bytes() > target {
            self.evict_from_all(ledger, [target; 2], now, &policy)
        } else {
            0
        };
        let elapsed = started.elapsed().as_nanos() as u64;
        self.counters
            .add(Counter::search_nanos, elapsed.saturating_sub(waited));
    }

    /// Sets every registered cell's predicted next read from the step plan; whether a step is
    /// known (without one, predictions are cleared and cells are scored by staleness).
    fn predict_all(&self, planned: bool) -> bool {
        let plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        let known = planned && plan.figures().period > 0;
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        for cell in registry.iter().filter_map(Weak::upgrade) {
            let info = cell.info();
            let predicted = if known {
                plan.distance(info.ordinal)
            } else {
                None
            };
            info.predicted.store(predicted.unwrap_or(u64::MAX), Relaxed);
            info.outlives_step
                .store(known && plan.outlives_step(info.ordinal), Relaxed);
        }
        known
    }

    /// The slow path of [`Self::evict_down`], when the sample has nothing to recompute: one
    /// scan of every tensor, then recomputable tensors in order of score, then buffers
    /// shared by several recomputable tensors, then offloads, all read in one batch. Returns
    /// the nanoseconds spent waiting for that read. `[target, offload_target]`: what live
    /// bytes the evictions on the device, then the offloads, bring them down to.
    pub(super) fn evict_from_all(
        &self,
        ledger: &Ledger,
        [target, offload_target]: [u64; 2],
        now: u64,
        policy: &Policy,
    ) -> u64 {
        let mut ranked: Vec<_> = self
            .cells()
            .into_iter()
            .filter_map(|cell| Some((cell.candidate(now, policy, false)?, cell)))
            .collect();
        ranked.sort_by(|a, b| a.0.cmp_rank(&b.0));
        let (on_device, offload): (Vec<_>, Vec<_>) = ranked
            .into_iter()
            .partition(|(candidate, _)| candidate.action != Action::Offload);
        for (candidate, cell) in on_device {
            if ledger.live_bytes() <= target {
                return 0;
            }
            apply(candidate.action, &cell);
        }
        // A tensor and its views share a buffer that no single eviction frees. The groups
        // are found once: evicting one group leaves the others' holders as they were.
        let mut groups = self.shared_buffers();
        while ledger.live_bytes() > target
            && let Some(group) = Self::shared_group(&mut groups, now, policy)
        {
            // Every cell of the group must go for the buffer to be freed: no short circuit.
            if group.iter().filter(|cell| cell.evict()).count() == 0 {
                break;
            }
        }
        let mut batch = OffloadBatch::default();
        for (_, cell) in offload {
            if ledger.live_bytes() <= offload_target {
                break;
            }
            batch.add(self, &cell);
        }
        // A buffer shared by a tensor that can only be offloaded and views of it: once the
        // views are evicted (recomputed from the tensor when read), the tensor is alone on its
        // buffer and can be offloaded.
        while ledger.live_bytes() > offload_target
            && let Some(OffloadableGroup { views, root }) =
                Self::offloadable_group(&mut groups, now, policy)
        {
            if !self.host_has_room(batch.pending, root.info().bytes)
                || !views.iter().all(|view| view.evict())
                || !batch.add(self, &root)
            {
                break;
            }
        }
        let pending = batch.pending;
        let Some(waited) = batch.finish(self) else {
            return 0;
        };
        log::trace!(
            "frugal: offloaded {} to host memory on {} in {:.1} ms",
            format_bytes(pending),
            ledger.label,
            waited as f64 / 1e6
        );
        waited
    }
}

/// Tensors gathered to be read to host memory in one transaction (the device's queue drains
/// once for all of them).
#[derive(Default)]
pub(super) struct OffloadBatch {
    batch: Option<Box<dyn HostBatch>>,
    /// Bytes of the tensors added so far.
    pub(super) pending: u64,
}

impl OffloadBatch {
    /// Adds `cell` if host memory has room for it under the budget's host limit (past it a
    /// tensor stays, and the budget may fail with a message, rather than the process being
    /// killed for memory); whether it was added.
    pub(super) fn add(&mut self, budget: &Budget, cell: &Arc<dyn Evictable>) -> bool {
        let bytes = cell.info().bytes;
        let added = budget.host_has_room(self.pending, bytes)
            && cell
                .clone()
                .offload_into(&mut **self.batch.get_or_insert_with(|| cell.host_batch()));
        if added {
            self.pending += bytes;
        }
        added
    }

    /// Reads the batch to host memory and counts it; the nanoseconds waited, or `None` if
    /// nothing was read.
    pub(super) fn finish(self, budget: &Budget) -> Option<u64> {
        let started = std::time::Instant::now();
        if self.batch?.finish() == 0 {
            return None;
        }
        let waited = started.elapsed().as_nanos() as u64;
        budget.counters.add(Counter::offload_batches, 1);
        budget.counters.add(Counter::offload_nanos, waited);
        Some(waited)
    }
}

/// A buffer held by one tensor that can be offloaded and by recomputable views of it.
struct OffloadableGroup {
    views: Vec<Arc<dyn Evictable>>,
    root: Arc<dyn Evictable>,
}

/// Carries out an eviction that needs no wait for the device: recompute later, or compress.
fn apply(action: Action, cell: &Arc<dyn Evictable>) -> bool {
    match action {
        Action::Compress => cell.compress(),
        Action::Pack => cell.pack(),
        _ => cell.evict(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::families::float::{Op, op};

    #[test]
    fn every_reclaim_has_one_target_arithmetic() {
        let (exp, sum) = (op(Op::float_exp), op(Op::float_sum));
        let limit = 1600;
        let after = Reclaim::AfterOp {
            op: Some(exp),
            needed: 10,
        };
        assert_eq!(after.target(limit, 1600, None), None);
        assert_eq!(after.target(limit, 1601, None), Some(Target::Within(1600)));
        assert_eq!(
            Reclaim::Relieve.target(limit, 1700, None),
            Some(Target::Within(1600))
        );
        let room = |live_limit, bytes| Some(Target::Room { live_limit, bytes });
        assert_eq!(Reclaim::Room { bytes: 100 }.target(limit, 1500, None), None);
        assert_eq!(
            Reclaim::Room { bytes: 100 }.target(limit, 1501, None),
            room(1500, 100)
        );
        // Room for a tensor as large as the budget is not sought.
        assert_eq!(Reclaim::Room { bytes: 1600 }.target(limit, 1, None), None);
        // Before an op: the learned step's size when it names this op, else the largest input.
        let before = Reclaim::BeforeOp {
            op: exp,
            largest_input: 100,
        };
        assert_eq!(before.target(limit, 1550, Some((exp, 40))), None);
        assert_eq!(before.target(limit, 1570, Some((exp, 40))), room(1560, 40));
        assert_eq!(before.target(limit, 1550, Some((sum, 40))), room(1500, 100));
        assert_eq!(before.target(limit, 1550, Some((exp, 0))), None);
        // An allocation's rescue frees a sixteenth of the budget more than it asked.
        assert_eq!(
            Reclaim::Allocation { bytes: 7 }.target(limit, 0, None),
            Some(Target::Free(107))
        );
    }
}
