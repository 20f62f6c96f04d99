//! What every HTTP surface shares (the ingest API, the query gateway, the admin
//! listener): tenant resolution, headers a client sends once, and the body deadline of
//! a listener. Below the surfaces, so none of them reaches into another for these.

pub mod body_deadline;
pub mod headers;
pub mod tenant;

pub use body_deadline::body_timed_out;
