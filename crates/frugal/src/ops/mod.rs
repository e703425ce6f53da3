//! Every Backend op trait of Burn 0.21, forwarded to the inner backend.
//!
//! Each op family (one file per Burn op trait, as in burn-autodiff) lists its methods once in
//! a small signature language read by the private macro `forward_ops!`:
//!
//! | kind | Frugal-side type | handed to the inner backend as |
//! |---|---|---|
//! | `F` `I` `Bo` `Q` | float / int / bool / quantized tensor | its inner primitive |
//! | `RF` `RI` `RBo` `RQ` | reference to one | a reference to its inner primitive |
//! | `VF` `VI` `VBo` `VQ` | `Vec` of them | `Vec` of inner primitives |
//! | `OF` `OBo` | `Option` of one | `Option` of the inner primitive |
//! | `D` | `&Device` | as is |
//! | `TP`, `QP` | `TensorPrimitive`, quantization parameters | the inner versions |
//! | `[T]` | any other type `T` | as is |
//!
//! Outputs are charged to the ledger of the op's first tensor argument (or its device
//! argument). Ops listed under `views:` return a tensor that shares its input's storage record
//! instead of being charged again, so a buffer is never counted twice.

mod activation;
pub(crate) mod attention;
mod backend;
mod bool;
pub(crate) mod convert;
#[cfg(feature = "distributed")]
mod distributed;
mod float;
mod int;
pub(crate) mod layer_norm;
pub(crate) mod linear_cross_entropy;
mod module;
mod qtensor;
pub(crate) mod registry;
mod transaction;

use crate::device::DeviceState;
use crate::op::OP_COUNT;
pub use crate::op::forwarded_methods;

/// How many times each forwarded method has been called in this process, on any device.
pub fn call_counts() -> Vec<(&'static str, &'static str, u64)> {
    let states = DeviceState::all();
    (0..OP_COUNT)
        .map(|i| {
            let op = crate::op::OpId::from_index(i);
            let calls = states.iter().map(|s| s.ledger.calls(op)).sum::<u64>()
                + DeviceState::unattributed().ledger.calls(op);
            (op.family(), op.name(), calls)
        })
        .collect()
}

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

/// The argument as a recipe passes it again, from what [`managed_arg!`] kept (`$c` is a
/// reference to it).
macro_rules! replay {
    (F, $c:ident) => {
        $c.get()
    };
    (I, $c:ident) => {
        $c.get()
    };
    (Bo, $c:ident) => {
        $c.get()
    };
    (Q, $c:ident) => {
        $c.get()
    };
    (RF, $c:ident) => {
        &$c.get()
    };
    (RI, $c:ident) => {
        &$c.get()
    };
    (RBo, $c:ident) => {
        &$c.get()
    };
    (RQ, $c:ident) => {
        &$c.get()
    };
    (VF, $c:ident) => {
        $c.iter().map($crate::remat::Source::get).collect()
    };
    (VI, $c:ident) => {
        $crate::ops::replay!(VF, $c)
    };
    (VBo, $c:ident) => {
        $crate::ops::replay!(VF, $c)
    };
    (VQ, $c:ident) => {
        $crate::ops::replay!(VF, $c)
    };
    (OF, $c:ident) => {
        $c.as_ref().map($crate::remat::Source::get)
    };
    (OBo, $c:ident) => {
        $crate::ops::replay!(OF, $c)
    };
    (TP, $c:ident) => {
        unreachable!()
    };
    (QP, $c:ident) => {
        unreachable!()
    };
    (D, $c:ident) => {
        $c
    };
    ([&[$t:ty]], $c:ident) => {
        &$c[..]
    };
    ([&$t:ty], $c:ident) => {
        $c
    };
    ([TensorData], $c:ident) => {
        unreachable!()
    };
    ([$($t:tt)*], $c:ident) => {
        $c.clone()
    };
}
pub(crate) use replay;

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
    op: crate::op::OpId,
    operands: &[Option<(burn_backend::Shape, burn_backend::DType)>; 2],
) -> u64 {
    use crate::op::families::{float, module};
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

/// Adds a float argument's dtype to autocast's set (other arguments add nothing).
macro_rules! note_dtype {
    (F, $a:ident, $s:ident) => {
        $s.add(burn_backend::TensorMetadata::dtype(&$a))
    };
    (OF, $a:ident, $s:ident) => {
        if let Some(t) = &$a {
            $s.add(burn_backend::TensorMetadata::dtype(t))
        }
    };
    (VF, $a:ident, $s:ident) => {
        $a.iter()
            .for_each(|t| $s.add(burn_backend::TensorMetadata::dtype(t)))
    };
    ($other:tt, $a:ident, $s:ident) => {
        ()
    };
}
pub(crate) use note_dtype;

/// A float argument cast to autocast's input type (other arguments unchanged).
macro_rules! cast_arg {
    (F, $a:ident, $d:expr) => {
        $crate::ops::convert::cast_to::<B>($a, $d)
    };
    (OF, $a:ident, $d:expr) => {
        $a.map(|t| $crate::ops::convert::cast_to::<B>(t, $d))
    };
    (VF, $a:ident, $d:expr) => {
        $a.into_iter()
            .map(|t| $crate::ops::convert::cast_to::<B>(t, $d))
            .collect::<Vec<_>>()
    };
    ($other:tt, $a:ident, $d:expr) => {
        $a
    };
}
pub(crate) use cast_arg;

/// A float output cast to autocast's output type, if the plan has one.
macro_rules! cast_out {
    (F, $o:ident, $d:expr) => {
        match $d {
            Some(dtype) => $crate::ops::convert::cast_to::<B>($o, dtype),
            None => $o,
        }
    };
    ($other:tt, $o:ident, $d:expr) => {
        $o
    };
}
pub(crate) use cast_out;

/// What a recipe keeps for an argument that makes the op impossible to replay.
pub(crate) struct NoReplay;

/// The cell kind of a single-tensor output.
macro_rules! kind_of {
    (F) => {
        $crate::remat::FloatKind
    };
    (I) => {
        $crate::remat::IntKind
    };
    (Bo) => {
        $crate::remat::BoolKind
    };
    (Q) => {
        $crate::remat::QuantKind
    };
}
pub(crate) use kind_of;

/// The device state an op's outputs are charged to: its first tensor's, else its device's.
macro_rules! state_of {
    () => { $crate::device::DeviceState::unattributed() };
    (F $a:ident $($rest:tt)*) => { $a.state() };
    (I $a:ident $($rest:tt)*) => { $a.state() };
    (Bo $a:ident $($rest:tt)*) => { $a.state() };
    (Q $a:ident $($rest:tt)*) => { $a.state() };
    (RF $a:ident $($rest:tt)*) => { $a.state() };
    (RI $a:ident $($rest:tt)*) => { $a.state() };
    (RBo $a:ident $($rest:tt)*) => { $a.state() };
    (RQ $a:ident $($rest:tt)*) => { $a.state() };
    (VF $a:ident $($rest:tt)*) => { match $a.first() { Some(t) => t.state(), None => $crate::ops::state_of!($($rest)*) } };
    (VI $a:ident $($rest:tt)*) => { $crate::ops::state_of!(VF $a $($rest)*) };
    (VBo $a:ident $($rest:tt)*) => { $crate::ops::state_of!(VF $a $($rest)*) };
    (VQ $a:ident $($rest:tt)*) => { $crate::ops::state_of!(VF $a $($rest)*) };
    (TP $a:ident $($rest:tt)*) => { $crate::ops::convert::primitive_state::<B>(&$a) };
    // A device argument: also where `Frugal<B>` registers its attention (`attention.rs`).
    (D $a:ident $($rest:tt)*) => { $crate::ops::registry::device_state::<B, _>($a) };
    ($other:tt $a:ident $($rest:tt)*) => { $crate::ops::state_of!($($rest)*) };
}
pub(crate) use state_of;

/// Wraps an inner backend's output, charging new tensors to `$ledger` under `$op`.
macro_rules! wrap_out {
    (F, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::FrugalTensor::track::<B, $crate::remat::FloatKind>($o, $l, $op)
    };
    (I, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::FrugalTensor::track::<B, $crate::remat::IntKind>($o, $l, $op)
    };
    (Bo, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::FrugalTensor::track::<B, $crate::remat::BoolKind>($o, $l, $op)
    };
    (Q, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::FrugalTensor::track::<B, $crate::remat::QuantKind>($o, $l, $op)
    };
    (TP, $o:ident, $l:ident, $op:ident) => {
        $crate::ops::convert::track_primitive::<B>($o, $l, $op)
    };
    (MaxPool1dWithIndices, $o:ident, $l:ident, $op:ident) => {
        $crate::ops::convert::track_max_pool1d::<B>($o, $l, $op)
    };
    (MaxPool2dWithIndices, $o:ident, $l:ident, $op:ident) => {
        $crate::ops::convert::track_max_pool2d::<B>($o, $l, $op)
    };
    (MaxPool1dBackward, $o:ident, $l:ident, $op:ident) => {
        $crate::ops::convert::track_max_pool1d_backward::<B>($o, $l, $op)
    };
    (MaxPool2dBackward, $o:ident, $l:ident, $op:ident) => {
        $crate::ops::convert::track_max_pool2d_backward::<B>($o, $l, $op)
    };
    (DeformConv2dBackward, $o:ident, $l:ident, $op:ident) => {
        $crate::ops::convert::track_deform_conv2d_backward::<B>($o, $l, $op)
    };
    (($a:tt, $b:tt), $o:ident, $l:ident, $op:ident) => {{
        let (first, second) = $o;
        (
            $crate::ops::wrap_out!($a, first, $l, $op),
            $crate::ops::wrap_out!($b, second, $l, $op),
        )
    }};
    ([$($t:tt)*], $o:ident, $l:ident, $op:ident) => {
        $o
    };
}
pub(crate) use wrap_out;

/// Wraps the output of an op run on a managed device: a single tensor gets a cell with a
/// recipe that replays the op from `$caps`; other outputs are kept or offloaded only.
macro_rules! wrap_managed {
    (@recipe $k:tt, $o:ident, $l:ident, $op:ident, [$($inner:tt)*], $caps:ident, $($arg:ident: $kind:tt),*) => {{
        let (usable, inputs, sizes) = {
            #[allow(unused_variables)]
            let ($($arg,)*) = &$caps;
            let usable = $op.facts().replayable
                $(&& $crate::ops::usable!($kind, $arg))*;
            #[allow(unused_mut)]
            let mut inputs = Vec::new();
            if usable {
                $($crate::ops::push_cells!($kind, $arg, inputs);)*
            }
            (usable, inputs, [$($crate::ops::arg_bytes!($kind, $arg)),*])
        };
        let storage = std::sync::Arc::new($l.charge(&$o, $op));
        let cost = $crate::op::cost::op_cost(
            $op,
            &sizes,
            storage.bytes,
            burn_backend::TensorMetadata::shape(&$o).last().copied().unwrap_or(1),
            burn_backend::TensorMetadata::dtype(&$o).size(),
        );
        #[allow(unreachable_code)]
        let recipe = usable.then(|| $crate::remat::Recipe {
            run: Box::new(move || {
                #[allow(unused_variables)]
                let ($($arg,)*) = &$caps;
                $crate::ops::inner_fn!(B, $($inner)*)($($crate::ops::replay!($kind, $arg)),*)
            }),
            inputs,
            view_of: None,
        });
        $crate::tensor::FrugalTensor::managed::<B, $crate::ops::kind_of!($k)>($o, storage, recipe, cost)
    }};
    (F, $($rest:tt)*) => { $crate::ops::wrap_managed!(@recipe F, $($rest)*) };
    (I, $($rest:tt)*) => { $crate::ops::wrap_managed!(@recipe I, $($rest)*) };
    (Bo, $($rest:tt)*) => { $crate::ops::wrap_managed!(@recipe Bo, $($rest)*) };
    (Q, $($rest:tt)*) => { $crate::ops::wrap_managed!(@recipe Q, $($rest)*) };
    ($other:tt, $o:ident, $l:ident, $op:ident, [$($inner:tt)*], $caps:ident, $($rest:tt)*) => {{
        let _unused = $caps;
        $crate::ops::wrap_out!($other, $o, $l, $op)
    }};
}
pub(crate) use wrap_managed;

/// The inner function an op forwards to: `B`'s method of the same name, or
/// `crate::kernels::$via`, which takes the same arguments and runs Frugal's own kernels or
/// cuBLASLt where they apply. Recipes replay the same function, so a recomputed tensor has
/// the bits of the original.
macro_rules! inner_fn {
    ($b:ident, $name:ident) => {
        $b::$name
    };
    ($b:ident, $name:ident, $via:ident) => {
        $crate::kernels::$via::<$b>
    };
}
pub(crate) use inner_fn;

/// Implements one Burn op trait for `Frugal<B>` by forwarding each listed method to `B`'s own
/// method of the same name. Methods under `manual` are written by hand beside the invocation
/// (async reads, device moves) but get ids here too.
///
/// Each method has two paths: the plain one (no budget, no scope: unwrap, call, charge) and
/// the managed one, which also records how to replay the op and, after it, enforces the
/// device's budget.
macro_rules! forward_ops {
    (
        { $($manual_items:tt)* }
        family $trait:ident, module $module:ident, base $base:ident;
        manual [$($manual:ident),* $(,)?];
        $(fn $name:ident($($arg:ident : $kind:tt),* $(,)?) -> $ret:tt $(via $via:ident)?;)*
        views:
        $(fn $vname:ident($vt:ident : $vk:tt $(, $varg:ident : $vkind:tt)* $(,)?) -> $vret:tt;)*
    ) => {
        #[allow(unused_imports)]
        use $crate::op::families::$module::{Op, op};

        impl<B: Backend> $trait<Frugal<B>> for Frugal<B> {
            $(
                #[inline]
                #[allow(dropping_copy_types)]
                fn $name($($arg: $crate::ops::frugal_ty!($kind)),*) -> $crate::ops::frugal_ty!($ret) {
                    let state = $crate::ops::state_of!($($kind $arg)*);
                    let id = op(Op::$name);
                    // Autocast: 0 (one byte load) unless the device has a policy.
                    let precision = state.autocast.code(id);
                    #[allow(unused_variables)]
                    if precision != 0 {
                        #[allow(unused_mut)]
                        let mut dtypes = $crate::autocast::DtypeSet::default();
                        $($crate::ops::note_dtype!($kind, $arg, dtypes);)*
                        if let Some(plan) = $crate::autocast::plan(precision, dtypes) {
                            $(let $arg = $crate::ops::cast_arg!($kind, $arg, plan.input);)*
                            let out = <Self as $trait<Self>>::$name($($arg),*);
                            return $crate::ops::cast_out!($ret, out, plan.output);
                        }
                    }
                    state.count_call(id);
                    if !state.managing() {
                        $(let $arg = $crate::ops::split_arg!($kind, $arg);)*
                        let out = $crate::ops::inner_fn!(B, $name $(, $via)?)($($crate::ops::pass!($kind, $arg)),*);
                        return $crate::ops::wrap_out!($ret, out, state, id);
                    }
                    let live_before = state.ledger.live_bytes();
                    $(let $arg = $crate::ops::managed_arg!($kind, $arg);)*
                    let caps = ($($arg.2,)*);
                    #[allow(unused_variables)]
                    let (inputs_bytes, largest_input): (u64, u64) = {
                        let ($($arg,)*) = &caps;
                        (
                            0 $(+ $crate::ops::arg_bytes!($kind, $arg))*,
                            0 $(.max($crate::ops::size_hint!($kind, $arg)))*,
                        )
                    };
                    // A product's output may be larger than any input (a layer's up-projection,
                    // the logits): its size follows from the operands' shapes.
                    let product_output = if id.facts().product {
                        #[allow(unused_mut)]
                        let mut operands = [None, None];
                        $($crate::ops::note_operand!($kind, $arg, operands);)*
                        $crate::ops::product_output_bytes(id, &operands)
                    } else {
                        0
                    };
                    // The inputs are resident and held: room for the output. A product's size
                    // is known exactly; the learned step's size for the op it expects next may
                    // be another call's of the same op (a restore chain runs out of the learned
                    // order), so it serves only the other ops, whose size is else guessed from
                    // their inputs.
                    if product_output > 0 {
                        state.reclaim($crate::engine::Reclaim::Room { bytes: product_output });
                    } else {
                        state.reclaim($crate::engine::Reclaim::BeforeOp { op: id, largest_input });
                    }
                    let out = $crate::ops::inner_fn!(B, $name $(, $via)?)($($crate::ops::pass!($kind, $arg)),*);
                    let out = $crate::ops::wrap_managed!($ret, out, state, id, [$name $(, $via)?], caps, $($arg: $kind),*);
                    $(drop($arg.1);)*
                    let output_bytes = state.ledger.live_bytes().saturating_sub(live_before);
                    state.reclaim($crate::engine::Reclaim::AfterOp { op: Some(id), needed: inputs_bytes + output_bytes });
                    out
                }
            )*
            $(
                #[inline]
                fn $vname($vt: $crate::ops::frugal_ty!($vk) $(, $varg: $crate::ops::frugal_ty!($vkind))*) -> $crate::ops::frugal_ty!($vret) {
                    let state = $vt.state();
                    let id = op(Op::$vname);
                    state.count_call(id);
                    if !state.managing() {
                        let (inner, storage) = $vt.split_view();
                        return $crate::tensor::FrugalTensor::plain_view(B::$vname(inner $(, $varg)*), storage, true);
                    }
                    let (inner, storage, source) = $vt.split_view_source();
                    $(let $varg = $crate::ops::managed_arg!($vkind, $varg);)*
                    let caps = (source, $($varg.2,)*);
                    let out = B::$vname(inner $(, $crate::ops::pass!($vkind, $varg))*);
                    let recipe = caps.0.usable().then(|| {
                        let mut inputs = Vec::new();
                        caps.0.push_cell(&mut inputs);
                        let view_of = caps.0.view_of();
                        $crate::remat::Recipe {
                            view_of,
                            run: Box::new(move || {
                                #[allow(unused_variables)]
                                let (source, $($varg,)*) = &caps;
                                B::$vname(source.get() $(, $crate::ops::replay!($vkind, $varg))*)
                            }),
                            inputs,
                        }
                    });
                    let out = $crate::tensor::FrugalTensor::managed::<B, $crate::ops::kind_of!($vret)>(out, storage, recipe, 0.0);
                    // Reading an evicted input restored it.
                    state.reclaim($crate::engine::Reclaim::AfterOp { op: Some(id), needed: out.storage_bytes() });
                    out
                }
            )*
            $($manual_items)*
        }
    };
}
pub(crate) use forward_ops;

/// Forwards a `*_to_device` method: the output is charged to the target device's ledger.
macro_rules! to_device {
    ($name:ident, $ty:ident, $kind:ident) => {
        fn $name(
            tensor: burn_backend::tensor::$ty<Self>,
            device: &burn_backend::tensor::Device<Self>,
        ) -> burn_backend::tensor::$ty<Self> {
            let target = $crate::device::DeviceState::of_device(device);
            let id = op(Op::$name);
            target.count_call(id);
            if std::ptr::eq(tensor.state(), target) {
                // To its own device the inner backends hand the same buffer back (AdamW moves
                // its moments "to" their device every step, while it still holds them): the
                // result shares the input's charge rather than counting the buffer twice. It
                // gets a cell of its own without a recipe, as a new tensor would, so that a
                // moment does not keep the history it was computed from.
                let view = tensor.is_plain_view();
                let (inner, storage) = tensor.split_view();
                let out = B::$name(inner, device);
                return if target.managing() {
                    $crate::tensor::FrugalTensor::managed_alias::<B, $crate::remat::$kind>(
                        out, storage, id,
                    )
                } else {
                    $crate::tensor::FrugalTensor::plain_view(out, storage, view)
                };
            }
            let (inner, keep) = tensor.split();
            let out = B::$name(inner, device);
            let out =
                $crate::tensor::FrugalTensor::track::<B, $crate::remat::$kind>(out, target, id);
            drop(keep);
            target.reclaim($crate::engine::Reclaim::AfterOp {
                op: Some(id),
                needed: 0,
            });
            out
        }
    };
}
pub(crate) use to_device;

/// Forwards a `*_device` method. A managed tensor answers from its cell, so asking an
/// evicted tensor for its device does not restore it.
macro_rules! device_of {
    ($name:ident, $ty:ident) => {
        fn $name(tensor: &burn_backend::tensor::$ty<Self>) -> burn_backend::tensor::Device<Self> {
            tensor.state().count_call(op(Op::$name));
            match tensor.managed_device::<burn_backend::tensor::Device<Self>>() {
                Some(device) => device,
                None => B::$name(&*tensor.prim_ref()),
            }
        }
    };
}
pub(crate) use device_of;

/// Forwards a `*_into_data` method, whose result is a future.
macro_rules! into_data {
    ($name:ident, $ty:ident) => {
        fn $name(
            tensor: burn_backend::tensor::$ty<Self>,
        ) -> impl core::future::Future<
            Output = Result<burn_backend::TensorData, burn_backend::ExecutionError>,
        > + Send {
            let state = tensor.state();
            state.count_call(op(Op::$name));
            let inner = tensor.into_inner();
            // Reading an evicted tensor restored it.
            state.reclaim($crate::engine::Reclaim::AfterOp {
                op: Some(op(Op::$name)),
                needed: 0,
            });
            B::$name(inner)
        }
    };
}
pub(crate) use into_data;

#[cfg(test)]
mod tests {
    use burn_backend::{DType, Shape};

    use super::product_output_bytes;
    use crate::op::families::{float, module};

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
