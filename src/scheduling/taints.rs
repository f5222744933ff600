//! Taints and tolerations with kube-scheduler's meaning.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// Taint effects that keep pods off a node (PreferNoSchedule is only a preference).
pub fn is_hard(taint: &Taint) -> bool {
    taint.effect == "NoSchedule" || taint.effect == "NoExecute"
}

/// Whether one toleration tolerates one taint: an empty effect matches every effect; an
/// empty key with `Exists` matches every key; `Equal` (the default) compares values.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    let operator = toleration.operator.as_deref().unwrap_or("Equal");
    match operator {
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
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
    fn prefer_no_schedule_only_counts_while_preferences_are_strict() {
        let taints = vec![taint("spot", "", "PreferNoSchedule")];
        assert!(untolerated(&taints, &[], true).is_some());
        assert!(untolerated(&taints, &[], false).is_none());
        assert_eq!(describe(&taints[0]), "spot:PreferNoSchedule");
    }
}
