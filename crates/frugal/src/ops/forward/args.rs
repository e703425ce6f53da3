//! Arguments of a forwarded op, by signature kind: the Frugal-side type, how each is unwrapped
//! for the inner backend (and kept for a recipe), its bytes, and what it says of the output's
//! size before the op runs.

/// The Frugal-side type of a signature kind (see the module docs).
macro_rules! frugal_ty {
    (F) => { burn_backend::tensor::FloatTensor<Self> };
    (I) => { burn_backend::tensor::IntTensor<Self> };
    (Bo) => { burn_backend::tensor::BoolTensor<Self> };
    (Q) => { burn_backend::tensor::QuantizedTensor<Self> };
    (RF) => { &burn_backend::tensor::FloatTensor<Self> };
    (RI) => { &burn_backend::tensor::IntTensor<Self> };
    (RBo) => { &burn_backend::tensor::BoolTensor<Self> };
    (RQ) => { &burn_backend::tensor::QuantizedTensor<Self> };
    (VF) => { Vec<burn_backend::tensor::FloatTensor<Self>> };
    (VI) => { Vec<burn_backend::tensor::IntTensor<Self>> };
    (VBo) => { Vec<burn_backend::tensor::BoolTensor<Self>> };
    (VQ) => { Vec<burn_backend::tensor::QuantizedTensor<Self>> };
    (OF) => { Option<burn_backend::tensor::FloatTensor<Self>> };
    (OBo) => { Option<burn_backend::tensor::BoolTensor<Self>> };
    (D) => { &burn_backend::tensor::Device<Self> };
    (TP) => { burn_backend::TensorPrimitive<Self> };
    (QP) => { burn_backend::quantization::QuantizationParametersPrimitive<Self> };
    (($a:tt, $b:tt)) => { ($crate::ops::frugal_ty!($a), $crate::ops::frugal_ty!($b)) };
    ([$($t:tt)*]) => { $($t)* };
    ($module_struct:ident) => { burn_backend::ops::$module_struct<Self> };
}
pub(crate) use frugal_ty;

/// Splits an argument into what the inner backend takes and the storage records to keep alive
/// until the outputs are charged (the path taken when the device is not managed).
macro_rules! split_arg {
    (F, $a:ident) => {
        $a.split()
    };
    (I, $a:ident) => {
        $a.split()
    };
    (Bo, $a:ident) => {
        $a.split()
    };
    (Q, $a:ident) => {
        $a.split()
    };
    (RF, $a:ident) => {
        ($a.prim_ref(), ())
    };
    (RI, $a:ident) => {
        ($a.prim_ref(), ())
    };
    (RBo, $a:ident) => {
        ($a.prim_ref(), ())
    };
    (RQ, $a:ident) => {
        ($a.prim_ref(), ())
    };
    (VF, $a:ident) => {
        $crate::tensor::split_vec($a)
    };
    (VI, $a:ident) => {
        $crate::tensor::split_vec($a)
    };
    (VBo, $a:ident) => {
        $crate::tensor::split_vec($a)
    };
    (VQ, $a:ident) => {
        $crate::tensor::split_vec($a)
    };
    (OF, $a:ident) => {
        $crate::tensor::split_opt($a)
    };
    (OBo, $a:ident) => {
        $crate::tensor::split_opt($a)
    };
    (TP, $a:ident) => {
        $crate::ops::convert::split_primitive::<B>($a)
    };
    (QP, $a:ident) => {
        $crate::ops::convert::split_qparams::<B>($a)
    };
    ($other:tt, $a:ident) => {
        ($a, ())
    };
}
pub(crate) use split_arg;

/// How a split argument is handed to the inner backend.
macro_rules! pass {
    (RF, $a:ident) => {
        &*$a.0
    };
    (RI, $a:ident) => {
        &*$a.0
    };
    (RBo, $a:ident) => {
        &*$a.0
    };
    (RQ, $a:ident) => {
        &*$a.0
    };
    ($other:tt, $a:ident) => {
        $a.0
    };
}
pub(crate) use pass;

/// As [`split_arg!`] on a managed device, with a third part: what a recipe keeps to replay the
/// op (the input's cell, a kept copy, or a clone of a plain argument).
macro_rules! managed_arg {
    (F, $a:ident) => {
        $a.split_source()
    };
    (I, $a:ident) => {
        $a.split_source()
    };
    (Bo, $a:ident) => {
        $a.split_source()
    };
    (Q, $a:ident) => {
        $a.split_source()
    };
    (RF, $a:ident) => {
        ($a.prim_ref(), (), $a.source())
    };
    (RI, $a:ident) => {
        ($a.prim_ref(), (), $a.source())
    };
    (RBo, $a:ident) => {
        ($a.prim_ref(), (), $a.source())
    };
    (RQ, $a:ident) => {
        ($a.prim_ref(), (), $a.source())
    };
    (VF, $a:ident) => {
        $crate::tensor::split_vec_source($a)
    };
    (VI, $a:ident) => {
        $crate::tensor::split_vec_source($a)
    };
    (VBo, $a:ident) => {
        $crate::tensor::split_vec_source($a)
    };
    (VQ, $a:ident) => {
        $crate::tensor::split_vec_source($a)
    };
    (OF, $a:ident) => {
        $crate::tensor::split_opt_source($a)
    };
    (OBo, $a:ident) => {
        $crate::tensor::split_opt_source($a)
    };
    (TP, $a:ident) => {{
        let (inner, keep) = $crate::ops::convert::split_primitive::<B>($a);
        (inner, keep, $crate::ops::NoReplay)
    }};
    (QP, $a:ident) => {{
        let (inner, keep) = $crate::ops::convert::split_qparams::<B>($a);
        (inner, keep, $crate::ops::NoReplay)
    }};
    (D, $a:ident) => {
        ($a, (), $a.clone())
    };
    ([&[$t:ty]], $a:ident) => {
        ($a, (), $a.to_vec())
    };
    ([&$t:ty], $a:ident) => {
        ($a, (), $a.clone())
    };
    ([TensorData], $a:ident) => {
        ($a, (), $crate::ops::NoReplay)
    };
    ([$($t:tt)*], $a:ident) => {{
        let kept = $a.clone();
        ($a, (), kept)
    }};
}
pub(crate) use managed_arg;

/// Whether what [`managed_arg!`] kept lets the op be replayed.
macro_rules! usable {
    (F, $c:ident) => {
        $c.usable()
    };
    (I, $c:ident) => {
        $c.usable()
    };
    (Bo, $c:ident) => {
        $c.usable()
    };
    (Q, $c:ident) => {
        $c.usable()
    };
    (RF, $c:ident) => {
        $c.usable()
    };
    (RI, $c:ident) => {
        $c.usable()
    };
    (RBo, $c:ident) => {
        $c.usable()
    };
    (RQ, $c:ident) => {
        $c.usable()
    };
    (VF, $c:ident) => {
        $c.iter().all($crate::remat::Source::usable)
    };
    (VI, $c:ident) => {
        $crate::ops::usable!(VF, $c)
    };
    (VBo, $c:ident) => {
        $crate::ops::usable!(VF, $c)
    };
    (VQ, $c:ident) => {
        $crate::ops::usable!(VF, $c)
    };
    (OF, $c:ident) => {
        $c.as_ref().is_none_or($crate::remat::Source::usable)
    };
    (OBo, $c:ident) => {
        $crate::ops::usable!(OF, $c)
    };
    (TP, $c:ident) => {
        false
    };
    (QP, $c:ident) => {
        false
    };
    ([TensorData], $c:ident) => {
        false
    };
    ($other:tt, $c:ident) => {
        true
    };
}
pub(crate) use usable;

/// Bytes of a tensor argument as kept by [`managed_arg!`] (0 for other arguments).
macro_rules! arg_bytes {
    (F, $c:ident) => {
        $c.bytes()
    };
    (I, $c:ident) => {
        $c.bytes()
    };
    (Bo, $c:ident) => {
        $c.bytes()
    };
    (Q, $c:ident) => {
        $c.bytes()
    };
    (RF, $c:ident) => {
        $c.bytes()
    };
    (RI, $c:ident) => {
        $c.bytes()
    };
    (RBo, $c:ident) => {
        $c.bytes()
    };
    (RQ, $c:ident) => {
        $c.bytes()
    };
    (VF, $c:ident) => {
        $c.iter().map($crate::remat::Source::bytes).sum::<u64>()
    };
    (VI, $c:ident) => {
        $crate::ops::arg_bytes!(VF, $c)
    };
    (VBo, $c:ident) => {
        $crate::ops::arg_bytes!(VF, $c)
    };
    (VQ, $c:ident) => {
        $crate::ops::arg_bytes!(VF, $c)
    };
    (OF, $c:ident) => {
        $c.as_ref().map_or(0, $crate::remat::Source::bytes)
    };
    (OBo, $c:ident) => {
        $crate::ops::arg_bytes!(OF, $c)
    };
    ($other:tt, $c:ident) => {
        0u64
    };
}
pub(crate) use arg_bytes;

/// What an argument says of the size of the op's output, for making room before the op: a
/// tensor its bytes, a shape its elements at 4 bytes (f32, the type of the creation ops a
/// model's first step runs: its parameters' initialisation), anything else nothing.
macro_rules! size_hint {
    ([Shape], $c:ident) => {
        $c.num_elements() as u64 * 4
    };
    ($kind:tt, $c:ident) => {
        $crate::ops::arg_bytes!($kind, $c)
    };
}
pub(crate) use size_hint;

/// Notes a float tensor argument's shape and dtype in the first free slot of `$s`, the
/// operands of a product (see [`product_output_bytes`]).
macro_rules! note_operand {
    (F, $a:ident, $s:ident) => {
        if let Some(slot) = $s.iter_mut().find(|slot| slot.is_none()) {
            *slot = Some((
                burn_backend::TensorMetadata::shape(&$a.0),
                burn_backend::TensorMetadata::dtype(&$a.0),
            ));
        }
    };
    ($other:tt, $a:ident, $s:ident) => {
        ()
    };
}
pub(crate) use note_operand;

/// Bytes of the output of the product `op` on its first two float operands: for Burn's
/// `linear` (`[.., k] · [k, n]`) and `float_matmul` (`[.., m, k] · [.., k, n]`, the left
/// operand's batch), the left operand's rows times the right operand's columns; 0 for other
/// ops, whose output the budget guesses from their inputs.
pub(crate) fn product_output_bytes(
    op: crate::vocabulary::OpId,
    operands: &[Option<(burn_backend::Shape, burn_backend::DType)>; 2],
) -> u64 {
    use crate::vocabulary::families::{float, module};
    let [Some((lhs, dtype)), Some((rhs, _))] = operands else {
        return 0;
    };
    let (Some(&k), Some(&n)) = (lhs.last(), rhs.last()) else {
        return 0;
    };
    if k == 0 || (op != module::op(module::Op::linear) && op != float::op(float::Op::float_matmul))
    {
        return 0;
    }
    (lhs.num_elements() / k * n * dtype.size()) as u64
}

/// Adds a tensor argument's cell to a recipe's inputs.
macro_rules! push_cells {
    (F, $c:ident, $v:ident) => {
        $c.push_cell(&mut $v)
    };
    (I, $c:ident, $v:ident) => {
        $c.push_cell(&mut $v)
    };
    (Bo, $c:ident, $v:ident) => {
        $c.push_cell(&mut $v)
    };
    (Q, $c:ident, $v:ident) => {
        $c.push_cell(&mut $v)
    };
    (RF, $c:ident, $v:ident) => {
        $c.push_cell(&mut $v)
    };
    (RI, $c:ident, $v:ident) => {
        $c.push_cell(&mut $v)
    };
    (RBo, $c:ident, $v:ident) => {
        $c.push_cell(&mut $v)
    };
    (RQ, $c:ident, $v:ident) => {
        $c.push_cell(&mut $v)
    };
    (VF, $c:ident, $v:ident) => {
        $c.iter().for_each(|s| s.push_cell(&mut $v))
    };
    (VI, $c:ident, $v:ident) => {
        $crate::ops::push_cells!(VF, $c, $v)
    };
    (VBo, $c:ident, $v:ident) => {
        $crate::ops::push_cells!(VF, $c, $v)
    };
    (VQ, $c:ident, $v:ident) => {
        $crate::ops::push_cells!(VF, $c, $v)
    };
    (OF, $c:ident, $v:ident) => {
        $c.iter().for_each(|s| s.push_cell(&mut $v))
    };
    (OBo, $c:ident, $v:ident) => {
        $crate::ops::push_cells!(OF, $c, $v)
    };
    ($other:tt, $c:ident, $v:ident) => {
        ()
    };
}
pub(crate) use push_cells;

#[cfg(test)]
mod tests {
    use burn_backend::{DType, Shape};

    use super::product_output_bytes;
    use crate::vocabulary::families::{float, module};

    #[test]
    fn a_products_output_size_follows_from_its_operands_shapes() {
        let linear = module::op(module::Op::linear);
        let matmul = float::op(float::Op::float_matmul);
        let operands = |lhs: &[usize], rhs: &[usize], dtype| {
            [
                Some((Shape::from(lhs.to_vec()), dtype)),
                Some((Shape::from(rhs.to_vec()), dtype)),
            ]
        };
        // An up-projection: four times its input.
        let up = operands(&[8, 512, 768], &[768, 3072], DType::F32);
        assert_eq!(product_output_bytes(linear, &up), 8 * 512 * 3072 * 4);
        // Attention scores in bf16: [b, h, s, d] · [b, h, d, s].
        let scores = operands(&[8, 12, 512, 64], &[8, 12, 64, 512], DType::BF16);
        assert_eq!(
            product_output_bytes(matmul, &scores),
            8 * 12 * 512 * 512 * 2
        );
        // Other ops, and a missing operand, are left to the inputs' sizes.
        let exp = float::op(float::Op::float_exp);
        assert_eq!(product_output_bytes(exp, &up), 0);
        assert_eq!(product_output_bytes(linear, &[up[0].clone(), None]), 0);
    }
}
