"""Create -> ready in the embedded mode, run by bench/embedded/run against its own `labforge up`.

For each run: POST a notebook at the catalog's defaults, then every 20 ms ask its server (on its
published port, as the runtime does) and the API. Reported per run: when the server first answered
HTTP, when the API first said ready, the lag between them, the CPU its container had used by then
(its cgroup's counter) and the CPU the whole machine spent from the create to ready (labforge,
podman and the container together). Then the median of each. The published port is found in
/proc/net/tcp rather than by asking podman, whose every call costs the machine CPU of its own.
    python3 measure.py URL USER PASSWORD RUNS [KIND]
KIND: jupyter (the default), vscode (the catalog's code-server), or saved: a JupyterLab notebook
saved as an image once, then each run creates a notebook on that image, removed from podman
first so that each start pulls its new layer, as a start after an auto-save does.
"""
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

url, user, password, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kind = sys.argv[5] if len(sys.argv) > 5 else "jupyter"
assert kind in ("jupyter", "vscode", "saved"), f"unknown kind {kind}"
# BENCH_CPU_LIMIT: a CPU limit above the catalog's request (the request stays the weight).
cpu_limit = os.environ.get("BENCH_CPU_LIMIT", "")
session = ""


def call(method, path, body=None):
    """The API, with the session cookie kept by hand: urllib's jar keeps no Secure cookie on
    plain HTTP, and labforge's is __Host- on localhost."""
    global session
    request = urllib.request.Request(
        url + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json", "cookie": session},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            if response.headers.get("set-cookie"):
                session = response.headers["set-cookie"].split(";")[0]
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None


def podman(*args):
    return subprocess.run(["podman", *args], capture_output=True, text=True).stdout.strip()


def machine_busy_seconds():
    """CPU every core spent busy so far: user, nice, system, irq, softirq and steal."""
    ticks = [int(t) for t in open("/proc/stat").readline().split()[1:]]
    return sum(ticks[i] for i in (0, 1, 2, 5, 6, 7)) / os.sysconf("SC_CLK_TCK")


def published_ports():
    """Ports listening on 127.0.0.2, where labforge publishes notebooks."""
    ports = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port = local.split(":")
        if state == "0A" and address == "0200007F":
            ports.add(int(port, 16))
    return ports


def cpu_seconds(container):
    """CPU used by the container so far, from its cgroup (v1 cpuacct or v2 cpu.stat)."""
    pid = podman("inspect", "--format", "{{.State.Pid}}", container)
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            for mount in (controllers, "cpuacct", "cpu,cpuacct"):
                try:
                    return int(open(f"/sys/fs/cgroup/{mount}{path}/cpuacct.usage").read()) / 1e9
                except OSError:
                    continue
        if controllers == "":
            try:
                stat = dict(l.split() for l in open(f"/sys/fs/cgroup{path}/cpu.stat"))
                return int(stat["usage_usec"]) / 1e6
            except OSError:
                pass
    return float("nan")


class KeepRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer of the server itself: not followed."""

    def redirect_request(self, *args):
        return None


no_redirects = urllib.request.build_opener(KeepRedirects)


def wait_ready(name, timeout=300):
    while True:
        _, answer = call("GET", f"/api/namespaces/{user}/notebooks/{name}")
        if answer and answer.get("notebook", answer).get("state") == "ready":
            return
        assert timeout > 0, f"{name}: not ready"
        time.sleep(0.2)
        timeout -= 0.2


def saved_image():
    """A JupyterLab notebook saved once: the image each run starts on."""
    status, _ = call("POST", f"/api/namespaces/{user}/notebooks", {"name": "origin", "workspace": "none"})
    assert status == 201, f"create origin: HTTP {status}"
    wait_ready("origin")
    status, save = call("POST", f"/api/namespaces/{user}/notebooks/origin/saves", {"tag": "bench"})
    assert status == 202, f"save: HTTP {status}"
    request = urllib.request.Request(f"{url}/api/namespaces/{user}/saves/{save['id']}", headers={"cookie": session})
    last = {}
    with urllib.request.urlopen(request, timeout=300) as events:
        for line in events:
            if line.startswith(b"data:"):
                last = json.loads(line[5:])
    assert last.get("phase") == "done", f"save ended {last}"
    call("DELETE", f"/api/namespaces/{user}/notebooks/origin")
    time.sleep(4)
    return last["target"]


status, _ = call("POST", "/api/login", {"username": user, "password": password})
assert status == 200, f"sign-in: HTTP {status}"
image = saved_image() if kind == "saved" else None
rows = []
for run in range(1, runs + 1):
    name = f"nb{run}"
    container = f"labforge-{user}_{name}"
    body = {"name": name}
    if cpu_limit:
        body["cpuLimit"] = cpu_limit
    if kind == "vscode":
        body["serverType"] = "vscode"
    if image:
        body["image"] = image
        podman("rmi", "-f", image)
    before = published_ports()
    start, busy_at_start = time.monotonic(), machine_busy_seconds()
    status, _ = call("POST", f"/api/namespaces/{user}/notebooks", body)
    assert status == 201, f"create: HTTP {status}"
    answered = ready = port = None
    while answered is None or ready is None:
        now = time.monotonic()
        if now - start > 300:
            sys.exit(f"{name}: not ready within 300 s")
        if port is None:
            new = published_ports() - before
            if new:
                port = new.pop()
        if port is not None and answered is None:
            try:
                no_redirects.open(f"http://127.0.0.2:{port}/notebook/{user}/{name}/", timeout=1)
                answered = time.monotonic()
            except urllib.error.HTTPError:
                answered = time.monotonic()  # any HTTP answer: the server is serving
            except OSError:
                pass
        if ready is None:
            _, answer = call("GET", f"/api/namespaces/{user}/notebooks/{name}")
            if answer and answer.get("notebook", answer).get("state") == "ready":
                ready = time.monotonic()
                machine = machine_busy_seconds() - busy_at_start
                cpu = cpu_seconds(container)
        time.sleep(0.02)
    rows.append((answered - start, ready - start, max(0.0, ready - answered), cpu, machine))
    print(
        f"{kind} run {run}: server answering {rows[-1][0]:.2f} s, API ready {rows[-1][1]:.2f} s, "
        f"lag {rows[-1][2]:.2f} s, CPU at ready {rows[-1][3]:.2f} s, machine {rows[-1][4]:.2f} s",
        flush=True,
    )
    call("DELETE", f"/api/namespaces/{user}/notebooks/{name}")
    time.sleep(4)  # its container goes before the next run, so runs do not share the CPUs
medians = [statistics.median(column) for column in zip(*rows)]
print(
    f"{kind}, median of {runs}: server answering {medians[0]:.2f} s, API ready {medians[1]:.2f} s, "
    f"lag {medians[2]:.2f} s (max {max(r[2] for r in rows):.2f}), CPU at ready {medians[3]:.2f} s, "
    f"machine CPU {medians[4]:.2f} s"
)
