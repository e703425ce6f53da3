//! The methods of Burn's `Backend` trait itself, in op-id order. They are written by hand in
//! `crate::ops::backend` (no tensor arguments to forward), so the list only names them.

/// Expands to `$callback! { $head... }` followed by the family's method list.
macro_rules! backend_methods {
    ($callback:ident! { $($head:tt)* }) => {
        $callback! {
            $($head)*
            family Backend, module backend, base BACKEND_BASE;
            manual [
                ad_enabled,
                memory_persistent_allocations,
                memory_cleanup,
                name,
                seed,
                sync,
                staging,
                supports_dtype,
                dtype_usage,
                device_count,
            ];
            views:
        }
    };
}
pub(crate) use backend_methods;
