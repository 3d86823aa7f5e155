//! [`DriverPlace`]: where a queue's driver runs.

/// Where a queue's driver runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DriverPlace {
    /// A queue runtime of the set, by id.
    Runtime(u32),
    /// A runtime handed to the set ([`ChannelSet::add_external_runtime`](super::ChannelSet::add_external_runtime)),
    /// by the name it was given.
    External(String),
}

impl std::fmt::Display for DriverPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriverPlace::Runtime(id) => write!(f, "runtime {id}"),
            DriverPlace::External(name) => write!(f, "runtime {name:?}"),
        }
    }
}
