//! Floor 3, `policy`: what a request is held to. [`route`] decides a request's route from its
//! head (and its model), [`slo`] judges a finished request against the route's SLO, and
//! [`outcome`] holds the plain values of a finished request that both read.

pub(crate) mod outcome;
pub(crate) mod route;
pub(crate) mod slo;
