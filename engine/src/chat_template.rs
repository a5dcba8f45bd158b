//! Chat templates rendered with minijinja.
