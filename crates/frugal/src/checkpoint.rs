//! Checkpoint scopes, like `torch.utils.checkpoint`: tensors created inside a scope that are
//! still held when it ends (typically by autodiff, for the backward pass) are evicted then, and
//! recomputed from the scope's inputs when they are read. The mechanism is in `crate::scope`;
//! this is its public face.

use burn_backend::DeviceOps;
use burn_tensor::{BasicOps, Tensor, TensorKind};

use crate::device::DeviceState;
use crate::scope::{OpenScope, collect_reads, note_read};
use crate::tensor::FrugalTensor;

/// What a checkpointed closure returns: its Frugal tensors are kept resident when the scope
/// ends, since the code after the scope reads them next.
pub trait ScopeOutput {
    /// Reports each tensor in `self` to the closing scope.
    fn visit(&self);
}

impl<P: Clone + 'static> ScopeOutput for FrugalTensor<P> {
    fn visit(&self) {
        if let Some(address) = self.cell_address() {
            note_read(address);
        }
    }
}

/// Any backend's tensor: asking for its device goes through Frugal's `*_device` op, which
/// reports the cell under it, however many decorators (such as `Autodiff`) sit on top.
impl<B: burn_backend::Backend, const D: usize, K: TensorKind<B> + BasicOps<B>> ScopeOutput
    for Tensor<B, D, K>
{
    fn visit(&self) {
        let _ = self.device();
    }
}

impl ScopeOutput for () {
    fn visit(&self) {}
}

impl<T: ScopeOutput> ScopeOutput for Vec<T> {
    fn visit(&self) {
        self.iter().for_each(|t| t.visit());
    }
}

impl<T: ScopeOutput> ScopeOutput for Option<T> {
    fn visit(&self) {
        if let Some(t) = self {
            t.visit();
        }
    }
}

impl<T1: ScopeOutput, T2: ScopeOutput> ScopeOutput for (T1, T2) {
    fn visit(&self) {
        self.0.visit();
        self.1.visit();
    }
}

impl<T1: ScopeOutput, T2: ScopeOutput, T3: ScopeOutput> ScopeOutput for (T1, T2, T3) {
    fn visit(&self) {
        self.0.visit();
        self.1.visit();
        self.2.visit();
    }
}

/// Runs `f` as a checkpointed block on `device`: of the tensors it creates, only its outputs
/// (and what the program had before) stay on the device when it returns; the others still
/// held, e.g. saved by autodiff for the backward pass, are evicted and recomputed when read.
/// Tensors that cannot be recomputed identically (random draws such as dropout masks) stay.
///
/// ```
/// use burn::backend::{Autodiff, NdArray};
/// use burn::tensor::Tensor;
/// use frugal::Frugal;
///
/// type B = Autodiff<Frugal<NdArray>>;
/// let device = Default::default();
/// let x = Tensor::<B, 2>::ones([64, 64], &device).require_grad();
/// let y = frugal::checkpoint(&device, || x.clone().exp().sin().exp());
/// // exp's output and sin's, saved for the backward pass, are evicted now.
/// assert!(frugal::memory::remat_stats(&device).evictions >= 2);
/// let grads = y.sum().backward();
/// assert!(x.grad(&grads).is_some());
/// assert!(frugal::memory::remat_stats(&device).recomputes >= 2);
/// ```
pub fn checkpoint<D: DeviceOps + 'static, R: ScopeOutput>(device: &D, f: impl FnOnce() -> R) -> R {
    let state = DeviceState::of_device(device);
    let scope = state.open_scope();
    // Close the scope even if `f` panics, so the device does not stay managed by mistake.
    struct Close {
        state: &'static DeviceState,
        scope: OpenScope,
        keep: Vec<usize>,
    }
    impl Drop for Close {
        fn drop(&mut self) {
            self.state.close_scope(self.scope, &self.keep);
        }
    }
    let mut close = Close {
        state,
        scope,
        keep: Vec::new(),
    };
    let out = f();
    close.keep = collect_reads(|| out.visit());
    drop(close);
    out
}
