//! Gradient accumulation against the whole batch: the same parameter gradients (up to f32
//! summation order), one micro-batch the same bits as no accumulation, and miscounts refused.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::{Distribution, Tensor, backend::Backend};
use frugal::{AccumulationError, Frugal, GradientAccumulation, micro_batch_size};

type B = Autodiff<Frugal<NdArray>>;

fn loss(model: &Linear<B>, x: Tensor<B, 2>, y: Tensor<B, 2>) -> Tensor<B, 1> {
    (model.forward(x) - y).powi_scalar(2).mean()
}

fn weight_grad(model: &Linear<B>, grads: &GradientsParams) -> Vec<f32> {
    let weight: &Param<Tensor<B, 2>> = &model.weight;
    grads
        .get::<Frugal<NdArray>, 2>(weight.id)
        .unwrap()
        .into_data()
        .to_vec()
        .unwrap()
}

#[test]
fn micro_batches_give_the_whole_batch_gradient() {
    let _one = crate::serial();
    let device = Default::default();
    <B as Backend>::seed(&device, 7);
    let model: Linear<B> = LinearConfig::new(16, 4).init(&device);
    let x = Tensor::<B, 2>::random([12, 16], Distribution::Normal(0.0, 1.0), &device);
    let y = Tensor::<B, 2>::random([12, 4], Distribution::Normal(0.0, 1.0), &device);

    let whole = GradientsParams::from_grads(loss(&model, x.clone(), y.clone()).backward(), &model);
    let expected = weight_grad(&model, &whole);

    for n in [1, 2, 3, 4, 6, 12] {
        let mut accumulation = GradientAccumulation::new(n).unwrap();
        for (xs, ys) in x.clone().chunk(n, 0).into_iter().zip(y.clone().chunk(n, 0)) {
            accumulation.backward(&model, loss(&model, xs, ys)).unwrap();
        }
        let got = weight_grad(&model, &accumulation.finish().unwrap());
        for (a, b) in expected.iter().zip(&got) {
            if n == 1 {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "one micro-batch is no accumulation"
                );
            } else {
                assert!((a - b).abs() <= 1e-5 * a.abs().max(1e-3), "{n}: {a} vs {b}");
            }
        }
    }
    // The model is the same: its parameter count did not change by accumulating.
    assert_eq!(model.num_params(), 16 * 4 + 4);
}

#[test]
fn miscounts_and_uneven_splits_are_refused() {
    let _one = crate::serial();
    let device = Default::default();
    let model: Linear<B> = LinearConfig::new(2, 1).init(&device);
    let x = Tensor::<B, 2>::ones([2, 2], &device);
    assert_eq!(
        GradientAccumulation::<Linear<B>>::new(0).err(),
        Some(AccumulationError::NoMicroBatches)
    );
    let mut accumulation = GradientAccumulation::new(2).unwrap();
    accumulation
        .backward(&model, model.forward(x.clone()).mean())
        .unwrap();
    let early = GradientAccumulation::<Linear<B>>::new(2).unwrap().finish();
    assert!(early.is_err());
    accumulation
        .backward(&model, model.forward(x.clone()).mean())
        .unwrap();
    let extra = accumulation.backward(&model, model.forward(x).mean());
    let message = extra.unwrap_err().to_string();
    assert!(
        message.contains("over 2 micro-batches was given 3"),
        "{message}"
    );
    assert_eq!(micro_batch_size(12, 4), Ok(3));
    let uneven = micro_batch_size(10, 4).unwrap_err().to_string();
    assert!(uneven.contains("10") && uneven.contains("4"), "{uneven}");
}
