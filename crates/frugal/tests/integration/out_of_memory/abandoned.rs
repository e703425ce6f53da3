//! A step that fails in its forward pass leaves its graph in burn-autodiff, holding what its
//! nodes saved, until a backward pass through the parameters; `release_abandoned_graph` runs
//! one at once.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use frugal::{Frugal, memory, release_abandoned_graph};

type B = Autodiff<Frugal<NdArray>>;

#[derive(Module, Debug)]
struct TwoLayers<B: Backend> {
    first: Param<Tensor<B, 2>>,
    second: Param<Tensor<B, 2>>,
}

impl<B: Backend> TwoLayers<B> {
    fn new(device: &B::Device) -> Self {
        let weight = || Param::from_tensor(Tensor::random([64, 64], Distribution::Default, device));
        Self {
            first: weight(),
            second: weight(),
        }
    }

    /// Ten rounds of both products, each saving its inputs for the backward pass.
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let mut x = x;
        for _ in 0..10 {
            x = x.matmul(self.first.val()).tanh();
            x = x.matmul(self.second.val()).tanh();
        }
        x
    }
}

#[test]
fn a_failed_forward_pass_is_given_back_down_to_what_was_live_before_it() {
    let _one = crate::serial();
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    let model = TwoLayers::<B>::new(&device);
    let input = Tensor::<B, 2>::random([256, 64], Distribution::Default, &device);
    let before = memory::live_bytes(&device);

    // A forward pass that fails half-way: its tensors are dropped while it unwinds.
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let out = model.forward(input.clone());
        assert!(out.dims()[0] == 0, "the step fails here");
    }));
    assert!(failed.is_err());
    let held = memory::live_bytes(&device) - before;
    assert!(
        held >= 20 * 256 * 64 * 4,
        "burn-autodiff keeps the saved activations of all 20 products: {held} B"
    );

    let freed = release_abandoned_graph(&model, &device, before);
    assert_eq!(freed, held, "everything the failed pass held is freed");
    assert_eq!(memory::live_bytes(&device), before);

    // Nothing left to free: the call returns at once.
    assert_eq!(release_abandoned_graph(&model, &device, before), 0);

    // The model still trains, and its gradients are those of a model that never failed.
    let grads = model.forward(input.clone()).sum().backward();
    let fresh = TwoLayers::<B> {
        first: Param::from_tensor(model.first.val().detach().require_grad()),
        second: Param::from_tensor(model.second.val().detach().require_grad()),
    };
    let fresh_grads = fresh.forward(input).sum().backward();
    let grad = model.first.val().grad(&grads).unwrap();
    let fresh_grad = fresh.first.val().grad(&fresh_grads).unwrap();
    grad.to_data().assert_eq(&fresh_grad.to_data(), true);
}

#[test]
fn a_graph_whose_output_a_caller_still_holds_is_kept() {
    let _one = crate::serial();
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    let model = TwoLayers::<B>::new(&device);
    let input = Tensor::<B, 2>::random([256, 64], Distribution::Default, &device);
    let before = memory::live_bytes(&device);
    let kept = model.forward(input);
    let holding = memory::live_bytes(&device);
    release_abandoned_graph(&model, &device, before);
    assert_eq!(
        memory::live_bytes(&device),
        holding,
        "a live graph is not touched"
    );
    // And it still gives its gradients.
    let grads = kept.sum().backward();
    assert!(model.second.val().grad(&grads).is_some());
}
