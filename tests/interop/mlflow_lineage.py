"""Interop: `kiln train --mlflow_tracking_uri file:DIR` read back by PyPI's MLflow client.

mlflow_lineage.py KILN_CLI
  1. two runs of `kiln train` (mlp, 2 epochs on 2000 Fashion-MNIST samples) into one file store,
     the second with --export and its own experiment name;
  2. MLflow's client (mlflow-skinny, MLFLOW_ALLOW_FILE_STORE=true: the file store is in
     maintenance mode upstream) lists the experiments and runs; each run has its params, its
     per-epoch metrics (loss, accuracy, samples_per_sec ... at steps 0 and 1) and test metrics,
     the kiln tags (version, data fingerprint: equal for equal data) and FINISHED status;
  3. the exported package is the run's artefact `model/`, and the package's metadata names
     the run (`kiln show --all`), so lineage goes both ways;
  4. a tracking URI kiln cannot write (http://) fails with a clear error before training.
Prints "mlflow interop ok".
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

KILN = sys.argv[1]


def train(*extra):
    r = subprocess.run([KILN, "train", "--model", "mlp", "--epochs", "2", "--max-samples", "2000", "--verbose", "0",
                        *extra], capture_output=True, text=True, timeout=600)
    return r


def main():
    work = tempfile.mkdtemp(prefix="kiln-mlflow-")
    try:
        store = os.path.join(work, "mlruns")
        uri = "file:" + store
        r1 = train("--mlflow_tracking_uri", uri)
        assert r1.returncode == 0, r1.stderr
        run1 = re.search(r"MLflow run ([0-9a-f]{32})", r1.stderr).group(1)
        export = os.path.join(work, "export")
        r2 = train("--mlflow_tracking_uri", uri, "--mlflow_experiment", "fashion", "--mlflow_run_name", "mlp-export",
                   "--export", export)
        assert r2.returncode == 0, r2.stderr
        run2 = re.search(r"MLflow run ([0-9a-f]{32})", r2.stderr).group(1)

        client = MlflowClient(tracking_uri=uri)
        names = sorted(e.name for e in client.search_experiments())
        assert names == ["Default", "fashion"], names
        for run_id, exp_name, run_name in ((run1, "Default", "mlp"), (run2, "fashion", "mlp-export")):
            run = client.get_run(run_id)
            assert run.info.status == "FINISHED", run.info
            assert run.info.run_name == run_name, run.info.run_name
            assert client.get_experiment(run.info.experiment_id).name == exp_name
            assert run.info.end_time and run.info.end_time >= run.info.start_time
            p = run.data.params
            assert p["model"] == "mlp" and p["epochs"] == "2" and p["batch_size"] == "128" and p["optimizer"] == "adam", p
            t = run.data.tags
            assert t["kiln.version"] and t["kiln.data_fingerprint"].startswith("sha256:"), t
            assert t["mlflow.runName"] == run_name and t["mlflow.source.type"] == "LOCAL", t
            m = run.data.metrics
            for key in ("loss", "accuracy", "samples_per_sec", "epoch_time", "test_loss", "test_accuracy"):
                assert key in m, (key, m)
            hist = client.get_metric_history(run_id, "loss")
            assert [h.step for h in hist] == [0, 1], [h.step for h in hist]
            assert hist[1].value < hist[0].value, [h.value for h in hist]
            assert 0.5 < m["test_accuracy"] <= 1, m
        fp = [client.get_run(r).data.tags["kiln.data_fingerprint"] for r in (run1, run2)]
        assert fp[0] == fp[1], fp  # the same data, the same fingerprint
        runs = client.search_runs([client.get_experiment_by_name("fashion").experiment_id],
                                  filter_string="metrics.test_accuracy > 0.5")
        assert [r.info.run_id for r in runs] == [run2], runs

        # The package is the run's artefact, and names its run.
        arts = [a.path for a in client.list_artifacts(run2, "model")]
        assert "model/manifest.json" in arts and "model/model.pb" in arts, arts
        local = mlflow.artifacts.download_artifacts(run_id=run2, artifact_path="model", tracking_uri=uri)
        show = subprocess.run([KILN, "show", "--dir", local, "--all"], capture_output=True, text=True, timeout=120)
        assert show.returncode == 0 and f"mlflow_run_id: {run2}" in show.stdout, show.stdout + show.stderr
        print(f"runs {run1[:8]} and {run2[:8]}: params, per-epoch metrics, tags, status, the package artefact")

        bad = train("--mlflow_tracking_uri", "http://127.0.0.1:5000")
        assert bad.returncode == 1 and "Unimplemented" in bad.stderr and "file store" in bad.stderr, bad.stderr
        print("bad uri:", bad.stderr.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("mlflow interop ok")


if __name__ == "__main__":
    main()
