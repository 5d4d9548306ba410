//! krust's end-to-end tests, one module per area, in one test binary (one link instead of
//! one per file, a fraction of the disk): each test starts real `krust` processes in its
//! own temp dir and drives them with the real kubectl, curl and clients. `common` is the
//! harness; `https` an HTTPS test server for webhooks and aggregated apiservers.

mod common;
mod https;

mod admission_policy;
mod agent;
mod aggregation;
mod architecture;
mod audit;
mod autoscaling;
mod certificates;
mod chaos;
mod controllers;
mod conversion;
mod custom_resources;
mod daemonsets;
mod disruption;
mod dns;
mod doctor;
mod durability;
mod encryption;
mod endpoints;
mod errors;
mod etcd;
mod gateway;
mod gc;
mod ha;
mod history;
mod hostile;
mod images;
mod ingress;
mod ingress_options;
mod install;
mod jobs;
mod kube_rs;
mod kubectl;
mod kubelet;
mod lifecycle;
mod managed_etcd;
mod metrics;
mod multinode;
mod namespaces;
mod network_policy;
mod operator;
mod podgc;
mod policy_admission;
mod protobuf;
mod proxy;
mod python_client;
mod rbac;
mod registry;
mod runtime_class;
mod scheduler;
mod sim;
mod snapshots;
mod statefulsets;
mod streams;
mod tokens;
mod volumes;
mod watch;
mod webhooks;
