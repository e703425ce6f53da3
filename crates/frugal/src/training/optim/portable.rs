//! The step on plain Burn ops, for any backend: burn-optim's `AdamW` arithmetic, operation
//! for operation, on f32 moments ([`step_full`]) or on 8-bit ones dequantised and requantised
//! around it ([`step_quantized`], the same arithmetic as the fused kernel).

use burn_core::tensor::backend::Backend;
use burn_core::tensor::{DType, Element, ElementConversion, Int, IntDType, Tensor, TensorData, s};

use super::qmap::{MAP_LEN, Tables};
use super::{Decay, QuantizedMoments, Scalars};

/// burn-optim's `AdamW` step (without AMSGrad) on moments in the parameter's dtype; `None`
/// for the first step, which starts from the gradient alone as `AdamW` does.
pub(super) fn step_full<B: Backend, const D: usize>(
    s: &Scalars,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
) -> (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>) {
    let (moment_1, moment_2) = match moments {
        Some((m, v)) => (
            m.mul_scalar(s.beta_1)
                .add(grad.clone().mul_scalar(s.one_minus_beta_1)),
            v.mul_scalar(s.beta_2)
                .add(grad.square().mul_scalar(s.one_minus_beta_2)),
        ),
        None => (
            grad.clone().mul_scalar(s.one_minus_beta_1),
            grad.square().mul_scalar(s.one_minus_beta_2),
        ),
    };
    let tensor = update(s, tensor, moment_1.clone(), moment_2.clone());
    (tensor, moment_1, moment_2)
}

/// The parameter update from this step's f32 moments, as burn-optim's `AdamW` computes it:
/// bias correction, `m̂ / (√v̂ + ε)`, decoupled weight decay, then `- lr · delta`.
fn update<B: Backend, const D: usize>(
    s: &Scalars,
    tensor: Tensor<B, D>,
    moment_1: Tensor<B, D>,
    moment_2: Tensor<B, D>,
) -> Tensor<B, D> {
    let m_hat = moment_1.clone().div_scalar(s.bias_correction_1);
    let v_hat = moment_2.div_scalar(s.bias_correction_2);
    let delta = m_hat.div(v_hat.sqrt().add_scalar(s.epsilon));
    let decayed = match s.decay {
        Decay::None => tensor,
        Decay::Plain { factor } => tensor.mul_scalar(factor),
        Decay::Cautious { rate } => {
            let tensor_pos = tensor.clone().greater_equal_elem(0.0);
            let moment_pos = moment_1.greater_equal_elem(0.0);
            let differ = tensor_pos.not_equal(moment_pos);
            tensor.clone() - tensor.mul_scalar(rate).mask_fill(differ, 0.0)
        }
    };
    decayed - delta.mul_scalar(s.lr)
}

/// One step on 8-bit moments: dequantise, [`step_full`]'s arithmetic, requantise against the
/// new per-block absmax. The last block is padded with zero gradients, as in the kernel.
pub(super) fn step_quantized<B: Backend, const D: usize>(
    s: &Scalars,
    tables: &Tables,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    q: QuantizedMoments<B>,
) -> (Tensor<B, D>, QuantizedMoments<B>) {
    let device = tensor.device();
    let shape = tensor.shape();
    let (len, block_size) = (q.len, q.block_size);
    let (blocks, words) = (q.blocks(), q.words());
    let padded = blocks * block_size;
    let table = |values: &[f32; MAP_LEN]| {
        Tensor::<B, 1>::from_data(
            TensorData::new(values.to_vec(), [MAP_LEN]),
            (&device, DType::F32),
        )
    };

    let codes_m = unpack(q.codes.clone().slice(s![0..words]));
    let codes_v = unpack(q.codes.slice(s![words..2 * words]));
    let absmax_m = q.absmax.clone().slice(s![0..blocks]).reshape([blocks, 1]);
    let absmax_v = q.absmax.slice(s![blocks..2 * blocks]).reshape([blocks, 1]);
    let m0 = table(&tables.signed)
        .select(0, codes_m)
        .reshape([blocks, block_size])
        .mul(absmax_m);
    let v0 = table(&tables.unsigned)
        .select(0, codes_v)
        .reshape([blocks, block_size])
        .mul(absmax_v);

    let mut g = grad.reshape([len]);
    if padded > len {
        g = Tensor::cat(vec![g, Tensor::zeros([padded - len], &device)], 0);
    }
    let g = g.reshape([blocks, block_size]);
    let m = m0
        .mul_scalar(s.beta_1)
        .add(g.clone().mul_scalar(s.one_minus_beta_1));
    let v = v0
        .mul_scalar(s.beta_2)
        .add(g.square().mul_scalar(s.one_minus_beta_2));
    let new_absmax_m = m.clone().abs().max_dim(1);
    let new_absmax_v = v.clone().max_dim(1);

    let unpadded = |x: Tensor<B, 2>| x.reshape([padded]).slice(s![0..len]);
    let tensor = update(
        s,
        tensor.reshape([len]),
        unpadded(m.clone()),
        unpadded(v.clone()),
    )
    .reshape(shape);

    // An all-zero block keeps its zeros: divide by 1 instead of 0.
    let nonzero = |a: Tensor<B, 2>| a.clone().mask_fill(a.equal_elem(0.0), 1.0);
    let x_m = m.div(nonzero(new_absmax_m.clone())).reshape([padded]);
    let x_v = v.div(nonzero(new_absmax_v.clone())).reshape([padded]);
    let codes_m = pack(quantise(x_m, table(&tables.signed_bounds)));
    let codes_v = pack(quantise(x_v, table(&tables.unsigned_bounds)));
    let q = QuantizedMoments {
        codes: Tensor::cat(vec![codes_m, codes_v], 0),
        absmax: Tensor::cat(
            vec![
                new_absmax_m.reshape([blocks]),
                new_absmax_v.reshape([blocks]),
            ],
            0,
        ),
        block_size,
        len,
    };
    (tensor, q)
}

/// The backend's default int dtype, for indices.
fn index_dtype<B: Backend>() -> IntDType {
    IntDType::from(<B::IntElem as Element>::dtype())
}

/// Code words (`U32`, four little-endian codes each) to one code per element.
fn unpack<B: Backend>(words: Tensor<B, 1, Int>) -> Tensor<B, 1, Int> {
    let n = words.dims()[0];
    let lanes = (0..4)
        .map(|lane| {
            words
                .clone()
                .bitwise_right_shift_scalar((8 * lane).elem())
                .bitwise_and_scalar(255.elem())
        })
        .collect();
    Tensor::stack::<2>(lanes, 1)
        .reshape([4 * n])
        .cast(index_dtype::<B>())
}

/// One code per element (0..=255) to code words, as [`unpack`] reads them.
fn pack<B: Backend>(codes: Tensor<B, 1, Int>) -> Tensor<B, 1, Int> {
    let n = codes.dims()[0] / 4;
    let codes = codes.cast(IntDType::U32).reshape([n, 4]);
    let mut words = codes.clone().slice(s![.., 0..1]);
    for lane in 1..4 {
        let byte = codes
            .clone()
            .slice(s![.., lane..lane + 1])
            .bitwise_left_shift_scalar((8 * lane as i64).elem());
        words = words.bitwise_or(byte);
    }
    words.reshape([n])
}

/// The largest `k` with `bounds[k] <= x` for each element (see [`super::qmap::quantise`]):
/// the same 8-step binary search as the kernel, one gather and one comparison per step.
fn quantise<B: Backend>(x: Tensor<B, 1>, bounds: Tensor<B, 1>) -> Tensor<B, 1, Int> {
    let mut code = Tensor::<B, 1, Int>::zeros(x.shape(), &x.device());
    for bit in 0..8 {
        let candidate = code.clone().add_scalar(128 >> bit);
        let bound = bounds.clone().select(0, candidate.clone());
        code = code.mask_where(bound.lower_equal(x.clone()), candidate);
    }
    code
}
