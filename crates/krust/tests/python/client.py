"""The official Python client against a krust server with a node: CRUD, watch, logs,
exec and port-forward (WebSocket v4.channel.k8s.io). Run by tests/python_client.rs with
KUBECONFIG set; prints "ok" when every check passed."""

from kubernetes import client, config, watch
from kubernetes.stream import portforward, stream

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
                command=[
                    "sh",
                    "-c",
                    "echo hello-from-py; mkdir -p /www; echo pf-ok > /www/index.html;"
                    " exec httpd -f -p 8080 -h /www",
                ],
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

# Interactive: stdin written as text messages (the client's way), answered on stdout.
shell = stream(
    v1.connect_post_namespaced_pod_exec,
    "py",
    ns,
    command=["/bin/sh"],
    stderr=True,
    stdin=True,
    stdout=True,
    tty=False,
    _preload_content=False,
)
shell.write_stdin("echo test string 1\n")
line = shell.readline_stdout(timeout=10)
assert line == "test string 1", repr(line)
shell.write_stdin("exit\n")
shell.close()

# Port-forward: a data and an error channel per port.
pf = portforward(v1.connect_get_namespaced_pod_portforward, "py", ns, ports="8080")
sock = pf.socket(8080)
sock.setblocking(True)
sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
reply = b""
while True:
    data = sock.recv(1024)
    if not data:
        break
    reply += data
sock.close()
assert b"pf-ok" in reply, reply
assert pf.error(8080) is None, pf.error(8080)

v1.delete_namespaced_pod("py", ns)
print("ok")
