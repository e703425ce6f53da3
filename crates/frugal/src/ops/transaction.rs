//! Forwarding of Burn's `TransactionOps`.

use burn_backend::Backend;
use burn_backend::ops::TransactionOps;

use burn_backend::ExecutionError;
use burn_backend::ops::{TransactionPrimitive, TransactionPrimitiveData};

use super::forward_ops;
use crate::backend::Frugal;
use crate::device::DeviceState;
use crate::tensor::FrugalTensor;

crate::vocabulary::catalog::transaction::transaction_methods!(forward_ops! {{
        fn tr_execute(
            transaction: TransactionPrimitive<Self>,
        ) -> impl core::future::Future<Output = Result<TransactionPrimitiveData, ExecutionError>> + Send
        {
            let state = transaction
                .read_floats
                .first()
                .map(|t| t.state())
                .or(transaction.read_qfloats.first().map(|t| t.state()))
                .or(transaction.read_ints.first().map(|t| t.state()))
                .or(transaction.read_bools.first().map(|t| t.state()))
                .unwrap_or_else(DeviceState::unattributed);
            state.count_call(op(Op::tr_execute));
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
}});
