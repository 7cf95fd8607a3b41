//! Configuration pushed over xDS, as the reference's CONFIG_TYPE=GRPC_XDS_SOTW takes it (the
//! way Envoy Gateway configures its rate limit service): one ADS stream
//! (envoy.service.discovery.v3.AggregatedDiscoveryService) to CONFIG_GRPC_XDS_SERVER_URL,
//! subscribed to `ratelimit.config.ratelimit.v3.RateLimitConfig` as node
//! CONFIG_GRPC_XDS_NODE_ID. Each response is the whole configuration (state of the world):
//! it is loaded as the files are (the same checks, the resource's name starting each
//! error) and acknowledged, or refused with its error (the last good one stays). A lost
//! stream is dialled again after CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL.

use crate::config::{Config, FileDoc, NodeDoc, RateLimitDoc, ReplacesDoc};
use crate::log;
use crate::metrics::Metrics;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Value as PbValue};
use envoy_types::pb::ratelimit::config::ratelimit::v3 as rls_conf;
use prost::Message;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

pub struct Source {
    pub url: String,
    pub node_id: String,
    pub retry: Duration,
    pub merge: bool,
}

/// A Go duration as the reference's settings write them (`3s`, `500ms`, `1m`), or seconds.
pub fn duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().ok()?;
    let seconds = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

impl Source {
    pub fn from_env() -> Result<Source, String> {
        let get = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        let retry_text = get("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s");
        let retry = duration(&retry_text)
            .ok_or_else(|| format!("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL: not a duration: {retry_text:?}"))?;
        Ok(Source {
            url: get("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
            node_id: get("CONFIG_GRPC_XDS_NODE_ID", "default"),
            retry,
            merge: crate::service::env_bool("MERGE_DOMAIN_CONFIG")?,
        })
    }
}

fn json_of(v: &PbValue) -> serde_yaml::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_yaml::Value::Null,
        Some(Kind::NumberValue(n)) => serde_yaml::Value::Number((*n).into()),
        Some(Kind::StringValue(s)) => serde_yaml::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_yaml::Value::Bool(*b),
        Some(Kind::StructValue(s)) => serde_yaml::Value::Mapping(
            s.fields.iter().map(|(k, v)| (serde_yaml::Value::String(k.clone()), json_of(v))).collect(),
        ),
        Some(Kind::ListValue(l)) => serde_yaml::Value::Sequence(l.values.iter().map(json_of).collect()),
    }
}

fn unit_text(unit: i32) -> String {
    rls_conf::RateLimitUnit::try_from(unit).map_or_else(|_| unit.to_string(), |u| u.as_str_name().to_owned())
}

fn node_of(d: rls_conf::RateLimitDescriptor) -> NodeDoc {
    NodeDoc {
        key: d.key,
        value: d.value,
        rate_limit: d.rate_limit.map(|p| RateLimitDoc {
            name: p.name,
            replaces: p.replaces.into_iter().map(|r| ReplacesDoc { name: r.name }).collect(),
            unit: unit_text(p.unit),
            requests_per_unit: p.requests_per_unit,
            unlimited: p.unlimited,
            ..Default::default()
        }),
        descriptors: d.descriptors.into_iter().map(node_of).collect(),
        shadow_mode: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        metadata: d.metadata.map(|s| {
            serde_yaml::Value::Mapping(
                s.fields.iter().map(|(k, v)| (serde_yaml::Value::String(k.clone()), json_of(v))).collect(),
            )
        }),
        ..Default::default()
    }
}

/// The configuration of one response: every resource a RateLimitConfig, loaded in order.
pub fn config_of(resources: &[envoy_types::pb::google::protobuf::Any], merge: bool) -> Result<Config, String> {
    let mut config = Config::new(merge);
    for any in resources {
        if any.type_url != TYPE_URL {
            return Err(format!("a resource of type {:?}, not {TYPE_URL}", any.type_url));
        }
        let pb = rls_conf::RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("a RateLimitConfig that does not decode: {e}"))?;
        let name = pb.name.clone();
        let doc = FileDoc {
            domain: pb.domain,
            on_database_error: None,
            algorithm: None,
            descriptors: pb.descriptors.into_iter().map(node_of).collect(),
        };
        config.add(&name, doc)?;
    }
    Ok(config)
}

/// Follows the management server for as long as the server runs.
pub async fn follow(source: Source, config: Arc<RwLock<Arc<Config>>>, metrics: Arc<Metrics>) {
    let endpoint = if source.url.contains("://") { source.url.clone() } else { format!("http://{}", source.url) };
    let node = Node { id: source.node_id.clone(), ..Default::default() };
    loop {
        match stream(&endpoint, &node, &source, &config, &metrics).await {
            Ok(()) => log::line("error", "the xDS stream ended; dialling again", &[("server", &source.url)]),
            Err(e) => log::line(
                "error",
                "the xDS server cannot be followed; dialling again",
                &[("server", &source.url), ("error", &e)],
            ),
        }
        tokio::time::sleep(source.retry).await;
    }
}

async fn stream(
    endpoint: &str,
    node: &Node,
    source: &Source,
    config: &Arc<RwLock<Arc<Config>>>,
    metrics: &Arc<Metrics>,
) -> Result<(), String> {
    let mut client = AggregatedDiscoveryServiceClient::connect(endpoint.to_owned()).await.map_err(|e| e.to_string())?;
    let (tx, rx) = tokio::sync::mpsc::channel::<DiscoveryRequest>(4);
    let request = |version: &str, nonce: &str, error: Option<String>| DiscoveryRequest {
        version_info: version.to_owned(),
        node: Some(node.clone()),
        type_url: TYPE_URL.to_owned(),
        response_nonce: nonce.to_owned(),
        error_detail: error.map(|message| envoy_types::pb::google::rpc::Status { code: 3, message, details: vec![] }),
        ..Default::default()
    };
    tx.send(request("", "", None)).await.map_err(|e| e.to_string())?;
    let mut responses = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    log::line("info", "following the xDS server", &[("server", &source.url), ("node", &node.id)]);
    let mut accepted = String::new();
    while let Some(response) = responses.message().await.map_err(|e| e.to_string())? {
        let DiscoveryResponse { version_info, resources, nonce, type_url, .. } = response;
        if type_url != TYPE_URL {
            continue;
        }
        match config_of(&resources, source.merge) {
            Ok(fresh) => {
                let domains = fresh.domains.len().to_string();
                *config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
                metrics.load("ok");
                log::line("info", "configuration pushed", &[("version", &version_info), ("domains", &domains)]);
                accepted = version_info.clone();
                tx.send(request(&version_info, &nonce, None)).await.map_err(|e| e.to_string())?;
            }
            Err(e) => {
                metrics.load("error");
                log::line(
                    "error",
                    "pushed configuration refused; the last good one stays",
                    &[("version", &version_info), ("error", &e)],
                );
                tx.send(request(&accepted, &nonce, Some(e))).await.map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pushed_config_loads_as_a_file_would() {
        let pb = rls_conf::RateLimitConfig {
            name: "gateway".into(),
            domain: "eg".into(),
            descriptors: vec![rls_conf::RateLimitDescriptor {
                key: "user".into(),
                rate_limit: Some(rls_conf::RateLimitPolicy { unit: 2, requests_per_unit: 3, ..Default::default() }),
                ..Default::default()
            }],
        };
        let any = envoy_types::pb::google::protobuf::Any { type_url: TYPE_URL.into(), value: pb.encode_to_vec() };
        let config = config_of(std::slice::from_ref(&any), false).unwrap();
        let m = config.domains["eg"].find(&[("user", "ann")]).unwrap();
        assert_eq!(m.rule.requests_per_unit, 3);
        let bad = rls_conf::RateLimitConfig { name: "broken".into(), domain: String::new(), descriptors: vec![] };
        let any = envoy_types::pb::google::protobuf::Any { type_url: TYPE_URL.into(), value: bad.encode_to_vec() };
        assert_eq!(config_of(&[any], false).unwrap_err(), "broken: config file cannot have empty domain");
        assert_eq!(duration("3s"), Some(Duration::from_secs(3)));
        assert_eq!(duration("250ms"), Some(Duration::from_millis(250)));
    }
}
