//! The resource's own record on stores without triggers: each store's ordered log of the changes
//! it applied, followed from before the storm to after it.
//!
//! - **Redis**: the replication stream (`redis-cli --replica`). A fenced write is a script whose
//!   effects Redis replicates as `HINCRBY <fence> accepted 1` and `HSET <fence> hw <token>` in
//!   one `MULTI`/`EXEC`, in the order Redis executed the scripts.
//! - **etcd**: the MVCC history of the state keys under the fence prefix (a watch from the
//!   revision before the storm): each revision of a state key whose `accepted` count rose is an
//!   accepted write with the revision's high-water token.
//! - **Kubernetes**: the watch of the fence ConfigMaps (from the resourceVersion before the
//!   storm): each modification whose accepted-count annotation rose is an accepted write with the
//!   object's high-water token.
//!
//! Each log is read up to a marker this module writes after the writes of interest (a key, a
//! state key, a ConfigMap), so that everything applied before the marker has been seen.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{FencingToken, LeaseKey};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What a tail saw: writes (the resource key, the token, how many writes) and markers.
#[derive(Debug)]
enum Item {
    Write(String, FencingToken, u64),
    Marker(String),
    Failed(String),
}

/// Which store a tail follows.
#[derive(Debug, Clone)]
pub enum Source {
    /// A Redis at this URL (keys under the default prefix `lease`).
    Redis {
        /// `redis://host:port`.
        url: String,
    },
    /// An etcd endpoint (state keys under the default fence prefix).
    Etcd {
        /// `host:port`.
        endpoint: String,
    },
    /// A Kubernetes namespace (fence ConfigMaps without a name prefix).
    Kube {
        /// The kubeconfig.
        kubeconfig: String,
        /// The namespace.
        namespace: String,
    },
}

/// A running tail of one store's log, for the keys that start with one namespace.
#[derive(Debug)]
pub struct Tail {
    source: Source,
    ns: String,
    rx: mpsc::UnboundedReceiver<Item>,
    task: JoinHandle<()>,
    /// Every accepted write seen so far: resource key and token, in the log's order.
    seen: Vec<(String, FencingToken)>,
    markers: u64,
}

impl Drop for Tail {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn e2s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

const WITHIN: Duration = Duration::from_secs(30);

impl Tail {
    /// Starts following `source` for the keys that start with `ns`; returns once the log is
    /// followed (every later change will be seen).
    ///
    /// # Errors
    /// If the store cannot be reached or its log cannot be followed within 30 s.
    ///
    /// # Cancellation safety
    /// Cancel safe: a cancelled start leaves nothing running.
    pub async fn start(source: &Source, ns: &str) -> Result<Tail, String> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = match source {
            Source::Redis { url } => tokio::spawn(redis_tail(url.clone(), tx, ready_tx)),
            Source::Etcd { endpoint } => {
                tokio::spawn(etcd_tail(endpoint.clone(), ns.to_string(), tx, ready_tx))
            }
            Source::Kube {
                kubeconfig,
                namespace,
            } => tokio::spawn(kube_tail(
                kubeconfig.clone(),
                namespace.clone(),
                ns.to_string(),
                tx,
                ready_tx,
            )),
        };
        let tail = Tail {
            source: source.clone(),
            ns: ns.to_string(),
            rx,
            task,
            seen: Vec::new(),
            markers: 0,
        };
        match tokio::time::timeout(WITHIN, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(tail),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err("the tail ended before it was ready".to_string()),
            Err(_) => Err(format!("{source:?}: the log was not followed within 30 s")),
        }
    }

    /// The accepted writes of `key` the log holds so far (after a marker written now), in the
    /// order the store applied them.
    ///
    /// # Errors
    /// If the marker cannot be written or is not seen within 30 s, or the tail failed.
    ///
    /// # Cancellation safety
    /// Not cancel safe: a cancelled read may leave a marker unread (the next read still works).
    pub async fn read(&mut self, key: &LeaseKey) -> Result<Vec<FencingToken>, String> {
        self.markers += 1;
        let marker = format!("{}-record-marker-{}", self.ns, self.markers);
        write_marker(&self.source, &marker).await?;
        let deadline = tokio::time::Instant::now() + WITHIN;
        loop {
            let item = tokio::time::timeout_at(deadline, self.rx.recv())
                .await
                .map_err(|_| format!("the marker {marker} was not seen within 30 s"))?
                .ok_or("the tail ended")?;
            match item {
                Item::Write(k, token, n) => {
                    for _ in 0..n {
                        self.seen.push((k.clone(), token));
                    }
                }
                Item::Marker(m) if m == marker => break,
                Item::Marker(_) => {}
                Item::Failed(e) => return Err(e),
            }
        }
        Ok(self
            .seen
            .iter()
            .filter(|(k, _)| k == key.as_str())
            .map(|&(_, t)| t)
            .collect())
    }
}

async fn write_marker(source: &Source, marker: &str) -> Result<(), String> {
    match source {
        Source::Redis { url } => {
            let out = tokio::time::timeout(
                WITHIN,
                Command::new("redis-cli")
                    .args(["-u", url, "SET", marker, "1", "EX", "60"])
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .map_err(|_| "redis-cli SET timed out".to_string())?
            .map_err(e2s)?;
            if !String::from_utf8_lossy(&out.stdout).contains("OK") {
                return Err(format!(
                    "redis-cli SET {marker}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(())
        }
        Source::Etcd { endpoint } => {
            let mut c = etcd_client::Client::connect([endpoint.as_str()], None)
                .await
                .map_err(e2s)?;
            let name = format!("{ETCD_FENCE_PREFIX}{marker}");
            c.put(name.clone(), "marker", None).await.map_err(e2s)?;
            c.delete(name, None).await.map_err(e2s)?;
            Ok(())
        }
        Source::Kube {
            kubeconfig,
            namespace,
        } => {
            use k8s_openapi::api::core::v1::ConfigMap;
            use kube::api::{Api, DeleteParams, PostParams};
            let client = leasehold::k8s::client_from_kubeconfig(kubeconfig)
                .await
                .map_err(e2s)?;
            let api: Api<ConfigMap> = Api::namespaced(client, namespace);
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("fence.{marker}"));
            api.create(&PostParams::default(), &cm).await.map_err(e2s)?;
            api.delete(&format!("fence.{marker}"), &DeleteParams::default())
                .await
                .map_err(e2s)?;
            Ok(())
        }
    }
}

/// The resource key of a Redis fence key `lease:{<key>}:fence`.
fn redis_fence_key(name: &str) -> Option<&str> {
    name.strip_prefix("lease:{")?.strip_suffix("}:fence")
}

/// The fields of one line of `redis-cli --replica` output (CSV: `"cmd","arg",...`).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', false) => quoted = true,
            ('"', true) => quoted = false,
            ('\\', true) => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (',', false) => out.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Redis's replication stream, as `redis-cli --replica` prints it, to accepted writes and
/// markers: an `HINCRBY <fence> accepted n` counts n writes, which the next `HSET <fence> hw
/// <token>` of the same script names the token of.
#[derive(Debug, Default)]
struct RedisStream {
    pending: HashMap<String, u64>,
}

impl RedisStream {
    fn line(&mut self, line: &str) -> Option<Item> {
        let f = csv_fields(line.trim());
        let cmd = f.first()?.to_ascii_lowercase();
        match (cmd.as_str(), f.get(1), f.get(2), f.get(3)) {
            ("hincrby", Some(k), Some(field), Some(n)) if field == "accepted" => {
                let key = redis_fence_key(k)?;
                *self.pending.entry(key.to_string()).or_default() += n.parse::<u64>().ok()?;
                None
            }
            ("hset", Some(k), Some(field), Some(t)) if field == "hw" => {
                let key = redis_fence_key(k)?;
                let n = self.pending.remove(key).unwrap_or(0);
                let token = FencingToken::new(t.parse().ok()?).ok()?;
                (n > 0).then(|| Item::Write(key.to_string(), token, n))
            }
            ("set", Some(k), _, _) if k.contains("-record-marker-") => {
                Some(Item::Marker(k.clone()))
            }
            _ => None,
        }
    }
}

async fn redis_tail(
    url: String,
    tx: mpsc::UnboundedSender<Item>,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    let child = Command::new("redis-cli")
        .args(["-u", &url, "--replica"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(format!("redis-cli --replica: {e}")));
            return;
        }
    };
    let Some(out) = child.stdout.take() else {
        let _ = ready.send(Err("redis-cli: no stdout".to_string()));
        return;
    };
    // redis-cli says on stderr when the initial synchronisation is over; the commands Redis
    // applied after it come on stdout.
    if let Some(err) = child.stderr.take() {
        tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            let mut ready = Some(ready);
            while let Ok(Some(l)) = lines.next_line().await {
                if l.starts_with("SYNC done")
                    && let Some(r) = ready.take()
                {
                    let _ = r.send(Ok(()));
                }
            }
        });
    }
    let mut lines = BufReader::new(out).lines();
    let mut stream = RedisStream::default();
    while let Ok(Some(l)) = lines.next_line().await {
        if let Some(item) = stream.line(&l) {
            let _ = tx.send(item);
        }
    }
    let _ = tx.send(Item::Failed("redis-cli --replica ended".to_string()));
    drop(child);
}

/// The default fence prefix of the etcd backend.
const ETCD_FENCE_PREFIX: &str = leasehold::etcd::protocol::DEFAULT_FENCE_PREFIX;

async fn etcd_tail(
    endpoint: String,
    ns: String,
    tx: mpsc::UnboundedSender<Item>,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    let prefix = format!("{ETCD_FENCE_PREFIX}{ns}");
    let start = async {
        let mut c = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .map_err(e2s)?;
        let rev = c
            .get(prefix.clone(), None)
            .await
            .map_err(e2s)?
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let opts = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1);
        c.watch(prefix.clone(), Some(opts)).await.map_err(e2s)
    };
    let mut stream = match start.await {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            let _ = ready.send(Err(format!("etcd watch of {prefix}: {e}")));
            return;
        }
    };
    let mut accepted: HashMap<String, u64> = HashMap::new();
    loop {
        let resp = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                let _ = tx.send(Item::Failed(format!("etcd watch: {e}")));
                return;
            }
        };
        if resp.canceled() {
            let _ = tx.send(Item::Failed(format!(
                "etcd watch cancelled (compacted at {}): {}",
                resp.compact_revision(),
                resp.cancel_reason()
            )));
            return;
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let Ok(name) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            let Some(key) = name.strip_prefix(ETCD_FENCE_PREFIX) else {
                continue;
            };
            if key.contains("-record-marker-") {
                if ev.event_type() == etcd_client::EventType::Put {
                    let _ = tx.send(Item::Marker(key.to_string()));
                }
                continue;
            }
            if ev.event_type() != etcd_client::EventType::Put {
                continue;
            }
            let state = match leasehold::etcd::protocol::decode_state(name, kv.value()) {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Item::Failed(format!("{name}: {e}")));
                    return;
                }
            };
            let before = accepted
                .insert(key.to_string(), state.accepted)
                .unwrap_or(0);
            if let (Some(token), true) = (state.high_water, state.accepted > before) {
                let _ = tx.send(Item::Write(key.to_string(), token, state.accepted - before));
            }
        }
    }
    let _ = tx.send(Item::Failed("etcd watch ended".to_string()));
}

async fn kube_tail(
    kubeconfig: String,
    namespace: String,
    ns: String,
    tx: mpsc::UnboundedSender<Item>,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ListParams, WatchEvent, WatchParams};
    let start = async {
        let client = leasehold::k8s::client_from_kubeconfig(&kubeconfig)
            .await
            .map_err(e2s)?;
        let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
        let list = api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .map_err(e2s)?;
        let rv = list.metadata.resource_version.unwrap_or_default();
        Ok::<_, String>((api, rv))
    };
    let (api, mut rv) = match start.await {
        Ok(v) => v,
        Err(e) => {
            let _ = ready.send(Err(format!("kubernetes list: {e}")));
            return;
        }
    };
    let prefix = format!("fence.{ns}");
    let mut accepted: HashMap<String, u64> = HashMap::new();
    let mut ready = Some(ready);
    // A watch the server ends (its timeout) is resumed from the last resourceVersion seen.
    loop {
        let stream = match api.watch(&WatchParams::default(), &rv).await {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("kubernetes watch from {rv}: {e}");
                match ready.take() {
                    Some(r) => {
                        let _ = r.send(Err(msg));
                    }
                    None => {
                        let _ = tx.send(Item::Failed(msg));
                    }
                }
                return;
            }
        };
        if let Some(r) = ready.take() {
            let _ = r.send(Ok(()));
        }
        let mut stream = Box::pin(stream);
        while let Some(ev) = stream.next().await {
            let cm = match ev {
                Ok(WatchEvent::Added(cm) | WatchEvent::Modified(cm)) => cm,
                Ok(WatchEvent::Deleted(cm)) => {
                    if let Some(v) = cm.metadata.resource_version {
                        rv = v;
                    }
                    continue;
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                Ok(WatchEvent::Error(s)) => {
                    let _ = tx.send(Item::Failed(format!("kubernetes watch: {s:?}")));
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Item::Failed(format!("kubernetes watch: {e}")));
                    return;
                }
            };
            if let Some(v) = &cm.metadata.resource_version {
                rv.clone_from(v);
            }
            let name = cm.metadata.name.clone().unwrap_or_default();
            let Some(key) = name.strip_prefix("fence.") else {
                continue;
            };
            if !name.starts_with(&prefix) {
                continue;
            }
            if key.contains("-record-marker-") {
                let _ = tx.send(Item::Marker(key.to_string()));
                continue;
            }
            let state = match leasehold::k8s::protocol::parse_fence(&cm) {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Item::Failed(format!("{name}: {e}")));
                    return;
                }
            };
            let before = accepted
                .insert(key.to_string(), state.accepted)
                .unwrap_or(0);
            if let (Some(token), true) = (state.high_water, state.accepted > before) {
                let _ = tx.send(Item::Write(key.to_string(), token, state.accepted - before));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_replication_lines_become_writes() {
        let mut s = RedisStream::default();
        let lines = [
            "\"MULTI\"",
            "\"HINCRBY\",\"lease:{k1}:fence\",\"counter\",\"1\"",
            "\"HINCRBY\",\"lease:{k1}:fence\",\"accepted\",\"1\"",
            "\"HSET\",\"lease:{k1}:fence\",\"hw\",\"17\"",
            "\"EXEC\"",
            // An install: the mark moves, no write.
            "\"HSET\",\"lease:{k1}:fence\",\"hw\",\"18\"",
            "\"SET\",\"ns-record-marker-1\",\"1\",\"PXAT\",\"1\"",
            "\"PING\"",
        ];
        let items: Vec<String> = lines
            .iter()
            .filter_map(|l| s.line(l))
            .map(|i| format!("{i:?}"))
            .collect();
        assert_eq!(
            items,
            [
                format!(
                    "{:?}",
                    Item::Write("k1".into(), FencingToken::new(17).unwrap(), 1)
                ),
                format!("{:?}", Item::Marker("ns-record-marker-1".into())),
            ]
        );
        assert_eq!(csv_fields(r#""a","b\"c","""#), ["a", "b\"c", ""]);
    }
}
