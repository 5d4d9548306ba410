#!/usr/bin/env python3
"""Generates crates/apimachinery/src/patch/table.rs, the strategic-merge-patch metadata table.

The shape of every type (which fields are nested objects, which are lists, and of
what) is read from the k8s-openapi 0.29 sources (the `v1_33` module) in the local
cargo registry. k8s-openapi does not carry the strategic-merge-patch annotations
(`x-kubernetes-patch-strategy` / `x-kubernetes-patch-merge-key`), so those are listed
below in PATCH_FACTS, one line per annotated field of a type reachable from ROOTS.

Usage (from the workspace root):
    python3 crates/apimachinery/tools/gen_patch_meta.py [path/to/k8s-openapi-0.29.0/src/v1_33] \
        > crates/apimachinery/src/patch/table.rs

The script fails if a fact names a field that the walk did not reach, so the facts
cannot silently go stale when ROOTS or the k8s-openapi version change.
"""

import glob
import os
import re
import sys

# (group, version, kind) of every resource whose PATCH the apiserver can resolve.
ROOTS = [
    ("", "v1", "ConfigMap"),
    ("", "v1", "Endpoints"),
    ("", "v1", "Event"),
    ("", "v1", "LimitRange"),
    ("", "v1", "Namespace"),
    ("", "v1", "Node"),
    ("", "v1", "PersistentVolume"),
    ("", "v1", "PersistentVolumeClaim"),
    ("", "v1", "Pod"),
    ("", "v1", "PodTemplate"),
    ("", "v1", "ReplicationController"),
    ("", "v1", "ResourceQuota"),
    ("", "v1", "Secret"),
    ("", "v1", "Service"),
    ("", "v1", "ServiceAccount"),
    ("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
    ("apps", "v1", "ControllerRevision"),
    ("apps", "v1", "DaemonSet"),
    ("apps", "v1", "Deployment"),
    ("apps", "v1", "ReplicaSet"),
    ("apps", "v1", "StatefulSet"),
    ("autoscaling", "v2", "HorizontalPodAutoscaler"),
    ("batch", "v1", "CronJob"),
    ("batch", "v1", "Job"),
    ("coordination.k8s.io", "v1", "Lease"),
    ("discovery.k8s.io", "v1", "EndpointSlice"),
    ("events.k8s.io", "v1", "Event"),
    ("networking.k8s.io", "v1", "Ingress"),
    ("networking.k8s.io", "v1", "IngressClass"),
    ("networking.k8s.io", "v1", "NetworkPolicy"),
    ("node.k8s.io", "v1", "RuntimeClass"),
    ("policy", "v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io", "v1", "Role"),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
    ("scheduling.k8s.io", "v1", "PriorityClass"),
    ("storage.k8s.io", "v1", "StorageClass"),
]

CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."

# "<definition>.<json field>": (patchStrategy, patchMergeKey or None), as declared by
# the `patchStrategy` / `patchMergeKey` Go struct tags of the upstream API types.
PATCH_FACTS = {
    META + "ObjectMeta.finalizers": ("merge", None),
    META + "ObjectMeta.ownerReferences": ("merge", "uid"),
    CORE + "Container.env": ("merge", "name"),
    CORE + "Container.ports": ("merge", "containerPort"),
    CORE + "Container.volumeDevices": ("merge", "devicePath"),
    CORE + "Container.volumeMounts": ("merge", "mountPath"),
    CORE + "ContainerStatus.allocatedResourcesStatus": ("merge", "name"),
    CORE + "ContainerStatus.volumeMounts": ("merge", "mountPath"),
    CORE + "EphemeralContainer.env": ("merge", "name"),
    CORE + "EphemeralContainer.ports": ("merge", "containerPort"),
    CORE + "EphemeralContainer.volumeDevices": ("merge", "devicePath"),
    CORE + "EphemeralContainer.volumeMounts": ("merge", "mountPath"),
    CORE + "NamespaceStatus.conditions": ("merge", "type"),
    CORE + "NodeSpec.podCIDRs": ("merge", None),
    CORE + "NodeStatus.addresses": ("merge", "type"),
    CORE + "NodeStatus.conditions": ("merge", "type"),
    CORE + "PersistentVolumeClaimStatus.conditions": ("merge", "type"),
    CORE + "PodSpec.containers": ("merge", "name"),
    CORE + "PodSpec.ephemeralContainers": ("merge", "name"),
    CORE + "PodSpec.hostAliases": ("merge", "ip"),
    CORE + "PodSpec.imagePullSecrets": ("merge", "name"),
    CORE + "PodSpec.initContainers": ("merge", "name"),
    CORE + "PodSpec.resourceClaims": ("merge,retainKeys", "name"),
    CORE + "PodSpec.schedulingGates": ("merge", "name"),
    CORE + "PodSpec.topologySpreadConstraints": ("merge", "topologyKey"),
    CORE + "PodSpec.volumes": ("merge,retainKeys", "name"),
    CORE + "PodStatus.conditions": ("merge", "type"),
    CORE + "PodStatus.hostIPs": ("merge", "ip"),
    CORE + "PodStatus.podIPs": ("merge", "ip"),
    CORE + "PodStatus.resourceClaimStatuses": ("merge,retainKeys", "name"),
    CORE + "ReplicationControllerStatus.conditions": ("merge", "type"),
    CORE + "ServiceAccount.secrets": ("merge", "name"),
    CORE + "ServiceSpec.ports": ("merge", "port"),
    CORE + "ServiceStatus.conditions": ("merge", "type"),
    "io.k8s.api.apps.v1.DaemonSetStatus.conditions": ("merge", "type"),
    "io.k8s.api.apps.v1.DeploymentSpec.strategy": ("retainKeys", None),
    "io.k8s.api.apps.v1.DeploymentStatus.conditions": ("merge", "type"),
    "io.k8s.api.apps.v1.ReplicaSetStatus.conditions": ("merge", "type"),
    "io.k8s.api.apps.v1.StatefulSetStatus.conditions": ("merge", "type"),
    "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerStatus.conditions": ("merge", "type"),
    "io.k8s.api.batch.v1.JobStatus.conditions": ("merge", "type"),
    "io.k8s.api.policy.v1.PodDisruptionBudgetSpec.selector": ("replace", None),
    "io.k8s.api.policy.v1.PodDisruptionBudgetStatus.conditions": ("merge", "type"),
}


def find_source_dir():
    if len(sys.argv) > 1:
        return sys.argv[1]
    home = os.path.expanduser("~")
    pattern = os.path.join(home, ".cargo/registry/src/*/k8s-openapi-0.29.0/src/v1_33")
    found = sorted(glob.glob(pattern))
    if not found:
        sys.exit("k8s-openapi 0.29.0 sources not found; pass the src/v1_33 directory")
    return found[-1]


class Struct:
    def __init__(self, definition, fields):
        self.definition = definition
        self.fields = fields  # [(json name, rust type)]


def parse_sources(src_dir):
    """Returns ({rust path: Struct}, {(group, version, kind): rust path})."""
    structs, resources = {}, {}
    for path in glob.glob(os.path.join(src_dir, "**/*.rs"), recursive=True):
        text = open(path, encoding="utf-8").read()
        header = re.match(r"// Generated from definition (\S+)", text)
        body = re.search(r"^pub struct (\w+) \{\n(.*?)^\}", text, re.S | re.M)
        if not header or not body:
            continue
        module = os.path.relpath(os.path.dirname(path), src_dir).replace(os.sep, "::")
        rust_path = "crate::%s::%s" % (module, body.group(1))
        rust_types = dict(re.findall(r"^    pub (\w+): (.+),$", body.group(2), re.M))
        json_names = re.findall(r'^\s*"([^"]+)" => Field::Key_(\w+),$', text, re.M)
        # apiVersion and kind are decoded but are constants, not struct fields.
        fields = [(json, rust_types[ident]) for json, ident in json_names if ident in rust_types]
        structs[rust_path] = Struct(header.group(1), fields)
        resource = re.search(
            r'const GROUP: &\'static str = "([^"]*)";\s*'
            r'const KIND: &\'static str = "([^"]*)";\s*'
            r'const VERSION: &\'static str = "([^"]*)";',
            text,
        )
        if resource:
            group, kind, version = resource.groups()
            resources[(group, version, kind)] = rust_path
    return structs, resources


def classify(rust_type):
    """Splits a field type into (shape, element rust type): shape is one of
    'object', 'list', 'map'."""
    rust_type = re.sub(r"^Option<(.*)>$", r"\1", rust_type)
    m = re.match(r"^std::vec::Vec<(.*)>$", rust_type)
    if m:
        return "list", m.group(1)
    m = re.match(r"^std::collections::BTreeMap<std::string::String, (.*)>$", rust_type)
    if m:
        return "map", m.group(1)
    return "object", rust_type


def walk(structs, root_paths):
    """Visits every struct reachable from the roots; returns {definition: [field rows]}."""
    table, pending = {}, list(root_paths)
    while pending:
        rust_path = pending.pop()
        struct = structs[rust_path]
        if struct.definition in table:
            continue
        rows = []
        for json, rust_type in struct.fields:
            shape, elem = classify(rust_type)
            elem_struct = structs.get(elem)
            # Maps are merged key by key whatever their values are, so they carry no
            # metadata; a fact below a map value would go unreached and be reported.
            if shape == "map" or (shape == "object" and elem_struct is None):
                continue
            if elem_struct is not None:
                pending.append(elem)
            rows.append((json, shape, elem_struct.definition if elem_struct else None))
        table[struct.definition] = rows
    return table


def without_plain_types(table):
    """Drops the types that hold no list and no annotated field anywhere below them,
    and the object fields that point at them: for those the engine's default (merge
    objects key by key) is all there is to know. Lists are always kept, with no
    element type when the element is plain; annotated object fields are kept too."""
    annotated = {
        elem
        for definition, rows in table.items()
        for json, shape, elem in rows
        if shape == "object" and "%s.%s" % (definition, json) in PATCH_FACTS
    }
    plain = set()
    changed = True
    while changed:
        changed = False
        for definition, rows in table.items():
            if definition not in plain and definition not in annotated and all(
                shape == "object" and elem in plain for _, shape, elem in rows
            ):
                plain.add(definition)
                changed = True
    return {
        definition: [
            (json, shape, None if elem in plain else elem)
            for json, shape, elem in rows
            if not (shape == "object" and elem in plain)
        ]
        for definition, rows in table.items()
        if definition not in plain
    }


def rust_field(definition, json, shape, elem):
    fact = PATCH_FACTS.get("%s.%s" % (definition, json))
    if shape == "object":
        expr = 'obj("%s", "%s")' % (json, elem)
    elif elem is None:
        expr = 'list("%s")' % json
    else:
        expr = 'list_of("%s", "%s")' % (json, elem)
    if fact:
        strategy, key = fact
        merge = '.merge_by("%s")' % key if key else ".merge()"
        expr += {
            "merge": merge,
            "merge,retainKeys": merge + ".retain_keys()",
            "retainKeys": ".retain_keys()",
            "replace": ".replace()",
        }[strategy]
    return expr


def main():
    structs, resources = parse_sources(find_source_dir())
    root_paths = []
    for gvk in ROOTS:
        if gvk not in resources:
            sys.exit("no resource %s in k8s-openapi" % (gvk,))
        root_paths.append(resources[gvk])
    table = walk(structs, root_paths)

    for fact in PATCH_FACTS:
        definition, json = fact.rsplit(".", 1)
        if not any(row[0] == json for row in table.get(definition, [])):
            sys.exit("fact %s names no reachable list or object field" % fact)
    table = without_plain_types(table)

    out = [
        "// @generated by crates/apimachinery/tools/gen_patch_meta.py from the k8s-openapi 0.29 (v1_33)",
        "// type shapes and the patch strategies listed in that script. Do not edit by hand.",
        "",
        "use super::meta::{TypeMeta, list, list_of, obj};",
        "",
        "/// The types reachable from [`ROOTS`] that hold a list or an annotated field somewhere",
        "/// below them, sorted by definition name.",
        "pub(super) static TYPES: &[TypeMeta] = &[",
    ]
    for definition in sorted(table):
        rows = table[definition]
        if not rows:
            out.append('    TypeMeta::new("%s", &[]),' % definition)
            continue
        out.append('    TypeMeta::new("%s", &[' % definition)
        for json, shape, elem in rows:
            out.append("        %s," % rust_field(definition, json, shape, elem))
        out.append("    ]),")
    out.append("];")
    out.append("")
    out.append("/// (group, version, kind) → root type definition.")
    out.append("pub(super) static ROOTS: &[(&str, &str, &str, &str)] = &[")
    for gvk in ROOTS:
        out.append('    ("%s", "%s", "%s", "%s"),' % (gvk + (structs[resources[gvk]].definition,)))
    out.append("];")
    print("\n".join(out))


if __name__ == "__main__":
    main()
