//! The cell state machine: resident, evicted, offloaded (or on its way), compressed, gone.
//! This file holds the cell, its creation and the program's reads; by role beside it:
//! `restore.rs` the restore chain, `evictable.rs` what the budget sees and asks of a cell,
//! `dropped.rs` what happens when the program drops its last handle.

mod dropped;
mod evictable;
mod restore;

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use burn_backend::{Backend, DType, Shape, TensorData, TensorMetadata};

use super::{CellDyn, CellOf, Kind, Origin, Recipe, Values, ViewOf};
use crate::device::{DeviceState, NO_OWNER, Storage};
use crate::engine::{CellInfo, Evictable, Made, Status};
use crate::ledger::Role;

enum State<P, Q> {
    Resident(P, Arc<Storage>),
    Evicted,
    Offloaded(TensorData),
    /// Being read to host memory by a batch: the tensor is kept (it is the buffer the read
    /// needs anyway) so that a read that fails puts the cell back as it was, compressed or
    /// not, instead of losing its data.
    Offloading(P, bool),
    Compressed(P, Arc<Storage>),
    /// A tensor of only 0 and 1 kept as booleans (see [`Kind::pack`]): exact, unlike
    /// `Compressed`; the engine sees both as compressed.
    Packed(Q, Arc<Storage>),
    Gone,
}

impl<P, Q> State<P, Q> {
    fn status(&self) -> Status {
        match self {
            State::Resident(..) => Status::Resident,
            State::Evicted => Status::Evicted,
            State::Offloaded(_) => Status::Offloaded,
            State::Offloading(..) => Status::Offloading,
            State::Compressed(..) | State::Packed(..) => Status::Compressed,
            State::Gone => Status::Gone,
        }
    }
}

struct Slot<P, Q> {
    state: State<P, Q>,
    recipe: Option<Recipe<P>>,
    /// Length of the chain of evicted cells a restore of this one walks (0 when resident).
    depth: u32,
}

impl<P, Q> Slot<P, Q> {
    /// Resident (or compressed) to evicted: the data is dropped, and each recipe input counts
    /// this cell as a dependent until it is restored, so it stays restorable. Returns false,
    /// leaving the state as it was, when an input was consumed since it was checked (another
    /// thread's op took its data) or is in use: counted first and then looked at, an input
    /// consumed from now on sees this dependent and keeps its data.
    #[must_use]
    fn mark_evicted(&mut self, depth: u32) -> bool {
        let inputs = &self
            .recipe
            .as_ref()
            .expect("an evicted cell has a recipe")
            .inputs;
        for input in inputs {
            input.add_dependent();
        }
        if inputs
            .iter()
            .any(|input| matches!(input.try_status(), None | Some(Status::Gone)))
        {
            for input in inputs {
                input.remove_dependent();
            }
            return false;
        }
        self.depth = depth;
        self.state = State::Evicted;
        true
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
    /// (`SELECTION_DEAD_CHAIN` in `dropped.rs`); the selection recomputes only from tensors the program
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
fn token(op: crate::vocabulary::OpId, shape: &Shape, dtype: DType) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    op.hash(&mut hasher);
    shape.as_slice().hash(&mut hasher);
    dtype.hash(&mut hasher);
    hasher.finish()
}

/// The slot of a cell of kind `K` on backend `B`.
type SlotOf<B, K> =
    Slot<<K as Kind<B>>::Prim, <B as burn_backend::BackendTypes>::BoolTensorPrimitive>;

/// A managed tensor of kind `K` on backend `B`.
pub(crate) struct Cell<B: Backend, K: Kind<B>> {
    core: CellCore,
    slot: Mutex<SlotOf<B, K>>,
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
        origin: Origin,
    ) -> Arc<Self> {
        let op = storage.op;
        Self::create_made_by(tensor, storage, recipe, cost, op, origin)
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
        made_by: crate::vocabulary::OpId,
        origin: Origin,
    ) -> Arc<Self> {
        let state = storage.state;
        // Packing a view would leave its buffer's other views unpacked: only a buffer's own
        // tensor is packed.
        let packed = (origin.values == Values::Binary
            && storage.plan_owner.load(Relaxed) == NO_OWNER)
            .then(|| K::packed_bytes(&tensor))
            .flatten();
        let shape = tensor.shape();
        let owner = Some(storage.plan_owner.load(Relaxed)).filter(|&o| o != NO_OWNER);
        let made = Made {
            token: token(made_by, &shape, tensor.dtype()),
            op: storage.op,
            bytes: storage.bytes,
            live: state.ledger.live_bytes(),
            // The step plan asks whether the op could replay it, recipe or not: a selection
            // recomputes inputs the program dropped with the tensors it chooses.
            recompute: (origin.replays
                || recipe
                    .as_ref()
                    .is_some_and(|recipe| recipe.view_of.is_none()))
            .then_some(cost)
            .filter(|_| storage.op.facts().replayable),
            owner,
            cost,
            forward: storage.role() == Role::Activation,
            packed,
        };
        let created =
            state
                .budget
                .on_create(made, state.scopes.opened_at(), state.scopes.any_open());
        let ordinal = created.ordinal;
        let owner = owner.unwrap_or_else(|| {
            storage.plan_owner.store(ordinal, Relaxed);
            ordinal
        });
        // A parameter or optimizer state would be recomputed from the previous step's, which
        // its recipe would keep on the device beside it: such tensors are only offloaded.
        let recipe = recipe.filter(|_| !created.outlives_step);
        let scope = state.scopes.current(&state.budget);
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
                )
                .with_packed(packed),
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
            state.budget.hold_chosen(
                chosen,
                Arc::downgrade(&cell) as std::sync::Weak<dyn Evictable>,
            );
        }
        cell
    }

    fn lock(&self) -> MutexGuard<'_, SlotOf<B, K>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
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
        if let State::Resident(_, storage)
        | State::Compressed(_, storage)
        | State::Packed(_, storage) = &self.lock().state
        {
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
                        state
                            .budget
                            .count_recompute(self.core.info.bytes, self.core.info.cost);
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
            State::Packed(packed, storage) => {
                let tensor = K::unpack(packed, self.dtype);
                drop(storage);
                let storage =
                    Arc::new(state.charge_as(&tensor, self.core.info.op, self.core.role()));
                state.budget.count_unpack();
                slot.state = State::Resident(tensor, storage);
            }
            State::Offloading(..) => unreachable!("waited for above"),
            State::Gone => panic!(
                "frugal: internal error: a {} tensor ({} bytes) was read after it was freed",
                self.core.info.op.name(),
                self.core.info.bytes
            ),
        }
    }

    fn abort_offload(&self) {
        let mut slot = self.lock();
        if !matches!(slot.state, State::Offloading(..)) {
            return;
        }
        let State::Offloading(tensor, compressed) = std::mem::replace(&mut slot.state, State::Gone)
        else {
            unreachable!("checked above")
        };
        let storage = Arc::new(self.core.state.charge_as(
            &tensor,
            self.core.info.op,
            self.core.role(),
        ));
        slot.state = match compressed {
            true => State::Compressed(tensor, storage),
            false => State::Resident(tensor, storage),
        };
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
            // The evicted tensors that need it keep it recomputable; its bytes go now, not
            // when they are gone, as the plan's simulation frees a tensor at its last read.
            let (tensor, storage) = self.get_with_storage();
            self.evict_dropped();
            return (tensor, Some(storage));
        }
        let max_depth = self.core.state.budget.max_depth();
        let State::Resident(tensor, storage) = std::mem::replace(&mut slot.state, State::Gone)
        else {
            unreachable!("restored above")
        };
        let recipe = match self.keeps_recipe_when_dead(&slot, max_depth) {
            Some(depth) if slot.mark_evicted(depth) => None,
            _ => slot.recipe.take(),
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
            State::Resident(..)
            | State::Offloading(..)
            | State::Compressed(..)
            | State::Packed(..)
            | State::Gone => {}
        }
    }
}

#[cfg(test)]
mod tests;
