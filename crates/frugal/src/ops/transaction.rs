//! Forwarding of Burn's `TransactionOps`.

use burn_backend::Backend;
use burn_backend::ops::TransactionOps;

use burn_backend::ExecutionError;
use burn_backend::ops::{TransactionPrimitive, TransactionPrimitiveData};

use crate::Frugal;
use crate::ledger::Ledger;
use crate::tensor::FrugalTensor;

crate::ops::forward_ops! {
    impl TransactionOps, base crate::ops::TRANSACTION_BASE;
    manual [tr_execute] {
        fn tr_execute(
            transaction: TransactionPrimitive<Self>,
        ) -> impl core::future::Future<Output = Result<TransactionPrimitiveData, ExecutionError>> + Send
        {
            let ledger = transaction
                .read_floats
                .first()
                .map(|t| t.ledger())
                .or(transaction.read_qfloats.first().map(|t| t.ledger()))
                .or(transaction.read_ints.first().map(|t| t.ledger()))
                .or(transaction.read_bools.first().map(|t| t.ledger()))
                .unwrap_or_else(Ledger::unattributed);
            ledger.count_call(op(Op::tr_execute));
            fn inner<P: Clone>(tensors: Vec<FrugalTensor<P>>) -> Vec<P> {
                tensors.into_iter().map(FrugalTensor::into_inner).collect()
            }
            B::tr_execute(TransactionPrimitive::new(
                inner(transaction.read_floats),
                inner(transaction.read_qfloats),
                inner(transaction.read_ints),
                inner(transaction.read_bools),
            ))
        }
    }
    views:
}
