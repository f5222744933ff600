//! Tailor: a Kubernetes agent for Azure that right-sizes pod requests from their usage
//! history and provisions and consolidates the cheapest VM sizes that fit the right-sized
//! requests.
//!
//! The layering: [`model`] is the vocabulary; the decision engines are pure functions of a
//! [`state::Snapshot`], a catalog of instance types, recommendations, policy and `now`;
//! everything that talks to the world ([`cloud::CloudProvider`], [`clock::Clock`], the
//! Kubernetes API, Prometheus) sits behind a narrow trait with a simulated implementation.

#![forbid(unsafe_code)]

pub mod actuation;
pub mod apis;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod cloud;
pub mod controllers;
pub mod disruption;
pub mod model;
pub mod provisioning;
pub mod report;
pub mod rightsizing;
pub mod scheduling;
pub mod server;
pub mod sim;
pub mod state;
pub mod telemetry;
pub mod usage;
pub mod webhook;
