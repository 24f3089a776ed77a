"""Reads the event file written by write_events_main.cc with stock TensorBoard.

usage: read_events.py WRITER LOGDIR
Runs WRITER LOGDIR, then loads LOGDIR with TensorBoard's EventAccumulator and checks
every tag, step and value, and that the first event carries file_version brain.Event:2.
"""
import glob
import os
import subprocess
import sys

import numpy as np
import tensorboard
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import event_file_loader

# Expected scalars (same as write_events_main.cc), stored by TensorBoard as float32.
EXPECTED = {
    "train/loss": [(s, 1.0 / (s + 1)) for s in range(5)],
    "train/accuracy": [(s, 0.5 + 0.1 * s) for s in range(5)],
    "val/loss": [(4, 0.0), (1000000, -3.25)],
}


def main():
    writer, logdir = sys.argv[1], sys.argv[2]
    subprocess.run([writer, logdir], check=True)
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert len(files) == 1, f"expected one event file in {logdir}, found {files}"
    path = files[0]
    assert path.endswith(".kiln"), path

    # The raw first record, through TensorBoard's own TFRecord reader and Event proto.
    first = next(iter(event_file_loader.EventFileLoader(path).Load()))
    assert first.file_version == "brain.Event:2", f"first event: {first}"

    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    assert tags == sorted(EXPECTED), f"scalar tags {tags} != {sorted(EXPECTED)}"
    assert acc.file_version == 2.0, f"EventAccumulator parsed file version {acc.file_version}"
    for tag, want in EXPECTED.items():
        got = acc.Scalars(tag)
        steps = [e.step for e in got]
        assert steps == [s for s, _ in want], f"{tag}: steps {steps}"
        values = np.array([e.value for e in got], dtype=np.float64)
        ref = np.array([v for _, v in want], dtype=np.float32).astype(np.float64)
        assert np.array_equal(values, ref), f"{tag}: values {values} != {ref}"
        assert all(e.wall_time > 1.5e9 for e in got), f"{tag}: wall times {[e.wall_time for e in got]}"
    n = sum(len(v) for v in EXPECTED.values())
    print(f"tensorboard {tensorboard.__version__}: {path}: version ok, {len(tags)} tags, {n} scalars ok")


if __name__ == "__main__":
    main()
