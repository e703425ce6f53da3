//! The methods of Burn's `TransactionOps`, in op-id order, in the signature language of
//! [`crate::ops`]. Read twice: by `crate::vocabulary::declare_family!` for the ids and names, and by
//! the forwarding macro of `crate::ops::transaction` for the implementations.

/// Expands to `$callback! { $head... }` followed by the family's method list.
macro_rules! transaction_methods {
    ($callback:ident! { $($head:tt)* }) => {
        $callback! {
            $($head)*
            family TransactionOps, module transaction, base TRANSACTION_BASE;
            manual [tr_execute];
            views:
        }
    };
}
pub(crate) use transaction_methods;
