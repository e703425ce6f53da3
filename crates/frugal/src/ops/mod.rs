//! Every Backend op trait of Burn 0.21, forwarded to the inner backend.
//!
//! Each op family (one file per Burn op trait, as in burn-autodiff) lists its methods once in
//! a small signature language read by [`forward_ops!`]:
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
mod bool;
mod float;
mod int;
mod module;
mod qtensor;
mod transaction;

/// Index of a forwarded Backend method, global across op families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct OpId(u16);

impl OpId {
    pub(crate) const fn new(index: u16) -> Self {
        Self(index)
    }

    pub(crate) fn from_index(index: usize) -> Self {
        Self(index as u16)
    }

    #[inline]
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }

    /// The Backend method's name, e.g. `float_matmul`.
    pub(crate) fn name(self) -> &'static str {
        let mut index = self.index();
        for (_, names) in FAMILIES {
            if index < names.len() {
                return names[index];
            }
            index -= names.len();
        }
        "unknown"
    }

    /// The Burn trait the method belongs to.
    pub(crate) fn family(self) -> &'static str {
        let mut index = self.index();
        for (family, names) in FAMILIES {
            if index < names.len() {
                return family;
            }
            index -= names.len();
        }
        "unknown"
    }
}

/// The op families in id order, each with its Burn trait name and method names.
pub(crate) const FAMILIES: [(&str, &[&str]); 8] = [
    ("Backend", crate::backend::NAMES),
    ("FloatTensorOps", float::NAMES),
    ("IntTensorOps", int::NAMES),
    ("BoolTensorOps", bool::NAMES),
    ("QTensorOps", qtensor::NAMES),
    ("ModuleOps", module::NAMES),
    ("ActivationOps", activation::NAMES),
    ("TransactionOps", transaction::NAMES),
];

pub(crate) const BACKEND_BASE: u16 = 0;
pub(crate) const FLOAT_BASE: u16 = BACKEND_BASE + crate::backend::NAMES.len() as u16;
pub(crate) const INT_BASE: u16 = FLOAT_BASE + float::NAMES.len() as u16;
pub(crate) const BOOL_BASE: u16 = INT_BASE + int::NAMES.len() as u16;
pub(crate) const Q_BASE: u16 = BOOL_BASE + bool::NAMES.len() as u16;
pub(crate) const MODULE_BASE: u16 = Q_BASE + qtensor::NAMES.len() as u16;
pub(crate) const ACTIVATION_BASE: u16 = MODULE_BASE + module::NAMES.len() as u16;
pub(crate) const TRANSACTION_BASE: u16 = ACTIVATION_BASE + activation::NAMES.len() as u16;

/// Number of forwarded methods in all families.
pub(crate) const OP_COUNT: usize = TRANSACTION_BASE as usize + transaction::NAMES.len();

/// Every forwarded Backend method as `(trait, method)`, in id order.
pub fn forwarded_methods() -> Vec<(&'static str, &'static str)> {
    FAMILIES
        .iter()
        .flat_map(|(family, names)| names.iter().map(move |name| (*family, *name)))
        .collect()
}

/// How many times each forwarded method has been called in this process, on any device.
pub fn call_counts() -> Vec<(&'static str, &'static str, u64)> {
    let ledgers = crate::ledger::Ledger::all();
    (0..OP_COUNT)
        .map(|i| {
            let op = OpId::from_index(i);
            let calls = ledgers.iter().map(|l| l.calls(op)).sum::<u64>()
                + crate::ledger::Ledger::unattributed().calls(op);
            (op.family(), op.name(), calls)
        })
        .collect()
}

/// Declares an op family's method ids: an enum with one variant per method, their names, and
/// `op()` mapping a variant to its global [`OpId`].
macro_rules! op_family {
    ($base:expr; $($name:ident),* $(,)?) => {
        #[allow(non_camel_case_types, dead_code, clippy::enum_variant_names)]
        #[derive(Clone, Copy)]
        #[repr(u16)]
        pub(crate) enum Op { $($name,)* }

        pub(crate) const NAMES: &[&str] = &[$(stringify!($name),)*];

        #[inline]
        pub(crate) const fn op(op: Op) -> $crate::ops::OpId {
            $crate::ops::OpId::new($base + op as u16)
        }
    };
}
pub(crate) use op_family;

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
/// until the outputs are charged.
macro_rules! split_arg {
    (F, $a:ident) => {{
        let $crate::tensor::FrugalTensor { inner, storage } = $a;
        (inner, storage)
    }};
    (I, $a:ident) => {
        $crate::ops::split_arg!(F, $a)
    };
    (Bo, $a:ident) => {
        $crate::ops::split_arg!(F, $a)
    };
    (Q, $a:ident) => {
        $crate::ops::split_arg!(F, $a)
    };
    (RF, $a:ident) => {
        (&$a.inner, ())
    };
    (RI, $a:ident) => {
        (&$a.inner, ())
    };
    (RBo, $a:ident) => {
        (&$a.inner, ())
    };
    (RQ, $a:ident) => {
        (&$a.inner, ())
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
        $crate::tensor::split_primitive::<B>($a)
    };
    (QP, $a:ident) => {
        $crate::tensor::split_qparams::<B>($a)
    };
    ($other:tt, $a:ident) => {
        ($a, ())
    };
}
pub(crate) use split_arg;

/// The ledger an op's outputs are charged to: its first tensor's, else its device's.
macro_rules! ledger_of {
    () => { $crate::ledger::Ledger::unattributed() };
    (F $a:ident $($rest:tt)*) => { $a.ledger() };
    (I $a:ident $($rest:tt)*) => { $a.ledger() };
    (Bo $a:ident $($rest:tt)*) => { $a.ledger() };
    (Q $a:ident $($rest:tt)*) => { $a.ledger() };
    (RF $a:ident $($rest:tt)*) => { $a.ledger() };
    (RI $a:ident $($rest:tt)*) => { $a.ledger() };
    (RBo $a:ident $($rest:tt)*) => { $a.ledger() };
    (RQ $a:ident $($rest:tt)*) => { $a.ledger() };
    (VF $a:ident $($rest:tt)*) => { match $a.first() { Some(t) => t.ledger(), None => $crate::ops::ledger_of!($($rest)*) } };
    (VI $a:ident $($rest:tt)*) => { $crate::ops::ledger_of!(VF $a $($rest)*) };
    (VBo $a:ident $($rest:tt)*) => { $crate::ops::ledger_of!(VF $a $($rest)*) };
    (VQ $a:ident $($rest:tt)*) => { $crate::ops::ledger_of!(VF $a $($rest)*) };
    (TP $a:ident $($rest:tt)*) => { $crate::tensor::primitive_ledger::<B>(&$a) };
    (D $a:ident $($rest:tt)*) => { $crate::ledger::Ledger::of_device($a) };
    ($other:tt $a:ident $($rest:tt)*) => { $crate::ops::ledger_of!($($rest)*) };
}
pub(crate) use ledger_of;

/// Wraps an inner backend's output, charging new tensors to `$ledger` under `$op`.
macro_rules! wrap_out {
    (F, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::FrugalTensor::track($o, $l, $op)
    };
    (I, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::FrugalTensor::track($o, $l, $op)
    };
    (Bo, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::FrugalTensor::track($o, $l, $op)
    };
    (Q, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::FrugalTensor::track($o, $l, $op)
    };
    (TP, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::track_primitive::<B>($o, $l, $op)
    };
    (MaxPool1dWithIndices, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::track_max_pool1d::<B>($o, $l, $op)
    };
    (MaxPool2dWithIndices, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::track_max_pool2d::<B>($o, $l, $op)
    };
    (MaxPool1dBackward, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::track_max_pool1d_backward::<B>($o, $l, $op)
    };
    (MaxPool2dBackward, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::track_max_pool2d_backward::<B>($o, $l, $op)
    };
    (DeformConv2dBackward, $o:ident, $l:ident, $op:ident) => {
        $crate::tensor::track_deform_conv2d_backward::<B>($o, $l, $op)
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

/// Implements one Burn op trait for `Frugal<B>` by forwarding each listed method to `B`'s own
/// method of the same name. Methods under `manual` are written by hand beside the invocation
/// (async reads, device moves) but get ids here too.
macro_rules! forward_ops {
    (
        impl $trait:ident, base $base:expr;
        manual [$($manual:ident),* $(,)?] { $($manual_items:tt)* }
        $(fn $name:ident($($arg:ident : $kind:tt),* $(,)?) -> $ret:tt;)*
        views:
        $(fn $vname:ident($vt:ident : $vk:tt $(, $varg:ident : $vkind:tt)* $(,)?) -> $vret:tt;)*
    ) => {
        $crate::ops::op_family!($base; $($manual,)* $($name,)* $($vname,)*);

        impl<B: Backend> $trait<Frugal<B>> for Frugal<B> {
            $(
                #[inline]
                fn $name($($arg: $crate::ops::frugal_ty!($kind)),*) -> $crate::ops::frugal_ty!($ret) {
                    let ledger = $crate::ops::ledger_of!($($kind $arg)*);
                    let id = op(Op::$name);
                    ledger.count_call(id);
                    $(let $arg = $crate::ops::split_arg!($kind, $arg);)*
                    let out = B::$name($($arg.0),*);
                    $crate::ops::wrap_out!($ret, out, ledger, id)
                }
            )*
            $(
                #[inline]
                fn $vname($vt: $crate::ops::frugal_ty!($vk) $(, $varg: $crate::ops::frugal_ty!($vkind))*) -> $crate::ops::frugal_ty!($vret) {
                    let $crate::tensor::FrugalTensor { inner, storage } = $vt;
                    storage.ledger.count_call(op(Op::$vname));
                    $crate::tensor::FrugalTensor { inner: B::$vname(inner $(, $varg)*), storage }
                }
            )*
            $($manual_items)*
        }
    };
}
pub(crate) use forward_ops;

/// Forwards a `*_to_device` method: the output is charged to the target device's ledger.
macro_rules! to_device {
    ($name:ident, $ty:ident) => {
        fn $name(
            tensor: burn_backend::tensor::$ty<Self>,
            device: &burn_backend::tensor::Device<Self>,
        ) -> burn_backend::tensor::$ty<Self> {
            let target = $crate::ledger::Ledger::of_device(device);
            let id = op(Op::$name);
            target.count_call(id);
            let $crate::tensor::FrugalTensor { inner, storage } = tensor;
            let out = B::$name(inner, device);
            let out = $crate::tensor::FrugalTensor::track(out, target, id);
            drop(storage);
            out
        }
    };
}
pub(crate) use to_device;

/// Forwards a `*_into_data` method, whose result is a future.
macro_rules! into_data {
    ($name:ident, $ty:ident) => {
        fn $name(
            tensor: burn_backend::tensor::$ty<Self>,
        ) -> impl core::future::Future<
            Output = Result<burn_backend::TensorData, burn_backend::ExecutionError>,
        > + Send {
            tensor.ledger().count_call(op(Op::$name));
            B::$name(tensor.inner)
        }
    };
}
pub(crate) use into_data;
