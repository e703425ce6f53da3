//! Outputs of a forwarded op: the device state they are charged to, wrapped plain or managed,
//! and the recipe that replays the op.

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
        let (usable, inputs, sizes, origin) = {
            #[allow(unused_variables)]
            let ($($arg,)*) = &$caps;
            let usable = $op.facts().replayable
                $(&& $crate::ops::usable!($kind, $arg))*;
            #[allow(unused_mut)]
            let mut inputs = Vec::new();
            if usable {
                $($crate::ops::push_cells!($kind, $arg, inputs);)*
            }
            let origin = $crate::remat::Origin {
                values: $crate::ops::values_of!([$($inner)*] $($arg)*),
                replays: $op.facts().replayable $(&& $crate::ops::replays!($kind))*,
            };
            (usable, inputs, [$($crate::ops::arg_bytes!($kind, $arg)),*], origin)
        };
        let storage = std::sync::Arc::new($l.charge(&$o, $op));
        let cost = $crate::vocabulary::cost::op_cost(
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
        $crate::tensor::FrugalTensor::managed::<B, $crate::ops::kind_of!($k)>($o, storage, recipe, cost, origin)
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

/// What an op's output is known to hold, from its name and arguments: a Bernoulli draw holds
/// only 0 and 1 (see [`crate::remat::Values`]).
macro_rules! values_of {
    ([float_random] $shape:ident $distribution:ident $device:ident $dtype:ident) => {
        match $distribution {
            burn_backend::Distribution::Bernoulli(_) => $crate::remat::Values::Binary,
            _ => $crate::remat::Values::Any,
        }
    };
    ([$($inner:tt)*] $($arg:ident)*) => {
        $crate::remat::Values::Any
    };
}
pub(crate) use values_of;

/// Whether a recipe can pass an argument of this kind again (see [`crate::ops::managed_arg!`]).
macro_rules! replays {
    (TP) => {
        false
    };
    (QP) => {
        false
    };
    ([TensorData]) => {
        false
    };
    ($other:tt) => {
        true
    };
}
pub(crate) use replays;

/// The argument as a recipe passes it again, from what `managed_arg!` kept (`$c` is a
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
