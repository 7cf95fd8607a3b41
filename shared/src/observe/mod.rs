//! What rl_check counts and the subjects it refuses most, in memory (a process's, or PostgreSQL's shared memory).

pub mod refused;
pub mod stats;
