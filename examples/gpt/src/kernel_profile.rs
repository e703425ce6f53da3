//! `--profile-kernels`: the device time of a training step by kind of work (products,
//! attention, element-wise, reductions, casts, optimizer, copies, idle), measured on
//! frugal-cuda with CUDA events around every launch (`frugal_cuda::set_launch_timing`).
//! Written to `OUT/kernel-profile.json`; a few lines are printed at the end of the run.

use serde::Serialize;

/// The kind of work a kernel does, read from its name (CubeCL names a kernel by its type).
pub fn kernel_class(name: &str) -> &'static str {
    let name = name.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| name.contains(w));
    if has(&["cublaslt", "matmul", "gemm"]) {
        "products"
    } else if has(&["attention", "flash"]) {
        "attention"
    } else if has(&["copy to", "copy_"]) {
        "copies"
    } else if has(&["adamw"]) {
        "optimizer"
    } else if has(&["cross_entropy", "softmax", "log_softmax"]) {
        "loss and softmax"
    } else if has(&["cast"]) {
        "casts"
    } else if has(&["reduce", "norm", "sum", "mean", "argmax"]) {
        "reductions and norms"
    } else if has(&[
        "fuse", "elemwise", "unary", "binary", "clamp", "mask", "gather",
    ]) {
        "element-wise"
    } else {
        "other"
    }
}

/// One kind of kernel in the profile, per profiled step.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelRow {
    /// CubeCL's name of the kernel (its type, generics cut), or the library call.
    pub name: String,
    /// [`kernel_class`] of the name.
    pub class: &'static str,
    /// Launches per step.
    pub launches: f64,
    /// Device time per step, in milliseconds.
    pub ms: f64,
}

/// The profile of the steps timed, per step.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelProfile {
    /// Steps timed (the steps after the third, or the last one).
    pub steps: u64,
    /// Median wall time of those steps, in milliseconds (with the events recorded).
    pub step_ms: f64,
    /// Mean wall time of those steps, in milliseconds: what the device's busy and idle time per
    /// step add up to.
    pub mean_step_ms: f64,
    /// Device time by class, longest first.
    pub classes: Vec<KernelRow>,
    /// Device time between pieces of work per step: the device waiting for the host.
    pub idle_ms: f64,
    /// Every kernel, longest first.
    pub kernels: Vec<KernelRow>,
}

/// The first step to time: the second half of the run, and not before the fourth step (a
/// budget's plan is learned after the third, and its first planned steps compile and settle),
/// or the last step of a shorter run.
pub fn first_profiled_step(first: u64, steps: u64) -> u64 {
    let run = steps.saturating_sub(first);
    (first + (run / 2).max(3))
        .min(steps.saturating_sub(1))
        .max(first)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A kernel's type name without its module path and generic arguments.
fn short_name(name: &str) -> String {
    let base = name.split('<').next().unwrap_or(name);
    let mut parts = base.rsplit("::");
    let last = parts.next().unwrap_or(base);
    // A kernel type is often named `Kernel` or `Launch` inside a module that says what it is.
    match parts.next() {
        Some(module) if last.len() < 12 => format!("{module}::{last}"),
        _ => last.to_string(),
    }
}

/// Builds the profile of `steps` steps of median `step_ms` from the device time of each kernel
/// (`(name, launches, nanoseconds)`, as frugal-cuda measured them) and the idle time between.
pub fn profile<'a>(
    kernels: impl IntoIterator<Item = (&'a str, u64, u64)>,
    idle_nanos: u64,
    step_times_ms: &[f64],
) -> KernelProfile {
    let steps = step_times_ms.len() as u64;
    use std::collections::BTreeMap;
    let per_step = |nanos: u64| nanos as f64 / 1e6 / steps.max(1) as f64;
    let mut by_name: BTreeMap<String, KernelRow> = BTreeMap::new();
    for (full_name, launches, nanos) in kernels {
        let name = short_name(full_name);
        let row = by_name.entry(name.clone()).or_insert_with(|| KernelRow {
            class: kernel_class(full_name),
            name,
            launches: 0.0,
            ms: 0.0,
        });
        row.launches += launches as f64 / steps.max(1) as f64;
        row.ms += per_step(nanos);
    }
    let mut classes: BTreeMap<&'static str, KernelRow> = BTreeMap::new();
    for row in by_name.values() {
        let class = classes.entry(row.class).or_insert_with(|| KernelRow {
            name: row.class.to_string(),
            class: row.class,
            launches: 0.0,
            ms: 0.0,
        });
        class.launches += row.launches;
        class.ms += row.ms;
    }
    fn longest_first<K>(rows: BTreeMap<K, KernelRow>) -> Vec<KernelRow> {
        let mut rows: Vec<KernelRow> = rows.into_values().collect();
        rows.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        rows
    }
    KernelProfile {
        steps,
        step_ms: median(step_times_ms),
        mean_step_ms: step_times_ms.iter().sum::<f64>() / steps.max(1) as f64,
        classes: longest_first(classes),
        idle_ms: per_step(idle_nanos),
        kernels: longest_first(by_name),
    }
}

impl std::fmt::Display for KernelProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let busy: f64 = self.classes.iter().map(|c| c.ms).sum();
        let launches: f64 = self.classes.iter().map(|c| c.launches).sum();
        writeln!(
            f,
            "device time per step ({} steps timed; step {:.2} ms median, {:.2} ms mean): {busy:.2} ms in {launches:.0} launches, idle {:.2} ms",
            self.steps, self.step_ms, self.mean_step_ms, self.idle_ms
        )?;
        for class in &self.classes {
            writeln!(
                f,
                "  {:<22} {:>8.2} ms {:>5.1}% {:>7.0} launches",
                class.name,
                class.ms,
                100.0 * class.ms / busy.max(f64::MIN_POSITIVE),
                class.launches
            )?;
        }
        Ok(())
    }
}

/// Starts timing launches if `device` is a frugal-cuda device.
#[allow(unused_variables)]
pub fn start<D: 'static>(device: &D) {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        frugal_cuda::set_launch_timing(device, true);
    }
}

/// Stops timing and returns the profile of the steps timed, which took `step_times_ms`, if
/// `device` is a frugal-cuda device.
#[allow(unused_variables)]
pub fn finish<D: 'static>(device: &D, step_times_ms: &[f64]) -> Option<KernelProfile> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        let timings = frugal_cuda::take_launch_timings(device);
        frugal_cuda::set_launch_timing(device, false);
        let kernels = timings
            .kernels
            .iter()
            .map(|k| (k.name.as_str(), k.launches, k.device_nanos));
        return Some(profile(kernels, timings.idle_nanos, step_times_ms));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_classed_by_what_they_say() {
        assert_eq!(kernel_class("cuBLASLt product"), "products");
        assert_eq!(kernel_class("copy to host"), "copies");
        assert_eq!(
            kernel_class("frugal_kernels::attention::kernels::flash_forward::Kernel<R>"),
            "attention"
        );
        assert_eq!(
            kernel_class("cubecl_reduce::launch::ReduceKernel<f32>"),
            "reductions and norms"
        );
        assert_eq!(kernel_class("something_new"), "other");
    }

    #[test]
    fn short_names_keep_the_module_of_a_generic_kernel_name() {
        assert_eq!(
            short_name("a::b::flash_forward::Kernel<R, F>"),
            "flash_forward::Kernel"
        );
        assert_eq!(
            short_name("a::b::ElemwiseKernelLaunch<R>"),
            "ElemwiseKernelLaunch"
        );
        assert_eq!(short_name("cuBLASLt product"), "cuBLASLt product");
    }

    #[test]
    fn a_profile_is_per_step_and_sums_kernels_of_one_short_name_and_one_class() {
        let kernels = [
            ("cuBLASLt product", 200, 40_000_000),
            ("a::matmul::Kernel<f32>", 20, 4_000_000),
            ("a::matmul::Kernel<bf16>", 20, 2_000_000),
            ("copy to host", 2, 1_000_000),
        ];
        let p = profile(kernels, 10_000_000, &[30.0, 40.0]);
        assert_eq!((p.steps, p.step_ms, p.mean_step_ms), (2, 35.0, 35.0));
        assert_eq!(p.idle_ms, 5.0);
        assert_eq!(p.classes[0].name, "products");
        assert_eq!(p.classes[0].ms, 23.0);
        assert_eq!(p.classes[0].launches, 120.0);
        assert_eq!(p.classes[1].name, "copies");
        assert_eq!(p.kernels[0].name, "cuBLASLt product");
        assert_eq!(p.kernels[1].name, "matmul::Kernel");
        assert_eq!(p.kernels[1].ms, 3.0);
        assert!(p.to_string().contains("idle 5.00 ms"), "{p}");
    }

    #[test]
    fn the_second_half_is_timed_from_the_fourth_step_on_or_the_last_step() {
        assert_eq!(first_profiled_step(0, 14), 7);
        assert_eq!(first_profiled_step(0, 6), 3);
        assert_eq!(first_profiled_step(0, 2), 1);
        assert_eq!(first_profiled_step(5, 6), 5);
        assert_eq!(first_profiled_step(0, 1), 0);
    }
}
