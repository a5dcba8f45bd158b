//! dayone's engine.
