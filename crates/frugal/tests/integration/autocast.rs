//! Autocast differential tests on Flex (the CPU backend with bf16 and f16): every autocast
//! result equals the same computation written with explicit casts on the inner backend, bit
//! for bit; gradients through `Autodiff<Frugal<Flex>>` equal those of explicit casts under
//! `Autodiff<Flex>`; parameters and gradients stay f32; switching autocast off restores plain
//! f32 results; unsupported types and unknown ops are refused with a clear message.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::{DType, Distribution, Tensor, TensorData};
use frugal::precision::{self, AutocastPolicy, LowPrecision, OpPrecision, PrecisionError};
use frugal::{Frugal, set_autocast};

type F = Frugal<Flex>;

/// Turns autocast off again however the test ends.
struct Off;
impl Drop for Off {
    fn drop(&mut self) {
        set_autocast::<Flex>(&Default::default(), None).unwrap();
    }
}

fn on(low: LowPrecision) -> Off {
    set_autocast::<Flex>(&Default::default(), Some(AutocastPolicy::new(low))).unwrap();
    Off
}

/// bf16 autocast with low outputs (as PyTorch's autocast leaves them), off again when dropped.
fn on_low_outputs() -> Off {
    let policy = AutocastPolicy::new(LowPrecision::BF16).with_low_outputs(true);
    set_autocast::<Flex>(&Default::default(), Some(policy)).unwrap();
    Off
}

fn data<const D: usize>(shape: [usize; D], seed: u64) -> TensorData {
    // A fixed pseudo-random pattern with values that bf16 and f16 round differently.
    let n = shape.iter().product::<usize>();
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let values: Vec<f32> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        })
        .collect();
    TensorData::new(values, shape)
}

fn bits(t: TensorData) -> Vec<u32> {
    t.convert::<f32>()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn matmul_runs_in_the_low_type_and_returns_f32() {
    let _turn = crate::serial();
    let device = Default::default();
    for low in [LowPrecision::BF16, LowPrecision::F16] {
        let (a, b) = (data([33, 70], 1), data([70, 17], 2));
        let expected = Tensor::<Flex, 2>::from_data(a.clone(), &device)
            .cast(low.dtype())
            .matmul(Tensor::<Flex, 2>::from_data(b.clone(), &device).cast(low.dtype()))
            .cast(DType::F32);
        let plain = Tensor::<Flex, 2>::from_data(a.clone(), &device)
            .matmul(Tensor::<Flex, 2>::from_data(b.clone(), &device));

        let _off = on(low);
        let got =
            Tensor::<F, 2>::from_data(a, &device).matmul(Tensor::<F, 2>::from_data(b, &device));
        assert_eq!(got.dtype(), DType::F32);
        let got = bits(got.into_data());
        assert_eq!(got, bits(expected.into_data()), "{low:?}");
        assert_ne!(
            got,
            bits(plain.into_data()),
            "{low:?}: the low type must change the result"
        );
    }
}

#[test]
fn linear_runs_in_the_low_type_bias_included() {
    use burn::tensor::module::linear;
    let _turn = crate::serial();
    let device = Default::default();
    let (x, w, b) = (data([2, 24, 40], 21), data([40, 12], 22), data([1, 12], 23));
    let t3 = |d: &TensorData| Tensor::<Flex, 3>::from_data(d.clone(), &device);
    let t2 = |d: &TensorData| Tensor::<Flex, 2>::from_data(d.clone(), &device);
    let bias = |d: &TensorData| Tensor::<Flex, 2>::from_data(d.clone(), &device).reshape([12]);
    let expected = linear(
        t3(&x).cast(DType::BF16),
        t2(&w).cast(DType::BF16),
        Some(bias(&b).cast(DType::BF16)),
    )
    .cast(DType::F32);
    let plain = linear(t3(&x), t2(&w), Some(bias(&b)));

    let _off = on(LowPrecision::BF16);
    let got = linear(
        Tensor::<F, 3>::from_data(x, &device),
        Tensor::<F, 2>::from_data(w, &device),
        Some(Tensor::<F, 2>::from_data(b, &device).reshape([12])),
    );
    assert_eq!(got.dtype(), DType::F32);
    let got = bits(got.into_data());
    assert_eq!(got, bits(expected.into_data()));
    assert_ne!(got, bits(plain.into_data()));
}

#[test]
fn f32_ops_upcast_low_inputs_and_mixed_inputs_promote() {
    let _turn = crate::serial();
    let device = Default::default();
    let x = data([8, 9], 3);
    let y = data([8, 9], 4);
    let low = |d: &TensorData| Tensor::<Flex, 2>::from_data(d.clone(), &device).cast(DType::BF16);
    let expected_exp = low(&x).cast(DType::F32).exp();
    let expected_sum = low(&x).cast(DType::F32).sum_dim(1);
    let expected_add = low(&x).cast(DType::F32) + Tensor::<Flex, 2>::from_data(y.clone(), &device);

    let _off = on(LowPrecision::BF16);
    let lowf = |d: &TensorData| Tensor::<F, 2>::from_data(d.clone(), &device).cast(DType::BF16);
    let exp = lowf(&x).exp();
    assert_eq!(exp.dtype(), DType::F32, "exp is on the f32 list");
    assert_eq!(bits(exp.into_data()), bits(expected_exp.into_data()));
    let sum = lowf(&x).sum_dim(1);
    assert_eq!(sum.dtype(), DType::F32, "sums are on the f32 list");
    assert_eq!(bits(sum.into_data()), bits(expected_sum.into_data()));
    let add = lowf(&x) + Tensor::<F, 2>::from_data(y, &device);
    assert_eq!(add.dtype(), DType::F32, "bf16 + f32 promotes to f32");
    assert_eq!(bits(add.into_data()), bits(expected_add.into_data()));
    // A promote op on inputs of one type leaves them alone.
    assert_eq!(lowf(&x).abs().dtype(), DType::BF16);
}

#[test]
fn off_and_overridden_ops_are_plain_f32() {
    let _turn = crate::serial();
    let device = Default::default();
    let (a, b) = (data([16, 24], 5), data([24, 8], 6));
    let plain = bits(
        Tensor::<Flex, 2>::from_data(a.clone(), &device)
            .matmul(Tensor::<Flex, 2>::from_data(b.clone(), &device))
            .into_data(),
    );
    let run = || {
        bits(
            Tensor::<F, 2>::from_data(a.clone(), &device)
                .matmul(Tensor::<F, 2>::from_data(b.clone(), &device))
                .into_data(),
        )
    };
    assert_eq!(run(), plain, "autocast is off by default");
    let policy = AutocastPolicy::new(LowPrecision::BF16)
        .with("float_matmul", OpPrecision::Keep)
        .unwrap();
    assert_eq!(policy.get("float_matmul"), Some(OpPrecision::Keep));
    set_autocast::<Flex>(&device, Some(policy.clone())).unwrap();
    let _off = Off;
    assert_eq!(precision::autocast(&device), Some(policy));
    assert_eq!(run(), plain, "float_matmul overridden to Keep");
    set_autocast::<Flex>(&device, None).unwrap();
    assert_eq!(precision::autocast(&device), None);
    assert_eq!(run(), plain, "switched off");
}

#[test]
fn gradients_equal_explicit_casts_and_stay_f32() {
    let _turn = crate::serial();
    let device = Default::default();
    let (x, w) = (data([12, 20], 7), data([20, 6], 8));

    // Reference: explicit casts under Autodiff<Flex>.
    type A = Autodiff<Flex>;
    let xr = Tensor::<A, 2>::from_data(x.clone(), &device).require_grad();
    let wr = Tensor::<A, 2>::from_data(w.clone(), &device).require_grad();
    let yr = xr
        .clone()
        .cast(DType::BF16)
        .matmul(wr.clone().cast(DType::BF16))
        .cast(DType::F32);
    let lr = (yr.clone() * yr).tanh().sum();
    let gr = lr.backward();
    let (gxr, gwr) = (xr.grad(&gr).unwrap(), wr.grad(&gr).unwrap());

    type G = Autodiff<F>;
    let _off = on(LowPrecision::BF16);
    let xg = Tensor::<G, 2>::from_data(x, &device).require_grad();
    let wg = Tensor::<G, 2>::from_data(w, &device).require_grad();
    let yg = xg.clone().matmul(wg.clone());
    assert_eq!(yg.dtype(), DType::F32);
    let lg = (yg.clone() * yg).tanh().sum();
    let gg = lg.backward();
    let (gxg, gwg) = (xg.grad(&gg).unwrap(), wg.grad(&gg).unwrap());
    assert_eq!(gxg.dtype(), DType::F32, "gradients stay f32");
    assert_eq!(gwg.dtype(), DType::F32, "gradients stay f32");
    assert_eq!(bits(lg.into_data()), bits(lr.into_data()));
    assert_eq!(bits(gxg.into_data()), bits(gxr.into_data()));
    assert_eq!(bits(gwg.into_data()), bits(gwr.into_data()));
}

#[test]
fn low_outputs_stay_low_and_parameter_gradients_come_back_f32() {
    use burn::tensor::module::linear;
    let _turn = crate::serial();
    let device = Default::default();
    let (x, w) = (data([10, 16], 31), data([16, 8], 32));

    // Reference: PyTorch's autocast written out with explicit casts under Autodiff<Flex>.
    type A = Autodiff<Flex>;
    let xr = Tensor::<A, 2>::from_data(x.clone(), &device).require_grad();
    let wr = Tensor::<A, 2>::from_data(w.clone(), &device).require_grad();
    let yr = linear(
        xr.clone().cast(DType::BF16),
        wr.clone().cast(DType::BF16),
        None,
    );
    let lr = yr.cast(DType::F32).tanh().sum();
    let gr = lr.backward();
    let (gxr, gwr) = (xr.grad(&gr).unwrap(), wr.grad(&gr).unwrap());

    type G = Autodiff<F>;
    let _off = on_low_outputs();
    assert!(precision::autocast(&device).unwrap().low_outputs());
    let xg = Tensor::<G, 2>::from_data(x, &device).require_grad();
    let wg = Tensor::<G, 2>::from_data(w, &device).require_grad();
    let yg = linear(xg.clone(), wg.clone(), None);
    assert_eq!(
        yg.dtype(),
        DType::BF16,
        "PyTorch's autocast: the product stays bf16"
    );
    let lg = yg.cast(DType::F32).tanh().sum();
    let gg = lg.backward();
    let (gxg, gwg) = (xg.grad(&gg).unwrap(), wg.grad(&gg).unwrap());
    assert_eq!(gwg.dtype(), DType::F32, "a weight gradient comes back f32");
    assert_eq!(bits(lg.into_data()), bits(lr.into_data()));
    assert_eq!(bits(gwg.into_data()), bits(gwr.into_data()));
    assert_eq!(bits(gxg.into_data()), bits(gxr.into_data()));
}

#[test]
fn low_outputs_sum_a_bias_gradient_in_the_low_type_as_pytorch_does() {
    use burn::tensor::module::linear;
    let _turn = crate::serial();
    let device = Default::default();
    let (x, w, b) = (data([3, 10, 16], 33), data([16, 8], 34), data([8], 35));

    // Reference: PyTorch's autocast written out under Autodiff<Flex>: the bias enters the
    // product in bf16, so its gradient is the bf16 output gradient summed in bf16.
    type A = Autodiff<Flex>;
    let xr = Tensor::<A, 3>::from_data(x.clone(), &device).require_grad();
    let wr = Tensor::<A, 2>::from_data(w.clone(), &device).require_grad();
    let br = Tensor::<A, 1>::from_data(b.clone(), &device).require_grad();
    let yr = linear(
        xr.clone().cast(DType::BF16),
        wr.clone().cast(DType::BF16),
        Some(br.clone().cast(DType::BF16)),
    );
    let lr = yr.cast(DType::F32).tanh().sum();
    let gr = lr.backward();
    let gbr = br.grad(&gr).unwrap();

    type G = Autodiff<F>;
    let _off = on_low_outputs();
    let xg = Tensor::<G, 3>::from_data(x, &device).require_grad();
    let wg = Tensor::<G, 2>::from_data(w, &device).require_grad();
    let bg = Tensor::<G, 1>::from_data(b, &device).require_grad();
    let lg = linear(xg, wg, Some(bg.clone()))
        .cast(DType::F32)
        .tanh()
        .sum();
    let gg = lg.backward();
    let gbg = bg.grad(&gg).unwrap();
    assert_eq!(
        gbg.dtype(),
        DType::BF16,
        "summed as it came, not widened first (match_param_dtypes widens it for the optimizer)"
    );
    assert_eq!(bits(lg.into_data()), bits(lr.into_data()));
    assert_eq!(
        bits(gbg.cast(DType::F32).into_data()),
        bits(gbr.into_data())
    );
}

#[test]
fn match_param_dtypes_casts_gradients_to_their_parameters_type() {
    use burn::module::{Module, Param};
    use burn::optim::GradientsParams;
    #[derive(Module, Debug)]
    struct Two<B: burn::tensor::backend::Backend> {
        a: Param<Tensor<B, 2>>,
        b: Param<Tensor<B, 2>>,
    }
    let _turn = crate::serial();
    let device = Default::default();
    type A = Autodiff<Flex>;
    let model = Two::<A> {
        a: Param::from_tensor(Tensor::from_data(data([4, 4], 41), &device)),
        b: Param::from_tensor(Tensor::from_data(data([4, 4], 42), &device)),
    };
    // One gradient arrives in bf16, as a product left in bf16 would give it.
    let loss = (model.a.val().cast(DType::BF16) * 2.0)
        .cast(DType::F32)
        .sum()
        + model.b.val().sum();
    let mut grads = GradientsParams::from_grads(loss.backward(), &model);
    let mut grads_bf16 = GradientsParams::new();
    let a: Tensor<Flex, 2> = grads.remove(model.a.id).unwrap();
    grads_bf16.register(model.a.id, a.cast(DType::BF16));
    grads_bf16.register(model.b.id, grads.remove::<Flex, 2>(model.b.id).unwrap());
    precision::match_param_dtypes(&model, &mut grads_bf16);
    for id in [model.a.id, model.b.id] {
        let g: Tensor<Flex, 2> = grads_bf16.remove(id).unwrap();
        assert_eq!(g.dtype(), DType::F32);
        assert!(
            g.into_data()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .all(|v| *v == 2.0 || *v == 1.0)
        );
    }
}

#[test]
fn casts_are_charged_and_counted() {
    let _turn = crate::serial();
    let device = Default::default();
    let count = || {
        frugal::ops::call_counts()
            .into_iter()
            .find(|(_, name, _)| *name == "float_cast")
            .unwrap()
            .2
    };
    let a = Tensor::<F, 2>::random([64, 64], Distribution::Default, &device);
    let b = Tensor::<F, 2>::random([64, 64], Distribution::Default, &device);
    let before = count();
    let _off = on(LowPrecision::F16);
    let y = a.matmul(b);
    assert_eq!(y.dtype(), DType::F32);
    // Two input casts and one output cast go through Frugal's own float_cast.
    assert_eq!(count() - before, 3);
}

fn float_casts() -> u64 {
    frugal::ops::call_counts()
        .into_iter()
        .find(|(_, name, _)| *name == "float_cast")
        .unwrap()
        .2
}

/// A linear layer's step under autocast with casts kept or not: the loss, the gradients'
/// bits, and the casts it ran.
fn linear_step(keep: bool, x: &TensorData, w: &TensorData) -> (Vec<u32>, Vec<u32>, Vec<u32>, u64) {
    use burn::tensor::module::linear;
    type G = Autodiff<F>;
    let device = Default::default();
    let policy = AutocastPolicy::new(LowPrecision::BF16).with_kept_casts(keep);
    set_autocast::<Flex>(&device, Some(policy)).unwrap();
    let _off = Off;
    let before = float_casts();
    let xg = Tensor::<G, 2>::from_data(x.clone(), &device).require_grad();
    let wg = Tensor::<G, 2>::from_data(w.clone(), &device).require_grad();
    // The weight read twice forward (the second time as a view of the same buffer), then by
    // both products' backward.
    let y = linear(xg.clone(), wg.clone(), None) + xg.clone().matmul(wg.clone().transpose());
    let loss = y.tanh().sum();
    let grads = loss.backward();
    let (gx, gw) = (xg.grad(&grads).unwrap(), wg.grad(&grads).unwrap());
    let casts = float_casts() - before;
    (
        bits(loss.into_data()),
        bits(gx.into_data()),
        bits(gw.into_data()),
        casts,
    )
}

#[test]
fn kept_casts_serve_backward_and_change_no_bit() {
    let _turn = crate::serial();
    let device: burn::backend::flex::FlexDevice = Default::default();
    // A square weight: its transpose is a view of the same buffer with the same shape, which
    // must not be served the untransposed cast.
    let (x, w) = (data([9, 12], 51), data([12, 12], 52));
    let reused_before = precision::kept_casts_reused(&device);
    let (loss, gx, gw, casts) = linear_step(true, &x, &w);
    let reused = precision::kept_casts_reused(&device) - reused_before;
    let (loss_plain, gx_plain, gw_plain, casts_plain) = linear_step(false, &x, &w);
    assert_eq!(loss, loss_plain);
    assert_eq!(gx, gx_plain);
    assert_eq!(gw, gw_plain);
    assert!(reused > 0, "no kept cast was used");
    assert_eq!(casts + reused, casts_plain, "each reuse saves one cast");

    // The reference: the same step with every cast written out under Autodiff<Flex>.
    type A = Autodiff<Flex>;
    let xr = Tensor::<A, 2>::from_data(x, &device).require_grad();
    let wr = Tensor::<A, 2>::from_data(w, &device).require_grad();
    // Each product casts its own inputs, so each branch's gradient comes back f32 before
    // autodiff adds them, as under autocast.
    let low = |t: &Tensor<A, 2>| t.clone().cast(DType::BF16);
    let y = burn::tensor::module::linear(low(&xr), low(&wr), None).cast(DType::F32)
        + low(&xr).matmul(low(&wr).transpose()).cast(DType::F32);
    let loss_ref = y.tanh().sum();
    let grads = loss_ref.backward();
    assert_eq!(loss, bits(loss_ref.into_data()));
    assert_eq!(gx, bits(xr.grad(&grads).unwrap().into_data()));
    assert_eq!(gw, bits(wr.grad(&grads).unwrap().into_data()));
}

#[test]
fn unsupported_types_and_unknown_ops_are_refused_clearly() {
    let err = set_autocast::<NdArray>(
        &Default::default(),
        Some(AutocastPolicy::new(LowPrecision::BF16)),
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(matches!(
        err,
        PrecisionError::UnsupportedDtype {
            dtype: DType::BF16,
            ..
        }
    ));
    assert!(
        message.contains("BF16") && message.contains("ndarray"),
        "{message}"
    );
    assert!(message.contains("neither bf16 nor f16"), "{message}");
    assert_eq!(
        precision::autocast(&burn::backend::ndarray::NdArrayDevice::Cpu),
        None
    );

    let err = AutocastPolicy::new(LowPrecision::BF16)
        .with("float_matmull", OpPrecision::Low)
        .unwrap_err();
    assert!(err.to_string().contains("`float_matmull`"), "{err}");
    // The table lists the defaults.
    let table = AutocastPolicy::new(LowPrecision::F16).table();
    assert!(table.contains(&("FloatTensorOps", "float_matmul", OpPrecision::Low)));
    assert!(table.contains(&("FloatTensorOps", "float_exp", OpPrecision::F32)));
    assert!(table.contains(&("ModuleOps", "conv2d", OpPrecision::Low)));
    assert!(table.contains(&("ModuleOps", "linear", OpPrecision::Low)));
}
