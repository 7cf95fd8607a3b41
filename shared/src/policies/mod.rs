//! Policies (definitions, tiers, derived keys), what a connection remembers of them, and strikes and blocks.

pub mod penalty;
pub mod policy;
pub mod policy_cache;
