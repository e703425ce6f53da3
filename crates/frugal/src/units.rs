//! Layer 0, units: byte sizes (parsing and printing), the bytes a tensor occupies, and the
//! one 16-bit type vocabulary ([`LowPrecision`]) that autocast, compressed storage and the
//! kernels share. Imports nothing from the crate.

use burn_backend::quantization::{QuantStore, QuantValue};
use burn_backend::{DType, Shape};

/// A 16-bit floating-point type: what autocast computes `Low` ops in and what compressed
/// storage keeps tensors in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LowPrecision {
    /// bfloat16: f32's range, 8 bits of mantissa. No loss scaling needed.
    BF16,
    /// IEEE half: 11 bits of mantissa, range to 65504. Train with a [`crate::GradScaler`].
    F16,
}

impl LowPrecision {
    /// Burn's dtype for it.
    pub fn dtype(self) -> DType {
        match self {
            LowPrecision::BF16 => DType::BF16,
            LowPrecision::F16 => DType::F16,
        }
    }

    /// The 16-bit type `dtype` is, if it is one.
    pub fn of(dtype: DType) -> Option<Self> {
        match dtype {
            DType::BF16 => Some(LowPrecision::BF16),
            DType::F16 => Some(LowPrecision::F16),
            _ => None,
        }
    }

    /// A non-zero byte for an atomic slot; 0 stands for "none".
    pub(crate) const fn code(self) -> u8 {
        match self {
            LowPrecision::BF16 => 1,
            LowPrecision::F16 => 2,
        }
    }

    /// The inverse of [`Self::code`]; `None` for 0.
    pub(crate) const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(LowPrecision::BF16),
            2 => Some(LowPrecision::F16),
            _ => None,
        }
    }
}

/// Bytes a tensor of this shape and dtype occupies on the device, without allocator padding.
pub(crate) fn tensor_bytes(shape: &Shape, dtype: DType) -> u64 {
    let elements = shape.num_elements() as u64;
    match dtype {
        DType::QFloat(scheme) => {
            // Sub-byte quantized values report a size of 0; count their packed bits instead.
            let bits = match (scheme.store, scheme.value) {
                (_, QuantValue::Q8F | QuantValue::Q8S) => 8,
                (_, QuantValue::E4M3 | QuantValue::E5M2) => 8,
                (QuantStore::Native, QuantValue::E2M1) => 8,
                (_, QuantValue::E2M1 | QuantValue::Q4F | QuantValue::Q4S) => 4,
                (_, QuantValue::Q2F | QuantValue::Q2S) => 2,
            };
            (elements * bits).div_ceil(8)
        }
        other => elements * other.size() as u64,
    }
}

/// Formats bytes with binary units and two decimals, e.g. `1.50 GiB` (`512 B` below a KiB),
/// as `torch.cuda.memory_summary` prints them.
pub fn format_bytes(bytes: u64) -> String {
    // Whole bytes need no decimals (humansize would print `512.00 B`).
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let options = humansize::BINARY.decimal_places(2).decimal_zeroes(2);
    humansize::format_size(bytes, options)
}

/// Error from [`parse_bytes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseBytesError {
    input: String,
}

impl std::fmt::Display for ParseBytesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid byte size {:?}: expected a positive number with an optional unit \
             B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), \
             e.g. 2GiB or 1.5GB, between 1 B and 2^64 - 1 B",
            self.input
        )
    }
}

impl std::error::Error for ParseBytesError {}

/// Parses a byte size such as `2GiB`, `1.5 GB`, `800MB` or `123456`.
pub fn parse_bytes(input: &str) -> Result<u64, ParseBytesError> {
    let error = || ParseBytesError {
        input: input.to_string(),
    };
    let text = input.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| error())?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(error()),
    };
    let bytes = (number * scale).round();
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(error());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_binary_units_with_two_decimals() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.00 KiB");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(21_410_000), "20.42 MiB");
        assert_eq!(format_bytes(5 << 30), "5.00 GiB");
    }

    #[test]
    fn byte_sizes_parse_in_both_unit_systems() {
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("123456"), Ok(123456));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("2 apples").is_err());
    }
}
