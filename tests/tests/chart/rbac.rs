use std::{collections::BTreeSet, path::PathBuf};

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::{json, Value};

use crate::{chart_dir, check_k8s_schema, find, render, yaml_file, GROUP, NAMESPACE};

// ---------------------------------------------------------------------------
// 3. RBAC least privilege
// ---------------------------------------------------------------------------

const CRD_PLURALS: &[&str] = &[
    "egressclusterpolicies",
    "egressgateways",
    "egresspolicies",
    "egresstunnels",
];
const READ: &[&str] = &["get", "list", "watch"];

/// (apiGroup, resource, verb, namespaced role?) for every grant of one role kind and name.
fn grants(objs: &[Value], kind: &str, name: &str) -> Vec<(String, String, String)> {
    let rules: Vec<PolicyRule> =
        serde_json::from_value(find(objs, kind, name)["rules"].clone()).expect("rules");
    let mut out = Vec::new();
    for r in rules {
        assert!(r.non_resource_urls.is_none(), "{name}: nonResourceURLs");
        assert!(
            r.resource_names.is_none(),
            "{name}: resourceNames are not used"
        );
        for g in r.api_groups.unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                for v in &r.verbs {
                    out.push((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn writes(g: &[(String, String, String)]) -> BTreeSet<(String, String)> {
    g.iter()
        .filter(|(_, _, v)| !READ.contains(&v.as_str()))
        .map(|(grp, res, _)| (grp.clone(), res.clone()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    list.iter()
        .map(|(g, r)| (g.to_string(), r.to_string()))
        .collect()
}

#[test]
fn rbac_has_no_wildcards_or_secrets() {
    let objs = render(&json!({}));
    let mut roles = 0;
    for o in objs
        .iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
    {
        roles += 1;
        let rules: Vec<PolicyRule> = serde_json::from_value(o["rules"].clone()).unwrap();
        for r in rules {
            let all = r
                .api_groups
                .iter()
                .flatten()
                .chain(r.resources.iter().flatten())
                .chain(r.verbs.iter());
            for word in all {
                assert!(
                    !word.contains('*'),
                    "{}: wildcard {word:?}",
                    o["metadata"]["name"]
                );
            }
            for res in r.resources.iter().flatten() {
                assert!(
                    !matches!(
                        res.as_str(),
                        "secrets"
                            | "configmaps"
                            | "serviceaccounts/token"
                            | "nodes/proxy"
                            | "pods/exec"
                    ),
                    "{}: access to {res}",
                    o["metadata"]["name"]
                );
            }
            for v in &r.verbs {
                assert!(
                    !matches!(
                        v.as_str(),
                        "escalate" | "bind" | "impersonate" | "deletecollection"
                    ),
                    "{}: verb {v}",
                    o["metadata"]["name"]
                );
            }
        }
    }
    assert_eq!(roles, 4, "two roles each for the agent and the controller");
}

#[test]
fn agent_rbac_is_least_privilege() {
    let objs = render(&json!({}));
    let cluster = grants(&objs, "ClusterRole", "egw-egress-gateway-agent");
    let namespaced = grants(&objs, "Role", "egw-egress-gateway-agent");
    // writes: its EgressTunnel's status cluster-wide, Leases in the release namespace only
    assert_eq!(writes(&cluster), pairs(&[(GROUP, "egresstunnels/status")]));
    assert_eq!(
        writes(&namespaced),
        pairs(&[("coordination.k8s.io", "leases")])
    );
    let verbs = |g: &[(String, String, String)], res: &str| -> BTreeSet<String> {
        g.iter()
            .filter(|(_, r, _)| r == res)
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    assert!(!verbs(&cluster, "egresstunnels/status").contains("delete"));
    assert!(
        !verbs(&namespaced, "leases").contains("delete"),
        "an agent may not delete Leases (the leader's)"
    );
    // reads: what decides the maps
    for res in [
        "egresspolicies",
        "egressclusterpolicies",
        "egressgateways",
        "egresstunnels",
    ] {
        for v in READ {
            assert!(
                cluster.contains(&(GROUP.into(), res.into(), v.to_string())),
                "agent cannot {v} {res}"
            );
        }
    }
    for res in ["nodes", "pods"] {
        for v in READ {
            assert!(
                cluster.contains(&(String::new(), res.into(), v.to_string())),
                "agent cannot {v} {res}"
            );
        }
    }
    // every CRD resource named exists
    for (g, res, _) in &cluster {
        if g == GROUP {
            let plural = res.split('/').next().unwrap();
            assert!(CRD_PLURALS.contains(&plural), "unknown resource {res}");
        }
    }
    check_binding(
        &objs,
        "ClusterRoleBinding",
        "egw-egress-gateway-agent",
        "ClusterRole",
    );
    check_binding(&objs, "RoleBinding", "egw-egress-gateway-agent", "Role");
    let role = find(&objs, "Role", "egw-egress-gateway-agent");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
}

#[test]
fn controller_rbac_is_least_privilege() {
    let objs = render(&json!({}));
    let cluster = grants(&objs, "ClusterRole", "egw-egress-gateway-controller");
    let namespaced = grants(&objs, "Role", "egw-egress-gateway-controller");
    let allowed_writes: BTreeSet<(String, String)> = CRD_PLURALS
        .iter()
        .flat_map(|p| {
            [
                (GROUP.to_owned(), p.to_string()),
                (GROUP.to_owned(), format!("{p}/status")),
            ]
        })
        .chain([
            ("".to_owned(), "events".to_owned()),
            ("events.k8s.io".to_owned(), "events".to_owned()),
        ])
        .collect();
    let w = writes(&cluster);
    assert!(
        w.is_subset(&allowed_writes),
        "controller writes outside its objects: {:?}",
        w.difference(&allowed_writes)
    );
    for p in CRD_PLURALS {
        assert!(
            w.contains(&(GROUP.to_owned(), format!("{p}/status"))),
            "controller cannot write {p}/status"
        );
        for v in READ {
            assert!(
                cluster.contains(&(GROUP.into(), p.to_string(), v.to_string())),
                "controller cannot {v} {p}"
            );
        }
    }
    // events: create and patch only
    let event_verbs: BTreeSet<&str> = cluster
        .iter()
        .filter(|(_, r, _)| r == "events")
        .map(|(_, _, v)| v.as_str())
        .collect();
    assert_eq!(event_verbs, ["create", "patch"].into());
    // core objects: read only
    for (g, res, v) in &cluster {
        if g.is_empty() && res != "events" {
            assert!(READ.contains(&v.as_str()), "controller may {v} {res}");
        }
    }
    // deleting is for EgressTunnels of removed nodes only
    let deletes: BTreeSet<&str> = cluster
        .iter()
        .filter(|(_, _, v)| v == "delete")
        .map(|(_, r, _)| r.as_str())
        .collect();
    assert_eq!(deletes, ["egresstunnels"].into());
    // it creates the EgressTunnels (one per node; the agent may not)
    assert!(cluster
        .iter()
        .any(|(g, r, v)| g == GROUP && r == "egresstunnels" && v == "create"));
    // Leases: in the release namespace only
    assert_eq!(
        writes(&namespaced),
        pairs(&[("coordination.k8s.io", "leases")])
    );
    assert!(
        cluster.iter().all(|(_, r, _)| r != "leases"),
        "cluster-wide Lease access"
    );
    check_binding(
        &objs,
        "ClusterRoleBinding",
        "egw-egress-gateway-controller",
        "ClusterRole",
    );
    check_binding(
        &objs,
        "RoleBinding",
        "egw-egress-gateway-controller",
        "Role",
    );
}

/// A binding gives its role to the service account of the same name, in the
/// release namespace, and that account is the one the pods run as.
fn check_binding(objs: &[Value], kind: &str, name: &str, role_kind: &str) {
    let b = find(objs, kind, name);
    assert_eq!(b["roleRef"]["kind"], role_kind);
    assert_eq!(b["roleRef"]["name"], name);
    let subjects = b["subjects"].as_array().unwrap();
    assert_eq!(subjects.len(), 1, "{name}: one subject");
    assert_eq!(subjects[0]["kind"], "ServiceAccount");
    assert_eq!(subjects[0]["name"], name);
    assert_eq!(subjects[0]["namespace"], NAMESPACE);
    find(objs, "ServiceAccount", name);
}

/// The CRDs in `crds/` (generated from the Rust types by another part of the
/// project, drift-tested there) are valid CustomResourceDefinitions of this
/// project's group, the RBAC rules name exactly their plurals, and each has
/// the status subresource that the `*/status` rules grant.
#[test]
fn crds_match_the_rbac_rules() {
    let dir = chart_dir().join("crds");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
                .collect()
        })
        .unwrap_or_default();
    assert!(!files.is_empty(), "{} holds no CRDs", dir.display());
    let mut plurals = BTreeSet::new();
    for f in files {
        let crd = yaml_file(&f);
        if let Err(e) = check_k8s_schema(&crd) {
            panic!("{}: {e}", f.display());
        }
        assert_eq!(crd["spec"]["group"], GROUP, "{}", f.display());
        for v in crd["spec"]["versions"].as_array().unwrap() {
            assert!(
                v["subresources"]["status"].is_object(),
                "{}: version {} has no status subresource",
                f.display(),
                v["name"]
            );
        }
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap().to_owned();
        let scope = crd["spec"]["scope"].as_str().unwrap();
        // EgressPolicy is the one namespaced kind (DESIGN.md)
        let want_scope = if plural == "egresspolicies" {
            "Namespaced"
        } else {
            "Cluster"
        };
        assert_eq!(scope, want_scope, "{plural}");
        plurals.insert(plural);
    }
    let want: BTreeSet<String> = CRD_PLURALS.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        plurals, want,
        "the RBAC rules name other plurals than the CRDs"
    );
}
