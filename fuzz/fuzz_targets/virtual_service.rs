//! VirtualServices as the proxy reads them from the cluster (a namespace's owner may write their
//! own): any JSON that parses as one compiles into a route table or is skipped, never a panic.
#![no_main]

use labforge_crds::istio::VirtualService;
use labforge_proxy::activity::Activity;
use labforge_proxy::routes::{GatewayFilter, RouteTable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(vs) = serde_json::from_slice::<VirtualService>(data) else {
        return;
    };
    let activity = Activity::default();
    let _ = RouteTable::build([&vs], &GatewayFilter(None), &activity);
    let _ = RouteTable::build(
        [&vs],
        &GatewayFilter(Some("kubeflow/kubeflow-gateway".into())),
        &activity,
    );
});
