#!/usr/bin/env python3
"""Generates crates/apimachinery/src/apply/table.rs, the structural schema of built-in kinds that
server-side apply needs: for each list its `x-kubernetes-list-type` (and map keys), for
each map its `x-kubernetes-map-type`, and which structs are atomic.

It reuses the type shapes that gen_patch_meta.py reads from the k8s-openapi 0.29 sources
(`v1_33`) and takes the merge strategies from k8s-openapi's `DeepMerge` impls
(`merge_strategies::list::{atomic,set,map}`, `merge_strategies::map::{atomic,granular}`).
Those impls are close to, but not exactly, the schema that the apiserver applies with:
k8s-openapi replaces a list's `x-kubernetes-list-map-keys` with its single
`x-kubernetes-patch-merge-key`, and knows neither struct-level `x-kubernetes-map-type:
atomic` nor the `default` of key fields. The facts below restore those, one line per
field or type, as the upstream OpenAPI spec declares them.

Usage (from the workspace root):
    python3 crates/apimachinery/tools/gen_ssa_schema.py [path/to/k8s-openapi-0.29.0/src/v1_33] \
        > crates/apimachinery/src/apply/table.rs

    # Compare the result with the schema client-go embeds for typed apply (its
    # applyconfigurations/internal/internal.go); prints each difference and exits 1.
    python3 crates/apimachinery/tools/gen_ssa_schema.py --check path/to/internal.go [...]

The script fails if a fact names a field or type that the walk did not reach, so the
facts cannot silently go stale when ROOTS or the k8s-openapi version change.
"""

import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_patch_meta import ROOTS, classify, find_source_dir, parse_sources  # noqa: E402

CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."

# Definitions declared `x-kubernetes-map-type: atomic` (`+structType=atomic`): a field
# of such a type is owned and replaced as a whole.
ATOMIC_STRUCTS = {
    META + "LabelSelector",
    META + "OwnerReference",
    CORE + "ConfigMapKeySelector",
    CORE + "LocalObjectReference",
    CORE + "NodeSelector",
    CORE + "ObjectFieldSelector",
    CORE + "ObjectReference",
    CORE + "ResourceFieldSelector",
    CORE + "ScopeSelector",
    CORE + "SecretKeySelector",
    CORE + "SecretReference",
    CORE + "TypedLocalObjectReference",
    "io.k8s.api.networking.v1.ServiceBackendPort",
    "io.k8s.api.rbac.v1.RoleRef",
}

# Definitions that k8s-openapi does not model as a struct and that hold a scalar. Any
# other such type (free-form JSON such as RawExtension) has to be declared in
# FIELD_FACTS where it is reached: the walk stops with an error otherwise.
SCALAR_TYPES = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
    META + "MicroTime",
    META + "Time",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
}

# "<definition>.<json field>": the merge type where it is not what DeepMerge says:
# "atomic", "set", or the tuple of `x-kubernetes-list-map-keys`.
FIELD_FACTS = {
    CORE + "Container.ports": ("containerPort", "protocol"),
    CORE + "EphemeralContainer.ports": ("containerPort", "protocol"),
    CORE + "PodSpec.topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
    CORE + "PodStatus.hostIPs": "atomic",
    CORE + "ServiceSpec.ports": ("port", "protocol"),
    "io.k8s.api.batch.v1.JobStatus.conditions": "atomic",
    # Free-form (a RawExtension), but declared atomic rather than merged key by key.
    "io.k8s.api.apps.v1.ControllerRevision.data": "atomic",
    # k8s-openapi merges these by metadata.name; the API declares no list type.
    "io.k8s.api.apps.v1.StatefulSetSpec.volumeClaimTemplates": "atomic",
}

# "<definition>.<json field>" of a list-map key field: the value an item that omits the
# key is indexed by (the field's OpenAPI `default`). Key fields not listed have none.
KEY_DEFAULTS = {
    CORE + "ContainerPort.containerPort": 0,
    CORE + "ContainerPort.protocol": "TCP",
    CORE + "ServicePort.port": 0,
    CORE + "ServicePort.protocol": "TCP",
    CORE + "TopologySpreadConstraint.topologyKey": "",
    CORE + "TopologySpreadConstraint.whenUnsatisfiable": "",
    CORE + "Container.name": "",
    CORE + "EphemeralContainer.name": "",
    CORE + "EnvVar.name": "",
    CORE + "Volume.name": "",
    CORE + "VolumeMount.mountPath": "",
    CORE + "VolumeDevice.devicePath": "",
    CORE + "HostAlias.ip": "",
    CORE + "LocalObjectReference.name": "",
    CORE + "PodSchedulingGate.name": "",
    CORE + "PodResourceClaim.name": "",
    CORE + "PodResourceClaimStatus.name": "",
    CORE + "ResourceClaim.name": "",
    CORE + "PodIP.ip": "",
    CORE + "NodeAddress.type": "",
    CORE + "PodCondition.type": "",
    CORE + "NodeCondition.type": "",
    CORE + "NamespaceCondition.type": "",
    CORE + "PersistentVolumeClaimCondition.type": "",
    CORE + "ReplicationControllerCondition.type": "",
    META + "Condition.type": "",
    META + "OwnerReference.uid": "",
    "io.k8s.api.apps.v1.DaemonSetCondition.type": "",
    "io.k8s.api.apps.v1.DeploymentCondition.type": "",
    "io.k8s.api.apps.v1.ReplicaSetCondition.type": "",
    "io.k8s.api.apps.v1.StatefulSetCondition.type": "",
    "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerCondition.type": "",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinitionCondition.type": "",
}


class Rust:
    """What the struct parser of gen_patch_meta.py leaves out: JSON names of Rust
    fields, DeepMerge strategies, and the definitions of newtype and enum types."""

    def __init__(self, src_dir):
        self.json_of = {}  # rust path -> {rust ident: json name}
        self.merges = {}  # rust path -> {json name: ("list"|"map", strategy, keys)}
        self.opaque = {}  # rust path of a newtype or enum -> definition
        for path in glob.glob(os.path.join(src_dir, "**/*.rs"), recursive=True):
            text = open(path, encoding="utf-8").read()
            header = re.match(r"// Generated from definition (\S+)", text)
            if not header:
                continue
            module = os.path.relpath(os.path.dirname(path), src_dir).replace(os.sep, "::")
            named = re.search(r"^pub struct (\w+) \{", text, re.M)
            if not named:
                other = re.search(r"^pub (?:struct|enum) (\w+)\b", text, re.M)
                if other:
                    self.opaque["crate::%s::%s" % (module, other.group(1))] = header.group(1)
                continue
            rust_path = "crate::%s::%s" % (module, named.group(1))
            idents = dict(
                (ident, json)
                for json, ident in re.findall(r'^\s*"([^"]+)" => Field::Key_(\w+),$', text, re.M)
            )
            self.json_of[rust_path] = idents
            self.merges[rust_path] = self.parse_merges(text, idents)

    @staticmethod
    def parse_merges(text, idents):
        merges = {}
        pattern = r"crate::merge_strategies::(list|map)::(\w+)\(\s*&mut self\.(\w+),\s*other\.\w+(?:,(\s*&\[[^\]]*\]))?"
        for kind, strategy, ident, keys in re.findall(pattern, text):
            key_idents = re.findall(r"lhs\.(\w+) ==", keys)
            merges[idents[ident]] = (kind, strategy, key_idents)
        return merges


class Walker:
    """Computes the schema type of every field reachable from the roots."""

    def __init__(self, structs, rust):
        self.structs, self.rust = structs, rust
        self.types = {}  # definition -> [(json, ty)]
        self.used_facts = set()

    def definition(self, rust_type):
        struct = self.structs.get(rust_type)
        return struct.definition if struct else self.rust.opaque.get(rust_type)

    def value_ty(self, rust_type):
        """The type of a value of `rust_type` (no list or map around it)."""
        definition = self.definition(rust_type)
        if definition in ATOMIC_STRUCTS:
            self.used_facts.add(definition)
            return ("atomic",)
        if rust_type in self.structs:
            self.visit(rust_type)
            return ("struct", definition)
        if definition is not None and definition not in SCALAR_TYPES:
            sys.exit("%s (%s) is free-form: declare its fields in FIELD_FACTS" % (definition, rust_type))
        if rust_type == "serde_json::Value":
            sys.exit("a serde_json::Value field is free-form: declare it in FIELD_FACTS")
        return ("plain",)

    def field_ty(self, struct_path, json, rust_type):
        definition = self.structs[struct_path].definition
        shape, elem = classify(rust_type)
        merge = self.rust.merges[struct_path].get(json)
        fact = FIELD_FACTS.get("%s.%s" % (definition, json))
        if fact == "atomic" and shape != "list":
            self.used_facts.add("%s.%s" % (definition, json))
            return ("atomic",)
        if shape == "object":
            return self.value_ty(elem)
        if shape == "map":
            if merge and merge[1] == "atomic":
                return ("atomic",)
            if elem in self.structs or classify(elem)[0] != "object" or self.value_ty(elem) != ("plain",):
                # Owned key by key too, but each value also as a whole: the engine has
                # no such type yet since no built-in kind needs one.
                sys.exit("%s.%s is a map of %s: teach the engine maps of objects" % (definition, json, elem))
            # A map of scalars is owned key by key, exactly like a struct.
            return ("plain",)
        if fact is not None:
            self.used_facts.add("%s.%s" % (definition, json))
            strategy = "map" if isinstance(fact, tuple) else fact
            keys = list(fact) if isinstance(fact, tuple) else []
        else:
            strategy = merge[1] if merge else "atomic"
            json_of = self.rust.json_of.get(elem, {})
            keys = [json_of[ident] for ident in merge[2]] if merge else []
        if strategy == "atomic":
            return ("plain",)  # lists of a plain value are atomic
        if strategy == "set":
            return ("set",)
        elem_ty = self.value_ty(elem)
        elem_def = self.definition(elem)
        key_defaults = []
        for key in keys:
            name = "%s.%s" % (elem_def, key)
            if name in KEY_DEFAULTS:
                self.used_facts.add(name)
            key_defaults.append((key, KEY_DEFAULTS.get(name)))
        return ("keyed", tuple(key_defaults), elem_ty)

    def visit(self, rust_path):
        definition = self.structs[rust_path].definition
        if definition in self.types:
            return
        self.types[definition] = None  # a type reached again below itself is not walked twice
        self.types[definition] = [
            (json, self.field_ty(rust_path, json, rust_type))
            for json, rust_type in self.structs[rust_path].fields
        ]


def plain_types(types):
    """The definitions whose every field is plain, even after replacing references to
    other plain definitions with plain: for those the engine's default is all there
    is to know."""
    plain, changed = set(), True
    while changed:
        changed = False
        for definition, rows in types.items():
            if definition not in plain and all(
                ty == ("plain",) or (ty[0] == "struct" and ty[1] in plain) for _, ty in rows
            ):
                plain.add(definition)
                changed = True
    return plain


def simplify(ty, plain):
    if ty[0] == "struct" and ty[1] in plain:
        return ("plain",)
    if ty[0] == "keyed":
        return ("keyed", ty[1], simplify(ty[2], plain))
    return ty


def rust_ty(ty):
    kind = ty[0]
    if kind == "struct":
        return 'Ty::Struct("%s")' % ty[1]
    if kind == "keyed":
        keys = ", ".join(rust_key(name, default) for name, default in ty[1])
        return "Ty::Keyed(&[%s], &%s)" % (keys, rust_ty(ty[2]))
    return {"plain": "Ty::Plain", "atomic": "Ty::Atomic", "set": "Ty::Set"}[kind]


def rust_key(name, default):
    if default is None:
        return 'Key::new("%s")' % name
    if isinstance(default, int):
        return 'Key::new("%s").or_int(%d)' % (name, default)
    return 'Key::new("%s").or_str("%s")' % (name, default)


def build(src_dir):
    """Returns ({definition: [(json, ty)]} for every reachable definition, roots)."""
    structs, resources = parse_sources(src_dir)
    walker = Walker(structs, Rust(src_dir))
    roots = []
    for gvk in ROOTS:
        if gvk not in resources:
            sys.exit("no resource %s in k8s-openapi" % (gvk,))
        walker.visit(resources[gvk])
        roots.append(gvk + (structs[resources[gvk]].definition,))
    stale = (set(FIELD_FACTS) | set(KEY_DEFAULTS) | ATOMIC_STRUCTS) - walker.used_facts
    if stale:
        sys.exit("facts name no reachable field or type: %s" % ", ".join(sorted(stale)))
    return walker.types, roots


def without_plain_types(types):
    plain = plain_types(types)
    table = {}
    for definition, rows in types.items():
        if definition not in plain:
            rows = [(json, simplify(ty, plain)) for json, ty in rows]
            table[definition] = [(json, ty) for json, ty in rows if ty != ("plain",)]
    return table


def render(table, roots):
    out = [
        "// @generated by crates/apimachinery/tools/gen_ssa_schema.py from the k8s-openapi 0.29 (v1_33)",
        "// type shapes and merge strategies, and the facts listed in that script. Do not edit",
        "// by hand.",
        "",
        "use super::schema::{Key, Ty, TypeSchema};",
        "",
        "/// The types reachable from [`ROOTS`] that hold a keyed or set list or an atomic field",
        "/// somewhere below them, sorted by definition name. Fields of plain type are left out.",
        "pub(super) static TYPES: &[TypeSchema] = &[",
    ]
    for definition in sorted(table):
        out.append('    TypeSchema::new("%s", &[' % definition)
        for json, ty in table[definition]:
            out.append('        ("%s", %s),' % (json, rust_ty(ty)))
        out.append("    ]),")
    out.append("];")
    out.append("")
    out.append("/// (group, version, kind) → root type definition.")
    out.append("pub(super) static ROOTS: &[(&str, &str, &str, &str)] = &[")
    for root in roots:
        out.append('    ("%s", "%s", "%s", "%s"),' % root)
    out.append("];")
    return "\n".join(out)


def smd_ty(types, type_ref):
    """The same vocabulary as Walker, computed from a structured-merge-diff schema."""
    if "namedType" in type_ref:
        name = type_ref["namedType"]
        if name == "__untyped_atomic_":
            return ("atomic",)
        if name == "__untyped_deduced_":
            return ("deduced",)
        atom = types[name]
    else:
        atom = type_ref
    if "map" in atom and "scalar" in atom:
        return ("deduced",)
    if "map" in atom:
        m = atom["map"]
        if m.get("elementRelationship") == "atomic":
            return ("atomic",)
        if "fields" in m or "elementType" not in m:
            return ("struct", type_ref.get("namedType"))
        if m["elementType"].get("namedType") == "__untyped_deduced_":
            return ("deduced",)
        return ("map", smd_ty(types, m["elementType"]))
    if "list" in atom:
        lst = atom["list"]
        if lst.get("elementRelationship") != "associative":
            return ("plain",)
        if not lst.get("keys"):
            return ("set",)
        elem = types[lst["elementType"]["namedType"]]["map"]
        defaults = {f["name"]: f.get("default") for f in elem.get("fields", [])}
        keys = tuple((key, defaults.get(key)) for key in lst["keys"])
        return ("keyed", keys, smd_ty(types, lst["elementType"]))
    return ("plain",)


def check(internal_go_files, reachable):
    import yaml  # only the check needs it

    types = {}
    for path in internal_go_files:
        text = open(path, encoding="utf-8").read()
        start = text.index("typed.YAMLObject(`") + len("typed.YAMLObject(`")
        for t in yaml.safe_load(text[start : text.index("`)", start)])["types"]:
            types[t["name"]] = t

    def normalize(ty):
        # A map of scalars is plain on our side.
        if ty[0] == "map" and ty[1] == ("plain",):
            return ("plain",)
        if ty[0] == "keyed":
            return ("keyed", ty[1], normalize(ty[2]))
        return ty

    differences = 0
    for definition in sorted(reachable):
        if definition not in types:
            print("missing in the SMD schema: %s" % definition)
            continue
        theirs = {f["name"]: f["type"] for f in types[definition].get("map", {}).get("fields", [])}
        for json, mine in reachable[definition]:
            if json not in theirs:
                print("%s.%s: missing in the SMD schema" % (definition, json))
                continue
            smd = normalize(smd_ty(types, theirs[json]))
            if smd != mine:
                differences += 1
                print("%s.%s: ours %s, SMD %s" % (definition, json, mine, smd))
    print("%d difference(s) over %d types" % (differences, len(reachable)))
    return differences == 0


def main():
    if sys.argv[1:2] == ["--check"]:
        files = sys.argv[2:]
        del sys.argv[1:]  # find_source_dir reads an optional source directory there
        reachable, _ = build(find_source_dir())
        sys.exit(0 if check(files, reachable) else 1)
    reachable, roots = build(find_source_dir())
    print(render(without_plain_types(reachable), roots))


if __name__ == "__main__":
    main()
