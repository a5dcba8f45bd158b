//! Tool-call and reasoning parsers: one state machine per output format.
