use core::fmt;

use cubecl::{
    Runtime,
    client::ComputeClient,
    ir::{ElemType, FloatKind, StorageType, features::TypeUsage},
};

use crate::KernelError;

/// A floating-point element type the kernels read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FloatDtype {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`): f32's exponent range with an 8-bit significand.
    BF16,
}

impl FloatDtype {
    /// Every dtype, widest first.
    pub const ALL: [FloatDtype; 3] = [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16];

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            FloatDtype::F32 => 4,
            FloatDtype::F16 | FloatDtype::BF16 => 2,
        }
    }

    /// The CubeCL storage type of this dtype.
    pub(crate) fn storage_type(self) -> StorageType {
        let kind = match self {
            FloatDtype::F32 => FloatKind::F32,
            FloatDtype::F16 => FloatKind::F16,
            FloatDtype::BF16 => FloatKind::BF16,
        };
        StorageType::Scalar(ElemType::Float(kind))
    }

    /// Whether the client's device can hold this dtype in buffers and convert to and from it,
    /// as its CubeCL properties report.
    pub fn is_supported<R: Runtime>(self, client: &ComputeClient<R>) -> bool {
        let usage = client.properties().type_usage(self.storage_type());
        usage.contains(TypeUsage::Conversion) && usage.contains(TypeUsage::Buffer)
    }

    /// `Ok(())` if [`is_supported`](Self::is_supported), else [`KernelError::UnsupportedDtype`].
    pub(crate) fn check_supported<R: Runtime>(
        self,
        client: &ComputeClient<R>,
    ) -> Result<(), KernelError> {
        if self.is_supported(client) {
            Ok(())
        } else {
            Err(KernelError::UnsupportedDtype {
                dtype: self,
                runtime: R::name(client),
                supported: FloatDtype::ALL
                    .into_iter()
                    .filter(|d| d.is_supported(client))
                    .collect(),
            })
        }
    }
}

impl fmt::Display for FloatDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FloatDtype::F32 => "f32",
            FloatDtype::F16 => "f16",
            FloatDtype::BF16 => "bf16",
        })
    }
}
