//! What the budget's recomputation costs, and the limit a retrying loop puts on it: the cost
//! counters ([`RematStats::forward_cost`], [`RematStats::recomputed_cost`]) of a deep network
//! under a tight budget, a backward pass past [`memory::set_recompute_limit`] failing at once
//! as out of memory (and the device going on after it), and no limit by default.

use burn::backend::Autodiff;
use burn::backend::ndarray::{NdArray, NdArrayDevice};
use burn::tensor::activation::gelu;
use burn::tensor::{Distribution, Tensor};
use frugal::memory::{self, Phase};
use frugal::{Frugal, Policy, RematStats, catch_quietly};

type B = Autodiff<Frugal<NdArray>>;
const DEVICE: NdArrayDevice = NdArrayDevice::Cpu;
const WIDTH: usize = 64;
const LAYERS: usize = 24;

/// One forward and backward pass of a chain of `LAYERS` products and GELUs over `rows` rows,
/// with the phases marked as a training loop marks them; returns the pass's counters.
fn pass(weights: &[Tensor<B, 2>], rows: usize) -> RematStats {
    let before = memory::remat_stats(&DEVICE);
    memory::set_phase(&DEVICE, Phase::Forward);
    let mut x = Tensor::<B, 2>::random([rows, WIDTH], Distribution::Default, &DEVICE);
    for w in weights {
        x = gelu(x.matmul(w.clone()));
    }
    let loss = x.sum();
    memory::set_phase(&DEVICE, Phase::Backward);
    let grads = loss.backward();
    drop(grads);
    memory::set_phase(&DEVICE, Phase::Outside);
    memory::remat_stats(&DEVICE).since(&before)
}

#[test]
fn a_pass_past_the_recompute_limit_fails_as_out_of_memory_and_the_device_goes_on() {
    let _serial = crate::serial();
    memory::set_policy(&DEVICE, Policy::default());
    let weights: Vec<Tensor<B, 2>> = (0..LAYERS)
        .map(|_| {
            Tensor::<B, 2>::random([WIDTH, WIDTH], Distribution::Default, &DEVICE).require_grad()
        })
        .collect();
    let rows = 256;
    let base = memory::live_bytes(&DEVICE);
    // Each layer keeps two [rows, WIDTH] f32 tensors for the backward pass: a budget of
    // three layers' worth recomputes most of them.
    let layer = (2 * rows * WIDTH * 4) as u64;
    memory::set_budget(&DEVICE, Some(base + 3 * layer));

    let free = pass(&weights, rows);
    assert!(free.forward_cost > 0, "{free:?}");
    assert!(free.made_cost > free.forward_cost, "{free:?}");
    assert!(free.recomputed_cost > 0, "{free:?}");
    let ratio = free.recompute_ratio();
    assert!(ratio > 0.0);

    // Past a limit below that ratio the backward pass fails, naming the budget.
    memory::set_recompute_limit(&DEVICE, Some(ratio / 4.0));
    let failed = catch_quietly(|| pass(&weights, rows), || ()).unwrap_err();
    let message = failed.message();
    assert!(message.contains("memory budget"), "{message}");
    assert!(
        message.contains("x the forward pass's work in one pass"),
        "{message}"
    );
    memory::set_phase(&DEVICE, Phase::Outside);

    // Above it, and without one, the pass runs, and the budget still holds.
    memory::set_recompute_limit(&DEVICE, Some(ratio * 4.0 + 1.0));
    let under = pass(&weights, rows);
    assert!(under.recomputed_cost > 0);
    memory::set_recompute_limit(&DEVICE, None);
    memory::reset_peak(&DEVICE);
    pass(&weights, rows);
    assert!(memory::peak_bytes(&DEVICE) <= base + 3 * layer + layer);
    memory::set_budget(&DEVICE, None);
}
