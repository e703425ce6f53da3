//! Layer 2, the eviction engine: a device's memory budget, the registry of cells it may evict,
//! and the search that picks which to drop and how when live bytes exceed the budget
//! (`reclaim.rs`, entered through [`Budget::reclaim`] for every [`Reclaim`]).
//!
//! Owns: the budget's limit and [`Policy`], the registry, the logical clock, the counters
//! behind [`RematStats`]. Imports: `ledger`, `vocabulary`, `units`. It sees cells only through
//! [`Evictable`], the small trait `crate::remat`'s cells implement (as cubecl-runtime's
//! memory management sees its pools through one trait), so it is tested here on a mock.

mod cuts;
mod host_share;
mod plan;
mod policy;
mod reclaim;
mod stats;

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use crate::units::LowPrecision;
use crate::vocabulary::OpId;

use cuts::SegmentCuts;
use host_share::{HostShare, PROCESS_HOST_SHARE};
pub(crate) use plan::{CHAIN_DEPTH, SegmentEvent, StepPlan};
pub use policy::{Action, EvictionMode, Policy};
pub(crate) use policy::{Candidate, Shrink};
use reclaim::OffloadBatch;
pub(crate) use reclaim::Reclaim;
pub use stats::RematStats;
pub(crate) use stats::{Counter, Counters};

/// Where a cell's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Resident,
    Evicted,
    Offloaded,
    /// In a [`HostBatch`] that has not been read yet.
    Offloading,
    /// On the device in fewer bytes: in a lower-precision storage type, cast back when read,
    /// or packed into booleans (a tensor of only 0 and 1), made a float again when read.
    Compressed,
    Gone,
}

/// A managed tensor being made, as the step plan records it (see [`Budget::on_create`]).
pub(crate) struct Made {
    /// Its op, shape and type, hashed.
    pub(crate) token: u64,
    /// The op that made its buffer.
    pub(crate) op: OpId,
    /// Bytes of its buffer.
    pub(crate) bytes: u64,
    /// Live bytes on the device as it is made.
    pub(crate) live: u64,
    /// What re-running its op alone would cost, if it can be recomputed from its inputs
    /// alone (see [`StepPlan::on_create`]).
    pub(crate) recompute: Option<f64>,
    /// The ordinal of the tensor whose buffer it shares, if any.
    pub(crate) owner: Option<u64>,
    /// What running its op cost (see [`crate::vocabulary::cost::op_cost`]), recomputable or not.
    pub(crate) cost: f64,
    /// It was made by the forward pass (an activation).
    pub(crate) forward: bool,
    /// The bytes it would hold packed, if it can be (see [`CellInfo::packed`]).
    pub(crate) packed: Option<u64>,
}

/// What the budget's step plan says of a tensor being made (see [`Budget::on_create`]).
pub(crate) struct Created {
    /// Its position among the managed tensors the program created.
    pub(crate) ordinal: u64,
    /// With forward segments on, the same tensor one step earlier outlived its step: a
    /// parameter or optimizer state.
    pub(crate) outlives_step: bool,
    /// A selection drops it at a later cut (see [`StepPlan::is_chosen`]): the ordinal whose
    /// forward reads decide when, its own or, for a view, its buffer's. A view of a chosen
    /// tensor goes with it, since the buffer is freed only when every tensor sharing it is
    /// dropped, and the backward pass holds views (attention's q, k and v of a fused
    /// projection) until it reads them.
    pub(crate) chosen: Option<u64>,
    /// It is made in a forward pass under a selection (see [`StepPlan::under_selection`]).
    pub(crate) under_selection: bool,
}

/// What the engine reads of a cell without locking it.
pub(crate) struct CellInfo {
    /// The op that produced it.
    pub(crate) op: OpId,
    /// Bytes of its buffer.
    pub(crate) bytes: u64,
    /// Estimated cost of re-running the op alone (see [`crate::vocabulary::cost::op_cost`]).
    pub(crate) cost: f64,
    /// The checkpoint scope the cell was created in (0: none).
    pub(crate) scope: u64,
    /// The inner tensor may have a non-standard memory layout (a view, or an elementwise
    /// result of one). A host copy comes back contiguous, and some backends round
    /// reductions differently by layout, so such tensors are recomputed, never offloaded.
    pub(crate) strided: bool,
    /// Its position among the managed tensors the program created (see [`StepPlan`]).
    pub(crate) ordinal: u64,
    /// The ordinal of the first managed tensor on its buffer (its own, unless it is a view
    /// or shares its input's buffer): the step plan counts a buffer's reads there.
    pub(crate) owner: u64,
    last_use: AtomicU64,
    /// Creations until its next read as the step plan predicts it (`u64::MAX`: none), set by
    /// the engine before it scores the cell.
    predicted: AtomicU64,
    /// Whether the step plan expects it to outlive the step (parameters, optimizer state).
    outlives_step: AtomicBool,
    /// Kept across a cut of the forward pass's segments (see [`Self::mark_checkpoint`]).
    checkpoint: AtomicBool,
    dead: AtomicBool,
    /// The bytes it would hold packed into booleans, if it holds only 0 and 1 (dropout's
    /// mask) and packing frees bytes (see [`Evictable::pack`]).
    pub(crate) packed: Option<u64>,
}

impl CellInfo {
    /// A cell just used at time `now`.
    pub(crate) fn new(
        op: OpId,
        bytes: u64,
        cost: f64,
        scope: u64,
        strided: bool,
        (now, ordinal, owner): (u64, u64, u64),
    ) -> Self {
        Self {
            op,
            bytes,
            cost,
            scope,
            strided,
            ordinal,
            owner,
            last_use: AtomicU64::new(now),
            predicted: AtomicU64::new(u64::MAX),
            outlives_step: AtomicBool::new(false),
            checkpoint: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            packed: None,
        }
    }

    /// The same cell, packable into `packed` bytes (see [`Self::packed`]).
    pub(crate) fn with_packed(self, packed: Option<u64>) -> Self {
        Self { packed, ..self }
    }

    /// Whether the step plan expects it to outlive the step.
    pub(crate) fn outlives_step(&self) -> bool {
        self.outlives_step.load(Relaxed)
    }

    /// Marks it as a segment's checkpoint: a cut of the forward pass kept it because the
    /// segments after the cut read it. Recomputing it would replay the closed segment before
    /// it, whose tensors are gone, and that segment's checkpoint in turn: one read in the
    /// backward pass would restore segment after segment at once. So the budget never drops it
    /// to be recomputed; it may move it to the host.
    pub(crate) fn mark_checkpoint(&self) {
        self.checkpoint.store(true, Relaxed);
    }

    /// Whether a cut of the forward pass kept it (see [`Self::mark_checkpoint`]).
    pub(crate) fn is_checkpoint(&self) -> bool {
        self.checkpoint.load(Relaxed)
    }

    /// Creations until its next read, as last predicted by the step plan.
    pub(crate) fn predicted(&self) -> Option<u64> {
        let predicted = self.predicted.load(Relaxed);
        (predicted != u64::MAX).then_some(predicted)
    }

    /// When it was last used, on the budget's clock.
    pub(crate) fn last_use(&self) -> u64 {
        self.last_use.load(Relaxed)
    }

    /// Notes a use at time `now`.
    pub(crate) fn touch(&self, now: u64) {
        self.last_use.store(now, Relaxed);
    }

    /// Whether the program holds no handle to it any more.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Relaxed)
    }

    /// Marks it dead; returns whether it already was.
    pub(crate) fn set_dead(&self) -> bool {
        self.dead.swap(true, Relaxed)
    }
}

/// A cell as the engine sees it: what it is, and the three ways to free its buffer.
pub(crate) trait Evictable: Send + Sync {
    /// Its identity and bookkeeping.
    fn info(&self) -> &CellInfo;
    /// Where its data is (waits if it is in use).
    fn status(&self) -> Status;
    /// The address of a resident cell's buffer record and how many hold it; `None` if not
    /// resident or in use right now.
    fn storage_holders(&self) -> Option<(usize, usize)>;
    /// How this cell could be evicted now, and at what cost; `None` if it cannot be. With
    /// `shared`, the cell is scored as one of a group of cells that share its buffer and are
    /// evicted together (recomputation only).
    fn candidate(&self, now: u64, policy: &Policy, shared: bool) -> Option<Candidate>;
    /// Drops the buffer, to be recomputed when read; whether it was evicted. Never blocks: a
    /// cell in use elsewhere is skipped.
    fn evict(&self) -> bool;
    /// Brings the data back to the device if it is not there (recomputing or uploading what
    /// it needs).
    fn restore(&self);
    /// Keeps the data on the device in the budget's 16-bit storage type; whether it was
    /// compressed (resident, unpinned, unshared f32 only).
    fn compress(&self) -> bool;
    /// Keeps a tensor of only 0 and 1 on the device as booleans, exactly (see
    /// [`CellInfo::packed`]); whether it was packed (resident, unpinned, unshared only).
    fn pack(&self) -> bool;
    /// An empty batch for offloading cells of this one's backend together.
    fn host_batch(&self) -> Box<dyn HostBatch>;
    /// Moves the data into `batch` (made by [`Self::host_batch`] of a cell of the same
    /// backend); its device bytes leave the ledger now. `false` if it cannot be offloaded.
    fn offload_into(self: Arc<Self>, batch: &mut dyn HostBatch) -> bool;
    /// Whether dropping its device tensor gives the memory back at once, with no call to the
    /// device (see [`Reclaim::Allocation`]).
    fn drop_frees_at_once(&self) -> bool;
    /// Forgets how to recompute it, if it is on the device: a segment's checkpoint, which
    /// the budget never recomputes, so that the dropped tensors its recipe held (and theirs,
    /// back to the last checkpoint) can go.
    fn forget_recipe(&self);
}

/// Tensors on their way to host memory. They are read back together in one transaction: each
/// read from a GPU waits for the device's queue to drain, so one wait for many tensors instead
/// of one per tensor keeps the device busy.
pub(crate) trait HostBatch {
    /// The batch itself, for the cells of its backend to add themselves.
    fn as_any(&mut self) -> &mut dyn Any;
    /// Reads every tensor of the batch and hands each cell its host copy; returns how many.
    fn finish(self: Box<Self>) -> usize;
}

const NO_LIMIT: u64 = u64::MAX;

/// A device's budget: the limit, the policy, the registry of managed cells and the counters.
pub(crate) struct Budget {
    limit: AtomicU64,
    clock: AtomicU64,
    mode: AtomicU8,
    host_cost_bits: AtomicU64,
    max_depth: AtomicU32,
    scope_keeps_products: AtomicBool,
    planned: AtomicBool,
    forward_segments: AtomicBool,
    /// The storage type of compressed tensors ([`LowPrecision::code`]; 0: none).
    storage: AtomicU8,
    /// The most bytes this device's offloads may keep in host memory, when the user chose a
    /// limit ([`NO_LIMIT`]: none).
    host_limit: AtomicU64,
    /// Whether `host_limit` was chosen by the user; else the device's offloads count against
    /// `host_share`, which every such device shares.
    host_limit_chosen: AtomicBool,
    host_share: &'static HostShare,
    registry: Mutex<Vec<Weak<dyn Evictable>>>,
    /// The learned step and the reads recorded under it.
    plan: Mutex<StepPlan>,
    /// Under a limit and a learned step: the op and bytes of the tensor the program makes next
    /// (see [`StepPlan::next_made`]) packed by [`pack_next`], for [`Reclaim::BeforeOp`] to
    /// read without the plan's lock; 0 for none.
    next_made: AtomicU64,
    counters: Counters,
    /// The plan's cuts carried out, and the segment new tensors are made in.
    cuts: SegmentCuts,
    /// The next checkpoint scope id, segments' and the program's own scopes' alike.
    next_scope_id: AtomicU64,
    /// See [`Budget::set_recompute_limit`] (f64 bits; 0: none).
    recompute_limit_bits: AtomicU64,
    /// The pass being watched against the recompute limit.
    pass: PassWatch,
    /// Called when a step begins under cuts (see [`Budget::set_step_hook`]).
    step_hook: Mutex<Option<StepHook>>,
}

/// What [`Budget::set_step_hook`] calls when a step begins under cuts: with `true` if they
/// had stopped adapting (the step is settled).
pub(crate) type StepHook = Box<dyn Fn(bool) + Send + Sync>;

impl Default for Budget {
    fn default() -> Self {
        let policy = Policy::default();
        Self {
            limit: AtomicU64::new(NO_LIMIT),
            clock: AtomicU64::new(0),
            mode: AtomicU8::new(policy.mode as u8),
            host_cost_bits: AtomicU64::new(policy.host_cost_per_byte.to_bits()),
            max_depth: AtomicU32::new(policy.max_depth),
            scope_keeps_products: AtomicBool::new(policy.scope_keeps_products),
            planned: AtomicBool::new(policy.planned),
            forward_segments: AtomicBool::new(policy.forward_segments),
            storage: AtomicU8::new(0),
            host_limit: AtomicU64::new(NO_LIMIT),
            host_limit_chosen: AtomicBool::new(false),
            host_share: &PROCESS_HOST_SHARE,
            registry: Mutex::new(Vec::new()),
            plan: Mutex::new(StepPlan::default()),
            next_made: AtomicU64::new(0),
            counters: Counters::default(),
            cuts: SegmentCuts::default(),
            next_scope_id: AtomicU64::new(1),
            recompute_limit_bits: AtomicU64::new(0),
            pass: PassWatch::default(),
            step_hook: Mutex::new(None),
        }
    }
}

impl Budget {
    pub(crate) fn limit(&self) -> Option<u64> {
        let limit = self.limit.load(Relaxed);
        (limit != NO_LIMIT).then_some(limit)
    }

    pub(crate) fn set_limit(&self, limit: Option<u64>) {
        self.limit.store(limit.unwrap_or(NO_LIMIT), Relaxed);
    }

    /// The most bytes offloads may keep in host memory, if limited: the user's limit for
    /// this device, else the share of the process.
    pub(crate) fn host_limit(&self) -> Option<u64> {
        if self.host_limit_chosen() {
            let limit = self.host_limit.load(Relaxed);
            (limit != NO_LIMIT).then_some(limit)
        } else {
            self.host_share.limit()
        }
    }

    /// Sets the host limit: `chosen`, the user's for this device (kept by a new budget);
    /// else the process's share, if no budget set it before.
    pub(crate) fn set_host_limit(&self, limit: Option<u64>, chosen: bool) {
        if chosen {
            self.host_limit.store(limit.unwrap_or(NO_LIMIT), Relaxed);
        } else if let Some(limit) = limit {
            self.host_share.limit_once(limit);
        }
        self.host_limit_chosen.store(chosen, Relaxed);
    }

    /// Whether the user chose the host limit.
    pub(crate) fn host_limit_chosen(&self) -> bool {
        self.host_limit_chosen.load(Relaxed)
    }

    /// The host bytes counted against [`Budget::host_limit`]: this device's offloads under
    /// the user's limit, else every device's under the process's share.
    fn host_held(&self) -> u64 {
        if self.host_limit_chosen() {
            self.counters.read().host_bytes
        } else {
            self.host_share.held()
        }
    }

    /// Whether `bytes` more fit in host memory beside the `pending` bytes of a batch being
    /// filled.
    fn host_has_room(&self, pending: u64, bytes: u64) -> bool {
        let limit = self.host_limit().unwrap_or(NO_LIMIT);
        self.host_held()
            .saturating_add(pending)
            .saturating_add(bytes)
            <= limit
    }

    pub(crate) fn policy(&self) -> Policy {
        Policy {
            mode: match self.mode.load(Relaxed) {
                1 => EvictionMode::RecomputeOnly,
                2 => EvictionMode::OffloadOnly,
                _ => EvictionMode::Auto,
            },
            host_cost_per_byte: f64::from_bits(self.host_cost_bits.load(Relaxed)),
            max_depth: self.max_depth.load(Relaxed),
            scope_keeps_products: self.scope_keeps_products.load(Relaxed),
            planned: self.planned.load(Relaxed),
            forward_segments: self.forward_segments.load(Relaxed),
        }
    }

    /// The longest chain of evicted tensors one read may recompute ([`Policy::max_depth`]).
    #[inline]
    pub(crate) fn max_depth(&self) -> u32 {
        self.max_depth.load(Relaxed)
    }

    pub(crate) fn set_policy(&self, policy: Policy) {
        self.mode.store(policy.mode as u8, Relaxed);
        self.host_cost_bits
            .store(policy.host_cost_per_byte.to_bits(), Relaxed);
        self.max_depth.store(policy.max_depth, Relaxed);
        self.scope_keeps_products
            .store(policy.scope_keeps_products, Relaxed);
        self.planned.store(policy.planned, Relaxed);
        self.forward_segments
            .store(policy.forward_segments, Relaxed);
    }

    /// The type f32 tensors are compressed to, if compression is on.
    pub(crate) fn storage(&self) -> Option<LowPrecision> {
        LowPrecision::from_code(self.storage.load(Relaxed))
    }

    pub(crate) fn set_storage(&self, storage: Option<LowPrecision>) {
        self.storage
            .store(storage.map_or(0, LowPrecision::code), Relaxed);
    }

    /// The ordinal the next managed tensor will get.
    pub(crate) fn next_ordinal(&self) -> u64 {
        self.plan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_ordinal()
    }

    /// Sets what is called each time a step begins under cuts, told whether they stopped
    /// adapting (`None`: nothing): the device's runtime is told, so that it can judge the
    /// steps that repeat the ones to come, and only those. Called on the thread making the
    /// step's first tensor, with only the hook's own lock held (not the plan's); it must not
    /// wait for the device.
    pub(crate) fn set_step_hook(&self, hook: Option<StepHook>) {
        *self.step_hook.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// A logical clock, advanced by every use of a managed tensor.
    pub(crate) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Relaxed)
    }

    /// Notes a new managed tensor, `made`, and carries out what it means for the forward
    /// pass's segments (see [`StepPlan::segment_event`] and [`SegmentCuts::apply`]) unless
    /// `in_program_scope` (a checkpoint scope of the program's own is open); returns its
    /// ordinal for [`CellInfo::ordinal`]. `scope_opened_at`: the ordinal at which the program
    /// last opened a checkpoint scope of its own, if ever; the forward pass is cut into
    /// segments only after two learned steps without one (the program chose what to
    /// recompute).
    pub(crate) fn on_create(
        &self,
        made: Made,
        scope_opened_at: Option<u64>,
        in_program_scope: bool,
    ) -> Created {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        let before = plan.figures();
        let Made {
            owner,
            cost,
            forward,
            ..
        } = made;
        // A view or a move onto a buffer that exists did no work of its own.
        if owner.is_none() {
            self.counters.add(Counter::made_cost, cost as u64);
            if forward {
                self.counters.add(Counter::forward_cost, cost as u64);
            }
        }
        self.watch_recomputation();
        let ordinal = plan.on_create(&made);
        let segments = scope_opened_at
            .is_none_or(|at| before.period > 0 && ordinal >= at.saturating_add(2 * before.period));
        // A segment's end drops tensors to recompute them: not when the policy only offloads.
        let enabled = segments
            && self.forward_segments.load(Relaxed)
            && self.mode.load(Relaxed) != EvictionMode::OffloadOnly as u8;
        let segment = plan.segment_event(ordinal, self.limit().filter(|_| enabled));
        let outlives_step = enabled && plan.outlives_step(ordinal);
        let chosen = enabled.then(|| plan.chosen_key(ordinal, owner)).flatten();
        let under_selection = enabled && plan.under_selection();
        let next = match self.limit() {
            Some(_) if self.planned.load(Relaxed) => plan.next_made().map_or(0, pack_next),
            _ => 0,
        };
        self.next_made.store(next, Relaxed);
        let after = plan.figures();
        if after != before {
            self.counters.set(Counter::plan_period, after.period);
            self.counters.set(Counter::replans, after.replans);
            self.counters.set(Counter::plan_segments, after.segments);
            self.counters
                .set(Counter::plan_segment_bytes, after.segment_bytes);
            self.counters
                .set(Counter::plan_estimated_peak, after.estimated_peak);
            self.counters
                .set(Counter::plan_measured_peak, after.measured_peak);
            self.counters
                .set(Counter::plan_parked_bytes, after.parked_bytes);
            self.counters
                .set(Counter::plan_selected_bytes, after.selected_bytes);
            self.counters.set(Counter::plan_op_floor, after.op_floor);
            if after.segments > 0
                && (after.segments, after.segment_bytes) != (before.segments, before.segment_bytes)
            {
                self.counters.add(Counter::segment_plans, 1);
            }
        }
        drop(plan);
        if after.planned_steps > before.planned_steps {
            let settled = after.settled_steps > before.settled_steps;
            self.counters
                .add(Counter::settled_steps, u64::from(settled));
            if let Some(hook) = &*self.step_hook.lock().unwrap_or_else(|e| e.into_inner()) {
                hook(settled);
            }
        }
        if let Some(SegmentEvent::Open { park }) = &segment
            && !park.is_empty()
        {
            self.park(park);
        }
        if let Some(event) = segment
            && !in_program_scope
        {
            self.cuts.apply(event, self);
        }
        Created {
            ordinal,
            outlives_step,
            chosen,
            under_selection,
        }
    }

    /// Moves the resident tensors with `ordinals` (ascending: optimizer state the step plan
    /// parks for the forward and backward passes) to host memory in one batch; each comes back
    /// when the program reads it.
    fn park(&self, ordinals: &[u64]) {
        let mut batch = OffloadBatch::default();
        for cell in self.cells() {
            let info = cell.info();
            if ordinals.binary_search(&info.ordinal).is_ok() && cell.status() == Status::Resident {
                batch.add(self, &cell);
            }
        }
        let pending = batch.pending;
        if batch.finish(self).is_some() {
            self.counters.add(Counter::parked_bytes, pending);
        }
    }

    /// Notes that the program dropped the tensor with `ordinal`.
    pub(crate) fn on_drop(&self, ordinal: u64) {
        self.plan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .on_drop(ordinal);
    }

    /// Notes a program read (not a restore's) of the tensor with `ordinal`, whose buffer's
    /// first tensor has ordinal `owner`.
    pub(crate) fn on_read(&self, ordinal: u64, owner: u64) {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        plan.on_read(ordinal);
        if owner != ordinal {
            plan.on_read(owner);
        }
    }

    /// What the budget and scopes have done so far.
    pub(crate) fn stats(&self) -> RematStats {
        self.counters.read()
    }

    /// Adds a new cell to the ones the budget may evict.
    pub(crate) fn register(&self, cell: Weak<dyn Evictable>) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Amortised clean-up of cells that are gone, so the registry stays proportional to
        // the live ones.
        if registry.len() >= 1024 && registry.len().is_power_of_two() {
            registry.retain(|cell| cell.strong_count() > 0);
        }
        registry.push(cell);
    }

    /// Every registered cell still alive.
    pub(crate) fn cells(&self) -> Vec<Arc<dyn Evictable>> {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry.retain(|cell| cell.strong_count() > 0);
        registry.iter().filter_map(Weak::upgrade).collect()
    }

    /// About sqrt(n) + 32 registered cells chosen at random (all of them when few).
    fn sample(&self, seed: u64) -> Vec<Arc<dyn Evictable>> {
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let n = registry.len();
        let k = (n as f64).sqrt() as usize + 32;
        if n <= k {
            return registry.iter().filter_map(Weak::upgrade).collect();
        }
        let mut state = seed | 1;
        (0..k)
            .filter_map(|_| {
                // xorshift64: cheap, and good enough to spread the sample.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                registry[(state % n as u64) as usize].upgrade()
            })
            .collect()
    }

    /// A tensor evicted to be recomputed.
    pub(crate) fn count_eviction(&self, bytes: u64) {
        self.counters.add(Counter::evictions, 1);
        self.counters.add(Counter::evicted_bytes, bytes);
    }

    /// A new checkpoint scope id, larger than every one before (segments' and the program's
    /// own scopes' alike).
    pub(crate) fn new_scope_id(&self) -> u64 {
        self.next_scope_id.fetch_add(1, Relaxed)
    }

    /// The forward pass's open segment's scope id (0: none).
    #[inline]
    pub(crate) fn segment_scope(&self) -> u64 {
        self.cuts.segment()
    }

    /// Ends the forward pass's open segment, if any: the program opened a scope of its own.
    pub(crate) fn end_segment(&self) {
        self.cuts.end_segment();
    }

    /// Notes a tensor a selection drops at a later cut (see [`SegmentCuts::hold_chosen`]).
    pub(crate) fn hold_chosen(&self, ordinal: u64, cell: Weak<dyn Evictable>) {
        self.cuts.hold_chosen(ordinal, cell);
    }

    /// The tensors evicted with the one keyed `owner` at a selection's cut (see
    /// [`SegmentCuts::take_group`]).
    pub(crate) fn take_group(&self, owner: u64) -> Vec<Weak<dyn Evictable>> {
        self.cuts.take_group(owner)
    }

    /// Makes a pass that recomputes more than `ratio` times the work of the forward pass
    /// before it fail (see [`crate::memory::set_recompute_limit`]); `None`: never.
    pub(crate) fn set_recompute_limit(&self, ratio: Option<f64>) {
        let bits = ratio.filter(|r| *r > 0.0).map_or(0, f64::to_bits);
        self.recompute_limit_bits.store(bits, Relaxed);
    }

    /// Notes the program's phase (see [`crate::memory::set_phase`]): entering the forward
    /// pass begins a pass for [`Self::set_recompute_limit`].
    pub(crate) fn set_forward_phase(&self, forward: bool) {
        let pass = &self.pass;
        if forward && !pass.in_forward.swap(true, Relaxed) {
            let forward_work = self.counters.get(Counter::forward_cost);
            pass.forward_base.store(forward_work, Relaxed);
            let recomputed = self.counters.get(Counter::recomputed_cost);
            pass.recomputed_base.store(recomputed, Relaxed);
        } else if !forward {
            pass.in_forward.store(false, Relaxed);
        }
    }

    /// Under a recompute limit, before the plan sees a new tensor (no cell is locked here):
    /// outside the forward pass, checks the pass's recomputation against its forward work,
    /// and panics past the limit.
    fn watch_recomputation(&self) {
        let bits = self.recompute_limit_bits.load(Relaxed);
        let pass = &self.pass;
        if bits == 0 || pass.in_forward.load(Relaxed) {
            return;
        }
        let forward_work = self
            .counters
            .get(Counter::forward_cost)
            .saturating_sub(pass.forward_base.load(Relaxed));
        let recomputed = self
            .counters
            .get(Counter::recomputed_cost)
            .saturating_sub(pass.recomputed_base.load(Relaxed));
        let limit = f64::from_bits(bits);
        if forward_work == 0 || recomputed as f64 <= limit * forward_work as f64 {
            return;
        }
        // Once per pass: the loop's retry starts a new one.
        pass.recomputed_base.store(u64::MAX, Relaxed);
        let budget = self
            .limit()
            .map_or("none".into(), crate::units::format_bytes);
        panic!(
            "the memory budget of {budget} recomputed {:.1}x the forward pass's work in one \
             pass (the limit set is {limit}x): the tensors it keeps do not fit; a smaller \
             micro-batch does",
            recomputed as f64 / forward_work as f64
        );
    }

    /// A tensor of `bytes` recomputed, by an op that costs `cost`.
    pub(crate) fn count_recompute(&self, bytes: u64, cost: f64) {
        self.counters.add(Counter::recomputes, 1);
        self.counters.add(Counter::recomputed_bytes, bytes);
        self.counters.add(Counter::recomputed_cost, cost as u64);
    }

    /// A tensor's copy now in host memory.
    pub(crate) fn count_offload(&self, bytes: u64) {
        self.counters.add(Counter::offloads, 1);
        self.counters.add(Counter::offloaded_bytes, bytes);
        let host = self.counters.add(Counter::host_bytes, bytes);
        self.counters.max(Counter::peak_host_bytes, host);
        self.host_share.add(bytes);
    }

    /// A host copy back on the device, taking `elapsed` to hand over.
    pub(crate) fn count_upload(&self, bytes: u64, elapsed: std::time::Duration) {
        self.counters.add(Counter::uploads, 1);
        self.counters.add(Counter::uploaded_bytes, bytes);
        self.counters
            .add(Counter::upload_nanos, elapsed.as_nanos() as u64);
        self.host_release(bytes);
    }

    /// A tensor of `bytes` kept in the 16-bit storage type.
    pub(crate) fn count_compress(&self, bytes: u64) {
        self.counters.add(Counter::compressions, 1);
        self.counters.add(Counter::compressed_bytes, bytes);
    }

    /// A compressed tensor cast back.
    pub(crate) fn count_decompress(&self) {
        self.counters.add(Counter::decompressions, 1);
    }

    /// A tensor of `bytes` packed into booleans.
    pub(crate) fn count_pack(&self, bytes: u64) {
        self.counters.add(Counter::packs, 1);
        self.counters.add(Counter::packed_bytes, bytes);
    }

    /// A packed tensor made a float again.
    pub(crate) fn count_unpack(&self) {
        self.counters.add(Counter::unpacks, 1);
    }

    /// A host copy freed.
    pub(crate) fn host_release(&self, bytes: u64) {
        self.counters.sub(Counter::host_bytes, bytes);
        self.host_share.sub(bytes);
    }
}

/// Where the pass watched by [`Budget::set_recompute_limit`] began: the counters then.
#[derive(Default)]
struct PassWatch {
    in_forward: AtomicBool,
    forward_base: AtomicU64,
    recomputed_base: AtomicU64,
}

/// Bits of [`Budget::next_made`] that hold the bytes; the op's index is above them.
const NEXT_BYTES_BITS: u32 = 48;

/// Packs a predicted op and size into one word (sizes are capped at 2^48 - 1 bytes, far above
/// any device's memory); never 0, which means no prediction.
fn pack_next((op, bytes): (OpId, u64)) -> u64 {
    ((op.index() as u64 + 1) << NEXT_BYTES_BITS) | bytes.min((1 << NEXT_BYTES_BITS) - 1)
}

/// The prediction [`pack_next`] packed, if any.
fn unpack_next(word: u64) -> Option<(OpId, u64)> {
    let op = (word >> NEXT_BYTES_BITS).checked_sub(1)?;
    Some((
        OpId::from_index(op as usize),
        word & ((1 << NEXT_BYTES_BITS) - 1),
    ))
}

#[cfg(test)]
mod tests {
    //! The engine alone, on mock cells that hold ledger charges.

    use super::*;
    use crate::ledger::{Charge, Ledger};
    use crate::vocabulary::families::float;
    use burn_backend::{DType, Shape};

    /// A cell that frees its charge when evicted or offloaded.
    struct MockCell {
        info: CellInfo,
        ledger: &'static Ledger,
        charge: Mutex<Option<Charge>>,
        offloaded: AtomicBool,
        recompute: Option<f64>,
        offloadable: bool,
        /// Whether its drop frees memory at once (false: a fused backend's tensor).
        drop_frees_at_once: AtomicBool,
    }

    impl MockCell {
        fn new(
            ledger: &'static Ledger,
            elements: usize,
            recompute: Option<f64>,
            offloadable: bool,
        ) -> Arc<Self> {
            let op = float::op(float::Op::float_exp);
            let charge = ledger.charge(&Shape::new([elements]), DType::F32, op);
            Arc::new(Self {
                info: CellInfo::new(
                    op,
                    charge.bytes,
                    recompute.unwrap_or(0.0),
                    0,
                    false,
                    (0, 0, 0),
                ),
                ledger,
                charge: Mutex::new(Some(charge)),
                offloaded: AtomicBool::new(false),
                recompute,
                offloadable,
                drop_frees_at_once: AtomicBool::new(true),
            })
        }

        fn free(&self) -> bool {
            match self.charge.lock().unwrap().take() {
                Some(charge) => {
                    self.ledger.release(&charge);
                    true
                }
                None => false,
            }
        }
    }

    impl Evictable for MockCell {
        fn info(&self) -> &CellInfo {
            &self.info
        }
        fn status(&self) -> Status {
            match (
                self.charge.lock().unwrap().is_some(),
                self.offloaded.load(Relaxed),
            ) {
                (true, _) => Status::Resident,
                (false, true) => Status::Offloaded,
                (false, false) => Status::Evicted,
            }
        }
        fn storage_holders(&self) -> Option<(usize, usize)> {
            None
        }
        fn candidate(&self, now: u64, policy: &Policy, _shared: bool) -> Option<Candidate> {
            let bytes = self.charge.lock().unwrap().map(|c| c.bytes)?;
            Candidate::new(
                &self.info,
                bytes,
                now,
                self.recompute,
                self.offloadable,
                None,
                policy,
            )
        }
        fn evict(&self) -> bool {
            self.recompute.is_some() && self.free()
        }
        fn restore(&self) {
            unimplemented!("the engine's tests restore nothing")
        }
        fn compress(&self) -> bool {
            false
        }
        fn pack(&self) -> bool {
            false
        }
        fn host_batch(&self) -> Box<dyn HostBatch> {
            Box::new(MockBatch(Vec::new()))
        }
        fn offload_into(self: Arc<Self>, batch: &mut dyn HostBatch) -> bool {
            let batch = batch
                .as_any()
                .downcast_mut::<MockBatch>()
                .expect("a mock batch");
            if !self.offloadable || !self.free() {
                return false;
            }
            batch.0.push(self);
            true
        }
        fn drop_frees_at_once(&self) -> bool {
            self.drop_frees_at_once.load(Relaxed)
        }
        fn forget_recipe(&self) {}
    }

    struct MockBatch(Vec<Arc<MockCell>>);

    impl HostBatch for MockBatch {
        fn as_any(&mut self) -> &mut dyn Any {
            self
        }
        fn finish(self: Box<Self>) -> usize {
            self.0.iter().for_each(|c| c.offloaded.store(true, Relaxed));
            self.0.len()
        }
    }

    fn setup(cells: &[(Option<f64>, bool)]) -> (&'static Ledger, Budget, Vec<Arc<MockCell>>) {
        let ledger: &'static Ledger = Box::leak(Box::new(Ledger::new("mock".into())));
        let budget = Budget::default();
        let cells: Vec<_> = cells
            .iter()
            .map(|&(recompute, offloadable)| MockCell::new(ledger, 250, recompute, offloadable))
            .collect();
        for cell in &cells {
            budget.register(Arc::downgrade(cell) as Weak<dyn Evictable>);
        }
        (ledger, budget, cells)
    }

    fn statuses(cells: &[Arc<MockCell>]) -> Vec<Status> {
        cells.iter().map(|c| c.status()).collect()
    }

    #[test]
    fn the_cheapest_recomputation_goes_first_and_only_as_much_as_needed() {
        let (ledger, budget, cells) = setup(&[
            (Some(100.0), false),
            (Some(1.0), false),
            (Some(10.0), false),
        ]);
        assert_eq!(ledger.live_bytes(), 3000);
        budget.set_limit(Some(2500));
        budget.reclaim(
            ledger,
            Reclaim::AfterOp {
                op: None,
                needed: 0,
            },
        );
        use Status::*;
        assert_eq!(statuses(&cells), [Resident, Evicted, Resident]);
        assert_eq!(ledger.live_bytes(), 2000);
        assert_eq!(budget.stats().offloads, 0);
    }

    #[test]
    fn room_is_made_before_an_op_only_when_its_output_would_go_over_the_limit() {
        let (ledger, budget, cells) = setup(&[
            (Some(100.0), false),
            (Some(1.0), false),
            (Some(10.0), false),
        ]);
        budget.set_limit(Some(4000));
        budget.reclaim(ledger, Reclaim::Room { bytes: 1000 });
        assert_eq!(ledger.live_bytes(), 3000, "3000 + 1000 fit under 4000");
        assert_eq!(budget.stats().room_rounds, 0);
        budget.set_limit(Some(3500));
        budget.reclaim(ledger, Reclaim::Room { bytes: 1000 });
        use Status::*;
        assert_eq!(statuses(&cells), [Resident, Evicted, Resident]);
        assert_eq!(ledger.live_bytes(), 2000);
        assert_eq!(budget.stats().room_rounds, 1);
        // An output as large as the limit is left to the budget after the op.
        budget.reclaim(ledger, Reclaim::Room { bytes: 3500 });
        assert_eq!(ledger.live_bytes(), 2000);
        // Without a learned step, an op with no inputs has nothing to make room for...
        let exp = float::op(float::Op::float_exp);
        budget.reclaim(
            ledger,
            Reclaim::BeforeOp {
                op: exp,
                largest_input: 0,
            },
        );
        assert_eq!(budget.stats().room_rounds, 1);
        // ...and one whose largest input has 1000 bytes gets room for as much.
        budget.set_limit(Some(2500));
        budget.reclaim(
            ledger,
            Reclaim::BeforeOp {
                op: exp,
                largest_input: 1000,
            },
        );
        assert_eq!(statuses(&cells), [Resident, Evicted, Evicted]);
        assert_eq!(ledger.live_bytes(), 1000);
        assert_eq!(budget.stats().room_rounds, 2);
    }

    #[test]
    fn a_learned_size_is_used_only_for_the_op_the_learned_step_says_comes_next() {
        let (ledger, budget, cells) = setup(&[(Some(1.0), false), (Some(10.0), false)]);
        budget.set_limit(Some(2500));
        let (exp, sum) = (
            float::op(float::Op::float_exp),
            float::op(float::Op::float_sum_dim),
        );
        // The learned step says a 100-byte `sum_dim` comes next.
        budget.next_made.store(pack_next((sum, 100)), Relaxed);
        budget.reclaim(
            ledger,
            Reclaim::BeforeOp {
                op: sum,
                largest_input: 1000,
            },
        );
        assert_eq!(ledger.live_bytes(), 2000, "2000 + 100 fit under 2500");
        // An `exp` instead: the program left the learned order, and its output may be as
        // large as its input.
        budget.reclaim(
            ledger,
            Reclaim::BeforeOp {
                op: exp,
                largest_input: 1000,
            },
        );
        assert_eq!(statuses(&cells), [Status::Evicted, Status::Resident]);
        assert_eq!(ledger.live_bytes(), 1000);
        assert_eq!(
            unpack_next(pack_next((exp, 1 << 60))),
            Some((exp, (1 << 48) - 1))
        );
        assert_eq!(unpack_next(0), None);
    }

    #[test]
    fn evictions_stop_at_their_target_and_an_offload_batch_goes_to_its_own() {
        let (ledger, budget, cells) = setup(&[
            (Some(1.0), false),
            (Some(2.0), false),
            (None, true),
            (None, true),
        ]);
        let policy = budget.policy();
        use Status::*;
        // Recomputable tensors go first and only down to the target: no offload.
        budget.evict_from_all(ledger, [3000, 1500], 0, &policy);
        assert_eq!(statuses(&cells), [Evicted, Resident, Resident, Resident]);
        assert_eq!(budget.stats().offloads, 0);
        // When they are not enough, the one batch of offloads goes down to its own target.
        budget.evict_from_all(ledger, [1500, 500], 0, &policy);
        assert_eq!(statuses(&cells), [Evicted, Evicted, Offloaded, Offloaded]);
        assert_eq!(ledger.live_bytes(), 0);
        assert_eq!(budget.stats().offload_batches, 1);
    }

    #[test]
    fn recomputation_ranks_before_an_offload_whatever_the_scores() {
        let (ledger, budget, cells) = setup(&[(None, true), (Some(1e9), false)]);
        budget.set_limit(Some(1500));
        budget.reclaim(
            ledger,
            Reclaim::AfterOp {
                op: None,
                needed: 0,
            },
        );
        assert_eq!(statuses(&cells), [Status::Resident, Status::Evicted]);
    }

    #[test]
    fn offloads_are_read_in_one_batch() {
        let (ledger, budget, cells) = setup(&[(None, true), (None, true), (None, true)]);
        budget.set_limit(Some(1200));
        budget.reclaim(
            ledger,
            Reclaim::AfterOp {
                op: None,
                needed: 0,
            },
        );
        assert_eq!(ledger.live_bytes(), 1000);
        let offloaded = statuses(&cells)
            .iter()
            .filter(|s| **s == Status::Offloaded)
            .count();
        assert_eq!(offloaded, 2);
        assert_eq!(budget.stats().offload_batches, 1);
    }

    #[test]
    fn a_budget_that_cannot_be_kept_fails_naming_the_figures() {
        let (ledger, budget, _cells) = setup(&[(None, false), (None, false)]);
        budget.set_limit(Some(1000));
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            budget.reclaim(
                ledger,
                Reclaim::AfterOp {
                    op: Some(float::op(float::Op::float_exp)),
                    needed: 2000,
                },
            )
        }))
        .expect_err("nothing can be evicted");
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(
            message.contains("1000 B on mock cannot be kept after float_exp"),
            "{message}"
        );
        assert!(message.contains("1.95 KiB are live"), "{message}");
        assert!(message.contains("Raise the budget"), "{message}");
    }

    #[test]
    fn no_limit_means_no_eviction() {
        let (ledger, budget, cells) = setup(&[(Some(1.0), true)]);
        budget.reclaim(
            ledger,
            Reclaim::AfterOp {
                op: None,
                needed: 0,
            },
        );
        assert_eq!(statuses(&cells), [Status::Resident]);
    }

    #[test]
    fn an_allocation_rescue_only_drops_what_frees_at_once_and_can_be_recomputed() {
        let (ledger, budget, cells) = setup(&[
            (Some(1.0), false),
            (Some(10.0), false),
            (None, true),
            (Some(5.0), false),
        ]);
        // A fused backend's tensor: dropping it queues work on the device's thread.
        cells[0].drop_frees_at_once.store(false, Relaxed);
        budget.set_limit(Some(1_000_000));
        use Status::*;
        assert_eq!(budget.free_without_device_work(ledger, 1000), 1000);
        assert_eq!(statuses(&cells), [Resident, Resident, Resident, Evicted]);
        // More than there is: everything it may drop, and nothing else (no offload).
        assert_eq!(budget.free_without_device_work(ledger, 10_000), 1000);
        assert_eq!(statuses(&cells), [Resident, Evicted, Resident, Evicted]);
        assert_eq!(budget.free_without_device_work(ledger, 1), 0);
        let stats = budget.stats();
        assert_eq!((stats.allocation_rescues, stats.rescued_bytes), (3, 2000));
        assert_eq!((stats.offloads, stats.compressions), (0, 0));
    }

    #[test]
    fn offloads_stop_at_the_host_limit_and_the_failure_says_so() {
        let (ledger, budget, cells) = setup(&[(None, true), (None, true), (None, true)]);
        budget.set_host_limit(Some(1500), true);
        budget.set_limit(Some(1200));
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            budget.reclaim(
                ledger,
                Reclaim::AfterOp {
                    op: None,
                    needed: 0,
                },
            )
        }))
        .expect_err("one of the three fits in host memory, the budget needs two out");
        let offloaded = statuses(&cells)
            .iter()
            .filter(|s| **s == Status::Offloaded)
            .count();
        assert_eq!(offloaded, 1);
        let message = panic.downcast_ref::<String>().expect("a message");
        assert!(
            message.contains("of the host memory they may use"),
            "{message}"
        );
    }

    #[test]
    fn devices_without_a_chosen_host_limit_share_one() {
        let share: &'static HostShare = Box::leak(Box::new(HostShare::new()));
        let (ledger_a, mut budget_a, cells_a) = setup(&[(None, true), (None, true), (None, true)]);
        let (ledger_b, mut budget_b, _cells_b) = setup(&[(None, true), (None, true), (None, true)]);
        budget_a.host_share = share;
        budget_b.host_share = share;
        budget_a.set_host_limit(Some(1500), false);
        budget_b.set_host_limit(Some(10_000), false);
        assert_eq!(
            budget_b.host_limit(),
            Some(1500),
            "the first budget's share stays"
        );
        budget_a.set_limit(Some(2000));
        budget_a.reclaim(
            ledger_a,
            Reclaim::AfterOp {
                op: None,
                needed: 0,
            },
        );
        assert_eq!(
            statuses(&cells_a)
                .iter()
                .filter(|s| **s == Status::Offloaded)
                .count(),
            1
        );
        // Counted once the copy is on the host, as remat's cells do (the mock does not).
        budget_a.count_offload(1000);
        assert_eq!(share.held(), 1000);
        // Alone, device B's offload would fit the share; beside A's it does not.
        budget_b.set_limit(Some(2000));
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            budget_b.reclaim(
                ledger_b,
                Reclaim::AfterOp {
                    op: None,
                    needed: 0,
                },
            )
        }))
        .expect_err("A's offload leaves 500 B of the share, B needs 1000");
        let message = panic.downcast_ref::<String>().expect("a message");
        assert!(message.contains("Offloads hold 1000 B"), "{message}");
    }
}
