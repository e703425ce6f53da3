//! Managed tensors: the mechanism that lets Frugal drop a tensor's device buffer and bring it
//! back later, by re-running the op that made it (rematerialisation) or by copying it from
//! host memory (offload).
//!
//! While a device is under a budget or inside a checkpoint scope, every tensor Frugal creates
//! there is a [`Cell`]: its state (resident on the device, evicted, offloaded to the host, or
//! gone for good), and a [`Recipe`] to recompute it from its input cells when the op can be
//! replayed with the same result. The user's tensors hold a [`Handle`]; recipes hold the cells
//! directly, so Frugal knows when the program itself no longer holds a tensor ("dead").
//!
//! Invariants:
//! - an evicted cell can always be restored: each of its recipe inputs counts it as a
//!   dependent and is kept (resident, offloaded, or itself evicted and restorable) until the
//!   count is back to zero;
//! - a dead cell holds no device memory unless an evicted dependent needs it;
//! - restoring walks the chain of evicted inputs with an explicit stack, so a long chain cannot
//!   overflow the thread's stack, and no eviction happens until the op that asked returns.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use burn_backend::ops::TransactionPrimitive;
use burn_backend::{Backend, DType, Shape, TensorData, TensorMetadata};

use crate::ledger::Ledger;
use crate::ops::OpId;
use crate::policy::{Candidate, Policy};
use crate::tensor::Storage;

/// Which of the backend's four tensor kinds a cell holds, with the calls needed to move it to
/// the host and back.
pub(crate) trait Kind<B: Backend>: Send + Sync + 'static {
    type Prim: TensorMetadata + Clone + Send + Sync + 'static;
    fn device(tensor: &Self::Prim) -> B::Device;
    fn from_host(data: TensorData, device: &B::Device) -> Self::Prim;
    /// Adds `tensor` to a transaction's reads; the slot says where its data comes back.
    fn push_read(tensor: Self::Prim, transaction: &mut TransactionPrimitive<B>) -> ReadSlot;
    /// Whether tensors of this kind can be stored compressed (float kinds only).
    const COMPRESSIBLE: bool;
    /// `tensor` cast to the storage type `low` (only called when `COMPRESSIBLE`).
    fn compress(tensor: Self::Prim, low: DType) -> Self::Prim;
    /// A compressed tensor cast back to its type `dtype`.
    fn decompress(tensor: Self::Prim, dtype: DType) -> Self::Prim;
}

/// Where one tensor's data is in a transaction's result.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReadSlot {
    Float(usize),
    Int(usize),
    Bool(usize),
    Quantized(usize),
}

macro_rules! kinds {
    ($($kind:ident: $prim:ident, $device:ident, $from:ident, $reads:ident, $slot:ident, $cast:ident;)*) => {$(
        pub(crate) struct $kind;
        impl<B: Backend> Kind<B> for $kind {
            type Prim = B::$prim;
            fn device(tensor: &Self::Prim) -> B::Device {
                B::$device(tensor)
            }
            fn from_host(data: TensorData, device: &B::Device) -> Self::Prim {
                B::$from(data, device)
            }
            fn push_read(
                tensor: Self::Prim,
                transaction: &mut TransactionPrimitive<B>,
            ) -> ReadSlot {
                transaction.$reads.push(tensor);
                ReadSlot::$slot(transaction.$reads.len() - 1)
            }
            const COMPRESSIBLE: bool = kinds!(@compressible $cast);
            fn compress(tensor: Self::Prim, low: DType) -> Self::Prim {
                kinds!(@cast $cast, tensor, low)
            }
            fn decompress(tensor: Self::Prim, dtype: DType) -> Self::Prim {
                kinds!(@cast $cast, tensor, dtype)
            }
        }
    )*};
    (@compressible none) => { false };
    (@compressible $cast:ident) => { true };
    (@cast none, $t:ident, $d:ident) => {{
        let _ = $d;
        $t
    }};
    (@cast $cast:ident, $t:ident, $d:ident) => {
        $crate::kernels::cast_for::<B>(
            $t,
            burn_std::FloatDType::from($d),
            $crate::kernels::CastPurpose::Storage,
        )
    };
}

kinds! {
    FloatKind: FloatTensorPrimitive, float_device, float_from_data, read_floats, Float, float_cast;
    IntKind: IntTensorPrimitive, int_device, int_from_data, read_ints, Int, none;
    BoolKind: BoolTensorPrimitive, bool_device, bool_from_data, read_bools, Bool, none;
    QuantKind: QuantizedTensorPrimitive, q_device, q_from_data, read_qfloats, Quantized, none;
}

/// Tensors on their way to host memory. They are read back together in one transaction: each
/// read from a GPU waits for the device's queue to drain, so one wait for many tensors instead
/// of one per tensor keeps the device busy.
pub(crate) trait HostBatch {
    /// Moves `cell`'s data into the batch (its device bytes leave the ledger now); `false` if
    /// the cell cannot be offloaded any more.
    fn add(&mut self, cell: &Arc<dyn CellDyn>) -> bool;
    /// Reads every tensor of the batch and hands each cell its host copy; returns how many.
    fn finish(self: Box<Self>) -> usize;
}

struct HostBatchOf<B: Backend> {
    transaction: TransactionPrimitive<B>,
    pending: Vec<(Arc<dyn CellDyn>, ReadSlot)>,
}

impl<B: Backend> HostBatch for HostBatchOf<B> {
    fn add(&mut self, cell: &Arc<dyn CellDyn>) -> bool {
        match cell.begin_offload(&mut self.transaction) {
            Some(slot) => {
                self.pending.push((cell.clone(), slot));
                true
            }
            None => false,
        }
    }

    fn finish(self: Box<Self>) -> usize {
        let this = *self;
        let count = this.pending.len();
        if count == 0 {
            return 0;
        }
        let data =
            burn_std::future::block_on(B::tr_execute(this.transaction)).unwrap_or_else(|err| {
                panic!("frugal: offloading tensors to host memory failed: {err:?}")
            });
        let mut lists = [
            data.read_floats.into_iter().map(Some).collect::<Vec<_>>(),
            data.read_ints.into_iter().map(Some).collect(),
            data.read_bools.into_iter().map(Some).collect(),
            data.read_qfloats.into_iter().map(Some).collect(),
        ];
        for (cell, slot) in this.pending {
            let (list, index) = match slot {
                ReadSlot::Float(i) => (0, i),
                ReadSlot::Int(i) => (1, i),
                ReadSlot::Bool(i) => (2, i),
                ReadSlot::Quantized(i) => (3, i),
            };
            let data = lists[list][index]
                .take()
                .expect("frugal: internal error: a transaction read came back short");
            cell.finish_offload(data);
        }
        count
    }
}

/// How to compute a cell again: a closure over its inputs' cells (or kept copies of unmanaged
/// inputs) and the op's other arguments.
pub(crate) struct Recipe<P> {
    pub(crate) run: Box<dyn Fn() -> P + Send + Sync>,
    pub(crate) inputs: Vec<Arc<dyn CellDyn>>,
    /// For a view op: the storage its result shares, so a restored view is not charged again.
    pub(crate) view_of: Option<ViewOf>,
}

/// Where a view's buffer comes from.
pub(crate) enum ViewOf {
    /// A managed tensor: its storage record as of the restore.
    Cell(Arc<dyn CellDyn>),
    /// An unmanaged tensor the recipe keeps.
    Kept(Arc<Storage>),
}

/// Where a cell's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Resident,
    Evicted,
    Offloaded,
    /// In a [`HostBatch`] that has not been read yet.
    Offloading,
    /// On the device in a lower-precision storage type, cast back when read.
    Compressed,
    Gone,
}

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

/// What every cell shares whatever its kind: identity, accounting and eviction bookkeeping.
pub(crate) struct CellCore {
    pub(crate) ledger: &'static Ledger,
    pub(crate) op: OpId,
    pub(crate) bytes: u64,
    /// Estimated cost of re-running the op alone (see [`crate::policy::op_cost`]).
    pub(crate) cost: f64,
    /// The checkpoint scope the cell was created in (0: none).
    pub(crate) scope: u64,
    last_use: AtomicU64,
    /// Evicted cells whose recipe reads this one.
    dependents: AtomicU32,
    /// The program holds no handle to it any more.
    dead: AtomicBool,
    /// Restores in progress that need it resident: never evicted while non-zero.
    pins: AtomicU32,
    /// The inner tensor may have a non-standard memory layout (a view, or an elementwise
    /// result of one). A host copy comes back contiguous, and some backends round
    /// reductions differently by layout, so such tensors are recomputed, never offloaded.
    pub(crate) strided: bool,
    /// For a dropped tensor that kept its recipe: how many dropped tensors lead from it to
    /// tensors the program holds.
    dead_chain: AtomicU32,
}

impl CellCore {
    pub(crate) fn last_use(&self) -> u64 {
        self.last_use.load(Relaxed)
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Relaxed)
    }

    fn touch(&self) {
        self.last_use.store(self.ledger.budget.tick(), Relaxed);
    }
}

/// The kind-independent face of a cell, used by the eviction policy and by recipes.
pub(crate) trait CellDyn: Send + Sync {
    fn core(&self) -> &CellCore;
    fn status(&self) -> Status;
    /// The status, or `None` if the cell is in use (locked) right now.
    fn try_status(&self) -> Option<Status>;
    /// The storage record of a resident cell.
    fn resident_storage(&self) -> Option<Arc<Storage>>;
    /// Recipe inputs that must be restored before this cell can be: evicted or offloaded.
    fn missing_inputs(&self) -> Vec<Arc<dyn CellDyn>>;
    /// Brings this one cell back, assuming its inputs can be read without recomputation.
    fn restore_one(&self);
    /// How this cell could be evicted now, and at what cost; `None` if it cannot be.
    /// With `shared`, the cell is scored as one of a group of cells that share its buffer and
    /// are evicted together (recomputation only).
    fn candidate(&self, now: u64, policy: &Policy, shared: bool) -> Option<Candidate>;
    /// The address of a resident cell's storage record and how many hold it.
    fn storage_holders(&self) -> Option<(usize, usize)>;
    /// Evicts the cell to be recomputed when read, returning whether it was evicted. Never
    /// blocks: a cell in use elsewhere is skipped. (Offloading goes through [`HostBatch`].)
    fn evict(&self) -> bool;
    /// Keeps the cell on the device in the budget's storage type (bf16 or f16), cast back when
    /// read; returns whether it was compressed (resident, unpinned, unshared f32 only).
    fn compress(&self) -> bool;
    /// A batch for offloading cells of this one's backend together.
    fn host_batch(&self) -> Box<dyn HostBatch>;
    /// Moves the data of a resident, unpinned, unshared cell into `transaction` (a
    /// `TransactionPrimitive` of this cell's backend) and marks it offloading.
    fn begin_offload(&self, transaction: &mut dyn std::any::Any) -> Option<ReadSlot>;
    /// Stores the host copy read by the batch.
    fn finish_offload(&self, data: TensorData);
    fn depth(&self) -> u32;
    fn shape_ref(&self) -> &Shape;
    fn add_dependent(&self);
    fn remove_dependent(&self);
    /// Ends one restore chain's pin; the last frees the data of a dropped cell nobody needs.
    fn unpin(&self);
    /// Called once when the program's last handle goes: frees the data unless needed.
    fn on_dead(&self);
}

/// A cell of a known primitive type.
pub(crate) trait CellOf<P>: CellDyn {
    /// The data, restored first if needed.
    fn get(&self) -> P;
    /// The data and its storage record, restored first if needed.
    fn get_with_storage(&self) -> (P, Arc<Storage>);
    /// Hands the data to an op that consumes the program's last handle: moved out (so the
    /// inner backend may reuse the buffer) unless an evicted dependent still needs it.
    fn consume(&self) -> (P, Option<Arc<Storage>>);
    fn shape(&self) -> Shape;
    fn dtype(&self) -> DType;
    fn dtype_ref(&self) -> &DType;
    /// The device, without restoring the data.
    fn device_any(&self) -> &dyn std::any::Any;
}

/// The longest chain of dropped tensors kept only to recompute live ones.
const MAX_DEAD_CHAIN: u32 = 1;

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
        let ledger = storage.ledger;
        let shape = tensor.shape();
        let scope = ledger.budget.current_scope();
        // Outside any scope, an op that reads a checkpoint scope's tensors (a gradient reading
        // the activations the backward pass restored) gets no recipe, as it would have without
        // a budget: the scope decides what is recomputed. Its recipe would hold the scope's
        // dropped tensors and, through their recipes, the buffers those read: a weight's
        // gradient, live until the optimizer step, kept each block's `exp` and `gelu` on the
        // device (CPU, a never-reached budget over scopes: 65.0 MB peak live against 36.8 MB).
        // Views keep theirs: they cost nothing to replay and share their source's buffer.
        let recipe = recipe.filter(|recipe| {
            scope != 0
                || recipe.view_of.is_some()
                || recipe.inputs.iter().all(|input| input.core().scope == 0)
        });
        // A product's result has a layout of its own: only views and same-shaped results of
        // strided inputs (elementwise ops may keep their input's layout) are strided. Counting
        // `x.matmul(x.transpose())` as strided left it neither offloadable nor, once `x` was
        // consumed, recomputable, and the budget failed with room to spare.
        let strided = recipe.as_ref().is_some_and(|recipe| {
            recipe.view_of.is_some()
                || (!crate::policy::is_product(storage.op.name())
                    && recipe
                        .inputs
                        .iter()
                        .any(|input| input.core().strided && *input.shape_ref() == shape))
        });
        let cell = Arc::new(Self {
            core: CellCore {
                ledger,
                op: storage.op,
                bytes: storage.bytes,
                cost,
                scope,
                last_use: AtomicU64::new(ledger.budget.tick()),
                dependents: AtomicU32::new(0),
                dead: AtomicBool::new(false),
                pins: AtomicU32::new(0),
                strided,
                dead_chain: AtomicU32::new(0),
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
        ledger
            .budget
            .register(Arc::downgrade(&cell) as std::sync::Weak<dyn CellDyn>);
        cell
    }

    fn lock(&self) -> MutexGuard<'_, Slot<K::Prim>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Restores this cell and every evicted or offloaded cell its recipe needs, deepest first.
    /// A cell of the chain is pinned from the start until the last cell of the chain that reads
    /// it is restored; between restores the budget evicts other tensors (and the cells no
    /// longer needed), so a long chain does not pile up above the budget.
    fn ensure_resident(&self) {
        if self.status() == Status::Resident {
            return;
        }
        type Key = *const CellCore;
        let key = |cell: &Arc<dyn CellDyn>| cell.core() as Key;
        // Post-order walk with an explicit stack: inputs are restored before their users. Each
        // cell comes with the inputs it must wait for.
        let root_inputs = self.missing_inputs();
        let mut order: Vec<(Arc<dyn CellDyn>, Vec<Key>)> = Vec::new();
        /// A cell to visit, with its own missing inputs once expanded.
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
            let inputs = cell.missing_inputs();
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
            pins.chain
                .push((&**cell, readers(cell.core() as Key).max(1)));
        }
        self.core.pins.fetch_add(1, Relaxed);
        let budget = &self.core.ledger.budget;
        for (cell, inputs) in &order {
            if cell.status() != Status::Resident {
                cell.restore_one();
            }
            pins.done_reading(inputs);
            budget.relieve(self.core.ledger);
        }
        self.restore_one();
        drop(pins);
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
        let chain = recipe
            .inputs
            .iter()
            .filter(|input| input.core().is_dead())
            .map(|input| input.core().dead_chain.load(Relaxed) + 1)
            .max()
            .unwrap_or(1);
        let limit = if self.core.scope != 0 {
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
        let max_depth = self.core.ledger.budget.policy().max_depth;
        let Some(depth) = self.keeps_recipe_when_dead(&slot, max_depth) else {
            return;
        };
        slot.depth = depth;
        slot.state = State::Evicted;
        for input in &slot.recipe.as_ref().expect("checked").inputs {
            input.add_dependent();
        }
        self.core.ledger.budget.count_eviction(self.core.bytes);
    }

    /// Frees the data of a dead cell nobody evicted depends on; keeps its recipe if it can
    /// still be replayed, so live cells computed from it stay recomputable.
    fn settle(&self) {
        // A pinned cell is read by a restore chain still running; its last unpin settles it.
        if !self.core.is_dead() || self.core.pins.load(Relaxed) > 0 {
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
                let max_depth = self.core.ledger.budget.policy().max_depth;
                match self.keeps_recipe_when_dead(&slot, max_depth) {
                    Some(depth) => {
                        slot.depth = depth;
                        slot.state = State::Evicted;
                        for input in &slot.recipe.as_ref().expect("checked").inputs {
                            input.add_dependent();
                        }
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
                    self.core
                        .ledger
                        .budget
                        .host_release(data.bytes.len() as u64);
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

impl<B: Backend, K: Kind<B>> CellDyn for Cell<B, K> {
    fn core(&self) -> &CellCore {
        &self.core
    }

    fn status(&self) -> Status {
        self.lock().state.status()
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

    fn missing_inputs(&self) -> Vec<Arc<dyn CellDyn>> {
        let slot = self.lock();
        if slot.state.status() != Status::Evicted {
            return Vec::new();
        }
        slot.recipe
            .as_ref()
            .map(|recipe| {
                recipe
                    .inputs
                    .iter()
                    .filter(|input| {
                        matches!(
                            input.status(),
                            Status::Evicted
                                | Status::Offloaded
                                | Status::Offloading
                                | Status::Compressed
                        )
                    })
                    .cloned()
                    .collect()
            })
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
        let ledger = self.core.ledger;
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
                        ledger.budget.count_recompute(self.core.bytes);
                        Arc::new(ledger.charge(&tensor, self.core.op))
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
                    ledger.budget.count_decompress(self.core.bytes);
                    K::decompress(tensor, self.dtype)
                } else {
                    tensor
                };
                ledger.budget.count_upload_time(started.elapsed());
                let storage = Arc::new(ledger.charge(&tensor, self.core.op));
                ledger.budget.count_upload(host_bytes);
                slot.state = State::Resident(tensor, storage);
            }
            State::Compressed(low, compressed) => {
                let tensor = K::decompress(low, self.dtype);
                let storage = Arc::new(ledger.charge(&tensor, self.core.op));
                drop(compressed);
                ledger.budget.count_decompress(self.core.bytes);
                slot.state = State::Resident(tensor, storage);
            }
            State::Offloading => unreachable!("waited for above"),
            State::Gone => panic!(
                "frugal: internal error: a {} tensor ({} bytes) was read after it was freed",
                self.core.op.name(),
                self.core.bytes
            ),
        }
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
        let recompute = self.recompute_depth(&slot, policy.max_depth).map(|_| {
            let recipe = slot.recipe.as_ref().expect("checked");
            // DTR's evicted neighbourhood: restoring this cell also re-runs its evicted inputs.
            self.core.cost
                + recipe
                    .inputs
                    .iter()
                    .filter(|input| input.try_status() == Some(Status::Evicted))
                    .map(|input| input.core().cost)
                    .sum::<f64>()
        });
        let compress = (K::COMPRESSIBLE && !shared && !compressed && self.dtype == DType::F32)
            .then_some(self.core.ledger.budget.storage_dtype())
            .flatten();
        Candidate::new(
            &self.core,
            freed,
            now,
            recompute,
            !self.core.strided && !shared,
            compress,
            policy,
        )
    }

    fn compress(&self) -> bool {
        let Some(low) = self.core.ledger.budget.storage_dtype() else {
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
        let compressed = Arc::new(self.core.ledger.charge(&low, self.core.op));
        drop(storage);
        self.core.ledger.budget.count_compress(self.core.bytes);
        slot.state = State::Compressed(low, compressed);
        true
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
        let max_depth = self.core.ledger.budget.policy().max_depth;
        let Some(depth) = self.recompute_depth(&slot, max_depth) else {
            return false;
        };
        slot.depth = depth;
        slot.state = State::Evicted;
        for input in &slot.recipe.as_ref().expect("checked").inputs {
            input.add_dependent();
        }
        self.core.ledger.budget.count_eviction(self.core.bytes);
        true
    }

    fn host_batch(&self) -> Box<dyn HostBatch> {
        Box::new(HostBatchOf::<B> {
            transaction: TransactionPrimitive::new(Vec::new(), Vec::new(), Vec::new(), Vec::new()),
            pending: Vec::new(),
        })
    }

    fn begin_offload(&self, transaction: &mut dyn std::any::Any) -> Option<ReadSlot> {
        let transaction = transaction.downcast_mut::<TransactionPrimitive<B>>()?;
        if self.core.pins.load(Relaxed) > 0 || self.core.strided {
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

    fn finish_offload(&self, data: TensorData) {
        let mut slot = self.lock();
        self.core
            .ledger
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

    fn unpin(&self) {
        if self.core.pins.fetch_sub(1, Relaxed) == 1 {
            self.settle();
        }
    }

    fn on_dead(&self) {
        if !self.core.dead.swap(true, Relaxed) {
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
        self.core.dead.store(true, Relaxed);
        self.ensure_resident();
        let mut slot = self.lock();
        // Checked under the lock and after the restore: restoring may have evicted a tensor
        // that depends on this one, which must then stay readable.
        if self.core.dependents.load(Relaxed) > 0 || slot.state.status() != Status::Resident {
            drop(slot);
            let (tensor, _) = self.get_with_storage();
            return (tensor, None);
        }
        let max_depth = self.core.ledger.budget.policy().max_depth;
        let next = match self.keeps_recipe_when_dead(&slot, max_depth) {
            Some(depth) => {
                slot.depth = depth;
                for input in &slot.recipe.as_ref().expect("checked").inputs {
                    input.add_dependent();
                }
                State::Evicted
            }
            None => State::Gone,
        };
        let State::Resident(tensor, storage) = std::mem::replace(&mut slot.state, next) else {
            unreachable!("restored above")
        };
        let recipe = if slot.state.status() == Status::Gone {
            slot.recipe.take()
        } else {
            None
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
            State::Offloaded(data) => self
                .core
                .ledger
                .budget
                .host_release(data.bytes.len() as u64),
            State::Resident(..) | State::Offloading | State::Compressed(..) | State::Gone => {}
        }
    }
}

/// The program's reference to a managed tensor. Clones of a [`crate::FrugalTensor`] share one
/// handle; when the last goes, the cell learns it is dead.
pub(crate) struct Handle<P: 'static> {
    pub(crate) cell: Arc<dyn CellOf<P>>,
}

impl<P> Drop for Handle<P> {
    fn drop(&mut self) {
        self.cell.on_dead();
    }
}

/// An input as a recipe sees it.
pub(crate) enum Source<P: 'static> {
    /// A managed tensor: read through its cell, restored if evicted.
    Cell(Arc<dyn CellOf<P>>),
    /// An unmanaged tensor the recipe keeps (and the ledger keeps counting).
    Kept(P, Arc<Storage>),
    /// An input the op consumed and nobody else holds: the output cannot be recomputed.
    Gone,
}

impl<P: Clone> Source<P> {
    pub(crate) fn get(&self) -> P {
        match self {
            Source::Cell(cell) => cell.get(),
            Source::Kept(tensor, _) => tensor.clone(),
            Source::Gone => unreachable!("a recipe with a consumed input is never built"),
        }
    }

    pub(crate) fn usable(&self) -> bool {
        match self {
            Source::Cell(cell) => cell.status() != Status::Gone,
            Source::Kept(..) => true,
            Source::Gone => false,
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Source::Cell(cell) => cell.core().bytes,
            Source::Kept(_, storage) => storage.bytes,
            Source::Gone => 0,
        }
    }

    pub(crate) fn view_of(&self) -> Option<ViewOf> {
        match self {
            Source::Cell(cell) => Some(ViewOf::Cell(cell.clone() as Arc<dyn CellDyn>)),
            Source::Kept(_, storage) => Some(ViewOf::Kept(storage.clone())),
            Source::Gone => None,
        }
    }

    pub(crate) fn push_cell(&self, inputs: &mut Vec<Arc<dyn CellDyn>>) {
        if let Source::Cell(cell) = self {
            inputs.push(cell.clone() as Arc<dyn CellDyn>);
        }
    }
}
