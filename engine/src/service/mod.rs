//! The engine as a service: a handle that other threads use to submit and abort requests while
//! one thread owns the engine and steps it. (Being written; see the module's owner.)
