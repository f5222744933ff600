//! Right-sizing, pure: usage history in, recommended requests out.
//!
//! [`histogram`] holds VPA's decaying histogram; [`recommender`] keeps per-container
//! history and turns it into a recommendation under a [`policy::Policy`]. Reading usage
//! from Prometheus lives in `usage/`; applying recommendations in `actuation/`. [`backtest`]
//! scores it against independent reimplementations of VPA and KRR ([`baselines`]).

pub mod backtest;
pub mod baselines;
pub mod histogram;
pub mod policy;
pub mod recommender;
pub mod service;

pub use histogram::{Buckets, DecayingHistogram};
pub use policy::{Policy, PolicyError};
pub use recommender::{
    ContainerHistory, ContainerRecommendation, Context, Prices, Requests, cpu_starvation_price,
    recommend,
};
