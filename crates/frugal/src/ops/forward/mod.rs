//! `forward_ops!`: one Burn op trait implemented for `Frugal<B>` from its signature lines (see
//! the `ops` module's documentation), and the inner function each op forwards to. The macros
//! it expands to are beside it by role: `args.rs` (arguments), `cast.rs` (autocast),
//! `outputs.rs` (outputs and recipes), `manual.rs` (helpers of the hand-written methods); all
//! are reached as `$crate::ops::name!`.

mod args;
mod cast;
mod manual;
mod outputs;

pub(crate) use args::*;
pub(crate) use cast::*;
pub(crate) use manual::*;
pub(crate) use outputs::*;

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
        use $crate::vocabulary::families::$module::{Op, op};

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
                    let out = $crate::tensor::FrugalTensor::managed::<B, $crate::ops::kind_of!($vret)>(out, storage, recipe, 0.0, $crate::remat::Origin::OPAQUE);
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
