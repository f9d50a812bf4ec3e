//! The node's ResourceSlice (`resource.k8s.io/v1`): one device per GPU,
//! named `gpu-<index>`, with its attributes and two consumable capacities,
//! `memory` (bytes) and `cores` (percent of the GPU's time), each shareable
//! between claims (`allowMultipleAllocations`, KEP-5075). A request that
//! names neither gets the whole GPU (the request policies' defaults).

use serde_json::{json, Map, Value};

use super::api::{ApiError, ApiServer};
use super::devices::{Driver, Gpu};

/// The smallest share of memory a claim may ask, and its step: 256 MiB.
pub const MEMORY_STEP: u64 = 256 << 20;

/// The slice's name: the node's and the driver's (dots become dashes, as
/// object names allow either but read better so).
pub fn name(node: &str, driver: &str) -> String {
    format!("{node}-{}", driver.replace('.', "-"))
}

/// A byte count as Kubernetes writes a binary quantity: the largest of
/// Ki, Mi, Gi, Ti that divides it (`8Gi`), else plain bytes.
pub fn bytes_quantity(b: u64) -> String {
    for (shift, suffix) in [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if b != 0 && b.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", b >> shift);
        }
    }
    b.to_string()
}

/// The device entry of `gpu`.
fn device(gpu: &Gpu, driver: &Driver) -> Value {
    let mut attributes = Map::new();
    attributes.insert("uuid".into(), json!({ "string": gpu.uuid }));
    attributes.insert("index".into(), json!({ "int": gpu.index }));
    if let Some(p) = &gpu.product {
        attributes.insert("productName".into(), json!({ "string": p }));
    }
    if let Some((major, minor)) = gpu.compute_capability {
        attributes.insert(
            "computeCapability".into(),
            json!({ "string": format!("{major}.{minor}") }),
        );
    }
    // NVIDIA's versions are not semantic versions (`535.104.05` has a
    // leading zero): a string.
    if let Some(v) = &driver.version {
        attributes.insert("driverVersion".into(), json!({ "string": v }));
    }
    if let Some(c) = driver.cuda {
        attributes.insert(
            "cudaDriverVersion".into(),
            json!({ "version": format!("{}.{}.0", c / 1000, (c % 1000) / 10) }),
        );
    }
    // Memory in steps of MEMORY_STEP up to the whole GPU (the last step
    // may be short of it: the whole GPU is always a valid request, being
    // the default).
    let memory_max = gpu.memory - gpu.memory % MEMORY_STEP;
    json!({
        "name": gpu.name(),
        "attributes": attributes,
        "allowMultipleAllocations": true,
        "capacity": {
            "memory": {
                "value": bytes_quantity(gpu.memory),
                "requestPolicy": {
                    "default": bytes_quantity(gpu.memory),
                    "validRange": {
                        "min": bytes_quantity(MEMORY_STEP),
                        "max": bytes_quantity(memory_max.max(MEMORY_STEP)),
                        "step": bytes_quantity(MEMORY_STEP),
                    },
                },
            },
            "cores": {
                "value": "100",
                "requestPolicy": {
                    "default": "100",
                    "validRange": { "min": "1", "max": "100", "step": "1" },
                },
            },
        },
    })
}

/// The slice's `spec` for `gpus`, pool generation `generation`.
pub fn spec(
    driver_name: &str,
    node: &str,
    gpus: &[Gpu],
    driver: &Driver,
    generation: i64,
) -> Value {
    json!({
        "driver": driver_name,
        "nodeName": node,
        "pool": { "name": node, "generation": generation, "resourceSliceCount": 1 },
        "devices": gpus.iter().map(|g| device(g, driver)).collect::<Vec<_>>(),
    })
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// What publishing did.
#[derive(Debug, PartialEq, Eq)]
pub enum Published {
    Created,
    Replaced { generation: i64 },
    Unchanged,
}

/// Creates the node's slice, or replaces it when its devices or driver
/// changed (the pool's generation then goes up by one); a slice as wanted
/// is left alone. The Node owns the slice, so it goes with the Node.
pub async fn publish(
    api: &ApiServer,
    driver_name: &str,
    node: &str,
    gpus: &[Gpu],
    driver: &Driver,
) -> Result<Published, ApiError> {
    let name = name(node, driver_name);
    let path = format!("{SLICES}/{name}");
    let existing = api.get_json(&path).await?;
    let owner = api
        .get_json(&format!("/api/v1/nodes/{node}"))
        .await?
        .and_then(|n| n["metadata"]["uid"].as_str().map(str::to_owned))
        .map(|uid| {
            json!([{ "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid,
                     "controller": true }])
        });
    let mut metadata = json!({ "name": name });
    if let Some(o) = owner {
        metadata["ownerReferences"] = o;
    }
    match existing {
        None => {
            let slice = json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": spec(driver_name, node, gpus, driver, 1),
            });
            api.send_json(hyper::Method::POST, SLICES, &slice).await?;
            Ok(Published::Created)
        }
        Some(old) => {
            let generation = old["spec"]["pool"]["generation"].as_i64().unwrap_or(0);
            let wanted = spec(driver_name, node, gpus, driver, generation);
            if old["spec"] == wanted {
                return Ok(Published::Unchanged);
            }
            let generation = generation + 1;
            if let Some(rv) = old["metadata"]["resourceVersion"].as_str() {
                metadata["resourceVersion"] = json!(rv);
            }
            let slice = json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": spec(driver_name, node, gpus, driver, generation),
            });
            api.send_json(hyper::Method::PUT, &path, &slice).await?;
            Ok(Published::Replaced { generation })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_written_as_the_api_server_writes_them() {
        assert_eq!(bytes_quantity(8 << 30), "8Gi");
        assert_eq!(bytes_quantity(77_781 << 20), "77781Mi");
        assert_eq!(bytes_quantity(1000), "1000");
        assert_eq!(bytes_quantity(0), "0");
        assert_eq!(name("node-a", "vgpu.dev"), "node-a-vgpu-dev");
    }
}
