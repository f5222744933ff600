//! Taints and tolerations with kube-scheduler's meaning.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// Taint effects that keep pods off a node (PreferNoSchedule is only a preference).
pub fn is_hard(taint: &Taint) -> bool {
    taint.effect == "NoSchedule" || taint.effect == "NoExecute"
}

/// Whether one toleration tolerates one taint, as Kubernetes' `ToleratesTaint`: an empty
/// effect matches every effect and an empty key every key; `Exists` ignores the value,
/// `Equal` (the default) compares it, and any other operator tolerates nothing.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "Exists" => true,
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// The first taint among `taints` that keeps a pod with `tolerations` off the node.
/// `PreferNoSchedule` taints count only when `prefer_no_schedule` is set (Karpenter treats
/// them as required until preferences are relaxed).
pub fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    prefer_no_schedule: bool,
) -> Option<&'a Taint> {
    taints.iter().find(|t| {
        (is_hard(t) || (prefer_no_schedule && t.effect == "PreferNoSchedule"))
            && !tolerations.iter().any(|tol| tolerates(tol, t))
    })
}

/// `key=value:Effect`, as kubectl prints a taint.
pub fn describe(taint: &Taint) -> String {
    match taint.value.as_deref() {
        Some(v) if !v.is_empty() => format!("{}={}:{}", taint.key, v, taint.effect),
        _ => format!("{}:{}", taint.key, taint.effect),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: (!value.is_empty()).then(|| value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
        Toleration {
            key: (!key.is_empty()).then(|| key.into()),
            operator: Some(operator.into()),
            value: (!value.is_empty()).then(|| value.into()),
            effect: (!effect.is_empty()).then(|| effect.into()),
            toleration_seconds: None,
        }
    }

    #[test]
    fn equal_exists_and_wildcard_tolerations_match_like_kube_scheduler() {
        let gpu = taint("nvidia.com/gpu", "true", "NoSchedule");
        assert!(tolerates(
            &toleration("nvidia.com/gpu", "Equal", "true", "NoSchedule"),
            &gpu
        ));
        assert!(!tolerates(
            &toleration("nvidia.com/gpu", "Equal", "false", "NoSchedule"),
            &gpu
        ));
        assert!(tolerates(
            &toleration("nvidia.com/gpu", "Exists", "", ""),
            &gpu
        ));
        assert!(!tolerates(
            &toleration("nvidia.com/gpu", "Exists", "", "NoExecute"),
            &gpu
        ));
        assert!(tolerates(&toleration("", "Exists", "", ""), &gpu));
        assert!(!tolerates(&toleration("other", "Exists", "", ""), &gpu));
    }

    #[test]
    fn the_scheduler_and_the_plan_validator_agree_on_every_toleration() {
        // Every combination, including ones the API server refuses (an empty key with
        // `Equal`, an unknown operator): the validator's independent reading is
        // Kubernetes' `ToleratesTaint`, and the scheduler must not disagree with it.
        let taints = [
            taint("gpu", "true", "NoSchedule"),
            taint("gpu", "", "NoExecute"),
            taint("spot", "true", "PreferNoSchedule"),
        ];
        let mut tolerated = 0;
        for key in ["", "gpu", "spot"] {
            for operator in ["", "Equal", "Exists", "Gt"] {
                for value in ["", "true"] {
                    for effect in ["", "NoSchedule", "NoExecute"] {
                        let t = toleration(key, operator, value, effect);
                        for taint in &taints {
                            let ours = tolerates(&t, taint);
                            assert_eq!(
                                ours,
                                crate::scheduling::validate::matching::tolerates(&t, taint),
                                "{t:?} {taint:?}"
                            );
                            tolerated += usize::from(ours);
                        }
                    }
                }
            }
        }
        assert!(tolerated > 0 && tolerated < 3 * 4 * 2 * 3 * 3);
        // An empty key with `Equal` tolerates a taint of any key with the same value.
        assert!(tolerates(&toleration("", "Equal", "true", ""), &taints[0]));
        assert!(!tolerates(&toleration("", "Equal", "", ""), &taints[0]));
        assert!(!tolerates(&toleration("gpu", "Gt", "true", ""), &taints[0]));
    }

    #[test]
    fn prefer_no_schedule_only_counts_while_preferences_are_strict() {
        let taints = vec![taint("spot", "", "PreferNoSchedule")];
        assert!(untolerated(&taints, &[], true).is_some());
        assert!(untolerated(&taints, &[], false).is_none());
        assert_eq!(describe(&taints[0]), "spot:PreferNoSchedule");
    }
}
