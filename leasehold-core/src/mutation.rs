//! Switch points for protocol mutation testing, for backend authors and the mutation program
//! (`leasehold-mutants`) only.
//!
//! A backend passes the text that decides safety (an SQL statement, a trigger, a Lua script)
//! through [`text`] or [`string`], and guards a code-level condition (an etcd transaction's
//! comparison, a Kubernetes precondition) with [`on`]. Each call names its *site*, a stable id
//! such as `"postgres.renew"`.
//!
//! Without the cargo feature `mutants` (the default) [`text`] and [`string`] return their input
//! and [`on`] is `false`: every switch compiles away. With it, one mutant may be active per
//! process, read once from the environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `LEASEHOLD_MUTANT` | the mutant's name (nothing is active without it) |
//! | `LEASEHOLD_MUTANT_SITE` | the site it changes |
//! | `LEASEHOLD_MUTANT_FIND` | text mutants: the text to find at the site (every occurrence is replaced) |
//! | `LEASEHOLD_MUTANT_REPLACE` | text mutants: what replaces it |
//! | `LEASEHOLD_MUTANT_HITS` | optional file to which `hit <site>` (applied) or `miss <site>` (the site ran but the text was not found) is appended once per process |
//!
//! The hits file lets the mutation program tell a mutant that no test reached (or whose text is
//! stale) from one that survived.

/// Whether the code-level mutant of `site` is active: always `false` without the feature.
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub fn on(_site: &'static str) -> bool {
    false
}

/// `text`, or the active mutant's rewrite of it if the mutant is at `site`. Without the feature,
/// `text` itself.
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub fn text(_site: &'static str, text: &'static str) -> &'static str {
    text
}

/// [`text`] for text built at run time (the rewrite is made on every call).
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub fn string(_site: &'static str, text: String) -> String {
    text
}

#[cfg(feature = "mutants")]
pub use active::{on, string, text};

#[cfg(feature = "mutants")]
mod active {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, OnceLock};

    /// The mutant named by the environment.
    #[derive(Debug)]
    pub(super) struct Mutant {
        pub(super) site: String,
        pub(super) find: Option<String>,
        pub(super) replace: String,
    }

    impl Mutant {
        /// The mutant described by `var` (an environment lookup), if `LEASEHOLD_MUTANT` is set.
        pub(super) fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Option<Mutant> {
            var("LEASEHOLD_MUTANT").filter(|n| !n.is_empty())?;
            Some(Mutant {
                site: var("LEASEHOLD_MUTANT_SITE").unwrap_or_default(),
                find: var("LEASEHOLD_MUTANT_FIND").filter(|f| !f.is_empty()),
                replace: var("LEASEHOLD_MUTANT_REPLACE").unwrap_or_default(),
            })
        }

        /// `text` rewritten, or `None` if the find text does not occur in it (or this is a
        /// code-level mutant).
        pub(super) fn rewrite(&self, text: &str) -> Option<String> {
            let find = self.find.as_deref()?;
            text.contains(find)
                .then(|| text.replace(find, &self.replace))
        }
    }

    static ACTIVE: OnceLock<Option<Mutant>> = OnceLock::new();
    /// Each text given to [`text`] at the active site, and what it became.
    static REWRITTEN: Mutex<Vec<(&'static str, &'static str)>> = Mutex::new(Vec::new());
    static HIT: AtomicBool = AtomicBool::new(false);
    static MISS: AtomicBool = AtomicBool::new(false);

    fn active(site: &str) -> Option<&'static Mutant> {
        ACTIVE
            .get_or_init(|| Mutant::from_lookup(|v| std::env::var(v).ok()))
            .as_ref()
            .filter(|m| m.site == site)
    }

    fn record(flag: &AtomicBool, what: &str, site: &str) {
        if flag.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(path) = std::env::var_os("LEASEHOLD_MUTANT_HITS")
            && let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            let _ = writeln!(f, "{what} {site}");
        }
    }

    /// Whether the code-level mutant of `site` is active.
    pub fn on(site: &'static str) -> bool {
        match active(site) {
            Some(m) if m.find.is_none() => {
                record(&HIT, "hit", site);
                true
            }
            _ => false,
        }
    }

    /// `text`, or the active mutant's rewrite of it if the mutant is at `site`. Each rewrite is
    /// made once and kept for the life of the process (a site may pass several texts).
    pub fn text(site: &'static str, text: &'static str) -> &'static str {
        let Some(m) = active(site) else {
            return text;
        };
        let mut done = REWRITTEN.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, out)) = done.iter().find(|(input, _)| std::ptr::eq(*input, text)) {
            return out;
        }
        let out = match m.rewrite(text) {
            Some(new) => {
                record(&HIT, "hit", site);
                Box::leak(new.into_boxed_str())
            }
            None => {
                record(&MISS, "miss", site);
                text
            }
        };
        done.push((text, out));
        out
    }

    /// [`text`] for text built at run time.
    pub fn string(site: &'static str, text: String) -> String {
        let Some(m) = active(site) else {
            return text;
        };
        match m.rewrite(&text) {
            Some(new) => {
                record(&HIT, "hit", site);
                new
            }
            None => {
                record(&MISS, "miss", site);
                text
            }
        }
    }
}

#[cfg(all(test, feature = "mutants"))]
mod tests {
    use super::active::Mutant;

    fn mutant(vars: &[(&str, &str)]) -> Option<Mutant> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Mutant::from_lookup(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn nothing_is_active_without_a_name() {
        assert!(mutant(&[("LEASEHOLD_MUTANT_SITE", "s")]).is_none());
        assert!(mutant(&[("LEASEHOLD_MUTANT", "")]).is_none());
    }

    #[test]
    fn a_text_mutant_rewrites_every_occurrence_or_reports_none() {
        let m = mutant(&[
            ("LEASEHOLD_MUTANT", "flip"),
            ("LEASEHOLD_MUTANT_SITE", "s"),
            ("LEASEHOLD_MUTANT_FIND", "<="),
            ("LEASEHOLD_MUTANT_REPLACE", ">"),
        ])
        .unwrap();
        assert_eq!(m.site, "s");
        assert_eq!(
            m.rewrite("a <= b AND c <= d").as_deref(),
            Some("a > b AND c > d")
        );
        assert_eq!(m.rewrite("a = b"), None);
    }

    #[test]
    fn a_code_mutant_has_no_rewrite() {
        let m = mutant(&[("LEASEHOLD_MUTANT", "drop"), ("LEASEHOLD_MUTANT_SITE", "s")]).unwrap();
        assert!(m.find.is_none());
        assert_eq!(m.rewrite("anything"), None);
    }
}
