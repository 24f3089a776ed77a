"""Writes tests/fixtures/image/: small PNG and JPEG files made by Pillow, and what
TensorFlow decodes from them and how tf.image.resize resizes them.

usage: build/venv/bin/python scripts/make_image_fixtures.py [--tf-python /tmp/tfvenv/bin/python] [OUT_DIR]
Step 1 (this python, needs Pillow + numpy) writes the images; step 2 reruns this script
with --expected under a python that has tensorflow (default /tmp/tfvenv/bin/python),
which writes the expected arrays as .npy:
  <image>.c<C>.npy     tf.io.decode_png / decode_jpeg(<image>, channels=C), u8 [H, W, C]
  <image>.c3.accurate.npy  decode_jpeg(..., dct_method="INTEGER_ACCURATE")
  resize_<name>.npy    tf.image.resize(..., method="bilinear") (antialias=False), f32
TensorFlow links libpng and libjpeg-turbo as kiln does: decoded pixels match exactly.
"""
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "image")

# image file -> channel counts to decode it with
PNGS = {"rgb.png": [0, 1, 3, 4], "gray.png": [0, 1, 3, 4], "rgba.png": [0, 1, 3, 4],
        "palette_trns.png": [0, 1, 3, 4], "gray16.png": [0, 3], "gray1.png": [0, 3]}
JPEGS = {"rgb.jpg": [0, 1, 3], "gray.jpg": [0, 3], "progressive.jpg": [0, 3], "cmyk.jpg": [0, 3]}
# name -> (image, channels, height, width, as_float)
RESIZES = {"rgb_png_4x11": ("rgb.png", 3, 4, 11, False), "rgb_png_9x3": ("rgb.png", 3, 9, 3, False),
           "rgb_jpg_20x5": ("rgb.jpg", 3, 20, 5, False), "rgba_png_f32_3x10": ("rgba.png", 4, 3, 10, True),
           "gray_png_same": ("gray.png", 1, 5, 4, False)}


def write_images(out):
    from PIL import Image

    rng = np.random.default_rng(20240611)
    os.makedirs(out, exist_ok=True)
    # Smooth gradients plus noise: JPEG has real content, not just flat blocks.
    yy, xx = np.mgrid[0:6, 0:7]
    rgb = np.stack([yy * 40 + 10, xx * 35 + 5, (yy + xx) * 20 + 30], -1) + rng.integers(0, 20, (6, 7, 3))
    Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(os.path.join(out, "rgb.png"))
    Image.fromarray(rng.integers(0, 256, (5, 4), dtype=np.uint8)).save(os.path.join(out, "gray.png"))
    Image.fromarray(rng.integers(0, 256, (6, 7, 4), dtype=np.uint8)).save(os.path.join(out, "rgba.png"))
    pal = Image.new("P", (6, 5))
    pal.putdata([int(v) for v in rng.integers(0, 4, 30)])
    pal.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 250, 250, 10])
    pal.save(os.path.join(out, "palette_trns.png"), transparency=bytes([255, 128, 0, 255]))
    g16 = rng.integers(0, 65536, (4, 5), dtype=np.uint16)
    Image.fromarray(g16).save(os.path.join(out, "gray16.png"))
    Image.fromarray(rng.integers(0, 2, (3, 9), dtype=np.uint8).astype(bool)).save(os.path.join(out, "gray1.png"))

    yy, xx = np.mgrid[0:9, 0:13]
    big = np.stack([yy * 25 + 5, xx * 18 + 10, 200 - yy * 10 - xx * 5], -1) + rng.integers(0, 30, (9, 13, 3))
    big = big.clip(0, 255).astype(np.uint8)
    Image.fromarray(big).save(os.path.join(out, "rgb.jpg"), quality=90, subsampling=2)  # 4:2:0
    Image.fromarray(big[:, :8, 0]).save(os.path.join(out, "gray.jpg"), quality=85)
    yy, xx = np.mgrid[0:10, 0:17]
    prog = np.stack([xx * 14, yy * 25, (xx * yy) % 256], -1).astype(np.uint8)
    Image.fromarray(prog).save(os.path.join(out, "progressive.jpg"), quality=80, progressive=True)
    Image.fromarray(big[:6, :7]).convert("CMYK").save(os.path.join(out, "cmyk.jpg"), quality=95)


def write_expected(out):
    import tensorflow as tf

    def read(name):
        with open(os.path.join(out, name), "rb") as f:
            return f.read()

    for name, chans in PNGS.items():
        for c in chans:
            np.save(os.path.join(out, f"{name}.c{c}.npy"), tf.io.decode_png(read(name), channels=c).numpy())
    for name, chans in JPEGS.items():
        for c in chans:
            np.save(os.path.join(out, f"{name}.c{c}.npy"), tf.io.decode_jpeg(read(name), channels=c).numpy())
    # The accurate IDCT (TF's default is INTEGER_FAST).
    for name in ["rgb.jpg", "progressive.jpg"]:
        np.save(os.path.join(out, f"{name}.c3.accurate.npy"),
                tf.io.decode_jpeg(read(name), channels=3, dct_method="INTEGER_ACCURATE").numpy())
    for key, (name, c, h, w, as_float) in RESIZES.items():
        img = tf.io.decode_image(read(name), channels=c)
        if as_float:
            img = tf.cast(img, tf.float32) / 255.0
        r = tf.image.resize(img, [h, w], method="bilinear", antialias=False)
        np.save(os.path.join(out, f"resize_{key}.npy"), r.numpy().astype(np.float32))


def main(argv):
    tf_python = "/tmp/tfvenv/bin/python"
    if "--tf-python" in argv:
        i = argv.index("--tf-python")
        tf_python = argv[i + 1]
        del argv[i:i + 2]
    if argv and argv[0] == "--expected":
        write_expected(argv[1])
        return
    out = os.path.abspath(argv[0] if argv else DEFAULT_OUT)
    write_images(out)
    subprocess.run([tf_python, os.path.abspath(__file__), "--expected", out], check=True)
    print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1:])
