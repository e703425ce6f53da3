//! The registries through which functions generic over any backend (`crate::nn`) find
//! `Frugal<B>`'s own implementations of composite ops (attention, layer norm, a linear layer
//! with its cross-entropy): keyed by the `TypeId` of `Frugal<B>` and of
//! `Autodiff<Frugal<B>, C>`, filled the first time `Frugal<B>` is asked for a device state from
//! a device argument (every tensor is created from one, so before any call).

use std::any::{Any, TypeId};
use std::sync::RwLock;

use burn_autodiff::{
    Autodiff,
    checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing},
};
use burn_backend::{Backend, DeviceOps};

use crate::backend::Frugal;
use crate::device::DeviceState;

/// An implementation: takes the arguments of its backend, returns the output boxed.
pub(crate) type Entry<A> = fn(A) -> Box<dyn Any>;

/// One composite op's implementations, by backend type.
pub(crate) struct Registry<A> {
    entries: RwLock<Vec<(TypeId, Entry<A>)>>,
}

impl<A> Registry<A> {
    /// An empty registry.
    pub(crate) const fn new() -> Self {
        Self {
            entries: RwLock::new(Vec::new()),
        }
    }

    /// The implementation registered for the backend with this `TypeId`, if any.
    pub(crate) fn lookup(&self, backend: TypeId) -> Option<Entry<A>> {
        self.entries
            .read()
            .unwrap()
            .iter()
            .find(|(id, _)| *id == backend)
            .map(|(_, entry)| *entry)
    }

    /// Registers the entries of `Frugal<B>` (`inference`) and of `Autodiff<Frugal<B>, C>` for
    /// both of the checkpoint strategies Burn ships, once.
    #[inline]
    pub(crate) fn announce<B: Backend>(
        &self,
        inference: Entry<A>,
        no_checkpointing: Entry<A>,
        balanced: Entry<A>,
    ) {
        let id = TypeId::of::<Frugal<B>>();
        let known = |entries: &[(TypeId, Entry<A>)]| entries.iter().any(|(k, _)| *k == id);
        if known(&self.entries.read().unwrap()) {
            return;
        }
        let mut entries = self.entries.write().unwrap();
        if known(&entries) {
            return;
        }
        entries.extend([
            (id, inference),
            (
                TypeId::of::<Autodiff<Frugal<B>, NoCheckpointing>>(),
                no_checkpointing,
            ),
            (
                TypeId::of::<Autodiff<Frugal<B>, BalancedCheckpointing>>(),
                balanced,
            ),
        ]);
    }
}

/// Declares a composite op's registry in its module: `lookup`, by which `crate::nn` finds the
/// implementation for a backend, and `announce::<B>()`, which registers the module's
/// `inference::<B>` (for `Frugal<B>`) and `autodiff::<B, C>` (for `Autodiff<Frugal<B>, C>`,
/// both of Burn's checkpoint strategies) once.
macro_rules! composite_op_registry {
    ($args:ty) => {
        static REGISTRY: $crate::ops::registry::Registry<$args> =
            $crate::ops::registry::Registry::new();

        /// The implementation registered for the backend with this `TypeId`, if any.
        pub(crate) fn lookup(
            backend: std::any::TypeId,
        ) -> Option<$crate::ops::registry::Entry<$args>> {
            REGISTRY.lookup(backend)
        }

        /// Registers `Frugal<B>` and `Autodiff<Frugal<B>, C>` (both strategies) once.
        #[inline]
        pub(crate) fn announce<B: burn_backend::Backend>() {
            REGISTRY.announce::<B>(
                inference::<B>,
                autodiff::<B, burn_autodiff::checkpoint::strategy::NoCheckpointing>,
                autodiff::<B, burn_autodiff::checkpoint::strategy::BalancedCheckpointing>,
            );
        }
    };
}
pub(crate) use composite_op_registry;

/// The state of `device`, registering `Frugal<B>`'s composite ops first if they are not yet.
#[inline]
pub(crate) fn device_state<B: Backend, D: DeviceOps + 'static>(device: &D) -> &'static DeviceState {
    super::attention::announce::<B>();
    super::layer_norm::announce::<B>();
    super::linear_cross_entropy::announce::<B>();
    DeviceState::of_device(device)
}

/// A float tensor's primitive, boxed for a registry entry.
pub(crate) fn boxed<B: Backend, const D: usize>(t: burn_tensor::Tensor<B, D>) -> Box<dyn Any> {
    Box::new(t.into_primitive().tensor())
}

/// A registry entry's float output, back as a tensor of the caller's backend.
pub(crate) fn unboxed<B: Backend, const D: usize>(out: Box<dyn Any>) -> burn_tensor::Tensor<B, D> {
    burn_tensor::Tensor::from_primitive(burn_tensor::TensorPrimitive::Float(unbox(out)))
}

/// Unboxes an argument registered for `T`'s backend.
pub(crate) fn unbox<T: 'static>(value: Box<dyn Any>) -> T {
    *value
        .downcast::<T>()
        .unwrap_or_else(|_| panic!("frugal: internal error: an op registered for another type"))
}
