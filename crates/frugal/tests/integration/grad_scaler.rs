//! `GradScaler`: clean steps give the optimizer the same bits as unscaled training, an
//! overflow skips the step and backs the scale off, clean steps grow it, bad settings are
//! refused with the value named, and the state survives a JSON round trip.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use frugal::{Frugal, GradScaler, GradScalerConfig};

#[derive(Module, Debug)]
struct Mlp<B: burn::tensor::backend::Backend> {
    first: Linear<B>,
    second: Linear<B>,
    relu: Relu,
}

impl<B: burn::tensor::backend::Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            first: LinearConfig::new(16, 32).init(device),
            second: LinearConfig::new(32, 4).init(device),
            relu: Relu::new(),
        }
    }

    fn loss(&self, x: Tensor<B, 2>, y: Tensor<B, 2>) -> Tensor<B, 1> {
        let out = self
            .second
            .forward(self.relu.forward(self.first.forward(x)));
        (out - y).powi_scalar(2).mean()
    }
}

/// Every parameter's bits, in visiting order.
fn param_bits<B: burn::tensor::backend::Backend, M: Module<B>>(module: &M) -> Vec<u32> {
    struct Bits(Vec<u32>);
    impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Bits {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data();
            self.0
                .extend(data.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()));
        }
    }
    let mut bits = Bits(Vec::new());
    module.visit(&mut bits);
    bits.0
}

fn batch<B: burn::tensor::backend::Backend>(
    step: u64,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    B::seed(device, 1000 + step);
    (
        Tensor::random([8, 16], Distribution::Normal(0.0, 1.0), device),
        Tensor::random([8, 4], Distribution::Normal(0.0, 1.0), device),
    )
}

/// Trains 6 Adam steps with and without the scaler and returns both parameter bit lists
/// after every step.
fn scaled_and_plain<B: AutodiffBackend>() -> Vec<(Vec<u32>, Vec<u32>)> {
    let _serial = crate::serial();
    let device = B::Device::default();
    // Parameters are initialised lazily, at their first read: seed, build and read each.
    B::seed(&device, 7);
    let mut plain = Mlp::<B>::new(&device);
    let initial = param_bits(&plain);
    B::seed(&device, 7);
    let mut scaled = Mlp::<B>::new(&device);
    assert_eq!(param_bits(&scaled), initial, "the two models start apart");
    let mut plain_optim = AdamConfig::new().init::<B, Mlp<B>>();
    let mut scaled_optim = AdamConfig::new().init::<B, Mlp<B>>();
    let mut scaler = GradScaler::new(GradScalerConfig::default()).unwrap();
    let mut out = Vec::new();
    for step in 0..6 {
        let (x, y) = batch::<B>(step, &device);
        let grads = plain.loss(x.clone(), y.clone()).backward();
        let grads = GradientsParams::from_grads(grads, &plain);
        plain = plain_optim.step(1e-2, plain, grads);

        let grads = scaler.scale_loss(scaled.loss(x, y)).backward();
        let grads = GradientsParams::from_grads(grads, &scaled);
        let (next, outcome) = scaler.step(1e-2, scaled, &mut scaled_optim, grads);
        scaled = next;
        assert!(!outcome.skipped, "step {step} was skipped");
        assert_eq!(outcome.scale, 65536.0);
        out.push((param_bits(&plain), param_bits(&scaled)));
    }
    out
}

#[test]
fn clean_steps_match_unscaled_training_bit_for_bit() {
    for (step, (plain, scaled)) in scaled_and_plain::<Autodiff<NdArray>>()
        .into_iter()
        .enumerate()
    {
        assert_eq!(plain, scaled, "parameters differ after step {step}");
    }
}

#[test]
fn clean_steps_match_through_frugal_too() {
    for (step, (plain, scaled)) in scaled_and_plain::<Autodiff<Frugal<NdArray>>>()
        .into_iter()
        .enumerate()
    {
        assert_eq!(plain, scaled, "parameters differ after step {step}");
    }
}

#[test]
fn an_overflow_skips_the_step_and_backs_the_scale_off() {
    type B = Autodiff<NdArray>;
    let _serial = crate::serial();
    let device = Default::default();
    B::seed(&device, 3);
    let mut model = Mlp::<B>::new(&device);
    let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
    // Inputs of about 1e6 make the loss about 1e12 and the weight gradients larger still: at a
    // scale of 2^126 (8.5e37) they overflow, and the scale must come down about 2^40 to fit.
    let huge = 2f32.powi(126);
    let big_batch = |device: &burn::backend::ndarray::NdArrayDevice| {
        let (x, y) = batch::<B>(0, device);
        (x.mul_scalar(1e6), y)
    };
    let mut scaler = GradScaler::new(GradScalerConfig {
        init_scale: huge,
        ..Default::default()
    })
    .unwrap();
    let before = param_bits(&model);
    let (x, y) = big_batch(&device);
    let grads = scaler.scale_loss(model.loss(x, y)).backward();
    let grads = GradientsParams::from_grads(grads, &model);
    let (next, outcome) = scaler.step(1e-2, model, &mut optim, grads);
    model = next;
    assert!(outcome.skipped, "an overflowing step must be skipped");
    assert_eq!(outcome.scale, huge);
    assert_eq!(outcome.next_scale, huge * 0.5);
    assert_eq!(scaler.scale(), huge * 0.5);
    assert_eq!(
        param_bits(&model),
        before,
        "a skipped step changed the parameters"
    );

    // Backing off until the gradients fit, then a step that is taken.
    let mut skipped = 1;
    loop {
        let (x, y) = big_batch(&device);
        let grads = scaler.scale_loss(model.loss(x, y)).backward();
        let grads = GradientsParams::from_grads(grads, &model);
        let (next, outcome) = scaler.step(1e-2, model, &mut optim, grads);
        model = next;
        if !outcome.skipped {
            break;
        }
        skipped += 1;
        assert!(skipped < 200, "the scale never came down far enough");
    }
    assert!(
        skipped >= 20,
        "only {skipped} skipped steps at a scale of 2^126"
    );
    assert_eq!(scaler.scale(), huge * 0.5f32.powi(skipped));
    assert_ne!(param_bits(&model), before, "the clean step changed nothing");
}

#[test]
fn a_nan_in_one_gradient_is_found_and_the_others_are_unscaled() {
    type B = Autodiff<NdArray>;
    let _serial = crate::serial();
    let device = Default::default();
    B::seed(&device, 5);
    let model = Mlp::<B>::new(&device);
    let scaler = GradScaler::new(GradScalerConfig {
        init_scale: 4.0,
        ..Default::default()
    })
    .unwrap();
    let (x, y) = batch::<B>(0, &device);
    let grads = scaler.scale_loss(model.loss(x, y)).backward();
    let mut grads = GradientsParams::from_grads(grads, &model);
    // Plant a NaN in the second layer's bias gradient.
    let id = model.second.bias.as_ref().unwrap().id;
    let bias = grads.remove::<NdArray, 1>(id).unwrap();
    let first_weight = grads
        .get::<NdArray, 2>(model.first.weight.id)
        .unwrap()
        .into_data();
    grads.register(id, bias.mul_scalar(f32::NAN));
    assert!(
        scaler.unscale(&model, &mut grads),
        "the planted NaN was missed"
    );
    let unscaled = grads
        .get::<NdArray, 2>(model.first.weight.id)
        .unwrap()
        .into_data();
    let expected: Vec<f32> = first_weight
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|g| g * 0.25)
        .collect();
    assert_eq!(unscaled.as_slice::<f32>().unwrap(), expected.as_slice());
}

#[test]
fn clean_steps_grow_the_scale_after_the_interval() {
    let mut scaler = GradScaler::new(GradScalerConfig {
        init_scale: 8.0,
        growth_interval: 3,
        ..Default::default()
    })
    .unwrap();
    let mut scales = Vec::new();
    for found in [false, false, false, false, true, false, false, false] {
        scaler.update(found);
        scales.push(scaler.scale());
    }
    assert_eq!(scales, [8.0, 8.0, 16.0, 16.0, 8.0, 8.0, 8.0, 16.0]);
    // The scale never grows into infinity.
    let mut near_max = GradScaler::new(GradScalerConfig {
        init_scale: f32::MAX,
        growth_interval: 1,
        ..Default::default()
    })
    .unwrap();
    near_max.update(false);
    assert_eq!(near_max.scale(), f32::MAX);
}

#[test]
fn bad_settings_are_refused_with_the_value_and_the_range() {
    let cases = [
        (
            GradScalerConfig {
                init_scale: 0.0,
                ..Default::default()
            },
            "init_scale 0",
        ),
        (
            GradScalerConfig {
                init_scale: f32::INFINITY,
                ..Default::default()
            },
            "init_scale inf",
        ),
        (
            GradScalerConfig {
                growth_factor: 0.5,
                ..Default::default()
            },
            "growth_factor 0.5",
        ),
        (
            GradScalerConfig {
                backoff_factor: 1.0,
                ..Default::default()
            },
            "backoff_factor 1",
        ),
        (
            GradScalerConfig {
                growth_interval: 0,
                ..Default::default()
            },
            "growth_interval 0",
        ),
    ];
    for (config, named) in cases {
        let message = GradScaler::new(config).unwrap_err().to_string();
        assert!(message.contains(named), "{message:?} should name {named:?}");
        assert!(message.contains("accepted"), "{message:?} gives no range");
    }
}

#[test]
fn the_state_round_trips_through_json() {
    let mut scaler = GradScaler::new(GradScalerConfig {
        growth_interval: 5,
        ..Default::default()
    })
    .unwrap();
    scaler.update(true);
    scaler.update(false);
    scaler.update(false);
    let json = serde_json::to_string(&scaler.state()).unwrap();
    let restored = GradScaler::from_state(serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(restored, scaler);
    assert_eq!(restored.scale(), 32768.0);
}
