use serde_json::{json, Value};

use crate::{find, render, render_with, NAMESPACE, VAP_API};

/// The agents' admission policy among the rendered objects.
fn agent_policy(objs: &[Value]) -> &Value {
    find(
        objs,
        "ValidatingAdmissionPolicy",
        "egw-egress-gateway-agent-own-node",
    )
}

/// A string of the policy (a CEL expression) at this JSON pointer.
fn expression<'a>(vap: &'a Value, pointer: &str) -> &'a str {
    vap.pointer(pointer).and_then(Value::as_str).unwrap()
}

#[test]
fn agent_admission_policy() {
    // rendered only where the cluster serves the API
    let objs = render(&json!({}));
    assert!(objs
        .iter()
        .all(|o| o["kind"] != "ValidatingAdmissionPolicy"));
    let objs = render_with(&json!({}), &["--api-versions", VAP_API]);
    let vap = agent_policy(&objs);
    let condition = expression(vap, "/spec/matchConditions/0/expression");
    assert!(
        condition.contains(&format!(
            "system:serviceaccount:{NAMESPACE}:egw-egress-gateway-agent"
        )),
        "{condition}"
    );
    let rule = expression(vap, "/spec/validations/0/expression");
    assert!(
        rule.contains("authentication.kubernetes.io/node-name"),
        "{rule}"
    );
    let resources: Vec<&str> = vap["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
        })
        .collect();
    assert!(
        resources.contains(&"egresstunnels/status") && resources.contains(&"leases"),
        "{resources:?}"
    );
    let binding = find(
        &objs,
        "ValidatingAdmissionPolicyBinding",
        "egw-egress-gateway-agent-own-node",
    );
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let objs = render_with(
        &json!({"rbac": {"agentOwnNodeOnly": false}}),
        &["--api-versions", VAP_API],
    );
    assert!(objs
        .iter()
        .all(|o| o["kind"] != "ValidatingAdmissionPolicy"));
}

// ---------------------------------------------------------------------------
// The admission policy's CEL, evaluated
// ---------------------------------------------------------------------------

/// Evaluates a CEL expression with `request` bound to an admission request.
/// cel-interpreter is not the API server's CEL environment (no Kubernetes
/// extension libraries, no type checking), so this checks the logic of the
/// expressions, not that the API server compiles them.
fn cel(expr: &str, request: &Value) -> Result<cel_interpreter::Value, String> {
    let program = cel_interpreter::Program::compile(expr).map_err(|e| format!("{expr}: {e}"))?;
    let mut ctx = cel_interpreter::Context::default();
    ctx.add_variable("request", request.clone())
        .map_err(|e| e.to_string())?;
    program.execute(&ctx).map_err(|e| format!("{expr}: {e}"))
}

#[test]
fn agent_admission_policy_expressions() {
    let objs = render_with(&json!({}), &["--api-versions", VAP_API]);
    let vap = agent_policy(&objs);
    let condition = expression(vap, "/spec/matchConditions/0/expression");
    let validation = expression(vap, "/spec/validations/0/expression");
    let message = expression(vap, "/spec/validations/0/messageExpression");
    let agent = format!("system:serviceaccount:{NAMESPACE}:egw-egress-gateway-agent");
    let request = |user: &str, name: &str, extra: Value| json!({"name": name, "userInfo": {"username": user, "extra": extra}});
    let on_node = |node: &str| json!({"authentication.kubernetes.io/node-name": [node]});
    let yes = cel_interpreter::Value::Bool(true);
    let no = cel_interpreter::Value::Bool(false);

    // the policy looks at the agent only
    assert_eq!(
        cel(condition, &request(&agent, "node-a", on_node("node-a"))),
        Ok(yes.clone())
    );
    for other in [
        format!("system:serviceaccount:{NAMESPACE}:egw-egress-gateway-controller"),
        "system:serviceaccount:other:egw-egress-gateway-agent".to_owned(),
        "kubernetes-admin".to_owned(),
    ] {
        assert_eq!(
            cel(condition, &request(&other, "x", json!({}))),
            Ok(no.clone()),
            "{other}"
        );
    }
    // its own node's objects pass, any other name is refused
    assert_eq!(
        cel(validation, &request(&agent, "node-a", on_node("node-a"))),
        Ok(yes)
    );
    assert_eq!(
        cel(validation, &request(&agent, "node-b", on_node("node-a"))),
        Ok(no.clone())
    );
    assert_eq!(
        cel(
            validation,
            &request(&agent, "egw-egress-gateway-controller", on_node("node-a"))
        ),
        Ok(no.clone()),
        "an agent took the leader's Lease"
    );
    // a token without the node name (older cluster, or not pod-bound) is refused, not an error
    assert_eq!(
        cel(validation, &request(&agent, "node-a", json!({}))),
        Ok(no.clone())
    );
    assert_eq!(
        cel(
            validation,
            &json!({"name": "node-a", "userInfo": {"username": agent}})
        ),
        Ok(no)
    );
    let text = cel(message, &request(&agent, "node-b", on_node("node-a"))).unwrap();
    match text {
        cel_interpreter::Value::String(s) => assert!(s.ends_with("node-b"), "{s}"),
        other => panic!("messageExpression gave {other:?}"),
    }
}
