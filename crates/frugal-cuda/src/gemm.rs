//! The shape side of matrix products on cuBLASLt (`frugal_cuda::matmul`, feature `cuda`):
//! operands described by their strides, how Burn's products ([`Product`]) become one
//! strided-batched GEMM ([`plan`]), and how a row-major product maps onto the column-major
//! library. Pure arithmetic, tested without a GPU.
//!
//! cuBLASLt is column-major; Burn's tensors are row-major. A row-major `out = lhs · rhs`
//! (`m × n`) is the column-major `outᵀ = rhsᵀ · lhsᵀ`, so the library's first operand is `rhs`
//! and its second `lhs`. An operand stored transposed (a `swap_dims` view) is passed with the
//! library's transpose flag instead of being copied.

/// The element type of a product's operands and output (accumulation is always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmDtype {
    /// f32; strict IEEE products unless the call asks for TF32.
    F32,
    /// f16.
    F16,
    /// bf16.
    BF16,
}

impl GemmDtype {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            GemmDtype::F32 => 4,
            GemmDtype::F16 | GemmDtype::BF16 => 2,
        }
    }
}

/// How one operand's matrices lie in memory, in elements: element `(r, c)` of batch `b` is at
/// `b · batch_stride + r · row_stride + c · col_stride`. One of the two matrix strides must be
/// 1 (row-major or column-major); `batch_stride` 0 repeats one matrix for every batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixLayout {
    /// Rows of one matrix.
    pub rows: usize,
    /// Columns of one matrix.
    pub cols: usize,
    /// Elements between consecutive rows.
    pub row_stride: usize,
    /// Elements between consecutive columns.
    pub col_stride: usize,
    /// Elements between consecutive matrices of the batch (0: broadcast).
    pub batch_stride: usize,
}

/// A matrix as cuBLASLt takes it: column-major storage of `rows × cols` with leading
/// dimension `ld`, and whether the product uses its transpose.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Stored {
    pub(crate) rows: u64,
    pub(crate) cols: u64,
    pub(crate) ld: i64,
    pub(crate) transpose: bool,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl MatrixLayout {
    /// The layout as the library's operand for `self`'s matrix (`transpose == false`) in the
    /// column-major world, where the row-major matrix `X` is seen as `Xᵀ`: a row-major `X`
    /// is stored as the column-major `Xᵀ` (no transpose needed to use `Xᵀ`); a column-major
    /// `X` is stored as `X`, used transposed.
    fn stored(&self) -> Option<Stored> {
        let (r, c) = (self.rows, self.cols);
        let row_major = self.col_stride == 1 || c == 1;
        let col_major = self.row_stride == 1 || r == 1;
        if row_major && (r == 1 || self.row_stride >= c) {
            let ld = if r == 1 { c } else { self.row_stride };
            Some(Stored {
                rows: c as u64,
                cols: r as u64,
                ld: ld.max(1) as i64,
                transpose: false,
            })
        } else if col_major && (c == 1 || self.col_stride >= r) {
            let ld = if c == 1 { r } else { self.col_stride };
            Some(Stored {
                rows: r as u64,
                cols: c as u64,
                ld: ld.max(1) as i64,
                transpose: true,
            })
        } else {
            None
        }
    }
}

/// One product `out[b] = lhs[b] · rhs[b]` for `b < batch`: `lhs` is `m × k`, `rhs` `k × n`,
/// `out` row-major contiguous `[batch, m, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Matrices in the batch.
    pub batch: usize,
    /// Rows of `lhs` and `out`.
    pub m: usize,
    /// Columns of `rhs` and `out`.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// The left operand's layout (`m × k`).
    pub lhs: MatrixLayout,
    /// The right operand's layout (`k × n`).
    pub rhs: MatrixLayout,
    /// Operand and output type.
    pub dtype: GemmDtype,
    /// f32 products on TF32 tensor cores (10-bit mantissa), as PyTorch's
    /// `allow_tf32`; ignored for f16 and bf16.
    pub tf32: bool,
}

/// Why a product did not run on cuBLASLt (the caller then uses CubeCL's kernels).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GemmError {
    /// `libcublasLt` could not be loaded.
    Unavailable(String),
    /// The shapes or layouts are not a product the library takes as they are.
    Layout(String),
    /// The library refused the call (no algorithm, bad argument).
    Library(String),
}

impl std::fmt::Display for GemmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GemmError::Unavailable(why) => write!(f, "cuBLASLt is not available: {why}"),
            GemmError::Layout(why) => write!(f, "product not taken by cuBLASLt: {why}"),
            GemmError::Library(why) => write!(f, "cuBLASLt refused the product: {why}"),
        }
    }
}

impl std::error::Error for GemmError {}

/// The stored layouts of the library's operands A (= `rhs`), B (= `lhs`) and D (= `out`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn stored(shape: &GemmShape) -> Result<[Stored; 3], GemmError> {
    let check = |name: &str, layout: &MatrixLayout, rows: usize, cols: usize| {
        if layout.rows != rows || layout.cols != cols {
            return Err(GemmError::Layout(format!(
                "{name} is {}×{}, the product needs {rows}×{cols}",
                layout.rows, layout.cols
            )));
        }
        layout.stored().ok_or_else(|| {
            GemmError::Layout(format!(
                "{name}'s strides (row {}, column {}) are neither row- nor column-major",
                layout.row_stride, layout.col_stride
            ))
        })
    };
    let a = check("rhs", &shape.rhs, shape.k, shape.n)?;
    let b = check("lhs", &shape.lhs, shape.m, shape.k)?;
    let d = Stored {
        rows: shape.n as u64,
        cols: shape.m as u64,
        ld: shape.n.max(1) as i64,
        transpose: false,
    };
    Ok([a, b, d])
}

/// The largest power of two (up to 256) dividing a device address: the alignment the
/// algorithm may assume.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn alignment(address: u64) -> u32 {
    (address & address.wrapping_neg()).clamp(1, 256) as u32
}

/// A Burn product, as Frugal dispatches it (`frugal::kernels`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// `float_matmul(lhs, rhs)`: `[..batch, m, k] · [..batch, k, n]`, batches broadcast.
    Matmul,
    /// `linear(x, weight, _)` without its bias: `x[.., k] · weight[k, n]` over all of x's rows.
    Linear,
    /// `linear_x_backward(weight, grad)`: `grad[.., n] · weight[k, n]ᵀ`.
    LinearX,
    /// `linear_weight_backward(x, grad)`: `x[.., k]ᵀ · grad[.., n]` summed over the rows.
    LinearWeight,
}

/// The output shape of `product` on operands of these shapes, if Frugal takes it (`None`: not a
/// product taken here; Burn's own op then runs, with its checks and messages).
pub fn output_shape(product: Product, shapes: &[&[usize]]) -> Option<Vec<usize>> {
    match product {
        Product::Matmul => {
            let (l, r) = (shapes[0], shapes[1]);
            let d = l.len();
            if d < 2 || r.len() != d || l[d - 1] != r[d - 2] {
                return None;
            }
            let mut out = Vec::with_capacity(d);
            for i in 0..d - 2 {
                out.push(match (l[i], r[i]) {
                    (a, b) if a == b => a,
                    (1, b) => b,
                    (a, 1) => a,
                    _ => return None,
                });
            }
            out.extend([l[d - 2], r[d - 1]]);
            Some(out)
        }
        Product::Linear => {
            let (x, w) = (shapes[0], shapes[1]);
            if x.is_empty() || w.len() != 2 || x[x.len() - 1] != w[0] {
                return None;
            }
            let mut out = x.to_vec();
            *out.last_mut()? = w[1];
            Some(out)
        }
        Product::LinearX => {
            let (w, g) = (shapes[0], shapes[1]);
            if g.is_empty() || w.len() != 2 || g[g.len() - 1] != w[1] {
                return None;
            }
            let mut out = g.to_vec();
            *out.last_mut()? = w[0];
            Some(out)
        }
        Product::LinearWeight => {
            let (x, g) = (shapes[0], shapes[1]);
            if x.is_empty() || x.len() != g.len() || x[..x.len() - 1] != g[..g.len() - 1] {
                return None;
            }
            Some(vec![x[x.len() - 1], g[g.len() - 1]])
        }
    }
}

/// A tensor's leading dimensions as one: `(rows, row stride)` of the matrix whose columns
/// are the last dimension, if the leading dimensions collapse into one stride.
fn rows_of(shape: &[usize], strides: &[usize]) -> Option<(usize, usize)> {
    let d = shape.len();
    let rows: usize = shape[..d - 1].iter().product();
    let mut stride = None;
    for i in (0..d - 1).rev() {
        if shape[i] == 1 {
            continue;
        }
        match stride {
            None => stride = Some((strides[i], shape[i])),
            Some((inner, extent)) => {
                if strides[i] != inner * extent {
                    return None;
                }
                stride = Some((strides[i], shape[i]));
            }
        }
    }
    // The innermost non-unit leading dimension's stride; any value ≥ the columns when
    // there is one row.
    let row_stride = (0..d - 1)
        .rev()
        .find(|&i| shape[i] != 1)
        .map(|i| strides[i])
        .unwrap_or(shape[d - 1]);
    Some((rows, row_stride))
}

/// A matmul operand's batch stride over the output's batch dimensions: 0 where it is
/// broadcast in every one of them, one stride where they collapse, `None` otherwise.
fn batch_stride(shape: &[usize], strides: &[usize], out_batch: &[usize]) -> Option<usize> {
    let mut broadcast = 0;
    // The innermost full dimension's stride is the batch stride; each outer one must continue
    // it (`(stride, extent)` of the last dimension seen, going outwards).
    let mut innermost = None;
    let mut last: Option<(usize, usize)> = None;
    for i in (0..out_batch.len()).rev() {
        if out_batch[i] == 1 {
            continue;
        }
        if shape[i] == 1 {
            broadcast += 1;
            continue;
        }
        if let Some((inner, extent)) = last
            && strides[i] != inner * extent
        {
            return None;
        }
        innermost.get_or_insert(strides[i]);
        last = Some((strides[i], shape[i]));
    }
    match (broadcast, innermost) {
        (_, None) => Some(0),
        (0, stride) => stride,
        _ => None,
    }
}

/// `product` on tensors with these shapes and strides (in elements), as one strided-batched
/// GEMM; `None` where an operand's dimensions do not collapse into one stride.
pub fn plan(
    product: Product,
    shapes: &[&[usize]],
    strides: &[&[usize]],
    dtype: GemmDtype,
    tf32: bool,
) -> Option<GemmShape> {
    let matrix = |rows, cols, row_stride, col_stride, batch_stride| MatrixLayout {
        rows,
        cols,
        row_stride,
        col_stride,
        batch_stride,
    };
    let shape = |batch, m, n, k, lhs, rhs| GemmShape {
        batch,
        m,
        n,
        k,
        lhs,
        rhs,
        dtype,
        tf32,
    };
    let last = |s: &[usize]| s[s.len() - 1];
    match product {
        Product::Matmul => {
            let (ls, rs) = (shapes[0], shapes[1]);
            let (lt, rt) = (strides[0], strides[1]);
            let d = ls.len();
            let out = output_shape(product, shapes)?;
            let out_batch = &out[..d - 2];
            let batch: usize = out_batch.iter().product();
            let (m, k, n) = (ls[d - 2], ls[d - 1], rs[d - 1]);
            let lb = batch_stride(ls, lt, out_batch)?;
            let rb = batch_stride(rs, rt, out_batch)?;
            let lhs = matrix(m, k, lt[d - 2], lt[d - 1], lb);
            let rhs = matrix(k, n, rt[d - 2], rt[d - 1], rb);
            // A batch over one shared right operand whose left rows run on from one matrix
            // to the next is a single taller product.
            if batch > 1 && rb == 0 && lt[d - 1] == 1 && (m == 1 || lb == m * lt[d - 2]) {
                let lhs = matrix(batch * m, k, if m == 1 { lb } else { lt[d - 2] }, 1, 0);
                return Some(shape(1, batch * m, n, k, lhs, rhs));
            }
            Some(shape(batch, m, n, k, lhs, rhs))
        }
        Product::Linear => {
            // out[M, n] = x[M, k] · w[k, n]
            let (xs, ws) = (shapes[0], shapes[1]);
            let (xt, wt) = (strides[0], strides[1]);
            let (rows, row_stride) = rows_of(xs, xt)?;
            let (k, n) = (ws[0], ws[1]);
            let lhs = matrix(rows, k, row_stride, last(xt), 0);
            let rhs = matrix(k, n, wt[0], wt[1], 0);
            Some(shape(1, rows, n, k, lhs, rhs))
        }
        Product::LinearX => {
            // dx[M, k] = g[M, n] · wᵀ[n, k]
            let (ws, gs) = (shapes[0], shapes[1]);
            let (wt, gt) = (strides[0], strides[1]);
            let (rows, row_stride) = rows_of(gs, gt)?;
            let (k, n) = (ws[0], ws[1]);
            let lhs = matrix(rows, n, row_stride, last(gt), 0);
            let rhs = matrix(n, k, wt[1], wt[0], 0);
            Some(shape(1, rows, k, n, lhs, rhs))
        }
        Product::LinearWeight => {
            // dw[k, n] = xᵀ[k, M] · g[M, n]
            let (xs, gs) = (shapes[0], shapes[1]);
            let (xt, gt) = (strides[0], strides[1]);
            let (rows, x_row) = rows_of(xs, xt)?;
            let (_, g_row) = rows_of(gs, gt)?;
            let (k, n) = (last(xs), last(gs));
            let lhs = matrix(k, rows, last(xt), x_row, 0);
            let rhs = matrix(rows, n, g_row, last(gt), 0);
            Some(shape(1, k, n, rows, lhs, rhs))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(rows: usize, cols: usize, rs: usize, cs: usize) -> MatrixLayout {
        MatrixLayout {
            rows,
            cols,
            row_stride: rs,
            col_stride: cs,
            batch_stride: rows * cols,
        }
    }

    #[test]
    fn row_major_is_stored_as_its_transpose() {
        let s = layout(3, 5, 5, 1).stored().unwrap();
        assert_eq!((s.rows, s.cols, s.ld, s.transpose), (5, 3, 5, false));
        // A padded row.
        let s = layout(3, 5, 8, 1).stored().unwrap();
        assert_eq!((s.rows, s.cols, s.ld, s.transpose), (5, 3, 8, false));
    }

    #[test]
    fn column_major_is_used_transposed() {
        // The transpose view of a contiguous 5×3 matrix.
        let s = layout(3, 5, 1, 3).stored().unwrap();
        assert_eq!((s.rows, s.cols, s.ld, s.transpose), (3, 5, 3, true));
    }

    #[test]
    fn vectors_take_either_stride() {
        // One row whose row stride is meaningless.
        let s = layout(1, 4, 0, 1).stored().unwrap();
        assert_eq!((s.rows, s.cols, s.ld), (4, 1, 4));
        // One column with a column stride of 0.
        let s = layout(4, 1, 1, 0).stored().unwrap();
        assert_eq!((s.rows, s.cols, s.ld), (1, 4, 1));
    }

    #[test]
    fn other_strides_are_refused() {
        assert!(layout(3, 5, 10, 2).stored().is_none());
        // Overlapping rows.
        assert!(layout(3, 5, 2, 1).stored().is_none());
    }

    #[test]
    fn operands_must_match_the_product() {
        let shape = GemmShape {
            batch: 1,
            m: 3,
            n: 4,
            k: 5,
            lhs: layout(3, 5, 5, 1),
            rhs: layout(5, 4, 1, 5),
            dtype: GemmDtype::F32,
            tf32: false,
        };
        let [a, b, d] = stored(&shape).unwrap();
        assert!(a.transpose && !b.transpose);
        assert_eq!((d.rows, d.cols, d.ld), (4, 3, 4));
        let wrong = GemmShape { k: 6, ..shape };
        assert!(matches!(stored(&wrong), Err(GemmError::Layout(_))));
    }

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0x1000), 256);
        assert_eq!(alignment(0x1004), 4);
        assert_eq!(alignment(0x1010), 16);
    }

    fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
        let mut strides = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        strides
    }

    #[test]
    fn a_linear_layer_is_one_product_over_all_rows() {
        let x = [8, 512, 768];
        let w = [768, 3072];
        let (xt, wt) = (contiguous_strides(&x), contiguous_strides(&w));
        let g = plan(
            Product::Linear,
            &[&x, &w],
            &[&xt, &wt],
            GemmDtype::BF16,
            false,
        )
        .unwrap();
        assert_eq!((g.batch, g.m, g.n, g.k), (1, 4096, 3072, 768));
        assert_eq!((g.lhs.row_stride, g.lhs.col_stride), (768, 1));
    }

    #[test]
    fn the_weight_gradient_contracts_over_every_row() {
        let x = [8, 512, 768];
        let g = [8, 512, 3072];
        let (xt, gt) = (contiguous_strides(&x), contiguous_strides(&g));
        let p = plan(
            Product::LinearWeight,
            &[&x, &g],
            &[&xt, &gt],
            GemmDtype::F32,
            false,
        )
        .unwrap();
        assert_eq!((p.batch, p.m, p.n, p.k), (1, 768, 3072, 4096));
        // xᵀ: column-major view of x.
        assert_eq!((p.lhs.row_stride, p.lhs.col_stride), (1, 768));
        assert_eq!(
            output_shape(Product::LinearWeight, &[&x, &g]),
            Some(vec![768, 3072])
        );
    }

    #[test]
    fn a_transposed_operand_is_not_copied() {
        // q · kᵀ with kᵀ a swap_dims view of a contiguous [2, 3, 5, 4] tensor.
        let q = [2, 3, 5, 4];
        let kt = [2, 3, 4, 5];
        let kt_strides = [60, 20, 1, 4];
        let p = plan(
            Product::Matmul,
            &[&q, &kt],
            &[&contiguous_strides(&q), &kt_strides],
            GemmDtype::F32,
            false,
        )
        .unwrap();
        assert_eq!((p.batch, p.m, p.n, p.k), (6, 5, 5, 4));
        assert_eq!(
            (p.rhs.row_stride, p.rhs.col_stride, p.rhs.batch_stride),
            (1, 4, 20)
        );
    }

    #[test]
    fn a_shared_right_operand_folds_the_batch_into_rows() {
        let l = [4, 6, 8];
        let r = [1, 8, 3];
        let p = plan(
            Product::Matmul,
            &[&l, &r],
            &[&contiguous_strides(&l), &contiguous_strides(&r)],
            GemmDtype::F32,
            false,
        )
        .unwrap();
        assert_eq!((p.batch, p.m, p.n, p.k), (1, 24, 3, 8));
    }

    #[test]
    fn mixed_broadcast_batches_are_refused() {
        // Broadcast in one batch dimension, not in the other.
        let l = [2, 3, 4, 4];
        let r = [1, 3, 4, 4];
        let rt = contiguous_strides(&r);
        assert_eq!(batch_stride(&r, &rt, &[2, 3]), None);
        assert_eq!(
            batch_stride(&[1, 1, 4, 4], &[16, 16, 4, 1], &[2, 3]),
            Some(0)
        );
        assert_eq!(batch_stride(&l, &contiguous_strides(&l), &[2, 3]), Some(16));
        assert!(output_shape(Product::Matmul, &[&[2, 4, 5], &[3, 5, 4]]).is_none());
    }

    #[test]
    fn leading_dimensions_must_collapse() {
        // A [2, 3, 4] view whose batch rows are not evenly spaced.
        assert_eq!(rows_of(&[2, 3, 4], &[20, 4, 1]), None);
        assert_eq!(rows_of(&[2, 3, 4], &[12, 4, 1]), Some((6, 4)));
        assert_eq!(rows_of(&[4], &[1]), Some((1, 4)));
        assert_eq!(rows_of(&[1, 3, 4], &[99, 4, 1]), Some((3, 4)));
    }
}
