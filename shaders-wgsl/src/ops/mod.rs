//! The backend's ops by family: each file adds `impl WgslBackend` methods that the
//! [`dayone_backend::Backend`] impl in `lib.rs` forwards to.

mod attention;
mod basic;
mod dsa;
mod kda;
mod linear;
mod mla;
mod moe;
mod quant;
mod rows;
mod varlen;
