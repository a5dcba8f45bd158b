//! Conformance checks for the ops the vision encoder adds ([`crate::Backend::gelu`]), against
//! [`crate::reference`].

use crate::conformance::{activation_dtypes, compare, tolerance};
use crate::{reference, Backend, HostTensor};
use anyhow::Result;

/// `gelu` (exact and tanh) over values spanning both tails, in every activation dtype.
pub fn check_gelu<B: Backend>(b: &B) -> Result<()> {
    for dt in activation_dtypes(b) {
        for &(n, scale) in &[(1usize, 1.0f32), (333, 4.0), (4096, 9.0)] {
            // A deterministic spread: −scale … +scale, plus 0 and the sign flip around it.
            let xv: Vec<f32> = (0..n)
                .map(|i| scale * (2.0 * i as f32 / n.max(2) as f32 - 1.0) + 0.013 * (i % 7) as f32)
                .collect();
            let x = HostTensor::from_f32_as(vec![n], &xv, dt)?;
            for approximate in [false, true] {
                let want = reference::gelu(&x, approximate)?;
                let got = b.download(&b.gelu(&b.upload(&x)?, approximate)?)?;
                compare(
                    "gelu",
                    &format!("{dt} [{n}] ±{scale} approximate={approximate}"),
                    &got,
                    &want,
                    tolerance(dt),
                )?;
            }
        }
    }
    Ok(())
}
