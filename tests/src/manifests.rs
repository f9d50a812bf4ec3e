//! Reading rendered Kubernetes manifests.

use serde_yaml::Value;

/// Every `image:` value anywhere in a rendered document, in order.
pub fn images_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Mapping(m) => {
            for (k, val) in m {
                match (k.as_str(), val.as_str()) {
                    (Some("image"), Some(image)) => out.push(image.to_owned()),
                    _ => images_in(val, out),
                }
            }
        }
        Value::Sequence(s) => s.iter().for_each(|x| images_in(x, out)),
        _ => {}
    }
}
