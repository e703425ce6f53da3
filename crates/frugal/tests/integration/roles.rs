//! The ledger's roles (`memory::set_phase`, `memory::tag_parameters`) on
//! `Autodiff<Frugal<NdArray>>`: the roles always add up to the live bytes, and a tagged
//! tensor that a budget evicts comes back with its role.

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use frugal::Frugal;
use frugal::memory::{self, Phase, Role};

type B = Autodiff<Frugal<NdArray>>;

fn assert_roles_add_up() {
    let device = NdArrayDevice::Cpu;
    let live = memory::live_by_role(&device);
    assert_eq!(live.total(), memory::live_bytes(&device), "{live:?}");
}

#[test]
fn buffers_take_the_phase_they_are_made_in_and_tags_move_them() {
    let _serial = crate::serial();
    let device = Default::default();
    let before = memory::live_by_role(&device);
    memory::set_phase(&device, Phase::Forward);
    let activation = Tensor::<B, 2>::ones([16, 16], &device);
    memory::set_phase(&device, Phase::Backward);
    let gradient = Tensor::<B, 2>::ones([8, 16], &device);
    memory::set_phase(&device, Phase::Outside);
    let live = memory::live_by_role(&device);
    assert_eq!(live.activations - before.activations, 16 * 16 * 4);
    assert_eq!(live.gradients - before.gradients, 8 * 16 * 4);
    assert_roles_add_up();

    let linear: Linear<B> = LinearConfig::new(16, 4).init(&device);
    // Burn creates a parameter's tensor on its first read, here the visit: made outside a
    // phase, then tagged.
    memory::tag_parameters(&linear);
    let live = memory::live_by_role(&device);
    assert_eq!(live.parameters - before.parameters, (16 * 4 + 4) * 4);
    assert_roles_add_up();
    drop((activation, gradient, linear));
    assert_eq!(memory::live_by_role(&device), before);
}

#[test]
fn a_parameter_evicted_by_the_budget_is_restored_as_a_parameter() {
    let _serial = crate::serial();
    let device = Default::default();
    let start = memory::live_bytes(&device);
    memory::set_budget(&device, Some(start + 48 * 1024));
    let linear: Linear<B> = LinearConfig::new(64, 64).with_bias(false).init(&device);
    memory::tag_parameters(&linear);
    let weight_bytes = 64 * 64 * 4;
    assert_eq!(memory::live_by_role(&device).parameters, weight_bytes);
    // Three more tensors of the weight's size do not fit beside it: the least recently used,
    // the weight, leaves the device.
    let others: Vec<Tensor<B, 2>> = (0..3)
        .map(|i| Tensor::<B, 2>::full([64, 64], i as f32, &device))
        .collect();
    let stats = memory::remat_stats(&device);
    assert!(
        stats.evictions + stats.offloads > 0,
        "nothing was evicted: {stats:?}"
    );
    assert_eq!(memory::live_by_role(&device).parameters, 0);
    assert_roles_add_up();
    drop(others);
    // Reading it brings it back, counted as a parameter again.
    let out = linear.forward(Tensor::<B, 2>::ones([1, 64], &device));
    assert_eq!(memory::live_by_role(&device).parameters, weight_bytes);
    assert_roles_add_up();
    // The backward pass consumes the graph, which would otherwise keep the input for Burn to
    // free at some later op.
    drop(out.sum().backward());
    drop(linear);
    memory::set_budget(&device, None);
    assert_eq!(memory::live_by_role(&device).get(Role::Parameter), 0);
}
