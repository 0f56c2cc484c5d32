#!/usr/bin/python3
# Writes test/fixtures/vision/qwen2-vl-golden.json: what Pillow and the Qwen2-VL image processor's
# published algorithm (transformers' Qwen2VLImageProcessor: smart_resize, PIL bicubic resize,
# rescale, normalize in float32, temporal tiling and the patch reshape) make of a few small
# deterministic images, for test/vision-preprocess.test.ts. Run once by hand with Debian's
# python3-pil and python3-numpy (Pillow 9.4): /usr/bin/python3 scripts/vision-golden.py
# With --gemma3 it writes only test/fixtures/vision/gemma3-golden.json instead: Pillow's BILINEAR
# resize and Gemma3ImageProcessor's rescale + normalize (mean and std 0.5), for
# test/vision-gemma3-preprocess.test.ts.
import base64
import hashlib
import io
import json
import math
import os
import sys

import numpy as np
from PIL import Image


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def pattern(w, h, seed):
    # Smooth gradients plus hash noise, so every filter tap matters.
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(1, w - 1) + seed * 17) % 256
    g = (y * 255 // max(1, h - 1) + seed * 29) % 256
    b = ((x * 131 + y * 71 + seed * 13) * 2654435761 >> 7) % 256
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def smart_resize(height, width, factor, min_pixels, max_pixels):
    # As transformers' qwen2_vl image processing writes it (Python's round: half to even).
    if max(height, width) / min(height, width) > 200:
        raise ValueError("aspect ratio over 200")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


def qwen2_vl_patches(rgb, min_pixels, max_pixels, patch=14, merge=2, temporal=2):
    h, w = rgb.shape[:2]
    rh, rw = smart_resize(h, w, patch * merge, min_pixels, max_pixels)
    img = np.array(Image.fromarray(rgb, "RGB").resize((rw, rh), resample=Image.BICUBIC))
    img = (img.astype(np.float64) * (1 / 255)).astype(np.float32)
    img = (img - np.array(MEAN, dtype=np.float32)) / np.array(STD, dtype=np.float32)
    img = img.transpose(2, 0, 1)  # channels first
    patches = np.tile(img[None], (temporal, 1, 1, 1))
    c = patches.shape[1]
    gt, gh, gw = patches.shape[0] // temporal, rh // patch, rw // patch
    patches = patches.reshape(gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(gt * gh * gw, c * temporal * patch * patch).astype(np.float32)
    return (rh, rw), [gt, gh, gw], flat


def gemma3_golden():
    # Gemma3ImageProcessor: resize to size (BILINEAR, aspect not kept), rescale 1/255 (float64,
    # then float32), normalize (x - 0.5) / 0.5 in float32, channels first. The 896 x 896 outputs
    # are written as SHA-256 digests (2.4 MB each); the small ones in full.
    mean = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    std = np.array([0.5, 0.5, 0.5], dtype=np.float32)

    def pixels(res):
        img = (res.astype(np.float64) * (1 / 255)).astype(np.float32)
        return ((img - mean) / std).transpose(2, 0, 1).astype(np.float32)

    sha = lambda a: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
    g = {"pillow": Image.__version__, "large": [], "small": []}
    # Inputs are pattern(w, h, seed): the test builds them itself.
    for (w, h, size, seed) in [(640, 480, 896, 1), (1200, 1000, 896, 2), (300, 1500, 896, 3), (896, 500, 896, 4), (896, 896, 896, 5)]:
        rgb = pattern(w, h, seed)
        res = np.array(Image.fromarray(rgb, "RGB").resize((size, size), resample=Image.BILINEAR))
        g["large"].append({"width": w, "height": h, "seed": seed, "size": size, "inputSha256": sha(rgb),
                           "resizedSha256": sha(res), "pixelValuesSha256": sha(pixels(res))})
    for (w, h, ow, oh, seed) in [(90, 60, 56, 56, 1), (56, 56, 56, 56, 2), (300, 120, 56, 56, 3), (20, 30, 56, 56, 6),
                                (61, 37, 112, 84, 7), (150, 100, 42, 28, 8), (97, 13, 12, 40, 9)]:
        rgb = pattern(w, h, seed)
        res = np.array(Image.fromarray(rgb, "RGB").resize((ow, oh), resample=Image.BILINEAR))
        g["small"].append({"width": w, "height": h, "seed": seed, "outWidth": ow, "outHeight": oh, "inputSha256": sha(rgb),
                           "resized": b64(res), "pixelValues": b64(pixels(res))})
    v = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
    g["normalized"] = b64((v - np.float32(0.5)) / np.float32(0.5))
    path = os.path.join(os.path.dirname(__file__), "..", "test", "fixtures", "vision", "gemma3-golden.json")
    with open(path, "w") as f:
        json.dump(g, f)
        f.write("\n")
    print("wrote", path, os.path.getsize(path), "bytes")


if "--gemma3" in sys.argv[1:]:
    gemma3_golden()
    sys.exit(0)

out = {"pillow": Image.__version__, "resizes": [], "smart_resize": [], "qwen2_vl": []}
for (w, h, ow, oh, seed) in [(61, 37, 56, 28, 1), (61, 37, 112, 84, 2), (30, 30, 28, 28, 3), (150, 100, 42, 28, 4),
                            (97, 13, 12, 40, 5), (17, 200, 17, 31, 6)]:
    rgb = pattern(w, h, seed)
    res = np.array(Image.fromarray(rgb, "RGB").resize((ow, oh), resample=Image.BICUBIC))
    out["resizes"].append({"width": w, "height": h, "outWidth": ow, "outHeight": oh, "inputSha256": sha(rgb), "output": b64(res)})

for (h, w, lo, hi) in [(37, 61, 3136, 12845056), (1080, 1920, 3136, 12845056), (1080, 1920, 3136, 1003520),
                       (10, 10, 3136, 12845056), (14, 2000, 3136, 12845056), (42, 42, 3136, 12845056),
                       (70, 42, 3136, 12845056), (4000, 3000, 256 * 28 * 28, 1280 * 28 * 28), (99, 141, 3136, 3136 * 4)]:
    rh, rw = smart_resize(h, w, 28, lo, hi)
    out["smart_resize"].append({"height": h, "width": w, "minPixels": lo, "maxPixels": hi, "resized": [rh, rw]})

for (w, h, lo, hi, seed) in [(45, 30, 3136, 12845056, 7), (50, 120, 3136, 3136 * 2, 9)]:
    rgb = pattern(w, h, seed)
    (rh, rw), grid, flat = qwen2_vl_patches(rgb, lo, hi)
    # The first six patch rows (a whole 2x2 merge group and more) and the last one, to keep the
    # file small; every value of a row comes from the resized image through the table below.
    rows = list(range(6)) + [flat.shape[0] - 1]
    out["qwen2_vl"].append({"width": w, "height": h, "minPixels": lo, "maxPixels": hi, "input": b64(rgb),
                            "resized": [rh, rw], "grid": grid, "patchDim": int(flat.shape[1]), "rows": rows,
                            "pixelValues": b64(flat[rows])})
# What rescale + normalize make of each 8-bit value, per channel (float32).
v = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
out["normalized"] = [b64((v - np.float32(MEAN[c])) / np.float32(STD[c])) for c in range(3)]

# Decoding: Pillow's RGB of a JPEG it encodes (4:2:0 and 4:4:4), and transformers' convert_to_rgb
# of an RGBA PNG (alpha composited over white).
out["decodes"] = []
for (name, w, h, seed, fmt, opts) in [("jpeg-420", 97, 61, 10, "JPEG", {"quality": 85}),
                                     ("jpeg-444", 64, 48, 11, "JPEG", {"quality": 92, "subsampling": 0}),
                                     ("png-rgba", 40, 30, 12, "PNG", {})]:
    rgb = pattern(w, h, seed)
    img = Image.fromarray(rgb, "RGB")
    if name == "png-rgba":
        alpha = ((np.arange(w * h).reshape(h, w) * 37) % 256).astype(np.uint8)
        img = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    buf = io.BytesIO()
    img.save(buf, format=fmt, **opts)
    decoded = Image.open(io.BytesIO(buf.getvalue()))
    if decoded.mode == "RGBA":
        white = Image.new("RGBA", decoded.size, (255, 255, 255))
        decoded = Image.alpha_composite(white, decoded)
    out["decodes"].append({"name": name, "mediaType": "image/" + fmt.lower(), "file": base64.b64encode(buf.getvalue()).decode(),
                           "width": w, "height": h, "rgb": b64(np.array(decoded.convert("RGB")))})

path = os.path.join(os.path.dirname(__file__), "..", "test", "fixtures", "vision", "qwen2-vl-golden.json")
with open(path, "w") as f:
    json.dump(out, f)
    f.write("\n")
print("wrote", path, os.path.getsize(path), "bytes")
