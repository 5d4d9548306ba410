//! The policy [`Ruleset`] as nftables text: the whole table (the first load, after a
//! failure, when isolation begins or ends), or the partial transaction from what the
//! kernel holds — only the chains, set elements and map elements that changed, as the
//! Service proxy does. Chains and sets no longer wanted are flushed at once and deleted
//! by the next update, when no rule or element of the same transaction can name them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::Ipv4Addr;

use super::model::{Protocol, Ruleset};

/// Base chains' priorities in the forward hook: before the filter tables of others,
/// egress (the sender's side) before ingress (the receiver's). An `accept` only ends
/// a base chain; the packet then meets the next.
const EGRESS_PRIORITY: i32 = -20;
const INGRESS_PRIORITY: i32 = -10;

const PEER_SET_TYPE: &str = "ipv4_addr";
const PORT_SET_TYPE: &str = "ipv4_addr . inet_proto . inet_service";

/// The maps that send a packet to its pod's chain: (name, the packet field, priority of
/// the base chain that looks it up).
const MAPS: [(&str, &str, &str, i32); 2] = [
    ("pods-egress", "forward-egress", "ip saddr", EGRESS_PRIORITY),
    (
        "pods-ingress",
        "forward-ingress",
        "ip daddr",
        INGRESS_PRIORITY,
    ),
];

fn peer(ip: &Ipv4Addr) -> String {
    ip.to_string()
}

fn port((ip, protocol, port): &(Ipv4Addr, Protocol, u16)) -> String {
    format!("{ip} . {protocol} . {port}")
}

fn verdict((ip, chain): (&Ipv4Addr, &String)) -> String {
    format!("{ip} : jump {chain}")
}

fn pods<'a>(rules: &'a Ruleset, map: &str) -> &'a BTreeMap<Ipv4Addr, String> {
    if map == "pods-egress" {
        &rules.egress
    } else {
        &rules.ingress
    }
}

/// `elements = { ... }` of a set or map definition, nothing when there are none.
fn elements<T>(t: &mut String, items: impl IntoIterator<Item = T>, show: impl Fn(T) -> String) {
    let list: Vec<String> = items.into_iter().map(show).collect();
    if !list.is_empty() {
        let _ = writeln!(t, "\t\telements = {{ {} }}", list.join(", "));
    }
}

/// The whole table, replacing what is there in one transaction. With no pod isolated
/// the table is empty: no base chain, so no packet pays for a lookup.
pub fn full(table: &str, rules: &Ruleset) -> String {
    let mut t = format!("table ip {table}\ndelete table ip {table}\ntable ip {table} {{\n");
    if rules.is_empty() {
        t.push_str("}\n");
        return t;
    }
    for (name, addresses) in &rules.peers {
        let _ = writeln!(t, "\tset {name} {{\n\t\ttype {PEER_SET_TYPE}");
        elements(&mut t, addresses, peer);
        t.push_str("\t}\n");
    }
    for (name, ports) in &rules.named_ports {
        let _ = writeln!(t, "\tset {name} {{\n\t\ttype {PORT_SET_TYPE}");
        elements(&mut t, ports, port);
        t.push_str("\t}\n");
    }
    for (name, body) in &rules.chains {
        let _ = writeln!(t, "\tchain {name} {{");
        for rule in body {
            let _ = writeln!(t, "\t\t{rule}");
        }
        t.push_str("\t}\n");
    }
    for (map, ..) in MAPS {
        let _ = writeln!(t, "\tmap {map} {{\n\t\ttype ipv4_addr : verdict");
        elements(&mut t, pods(rules, map), verdict);
        t.push_str("\t}\n");
    }
    for (map, chain, field, priority) in MAPS {
        let _ = write!(
            t,
            "\tchain {chain} {{\n\
             \t\ttype filter hook forward priority {priority}; policy accept;\n\
             \t\tct state established,related accept\n\
             \t\t{field} vmap @{map}\n\
             \t}}\n"
        );
    }
    t.push_str("}\n");
    t
}

/// What the kernel holds after the last successful load, and the chains and sets the
/// last update flushed, which the next deletes.
#[derive(Debug, Default)]
pub struct Loaded {
    rules: Ruleset,
    stale_chains: BTreeSet<String>,
    stale_sets: BTreeSet<String>,
}

impl Loaded {
    /// The state a full load of `rules` leaves.
    pub fn full(rules: Ruleset) -> Loaded {
        Loaded {
            rules,
            ..Loaded::default()
        }
    }

    pub fn rules(&self) -> &Ruleset {
        &self.rules
    }

    /// The partial transaction from this state to `rules` in `table` (isolation
    /// neither begins nor ends) and the state it leaves once committed.
    fn update(&self, table: &str, rules: Ruleset) -> (String, Loaded) {
        let before = &self.rules;
        let mut t = String::new();
        for (map, ..) in MAPS {
            let wanted = pods(&rules, map);
            for (ip, chain) in pods(before, map) {
                if wanted.get(ip) != Some(chain) {
                    let _ = writeln!(t, "delete element ip {table} {map} {{ {ip} }}");
                }
            }
        }
        let mut stale_sets = BTreeSet::new();
        sets(
            &mut t,
            table,
            PEER_SET_TYPE,
            &before.peers,
            &rules.peers,
            peer,
            &mut stale_sets,
        );
        sets(
            &mut t,
            table,
            PORT_SET_TYPE,
            &before.named_ports,
            &rules.named_ports,
            port,
            &mut stale_sets,
        );
        let changed: Vec<(&String, &Vec<String>)> = (rules.chains.iter())
            .filter(|(name, body)| before.chains.get(*name) != Some(*body))
            .collect();
        // Every chain exists before an element names it.
        for (name, body) in &changed {
            let _ = writeln!(
                t,
                "add chain ip {table} {name}\nflush chain ip {table} {name}"
            );
            for rule in *body {
                let _ = writeln!(t, "add rule ip {table} {name} {rule}");
            }
        }
        for (map, ..) in MAPS {
            let had = pods(before, map);
            for (ip, chain) in pods(&rules, map) {
                if had.get(ip) != Some(chain) {
                    let _ = writeln!(t, "add element ip {table} {map} {{ {ip} : jump {chain} }}");
                }
            }
        }
        let mut stale_chains = BTreeSet::new();
        for name in before.chains.keys() {
            if !rules.chains.contains_key(name) {
                let _ = writeln!(t, "flush chain ip {table} {name}");
                stale_chains.insert(name.clone());
            }
        }
        for name in self
            .stale_chains
            .iter()
            .filter(|c| !rules.chains.contains_key(*c))
        {
            let _ = writeln!(t, "delete chain ip {table} {name}");
        }
        let wanted =
            |name: &String| rules.peers.contains_key(name) || rules.named_ports.contains_key(name);
        for name in self.stale_sets.iter().filter(|s| !wanted(s)) {
            let _ = writeln!(t, "delete set ip {table} {name}");
        }
        (
            t,
            Loaded {
                rules,
                stale_chains,
                stale_sets,
            },
        )
    }
}

/// The transaction from `from` (`None`: unknown, a full load is due) to `rules` in
/// `table`: its text, the state it leaves once committed, and whether it loads the
/// whole table — also when isolation begins or ends (the base chains come or go).
pub fn transaction(from: Option<&Loaded>, table: &str, rules: Ruleset) -> (String, Loaded, bool) {
    match from {
        Some(loaded) if loaded.rules.is_empty() == rules.is_empty() => {
            let (text, after) = loaded.update(table, rules);
            (text, after, false)
        }
        _ => (full(table, &rules), Loaded::full(rules), true),
    }
}

/// The set changes from `before` to `after`: new sets defined and filled, elements of
/// kept sets added and removed, sets no longer wanted flushed (and noted in `stale`).
fn sets<T: Ord>(
    t: &mut String,
    table: &str,
    kind: &str,
    before: &BTreeMap<String, BTreeSet<T>>,
    after: &BTreeMap<String, BTreeSet<T>>,
    show: impl Fn(&T) -> String,
    stale: &mut BTreeSet<String>,
) {
    let list = |items: Vec<&T>| items.into_iter().map(&show).collect::<Vec<_>>().join(", ");
    let none = BTreeSet::new();
    for (name, wanted) in after {
        let had = match before.get(name) {
            Some(had) => had,
            None => {
                let _ = writeln!(t, "add set ip {table} {name} {{ type {kind}; }}");
                &none
            }
        };
        let gone: Vec<&T> = had.difference(wanted).collect();
        if !gone.is_empty() {
            let _ = writeln!(t, "delete element ip {table} {name} {{ {} }}", list(gone));
        }
        let new: Vec<&T> = wanted.difference(had).collect();
        if !new.is_empty() {
            let _ = writeln!(t, "add element ip {table} {name} {{ {} }}", list(new));
        }
    }
    for name in before.keys().filter(|name| !after.contains_key(*name)) {
        let _ = writeln!(t, "flush set ip {table} {name}");
        stale.insert(name.clone());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use serde_json::json;

    use super::*;
    use crate::policy::model::{self, PolicyPod};

    fn pod(ns: &str, name: &str, app: &str, ip: &str) -> Arc<PolicyPod> {
        Arc::new(PolicyPod {
            namespace: ns.into(),
            name: name.into(),
            labels: [("app".to_string(), app.to_string())].into(),
            node: Some("n1".into()),
            ip: Some(ip.parse().unwrap()),
            ports: vec![("http".into(), Protocol::Tcp, 80)],
        })
    }

    fn policy(ns: &str, name: &str, spec: serde_json::Value) -> Arc<NetworkPolicy> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"namespace": ns, "name": name}, "spec": spec}),
            )
            .unwrap(),
        )
    }

    /// Every shape the ruleset has: peer sets, named-port sets, blocks, both directions.
    fn every_shape() -> Arc<NetworkPolicy> {
        policy(
            "x",
            "all-shapes",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"namespaceSelector": {}}, {"ipBlock": {"cidr": "10.9.0.0/16", "except": ["10.9.1.0/24"]}}],
                             "ports": [{"port": "http"}, {"protocol": "UDP", "port": 53, "endPort": 60}]}],
                "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                            "ports": [{"port": "http"}, {"protocol": "SCTP"}]}]}),
        )
    }

    #[test]
    fn the_full_table_is_one_the_kernel_accepts() {
        let pods = [
            pod("x", "a", "web", "10.0.0.2"),
            pod("y", "b", "web", "10.0.0.3"),
        ];
        let rules = model::ruleset("n1", &pods, &[], &[every_shape()]);
        assert!(!rules.is_empty());
        let text = full("krust-policy-test", &rules);
        crate::nft::check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        // Nothing isolated: an empty table, no chain in the forward hook.
        let empty = full("krust-policy-test", &Ruleset::default());
        assert!(!empty.contains("hook"));
        crate::nft::check(&empty).unwrap_or_else(|e| panic!("{e}\n{empty}"));
    }

    /// `nft list table` with its name taken out and its parts in a fixed order (the
    /// kernel lists chains in creation order and set elements as it likes).
    fn listing(table: &str) -> Vec<String> {
        let out = std::process::Command::new("nft")
            .args(["list", "table", "ip", table])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // The table's own closing brace would end whichever block comes last.
        let text = text.trim_end().strip_suffix('}').unwrap_or_default();
        let mut blocks: Vec<String> = Vec::new();
        let mut elements: Vec<String> = Vec::new();
        let mut in_elements = false;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if line.starts_with("chain ") || line.starts_with("set ") || line.starts_with("map ") {
                blocks.push(String::new());
            }
            let Some(block) = blocks.last_mut() else {
                continue;
            };
            let rest = match line.strip_prefix("elements = {") {
                Some(rest) => {
                    in_elements = true;
                    rest
                }
                None if in_elements => line,
                None => {
                    block.push_str(line);
                    block.push('\n');
                    continue;
                }
            };
            let rest = match rest.strip_suffix('}') {
                Some(last) => {
                    in_elements = false;
                    last
                }
                None => rest,
            };
            elements.extend(
                rest.split(',')
                    .map(|e| e.trim().to_string())
                    .filter(|e| !e.is_empty()),
            );
            if !in_elements {
                elements.sort();
                block.push_str(&format!("elements {}\n", elements.join(", ")));
                elements.clear();
            }
        }
        blocks.sort();
        blocks
    }

    /// A sequence of cluster states; after each, the table updated step by step must
    /// list exactly as one loaded whole from that state, and stale chains and sets are
    /// gone one update later.
    #[test]
    fn updates_reach_what_a_full_load_would_and_delete_stale_parts_a_step_later() {
        let namespaces: Vec<Arc<Namespace>> = Vec::new();
        let a = pod("x", "a", "web", "10.0.0.2");
        let b = pod("x", "b", "web", "10.0.0.3");
        let c = pod("x", "c", "db", "10.0.0.4");
        let other = policy(
            "x",
            "db-from-web",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 5432}]}]}),
        );
        type State = (Vec<Arc<PolicyPod>>, Vec<Arc<NetworkPolicy>>);
        let states: Vec<State> = vec![
            (vec![a.clone()], vec![every_shape()]),
            // A pod comes: new chains, new set elements.
            (vec![a.clone(), b.clone(), c.clone()], vec![every_shape()]),
            // A second policy, then the first goes: its sets and chains go stale.
            (
                vec![a.clone(), b.clone(), c.clone()],
                vec![every_shape(), other.clone()],
            ),
            (vec![a.clone(), b.clone(), c.clone()], vec![other.clone()]),
            // The first comes back while its parts are still stale; a pod goes.
            (
                vec![a.clone(), c.clone()],
                vec![every_shape(), other.clone()],
            ),
            (vec![a.clone(), c.clone()], vec![other.clone()]),
            (vec![a.clone(), c.clone()], vec![other.clone()]),
        ];
        let (step, whole) = ("krust-policy-test-steps", "krust-policy-test-whole");
        let mut loaded: Option<Loaded> = None;
        for (i, (pods, policies)) in states.into_iter().enumerate() {
            let rules = model::ruleset("n1", &pods, &namespaces, &policies);
            crate::nft::apply(&full(whole, &rules)).unwrap();
            let (text, after, whole_table) = transaction(loaded.as_ref(), step, rules);
            assert_eq!(whole_table, i == 0, "state {i}");
            crate::nft::apply(&text).unwrap_or_else(|e| panic!("state {i}: {e}\n{text}"));
            let (mut got, wanted) = (listing(step), listing(whole));
            // Stale chains and sets linger (flushed) for one update.
            got.retain(|block| {
                let name = block.lines().next().unwrap_or_default();
                let stale = |names: &BTreeSet<String>| {
                    names.iter().any(|n| name.contains(&format!(" {n} {{")))
                };
                !(stale(&after.stale_chains) || stale(&after.stale_sets))
            });
            let only = |a: &[String], b: &[String]| -> Vec<String> {
                a.iter().filter(|x| !b.contains(x)).cloned().collect()
            };
            assert!(
                got == wanted,
                "state {i}: only after the update: {:#?}\nonly after a full load: {:#?}\n{text}",
                only(&got, &wanted),
                only(&wanted, &got)
            );
            loaded = Some(after);
        }
        // Isolation ending needs the whole table (its base chains go).
        assert!(transaction(loaded.as_ref(), step, Ruleset::default()).2);
        crate::nft::delete_table(step).unwrap();
        crate::nft::delete_table(whole).unwrap();
    }
}
