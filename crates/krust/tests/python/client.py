"""The official Python client against a krust server with a node: CRUD, watch, logs
and exec (WebSocket v4.channel.k8s.io). Run by tests/python_client.rs with KUBECONFIG
set; prints "ok" when every check passed."""

from kubernetes import client, config, watch
from kubernetes.stream import stream

config.load_kube_config()
v1 = client.CoreV1Api()
ns = "default"

pod = client.V1Pod(
    metadata=client.V1ObjectMeta(name="py", labels={"app": "py"}),
    spec=client.V1PodSpec(
        termination_grace_period_seconds=1,
        containers=[
            client.V1Container(
                name="c",
                image="busybox",
                command=["sh", "-c", "echo hello-from-py; exec sleep 3600"],
            )
        ],
    ),
)
created = v1.create_namespaced_pod(ns, pod)
assert created.metadata.uid, created

w = watch.Watch()
running = False
for event in w.stream(
    v1.list_namespaced_pod, ns, label_selector="app=py", timeout_seconds=60
):
    if event["object"].status.phase == "Running":
        running = True
        w.stop()
assert running, "the pod never ran"

logs = v1.read_namespaced_pod_log("py", ns, container="c")
assert logs == "hello-from-py\n", repr(logs)

out = stream(
    v1.connect_get_namespaced_pod_exec,
    "py",
    ns,
    command=["sh", "-c", "echo out-$((6*7))"],
    stderr=True,
    stdin=False,
    stdout=True,
    tty=False,
)
assert out.strip() == "out-42", repr(out)

resp = stream(
    v1.connect_get_namespaced_pod_exec,
    "py",
    ns,
    command=["sh", "-c", "echo to-stderr >&2; exit 3"],
    stderr=True,
    stdin=False,
    stdout=True,
    tty=False,
    _preload_content=False,
)
resp.run_forever(timeout=20)
assert resp.returncode == 3, resp.returncode
assert resp.read_stderr().strip() == "to-stderr"

v1.delete_namespaced_pod("py", ns)
print("ok")
