//! What the API server does to a custom resource before it stores it,
//! from the CRD's structural schema (`openAPIV3Schema`): nulls of
//! non-nullable fields are dropped, unknown fields pruned, defaults
//! filled in, then the value is validated (types, enums, required fields,
//! minimum and maximum). A field the code writes and the CRD lacks is
//! silently lost on a real cluster, and one that breaks the schema makes
//! the whole write fail: both show up here as they would there.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

use super::store::Resource;

/// The schemas of the CRDs in `dir` (YAML files), by resource.
pub fn load_crds(dir: &Path) -> Result<HashMap<Resource, Value>> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let crd = Value::deserialize(doc)?;
            if crd["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let group = crd["spec"]["group"].as_str().context("spec.group")?;
            let plural = crd["spec"]["names"]["plural"]
                .as_str()
                .context("spec.names.plural")?;
            for v in crd["spec"]["versions"]
                .as_array()
                .context("spec.versions")?
            {
                let name = v["name"].as_str().context("version name")?;
                let schema = v.pointer("/schema/openAPIV3Schema").with_context(|| {
                    format!("{}: {plural} {name} has no schema", path.display())
                })?;
                out.insert(
                    Resource::new(&format!("{group}/{name}"), plural),
                    schema.clone(),
                );
            }
        }
    }
    Ok(out)
}

/// Prunes, defaults and validates `obj` (whole object; `metadata`,
/// `apiVersion` and `kind` are the server's and left alone). The errors
/// name each field as the API server does (`status.phase: ...`).
pub fn admit(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(o) = obj.as_object_mut() else {
        return vec!["the object is not a JSON object".into()];
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let keys: Vec<String> = o.keys().cloned().collect();
    for k in keys {
        if matches!(k.as_str(), "metadata" | "apiVersion" | "kind") {
            continue;
        }
        match props.and_then(|p| p.get(&k)) {
            Some(s) => {
                let v = o.get_mut(&k).expect("listed");
                if walk(s, v, &k, &mut errors) == Keep::Drop {
                    o.remove(&k);
                }
            }
            None => {
                o.remove(&k);
            }
        }
    }
    errors
}

#[derive(PartialEq)]
enum Keep {
    Yes,
    Drop,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn walk(schema: &Value, v: &mut Value, path: &str, errors: &mut Vec<String>) -> Keep {
    if v.is_null() {
        // A null where the schema does not allow one is dropped, not refused.
        return if schema["nullable"] == true {
            Keep::Yes
        } else {
            Keep::Drop
        };
    }
    let want = schema["type"].as_str().unwrap_or_default();
    let have = type_name(v);
    let fits = want.is_empty() || want == have || (want == "number" && have == "integer");
    if !fits {
        errors.push(format!(
            "{path}: Invalid value: \"{have}\": {path} in body must be of type {want}"
        ));
        return Keep::Yes;
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(v) {
            let list: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
            errors.push(format!(
                "{path}: Unsupported value: {v}: supported values: {}",
                list.join(", ")
            ));
        }
    }
    if let Some(n) = v.as_f64() {
        if schema["minimum"].as_f64().is_some_and(|m| n < m) {
            errors.push(format!(
                "{path}: Invalid value: {n}: should be greater than or equal to {}",
                schema["minimum"]
            ));
        }
        if schema["maximum"].as_f64().is_some_and(|m| n > m) {
            errors.push(format!(
                "{path}: Invalid value: {n}: should be less than or equal to {}",
                schema["maximum"]
            ));
        }
    }
    match v {
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                let mut i = 0;
                items.retain_mut(|item| {
                    let keep = walk(s, item, &format!("{path}[{i}]"), errors) == Keep::Yes;
                    i += 1;
                    keep
                });
            }
        }
        Value::Object(o) => {
            let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            let keys: Vec<String> = o.keys().cloned().collect();
            for k in keys {
                let sub = props.and_then(|p| p.get(&k)).or(extra);
                let child = format!("{path}.{k}");
                match sub {
                    Some(s) => {
                        if walk(s, o.get_mut(&k).expect("listed"), &child, errors) == Keep::Drop {
                            o.remove(&k);
                        }
                    }
                    None if preserve => {}
                    None => {
                        o.remove(&k);
                    }
                }
            }
            if let Some(props) = props {
                for (k, s) in props {
                    if let (false, Some(d)) = (o.contains_key(k), s.get("default")) {
                        o.insert(k.clone(), d.clone());
                    }
                }
            }
            for r in schema["required"].as_array().into_iter().flatten() {
                if let Some(r) = r.as_str().filter(|r| !o.contains_key(*r)) {
                    errors.push(format!("{path}.{r}: Required value"));
                }
            }
        }
        _ => {}
    }
    Keep::Yes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({"properties": {
            "spec": {"type": "object", "properties": {
                "n": {"type": "integer", "minimum": 0.0},
                "keep": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "opt": {"type": "string", "nullable": true}}},
            "status": {"type": "object", "nullable": true, "properties": {
                "phase": {"type": "string", "enum": ["Pending", "Ready"], "default": "Pending"},
                "items": {"type": "array", "items": {"type": "object", "required": ["eip"],
                          "properties": {"eip": {"type": "string"}}}}}}}})
    }

    #[test]
    fn unknown_fields_are_pruned_nulls_dropped_and_defaults_filled() {
        let mut o = json!({"metadata": {"name": "x"}, "spec": {"n": 1, "extra": 2, "keep": {"a": 1}, "opt": null},
                           "status": {"items": [{"eip": "1.2.3.4", "junk": true}]}, "other": 1});
        assert!(admit(&schema(), &mut o).is_empty());
        assert_eq!(
            o,
            json!({"metadata": {"name": "x"}, "spec": {"n": 1, "keep": {"a": 1}, "opt": null},
                   "status": {"items": [{"eip": "1.2.3.4"}], "phase": "Pending"}})
        );
    }

    #[test]
    fn types_enums_minimums_and_required_fields_are_checked() {
        let mut o = json!({"spec": {"n": -1}, "status": {"phase": "Gone", "items": [{}]}});
        let errors = admit(&schema(), &mut o);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors.iter().any(|e| e.starts_with("spec.n:")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("status.phase: Unsupported value")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e == "status.items[0].eip: Required value"),
            "{errors:?}"
        );
        let mut wrong = json!({"spec": {"n": "1"}});
        assert_eq!(admit(&schema(), &mut wrong).len(), 1);
    }

    #[test]
    fn the_charts_crds_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/egress-gateway/crds");
        let crds = load_crds(&dir).unwrap();
        assert!(crds.contains_key(&Resource::new(
            "egressgateway.egress.dev/v1beta1",
            "egresstunnels"
        )));
        assert_eq!(crds.len(), 4);
    }
}
