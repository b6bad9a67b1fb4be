use serde_json::json;

use super::*;

fn tunnels() -> Resource {
    Resource::new("egressgateway.egress.dev/v1beta1", "egresstunnels")
}

fn pods() -> Resource {
    Resource::new("v1", "pods")
}

fn tunnel(name: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {}, "status": {"phase": "Ready"}})
}

#[test]
fn create_stamps_the_object_and_drops_a_custom_resources_status() {
    let mut s = Store::default();
    let o = s.create(&tunnels(), "", tunnel("w1")).unwrap();
    assert_eq!(o["metadata"]["resourceVersion"], "1");
    assert_eq!(o["kind"], "EgressTunnel");
    assert!(o.get("status").is_none());
    let e = s.create(&tunnels(), "", tunnel("w1")).unwrap_err();
    assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
}

#[test]
fn replace_checks_the_resource_version_and_keeps_the_status() {
    let mut s = Store::default();
    s.create(&tunnels(), "", tunnel("w1")).unwrap();
    s.apply_status(
        &tunnels(),
        "",
        "w1",
        "agent",
        true,
        &json!({"status": {"tunnel": {"ipv4": "10.0.0.1"}}}),
    )
    .unwrap();
    let mut stale = s.get(&tunnels(), "", "w1").unwrap();
    stale["metadata"]["resourceVersion"] = json!("1");
    assert_eq!(
        s.replace(&tunnels(), "", "w1", stale).unwrap_err().code,
        409
    );
    let mut cur = s.get(&tunnels(), "", "w1").unwrap();
    cur["status"] = json!({});
    cur["spec"] = json!({"x": 1});
    let o = s.replace(&tunnels(), "", "w1", cur).unwrap();
    assert_eq!(o["status"]["tunnel"]["ipv4"], "10.0.0.1");
    assert_eq!(o["spec"]["x"], 1);
}

#[test]
fn apply_removes_only_what_the_manager_owned_and_left_out() {
    let mut s = Store::default();
    s.create(&tunnels(), "", tunnel("w1")).unwrap();
    let r = tunnels();
    s.apply_status(
        &r,
        "",
        "w1",
        "agent",
        true,
        &json!({"status": {"tunnel": 1, "mac": 2}}),
    )
    .unwrap();
    s.apply_status(
        &r,
        "",
        "w1",
        "controller",
        true,
        &json!({"status": {"phase": "Ready"}}),
    )
    .unwrap();
    let o = s
        .apply_status(
            &r,
            "",
            "w1",
            "agent",
            true,
            &json!({"status": {"tunnel": 3}}),
        )
        .unwrap();
    assert_eq!(o["status"], json!({"tunnel": 3, "phase": "Ready"}));
    // Without force, another manager's field is a conflict.
    let e = s
        .apply_status(
            &r,
            "",
            "w1",
            "agent",
            false,
            &json!({"status": {"phase": "X"}}),
        )
        .unwrap_err();
    assert_eq!(e.code, 409);
}

#[test]
fn a_pod_leaving_a_field_selector_is_deleted_for_its_watchers() {
    let mut s = Store::default();
    let pod = |node: &str| json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": node}});
    s.create(&pods(), "default", pod("w1")).unwrap();
    let mut moved = s.get(&pods(), "default", "p").unwrap();
    moved["spec"]["nodeName"] = json!("w2");
    s.replace(&pods(), "default", "p", moved).unwrap();
    let w1 = Selector::parse(None, Some("spec.nodeName=w1")).unwrap();
    let w2 = Selector::parse(None, Some("spec.nodeName=w2")).unwrap();
    let types = |sel: &Selector| -> Vec<&str> {
        s.events_after(&pods(), "", sel, 0)
            .unwrap()
            .into_iter()
            .map(|(t, _)| t)
            .collect()
    };
    assert_eq!(types(&w1), ["ADDED", "DELETED"]);
    assert_eq!(types(&w2), ["ADDED"]);
    assert_eq!(s.events_after(&pods(), "", &w1, 1).unwrap().len(), 1);
    s.compact();
    assert_eq!(s.events_after(&pods(), "", &w1, 1).unwrap_err().code, 410);
    assert!(s.events_after(&pods(), "", &w1, 2).unwrap().is_empty());
}

#[test]
fn delete_honours_its_precondition() {
    let mut s = Store::default();
    s.create(&tunnels(), "", tunnel("w1")).unwrap();
    assert_eq!(
        s.delete(&tunnels(), "", "w1", Some("7")).unwrap_err().code,
        409
    );
    let gone = s.delete(&tunnels(), "", "w1", Some("1")).unwrap();
    assert_eq!(gone["metadata"]["resourceVersion"], "2");
    assert_eq!(s.get(&tunnels(), "", "w1").unwrap_err().code, 404);
    let all = Selector::default();
    let t: Vec<_> = s
        .events_after(&tunnels(), "", &all, 0)
        .unwrap()
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(t, ["ADDED", "DELETED"]);
}

#[test]
fn merge_patch_follows_rfc_7386() {
    let mut t = json!({"a": {"b": 1, "c": 2}, "d": 3});
    merge_patch(&mut t, &json!({"a": {"b": null, "e": 4}, "d": [1]}));
    assert_eq!(t, json!({"a": {"c": 2, "e": 4}, "d": [1]}));
}

#[test]
fn dates_are_civil() {
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(20_787), (2026, 11, 30));
}
