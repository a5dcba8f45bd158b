//! `/metrics`: the engine's metrics in Prometheus text.
