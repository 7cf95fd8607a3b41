//! Where rows live and how a call changes them atomically: the seam an engine implements, the flows over it, the statements of both SQL engines and their store, and the memory store.

pub mod decision_slot;
pub mod memory;
pub mod memory_store;
pub mod protocol;
pub mod sql;
pub mod sql_store;
pub mod store;
