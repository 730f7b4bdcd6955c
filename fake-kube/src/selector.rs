//! Label and field selectors, in the query-string syntax (`app=web,tier in (a,b),!legacy`) and in
//! the `metav1.LabelSelector` object form used by workloads.

use serde_json::{Map, Value};

use super::schema::names;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Operator {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let value = labels
            .and_then(|labels| labels.get(&self.key))
            .and_then(Value::as_str);
        match self.operator {
            Operator::Equals | Operator::In => {
                value.is_some_and(|v| self.values.iter().any(|x| x == v))
            }
            Operator::NotEquals | Operator::NotIn => {
                value.is_none_or(|v| self.values.iter().all(|x| x != v))
            }
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(value), Some(bound)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    value > bound
                } else {
                    value < bound
                }
            }
        }
    }
}

/// A parsed `labelSelector` query parameter; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// Parses the string syntax; the error text is what the server answers with 400.
    pub(crate) fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        for term in split_top_level(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(term)?);
        }
        Ok(LabelSelector(requirements))
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        self.0.iter().all(|requirement| requirement.matches(labels))
    }
}

/// Splits at commas that are not inside `( )`.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    let invalid = |why: &str| format!("unable to parse requirement: {term:?}: {why}");
    let requirement = if let Some(key) = term.strip_prefix('!') {
        Requirement {
            key: key.trim().to_string(),
            operator: Operator::DoesNotExist,
            values: Vec::new(),
        }
    } else if let Some(open) = term.find('(') {
        let close = term
            .rfind(')')
            .filter(|close| *close > open)
            .ok_or_else(|| invalid("missing ')'"))?;
        if !term[close + 1..].trim().is_empty() {
            return Err(invalid("unexpected text after ')'"));
        }
        let head = term[..open].trim();
        let (key, operator) = if let Some(key) = head.strip_suffix("notin") {
            (key, Operator::NotIn)
        } else if let Some(key) = head.strip_suffix("in") {
            (key, Operator::In)
        } else {
            return Err(invalid("expected 'in' or 'notin'"));
        };
        if !key.ends_with(char::is_whitespace) {
            return Err(invalid("expected whitespace before the set operator"));
        }
        let values = term[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_string())
            .collect::<Vec<_>>();
        Requirement {
            key: key.trim().to_string(),
            operator,
            values,
        }
    } else {
        let (key, operator, value) = if let Some((k, v)) = term.split_once("!=") {
            (k, Operator::NotEquals, Some(v))
        } else if let Some((k, v)) = term.split_once("==") {
            (k, Operator::Equals, Some(v))
        } else if let Some((k, v)) = term.split_once('=') {
            (k, Operator::Equals, Some(v))
        } else if let Some((k, v)) = term.split_once('>') {
            (k, Operator::GreaterThan, Some(v))
        } else if let Some((k, v)) = term.split_once('<') {
            (k, Operator::LessThan, Some(v))
        } else {
            (term, Operator::Exists, None)
        };
        Requirement {
            key: key.trim().to_string(),
            operator,
            values: value
                .map(|v| vec![v.trim().to_string()])
                .unwrap_or_default(),
        }
    };
    if let Err(why) = names::check_qualified_name(&requirement.key) {
        return Err(invalid(&why));
    }
    for value in &requirement.values {
        if matches!(
            requirement.operator,
            Operator::GreaterThan | Operator::LessThan
        ) {
            if value.parse::<i64>().is_err() {
                return Err(invalid("the value must be an integer"));
            }
        } else if !names::is_label_value(value) {
            return Err(invalid(&format!("invalid label value {value:?}")));
        }
    }
    Ok(requirement)
}

/// A parsed `fieldSelector`: `path=value` / `path==value` / `path!=value` terms, ANDed, where the
/// path is any dotted field of the object (`metadata.name`, `involvedObject.uid`, `status.phase`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub(crate) fn parse(text: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in text.split(',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (path, equal, value) = if let Some((p, v)) = term.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = term.split_once("==") {
                (p, true, v)
            } else if let Some((p, v)) = term.split_once('=') {
                (p, true, v)
            } else {
                return Err(format!(
                    "invalid selector: {term:?}; can't understand {term:?}"
                ));
            };
            terms.push((path.trim().to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, equal, expected)| {
            let mut current = Some(object);
            for part in path.split('.') {
                current = current.and_then(|v| v.get(part));
            }
            let actual = match current {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (actual == *expected) == *equal
        })
    }

    /// The value a selector pins `metadata.name` to, for single-object watches.
    #[cfg(test)]
    pub(crate) fn name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(path, equal, _)| path == "metadata.name" && *equal)
            .map(|(_, _, value)| value.as_str())
    }
}

/// Evaluates a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions`) against labels.
/// A missing or null selector matches nothing; an empty one matches everything.
pub(crate) fn label_selector_object_matches(
    selector: &Value,
    labels: Option<&Map<String, Value>>,
) -> bool {
    let Some(selector) = selector.as_object() else {
        return false;
    };
    let match_labels = selector.get("matchLabels").and_then(Value::as_object);
    for (key, value) in match_labels.into_iter().flatten() {
        if labels.and_then(|labels| labels.get(key)) != Some(value) {
            return false;
        }
    }
    let expressions = selector.get("matchExpressions").and_then(Value::as_array);
    for expression in expressions.into_iter().flatten() {
        let key = expression
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let values = expression
            .get("values")
            .and_then(Value::as_array)
            .map(|values| {
                values
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let operator = match expression.get("operator").and_then(Value::as_str) {
            Some("In") => Operator::In,
            Some("NotIn") => Operator::NotIn,
            Some("Exists") => Operator::Exists,
            Some("DoesNotExist") => Operator::DoesNotExist,
            _ => return false,
        };
        let requirement = Requirement {
            key: key.to_string(),
            operator,
            values,
        };
        if !requirement.matches(labels) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "labels": labels}})
    }

    #[test]
    fn equality_and_inequality() {
        let web = labelled(json!({"app": "web", "tier": "front"}));
        let db = labelled(json!({"app": "db"}));
        let selector = LabelSelector::parse("app=web").unwrap();
        assert!(selector.matches(&web));
        assert!(!selector.matches(&db));
        assert!(LabelSelector::parse("app==web").unwrap().matches(&web));
        let not_web = LabelSelector::parse("app!=web").unwrap();
        assert!(!not_web.matches(&web));
        assert!(not_web.matches(&db));
        // `!=` also matches objects without the label, as in Kubernetes.
        assert!(LabelSelector::parse("tier!=front").unwrap().matches(&db));
    }

    #[test]
    fn set_based_and_existence() {
        let web = labelled(json!({"app": "web", "tier": "front"}));
        let db = labelled(json!({"app": "db"}));
        let selector = LabelSelector::parse("app in (web, api),tier").unwrap();
        assert!(selector.matches(&web));
        assert!(!selector.matches(&db));
        let selector = LabelSelector::parse("app notin (web),!tier").unwrap();
        assert!(!selector.matches(&web));
        assert!(selector.matches(&db));
        assert!(LabelSelector::parse("").unwrap().matches(&db));
        assert!(!LabelSelector::parse("missing").unwrap().matches(&db));
        assert!(
            LabelSelector::parse("!missing")
                .unwrap()
                .matches(&json!({"metadata": {}}))
        );
    }

    #[test]
    fn rejects_malformed_selectors() {
        for text in [
            "app in web",
            "app in (web",
            "bad key=x",
            "app=bad value",
            "app in(web)x",
        ] {
            assert!(
                LabelSelector::parse(text).is_err(),
                "{text:?} should not parse"
            );
        }
    }

    #[test]
    fn field_selectors_compare_dotted_paths() {
        let event = json!({"metadata": {"name": "e1", "namespace": "ns"}, "involvedObject": {"uid": "u-1"}, "count": 3});
        assert!(
            FieldSelector::parse("metadata.name=e1")
                .unwrap()
                .matches(&event)
        );
        assert!(
            FieldSelector::parse("metadata.namespace==ns,involvedObject.uid=u-1")
                .unwrap()
                .matches(&event)
        );
        assert!(
            !FieldSelector::parse("involvedObject.uid=u-2")
                .unwrap()
                .matches(&event)
        );
        assert!(
            FieldSelector::parse("involvedObject.uid!=u-2")
                .unwrap()
                .matches(&event)
        );
        assert!(FieldSelector::parse("count=3").unwrap().matches(&event));
        assert!(
            FieldSelector::parse("spec.nodeName=")
                .unwrap()
                .matches(&event)
        );
        assert_eq!(
            FieldSelector::parse("metadata.name=e1").unwrap().name(),
            Some("e1")
        );
        assert!(FieldSelector::parse("nonsense").is_err());
    }

    #[test]
    fn label_selector_objects() {
        let labels = json!({"app": "web", "tier": "front"});
        let labels = labels.as_object();
        assert!(label_selector_object_matches(
            &json!({"matchLabels": {"app": "web"}}),
            labels
        ));
        assert!(!label_selector_object_matches(
            &json!({"matchLabels": {"app": "db"}}),
            labels
        ));
        assert!(label_selector_object_matches(
            &json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]}),
            labels
        ));
        assert!(!label_selector_object_matches(
            &json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
            labels
        ));
        assert!(!label_selector_object_matches(&Value::Null, labels));
    }
}
