//! Frugal's own CubeCL kernels (crate `frugal-kernels`) in place of the inner backend's ops,
//! for inner backends built on a CubeCL runtime this build knows (features `cuda`, `wgpu`),
//! with Burn's fusion on or off.
//!
//! Which inner backend runs is found from the tensor primitive's type at run time (a type id
//! comparison, no allocation), so `Frugal<B>` stays generic: for any other backend (NdArray,
//! Flex, ...) and for layouts the kernels do not take (strided views), Frugal calls the inner
//! backend's own op, which gives the same bits (the kernels are tested bit for bit against
//! Burn's cast).
//!
//! Where they are used:
//! - **casts** between f32, f16 and bf16 (`float_cast`: autocast's casts and the user's own),
//!   vectorised;
//! - **compressed storage** (the budget's `Compress` action and the cast back on a read);
//! - **[`crate::GradScaler::unscale`]**: one fused unscale-and-check launch per group of f32
//!   gradients with the found-inf flag kept on the device, and the fused widen-and-scale cast
//!   for 16-bit gradients.
//!
//! Under fusion, a Frugal kernel is a custom operation, which ends the fused block before it:
//! a cast that Burn's fusion would fold into the neighbouring element-wise kernel is cheaper
//! left to Burn. So by default ([`KernelMode::Auto`]) casts on a fused backend stay Burn's and
//! everything else uses Frugal's kernels; [`KernelMode::Always`] and [`KernelMode::Never`]
//! override that (e.g. to compare them).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

use burn_backend::{Backend, FloatDType};

/// When Frugal runs its own kernels rather than the inner backend's ops (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelMode {
    /// Frugal's kernels everywhere except casts on a fused backend (which fusion folds into
    /// neighbouring kernels).
    #[default]
    Auto,
    /// Frugal's kernels wherever the primitive is a CubeCL one, fused or not.
    Always,
    /// Never: always the inner backend's own ops.
    Never,
}

static MODE: AtomicU8 = AtomicU8::new(0);

/// Sets when Frugal uses its own kernels, for every device (default [`KernelMode::Auto`]).
pub fn set_mode(mode: KernelMode) {
    MODE.store(
        match mode {
            KernelMode::Auto => 0,
            KernelMode::Always => 1,
            KernelMode::Never => 2,
        },
        Relaxed,
    );
}

/// The current [`KernelMode`].
pub fn mode() -> KernelMode {
    match MODE.load(Relaxed) {
        1 => KernelMode::Always,
        2 => KernelMode::Never,
        _ => KernelMode::Auto,
    }
}

/// How many times each of Frugal's kernels ran, since the process started (all devices).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Casts run by Frugal's cast kernel.
    pub casts: u64,
    /// Of those, run as a custom operation of Burn's fusion.
    pub fused_casts: u64,
    /// Widening casts fused with a scale (16-bit gradients unscaled).
    pub scaled_casts: u64,
    /// Launches of the fused unscale-and-check kernel.
    pub unscale_launches: u64,
    /// Gradients unscaled by those launches.
    pub unscaled_tensors: u64,
}

static CASTS: AtomicU64 = AtomicU64::new(0);
static FUSED_CASTS: AtomicU64 = AtomicU64::new(0);
static SCALED_CASTS: AtomicU64 = AtomicU64::new(0);
static UNSCALE_LAUNCHES: AtomicU64 = AtomicU64::new(0);
static UNSCALED_TENSORS: AtomicU64 = AtomicU64::new(0);

/// Reads the [`KernelStats`] counters.
pub fn stats() -> KernelStats {
    KernelStats {
        casts: CASTS.load(Relaxed),
        fused_casts: FUSED_CASTS.load(Relaxed),
        scaled_casts: SCALED_CASTS.load(Relaxed),
        unscale_launches: UNSCALE_LAUNCHES.load(Relaxed),
        unscaled_tensors: UNSCALED_TENSORS.load(Relaxed),
    }
}

/// Why a cast is made, which decides whether Frugal's kernel is worth it under fusion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CastPurpose {
    /// An op's cast (autocast or the user's): fusable with its neighbours.
    Op,
    /// Compressing a tensor at rest or restoring it: a lone pass over the buffer.
    Storage,
}

/// `B::float_cast`, run by Frugal's kernel when the mode and the primitive allow it.
pub(crate) fn float_cast<B: Backend>(
    tensor: B::FloatTensorPrimitive,
    dtype: FloatDType,
) -> B::FloatTensorPrimitive {
    cast_for::<B>(tensor, dtype, CastPurpose::Op)
}

/// `B::float_cast` for `purpose`.
pub(crate) fn cast_for<B: Backend>(
    tensor: B::FloatTensorPrimitive,
    dtype: FloatDType,
    purpose: CastPurpose,
) -> B::FloatTensorPrimitive {
    let mode = mode();
    if mode == KernelMode::Never {
        return B::float_cast(tensor, dtype);
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        let mut slot = Some(tensor);
        if cube::try_cast(&mut slot, burn_backend::DType::from(dtype), mode, purpose) {
            return slot.expect("the cast put its output back");
        }
        B::float_cast(slot.expect("untouched when not cast"), dtype)
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = purpose;
        B::float_cast(tensor, dtype)
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub(crate) mod cube {
    //! The CubeCL side: downcasts of the primitive, the kernels' launches, and the fusion
    //! custom operation.

    use std::any::Any;
    use std::marker::PhantomData;

    use burn_backend::{DType, FloatDType, ops::FloatTensorOps};
    use burn_cubecl::{CubeBackend, CubeRuntime, fusion::FusionCubeRuntime, tensor::CubeTensor};
    use burn_fusion::{
        FusionRuntime, FusionTensor,
        stream::{Operation, OperationStreams},
    };
    use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
    use frugal_kernels::FloatDtype;

    use crate::FrugalTensor;

    use super::*;

    /// The `frugal-kernels` dtype of a Burn dtype, if the kernels take it.
    fn kernel_dtype(dtype: DType) -> Option<FloatDtype> {
        match dtype {
            DType::F32 => Some(FloatDtype::F32),
            DType::F16 => Some(FloatDtype::F16),
            DType::BF16 => Some(FloatDtype::BF16),
            _ => None,
        }
    }

    /// A CubeCL backend whose float primitive is `CubeTensor<R>` whatever its element types
    /// (tensors carry their dtype), used to move tensors in and out of fusion's handles.
    type Cube<R> = CubeBackend<R, f32, i32, u8>;

    /// Casts `slot`'s tensor into `dtype` with Frugal's kernel if it is a CubeCL primitive of
    /// a known runtime and `mode`/`purpose` allow; `true` when done (the output is in `slot`).
    pub(crate) fn try_cast<P: Any>(
        slot: &mut Option<P>,
        dtype: DType,
        mode: KernelMode,
        purpose: CastPurpose,
    ) -> bool {
        let any = slot as &mut dyn Any;
        #[cfg(feature = "cuda")]
        if let Some(done) = try_cast_on::<cubecl::cuda::CudaRuntime>(any, dtype, mode, purpose) {
            return done;
        }
        #[cfg(feature = "wgpu")]
        if let Some(done) = try_cast_on::<cubecl::wgpu::WgpuRuntime>(any, dtype, mode, purpose) {
            return done;
        }
        let _ = (any, dtype, mode, purpose);
        false
    }

    /// `None` if the primitive is not `R`'s; else whether it was cast.
    fn try_cast_on<R: CubeRuntime>(
        any: &mut dyn Any,
        dtype: DType,
        mode: KernelMode,
        purpose: CastPurpose,
    ) -> Option<bool> {
        if let Some(slot) = any.downcast_mut::<Option<CubeTensor<R>>>() {
            let tensor = slot.as_ref().expect("a tensor to cast");
            let Some(out) = cast_direct(tensor, dtype) else {
                return Some(false);
            };
            *slot = Some(out);
            return Some(true);
        }
        let slot = any.downcast_mut::<Option<FusionTensor<FusionCubeRuntime<R>>>>()?;
        if mode == KernelMode::Auto && purpose == CastPurpose::Op {
            return Some(false);
        }
        let tensor = slot.as_ref().expect("a tensor to cast");
        if !castable(tensor.dtype, dtype) {
            return Some(false);
        }
        let tensor = slot.take().expect("checked");
        *slot = Some(cast_fused(tensor, dtype));
        Some(true)
    }

    /// Whether the kernels take a cast from `from` to `to` (a same-type cast is left to the
    /// backend, which returns the tensor itself).
    fn castable(from: DType, to: DType) -> bool {
        from != to && kernel_dtype(from).is_some() && kernel_dtype(to).is_some()
    }

    /// Casts a contiguous `CubeTensor` with Frugal's kernel; `None` if the kernel does not
    /// apply (layout, dtypes, device support, length).
    pub(crate) fn cast_direct<R: CubeRuntime>(
        tensor: &CubeTensor<R>,
        dtype: DType,
    ) -> Option<CubeTensor<R>> {
        let (Some(from), Some(to)) = (kernel_dtype(tensor.dtype), kernel_dtype(dtype)) else {
            return None;
        };
        if from == to || !tensor.is_contiguous() {
            return None;
        }
        let shape = tensor.meta.shape().clone();
        let len = shape.num_elements();
        let handle = frugal_kernels::cast(&tensor.client, &tensor.handle, len, from, to).ok()?;
        CASTS.fetch_add(1, Relaxed);
        Some(CubeTensor::new_contiguous(
            tensor.client.clone(),
            tensor.device.clone(),
            shape,
            handle,
            dtype,
        ))
    }

    /// Registers the cast as a custom operation of the fusion stream: it runs when the stream
    /// is flushed, on the `CubeTensor` fusion holds by then.
    fn cast_fused<R: CubeRuntime>(
        tensor: FusionTensor<FusionCubeRuntime<R>>,
        dtype: DType,
    ) -> FusionTensor<FusionCubeRuntime<R>> {
        let client = tensor.client.clone();
        let streams = OperationStreams::with_inputs([&tensor]);
        let output = TensorIr::uninit(client.create_empty_handle(), tensor.shape.clone(), dtype);
        let desc = CustomOpIr::new("frugal_cast", &[tensor.into_ir()], &[output]);
        FUSED_CASTS.fetch_add(1, Relaxed);
        client
            .register(
                streams,
                OperationIr::Custom(desc.clone()),
                FusedCast::<R> {
                    desc,
                    dtype,
                    _runtime: PhantomData,
                },
            )
            .into_iter()
            .next()
            .expect("one output")
    }

    /// The fusion custom operation of [`cast_fused`].
    #[derive(Debug)]
    struct FusedCast<R> {
        desc: CustomOpIr,
        dtype: DType,
        _runtime: PhantomData<fn() -> R>,
    }

    impl<R: CubeRuntime> Operation<FusionCubeRuntime<R>> for FusedCast<R> {
        fn execute(
            &self,
            handles: &mut HandleContainer<<FusionCubeRuntime<R> as FusionRuntime>::FusionHandle>,
        ) {
            let ([input], [output]) = self.desc.as_fixed();
            let tensor = handles.get_float_tensor::<Cube<R>>(input);
            // A strided input (fusion may hand back a view) goes through CubeCL's own cast.
            let out = cast_direct(&tensor, self.dtype)
                .unwrap_or_else(|| Cube::<R>::float_cast(tensor, FloatDType::from(self.dtype)));
            handles.register_float_tensor::<Cube<R>>(&output.id, out);
        }
    }

    /// See [`super::unscale`].
    pub(crate) fn unscale<B, M>(
        module: &M,
        grads: &mut burn_optim::GradientsParams,
        inv_scale: f32,
    ) -> Option<bool>
    where
        B: burn_core::tensor::backend::AutodiffBackend,
        M: burn_core::module::AutodiffModule<B>,
    {
        // Every gradient in the parameter's type (f32), as the optimizer will read it.
        let mut taken = Take::<B> {
            grads,
            ids: Vec::new(),
            prims: Vec::new(),
        };
        module.visit(&mut taken);
        let Take { grads, ids, prims } = taken;
        let mut prims = Some(prims);
        let found = unscale_any(&mut prims, inv_scale);
        let mut put = Put::<B, _, _> {
            grads,
            ids: ids.into_iter().peekable(),
            prims: prims.expect("given back").into_iter(),
            _backend: PhantomData,
        };
        module.visit(&mut put);
        found
    }

    /// Takes each parameter's gradient out of `grads`, in the parameter's type or, for an f32
    /// parameter, possibly 16-bit (widened by the unscale).
    struct Take<'a, B: burn_core::tensor::backend::AutodiffBackend> {
        grads: &'a mut burn_optim::GradientsParams,
        ids: Vec<burn_core::module::ParamId>,
        prims: Vec<<B::InnerBackend as burn_backend::BackendTypes>::FloatTensorPrimitive>,
    }

    impl<B: burn_core::tensor::backend::AutodiffBackend> burn_core::module::ModuleVisitor<B>
        for Take<'_, B>
    {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn_core::module::Param<burn_core::tensor::Tensor<B, D>>,
        ) {
            let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
                return;
            };
            let dtype = param.val().dtype();
            // A 16-bit gradient of an f32 parameter is widened by the fused scaled cast; any
            // other mismatch is cast as `precision::match_param_dtypes` does.
            let widened_by_kernel =
                dtype == DType::F32 && matches!(grad.dtype(), DType::F16 | DType::BF16);
            let grad = if grad.dtype() == dtype || widened_by_kernel {
                grad
            } else {
                grad.cast(dtype)
            };
            self.ids.push(param.id);
            self.prims.push(grad.into_primitive().tensor());
        }
    }

    /// Puts the gradients taken by [`Take`] back, in the same visiting order.
    struct Put<'a, B, I: Iterator, P> {
        grads: &'a mut burn_optim::GradientsParams,
        ids: std::iter::Peekable<I>,
        prims: P,
        _backend: PhantomData<B>,
    }

    impl<B, I, P> burn_core::module::ModuleVisitor<B> for Put<'_, B, I, P>
    where
        B: burn_core::tensor::backend::AutodiffBackend,
        I: Iterator<Item = burn_core::module::ParamId>,
        P: Iterator<Item = <B::InnerBackend as burn_backend::BackendTypes>::FloatTensorPrimitive>,
    {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn_core::module::Param<burn_core::tensor::Tensor<B, D>>,
        ) {
            // Parameters without a gradient were skipped by `Take`, so ids come in order.
            if self.ids.peek() != Some(&param.id) {
                return;
            }
            let id = self.ids.next().expect("peeked");
            let prim = self.prims.next().expect("one primitive per id");
            let grad = burn_core::tensor::Tensor::<B::InnerBackend, D>::from_primitive(
                burn_backend::TensorPrimitive::Float(prim),
            );
            self.grads.register(id, grad);
        }
    }

    /// Runs the fused unscale over `prims` if they are all tensors of one known runtime;
    /// `None` (untouched) otherwise.
    fn unscale_any<P: Any>(prims: &mut Option<Vec<P>>, inv_scale: f32) -> Option<bool> {
        let any = prims as &mut dyn Any;
        #[cfg(feature = "cuda")]
        if let Some(found) = unscale_on::<cubecl::cuda::CudaRuntime>(any, inv_scale) {
            return found;
        }
        #[cfg(feature = "wgpu")]
        if let Some(found) = unscale_on::<cubecl::wgpu::WgpuRuntime>(any, inv_scale) {
            return found;
        }
        let _ = (any, inv_scale);
        None
    }

    /// `None` if the primitives are not `R`'s; else the result of [`unscale_cube`] or
    /// [`unscale_fused`] (`Some(None)`: not applicable, untouched).
    fn unscale_on<R: CubeRuntime>(any: &mut dyn Any, inv_scale: f32) -> Option<Option<bool>> {
        if let Some(slot) = any.downcast_mut::<Option<Vec<FrugalTensor<CubeTensor<R>>>>>() {
            return Some(through_frugal(slot, |t| unscale_cube(t, inv_scale)));
        }
        if let Some(slot) =
            any.downcast_mut::<Option<Vec<FrugalTensor<FusionTensor<FusionCubeRuntime<R>>>>>>()
        {
            return Some(through_frugal(slot, |t| unscale_fused(t, inv_scale)));
        }
        if let Some(slot) = any.downcast_mut::<Option<Vec<CubeTensor<R>>>>() {
            return Some(direct(slot, |t| unscale_cube(t, inv_scale)));
        }
        if let Some(slot) = any.downcast_mut::<Option<Vec<FusionTensor<FusionCubeRuntime<R>>>>>() {
            return Some(direct(slot, |t| unscale_fused(t, inv_scale)));
        }
        None
    }

    /// Applies `run` to tensors held by the plain backend.
    fn direct<P>(
        slot: &mut Option<Vec<P>>,
        run: impl FnOnce(Vec<P>) -> Unscaled<P>,
    ) -> Option<bool> {
        let tensors = slot.take().expect("tensors");
        match run(tensors) {
            Ok((out, found)) => {
                *slot = Some(out);
                Some(found)
            }
            Err(tensors) => {
                *slot = Some(tensors);
                None
            }
        }
    }

    /// Applies `run` to the inner tensors of Frugal tensors held directly (a managed tensor
    /// has a recipe that would replay the scaled value: those take the portable path). The
    /// results keep their ledger records: same bytes, same dtype.
    fn through_frugal<P: Clone + burn_backend::TensorMetadata>(
        slot: &mut Option<Vec<FrugalTensor<P>>>,
        run: impl FnOnce(Vec<P>) -> Unscaled<P>,
    ) -> Option<bool> {
        let tensors = slot.as_ref().expect("tensors");
        if tensors.iter().any(|t| !t.is_plain()) {
            return None;
        }
        let (inner, records): (Vec<P>, Vec<_>) = slot
            .take()
            .expect("tensors")
            .into_iter()
            .map(|t| {
                let ledger = t.ledger();
                let (inner, storage) = t.split();
                let dtype = inner.dtype();
                let storage = storage.expect("a plain tensor has its record");
                (inner, (ledger, dtype, storage))
            })
            .unzip();
        let (inner, found) = match run(inner) {
            Ok((out, found)) => (out, Some(found)),
            Err(inner) => (inner, None),
        };
        *slot = Some(
            inner
                .into_iter()
                .zip(records)
                .map(|(inner, (ledger, dtype, storage))| {
                    // A widened gradient is a new buffer: charged as the cast it is, and the
                    // 16-bit one's record is dropped with it.
                    let storage = if inner.dtype() == dtype {
                        storage
                    } else {
                        let cast = crate::ops::float::op(crate::ops::float::Op::float_cast);
                        std::sync::Arc::new(ledger.charge(&inner, cast))
                    };
                    FrugalTensor::plain(inner, storage)
                })
                .collect(),
        );
        found
    }

    /// Whether a tensor's buffer can be scaled in place: f32, contiguous, no other holder.
    fn in_place<R: CubeRuntime>(tensor: &CubeTensor<R>) -> bool {
        tensor.dtype == DType::F32 && tensor.is_contiguous() && tensor.can_mut()
    }

    /// Whether a 16-bit gradient can be widened with the fused scaled cast.
    fn widenable<R: CubeRuntime>(tensor: &CubeTensor<R>) -> bool {
        matches!(tensor.dtype, DType::F16 | DType::BF16) && tensor.is_contiguous()
    }

    /// Unscales `tensors` into `flag`: f32 ones in place with the fused unscale-and-check
    /// kernel, 16-bit ones into new f32 tensors with the fused scaled cast (then checked by the
    /// same kernel with a factor of 1, which is exact). Every tensor must be [`in_place`] or
    /// [`widenable`], and `inv_scale` finite and > 0. `false` if a launch failed (then some
    /// gradients may be unscaled and others not: the caller must skip the step).
    fn unscale_into<R: CubeRuntime>(
        client: &cubecl::client::ComputeClient<R>,
        tensors: Vec<CubeTensor<R>>,
        inv_scale: f32,
        flag: &frugal_kernels::FoundInf,
    ) -> (Vec<CubeTensor<R>>, bool) {
        let mut ok = true;
        let mut scaled = Vec::new();
        let mut widened = Vec::new();
        let tensors: Vec<_> = tensors
            .into_iter()
            .map(|tensor| {
                if tensor.dtype == DType::F32 {
                    scaled.push(tensor.clone());
                    return tensor;
                }
                let from = kernel_dtype(tensor.dtype).expect("checked 16-bit");
                let shape = tensor.meta.shape().clone();
                let len = shape.num_elements();
                match frugal_kernels::cast_scaled(
                    client,
                    &tensor.handle,
                    len,
                    from,
                    FloatDtype::F32,
                    inv_scale,
                ) {
                    Ok(handle) => {
                        SCALED_CASTS.fetch_add(1, Relaxed);
                        let wide = CubeTensor::new_contiguous(
                            tensor.client.clone(),
                            tensor.device.clone(),
                            shape,
                            handle,
                            DType::F32,
                        );
                        widened.push(wide.clone());
                        wide
                    }
                    Err(_) => {
                        ok = false;
                        tensor
                    }
                }
            })
            .collect();
        ok &= launch_unscale(client, &scaled, inv_scale, flag).is_ok();
        ok &= launch_unscale(client, &widened, 1.0, flag).is_ok();
        (tensors, ok)
    }

    /// The tensors unscaled and whether a non-finite value was found, or the tensors given back
    /// untouched when the kernels do not apply.
    type Unscaled<T> = Result<(Vec<T>, bool), Vec<T>>;

    /// Unscales CubeCL tensors in place and reads the flag (one device wait).
    fn unscale_cube<R: CubeRuntime>(
        tensors: Vec<CubeTensor<R>>,
        inv_scale: f32,
    ) -> Unscaled<CubeTensor<R>> {
        let Some(client) = tensors.first().map(|t| t.client.clone()) else {
            return Err(tensors);
        };
        let valid_scale = inv_scale.is_finite() && inv_scale > 0.0;
        if !valid_scale || !tensors.iter().all(|t| in_place(t) || widenable(t)) {
            return Err(tensors);
        }
        let flag = frugal_kernels::FoundInf::new(&client);
        let (tensors, ok) = unscale_into(&client, tensors, inv_scale, &flag);
        // A failed launch or read is reported as non-finite: the step is skipped rather than
        // taken on gradients of unknown scale.
        let found = !ok || flag.read(&client).unwrap_or(true);
        Ok((tensors, found))
    }

    /// One fused launch per group of buffers (see `frugal_kernels::unscale_and_check_into`).
    fn launch_unscale<R: CubeRuntime>(
        client: &cubecl::client::ComputeClient<R>,
        tensors: &[CubeTensor<R>],
        inv_scale: f32,
        flag: &frugal_kernels::FoundInf,
    ) -> Result<(), frugal_kernels::KernelError> {
        let buffers: Vec<_> = tensors
            .iter()
            .map(|t| (&t.handle, t.meta.shape().num_elements()))
            .collect();
        let launches = frugal_kernels::unscale_and_check_into(client, &buffers, inv_scale, flag)?;
        UNSCALE_LAUNCHES.fetch_add(launches as u64, Relaxed);
        UNSCALED_TENSORS.fetch_add(tensors.len() as u64, Relaxed);
        Ok(())
    }

    /// Unscales fused tensors with one custom operation (inputs in, outputs and the flag out),
    /// then reads the flag.
    fn unscale_fused<R: CubeRuntime>(
        tensors: Vec<FusionTensor<FusionCubeRuntime<R>>>,
        inv_scale: f32,
    ) -> Unscaled<FusionTensor<FusionCubeRuntime<R>>> {
        let Some(client) = tensors.first().map(|t| t.client.clone()) else {
            return Err(tensors);
        };
        // What the kernels take: f32 or 16-bit, 32-bit lengths, a finite positive factor.
        let takes = |t: &FusionTensor<FusionCubeRuntime<R>>| {
            matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16)
                && t.shape.num_elements() <= u32::MAX as usize
        };
        let valid_scale = inv_scale.is_finite() && inv_scale > 0.0;
        if !valid_scale || !tensors.iter().all(takes) {
            return Err(tensors);
        }
        let streams = OperationStreams::with_inputs(&tensors);
        let outputs: Vec<TensorIr> = tensors
            .iter()
            .map(|t| TensorIr::uninit(client.create_empty_handle(), t.shape.clone(), DType::F32))
            .collect();
        let flag = TensorIr::uninit(client.create_empty_handle(), [1].into(), DType::U32);
        let inputs: Vec<TensorIr> = tensors.into_iter().map(|t| t.into_ir()).collect();
        let mut all_outputs = outputs;
        all_outputs.push(flag);
        let desc = CustomOpIr::new("frugal_unscale", &inputs, &all_outputs);
        let mut out = client.register(
            streams,
            OperationIr::Custom(desc.clone()),
            FusedUnscale::<R> {
                desc,
                inv_scale,
                _runtime: PhantomData,
            },
        );
        let flag = out.pop().expect("the flag");
        let data = burn_std::future::block_on(
            <burn_fusion::Fusion<Cube<R>> as burn_backend::ops::IntTensorOps<_>>::int_into_data(
                flag,
            ),
        );
        let found = data
            .ok()
            .and_then(|d| d.to_vec::<u32>().ok())
            .and_then(|v| v.first().copied())
            .map(|word| word != 0);
        // The outputs are registered either way; a failed read reports a non-finite gradient
        // (the step is skipped rather than taken on unknown values).
        Ok((out, found.unwrap_or(true)))
    }

    /// The fusion custom operation of [`unscale_fused`].
    #[derive(Debug)]
    struct FusedUnscale<R> {
        desc: CustomOpIr,
        inv_scale: f32,
        _runtime: PhantomData<fn() -> R>,
    }

    impl<R: CubeRuntime> Operation<FusionCubeRuntime<R>> for FusedUnscale<R> {
        fn execute(
            &self,
            handles: &mut HandleContainer<<FusionCubeRuntime<R> as FusionRuntime>::FusionHandle>,
        ) {
            let inputs = &self.desc.inputs;
            let (outputs, flag_ir) = self.desc.outputs.split_at(inputs.len());
            let tensors: Vec<CubeTensor<R>> = inputs
                .iter()
                .map(|ir| {
                    let tensor = handles.get_float_tensor::<Cube<R>>(ir);
                    let usable = |t: &CubeTensor<R>| in_place(t) || widenable(t);
                    if usable(&tensor) {
                        return tensor;
                    }
                    let tensor = burn_cubecl::kernel::into_contiguous(tensor);
                    if usable(&tensor) {
                        return tensor;
                    }
                    // An f32 gradient still read elsewhere: scale a copy instead.
                    let shape = tensor.meta.shape().clone();
                    let handle = frugal_kernels::copy(
                        &tensor.client,
                        &tensor.handle,
                        shape.num_elements(),
                        FloatDtype::F32,
                    )
                    .expect("dtype and length checked when the operation was registered");
                    CubeTensor::new_contiguous(
                        tensor.client.clone(),
                        tensor.device.clone(),
                        shape,
                        handle,
                        DType::F32,
                    )
                })
                .collect();
            let client = tensors[0].client.clone();
            let device = tensors[0].device.clone();
            let flag = frugal_kernels::FoundInf::new(&client);
            let (tensors, ok) = unscale_into(&client, tensors, self.inv_scale, &flag);
            for (tensor, out) in tensors.into_iter().zip(outputs) {
                handles.register_float_tensor::<Cube<R>>(&out.id, tensor);
            }
            // A failed launch raises the flag: the step is skipped.
            let flag = if ok {
                flag.handle().clone()
            } else {
                client.create_from_slice(&1u32.to_le_bytes())
            };
            let flag = CubeTensor::new_contiguous(client, device, [1].into(), flag, DType::U32);
            handles.register_int_tensor::<Cube<R>>(&flag_ir[0].id, flag);
        }
    }
}

/// [`crate::GradScaler::unscale`] through the fused unscale-and-check kernel: `Some(found
/// non-finite)` when every gradient is a CubeCL tensor of a known runtime (held directly by
/// Frugal, i.e. not under a budget or scope, or by the plain backend); `None` (with `grads`
/// as they were) when the portable path must run.
pub(crate) fn unscale<B, M>(
    module: &M,
    grads: &mut burn_optim::GradientsParams,
    inv_scale: f32,
) -> Option<bool>
where
    B: burn_core::tensor::backend::AutodiffBackend,
    M: burn_core::module::AutodiffModule<B>,
{
    if mode() == KernelMode::Never {
        return None;
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        cube::unscale::<B, M>(module, grads, inv_scale)
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (module, grads, inv_scale);
        None
    }
}
