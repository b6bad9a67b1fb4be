//! RBAC as the API server evaluates it, for the fake: a request's
//! attributes (verb, API group, resource with its subresource, namespace,
//! name) against the rules of the roles bound to its caller. A ClusterRole
//! applies everywhere, a Role in its own namespace only.

use serde_json::Value;

/// One PolicyRule, with the namespace of the Role it came from (None: a ClusterRole).
#[derive(Clone, Debug)]
pub struct Rule {
    pub api_groups: Vec<String>,
    /// `plural` or `plural/subresource`.
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub resource_names: Vec<String>,
    pub namespace: Option<String>,
}

/// What a request asks for, in RBAC's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct Attributes {
    pub verb: &'static str,
    pub api_group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

fn strings(v: &Value, field: &str) -> Vec<String> {
    v.get(field)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The rules of a rendered Role or ClusterRole.
pub fn rules_of(role: &Value) -> Vec<Rule> {
    let namespace = (role["kind"] == "Role").then(|| {
        role.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    });
    role["rules"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| Rule {
                    api_groups: strings(r, "apiGroups"),
                    resources: strings(r, "resources"),
                    verbs: strings(r, "verbs"),
                    resource_names: strings(r, "resourceNames"),
                    namespace: namespace.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

impl Rule {
    pub fn allows(&self, a: &Attributes) -> bool {
        let in_scope = match &self.namespace {
            None => true,
            Some(ns) => *ns == a.namespace,
        };
        // resourceNames never restrict create, list or watch (they name no object).
        let named = self.resource_names.is_empty()
            || matches!(a.verb, "create" | "list" | "watch")
            || self.resource_names.contains(&a.name);
        in_scope
            && named
            && has(&self.api_groups, &a.api_group)
            && has(&self.resources, &a.resource)
            && has(&self.verbs, a.verb)
    }
}

pub fn allowed(rules: &[Rule], a: &Attributes) -> bool {
    rules.iter().any(|r| r.allows(a))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn attrs(verb: &'static str, group: &str, resource: &str, ns: &str) -> Attributes {
        Attributes {
            verb,
            api_group: group.into(),
            resource: resource.into(),
            namespace: ns.into(),
            name: "x".into(),
        }
    }

    #[test]
    fn a_role_grants_in_its_namespace_and_a_cluster_role_everywhere() {
        let role = json!({"kind": "Role", "metadata": {"namespace": "egress-system"},
                          "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]});
        let cluster = json!({"kind": "ClusterRole", "metadata": {},
                             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
                                       {"apiGroups": ["g"], "resources": ["t/status"], "verbs": ["patch"]}]});
        let mut rules = rules_of(&role);
        rules.extend(rules_of(&cluster));
        let lease = |ns| attrs("get", "coordination.k8s.io", "leases", ns);
        assert!(allowed(&rules, &lease("egress-system")));
        assert!(!allowed(&rules, &lease("default")));
        assert!(allowed(&rules, &attrs("watch", "", "pods", "")));
        assert!(!allowed(&rules, &attrs("create", "", "pods", "default")));
        assert!(allowed(&rules, &attrs("patch", "g", "t/status", "")));
        assert!(!allowed(&rules, &attrs("patch", "g", "t", "")));
    }
}
