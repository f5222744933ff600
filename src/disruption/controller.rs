//! The rules by which disruption decisions are carried out, pure so the agent's
//! controller ([`crate::controllers::disruption`]) applies them as plain functions: a
//! decision waits out a validation delay and is carried out only if deciding again then
//! gives the same ([`Validation`]); a command's old nodes go only once every replacement is
//! initialized, and a command whose replacements are missing or not ready within the
//! registration TTL is undone ([`progress`]).

use jiff::{SignedDuration, Timestamp};

use super::Decision;

/// Karpenter waits this long before acting on a consolidation decision and re-checks it.
pub const DEFAULT_VALIDATION_DELAY: SignedDuration = SignedDuration::from_secs(15);

/// A command that made no replacement after this long is abandoned (its creator crashed
/// between marking the old nodes and creating replacements).
pub const ORPHANED_COMMAND: SignedDuration = SignedDuration::from_secs(60);

/// A replacement that is not running and registered this long after its launch is given
/// up on, and its command undone: the registration TTL of a NodeClaim.
pub const DEFAULT_REPLACEMENT_TTL: SignedDuration = SignedDuration::from_mins(15);

/// A decision waiting out the validation delay. It is carried out only if, once the delay
/// has passed, deciding again on the cluster as it is then gives the same decision (the
/// same method over the same nodes); a different decision starts its own delay, and no
/// decision drops it.
/// Pure: the caller decides and passes the time.
#[derive(Debug, Clone)]
pub struct Validation {
    delay: SignedDuration,
    pending: Option<(Timestamp, Decision)>,
}

impl Validation {
    /// Nothing waiting; decisions wait `delay`.
    pub fn new(delay: SignedDuration) -> Self {
        Validation {
            delay,
            pending: None,
        }
    }

    /// Whether a decision is waiting.
    pub fn pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Forgets the waiting decision (the cluster is in no state to decide over).
    pub fn clear(&mut self) {
        self.pending = None;
    }

    /// Takes this pass's first decision at `now`: returns it when the same decision has
    /// been offered since at least the delay ago, to be carried out now.
    pub fn offer(&mut self, now: Timestamp, decision: Option<Decision>) -> Option<Decision> {
        let Some(decision) = decision else {
            self.pending = None;
            return None;
        };
        match &self.pending {
            Some((since, waiting))
                if waiting.nodes == decision.nodes && waiting.method == decision.method =>
            {
                if now.duration_since(*since) < self.delay {
                    return None;
                }
                self.pending = None;
                Some(decision)
            }
            _ => {
                self.pending = Some((now, decision));
                None
            }
        }
    }
}

/// A command in flight: the nodes it disrupts and its replacements, as the agent reads
/// them back from the NodeClaims' annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    /// Command id.
    pub id: String,
    /// Old NodeClaims.
    pub old: Vec<String>,
    /// Replacements needed.
    pub needed: usize,
    /// Replacements (claim names) and whether each is initialized: running and registered.
    pub replacements: Vec<(String, bool)>,
    /// When the command began (oldest marking).
    pub started: Option<Timestamp>,
}

/// What to do with a command in flight.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// Replacements ready (or none needed): delete the old claims.
    Finish,
    /// Keep waiting.
    Wait,
    /// Give up and restore the old nodes.
    Undo(String),
}

/// Decides the next step of a command in flight: finish once every replacement is ready,
/// undo when replacements are missing after [`ORPHANED_COMMAND`] or not ready within
/// `ttl`. Pure.
pub fn progress(cmd: &InFlight, now: Timestamp, ttl: SignedDuration) -> Progress {
    let age = cmd
        .started
        .map_or(SignedDuration::ZERO, |s| now.duration_since(s));
    if cmd.replacements.len() < cmd.needed {
        return if age >= ORPHANED_COMMAND {
            Progress::Undo(format!(
                "{} of {} replacement(s) exist after {age:#}",
                cmd.replacements.len(),
                cmd.needed
            ))
        } else {
            Progress::Wait
        };
    }
    if cmd.replacements.iter().all(|(_, ready)| *ready) {
        return Progress::Finish;
    }
    if age >= ttl {
        return Progress::Undo(format!("replacements not initialized after {age:#}"));
    }
    Progress::Wait
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("valid")
    }

    fn cmd(needed: usize, replacements: &[bool]) -> InFlight {
        InFlight {
            id: "single-1".to_string(),
            old: vec!["old".to_string()],
            needed,
            replacements: replacements
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("r{i}"), *r))
                .collect(),
            started: Some(t(0)),
        }
    }

    const TTL: SignedDuration = SignedDuration::from_mins(15);

    fn decision(method: super::super::Method, nodes: &[&str]) -> Decision {
        Decision {
            method,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            replacements: Vec::new(),
            savings_per_hour: 0.1,
            pods_moved: Vec::new(),
            reason: String::new(),
        }
    }

    #[test]
    fn a_decision_is_carried_out_once_it_has_been_decided_again_after_the_delay() {
        use super::super::Method::{Empty, Single};
        let delay = DEFAULT_VALIDATION_DELAY;
        let mut v = Validation::new(delay);
        let a = || Some(decision(Empty, &["a"]));
        assert_eq!(v.offer(t(0), a()), None, "first seen: it waits");
        assert!(v.pending());
        assert_eq!(v.offer(t(10), a()), None, "within the delay");
        assert_eq!(v.offer(t(15), a()), a(), "the same after the delay");
        assert!(!v.pending());

        // Another decision starts its own delay; so does the same nodes by another method.
        assert_eq!(v.offer(t(20), a()), None);
        assert_eq!(v.offer(t(40), Some(decision(Empty, &["b"]))), None);
        assert_eq!(v.offer(t(50), Some(decision(Single, &["b"]))), None);
        assert_eq!(v.offer(t(60), Some(decision(Single, &["b"]))), None);
        assert_eq!(
            v.offer(t(65), Some(decision(Single, &["b"]))),
            Some(decision(Single, &["b"]))
        );

        // A pass that finds nothing, or a clear, drops what was waiting.
        assert_eq!(v.offer(t(100), a()), None);
        assert_eq!(v.offer(t(105), None), None);
        assert!(!v.pending());
        assert_eq!(v.offer(t(130), a()), None, "the delay runs again");
        v.clear();
        assert_eq!(v.offer(t(200), a()), None);
    }

    #[test]
    fn old_nodes_go_only_once_every_replacement_is_initialized() {
        assert_eq!(
            progress(&cmd(0, &[]), t(1), TTL),
            Progress::Finish,
            "a deletion needs none"
        );
        assert_eq!(progress(&cmd(1, &[false]), t(30), TTL), Progress::Wait);
        assert_eq!(
            progress(&cmd(2, &[true, false]), t(30), TTL),
            Progress::Wait
        );
        assert_eq!(
            progress(&cmd(2, &[true, true]), t(30), TTL),
            Progress::Finish
        );
    }

    #[test]
    fn a_command_left_half_made_by_a_crash_is_undone() {
        // Marked, but the replacement was never created: undone after a minute.
        assert_eq!(progress(&cmd(1, &[]), t(30), TTL), Progress::Wait);
        assert!(matches!(
            progress(&cmd(1, &[]), t(61), TTL),
            Progress::Undo(_)
        ));
        // Replacement never became ready: undone after the registration TTL.
        assert!(matches!(
            progress(&cmd(1, &[false]), t(15 * 60), TTL),
            Progress::Undo(_)
        ));
    }
}
