//! placeholder

pub mod certificates;
pub mod credentials;
pub mod secrets;
pub mod specs;
pub mod store;
