//! The names a stack's channel set gives, in its placement, the runtimes handed to it
//! from outside: the application's and a latency application's. The builder places queues
//! on them by these names, and the core moves latency queues to the latter.

/// The name the channel set's placement gives the application's runtime.
pub const APPLICATION_RUNTIME: &str = "application";
/// The name the channel set's placement gives a latency application's runtime
/// ([`StackBuilder::latency_runtime`](super::StackBuilder::latency_runtime)).
pub const LATENCY_RUNTIME: &str = "latency";
