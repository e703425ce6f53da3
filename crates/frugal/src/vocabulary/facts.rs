//! What Frugal knows about each op, in one table indexed by [`OpId`], built at compile time
//! from the lists below. Add a fact here, next to its list, and read it with
//! [`OpId::facts`]; nothing matches op names at run time.

use super::families::{float, int, module, qtensor};
use super::{OP_COUNT, OpId};

/// How autocast treats an op's floating-point inputs (see [`crate::precision`]'s table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpPrecision {
    /// Inputs as given; the op is never touched.
    Keep,
    /// Mixed float inputs are cast to the widest of their types.
    Promote,
    /// f16/bf16 inputs are cast to f32.
    F32,
    /// f32 inputs are cast to the policy's low type; the result is cast back to the widest
    /// input type.
    Low,
}

/// How the multiply-adds of a product are counted from its operands' bytes (see
/// [`crate::vocabulary::cost::op_cost`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Macs {
    /// None: the op costs its memory traffic.
    None,
    /// A matrix product `[.., m, k] · [.., k, n]`: the elements of the tensor argument at this
    /// index (the operand holding every row) times the output's columns.
    RowsOf(usize),
    /// Another product (convolutions, attention): `sqrt(lhs · rhs · out)` bytes / 8, exact for
    /// an `(m×k)·(k×n)` f32 product.
    Product,
}

/// The facts of one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpFacts {
    /// A product (matrix product, linear layer, convolution, attention): many multiply-adds per
    /// byte, and a result written into a fresh buffer of standard layout whatever its inputs'
    /// layouts.
    pub(crate) product: bool,
    /// Whether re-running the op gives the same result: not for random draws, uninitialised
    /// buffers or uploads of host data, which are kept or offloaded, never recomputed.
    pub(crate) replayable: bool,
    /// The op's result is a parameter's gradient: autocast returns it in f32 whatever the
    /// policy.
    pub(crate) gives_param_grad: bool,
    /// How its multiply-adds are counted.
    pub(crate) macs: Macs,
    /// Its class in the default autocast policy.
    pub(crate) autocast: OpPrecision,
}

impl OpFacts {
    const ELEMENTWISE: Self = Self {
        product: false,
        replayable: true,
        gives_param_grad: false,
        macs: Macs::None,
        autocast: OpPrecision::Promote,
    };
}

const fn f(op: float::Op) -> OpId {
    float::op(op)
}
const fn m(op: module::Op) -> OpId {
    module::op(op)
}

/// Products: matrix products, linear layers, convolutions (bias gradients included, as the
/// family they belong to) and attention.
const PRODUCTS: &[OpId] = {
    use module::Op::*;
    &[
        f(float::Op::float_matmul),
        int::op(int::Op::int_matmul),
        qtensor::op(qtensor::Op::q_matmul),
        m(linear),
        m(linear_x_backward),
        m(linear_weight_backward),
        m(linear_bias_backward),
        m(conv1d),
        m(conv1d_x_backward),
        m(conv1d_weight_backward),
        m(conv1d_bias_backward),
        m(conv2d),
        m(conv2d_x_backward),
        m(conv2d_weight_backward),
        m(conv2d_bias_backward),
        m(deform_conv2d),
        m(deform_conv2d_backward),
        m(conv3d),
        m(conv3d_x_backward),
        m(conv3d_weight_backward),
        m(conv3d_bias_backward),
        m(conv_transpose1d),
        m(conv_transpose1d_x_backward),
        m(conv_transpose1d_weight_backward),
        m(conv_transpose1d_bias_backward),
        m(conv_transpose2d),
        m(conv_transpose2d_x_backward),
        m(conv_transpose2d_weight_backward),
        m(conv_transpose2d_bias_backward),
        m(conv_transpose3d),
        m(conv_transpose3d_x_backward),
        m(conv_transpose3d_weight_backward),
        m(conv_transpose3d_bias_backward),
        m(attention),
    ]
};

/// Matrix products whose multiply-adds are counted from one operand's rows.
const ROW_PRODUCTS: &[(OpId, usize)] = &[
    (f(float::Op::float_matmul), 0),
    (int::op(int::Op::int_matmul), 0),
    (m(module::Op::linear), 0),
    (m(module::Op::linear_weight_backward), 0),
    // grad_x [.., k] = grad_out [.., n] · W: grad_out (argument 2) times k.
    (m(module::Op::linear_x_backward), 2),
];

/// Ops whose result differs from one call to the next or that upload host data.
const NOT_REPLAYABLE: &[OpId] = &[
    f(float::Op::float_from_data),
    f(float::Op::float_random),
    f(float::Op::float_empty),
    int::op(int::Op::int_empty),
    int::op(int::Op::int_from_data),
    int::op(int::Op::int_random),
    super::families::bool::op(super::families::bool::Op::bool_empty),
    super::families::bool::op(super::families::bool::Op::bool_from_data),
    qtensor::op(qtensor::Op::q_from_data),
];

/// Ops producing a parameter's gradient.
const PARAM_GRADS: &[OpId] = {
    use module::Op::*;
    &[
        m(linear_weight_backward),
        m(linear_bias_backward),
        m(conv1d_weight_backward),
        m(conv1d_bias_backward),
        m(conv2d_weight_backward),
        m(conv2d_bias_backward),
        m(conv3d_weight_backward),
        m(conv3d_bias_backward),
        m(conv_transpose1d_weight_backward),
        m(conv_transpose1d_bias_backward),
        m(conv_transpose2d_weight_backward),
        m(conv_transpose2d_bias_backward),
        m(conv_transpose3d_weight_backward),
        m(conv_transpose3d_bias_backward),
    ]
};

/// Computed in the low type by default: PyTorch's CUDA autocast "lower precision" list as
/// Burn names the ops (matrix products, Burn's `linear` that `nn::Linear` calls, bias
/// included, convolutions and their backward products, attention).
const AUTOCAST_LOW: &[OpId] = {
    use module::Op::*;
    &[
        f(float::Op::float_matmul),
        m(linear),
        m(linear_x_backward),
        m(linear_weight_backward),
        m(conv1d),
        m(conv1d_x_backward),
        m(conv1d_weight_backward),
        m(conv2d),
        m(conv2d_x_backward),
        m(conv2d_weight_backward),
        m(conv3d),
        m(conv3d_x_backward),
        m(conv3d_weight_backward),
        m(conv_transpose1d),
        m(conv_transpose2d),
        m(conv_transpose3d),
        m(attention),
    ]
};

/// Computed in f32 by default: PyTorch's "float32" list (exponentials, logarithms, powers,
/// reciprocals, reductions, and the activations built on them).
const AUTOCAST_F32: &[OpId] = {
    use super::families::activation::{Op as A, op as a};
    use float::Op::*;
    &[
        f(float_exp),
        f(float_log),
        f(float_log1p),
        f(float_recip),
        f(float_powf),
        f(float_powi),
        f(float_powi_scalar),
        f(float_powi_scalar_impl),
        f(float_powf_scalar),
        f(float_powf_scalar_impl),
        f(float_sum),
        f(float_sum_dim),
        f(float_mean),
        f(float_mean_dim),
        f(float_prod),
        f(float_prod_dim),
        f(float_cumsum),
        f(float_cumprod),
        f(float_acos),
        f(float_asin),
        f(float_cosh),
        f(float_sinh),
        f(float_tan),
        f(float_erf),
        a(A::log_sigmoid),
        a(A::log_sigmoid_backward),
        m(module::Op::linear_bias_backward),
        m(module::Op::conv1d_bias_backward),
        m(module::Op::conv2d_bias_backward),
        m(module::Op::conv3d_bias_backward),
    ]
};

/// Never touched by autocast: casts themselves and data movement between types or devices.
const AUTOCAST_KEEP: &[OpId] = {
    use float::Op::*;
    &[
        f(float_cast),
        f(float_into_int),
        f(float_to_device),
        f(float_into_data),
        f(float_is_nan),
        f(float_is_inf),
    ]
};

/// The table, one entry per forwarded method.
pub(crate) static FACTS: [OpFacts; OP_COUNT] = build();

const fn build() -> [OpFacts; OP_COUNT] {
    let mut table = [OpFacts::ELEMENTWISE; OP_COUNT];
    let mut i = 0;
    while i < PRODUCTS.len() {
        table[PRODUCTS[i].index()].product = true;
        if let Macs::None = table[PRODUCTS[i].index()].macs {
            table[PRODUCTS[i].index()].macs = Macs::Product;
        }
        i += 1;
    }
    i = 0;
    while i < ROW_PRODUCTS.len() {
        let (op, operand) = ROW_PRODUCTS[i];
        table[op.index()].macs = Macs::RowsOf(operand);
        i += 1;
    }
    i = 0;
    while i < NOT_REPLAYABLE.len() {
        table[NOT_REPLAYABLE[i].index()].replayable = false;
        i += 1;
    }
    i = 0;
    while i < PARAM_GRADS.len() {
        table[PARAM_GRADS[i].index()].gives_param_grad = true;
        i += 1;
    }
    let classes: [(&[OpId], OpPrecision); 3] = [
        (AUTOCAST_LOW, OpPrecision::Low),
        (AUTOCAST_F32, OpPrecision::F32),
        (AUTOCAST_KEEP, OpPrecision::Keep),
    ];
    let mut c = 0;
    while c < classes.len() {
        let (ops, class) = classes[c];
        i = 0;
        while i < ops.len() {
            table[ops[i].index()].autocast = class;
            i += 1;
        }
        c += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    //! The table against the name predicates it replaced, for every forwarded method.

    use super::*;

    fn old_is_product(op: &str) -> bool {
        op.contains("matmul")
            || op.contains("conv")
            || op.contains("attention")
            || op.contains("linear")
    }

    fn old_replayable(name: &str) -> bool {
        !(name.ends_with("_random") || name.ends_with("_empty") || name.ends_with("_from_data"))
    }

    fn old_gives_parameter_gradient(name: &str) -> bool {
        name.ends_with("_weight_backward") || name.ends_with("_bias_backward")
    }

    const OLD_LOW: &[&str] = &[
        "float_matmul",
        "linear",
        "linear_x_backward",
        "linear_weight_backward",
        "conv1d",
        "conv1d_x_backward",
        "conv1d_weight_backward",
        "conv2d",
        "conv2d_x_backward",
        "conv2d_weight_backward",
        "conv3d",
        "conv3d_x_backward",
        "conv3d_weight_backward",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "attention",
    ];
    const OLD_F32: &[&str] = &[
        "float_exp",
        "float_log",
        "float_log1p",
        "float_recip",
        "float_powf",
        "float_powi",
        "float_powi_scalar",
        "float_powi_scalar_impl",
        "float_powf_scalar",
        "float_powf_scalar_impl",
        "float_sum",
        "float_sum_dim",
        "float_mean",
        "float_mean_dim",
        "float_prod",
        "float_prod_dim",
        "float_cumsum",
        "float_cumprod",
        "float_acos",
        "float_asin",
        "float_cosh",
        "float_sinh",
        "float_tan",
        "float_erf",
        "log_sigmoid",
        "log_sigmoid_backward",
        "linear_bias_backward",
        "conv1d_bias_backward",
        "conv2d_bias_backward",
        "conv3d_bias_backward",
    ];
    const OLD_KEEP: &[&str] = &[
        "float_cast",
        "float_into_int",
        "float_to_device",
        "float_into_data",
        "float_is_nan",
        "float_is_inf",
    ];

    fn old_macs(name: &str) -> Macs {
        match name {
            "float_matmul" | "int_matmul" | "linear" | "linear_weight_backward" => Macs::RowsOf(0),
            "linear_x_backward" => Macs::RowsOf(2),
            _ if old_is_product(name) => Macs::Product,
            _ => Macs::None,
        }
    }

    #[test]
    fn the_table_agrees_with_the_name_predicates_for_every_method() {
        let methods = crate::vocabulary::forwarded_methods();
        assert_eq!(methods.len(), OP_COUNT);
        for (index, (_, name)) in methods.iter().enumerate() {
            let facts = OpId::from_index(index).facts();
            assert_eq!(facts.product, old_is_product(name), "product: {name}");
            assert_eq!(facts.replayable, old_replayable(name), "replayable: {name}");
            assert_eq!(
                facts.gives_param_grad,
                old_gives_parameter_gradient(name),
                "param grad: {name}"
            );
            assert_eq!(facts.macs, old_macs(name), "macs: {name}");
            let class = if OLD_LOW.contains(name) {
                OpPrecision::Low
            } else if OLD_F32.contains(name) {
                OpPrecision::F32
            } else if OLD_KEEP.contains(name) {
                OpPrecision::Keep
            } else {
                OpPrecision::Promote
            };
            assert_eq!(facts.autocast, class, "autocast: {name}");
        }
    }

    #[test]
    fn ids_and_names_round_trip() {
        for (index, (family, name)) in crate::vocabulary::forwarded_methods()
            .into_iter()
            .enumerate()
        {
            let op = OpId::from_index(index);
            assert_eq!((op.family(), op.name()), (family, name));
            assert_eq!(OpId::by_name(name), Some(op));
        }
        assert_eq!(f(float::Op::float_matmul).name(), "float_matmul");
    }
}
