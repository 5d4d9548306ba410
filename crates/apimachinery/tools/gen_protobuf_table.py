#!/usr/bin/env python3
"""Generates crates/apimachinery/src/protobuf/table.rs, the protobuf descriptor table.

Field numbers and wire types come from the upstream `generated.proto` files. The JSON
side of each field comes from the Go struct tags beside them (`types.go` and friends in
the same package): the JSON name, `omitempty`, `,inline`, and whether the Go field is
a pointer. The .proto files cannot tell those apart: go-to-protobuf declares every field
`optional`, and gogo writes non-pointer fields even when they hold zero values, so the
decoder needs the Go tags to drop zero values exactly where encoding/json would.

Usage (from the workspace root), with checkouts of kubernetes/api and
kubernetes/apimachinery at the same release tag (v0.33.x for Kubernetes 1.33), the tag
being recorded in the table's header:
    python3 crates/apimachinery/tools/gen_protobuf_table.py path/to/api path/to/apimachinery v0.33.13 \
        > crates/apimachinery/src/protobuf/table.rs

The script fails on anything the decoder could not represent (a Go named-slice wrapper
message, a map with non-string keys, an unknown scalar or special type), so a new root
or release cannot silently produce a table the decoder misreads.
"""

import glob
import os
import re
import sys

API_GROUPS = {
    # proto package suffix (k8s.io.api.<dir>.v1) -> apiVersion of its kinds
    "core": "v1",
    "admissionregistration": "admissionregistration.k8s.io/v1",
    "apps": "apps/v1",
    "authentication": "authentication.k8s.io/v1",
    "authorization": "authorization.k8s.io/v1",
    "autoscaling": "autoscaling/v1",
    "batch": "batch/v1",
    "certificates": "certificates.k8s.io/v1",
    "coordination": "coordination.k8s.io/v1",
    "discovery": "discovery.k8s.io/v1",
    "events": "events.k8s.io/v1",
    "networking": "networking.k8s.io/v1",
    "node": "node.k8s.io/v1",
    "policy": "policy/v1",
    "rbac": "rbac.authorization.k8s.io/v1",
    "scheduling": "scheduling.k8s.io/v1",
    "storage": "storage.k8s.io/v1",
}

# Group versions beyond v1 whose kinds are served: (proto package directory, version).
LATER_VERSIONS = [("autoscaling", "v2")]

# (apiVersion, kind, message) of every kind served in protobuf or accepted in a protobuf
# request body. Each one's `<Kind>List`, where its package has one, is added by `roots`.
ROOTS = [
    ("v1", "Binding", "core.v1.Binding"),
    ("v1", "ComponentStatus", "core.v1.ComponentStatus"),
    ("v1", "ConfigMap", "core.v1.ConfigMap"),
    ("v1", "Endpoints", "core.v1.Endpoints"),
    ("v1", "Event", "core.v1.Event"),
    ("v1", "LimitRange", "core.v1.LimitRange"),
    ("v1", "Namespace", "core.v1.Namespace"),
    ("v1", "Node", "core.v1.Node"),
    ("v1", "PersistentVolume", "core.v1.PersistentVolume"),
    ("v1", "PersistentVolumeClaim", "core.v1.PersistentVolumeClaim"),
    ("v1", "Pod", "core.v1.Pod"),
    ("v1", "PodTemplate", "core.v1.PodTemplate"),
    ("v1", "ReplicationController", "core.v1.ReplicationController"),
    ("v1", "ResourceQuota", "core.v1.ResourceQuota"),
    ("v1", "Secret", "core.v1.Secret"),
    ("v1", "Service", "core.v1.Service"),
    ("v1", "ServiceAccount", "core.v1.ServiceAccount"),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "admissionregistration.v1.MutatingWebhookConfiguration"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "admissionregistration.v1.ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", "admissionregistration.v1.ValidatingAdmissionPolicyBinding"),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "admissionregistration.v1.ValidatingWebhookConfiguration"),
    ("apps/v1", "ControllerRevision", "apps.v1.ControllerRevision"),
    ("apps/v1", "DaemonSet", "apps.v1.DaemonSet"),
    ("apps/v1", "Deployment", "apps.v1.Deployment"),
    ("apps/v1", "ReplicaSet", "apps.v1.ReplicaSet"),
    ("apps/v1", "StatefulSet", "apps.v1.StatefulSet"),
    ("authentication.k8s.io/v1", "SelfSubjectReview", "authentication.v1.SelfSubjectReview"),
    ("authentication.k8s.io/v1", "TokenRequest", "authentication.v1.TokenRequest"),
    ("authentication.k8s.io/v1", "TokenReview", "authentication.v1.TokenReview"),
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview", "authorization.v1.LocalSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview", "authorization.v1.SelfSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview", "authorization.v1.SelfSubjectRulesReview"),
    ("authorization.k8s.io/v1", "SubjectAccessReview", "authorization.v1.SubjectAccessReview"),
    ("autoscaling/v1", "HorizontalPodAutoscaler", "autoscaling.v1.HorizontalPodAutoscaler"),
    ("autoscaling/v1", "Scale", "autoscaling.v1.Scale"),
    ("autoscaling/v2", "HorizontalPodAutoscaler", "autoscaling.v2.HorizontalPodAutoscaler"),
    ("batch/v1", "CronJob", "batch.v1.CronJob"),
    ("batch/v1", "Job", "batch.v1.Job"),
    ("certificates.k8s.io/v1", "CertificateSigningRequest", "certificates.v1.CertificateSigningRequest"),
    ("coordination.k8s.io/v1", "Lease", "coordination.v1.Lease"),
    ("discovery.k8s.io/v1", "EndpointSlice", "discovery.v1.EndpointSlice"),
    ("events.k8s.io/v1", "Event", "events.v1.Event"),
    ("networking.k8s.io/v1", "Ingress", "networking.v1.Ingress"),
    ("networking.k8s.io/v1", "IngressClass", "networking.v1.IngressClass"),
    ("networking.k8s.io/v1", "NetworkPolicy", "networking.v1.NetworkPolicy"),
    ("node.k8s.io/v1", "RuntimeClass", "node.v1.RuntimeClass"),
    ("policy/v1", "Eviction", "policy.v1.Eviction"),
    ("policy/v1", "PodDisruptionBudget", "policy.v1.PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "rbac.v1.ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "rbac.v1.ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role", "rbac.v1.Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rbac.v1.RoleBinding"),
    ("scheduling.k8s.io/v1", "PriorityClass", "scheduling.v1.PriorityClass"),
    ("storage.k8s.io/v1", "CSIDriver", "storage.v1.CSIDriver"),
    ("storage.k8s.io/v1", "CSINode", "storage.v1.CSINode"),
    ("storage.k8s.io/v1", "CSIStorageCapacity", "storage.v1.CSIStorageCapacity"),
    ("storage.k8s.io/v1", "StorageClass", "storage.v1.StorageClass"),
    ("storage.k8s.io/v1", "VolumeAttachment", "storage.v1.VolumeAttachment"),
    # DeleteOptions is registered in every group version; these two are the
    # group-independent spellings (the decoder maps any other apiVersion to it too).
    ("meta.k8s.io/v1", "DeleteOptions", "meta.v1.DeleteOptions"),
    ("v1", "DeleteOptions", "meta.v1.DeleteOptions"),
    # Answers that are not stored kinds: errors, and the metadata-only view of any kind.
    ("v1", "Status", "meta.v1.Status"),
    ("meta.k8s.io/v1", "PartialObjectMetadata", "meta.v1.PartialObjectMetadata"),
]

# Types whose JSON form is custom (a MarshalJSON method in Go): the decoder handles
# each one in code, so they are value kinds rather than table messages.
SPECIAL = {
    "k8s.io.apimachinery.pkg.api.resource.Quantity": "Quantity",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": "IntOrString",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Time": "Time",
    "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime": "MicroTime",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1": "FieldsV1",
    "k8s.io.apimachinery.pkg.runtime.RawExtension": "RawExtension",
    # `type ExtraValue []string`, wrapped as `{repeated string items = 1}`.
    "k8s.io.api.authentication.v1.ExtraValue": "StringList",
    "k8s.io.api.authorization.v1.ExtraValue": "StringList",
    "k8s.io.api.certificates.v1.ExtraValue": "StringList",
}

SCALARS = {"string": "Str", "bool": "Bool", "int32": "I32", "int64": "I64", "bytes": "Bytes"}

FIELD_RE = re.compile(
    r"^\s*(?:(optional|repeated|required)\s+)?(map<\s*(\S+)\s*,\s*(\S+)\s*>|\S+)\s+(\w+)\s*=\s*(\d+)\s*;"
)
GO_FIELD_RE = re.compile(r"^\t(?:(\w+)\s+)?(\S+)\s+`([^`]*)`")


def fail(msg):
    sys.exit(f"gen_protobuf_table: {msg}")


def short(package):
    """`k8s.io.api.core.v1` -> `core.v1`; `k8s.io.apimachinery.pkg.apis.meta.v1` -> `meta.v1`."""
    for prefix in ("k8s.io.api.", "k8s.io.apimachinery.pkg.apis."):
        if package.startswith(prefix):
            return package[len(prefix):]
    fail(f"no short name for package {package}")


def parse_proto(path):
    """Messages of one generated.proto: {full name: [(number, name, label, type, map key)]}."""
    text = open(path).read()
    package = re.search(r"^package\s+([\w.]+);", text, re.M).group(1)
    messages = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^message\s+(\w+)\s*{", line)
        if m:
            current = messages.setdefault(f"{package}.{m.group(1)}", [])
            continue
        if line.startswith("}"):
            current = None
            continue
        m = FIELD_RE.match(line)
        if m and current is not None:
            label, typ, key, value, name, number = m.groups()
            if key is not None:
                label, typ = "map", value
            if typ not in SCALARS:
                typ = typ.lstrip(".") if "." in typ else f"{package}.{typ}"
            current.append((int(number), name, label, typ, key))
    return messages


def parse_go(directory):
    """Go struct fields carrying a protobuf tag: {(struct, number): go field facts}."""
    fields = {}
    slices = set()
    for path in sorted(glob.glob(os.path.join(directory, "*.go"))):
        if path.endswith("_test.go") or os.path.basename(path).startswith("zz_generated"):
            continue
        struct, order = None, 0
        for line in open(path):
            m = re.match(r"^type (\w+) (\[\]|map\[)", line)
            if m:
                slices.add(m.group(1))
            m = re.match(r"^type (\w+) struct {", line)
            if m:
                struct, order = m.group(1), 0
                continue
            if line.startswith("}"):
                struct = None
                continue
            m = GO_FIELD_RE.match(line) if struct else None
            if not m:
                continue
            _, go_type, tags = m.groups()
            pb = re.search(r'protobuf:"([^"]*)"', tags)
            js = re.search(r'json:"([^"]*)"', tags)
            if not pb or pb.group(1) == "-":
                continue
            number = int(pb.group(1).split(",")[1])
            json_name, *opts = (js.group(1) if js else "").split(",")
            fields[(struct, number)] = {
                "json": json_name,
                "omitempty": "omitempty" in opts,
                "inline": "inline" in opts,
                "pointer": go_type.startswith("*"),
                "order": order,
            }
            order += 1
    return fields, slices


def load(api_root, machinery_root):
    protos, go_fields, go_slices = {}, {}, set()
    dirs = [(os.path.join(api_root, g, "v1"), f"k8s.io.api.{g}.v1") for g in API_GROUPS]
    dirs += [(os.path.join(api_root, g, v), f"k8s.io.api.{g}.{v}") for g, v in LATER_VERSIONS]
    dirs.append((os.path.join(machinery_root, "pkg/apis/meta/v1"), "k8s.io.apimachinery.pkg.apis.meta.v1"))
    for directory, package in dirs:
        protos.update(parse_proto(os.path.join(directory, "generated.proto")))
        fields, slices = parse_go(directory)
        go_fields.update({(package, s, n): f for (s, n), f in fields.items()})
        go_slices.update(f"{package}.{s}" for s in slices)
    return protos, go_fields, go_slices


def value_kind(typ, pending):
    """The table's `Kind` for a proto type; queues messages of the table for the walk."""
    if typ in SCALARS:
        return SCALARS[typ]
    if typ in SPECIAL:
        return f"Obj({SPECIAL[typ]})"
    package, _, name = typ.rpartition(".")
    pending.append(typ)
    return f'Obj(Msg("{short(package)}.{name}"))'


def roots(full):
    """ROOTS and the list kind of each (`PodList` for `Pod`), where its package has one."""
    lists = [(v, f"{k}List", f"{m}List") for v, k, m in ROOTS
             if k != "DeleteOptions" and f"{m}List" in full]
    return ROOTS + lists


def build(protos, go_fields, go_slices):
    """Walks the messages reachable from the roots; returns the roots and
    {short name: [field rows]}."""
    full = {f"{short(p)}.{n}": f"{p}.{n}" for p, _, n in (k.rpartition(".") for k in protos)
            if p.startswith(("k8s.io.api.", "k8s.io.apimachinery.pkg.apis."))}
    kinds = roots(full)
    pending = [full[msg] for _, _, msg in kinds]
    table = {}
    while pending:
        typ = pending.pop()
        package, _, struct = typ.rpartition(".")
        name = f"{short(package)}.{struct}"
        if name in table:
            continue
        if typ not in protos:
            fail(f"{typ} is not in the .proto files read")
        if typ in go_slices:
            fail(f"{typ} is a Go named slice or map; the decoder has no wrapper support")
        rows = []
        for number, proto_name, label, ptype, key in protos[typ]:
            go = go_fields.get((package, struct, number))
            if go is None:
                fail(f"{name} field {number} ({proto_name}) has no Go struct field")
            if key is not None and key != "string":
                fail(f"{name}.{proto_name}: map key {key} is not string")
            kind = value_kind(ptype, pending)
            shape = {"map": "Map", "repeated": "List"}.get(label, "One")
            if go["inline"]:
                if not kind.startswith("Obj(Msg(") or go["pointer"] or shape != "One":
                    fail(f"{name}.{proto_name}: only embedded structs can be inline")
                json_name = ""
            else:
                # Usually equal to the proto name, but not always (IngressClassParametersReference
                # has proto `aPIGroup` for JSON `apiGroup`), so the Go tag decides.
                json_name = go["json"]
                if json_name in ("", "-"):
                    fail(f"{name}.{proto_name}: no JSON name in the Go tag")
            if go["pointer"]:
                presence = "Ptr" if go["omitempty"] else "PtrNull"
            elif shape == "One" and kind.startswith("Obj("):
                presence = "Keep"  # encoding/json never omits a struct value
            else:
                presence = "Omit" if go["omitempty"] else "Keep"
            rows.append((number, json_name, go["order"], shape, kind, presence))
        table[name] = sorted(rows)
    return kinds, table


def ident(name):
    """`core.v1.HTTPIngressPath` -> `CORE_V1_HTTP_INGRESS_PATH`, the message's static."""
    words = re.sub(r"([a-z0-9])([A-Z])|([A-Z])([A-Z][a-z])", r"\1\3_\2\4", name)
    return words.replace(".", "_").upper()


def check_acyclic(table):
    """The decoder recurses once per nested message; without cycles its depth is bounded."""
    state = {}

    def visit(name, path):
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            fail("message cycle " + " -> ".join(path + [name]))
        state[name] = "open"
        for row in table[name]:
            m = re.match(r'Msg\(&(\w+)\)', row[4])
            if m:
                visit(m.group(1), path + [name])
        state[name] = "done"

    for name in table:
        visit(name, [])


def main():
    if len(sys.argv) != 4:
        fail("usage: gen_protobuf_table.py <kubernetes/api dir> <kubernetes/apimachinery dir> <tag>")
    api_root, machinery_root, tag = sys.argv[1:]
    kinds, table = build(*load(api_root, machinery_root))
    idents = {name: ident(name) for name in table}
    if len(set(idents.values())) != len(idents):
        fail("two messages map to the same static name")
    rows = {idents[name]: [(*r[:4], re.sub(r'Msg\("([^"]+)"\)', lambda m: f"Msg(&{idents[m.group(1)]})", r[4]), r[5])
                           for r in table[name]] for name in table}
    check_acyclic(rows)
    out = [
        "// @generated by crates/apimachinery/tools/gen_protobuf_table.py from the generated.proto files and",
        f"// Go struct tags of kubernetes/api and kubernetes/apimachinery {tag}. Do not edit by hand.",
        "",
        "use super::descriptor::{Field, Kind::*, Message, Obj::*, Presence::*, Shape::*};",
        "",
        "/// (apiVersion, kind, message) of every kind with a protobuf form, sorted.",
        "pub(super) static KINDS: &[(&str, &str, &Message)] = &[",
    ]
    out += [f'    ("{v}", "{k}", &{idents[m]}),' for v, k, m in sorted(kinds)]
    out.append("];")
    for name in sorted(table):
        out += ["", f'static {idents[name]}: Message = Message::new("{name}", &[']
        for number, json_name, order, shape, kind, presence in rows[idents[name]]:
            out.append(f'    Field::new({number}, "{json_name}", {order}, {shape}, {kind}, {presence}),')
        out.append("]);")
    print("\n".join(out))


if __name__ == "__main__":
    main()
