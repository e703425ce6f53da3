//! The log filter of `gpt` and the benches: what a person can act on by default, everything
//! through `RUST_LOG`.

/// The filter when `RUST_LOG` is not set: warnings from this project's crates, errors only from
/// its dependencies. A dependency's warnings are for its own developers: on a device
/// out-of-memory, CubeCL warns once per queued task that failed (thousands of lines), while
/// the run says in one line what happened and what it does about it.
pub const DEFAULT_FILTER: &str = "error,gpt=warn,frugal=warn,frugal_cuda=warn,\
                                  frugal_kernels=warn,frugal_benches=warn,peak_memory=warn";

/// Starts the `log` logger on stderr with `RUST_LOG`'s filter, or [`DEFAULT_FILTER`] when it is
/// not set (`RUST_LOG` replaces it entirely: `RUST_LOG=warn` shows every crate's warnings).
pub fn init() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(DEFAULT_FILTER))
        .format_timestamp(None)
        .init();
}
