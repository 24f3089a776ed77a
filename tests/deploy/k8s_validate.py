"""deploy/k8s/ rendered and validated without a cluster.

k8s_validate.py KILN_CLI
  1. `kubectl kustomize` renders each overlay (cpu, gpu);
  2. every object validates against the Kubernetes OpenAPI schemas of KUBERNETES_VERSION
     (PyPI's kubernetes-validate, --strict: unknown fields are errors); a deliberately
     broken copy fails, so the check can fail;
  3. the GPU overlay has runtimeClassName nvidia and an nvidia.com/gpu limit, the CPU one
     neither; probes point at /healthz and /readyz; the pod runs as non-root on a read-only
     root filesystem, and its grace period outlasts the server's drain;
  4. every flag the Deployment passes is one `kiln serve --help` lists, and the ConfigMap's
     model config is a file `kiln serve` parses;
  5. deploy/k8s/training (multi-worker training): an Indexed Job with one pod per worker of
     KILN_WORKERS, each named as listed through the headless Service, KILN_RANK from the
     completion index, flags that `kiln train` takes.
Prints "k8s manifests ok". Exits 77 (CTest: skipped, with the reason) when kubectl is not
installed; fails otherwise.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml
from kubernetes_validate import validate
from kubernetes_validate.utils import ValidationError

KUBERNETES_VERSION = "1.30.0"
HERE = os.path.dirname(os.path.abspath(__file__))
K8S = os.path.join(HERE, "..", "..", "deploy", "k8s")
KILN = sys.argv[1]


def render(overlay):
    r = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, "overlays", overlay)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def check_schema(objs, what):
    for o in objs:
        validate(o, KUBERNETES_VERSION, strict=True)
    print(f"{what}: {len(objs)} objects valid against Kubernetes {KUBERNETES_VERSION} (strict)")


def check_training():
    """deploy/k8s/training: the multi-worker Job agrees with its Service and with `kiln train`."""
    r = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, "training")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    objs = [d for d in yaml.safe_load_all(r.stdout) if d]
    check_schema(objs, "training")
    assert sorted(o["kind"] for o in objs) == ["Job", "PersistentVolumeClaim", "Service"], [o["kind"] for o in objs]
    job = next(o for o in objs if o["kind"] == "Job")
    svc = next(o for o in objs if o["kind"] == "Service")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    workers = env["KILN_WORKERS"]["value"].split(",")
    # Every worker at once, one pod per listed worker, each reachable by the name listed.
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == len(workers), spec
    assert svc["spec"]["clusterIP"] == "None" and pod["subdomain"] == svc["metadata"]["name"], (svc, pod)
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), (svc["spec"]["selector"], labels)
    port = svc["spec"]["ports"][0]["port"]
    for i, w in enumerate(workers):
        assert w == f"{job['metadata']['name']}-{i}.{svc['metadata']['name']}:{port}", (i, w)
    assert "job-completion-index" in env["KILN_RANK"]["valueFrom"]["fieldRef"]["fieldPath"], env["KILN_RANK"]
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    # The command is one `kiln train` takes, and the worker list is one kiln parses.
    assert c["args"][0] == "train", c["args"]
    help_text = subprocess.run([KILN, "train", "--help"], capture_output=True, text=True).stdout
    for a in c["args"][1:]:
        flag = a.split("=")[0]
        assert re.search(rf"^\s+{re.escape(flag)}\b", help_text, re.M), f"kiln train has no flag {flag}"
    assert "--strategy=multi_worker" in c["args"]
    run_env = dict(os.environ, KILN_WORKERS=env["KILN_WORKERS"]["value"], KILN_RANK="1")
    # Parsed, then the worker looks for worker 0, which is not there: a clear rendezvous error.
    r = subprocess.run([KILN, "train", "--strategy", "multi_worker", "--max-samples", "10", "--worker-timeout", "1",
                        "--verbose", "0"], env=run_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "worker 1 of 2 (KILN_WORKERS)" in r.stderr and "rendezvous" in r.stderr, r.stderr
    print(f"training: Indexed Job of {len(workers)} workers, headless Service, flags and worker list parse")


def main():
    if not shutil.which("kubectl"):
        print("kubectl not installed: deploy/k8s cannot be rendered on this machine (skipped)")
        sys.exit(77)
    help_text = subprocess.run([KILN, "serve", "--help"], capture_output=True, text=True).stdout
    for overlay in ("cpu", "gpu"):
        objs = render(overlay)
        check_schema(objs, overlay)
        kinds = sorted(o["kind"] for o in objs)
        assert kinds == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim",
                         "PodDisruptionBudget", "Service"], kinds
        dep = next(o for o in objs if o["kind"] == "Deployment")
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]
        gpu = pod.get("runtimeClassName") == "nvidia" and c["resources"]["limits"].get("nvidia.com/gpu") == "1"
        assert gpu == (overlay == "gpu"), (overlay, pod.get("runtimeClassName"), c["resources"])
        assert c["image"] == f"kiln-serving:{'cuda' if overlay == 'gpu' else 'cpu'}", c["image"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert "startupProbe" in c
        assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
        grace = [float(a.split("=")[1]) for a in c["args"] if a.startswith("--shutdown_grace_seconds=")]
        assert grace and pod["terminationGracePeriodSeconds"] > grace[0], (pod["terminationGracePeriodSeconds"], grace)
        for a in c["args"]:
            flag = a.split("=")[0]
            assert re.search(rf"^\s+{re.escape(flag)}\b", help_text, re.M), f"kiln serve has no flag {flag}"
        # The selector labels reach the pods, the Service and the PDB alike.
        labels = dep["spec"]["template"]["metadata"]["labels"]
        for o in objs:
            sel = o["spec"].get("selector") if o["kind"] in ("Service", "PodDisruptionBudget") else None
            if sel is not None:
                sel = sel.get("matchLabels", sel)
                assert all(labels.get(k) == v for k, v in sel.items()), (o["kind"], sel, labels)
        # The model config parses: kiln serve reads it and reports the missing base path.
        cm = next(o for o in objs if o["kind"] == "ConfigMap")
        with tempfile.NamedTemporaryFile("w", suffix=".config", delete=False) as f:
            f.write(cm["data"]["models.config"])
        p = subprocess.Popen([KILN, "serve", "--model_config_file", f.name, "--port", "0", "--rest_api_port", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen = []
        try:
            for line in p.stderr:  # parsed: the server looks for the model's base path
                seen.append(line)
                if "event=base_path_missing" in line and "/models/fashion" in line:
                    break
        finally:
            p.kill()
            p.wait()
            os.unlink(f.name)
        assert any("event=base_path_missing" in s for s in seen), "".join(seen)
    check_training()
    # The check can fail: an unknown field and a wrong type are rejected.
    broken = render("cpu")
    dep = next(o for o in broken if o["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    try:
        check_schema(broken, "broken")
        raise AssertionError("an unknown field passed validation")
    except ValidationError as e:
        print("broken copy rejected:", str(e).splitlines()[0][:120])
    print("k8s manifests ok")


if __name__ == "__main__":
    main()
