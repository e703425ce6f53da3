//! Layer 5, managed cells: the mechanism that lets Frugal drop a tensor's device buffer and
//! bring it back later, by re-running the op that made it (rematerialisation), by copying it
//! from host memory (offload), by casting it back from a 16-bit copy (compression), or by
//! making a float of its booleans again (a dropout mask, packed).
//!
//! Owns: the cell state machine ([`cell`]), recipes, the tensor kinds ([`kind`]). Imports:
//! `device`, `engine`, `kernels`, `ledger` (roles), `runtime`, `vocabulary`, `units`. Cells
//! implement the engine's [`Evictable`]; the engine decides which cell goes, the cell how.
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

mod cell;
mod kind;

use std::sync::Arc;

use burn_backend::{DType, Shape, TensorData};

use crate::device::Storage;
use crate::engine::{Evictable, Status};
use crate::ledger::Role;

pub(crate) use cell::{Cell, CellCore};
pub(crate) use kind::{BoolKind, FloatKind, IntKind, Kind, QuantKind};

/// What the op that made a new tensor knows of it beside the tensor itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    /// What its elements are known to be.
    pub(crate) values: Values,
    /// Its op replays from its inputs alone (a forwarded, deterministic op), whether or not
    /// it kept a recipe: made from an input the program had dropped, it keeps none, yet a
    /// selection can recompute it with that input (see `StepRecord::select`).
    pub(crate) replays: bool,
}

impl Origin {
    /// A tensor Frugal knows nothing of: any values, no replay.
    pub(crate) const OPAQUE: Origin = Origin {
        values: Values::Any,
        replays: false,
    };
}

/// What a new tensor's elements are known to be, from the op that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Values {
    /// Anything.
    Any,
    /// Only 0 and 1 (a Bernoulli draw, as dropout's mask): it can be packed exactly (see
    /// [`Kind::pack`]).
    Binary,
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

/// The kind-independent face of a cell, used by recipes and restore chains; what the
/// eviction engine needs of it is its supertrait [`Evictable`].
pub(crate) trait CellDyn: Evictable {
    fn core(&self) -> &CellCore;
    /// The status, or `None` if the cell is in use (locked) right now.
    fn try_status(&self) -> Option<Status>;
    /// The storage record of a resident cell.
    fn resident_storage(&self) -> Option<Arc<Storage>>;
    /// Tags the tensor as `role`, now and after restores.
    fn set_role(&self, role: Role);
    /// The recipe inputs a restore of this cell reads, resident or not; none unless the cell
    /// is evicted. A restore chain pins them all: making room for this cell must not evict an
    /// input it is about to read.
    fn restore_inputs(&self) -> Vec<Arc<dyn CellDyn>>;
    /// Brings this one cell back, assuming its inputs can be read without recomputation.
    fn restore_one(&self);
    /// Stores the host copy read by the batch.
    fn finish_offload(&self, data: TensorData);
    /// The batch's read failed: back to resident (or compressed), charged again.
    fn abort_offload(&self);
    fn depth(&self) -> u32;
    fn shape_ref(&self) -> &Shape;
    fn add_dependent(&self);
    fn remove_dependent(&self);
    /// Keeps the cell resident (restored first if needed) until a matching [`CellDyn::unpin`]:
    /// for a tensor another thread reads through a raw reference (a gradient handed to a
    /// collective).
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    fn pin(&self);
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
            Source::Cell(cell) => cell.core().info.bytes,
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
