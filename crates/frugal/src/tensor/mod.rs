//! Layer 6, the tensor: the primitive of [`Frugal`](crate::Frugal), the inner backend's
//! primitive plus a shared record of the storage it occupies, or a handle to a managed cell.
//!
//! Owns: [`FrugalTensor`] and the conversions the forwarding macro uses to unwrap arguments.
//! Imports: `device`, `engine` (statuses), `remat`, `scope`, `ledger` (roles), `vocabulary`.

use std::sync::Arc;

use burn_backend::{Backend, DType, QTensorPrimitive, Shape, TensorMetadata};

use crate::device::{DeviceState, Storage};
use crate::engine::Status;
use crate::ledger::Role;
use crate::remat::{Cell, Handle, Kind, Origin, Recipe, Source};
use crate::vocabulary::OpId;

/// A tensor of [`Frugal<B>`](crate::Frugal): the inner backend's primitive and the ledger record
/// of the storage behind it, or, while the device is under a budget or in a checkpoint scope, a
/// handle to a managed cell that Frugal may evict and restore.
#[derive(Clone)]
pub struct FrugalTensor<P: 'static> {
    pub(crate) repr: Repr<P>,
}

#[derive(Clone)]
pub(crate) enum Repr<P: 'static> {
    /// Held directly, as when no budget is set: no lock, no indirection. `view`: made by a
    /// view op, so possibly another layout of the buffer than the op that made it wrote.
    Plain {
        inner: P,
        storage: Arc<Storage>,
        view: bool,
    },
    /// Held through a cell (see [`crate::remat`]).
    Managed(Arc<Handle<P>>),
}

impl<P: TensorMetadata + 'static> FrugalTensor<P> {
    /// Wraps a freshly produced inner tensor, charging its bytes to `op` on `state`; managed
    /// (without a recipe) when the device is under a budget or in a scope.
    #[inline]
    pub(crate) fn track<B: Backend, K: Kind<B, Prim = P>>(
        inner: P,
        state: &'static DeviceState,
        op: OpId,
    ) -> Self {
        let storage = Arc::new(state.charge(&inner, op));
        if state.managing() {
            Self::managed::<B, K>(inner, storage, None, 0.0, Origin::OPAQUE)
        } else {
            Self::plain(inner, storage)
        }
    }

    #[inline]
    pub(crate) fn plain(inner: P, storage: Arc<Storage>) -> Self {
        Self {
            repr: Repr::Plain {
                inner,
                storage,
                view: false,
            },
        }
    }

    /// A plain tensor made by a view op over `storage`, or by a move that kept `view`'s
    /// layout.
    #[inline]
    pub(crate) fn plain_view(inner: P, storage: Arc<Storage>, view: bool) -> Self {
        Self {
            repr: Repr::Plain {
                inner,
                storage,
                view,
            },
        }
    }

    /// A managed tensor over a new cell.
    pub(crate) fn managed<B: Backend, K: Kind<B, Prim = P>>(
        inner: P,
        storage: Arc<Storage>,
        recipe: Option<Recipe<P>>,
        cost: f64,
        origin: Origin,
    ) -> Self {
        let cell = Cell::<B, K>::create(inner, storage, recipe, cost, origin);
        Self {
            repr: Repr::Managed(Arc::new(Handle { cell })),
        }
    }

    /// A managed tensor over a new cell without a recipe, that `made_by` made over a buffer
    /// it shares (see [`Cell::create_made_by`]).
    pub(crate) fn managed_alias<B: Backend, K: Kind<B, Prim = P>>(
        inner: P,
        storage: Arc<Storage>,
        made_by: crate::vocabulary::OpId,
    ) -> Self {
        let cell = Cell::<B, K>::create_made_by(inner, storage, None, 0.0, made_by, Origin::OPAQUE);
        Self {
            repr: Repr::Managed(Arc::new(Handle { cell })),
        }
    }
}

impl<P: Clone + 'static> FrugalTensor<P> {
    /// The inner backend's tensor (restored first if Frugal had evicted it), with the ledger
    /// record dropped.
    pub fn into_inner(self) -> P {
        self.split().0
    }

    /// A clone of the inner backend's tensor, restored first if Frugal had evicted it.
    pub fn primitive(&self) -> P {
        match &self.repr {
            Repr::Plain { inner, .. } => inner.clone(),
            Repr::Managed(handle) => handle.cell.get(),
        }
    }

    /// The inner tensor for an op that reads it by reference: borrowed when held directly,
    /// a restored clone when managed.
    #[inline]
    pub(crate) fn prim_ref(&self) -> PrimRef<'_, P> {
        match &self.repr {
            Repr::Plain { inner, .. } => PrimRef::Borrowed(inner),
            Repr::Managed(handle) => {
                crate::scope::note_read(Arc::as_ptr(&handle.cell) as *const () as usize);
                PrimRef::Owned(handle.cell.get())
            }
        }
    }

    /// The record of the whole buffer when the tensor is held directly and is that buffer as
    /// the op that made it wrote it (not a view): what a kept cast belongs to.
    #[inline]
    pub(crate) fn whole_plain_storage(&self) -> Option<&Arc<Storage>> {
        match &self.repr {
            Repr::Plain {
                storage,
                view: false,
                ..
            } => Some(storage),
            _ => None,
        }
    }

    /// Whether the tensor is a view held directly (see [`Self::plain_view`]).
    #[inline]
    pub(crate) fn is_plain_view(&self) -> bool {
        matches!(self.repr, Repr::Plain { view: true, .. })
    }

    /// Whether the tensor is held directly (no budget or scope manages it, so it has no
    /// recipe).
    #[cfg_attr(not(feature = "cube"), allow(dead_code))]
    pub(crate) fn is_plain(&self) -> bool {
        matches!(self.repr, Repr::Plain { .. })
    }

    /// The device of a managed tensor, read from its cell (`None` for a plain tensor).
    pub(crate) fn managed_device<D: Clone + 'static>(&self) -> Option<D> {
        match &self.repr {
            Repr::Plain { .. } => None,
            Repr::Managed(handle) => {
                crate::scope::note_read(Arc::as_ptr(&handle.cell) as *const () as usize);
                handle.cell.device_any().downcast_ref::<D>().cloned()
            }
        }
    }

    /// Bytes of the storage this tensor points into (shared with its views).
    pub fn storage_bytes(&self) -> u64 {
        match &self.repr {
            Repr::Plain { storage, .. } => storage.bytes,
            Repr::Managed(handle) => handle.cell.core().info.bytes,
        }
    }

    /// Whether the tensor's data is on the device now (false while Frugal has it evicted or
    /// offloaded).
    pub fn is_resident(&self) -> bool {
        match &self.repr {
            Repr::Plain { .. } => true,
            Repr::Managed(handle) => handle.cell.status() == Status::Resident,
        }
    }

    /// Tags the storage the tensor points into as `role` (see [`crate::memory::tag_parameters`]).
    pub(crate) fn set_role(&self, role: Role) {
        match &self.repr {
            Repr::Plain { storage, .. } => storage.set_role(role),
            Repr::Managed(handle) => handle.cell.set_role(role),
        }
    }

    /// What the storage the tensor points into is for.
    pub fn role(&self) -> Role {
        match &self.repr {
            Repr::Plain { storage, .. } => storage.role(),
            Repr::Managed(handle) => handle.cell.core().role(),
        }
    }

    /// The state of the device the tensor is on.
    #[inline]
    pub(crate) fn state(&self) -> &'static DeviceState {
        match &self.repr {
            Repr::Plain { storage, .. } => storage.state,
            Repr::Managed(handle) => handle.cell.core().state,
        }
    }

    /// The op that made the buffer the tensor points into.
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn made_by(&self) -> OpId {
        match &self.repr {
            Repr::Plain { storage, .. } => storage.op,
            Repr::Managed(handle) => handle.cell.core().info.op,
        }
    }

    /// Keeps a managed tensor resident, restoring it first if needed, until [`Self::unpin`];
    /// false (and nothing to undo) for a plain tensor, which Frugal never evicts.
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn pin(&self) -> bool {
        match &self.repr {
            Repr::Plain { .. } => false,
            Repr::Managed(handle) => {
                handle.cell.pin();
                true
            }
        }
    }

    /// Ends a [`Self::pin`].
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn unpin(&self) {
        if let Repr::Managed(handle) = &self.repr {
            handle.cell.unpin();
        }
    }

    /// Address of the managed cell, if any, to recognise it among a ledger's cells.
    pub(crate) fn cell_address(&self) -> Option<usize> {
        match &self.repr {
            Repr::Plain { .. } => None,
            Repr::Managed(handle) => Some(Arc::as_ptr(&handle.cell) as *const () as usize),
        }
    }

    /// The inner tensor for an op that consumes this one, and the storage record to keep
    /// until the op's outputs are charged (so the peak counts inputs and outputs together).
    #[inline]
    pub(crate) fn split(self) -> (P, Option<Arc<Storage>>) {
        match self.repr {
            Repr::Plain { inner, storage, .. } => (inner, Some(storage)),
            Repr::Managed(handle) => match Arc::try_unwrap(handle) {
                Ok(handle) => handle.cell.consume(),
                Err(handle) => {
                    let (inner, storage) = handle.cell.get_with_storage();
                    (inner, Some(storage))
                }
            },
        }
    }

    /// As [`Self::split`], for a view op: the storage record is the output's.
    pub(crate) fn split_view(self) -> (P, Arc<Storage>) {
        match self.repr {
            Repr::Plain { inner, storage, .. } => (inner, storage),
            Repr::Managed(handle) => {
                let (inner, storage) = handle.cell.get_with_storage();
                (inner, storage)
            }
        }
    }

    /// As [`Self::split`], also returning the input as a recipe will read it.
    pub(crate) fn split_source(self) -> (P, Option<Arc<Storage>>, Source<P>) {
        match self.repr {
            Repr::Plain { inner, storage, .. } => {
                // The op may reuse a buffer nobody else holds; keeping a copy for a recipe
                // would force it to allocate, so such an output is not recomputable.
                let source = if Arc::strong_count(&storage) == 1 {
                    Source::Gone
                } else {
                    Source::Kept(inner.clone(), storage.clone())
                };
                (inner, Some(storage), source)
            }
            Repr::Managed(handle) => {
                let source = Source::Cell(handle.cell.clone());
                let (inner, storage) = match Arc::try_unwrap(handle) {
                    Ok(handle) => handle.cell.consume(),
                    Err(handle) => {
                        let (inner, storage) = handle.cell.get_with_storage();
                        (inner, Some(storage))
                    }
                };
                (inner, storage, source)
            }
        }
    }

    /// For a view op under management: the input, its storage (the output's too) and source.
    pub(crate) fn split_view_source(self) -> (P, Arc<Storage>, Source<P>) {
        match self.repr {
            Repr::Plain { inner, storage, .. } => {
                let source = Source::Kept(inner.clone(), storage.clone());
                (inner, storage, source)
            }
            Repr::Managed(handle) => {
                let source = Source::Cell(handle.cell.clone());
                let (inner, storage) = handle.cell.get_with_storage();
                (inner, storage, source)
            }
        }
    }

    /// The input as a recipe reads it, for an op that takes it by reference.
    pub(crate) fn source(&self) -> Source<P> {
        match &self.repr {
            Repr::Plain { inner, storage, .. } => Source::Kept(inner.clone(), storage.clone()),
            Repr::Managed(handle) => Source::Cell(handle.cell.clone()),
        }
    }
}

/// An inner tensor borrowed from a plain Frugal tensor or cloned out of a managed one.
pub(crate) enum PrimRef<'a, P> {
    Borrowed(&'a P),
    Owned(P),
}

impl<P> std::ops::Deref for PrimRef<'_, P> {
    type Target = P;

    #[inline]
    fn deref(&self) -> &P {
        match self {
            PrimRef::Borrowed(inner) => inner,
            PrimRef::Owned(inner) => inner,
        }
    }
}

impl<P: std::fmt::Debug + TensorMetadata + Clone> std::fmt::Debug for FrugalTensor<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrugalTensor")
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .field("storage_bytes", &self.storage_bytes())
            .field("resident", &self.is_resident())
            .finish()
    }
}

impl<P: TensorMetadata + 'static> TensorMetadata for FrugalTensor<P> {
    fn dtype(&self) -> DType {
        match &self.repr {
            Repr::Plain { inner, .. } => inner.dtype(),
            Repr::Managed(handle) => handle.cell.dtype(),
        }
    }

    fn shape(&self) -> Shape {
        match &self.repr {
            Repr::Plain { inner, .. } => inner.shape(),
            Repr::Managed(handle) => handle.cell.shape(),
        }
    }
}

impl<P: QTensorPrimitive + TensorMetadata + 'static> QTensorPrimitive for FrugalTensor<P> {
    fn scheme(&self) -> &burn_backend::quantization::QuantScheme {
        match &self.repr {
            Repr::Plain { inner, .. } => inner.scheme(),
            Repr::Managed(handle) => match handle.cell.dtype_ref() {
                DType::QFloat(scheme) => scheme,
                other => panic!("frugal: a quantized tensor has dtype {other:?}"),
            },
        }
    }

    fn acc_precision(&self) -> burn_std::quantization::QuantAcc {
        self.primitive().acc_precision()
    }

    fn propagation(&self) -> burn_std::quantization::QuantPropagation {
        self.primitive().propagation()
    }

    fn default_scheme() -> burn_backend::quantization::QuantScheme {
        P::default_scheme()
    }
}

// Conversions used by the forwarding macro. Each `split_*` hands the inner value to the inner
// backend and keeps the storage records alive until the op's outputs are charged, so the
// ledger's peak includes inputs and outputs together, as the device's does.

pub(crate) type Keep = Option<Arc<Storage>>;

pub(crate) fn split_vec<P: Clone>(tensors: Vec<FrugalTensor<P>>) -> (Vec<P>, Vec<Keep>) {
    tensors.into_iter().map(FrugalTensor::split).unzip()
}

pub(crate) fn split_opt<P: Clone>(tensor: Option<FrugalTensor<P>>) -> (Option<P>, Keep) {
    match tensor {
        Some(t) => {
            let (inner, keep) = t.split();
            (Some(inner), keep)
        }
        None => (None, None),
    }
}

pub(crate) fn split_vec_source<P: Clone>(
    tensors: Vec<FrugalTensor<P>>,
) -> (Vec<P>, Vec<Keep>, Vec<Source<P>>) {
    let mut inner = Vec::with_capacity(tensors.len());
    let mut keep = Vec::with_capacity(tensors.len());
    let mut sources = Vec::with_capacity(tensors.len());
    for tensor in tensors {
        let (i, k, s) = tensor.split_source();
        inner.push(i);
        keep.push(k);
        sources.push(s);
    }
    (inner, keep, sources)
}

pub(crate) fn split_opt_source<P: Clone>(
    tensor: Option<FrugalTensor<P>>,
) -> (Option<P>, Keep, Option<Source<P>>) {
    match tensor {
        Some(t) => {
            let (inner, keep, source) = t.split_source();
            (Some(inner), keep, Some(source))
        }
        None => (None, None, None),
    }
}
