//! [`crate::GradScaler::unscale`] on Frugal's fused kernels: one unscale-and-check launch per
//! group of f32 gradients with the found-inf flag kept on the device, and the fused
//! widen-and-scale cast for 16-bit gradients, for CubeCL inner backends with or without
//! Burn's fusion.

use crate::kernels::{self, KernelMode};

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
    if kernels::mode() == KernelMode::Never {
        return None;
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        // Every gradient in the parameter's type (f32), as the optimizer will read it.
        let mut taken = cube::Take::<B> {
            grads,
            ids: Vec::new(),
            prims: Vec::new(),
        };
        module.visit(&mut taken);
        let cube::Take { grads, ids, prims } = taken;
        let mut prims = Some(prims);
        let found = cube::unscale_any(&mut prims, inv_scale);
        let mut put = cube::Put::<B, _, _> {
            grads,
            ids: ids.into_iter().peekable(),
            prims: prims.expect("given back").into_iter(),
            _backend: std::marker::PhantomData,
        };
        module.visit(&mut put);
        found
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (module, grads, inv_scale);
        None
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube {
    use std::any::Any;
    use std::marker::PhantomData;
    use std::sync::atomic::Ordering::Relaxed;

    use burn_backend::{DType, Shape};
    use burn_cubecl::{CubeRuntime, fusion::FusionCubeRuntime, tensor::CubeTensor};
    use burn_fusion::FusionTensor;
    use frugal_kernels::FloatDtype;

    use crate::kernels::{
        self,
        cube::{Cube, kernel_dtype},
        custom::register_fused,
    };
    use crate::runtime::each_runtime;
    use crate::tensor::FrugalTensor;
    use crate::vocabulary::families::float;

    /// Takes each parameter's gradient out of `grads`, in the parameter's type or, for an f32
    /// parameter, possibly 16-bit (widened by the unscale).
    pub(super) struct Take<'a, B: burn_core::tensor::backend::AutodiffBackend> {
        pub(super) grads: &'a mut burn_optim::GradientsParams,
        pub(super) ids: Vec<burn_core::module::ParamId>,
        pub(super) prims:
            Vec<<B::InnerBackend as burn_backend::BackendTypes>::FloatTensorPrimitive>,
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
    pub(super) struct Put<'a, B, I: Iterator, P> {
        pub(super) grads: &'a mut burn_optim::GradientsParams,
        pub(super) ids: std::iter::Peekable<I>,
        pub(super) prims: P,
        pub(super) _backend: PhantomData<B>,
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
    pub(super) fn unscale_any<P: Any>(prims: &mut Option<Vec<P>>, inv_scale: f32) -> Option<bool> {
        let any = prims as &mut dyn Any;
        each_runtime!(unscale_on(any, inv_scale)).flatten()
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
                let state = t.state();
                let (inner, storage) = t.split();
                let dtype = inner.dtype();
                let storage = storage.expect("a plain tensor has its record");
                (inner, (state, dtype, storage))
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
                .map(|(inner, (state, dtype, storage))| {
                    // A widened gradient is a new buffer: charged as the cast it is, and the
                    // 16-bit one's record is dropped with it.
                    let storage = if inner.dtype() == dtype {
                        // Scaled in place: a cast autocast kept of the buffer is stale.
                        storage.forget_cast();
                        storage
                    } else {
                        let cast = float::op(float::Op::float_cast);
                        std::sync::Arc::new(state.charge(&inner, cast))
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
                        kernels::SCALED_CASTS.fetch_add(1, Relaxed);
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
        kernels::UNSCALE_LAUNCHES.fetch_add(launches as u64, Relaxed);
        kernels::UNSCALED_TENSORS.fetch_add(tensors.len() as u64, Relaxed);
        Ok(())
    }

    /// Unscales fused tensors with one custom operation (inputs in, outputs and the flag out),
    /// then reads the flag.
    fn unscale_fused<R: CubeRuntime>(
        tensors: Vec<FusionTensor<FusionCubeRuntime<R>>>,
        inv_scale: f32,
    ) -> Unscaled<FusionTensor<FusionCubeRuntime<R>>> {
        if tensors.is_empty() {
            return Err(tensors);
        }
        // What the kernels take: f32 or 16-bit, 32-bit lengths, a finite positive factor.
        let takes = |t: &FusionTensor<FusionCubeRuntime<R>>| {
            matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16)
                && t.shape.num_elements() <= u32::MAX as usize
        };
        let valid_scale = inv_scale.is_finite() && inv_scale > 0.0;
        if !valid_scale || !tensors.iter().all(takes) {
            return Err(tensors);
        }
        let mut outputs: Vec<(Shape, DType)> = tensors
            .iter()
            .map(|t| (t.shape.clone(), DType::F32))
            .collect();
        outputs.push(([1].into(), DType::U32));
        let mut out = register_fused("frugal_unscale", tensors, outputs, move |tensors| {
            unscale_registered(tensors, inv_scale)
        });
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

    /// What the custom operation of [`unscale_fused`] runs: the gradients unscaled, then the
    /// flag (raised if a launch failed, so that the step is skipped).
    fn unscale_registered<R: CubeRuntime>(
        inputs: Vec<CubeTensor<R>>,
        inv_scale: f32,
    ) -> Vec<CubeTensor<R>> {
        let tensors: Vec<CubeTensor<R>> = inputs
            .into_iter()
            .map(|tensor| {
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
        let (mut tensors, ok) = unscale_into(&client, tensors, inv_scale, &flag);
        let flag = if ok {
            flag.handle().clone()
        } else {
            client.create_from_slice(&1u32.to_le_bytes())
        };
        tensors.push(CubeTensor::new_contiguous(
            client,
            device,
            [1].into(),
            flag,
            DType::U32,
        ));
        tensors
    }
}
