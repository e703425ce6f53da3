//! The cell state machine: resident, evicted, offloaded (or on its way), compressed, gone;
//! the restore chain; and what happens when the program drops its last handle.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use burn_backend::ops::TransactionPrimitive;
use burn_backend::{Backend, DType, Shape, TensorData, TensorMetadata};

use super::kind::{HostBatchOf, ReadSlot};
use super::{CellDyn, CellOf, Kind, Recipe, ViewOf};
use crate::device::{DeviceState, NO_OWNER, Storage};
use crate::engine::{Candidate, CellInfo, Evictable, HostBatch, Made, Policy, Reclaim, Status};
use crate::ledger::Role;
use crate::units::LowPrecision;

enum State<P> {
    Resident(P, Arc<Storage>),
    Evicted,
    Offloaded(TensorData),
    Offloading,
    Compressed(P, Arc<Storage>),
    Gone,
}

impl<P> State<P> {
    fn status(&self) -> Status {
        match self {
            State::Resident(..) => Status::Resident,
            State::Evicted => Status::Evicted,
            State::Offloaded(_) => Status::Offloaded,
            State::Offloading => Status::Offloading,
            State::Compressed(..) => Status::Compressed,
            State::Gone => Status::Gone,
        }
    }
}

struct Slot<P> {
    state: State<P>,
    recipe: Option<Recipe<P>>,
    /// Length of the chain of evicted cells a restore of this one walks (0 when resident).
    depth: u32,
}

impl<P> Slot<P> {
    /// Resident (or compressed) to evicted: the data is dropped, and each recipe input counts
    /// this cell as a dependent until it is restored, so it stays restorable.
    fn mark_evicted(&mut self, depth: u32) {
        self.depth = depth;
        self.state = State::Evicted;
        for input in &self
            .recipe
            .as_ref()
            .expect("an evicted cell has a recipe")
            .inputs
        {
            input.add_dependent();
        }
    }
}

/// What every cell shares whatever its kind: what the engine reads ([`CellInfo`]), the
/// device, and the restore bookkeeping.
pub(crate) struct CellCore {
    pub(crate) info: CellInfo,
    pub(crate) state: &'static DeviceState,
    /// Evicted cells whose recipe reads this one.
    dependents: AtomicU32,
    /// Restores in progress that need it resident: never evicted while non-zero.
    pins: AtomicU32,
    /// For a dropped tensor that kept its recipe: how many dropped tensors lead from it to
    /// tensors the program holds.
    dead_chain: AtomicU32,
    /// Made in a forward pass under a selection: dropped, it keeps no recipe unless chosen
    /// ([`SELECTION_DEAD_CHAIN`]); the selection recomputes only from tensors the program
    /// holds, and longer histories keep dropped tensors on the device.
    under_selection: bool,
    /// A selection drops it (or the buffer it is a view of) at a later cut.
    chosen: bool,
    /// Its [`Role`] as an index, kept while it is not resident so a restore charges it to the
    /// same role.
    role: AtomicU8,
}

thread_local! {
    /// Restore chains running on this thread: their reads replay recipes, and are not the
    /// program's own (the step plan records only the program's reads).
    static RESTORING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl CellCore {
    /// What the tensor is for.
    pub(crate) fn role(&self) -> Role {
        Role::from_index(self.role.load(Relaxed))
    }

    fn touch(&self) {
        self.info.touch(self.state.budget.tick());
        if RESTORING.get() == 0 {
            self.state
                .budget
                .on_read(self.info.ordinal, self.info.owner);
        }
    }
}

/// Marks this thread as restoring until dropped.
struct Restoring;

impl Restoring {
    fn start() -> Self {
        RESTORING.set(RESTORING.get() + 1);
        Restoring
    }
}

impl Drop for Restoring {
    fn drop(&mut self) {
        RESTORING.set(RESTORING.get() - 1);
    }
}

/// The step plan's token for a tensor: its op, shape and type.
fn token(op: crate::op::OpId, shape: &Shape, dtype: DType) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    op.hash(&mut hasher);
    shape.as_slice().hash(&mut hasher);
    dtype.hash(&mut hasher);
    hasher.finish()
}

/// A cell whose recomputation must first restore inputs of more than this many times its own
/// bytes is not evicted to be recomputed (see `Cell::restore_outweighs`).
const RESTORE_OUTWEIGHS: u64 = 4;

/// The longest chain of dropped tensors kept only to recompute live ones.
const MAX_DEAD_CHAIN: u32 = 1;

/// The same in a forward pass under a selection (see `StepPlan::select`) for the tensors it
/// does not choose: its simulation frees every dropped tensor at its last read except the
/// inputs of the chosen tensors, which their recipes hold. A dropped `mean` that kept its
/// recipe held the residual stream's sum it was computed from on the device through the whole
/// step, and that sum, one dropped product away from live tensors, could keep no recipe of its
/// own to be evicted by. (A chosen tensor the program dropped, held by its views, keeps its
/// recipe as outside a scope.)
const SELECTION_DEAD_CHAIN: u32 = 0;

/// The same inside a checkpoint scope. A block's saved tensors are often a few ops and views
/// away from what the program still holds (`softmax`'s input is `mask_fill(div(q·kᵀ))`, each
/// consuming the last; `q` is a view of a view of a view of a dropped `qkv`), and a scope
/// exists to recompute them. Its history is bounded by the block, and goes when autodiff
/// drops the saved tensors in the backward pass; [`Policy::max_depth`] still bounds a
/// recomputation's depth.
const MAX_SCOPED_DEAD_CHAIN: u32 = 32;

/// A managed tensor of kind `K` on backend `B`.
pub(crate) struct Cell<B: Backend, K: Kind<B>> {
    core: CellCore,
    slot: Mutex<Slot<K::Prim>>,
    device: B::Device,
    shape: Shape,
    dtype: DType,
}

impl<B: Backend, K: Kind<B>> Cell<B, K> {
    /// A new resident cell for `tensor`, registered with the ledger's budget.
    pub(crate) fn create(
        tensor: K::Prim,
        storage: Arc<Storage>,
        recipe: Option<Recipe<K::Prim>>,
        cost: f64,
    ) -> Arc<Self> {
        let op = storage.op;
        Self::create_made_by(tensor, storage, recipe, cost, op)
    }

    /// [`Self::create`] for a cell that `made_by` made over a storage another op allocated:
    /// the step plan knows it by `made_by`, so that the same call in two steps is the same
    /// tensor to it whichever op made the buffer (AdamW's moments, moved "to" their own
    /// device every step, were made by another op in the first step than in later ones).
    pub(crate) fn create_made_by(
        tensor: K::Prim,
        storage: Arc<Storage>,
        recipe: Option<Recipe<K::Prim>>,
        cost: f64,
        made_by: crate::op::OpId,
    ) -> Arc<Self> {
        let state = storage.state;
        let shape = tensor.shape();
        let owner = Some(storage.plan_owner.load(Relaxed)).filter(|&o| o != NO_OWNER);
        let made = Made {
            token: token(made_by, &shape, tensor.dtype()),
            op: storage.op,
            bytes: storage.bytes,
            live: state.ledger.live_bytes(),
            recompute: recipe
                .as_ref()
                .filter(|recipe| recipe.view_of.is_none() && storage.op.facts().replayable)
                .map(|_| cost),
            owner,
        };
        let created = state.budget.on_create(made, state.scopes.opened_at());
        let ordinal = created.ordinal;
        let owner = owner.unwrap_or_else(|| {
            storage.plan_owner.store(ordinal, Relaxed);
            ordinal
        });
        // A parameter or optimizer state would be recomputed from the previous step's, which
        // its recipe would keep on the device beside it: such tensors are only offloaded.
        let recipe = recipe.filter(|_| !created.outlives_step);
        if let Some(event) = created.segment {
            state.scopes.on_segment_event(event, &state.budget);
        }
        let scope = state.scopes.current();
        // Outside any scope, an op that reads a checkpoint scope's tensors (a gradient reading
        // the activations the backward pass restored) gets no recipe, as it would have without
        // a budget: the scope decides what is recomputed. Its recipe would hold the scope's
        // dropped tensors and, through their recipes, the buffers those read: a weight's
        // gradient, live until the optimizer step, would keep each block's `exp` and `gelu` on
        // the device.
        // Views keep theirs: they cost nothing to replay and share their source's buffer.
        let recipe = recipe.filter(|recipe| {
            scope != 0
                || recipe.view_of.is_some()
                || recipe
                    .inputs
                    .iter()
                    .all(|input| input.core().info.scope == 0)
        });
        // A product's result has a layout of its own: only views and same-shaped results of
        // strided inputs (elementwise ops may keep their input's layout) are strided. Counting
        // `x.matmul(x.transpose())` as strided left it neither offloadable nor, once `x` was
        // consumed, recomputable, and the budget failed with room to spare.
        let strided = recipe.as_ref().is_some_and(|recipe| {
            recipe.view_of.is_some()
                || (!storage.op.facts().product
                    && recipe
                        .inputs
                        .iter()
                        .any(|input| input.core().info.strided && *input.shape_ref() == shape))
        });
        let cell = Arc::new(Self {
            core: CellCore {
                info: CellInfo::new(
                    storage.op,
                    storage.bytes,
                    cost,
                    scope,
                    strided,
                    (state.budget.tick(), ordinal, owner),
                ),
                state,
                dependents: AtomicU32::new(0),
                pins: AtomicU32::new(0),
                dead_chain: AtomicU32::new(0),
                under_selection: created.under_selection,
                chosen: created.chosen.is_some(),
                role: AtomicU8::new(storage.role() as u8),
            },
            device: K::device(&tensor),
            shape,
            dtype: tensor.dtype(),
            slot: Mutex::new(Slot {
                state: State::Resident(tensor, storage),
                recipe,
                depth: 0,
            }),
        });
        state
            .budget
            .register(Arc::downgrade(&cell) as std::sync::Weak<dyn Evictable>);
        if let Some(chosen) = created.chosen {
            state.scopes.hold_chosen(
                chosen,
                Arc::downgrade(&cell) as std::sync::Weak<dyn Evictable>,
            );
        }
        cell
    }

    /// Moves the data of a resident, unpinned, unshared cell into `transaction` and marks it
    /// offloading.
    fn begin_offload(&self, transaction: &mut TransactionPrimitive<B>) -> Option<ReadSlot> {
        if self.core.pins.load(Relaxed) > 0 || self.core.info.strided {
            return None;
        }
        let mut slot = self.slot.try_lock().ok()?;
        let (State::Resident(_, storage) | State::Compressed(_, storage)) = &slot.state else {
            return None;
        };
        if Arc::strong_count(storage) != 1 {
            return None;
        }
        let (State::Resident(tensor, storage) | State::Compressed(tensor, storage)) =
            std::mem::replace(&mut slot.state, State::Offloading)
        else {
            unreachable!("checked above")
        };
        drop(storage);
        Some(K::push_read(tensor, transaction))
    }

    fn lock(&self) -> MutexGuard<'_, Slot<K::Prim>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Restores this cell and every evicted or offloaded cell its recipe needs, deepest first.
    /// A cell of the chain, and every resident input a restore reads, is pinned from the start
    /// until the last cell of the chain that reads it is restored (room made for a cell must
    /// not come from evicting its own inputs, which it would then restore over the budget); between restores the budget evicts other tensors (and the cells no
    /// longer needed), so a long chain does not pile up above the budget.
    fn ensure_resident(&self) {
        if self.status() == Status::Resident {
            return;
        }
        type Key = *const CellCore;
        let key = |cell: &Arc<dyn CellDyn>| cell.core() as Key;
        // Post-order walk with an explicit stack: inputs are restored before their users. Each
        // cell comes with the inputs it reads.
        let root_inputs = self.restore_inputs();
        let mut order: Vec<(Arc<dyn CellDyn>, Vec<Key>)> = Vec::new();
        /// A cell to visit, with its recipe's inputs once expanded.
        type Visit = (Arc<dyn CellDyn>, Option<Vec<Key>>);
        let mut stack: Vec<Visit> = root_inputs
            .iter()
            .map(|input| (input.clone(), None))
            .collect();
        let mut seen: Vec<Key> = Vec::new();
        while let Some((cell, expanded)) = stack.pop() {
            if let Some(inputs) = expanded {
                order.push((cell, inputs));
                continue;
            }
            if seen.contains(&key(&cell)) {
                continue;
            }
            seen.push(key(&cell));
            let inputs = cell.restore_inputs();
            let keys = inputs.iter().map(key).collect();
            stack.push((cell, Some(keys)));
            stack.extend(inputs.into_iter().map(|input| (input, None)));
        }
        /// The chain's cells, each pinned while `readers` (cells of the chain still to be
        /// restored that read it) is non-zero; whatever is left is unpinned on drop. The root
        /// is unpinned without being settled: its caller reads it next (or, consuming it,
        /// settles it).
        struct Pins<'a> {
            chain: Vec<(&'a dyn CellDyn, u32)>,
            root: &'a CellCore,
        }
        impl Pins<'_> {
            fn done_reading(&mut self, inputs: &[Key]) {
                for &input in inputs {
                    if let Some(pin) = self
                        .chain
                        .iter_mut()
                        .find(|(c, n)| std::ptr::eq(c.core(), input) && *n > 0)
                    {
                        pin.1 -= 1;
                        if pin.1 == 0 {
                            pin.0.unpin();
                        }
                    }
                }
            }
        }
        impl Drop for Pins<'_> {
            fn drop(&mut self) {
                for (cell, readers) in &self.chain {
                    if *readers > 0 {
                        cell.unpin();
                    }
                }
                self.root.pins.fetch_sub(1, Relaxed);
            }
        }
        let root_keys: Vec<Key> = root_inputs.iter().map(key).collect();
        let readers = |cell: Key| {
            order
                .iter()
                .map(|(_, inputs)| inputs)
                .chain([&root_keys])
                .map(|inputs| inputs.iter().filter(|&&k| k == cell).count() as u32)
                .sum::<u32>()
        };
        let mut pins = Pins {
            chain: Vec::with_capacity(order.len()),
            root: &self.core,
        };
        for (cell, _) in &order {
            cell.core().pins.fetch_add(1, Relaxed);
            // A selection's chosen buffer stays pinned until the chain ends: the views evicted
            // with it are brought back from it then (see below).
            let core = cell.core();
            let group_owner = core.chosen && core.info.owner == core.info.ordinal;
            pins.chain.push((
                &**cell,
                readers(core as Key).max(1) + u32::from(group_owner),
            ));
        }
        self.core.pins.fetch_add(1, Relaxed);
        let _restoring = Restoring::start();
        // Room is made before each restore, so a chain never goes over the budget by the
        // tensor it brings back.
        for (cell, inputs) in &order {
            if cell.status() != Status::Resident {
                self.core.state.reclaim(Reclaim::Room {
                    bytes: cell.core().info.bytes,
                });
                cell.restore_one();
            }
            pins.done_reading(inputs);
            self.core.state.reclaim(Reclaim::Relieve);
        }
        self.core.state.reclaim(Reclaim::Room {
            bytes: self.core.info.bytes,
        });
        self.restore_one();
        // A selection evicted a product with its views: the views come back now, from this
        // recomputation, while the chain still pins it.
        let chosen = order
            .iter()
            .map(|(cell, _)| cell.core())
            .chain([&self.core])
            .filter(|core| core.chosen)
            .map(|core| core.info.owner);
        for owner in chosen {
            for sibling in self.core.state.scopes.take_group(owner) {
                if let Some(sibling) = sibling.upgrade() {
                    sibling.restore();
                }
            }
        }
        drop(pins);
    }

    /// Whether recomputing this cell would first bring back inputs far larger than the `freed`
    /// bytes its eviction frees (a weight's gradient, read by the optimizer, recomputed from a
    /// layer's evicted activations): such a cell is offloaded rather than recomputed, since
    /// the restore chain would need that room, pinned, at once.
    fn restore_outweighs(slot: &Slot<K::Prim>, freed: u64) -> bool {
        let Some(recipe) = slot.recipe.as_ref() else {
            return false;
        };
        let missing: u64 = recipe
            .inputs
            .iter()
            .filter(|input| {
                matches!(
                    input.try_status(),
                    Some(Status::Evicted | Status::Offloaded | Status::Compressed)
                )
            })
            .map(|input| input.core().info.bytes)
            .sum();
        missing > RESTORE_OUTWEIGHS * freed
    }

    fn can_recompute(slot: &Slot<K::Prim>, max_depth: u32) -> Option<u32> {
        let recipe = slot.recipe.as_ref()?;
        let mut depth = 0;
        for input in &recipe.inputs {
            // An input in use right now (its lock is held, possibly further up this thread's
            // stack) is not waited for: the cell is simply not evictable this time.
            match input.try_status()? {
                Status::Gone => return None,
                Status::Evicted => depth = depth.max(input.depth()),
                Status::Resident | Status::Offloaded | Status::Offloading | Status::Compressed => {}
            }
        }
        (depth < max_depth).then_some(depth + 1)
    }

    /// As [`Self::can_recompute`] within `max_depth`; but a strided cell, which cannot be
    /// offloaded (a host copy would not keep its layout), may go deeper: recomputing a longer
    /// chain beats failing the budget.
    fn recompute_depth(&self, slot: &Slot<K::Prim>, max_depth: u32) -> Option<u32> {
        Self::can_recompute(slot, max_depth).or_else(|| {
            self.core
                .info
                .strided
                .then(|| Self::can_recompute(slot, u32::MAX))
                .flatten()
        })
    }

    /// Whether a cell the program no longer holds keeps its recipe (so that live tensors
    /// computed from it stay recomputable): only if it is at most [`MAX_DEAD_CHAIN`] dropped
    /// tensors away from tensors the program still holds. This bounds how much history a
    /// live tensor can pin (e.g. parameters updated step after step).
    fn keeps_recipe_when_dead(&self, slot: &Slot<K::Prim>, max_depth: u32) -> Option<u32> {
        let depth = Self::can_recompute(slot, max_depth)?;
        let recipe = slot.recipe.as_ref()?;
        let inputs = recipe
            .inputs
            .iter()
            .filter(|input| input.core().info.is_dead())
            .map(|input| input.core().dead_chain.load(Relaxed))
            .max()
            .unwrap_or(0);
        // Under a selection a view does not lengthen the chain: it holds no memory of its own
        // and replays for nothing. Counted, it left attention's q, k and v (a slice of a swap
        // of a reshape of one product, which a selection may drop) with a dropped link and no
        // recipe, so they held their product's buffer.
        let chain = inputs + u32::from(recipe.view_of.is_none() || !self.core.under_selection);
        let limit = if self.core.under_selection && !self.core.chosen {
            SELECTION_DEAD_CHAIN
        } else if self.core.info.scope != 0 {
            MAX_SCOPED_DEAD_CHAIN
        } else {
            MAX_DEAD_CHAIN
        };
        if chain > limit {
            return None;
        }
        self.core.dead_chain.store(chain, Relaxed);
        Some(depth)
    }

    /// A dropped tensor that evicted tensors still read (e.g. a saved activation the backward
    /// pass restored, read by a gradient that was consumed and kept its recipe): evicted now if
    /// it can keep its own recipe, rather than held on the device until they go. It stays
    /// resident otherwise.
    fn evict_dropped(&self) {
        if self.core.pins.load(Relaxed) > 0 {
            return;
        }
        let Ok(mut slot) = self.slot.try_lock() else {
            return;
        };
        let State::Resident(..) = &slot.state else {
            return;
        };
        let max_depth = self.core.state.budget.max_depth();
        let Some(depth) = self.keeps_recipe_when_dead(&slot, max_depth) else {
            return;
        };
        slot.mark_evicted(depth);
        self.core.state.budget.count_eviction(self.core.info.bytes);
    }

    /// Frees the data of a dead cell nobody evicted depends on; keeps its recipe if it can
    /// still be replayed, so live cells computed from it stay recomputable.
    fn settle(&self) {
        // A pinned cell is read by a restore chain still running; its last unpin settles it.
        if !self.core.info.is_dead() || self.core.pins.load(Relaxed) > 0 {
            return;
        }
        if self.core.dependents.load(Relaxed) > 0 {
            self.evict_dropped();
            return;
        }
        let mut slot = self.lock();
        if self.core.dependents.load(Relaxed) > 0 {
            drop(slot);
            self.evict_dropped();
            return;
        }
        match slot.state.status() {
            Status::Resident => {
                let max_depth = self.core.state.budget.max_depth();
                match self.keeps_recipe_when_dead(&slot, max_depth) {
                    Some(depth) => {
                        slot.mark_evicted(depth);
                    }
                    None => {
                        slot.state = State::Gone;
                        let recipe = slot.recipe.take();
                        drop(slot);
                        drop(recipe);
                    }
                }
            }
            Status::Compressed => {
                slot.state = State::Gone;
                let recipe = slot.recipe.take();
                drop(slot);
                drop(recipe);
            }
            Status::Offloaded => {
                if let State::Offloaded(data) = &slot.state {
                    self.core.state.budget.host_release(data.bytes.len() as u64);
                }
                slot.state = State::Gone;
                let recipe = slot.recipe.take();
                drop(slot);
                drop(recipe);
            }
            // A batch is reading it: `finish_offload` settles it.
            Status::Evicted | Status::Offloading | Status::Gone => {}
        }
    }
}

impl<B: Backend, K: Kind<B>> Evictable for Cell<B, K> {
    fn info(&self) -> &CellInfo {
        &self.core.info
    }

    fn status(&self) -> Status {
        self.lock().state.status()
    }

    fn storage_holders(&self) -> Option<(usize, usize)> {
        let slot = self.slot.try_lock().ok()?;
        match &slot.state {
            State::Resident(_, storage) => {
                Some((Arc::as_ptr(storage) as usize, Arc::strong_count(storage)))
            }
            _ => None,
        }
    }

    fn candidate(&self, now: u64, policy: &Policy, shared: bool) -> Option<Candidate> {
        if self.core.pins.load(Relaxed) > 0 {
            return None;
        }
        let slot = self.slot.try_lock().ok()?;
        // A compressed tensor can still be dropped to be recomputed, or offloaded.
        let (storage, compressed) = match &slot.state {
            State::Resident(_, storage) => (storage, false),
            State::Compressed(_, storage) if !shared => (storage, true),
            _ => return None,
        };
        // Alone, only a buffer no other tensor points into is freed by evicting this cell.
        if (!shared && Arc::strong_count(storage) != 1) || storage.bytes == 0 {
            return None;
        }
        let freed = storage.bytes;
        let recompute = (!self.core.info.is_checkpoint())
            .then(|| self.recompute_depth(&slot, policy.max_depth))
            .flatten()
            .filter(|_| !Self::restore_outweighs(&slot, freed))
            .map(|_| {
                let recipe = slot.recipe.as_ref().expect("checked");
                // DTR's evicted neighbourhood: restoring this cell also re-runs its evicted inputs.
                self.core.info.cost
                    + recipe
                        .inputs
                        .iter()
                        .filter(|input| input.try_status() == Some(Status::Evicted))
                        .map(|input| input.core().info.cost)
                        .sum::<f64>()
            });
        let compress = (K::COMPRESSIBLE && !shared && !compressed && self.dtype == DType::F32)
            .then(|| self.core.state.budget.storage())
            .flatten()
            .map(LowPrecision::dtype);
        Candidate::new(
            &self.core.info,
            freed,
            now,
            recompute,
            !self.core.info.strided && !shared,
            compress,
            policy,
        )
    }

    fn evict(&self) -> bool {
        if self.core.pins.load(Relaxed) > 0 {
            return false;
        }
        let Ok(mut slot) = self.slot.try_lock() else {
            return false;
        };
        let (State::Resident(..) | State::Compressed(..)) = &slot.state else {
            return false;
        };
        let max_depth = self.core.state.budget.max_depth();
        let Some(depth) = self.recompute_depth(&slot, max_depth) else {
            return false;
        };
        slot.mark_evicted(depth);
        self.core.state.budget.count_eviction(self.core.info.bytes);
        true
    }

    fn restore(&self) {
        self.ensure_resident();
    }

    fn compress(&self) -> bool {
        let Some(low) = self.core.state.budget.storage().map(LowPrecision::dtype) else {
            return false;
        };
        if !K::COMPRESSIBLE || self.dtype != DType::F32 || self.core.pins.load(Relaxed) > 0 {
            return false;
        }
        let Ok(mut slot) = self.slot.try_lock() else {
            return false;
        };
        let State::Resident(_, storage) = &slot.state else {
            return false;
        };
        if Arc::strong_count(storage) != 1 {
            return false;
        }
        let State::Resident(tensor, storage) = std::mem::replace(&mut slot.state, State::Gone)
        else {
            unreachable!("checked above")
        };
        let low = K::compress(tensor, low);
        let compressed = Arc::new(self.core.state.charge_as(
            &low,
            self.core.info.op,
            self.core.role(),
        ));
        drop(storage);
        self.core.state.budget.count_compress(self.core.info.bytes);
        slot.state = State::Compressed(low, compressed);
        true
    }

    fn host_batch(&self) -> Box<dyn HostBatch> {
        Box::new(HostBatchOf::<B>::new())
    }

    fn offload_into(self: Arc<Self>, batch: &mut dyn HostBatch) -> bool {
        let Some(batch) = batch.as_any().downcast_mut::<HostBatchOf<B>>() else {
            return false;
        };
        match self.begin_offload(&mut batch.transaction) {
            Some(slot) => {
                batch.pending.push((self as Arc<dyn CellDyn>, slot));
                true
            }
            None => false,
        }
    }

    fn drop_frees_at_once(&self) -> bool {
        crate::runtime::drop_frees_at_once::<K::Prim>()
    }

    fn forget_recipe(&self) {
        let recipe = {
            let mut slot = self.lock();
            match slot.state {
                State::Resident(..) => slot.recipe.take(),
                _ => None,
            }
        };
        drop(recipe);
    }
}

impl<B: Backend, K: Kind<B>> CellDyn for Cell<B, K> {
    fn core(&self) -> &CellCore {
        &self.core
    }

    fn try_status(&self) -> Option<Status> {
        Some(self.slot.try_lock().ok()?.state.status())
    }

    fn resident_storage(&self) -> Option<Arc<Storage>> {
        match &self.lock().state {
            State::Resident(_, storage) => Some(storage.clone()),
            _ => None,
        }
    }

    fn set_role(&self, role: Role) {
        self.core.role.store(role as u8, Relaxed);
        if let State::Resident(_, storage) | State::Compressed(_, storage) = &self.lock().state {
            storage.set_role(role);
        }
    }

    fn restore_inputs(&self) -> Vec<Arc<dyn CellDyn>> {
        let slot = self.lock();
        if slot.state.status() != Status::Evicted {
            return Vec::new();
        }
        slot.recipe
            .as_ref()
            .map(|recipe| recipe.inputs.clone())
            .unwrap_or_default()
    }

    fn restore_one(&self) {
        let mut slot = self.lock();
        // Another thread's eviction is reading it to the host; it is back in a moment.
        while slot.state.status() == Status::Offloading {
            drop(slot);
            std::thread::yield_now();
            slot = self.lock();
        }
        let state = self.core.state;
        match std::mem::replace(&mut slot.state, State::Gone) {
            State::Resident(tensor, storage) => slot.state = State::Resident(tensor, storage),
            State::Evicted => {
                let recipe = slot.recipe.as_ref().expect("an evicted cell has a recipe");
                let tensor = (recipe.run)();
                let inputs = recipe.inputs.clone();
                let shared = match &recipe.view_of {
                    Some(ViewOf::Cell(source)) => source.resident_storage(),
                    Some(ViewOf::Kept(storage)) => Some(storage.clone()),
                    None => None,
                };
                let storage = match shared {
                    Some(storage) => storage,
                    None => {
                        log::trace!(
                            "frugal: recompute {} {} B, ordinal {}, dead {}, checkpoint {}",
                            self.core.info.op.name(),
                            self.core.info.bytes,
                            self.core.info.ordinal,
                            self.core.info.is_dead(),
                            self.core.info.is_checkpoint()
                        );
                        state.budget.count_recompute(self.core.info.bytes);
                        Arc::new(state.charge_as(&tensor, self.core.info.op, self.core.role()))
                    }
                };
                slot.state = State::Resident(tensor, storage);
                slot.depth = 0;
                drop(slot);
                for input in inputs {
                    input.remove_dependent();
                }
            }
            State::Offloaded(data) => {
                let started = std::time::Instant::now();
                let host_bytes = data.bytes.len() as u64;
                let tensor = K::from_host(data, &self.device);
                // A compressed tensor was offloaded in its storage type.
                let tensor = if tensor.dtype() != self.dtype {
                    state.budget.count_decompress();
                    K::decompress(tensor, self.dtype)
                } else {
                    tensor
                };
                let storage =
                    Arc::new(state.charge_as(&tensor, self.core.info.op, self.core.role()));
                state.budget.count_upload(host_bytes, started.elapsed());
                slot.state = State::Resident(tensor, storage);
            }
            State::Compressed(low, compressed) => {
                let tensor = K::decompress(low, self.dtype);
                let storage =
                    Arc::new(state.charge_as(&tensor, self.core.info.op, self.core.role()));
                drop(compressed);
                state.budget.count_decompress();
                slot.state = State::Resident(tensor, storage);
            }
            State::Offloading => unreachable!("waited for above"),
            State::Gone => panic!(
                "frugal: internal error: a {} tensor ({} bytes) was read after it was freed",
                self.core.info.op.name(),
                self.core.info.bytes
            ),
        }
    }

    fn finish_offload(&self, data: TensorData) {
        let mut slot = self.lock();
        self.core
            .state
            .budget
            .count_offload(data.bytes.len() as u64);
        slot.state = State::Offloaded(data);
        drop(slot);
        // Dropped while it was being read: free the host copy unless an evicted tensor needs it.
        self.settle();
    }

    fn depth(&self) -> u32 {
        self.lock().depth
    }

    fn shape_ref(&self) -> &Shape {
        &self.shape
    }

    fn add_dependent(&self) {
        self.core.dependents.fetch_add(1, Relaxed);
    }

    fn remove_dependent(&self) {
        if self.core.dependents.fetch_sub(1, Relaxed) == 1 {
            self.settle();
        }
    }

    fn pin(&self) {
        // Pinned first, so that making room for the restore cannot evict it again.
        self.core.pins.fetch_add(1, Relaxed);
        self.ensure_resident();
    }

    fn unpin(&self) {
        if self.core.pins.fetch_sub(1, Relaxed) == 1 {
            self.settle();
        }
    }

    fn on_dead(&self) {
        if !self.core.info.set_dead() {
            self.core.state.budget.on_drop(self.core.info.ordinal);
            self.settle();
        }
    }
}

impl<B: Backend, K: Kind<B>> CellOf<K::Prim> for Cell<B, K> {
    fn get(&self) -> K::Prim {
        self.get_with_storage().0
    }

    fn get_with_storage(&self) -> (K::Prim, Arc<Storage>) {
        self.core.touch();
        loop {
            {
                let slot = self.lock();
                if let State::Resident(tensor, storage) = &slot.state {
                    return (tensor.clone(), storage.clone());
                }
            }
            self.ensure_resident();
        }
    }

    fn consume(&self) -> (K::Prim, Option<Arc<Storage>>) {
        self.core.touch();
        if !self.core.info.set_dead() {
            self.core.state.budget.on_drop(self.core.info.ordinal);
        }
        self.ensure_resident();
        let mut slot = self.lock();
        // Checked under the lock and after the restore: restoring may have evicted a tensor
        // that depends on this one, which must then stay readable.
        if self.core.dependents.load(Relaxed) > 0 || slot.state.status() != Status::Resident {
            drop(slot);
            let (tensor, _) = self.get_with_storage();
            return (tensor, None);
        }
        let max_depth = self.core.state.budget.max_depth();
        let State::Resident(tensor, storage) = std::mem::replace(&mut slot.state, State::Gone)
        else {
            unreachable!("restored above")
        };
        let recipe = match self.keeps_recipe_when_dead(&slot, max_depth) {
            Some(depth) => {
                slot.mark_evicted(depth);
                None
            }
            None => slot.recipe.take(),
        };
        drop(slot);
        drop(recipe);
        (tensor, Some(storage))
    }

    fn shape(&self) -> Shape {
        self.shape.clone()
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn dtype_ref(&self) -> &DType {
        &self.dtype
    }

    fn device_any(&self) -> &dyn std::any::Any {
        &self.device
    }
}

impl<B: Backend, K: Kind<B>> Drop for Cell<B, K> {
    fn drop(&mut self) {
        let slot = self.slot.get_mut().unwrap_or_else(|e| e.into_inner());
        match &slot.state {
            State::Evicted => {
                if let Some(recipe) = slot.recipe.take() {
                    for input in &recipe.inputs {
                        input.remove_dependent();
                    }
                }
            }
            State::Offloaded(data) => self.core.state.budget.host_release(data.bytes.len() as u64),
            State::Resident(..) | State::Offloading | State::Compressed(..) | State::Gone => {}
        }
    }
}

#[cfg(test)]
mod tests {
    //! The state machine of one cell, on NdArray, without the engine choosing: each test
    //! drives the transitions itself.

    use burn::backend::NdArray;
    use burn_backend::ops::FloatTensorOps;

    use super::*;
    use crate::op::families::float;
    use crate::remat::{FloatKind, Handle, Source};

    /// NdArray with its default element types.
    type Nd = NdArray;
    type Prim = <Nd as burn_backend::BackendTypes>::FloatTensorPrimitive;

    fn state() -> &'static DeviceState {
        // A device of its own, so other tests' tensors do not share its counters.
        DeviceState::of_device(&burn::backend::ndarray::NdArrayDevice::Cpu)
    }

    fn values(tensor: Prim) -> Vec<f32> {
        burn_std::future::block_on(Nd::float_into_data(tensor))
            .unwrap()
            .to_vec()
            .unwrap()
    }

    /// A kept input and a cell computing `exp` of it, with its recipe.
    fn exp_cell() -> (Arc<Cell<Nd, FloatKind>>, Vec<f32>) {
        let device = Default::default();
        let input =
            Nd::float_from_data(burn_backend::TensorData::from([0.5f32, 1.0, -2.0]), &device);
        let exp = float::op(float::Op::float_exp);
        let kept = Source::Kept(input.clone(), Arc::new(state().charge(&input, exp)));
        let out = Nd::float_exp(input);
        let expected = values(out.clone());
        let storage = Arc::new(state().charge(&out, exp));
        let recipe = Recipe {
            run: Box::new(move || Nd::float_exp(kept.get())),
            inputs: Vec::new(),
            view_of: None,
        };
        (Cell::create(out, storage, Some(recipe), 1.0), expected)
    }

    #[test]
    fn an_evicted_cell_is_recomputed_to_the_same_values_when_read() {
        let (cell, expected) = exp_cell();
        assert_eq!(cell.status(), Status::Resident);
        let before = state().budget.stats().recomputes;
        assert!(cell.evict());
        assert_eq!(cell.status(), Status::Evicted);
        assert!(cell.resident_storage().is_none());
        assert_eq!(values(cell.get()), expected);
        assert_eq!(cell.status(), Status::Resident);
        assert!(state().budget.stats().recomputes > before);
    }

    #[test]
    fn an_offloaded_cell_comes_back_from_host_memory() {
        let (cell, expected) = exp_cell();
        let mut batch = cell.host_batch();
        assert!(cell.clone().offload_into(&mut *batch));
        assert_eq!(cell.status(), Status::Offloading);
        assert_eq!(batch.finish(), 1);
        assert_eq!(cell.status(), Status::Offloaded);
        assert_eq!(values(cell.get()), expected);
        assert_eq!(cell.status(), Status::Resident);
    }

    #[test]
    fn a_pinned_cell_is_neither_evicted_nor_offloaded() {
        let (cell, _) = exp_cell();
        cell.core.pins.fetch_add(1, Relaxed);
        assert!(!cell.evict());
        assert!(!cell.clone().offload_into(&mut *cell.host_batch()));
        cell.core.pins.fetch_sub(1, Relaxed);
        assert!(cell.evict());
    }

    #[test]
    fn dropping_the_last_handle_frees_a_cell_nothing_depends_on() {
        let (cell, _) = exp_cell();
        let handle = Handle::<Prim> { cell: cell.clone() };
        drop(handle);
        assert!(cell.core.info.is_dead());
        // Its recipe reads no dropped tensor, so it keeps it: evicted rather than gone.
        assert_eq!(cell.status(), Status::Evicted);
        // A cell without a recipe has nothing to keep.
        let device = Default::default();
        let lone = Nd::float_from_data(burn_backend::TensorData::from([1.0f32]), &device);
        let storage = Arc::new(state().charge(&lone, float::op(float::Op::float_exp)));
        let lone = Cell::<NdArray, FloatKind>::create(lone, storage, None, 0.0);
        drop(Handle::<Prim> { cell: lone.clone() });
        assert_eq!(lone.status(), Status::Gone);
    }

    /// A cell computing `exp` of the managed `input`, with its recipe.
    fn exp_of(input: &Arc<Cell<Nd, FloatKind>>) -> Arc<Cell<Nd, FloatKind>> {
        let exp = float::op(float::Op::float_exp);
        let out = Nd::float_exp(input.get());
        let storage = Arc::new(state().charge(&out, exp));
        let source = Source::Cell(input.clone() as Arc<dyn CellOf<Prim>>);
        let recipe = Recipe {
            run: Box::new(move || Nd::float_exp(source.get())),
            inputs: vec![input.clone() as Arc<dyn CellDyn>],
            view_of: None,
        };
        Cell::create(out, storage, Some(recipe), 1.0)
    }

    #[test]
    fn a_cell_that_forgets_its_recipe_lets_the_dropped_tensors_it_was_computed_from_go() {
        // a (no recipe) -> b -> c, as a block's input, a product and a segment's checkpoint.
        let device = Default::default();
        let a = Nd::float_from_data(burn_backend::TensorData::from([1.0f32, 2.0]), &device);
        let storage = Arc::new(state().charge(&a, float::op(float::Op::float_exp)));
        let a = Cell::<NdArray, FloatKind>::create(a, storage, None, 0.0);
        let b = exp_of(&a);
        let c = exp_of(&b);
        let expected = values(c.get());
        // b is dropped to be recomputed, then the program drops a and b: a stays on the
        // device, since recomputing b (for c) needs it.
        assert!(b.evict());
        drop(Handle::<Prim> { cell: a.clone() });
        drop(Handle::<Prim> { cell: b.clone() });
        assert_eq!(a.status(), Status::Resident);
        drop(b);
        // c will not be recomputed: without its recipe, b goes and a with it.
        c.forget_recipe();
        assert_eq!(a.status(), Status::Gone);
        assert_eq!(values(c.get()), expected);
        assert!(
            !c.evict(),
            "a cell without a recipe cannot be dropped to be recomputed"
        );
    }
}
