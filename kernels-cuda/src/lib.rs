//! The CUDA backend (filled in by the CUDA work).
