//! What a failed step leaves behind in burn-autodiff, given back before the next attempt.
//!
//! A step that fails in its forward pass (a device out-of-memory, an op over the budget)
//! unwinds and drops its tensors, but burn-autodiff 0.21 keeps the nodes it recorded, and with
//! them every tensor a node saved for the backward pass, for as long as the graph reaches a
//! tensor still alive: the model's parameters. It frees such nodes only in a later backward
//! pass through that graph, so the next attempt (a retry at half the micro-batch, auto-fit's
//! next probe) runs its forward pass beside the failed one's activations, and may fail for
//! that alone. [`release_abandoned_graph`] runs that backward pass at once, on one element of
//! each parameter in turn, until the ledger is back to what the caller expects.

use burn_core::module::{AutodiffModule, ModuleVisitor, Param};
use burn_core::tensor::Tensor;
use burn_core::tensor::backend::AutodiffBackend;

use crate::memory;

/// Frees what a failed step's forward pass left recorded in burn-autodiff's graph (see the
/// module's documentation): for each parameter of `model` that takes gradients, while the
/// device's live bytes are over `live_target`, a backward pass from one element of it, which
/// brings the graphs that reach it into that pass and frees their nodes no tensor needs any
/// more. Each pass holds one parameter's gradient for a moment. Returns the live bytes freed.
///
/// `live_target` is what should be live once the failed step is gone: the ledger's live bytes
/// before the step began. A caller that does not know it can pass 0: every parameter is then
/// visited. Tensors still referenced (a clone of a failed step's output kept by the caller) are
/// not freed; nor is anything outside burn-autodiff's graph.
pub fn release_abandoned_graph<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    device: &B::Device,
    live_target: u64,
) -> u64 {
    let before = memory::live_bytes(device);
    if before <= live_target {
        return 0;
    }
    let mut visitor = BackwardFromEach::<B> {
        device: device.clone(),
        live_target,
    };
    model.visit(&mut visitor);
    before.saturating_sub(memory::live_bytes(device))
}

struct BackwardFromEach<B: AutodiffBackend> {
    device: B::Device,
    live_target: u64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for BackwardFromEach<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if memory::live_bytes(&self.device) <= self.live_target {
            return;
        }
        let value = param.val();
        if !value.is_require_grad() || value.shape().num_elements() == 0 {
            return;
        }
        // One element: the backward pass is a few ops whatever the parameter's size, and its
        // one gradient is dropped with the pass.
        let first = value.slice(std::array::from_fn::<_, D, _>(|_| 0..1));
        drop(first.sum().backward());
    }
}
