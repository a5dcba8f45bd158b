//! The WGSL backend (filled in by the WGSL work).
