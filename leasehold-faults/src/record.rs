//! The resource's own record of what it accepted, checked against the grants.
//!
//! The history of a storm is kept by the harness: what each holder says it was granted and what
//! each write returned. The counter and high-water checks compare it with the resource's final
//! state only. Here the resource itself keeps a record of every write it accepted: triggers on the
//! table the fenced writes land in (PostgreSQL's and MySQL's `<table>_fence`, SQLite's
//! `lease_fenced`) append a row (key, token) for every rise of the row's `accepted` count, in the
//! order the database applied the writes (each key's row is locked by the write, so the log's ids
//! follow the writes). Stores without triggers keep an ordered log of their own, followed from
//! before the storm ([`crate::tail`]): Redis's replication stream, etcd's revisions of the state
//! key, the Kubernetes watch of the fence ConfigMap. After the storm the record is read back and
//! checked:
//!
//! - no accepted write carries a token below one accepted before it (a stale write accepted);
//! - each accepted write's token was granted, to a holder that attempted at least as many writes
//!   with it as the record holds, and the record holds at least the writes the holders saw
//!   accepted (the resource and the harness agree on who wrote what).
//!
//! A write carries only its token, and a token is granted to one owner: the owner the history
//! names for a token is the writer the record's entry stands for.

use std::collections::HashMap;

use leasehold_core::{FencingToken, LeaseKey};
use leasehold_testkit::history::{Attempt, History, Op, Violation, ViolationKind};
use tokio::process::Command;

use crate::tail::{Source, Tail};

/// Where the resource keeps its record.
#[derive(Debug, Clone)]
pub enum Record {
    /// A PostgreSQL database (a `postgres://` URL without query parameters, as `psql` takes it)
    /// and the schema of the lease table whose `leases_fence` table the writes land in.
    Postgres {
        /// The database URL.
        url: String,
        /// The lease table's schema.
        schema: String,
    },
    /// A SQLite database file whose `lease_fenced` table the writes land in.
    Sqlite {
        /// The file.
        path: String,
    },
    /// A store without triggers whose own ordered log of applied changes is followed
    /// ([`crate::tail`]): Redis's replication stream, etcd's revisions, the Kubernetes watch.
    Log(Source),
    /// A MySQL/MariaDB database (read with the `mariadb` or `mysql` client) whose
    /// `<table>_fence` table the writes land in.
    Mysql {
        /// How the client reaches the server.
        login: MysqlLogin,
        /// The lease table (its fence table is `<table>_fence`).
        table: String,
    },
}

/// A MySQL/MariaDB login, from a `mysql://user:password@host:port/database` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MysqlLogin {
    /// The server's host.
    pub host: String,
    /// The server's port.
    pub port: u16,
    /// The user.
    pub user: String,
    /// The password (empty: none).
    pub password: String,
    /// The database.
    pub database: String,
}

impl MysqlLogin {
    /// The login in a `mysql://` or `mariadb://` URL (query parameters ignored), `None` if the
    /// URL has no database or an unreadable port.
    pub fn from_url(url: &str) -> Option<MysqlLogin> {
        let rest = url
            .strip_prefix("mysql://")
            .or_else(|| url.strip_prefix("mariadb://"))?;
        let rest = rest.split('?').next().unwrap_or(rest);
        let (auth, rest) = rest.rsplit_once('@').unwrap_or(("root", rest));
        let (user, password) = auth.split_once(':').unwrap_or((auth, ""));
        let (host_port, database) = rest.split_once('/')?;
        let (host, port) = host_port.rsplit_once(':').unwrap_or((host_port, "3306"));
        Some(MysqlLogin {
            host: host.to_string(),
            port: port.parse().ok()?,
            user: user.to_string(),
            password: password.to_string(),
            database: database.to_string(),
        })
        .filter(|l| !l.database.is_empty())
    }
}

/// One write the resource accepted: its position in the resource's log and its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The log's id (increasing in the order the writes were applied to a key).
    pub id: u64,
    /// The token the write presented.
    pub token: FencingToken,
}

const PG_LOG: &str = "leasehold_faults_accepted";

/// The lease table of the fault suite's own on MySQL/MariaDB (the triggers sit on its fence
/// table, `<table>_fence`).
const MY_TABLE: &str = "leasehold_faults_record";

impl Record {
    /// The record of the resource at `url`, if its backend keeps one here (PostgreSQL, SQLite,
    /// MySQL/MariaDB through triggers; Redis, etcd and Kubernetes (with `KUBECONFIG` set) through
    /// their own logs). A PostgreSQL URL gets `table=<schema>.leases` added, a MySQL URL
    /// `table=leasehold_faults_record`, so that the triggers sit on a table of the fault suite's
    /// own; use the returned URL for the store and the resource.
    pub fn for_url(url: &str) -> Option<(Record, String)> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            return Some((
                Record::Sqlite {
                    path: path.split('?').next().unwrap_or(path).to_string(),
                },
                url.to_string(),
            ));
        }
        if url.starts_with("redis://") {
            let source = Source::Redis {
                url: url.to_string(),
            };
            return Some((Record::Log(source), url.to_string()));
        }
        if let Some(endpoint) = url.strip_prefix("etcd://") {
            let source = Source::Etcd {
                endpoint: endpoint
                    .split(['/', '?'])
                    .next()
                    .unwrap_or(endpoint)
                    .to_string(),
            };
            return Some((Record::Log(source), url.to_string()));
        }
        if let Some(namespace) = url.strip_prefix("k8s://") {
            let source = Source::Kube {
                kubeconfig: std::env::var("KUBECONFIG").ok()?,
                namespace: namespace
                    .split(['/', '?'])
                    .next()
                    .unwrap_or(namespace)
                    .to_string(),
            };
            return Some((Record::Log(source), url.to_string()));
        }
        if let Some(login) = MysqlLogin::from_url(url) {
            let table = MY_TABLE.to_string();
            let sep = if url.contains('?') { '&' } else { '?' };
            let with_table = format!("{url}{sep}table={table}");
            return Some((Record::Mysql { login, table }, with_table));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let base = url.split('?').next().unwrap_or(url).to_string();
            let schema = "leasehold_faults_record".to_string();
            let sep = if url.contains('?') { '&' } else { '?' };
            let with_table = format!("{url}{sep}table={schema}.leases");
            return Some((Record::Postgres { url: base, schema }, with_table));
        }
        None
    }

    /// Starts recording the writes to keys that start with `ns`: creates the log table and the
    /// triggers that append to it (idempotent), or starts following the store's log. Call it
    /// after the store and resource created their tables, before the writes.
    ///
    /// # Errors
    /// If the database's client cannot be run or refuses the statements, or the store's log
    /// cannot be followed.
    ///
    /// # Cancellation safety
    /// Cancel safe: every statement is idempotent, and a cancelled tail stops.
    pub async fn start(&self, ns: &str) -> Result<Recording<'_>, String> {
        self.install().await?;
        self.follow(ns).await
    }

    /// Starts recording the writes to keys that start with `ns` on a record already installed
    /// ([`install`](Self::install)): starts following the store's log, or nothing more for the
    /// databases, whose triggers record every key. Many recordings of one record may run at once,
    /// each for its own namespace, without the schema changes of [`start`](Self::start) taking
    /// locks on the fence table while other recordings' writes land in it.
    ///
    /// # Errors
    /// If the store's log cannot be followed.
    ///
    /// # Cancellation safety
    /// Cancel safe: a cancelled tail stops.
    pub async fn follow(&self, ns: &str) -> Result<Recording<'_>, String> {
        let tail = match self {
            Record::Log(source) => Some(Tail::start(source, ns).await?),
            _ => None,
        };
        Ok(Recording { record: self, tail })
    }

    /// Creates the log table and the triggers that append to it (idempotent; nothing for a
    /// store whose own log is followed). Call it after the store and resource created their
    /// tables, before the writes.
    ///
    /// # Errors
    /// If the database's client cannot be run or refuses the statements.
    ///
    /// # Cancellation safety
    /// Cancel safe: every statement is idempotent.
    pub async fn install(&self) -> Result<(), String> {
        match self {
            Record::Log(Source::Redis { url }) => {
                // Each recording is a replica of its own (`redis-cli --replica`), whose first
                // synchronisation a diskless primary delays by `repl-diskless-sync-delay` (5 s by
                // default) to gather more replicas: 5 s added to every storm. The record does not
                // depend on it, so a server that refuses the change is only slower.
                if let Err(e) = run(Command::new("redis-cli").args([
                    "-u",
                    url,
                    "CONFIG",
                    "SET",
                    "repl-diskless-sync-delay",
                    "0",
                ]))
                .await
                {
                    eprintln!("the record's replicas will wait for the primary's sync delay: {e}");
                }
                Ok(())
            }
            Record::Log(_) => Ok(()),
            Record::Postgres { url, schema } => {
                let fence = format!("\"{schema}\".\"leases_fence\"");
                let sql = format!(
                    "CREATE TABLE IF NOT EXISTS \"{schema}\".{PG_LOG} (
                       id bigserial PRIMARY KEY, resource_key text NOT NULL,
                       token bigint NOT NULL, accepted bigint NOT NULL);
                     CREATE OR REPLACE FUNCTION \"{schema}\".{PG_LOG}_log() RETURNS trigger
                       LANGUAGE plpgsql AS $$
                       BEGIN
                         INSERT INTO \"{schema}\".{PG_LOG} (resource_key, token, accepted)
                           VALUES (NEW.resource_key, NEW.last_fencing_token, NEW.accepted);
                         RETURN NULL;
                       END $$;
                     CREATE OR REPLACE TRIGGER {PG_LOG}_ins AFTER INSERT ON {fence}
                       FOR EACH ROW WHEN (NEW.accepted > 0)
                       EXECUTE FUNCTION \"{schema}\".{PG_LOG}_log();
                     CREATE OR REPLACE TRIGGER {PG_LOG}_upd AFTER UPDATE ON {fence}
                       FOR EACH ROW WHEN (NEW.accepted > OLD.accepted)
                       EXECUTE FUNCTION \"{schema}\".{PG_LOG}_log();"
                );
                psql(url, &sql).await.map(drop)
            }
            Record::Sqlite { path } => {
                let sql = "CREATE TABLE IF NOT EXISTS leasehold_faults_accepted (
                       id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
                       token INTEGER NOT NULL, accepted INTEGER NOT NULL);
                     CREATE TRIGGER IF NOT EXISTS leasehold_faults_accepted_ins
                       AFTER INSERT ON lease_fenced WHEN NEW.accepted > 0 BEGIN
                       INSERT INTO leasehold_faults_accepted (key, token, accepted)
                         VALUES (NEW.key, NEW.high_water, NEW.accepted); END;
                     CREATE TRIGGER IF NOT EXISTS leasehold_faults_accepted_upd
                       AFTER UPDATE ON lease_fenced WHEN NEW.accepted > OLD.accepted BEGIN
                       INSERT INTO leasehold_faults_accepted (key, token, accepted)
                         VALUES (NEW.key, NEW.high_water, NEW.accepted); END;";
                sqlite(path, sql).await.map(drop)
            }
            Record::Mysql { login, table } => {
                // One statement per trigger body, so no client delimiter is needed; the
                // `INSERT .. ON DUPLICATE KEY UPDATE` of a write fires the insert trigger for a
                // new row and the update trigger for an existing one.
                let fence = format!("`{table}_fence`");
                let log = format!("`{table}_accepted`");
                let sql = format!(
                    "CREATE TABLE IF NOT EXISTS {log} (
                       id BIGINT AUTO_INCREMENT PRIMARY KEY, resource_key VARBINARY(255) NOT NULL,
                       token BIGINT NOT NULL, accepted BIGINT NOT NULL) ENGINE=InnoDB;
                     CREATE TRIGGER IF NOT EXISTS `{table}_accepted_ins` AFTER INSERT ON {fence}
                       FOR EACH ROW INSERT INTO {log} (resource_key, token, accepted)
                       SELECT NEW.resource_key, NEW.last_fencing_token, NEW.accepted
                       FROM DUAL WHERE NEW.accepted > 0;
                     CREATE TRIGGER IF NOT EXISTS `{table}_accepted_upd` AFTER UPDATE ON {fence}
                       FOR EACH ROW INSERT INTO {log} (resource_key, token, accepted)
                       SELECT NEW.resource_key, NEW.last_fencing_token, NEW.accepted
                       FROM DUAL WHERE NEW.accepted > OLD.accepted;"
                );
                mysql(login, &sql).await.map(drop)
            }
        }
    }

    async fn read(&self, key: &LeaseKey) -> Result<Vec<Accepted>, String> {
        let k = key.as_str().replace('\'', "''");
        let out = match self {
            Record::Log(_) => return Err("a log is read through its recording".to_string()),
            Record::Postgres { url, schema } => {
                psql(
                    url,
                    &format!(
                        "SELECT id, token, accepted FROM \"{schema}\".{PG_LOG} \
                         WHERE resource_key = '{k}' ORDER BY id"
                    ),
                )
                .await?
            }
            Record::Sqlite { path } => {
                sqlite(
                    path,
                    &format!(
                        "SELECT id, token, accepted FROM leasehold_faults_accepted \
                         WHERE key = '{k}' ORDER BY id;"
                    ),
                )
                .await?
            }
            Record::Mysql { login, table } => {
                mysql(
                    login,
                    &format!(
                        "SELECT CONCAT_WS('|', id, token, accepted) FROM `{table}_accepted` \
                         WHERE resource_key = '{k}' ORDER BY id;"
                    ),
                )
                .await?
            }
        };
        parse_log(&out)
    }
}

/// A record being kept (see [`Record::start`]).
#[derive(Debug)]
pub struct Recording<'a> {
    record: &'a Record,
    tail: Option<Tail>,
}

impl Recording<'_> {
    /// The writes the resource accepted for `key` so far, in the order it applied them.
    ///
    /// # Errors
    /// If the log cannot be read or holds a token that is not a fencing token.
    ///
    /// # Cancellation safety
    /// Cancel safe for the databases (read only); a cancelled read of a followed log may leave
    /// its marker unread, which the next read skips.
    pub async fn read(&mut self, key: &LeaseKey) -> Result<Vec<Accepted>, String> {
        match &mut self.tail {
            Some(t) => Ok(t
                .read(key)
                .await?
                .into_iter()
                .zip(1..)
                .map(|(token, id)| Accepted { id, token })
                .collect()),
            None => self.record.read(key).await,
        }
    }
}

/// Rows `id|token|accepted` to writes: `accepted` counts the key's accepted writes, so a rise of
/// more than one between rows stands for that many writes (none is expected: each write is its
/// own statement).
fn parse_log(out: &str) -> Result<Vec<Accepted>, String> {
    let mut log = Vec::new();
    let mut last = 0u64;
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [id, token, accepted] = f[..] else {
            return Err(format!("unexpected log row {line:?}"));
        };
        let num = |s: &str| s.parse::<u64>().map_err(|e| format!("{line:?}: {e}"));
        let (id, token, accepted) = (num(id)?, num(token)?, num(accepted)?);
        let token = FencingToken::new(token).map_err(|e| format!("{line:?}: {e}"))?;
        for _ in last..accepted.max(last + 1) {
            log.push(Accepted { id, token });
        }
        last = accepted.max(last + 1);
    }
    Ok(log)
}

async fn psql(url: &str, sql: &str) -> Result<String, String> {
    run(Command::new("psql").args([
        url,
        "-X",
        "-q",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        sql,
    ]))
    .await
}

async fn sqlite(path: &str, sql: &str) -> Result<String, String> {
    run(Command::new("sqlite3")
        .args(["-batch", "-cmd", ".timeout 10000", path])
        .arg(sql))
    .await
}

async fn mysql(login: &MysqlLogin, sql: &str) -> Result<String, String> {
    let bin = if which("mariadb") { "mariadb" } else { "mysql" };
    let mut cmd = Command::new(bin);
    cmd.args([
        "--protocol=tcp",
        "-h",
        &login.host,
        "-P",
        &login.port.to_string(),
        "-u",
        &login.user,
        "-N",
        "-B",
        &login.database,
        "-e",
        sql,
    ]);
    if !login.password.is_empty() {
        // The client reads it from the environment, so it is not on a command line.
        cmd.env("MYSQL_PWD", &login.password);
    }
    run(&mut cmd).await
}

fn which(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

async fn run(cmd: &mut Command) -> Result<String, String> {
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        cmd.kill_on_drop(true).output(),
    )
    .await
    .map_err(|_| format!("{cmd:?} did not finish within 30 s"))?
    .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Checks the resource's record of `key` against the history's grants and writes (see the
/// module's documentation). An empty result means they agree.
pub fn check_record(history: &History, key: &LeaseKey, log: &[Accepted]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut highest: Option<Accepted> = None;
    for w in log {
        if let Some(h) = highest
            && w.token < h.token
        {
            out.push(Violation::new(
                ViolationKind::StaleWriteAccepted,
                format!(
                    "the resource's record accepted token {} (entry {}) after token {} (entry {})",
                    w.token.get(),
                    w.id,
                    h.token.get(),
                    h.id
                ),
            ));
        }
        if highest.is_none_or(|h| w.token >= h.token) {
            highest = Some(*w);
        }
    }
    // Per token: its owner (the client the history says it was granted to), the writes that
    // client attempted with it (any outcome) and the writes it saw accepted.
    let mut owner: HashMap<FencingToken, String> = HashMap::new();
    let mut attempted: HashMap<FencingToken, u64> = HashMap::new();
    let mut seen: HashMap<FencingToken, u64> = HashMap::new();
    for e in history.events().into_iter().filter(|e| &e.key == key) {
        match e.op {
            Op::Granted { token, .. } => {
                owner.insert(token, e.client.clone());
            }
            Op::Write { token, accepted } | Op::LateWrite { token, accepted } => {
                *attempted.entry(token).or_default() += 1;
                if accepted {
                    *seen.entry(token).or_default() += 1;
                }
            }
            Op::Unknown(Attempt::Write(token) | Attempt::LateWrite(token)) => {
                *attempted.entry(token).or_default() += 1;
            }
            _ => {}
        }
    }
    let mut recorded: HashMap<FencingToken, u64> = HashMap::new();
    for w in log {
        *recorded.entry(w.token).or_default() += 1;
    }
    let mut tokens: Vec<FencingToken> = recorded.keys().chain(seen.keys()).copied().collect();
    tokens.sort();
    tokens.dedup();
    for t in tokens {
        let (r, a, s) = (
            recorded.get(&t).copied().unwrap_or(0),
            attempted.get(&t).copied().unwrap_or(0),
            seen.get(&t).copied().unwrap_or(0),
        );
        let who = owner.get(&t).map_or("no holder", String::as_str);
        if r > 0 && !owner.contains_key(&t) {
            out.push(Violation::new(
                ViolationKind::WriteCountMismatch,
                format!(
                    "the resource accepted {r} write(s) with token {} that was never granted",
                    t.get()
                ),
            ));
        } else if r > a || r < s {
            out.push(Violation::new(
                ViolationKind::WriteCountMismatch,
                format!(
                    "the resource recorded {r} write(s) with token {} (granted to {who}), which attempted {a} and saw {s} accepted",
                    t.get()
                ),
            ));
        }
    }
    out
}

/// A negative control on a real backend: a write by a holder the history knows (token 5) and a
/// write with a token nobody was granted (token 6), both accepted by the resource at `url`; the
/// resource's record (its triggers' table or its followed log) must hold both, and
/// [`check_record`] must name the second.
///
/// # Errors
/// If the backend cannot be reached, its record was not kept, or the ungranted write was not
/// caught.
///
/// # Cancellation safety
/// Cancel safe: it writes only under a fresh key.
pub async fn live_control(record: &Record, url: &str) -> Result<String, String> {
    use leasehold_core::{OwnerId, WriteOp};
    use leasehold_testkit::history::{Event, Stamp};
    let resource = leasehold::connect_resource(url)
        .await
        .map_err(|e| e.to_string())?;
    let _store = leasehold::connect(url).await.map_err(|e| e.to_string())?;
    let key = crate::scenarios::fresh_key("recordctl");
    let mut recording = record.start(key.as_str()).await?;
    let tk = |n| FencingToken::new(n).map_err(|e| e.to_string());
    let history = History::new();
    let now = tokio::time::Instant::now();
    let stamp = |seq| Stamp { at: now, seq };
    let granted = tk(5)?;
    history.push(Event {
        client: "p1".into(),
        key: key.clone(),
        invoked: stamp(1),
        completed: stamp(1),
        op: Op::Granted {
            owner: OwnerId::with_label("p1"),
            token: granted,
            deadline: now + std::time::Duration::from_secs(1),
        },
    });
    let w = resource
        .write(&key, granted, WriteOp::Add(1))
        .await
        .map_err(|e| e.to_string())?;
    history.push(Event {
        client: "p1".into(),
        key: key.clone(),
        invoked: stamp(2),
        completed: stamp(2),
        op: Op::Write {
            token: granted,
            accepted: w.is_accepted(),
        },
    });
    // The rogue write: accepted by the fence (its token is the highest), absent from the history.
    let rogue = resource
        .write(&key, tk(6)?, WriteOp::Add(1))
        .await
        .map_err(|e| e.to_string())?;
    if !(w.is_accepted() && rogue.is_accepted()) {
        return Err(format!(
            "the fence refused a control write: {w:?}, {rogue:?}"
        ));
    }
    let log = recording.read(&key).await?;
    let tokens: Vec<u64> = log.iter().map(|a| a.token.get()).collect();
    if tokens != [5, 6] {
        return Err(format!(
            "the resource's record holds tokens {tokens:?}, expected [5, 6]"
        ));
    }
    let v = check_record(&history, &key, &log);
    match v.as_slice() {
        [one] if one.kind == ViolationKind::WriteCountMismatch => {
            Ok(format!("caught: {}", one.detail))
        }
        _ => Err(format!("the ungranted write was not caught alone: {v:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::OwnerId;
    use leasehold_testkit::history::{Event, Stamp};
    use tokio::time::Instant;

    fn tk(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    /// p1 granted token 1 and writes twice (both accepted), p2 granted token 2 and writes once.
    fn history(key: &LeaseKey) -> History {
        let h = History::new();
        let now = Instant::now();
        let mut seq = 0;
        let mut push = |client: &str, op: Op| {
            seq += 1;
            let s = Stamp { at: now, seq };
            h.push(Event {
                client: client.into(),
                key: key.clone(),
                invoked: s,
                completed: s,
                op,
            });
        };
        let deadline = now + std::time::Duration::from_secs(1);
        push(
            "p1",
            Op::Granted {
                owner: OwnerId::with_label("p1"),
                token: tk(1),
                deadline,
            },
        );
        push(
            "p1",
            Op::Write {
                token: tk(1),
                accepted: true,
            },
        );
        push(
            "p1",
            Op::Write {
                token: tk(1),
                accepted: true,
            },
        );
        push(
            "p2",
            Op::Granted {
                owner: OwnerId::with_label("p2"),
                token: tk(2),
                deadline,
            },
        );
        push(
            "p2",
            Op::Write {
                token: tk(2),
                accepted: true,
            },
        );
        h
    }

    fn log(tokens: &[u64]) -> Vec<Accepted> {
        tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| Accepted {
                id: i as u64 + 1,
                token: tk(t),
            })
            .collect()
    }

    fn kinds(v: &[Violation]) -> Vec<ViolationKind> {
        v.iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_record_that_agrees_is_clean() {
        let key = LeaseKey::new("k").unwrap();
        assert!(check_record(&history(&key), &key, &log(&[1, 1, 2])).is_empty());
    }

    /// Negative control: a record in which a lower token was accepted after a higher one.
    #[test]
    fn control_a_lower_token_after_a_higher_one_is_caught() {
        let key = LeaseKey::new("k").unwrap();
        let v = check_record(&history(&key), &key, &log(&[1, 2, 1]));
        assert_eq!(kinds(&v), [ViolationKind::StaleWriteAccepted], "{v:?}");
    }

    /// Negative control: a write with a token that was never granted.
    #[test]
    fn control_a_token_never_granted_is_caught() {
        let key = LeaseKey::new("k").unwrap();
        let v = check_record(&history(&key), &key, &log(&[1, 1, 2, 3]));
        assert_eq!(kinds(&v), [ViolationKind::WriteCountMismatch], "{v:?}");
    }

    /// Negative control: more writes with a token than its holder attempted, and fewer than it
    /// saw accepted.
    #[test]
    fn control_writes_its_holder_did_not_make_or_lost_writes_are_caught() {
        let key = LeaseKey::new("k").unwrap();
        let v = check_record(&history(&key), &key, &log(&[1, 1, 2, 2]));
        assert_eq!(kinds(&v), [ViolationKind::WriteCountMismatch], "{v:?}");
        let v = check_record(&history(&key), &key, &log(&[1, 2]));
        assert_eq!(kinds(&v), [ViolationKind::WriteCountMismatch], "{v:?}");
    }

    #[test]
    fn mysql_logins_come_from_urls() {
        let l = MysqlLogin::from_url("mysql://lease:lease-pw@127.0.0.1:3307/test?table=x").unwrap();
        assert_eq!(
            (
                l.host.as_str(),
                l.port,
                l.user.as_str(),
                l.password.as_str()
            ),
            ("127.0.0.1", 3307, "lease", "lease-pw")
        );
        assert_eq!(l.database, "test");
        let l = MysqlLogin::from_url("mariadb://root@db/test").unwrap();
        assert_eq!((l.port, l.password.as_str()), (3306, ""));
        assert!(MysqlLogin::from_url("mysql://root@db:3306/").is_none());
        assert!(MysqlLogin::from_url("mysql://root@db:x/test").is_none());
        assert!(MysqlLogin::from_url("postgres://root@db/test").is_none());
        let (r, url) = Record::for_url("mysql://u@127.0.0.1:3306/test").unwrap();
        assert!(matches!(r, Record::Mysql { .. }));
        assert_eq!(
            url,
            "mysql://u@127.0.0.1:3306/test?table=leasehold_faults_record"
        );
    }

    #[test]
    fn log_rows_parse_and_expand_rises() {
        let l = parse_log("3|5|1\n7|6|3\n").unwrap();
        assert_eq!(
            l.iter().map(|a| a.token.get()).collect::<Vec<_>>(),
            [5, 6, 6]
        );
        assert!(parse_log("x|1|1").is_err());
        assert!(parse_log("1|0|1").is_err());
    }
}
