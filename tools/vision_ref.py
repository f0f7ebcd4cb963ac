#!/usr/bin/env python3
"""Reference data for smelt's image decoding, resampling and image processors (tests/vision).

Writes small test images (PNG, JPEG, WebP in several pixel layouts) and what Pillow and the
Hugging Face image processors make of them:
  images/<name>             the encoded test images
  ref/<name>.rgb            ImageOps.exif_transpose(Image.open(f)).convert("RGB") as raw bytes (h*w*3)
  ref/resize_<k>.rgb        Image.resize((w, h), resample) of a decoded image
  ref/proc_<k>.f32          pixel values of an image processor (little-endian float32)
  manifest.json             what each file is, sizes, and the processors' target-size tables

The processors are computed as transformers' slow (Pillow-based) image processors compute them:
Qwen2VLImageProcessor (smart_resize, bicubic, rescale, normalize, patch flattening),
Gemma3ImageProcessor (fixed size, bilinear), PixtralImageProcessor (longest edge, multiples of the
patch, bicubic) and SmolVLMImageProcessor (longest edge, then multiples of the tile, split into tiles
plus a global image, Lanczos; manifest "idefics3_sizes": h, w, longest_edge, tile, the size after the
longest-edge resize, after the resize to tile multiples, rows, cols). With --transformers the same pixel
values are also computed by transformers' own classes (use_fast=False; the Pillow classes) and compared
(run it where transformers is installed; Idefics3ImageProcessor's differences are only reported).

Needs numpy and Pillow (Debian: apt-get install python3-numpy python3-pil).
Usage: python3 tools/vision_ref.py [--transformers] [OUTDIR]   (default tests/vision/data)
"""
import io
import json
import math
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image, ImageOps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def pattern(h, w, ch, seed):
    """smooth gradients, a checkerboard and noise: every filter tap matters"""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = [(x * 255.0 / max(w - 1, 1)), (y * 255.0 / max(h - 1, 1)), ((x + y) % 7) * 36.0,
            ((x // 3 + y // 3) % 2) * 200.0 + 20]
    out = np.stack([base[c % 4] for c in range(ch)], axis=-1)
    out += rng.normal(0, 18, size=out.shape)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def png_raw(path, arr, bit_depth, color_type, width=None):
    """a PNG written directly (Pillow cannot write 16-bit RGB); arr: rows of packed samples"""
    h, w = arr.shape[0], width or arr.shape[1]
    if bit_depth == 16:
        raw = arr.astype(">u2").tobytes()
        stride = arr[0].size * 2
    else:
        raw = arr.astype(np.uint8).tobytes()
        stride = arr[0].size
    rows = b"".join(b"\x00" + raw[i * stride:(i + 1) * stride] for i in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows, 9)) +
                chunk(b"IEND", b""))


def orientation_exif(o):
    e = Image.Exif()
    e[0x0112] = o
    return e.tobytes()


def load_rgb(path):
    """what transformers' load_image gives: ImageOps.exif_transpose, then convert("RGB")"""
    return ImageOps.exif_transpose(Image.open(path)).convert("RGB")


def make_images(d):
    os.makedirs(d, exist_ok=True)
    imgs = {}
    Image.fromarray(pattern(23, 37, 3, 1)).save(os.path.join(d, "rgb_37x23.png"))
    Image.fromarray(pattern(31, 29, 4, 2), "RGBA").save(os.path.join(d, "rgba_29x31.png"))
    Image.fromarray(pattern(40, 17, 1, 3)[..., 0], "L").save(os.path.join(d, "gray_17x40.png"))
    p = Image.fromarray(pattern(21, 33, 3, 4)).quantize(colors=37)
    p.info["transparency"] = 5
    p.save(os.path.join(d, "pal_33x21.png"), transparency=5)
    png_raw(os.path.join(d, "rgb16_19x13.png"), pattern(13, 19, 3, 5).astype(np.uint16) * 257 + 3, 16, 2)
    png_raw(os.path.join(d, "gray16_15x9.png"), (pattern(9, 15, 1, 6)[..., 0].astype(np.uint16) * 3), 16, 0)
    g2 = pattern(6, 12, 1, 7)[..., 0] >> 6  # 2-bit grey, 4 samples a byte, first in the high bits
    png_raw(os.path.join(d, "gray2_12x6.png"), g2.reshape(6, 3, 4) @ np.array([64, 16, 4, 1]), 2, 0, width=12)
    Image.fromarray(pattern(30, 45, 3, 8)).save(os.path.join(d, "rgb_45x30.jpg"), quality=90)
    Image.fromarray(pattern(35, 21, 1, 9)[..., 0], "L").save(os.path.join(d, "gray_21x35.jpg"), quality=85)
    Image.fromarray(pattern(17, 23, 4, 10), "CMYK").save(os.path.join(d, "cmyk_23x17.jpg"), quality=92)
    Image.fromarray(pattern(19, 27, 3, 11)).save(os.path.join(d, "rgb_27x19.webp"), quality=80)
    Image.fromarray(pattern(14, 22, 4, 12), "RGBA").save(os.path.join(d, "rgba_22x14.webp"), lossless=True)
    Image.fromarray(pattern(45, 61, 3, 13)).save(os.path.join(d, "rgb_61x45.png"))
    # EXIF orientation (load_image turns these upright): every value in a JPEG, one PNG (eXIf chunk),
    # one WebP (EXIF chunk)
    for o in range(2, 9):
        Image.fromarray(pattern(7, 11, 3, 20 + o)).save(os.path.join(d, "orient%d_11x7.jpg" % o), quality=95,
                                                        exif=orientation_exif(o))
    Image.fromarray(pattern(9, 15, 3, 30)).save(os.path.join(d, "orient6_15x9.png"), exif=orientation_exif(6))
    Image.fromarray(pattern(10, 13, 3, 31)).save(os.path.join(d, "orient8_13x10.webp"), lossless=True,
                                                 exif=orientation_exif(8))
    for n in sorted(os.listdir(d)):
        imgs[n] = os.path.join(d, n)
    return imgs


def rescale_normalize(arr, factor, mean, std):
    """transformers' rescale (float64 product rounded to float32) and normalize (float32)"""
    x = (arr.astype(np.float64) * factor).astype(np.float32)
    return (x - np.array(mean, np.float32)) / np.array(std, np.float32)


def smart_resize(height, width, factor, min_pixels, max_pixels):
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def pixtral_size(height, width, longest, patch):
    ratio = max(height / longest, width / longest)
    if ratio > 1:
        height = int(math.floor(height / ratio))
        width = int(math.floor(width / ratio))
    return ((height - 1) // patch + 1) * patch, ((width - 1) // patch + 1) * patch


def qwen_pixels(img, patch, merge, temporal, min_px, max_px, mean, std):
    h, w = smart_resize(img.height, img.width, patch * merge, min_px, max_px)
    arr = np.array(img.resize((w, h), resample=Image.BICUBIC))
    x = rescale_normalize(arr, 1 / 255, mean, std).transpose(2, 0, 1)
    p = np.repeat(x[None], temporal, axis=0)  # (T, C, H, W)
    gh, gw = h // patch, w // patch
    p = p.reshape(1, temporal, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    p = p.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return p.reshape(gh * gw, 3 * temporal * patch * patch), (h, w)


def fixed_pixels(img, h, w):
    arr = np.array(img.resize((w, h), resample=Image.BILINEAR))
    return rescale_normalize(arr, 1 / 255, [0.5] * 3, [0.5] * 3).transpose(2, 0, 1), (h, w)


def pan_scan_geometry(height, width, min_crop, max_crops, min_ratio):
    """Gemma3ImageProcessor.pan_and_scan's crop grid: (crop_w, crop_h, n_w, n_h), or None"""
    if width >= height:
        if width / height < min_ratio:
            return None
        nw = int(math.floor(width / height + 0.5))
        nw = min(int(math.floor(width / min_crop)), nw)
        nw = min(max_crops, max(2, nw))
        nh = 1
    else:
        if height / width < min_ratio:
            return None
        nh = int(math.floor(height / width + 0.5))
        nh = min(int(math.floor(height / min_crop)), nh)
        nh = min(max_crops, max(2, nh))
        nw = 1
    cw, ch = int(math.ceil(width / nw)), int(math.ceil(height / nh))
    if min(cw, ch) < min_crop:
        return None
    return cw, ch, nw, nh


def pan_scan_pixels(img, h, w, min_crop, max_crops, min_ratio):
    """the whole image, then its crops (numpy slices of the decoded image), each as fixed_pixels"""
    arr = np.array(img)
    g = pan_scan_geometry(arr.shape[0], arr.shape[1], min_crop, max_crops, min_ratio)
    parts = [arr]
    if g:
        cw, ch, nw, nh = g
        parts += [arr[y * ch:y * ch + ch, x * cw:x * cw + cw] for y in range(nh) for x in range(nw)]
    out = [fixed_pixels(Image.fromarray(p), h, w)[0] for p in parts]
    return np.stack(out), (h, w), len(parts) - 1


def pixtral_pixels(img, longest, patch):
    h, w = pixtral_size(img.height, img.width, longest, patch)
    arr = np.array(img.resize((w, h), resample=Image.BICUBIC))
    return rescale_normalize(arr, 1 / 255, CLIP_MEAN, CLIP_STD).transpose(2, 0, 1), (h, w)


IDEFICS3_MAX_IMAGE_SIZE = 4096  # transformers' MAX_IMAGE_SIZE of the SmolVLM image processor


def idefics3_first_size(height, width, longest_edge):
    """SmolVLMImageProcessor.resize with {"longest_edge": L}: _resize_output_size_rescale_to_max_len (the
    longest side to L, the other int(...) made even by +1, at least 1), then
    _resize_output_size_scale_below_upper_bound (4096)"""
    aspect_ratio = width / height
    if width >= height:
        width = longest_edge
        height = int(width / aspect_ratio)
        if height % 2 != 0:
            height += 1
    else:
        height = longest_edge
        width = int(height * aspect_ratio)
        if width % 2 != 0:
            width += 1
    height, width = max(height, 1), max(width, 1)
    m = IDEFICS3_MAX_IMAGE_SIZE
    aspect_ratio = width / height
    if width >= height and width > m:
        width = m
        height = int(width / aspect_ratio)
    elif height > width and height > m:
        height = m
        width = int(height * aspect_ratio)
    return max(height, 1), max(width, 1)


def idefics3_encoder_size(height, width, max_size):
    """resize_for_vision_encoder: both sides to multiples of max_size (the long side first, the other from
    the aspect ratio of the resized image, int(...), then rounded up)"""
    aspect_ratio = width / height
    if width >= height:
        width = math.ceil(width / max_size) * max_size
        height = int(width / aspect_ratio)
        height = math.ceil(height / max_size) * max_size
    else:
        height = math.ceil(height / max_size) * max_size
        width = int(height * aspect_ratio)
        width = math.ceil(width / max_size) * max_size
    return height, width


def idefics3_grid(h2, w2, max_size):
    """split_image's rows, cols of a (h2, w2) image (0, 0: no split, a single frame)"""
    if h2 > max_size or w2 > max_size:
        return (h2 - max_size) // max_size + 1, (w2 - max_size) // max_size + 1
    return 0, 0


def idefics3_frames(img, longest_edge, max_size, splitting, mean, std, resample=Image.LANCZOS):
    """SmolVLMImageProcessor.preprocess (slow, Pillow) of one RGB image: frames [F, 3, S, S] float32 (tiles
    row-major, then the global image; or one frame), rows, cols, (h2, w2): the size after
    resize_for_vision_encoder (S, S without splitting). Every resize is Image.resize of the uint8 image
    (to its own size: a copy)."""
    S = max_size
    h1, w1 = idefics3_first_size(img.height, img.width, longest_edge)
    im = img.resize((w1, h1), resample=resample)
    if splitting:
        h2, w2 = idefics3_encoder_size(h1, w1, S)
        im = im.resize((w2, h2), resample=resample)
        rows, cols = idefics3_grid(h2, w2, S)
        arr = np.array(im)
        if rows or cols:
            parts = [arr[r * S:(r + 1) * S, c * S:(c + 1) * S] for r in range(rows) for c in range(cols)]
            parts.append(np.array(im.resize((S, S), resample=resample)))
        else:  # both sides multiples of S and at most S: one S x S frame
            assert arr.shape[:2] == (S, S), arr.shape
            parts = [arr]
    else:
        h2, w2 = S, S
        rows = cols = 0
        parts = [np.array(im.resize((S, S), resample=resample))]
    frames = np.stack([rescale_normalize(p, 1 / 255, mean, std).transpose(2, 0, 1) for p in parts])
    return frames, rows, cols, (h2, w2)


def slow_image_processor(name):
    """transformers' Pillow image processor class: <name>Pil where the library has one (the image processors
    with backends: <name> is then the torchvision one), else <name> (5.0: the slow class)"""
    import transformers
    cls = getattr(transformers, name + "Pil", None)
    return cls if cls is not None else getattr(transformers, name)


def idefics3_transformers(name, c, img):
    """pixel values [F, 3, S, S], rows, cols of transformers' <name> (SmolVLMImageProcessor or
    Idefics3ImageProcessor, Pillow) for an idefics3 case"""
    cls = slow_image_processor(name)
    p = cls(size={"longest_edge": c["longest_edge"]}, max_image_size={"longest_edge": c["max_size"]},
            do_image_splitting=c["splitting"], image_mean=c["mean"], image_std=c["std"])
    r = p(images=[img], return_tensors="np", return_row_col_info=True)
    pv = np.asarray(r["pixel_values"], dtype=np.float32)
    if pv.ndim == 5:  # [batch 1, frames, 3, S, S]
        pv = pv[0]
    rows = int(np.asarray(r["rows"]).ravel()[0])
    cols = int(np.asarray(r["cols"]).ravel()[0])
    return pv, rows, cols, cls.__name__


def idefics3_compare(c, arr, img):
    """SmolVLMImageProcessor must give the reference (values within 1e-6, same rows and cols);
    Idefics3ImageProcessor is compared and its differences reported, never fatal"""
    got, rows, cols, cname = idefics3_transformers("SmolVLMImageProcessor", c, img)
    if got.shape != arr.shape:
        sys.exit("transformers' %s gives %s for %s, the reference %s" % (cname, got.shape, c["image"], arr.shape))
    err = float(np.max(np.abs(got - arr)))
    print("transformers %-8s %-16s max |diff| %.3g, rows %d cols %d (%s)" % (c["kind"], c["image"], err, rows, cols,
                                                                             cname))
    if err > 1e-6 or (rows, cols) != (c["rows"], c["cols"]):
        sys.exit("transformers' %s differs from the reference (%s: rows %d cols %d, the reference %d %d)" % (
            cname, c["image"], rows, cols, c["rows"], c["cols"]))
    try:
        got, rows, cols, cname = idefics3_transformers("Idefics3ImageProcessor", c, img)
    except Exception as e:  # e.g. old versions: longest_edge above 1820 raises
        print("  NOTE %s on %s (longest_edge %d, max %d, splitting %s) raised %s: %s" % (
            "Idefics3ImageProcessor", c["image"], c["longest_edge"], c["max_size"], c["splitting"],
            type(e).__name__, str(e)[:200]))
        return
    how = []
    if (rows, cols) != (c["rows"], c["cols"]):
        how.append("rows/cols %d x %d, SmolVLM %d x %d" % (rows, cols, c["rows"], c["cols"]))
    if got.shape != arr.shape:
        how.append("pixel values %s, SmolVLM %s" % (got.shape, arr.shape))
    else:
        e2 = float(np.max(np.abs(got - arr)))
        if e2 > 1e-6:
            how.append("max |diff| %.3g" % e2)
    if how:
        print("  NOTE %s differs on %s (longest_edge %d, max %d, splitting %s): %s" % (
            cname, c["image"], c["longest_edge"], c["max_size"], c["splitting"], "; ".join(how)))
    else:
        print("  %s: the same" % cname)


def with_transformers(cases, imgs):
    """the same pixel values from transformers' own (slow, Pillow) image processors"""
    Gemma3ImageProcessor = slow_image_processor("Gemma3ImageProcessor")
    PixtralImageProcessor = slow_image_processor("PixtralImageProcessor")
    Qwen2VLImageProcessor = slow_image_processor("Qwen2VLImageProcessor")
    for c, arr in cases:
        img = load_rgb(imgs[c["image"]])
        if c["kind"] == "idefics3":
            idefics3_compare(c, arr, img)
            continue
        if c["kind"] == "qwen":
            p = Qwen2VLImageProcessor(patch_size=c["patch"], merge_size=c["merge"], temporal_patch_size=c["temporal"],
                                      min_pixels=c["min_pixels"], max_pixels=c["max_pixels"],
                                      image_mean=c["mean"], image_std=c["std"])
            got = p(images=[img], return_tensors="np")["pixel_values"]
        elif c["kind"] == "fixed" and c.get("pan_and_scan"):
            p = Gemma3ImageProcessor(size={"height": c["height"], "width": c["width"]}, do_pan_and_scan=True,
                                     pan_and_scan_min_crop_size=c["pas_min_crop"],
                                     pan_and_scan_max_num_crops=c["pas_max_crops"],
                                     pan_and_scan_min_ratio_to_activate=c["pas_min_ratio"])
            r = p(images=[img], return_tensors="np")
            got = np.asarray(r["pixel_values"])
            if list(r["num_crops"]) != [c["n_crops"]]:
                sys.exit("transformers' pan and scan made %s crops, the reference %d" % (r["num_crops"], c["n_crops"]))
        elif c["kind"] == "fixed":
            p = Gemma3ImageProcessor(size={"height": c["height"], "width": c["width"]})
            got = p(images=[img], return_tensors="np")["pixel_values"][0]
        else:
            p = PixtralImageProcessor(size={"longest_edge": c["longest_edge"]},
                                      patch_size={"height": c["patch"], "width": c["patch"]})
            got = np.asarray(p(images=[img], return_tensors="np")["pixel_values"][0])
        err = float(np.max(np.abs(got.reshape(arr.shape) - arr)))
        print("transformers %-8s %-16s max |diff| %.3g" % (c["kind"], c["image"], err))
        if err > 1e-6:
            sys.exit("transformers' %s processor differs from the reference" % c["kind"])


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else os.path.join(ROOT, "tests", "vision", "data")
    imgs = make_images(os.path.join(out, "images"))
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    man = {"decode": [], "resize": [], "proc": [], "qwen_sizes": [], "pixtral_sizes": [], "pan_scan_sizes": []}
    for n, path in imgs.items():
        rgb = np.array(load_rgb(path))
        rgb.tofile(os.path.join(out, "ref", n + ".rgb"))
        man["decode"].append({"image": n, "w": rgb.shape[1], "h": rgb.shape[0]})
    filters = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
    resizes = [("rgb_37x23.png", 50, 31, "bicubic"), ("rgb_37x23.png", 20, 11, "bicubic"),
               ("rgb_37x23.png", 37, 50, "bilinear"), ("rgb_37x23.png", 64, 64, "lanczos"),
               ("rgb_37x23.png", 13, 7, "box"), ("rgb_37x23.png", 29, 17, "hamming"),
               ("rgb_61x45.png", 61, 12, "bicubic"), ("rgb_61x45.png", 9, 45, "bilinear"),
               ("rgb_45x30.jpg", 112, 84, "bicubic"), ("rgb_61x45.png", 3, 2, "bicubic")]
    for i, (n, w, h, f) in enumerate(resizes):
        r = np.array(load_rgb(imgs[n]).resize((w, h), resample=filters[f]))
        r.tofile(os.path.join(out, "ref", "resize_%d.rgb" % i))
        man["resize"].append({"image": n, "w": w, "h": h, "filter": filters[f], "file": "resize_%d.rgb" % i})
    cases = []
    for i, c in enumerate([
            dict(kind="qwen", image="rgb_45x30.jpg", patch=14, merge=2, temporal=2, min_pixels=3136,
                 max_pixels=1003520, mean=CLIP_MEAN, std=CLIP_STD),
            dict(kind="qwen", image="rgb_61x45.png", patch=8, merge=2, temporal=2, min_pixels=256,
                 max_pixels=1200, mean=[0.5] * 3, std=[0.5] * 3),
            dict(kind="fixed", image="rgb_37x23.png", height=24, width=24),
            dict(kind="fixed", image="pal_33x21.png", height=16, width=40),
            dict(kind="pixtral", image="rgb_45x30.jpg", longest_edge=32, patch=8),
            dict(kind="pixtral", image="gray_17x40.png", longest_edge=64, patch=6),
            dict(kind="fixed", image="rgb_61x45.png", height=24, width=24, pan_and_scan=True, pas_min_crop=16,
                 pas_max_crops=4, pas_min_ratio=1.2),
            dict(kind="fixed", image="gray_17x40.png", height=16, width=12, pan_and_scan=True, pas_min_crop=8,
                 pas_max_crops=4, pas_min_ratio=1.2),
            dict(kind="fixed", image="rgb_37x23.png", height=16, width=16, pan_and_scan=True, pas_min_crop=4,
                 pas_max_crops=3, pas_min_ratio=1.2),
            dict(kind="fixed", image="rgb_45x30.jpg", height=16, width=16, pan_and_scan=True, pas_min_crop=16,
                 pas_max_crops=4, pas_min_ratio=1.6),
            # SmolVLM / Idefics3: 2 x 3 tiles + global; a tall image (4 x 2 + global); an image smaller than a
            # tile (one frame); no splitting (squared); a resize to multiples of the tile that changes the
            # short side's tile count (3 x 3 + global, where get_number_of_image_patches says 2 x 3)
            dict(kind="idefics3", image="rgb_45x30.jpg", longest_edge=96, max_size=32, splitting=True,
                 mean=[0.5] * 3, std=[0.5] * 3),
            dict(kind="idefics3", image="gray_17x40.png", longest_edge=64, max_size=16, splitting=True,
                 mean=CLIP_MEAN, std=CLIP_STD),
            dict(kind="idefics3", image="rgb_61x45.png", longest_edge=40, max_size=48, splitting=True,
                 mean=[0.5] * 3, std=[0.5] * 3),
            dict(kind="idefics3", image="rgb_37x23.png", longest_edge=64, max_size=24, splitting=False,
                 mean=[0.5] * 3, std=[0.5] * 3),
            dict(kind="idefics3", image="rgb_61x45.png", longest_edge=80, max_size=32, splitting=True,
                 mean=[0.5] * 3, std=[0.5] * 3)]):
        img = load_rgb(imgs[c["image"]])
        if c["kind"] == "idefics3":
            arr, rows, cols, _ = idefics3_frames(img, c["longest_edge"], c["max_size"], c["splitting"], c["mean"],
                                                 c["std"])
            c.update(file="proc_%d.f32" % i, shape=list(arr.shape), rows=rows, cols=cols, out_h=c["max_size"],
                     out_w=c["max_size"], n_frames=arr.shape[0])
            arr.astype("<f4").tofile(os.path.join(out, "ref", c["file"]))
            man["proc"].append(c)
            cases.append((c, arr))
            continue
        if c["kind"] == "fixed" and c.get("pan_and_scan"):
            arr, (h, w), c["n_crops"] = pan_scan_pixels(img, c["height"], c["width"], c["pas_min_crop"],
                                                        c["pas_max_crops"], c["pas_min_ratio"])
        elif c["kind"] == "qwen":
            arr, (h, w) = qwen_pixels(img, c["patch"], c["merge"], c["temporal"], c["min_pixels"], c["max_pixels"],
                                      c["mean"], c["std"])
        elif c["kind"] == "fixed":
            arr, (h, w) = fixed_pixels(img, c["height"], c["width"])
        else:
            arr, (h, w) = pixtral_pixels(img, c["longest_edge"], c["patch"])
        c.update(file="proc_%d.f32" % i, out_h=h, out_w=w, shape=list(arr.shape))
        arr.astype("<f4").tofile(os.path.join(out, "ref", c["file"]))
        man["proc"].append(c)
        cases.append((c, arr))
    # target sizes: rounding half to even, the min/max branches, thin images
    for h, w, f, lo, hi in [(30, 45, 28, 3136, 1003520), (42, 42, 28, 3136, 1003520), (70, 98, 28, 3136, 1003520),
                            (126, 14, 28, 3136, 1003520), (1000, 1000, 28, 3136, 1003520),
                            (4032, 3024, 28, 3136, 12845056), (3024, 4032, 28, 3136, 1003520),
                            (10, 10, 28, 3136, 1003520), (1, 150, 28, 3136, 1003520), (500, 3, 32, 65536, 16777216),
                            (768, 1024, 28, 3136, 12845056), (224, 224, 32, 65536, 16777216),
                            (1080, 1920, 32, 65536, 16777216), (14, 14, 28, 56 * 56, 28 * 28 * 1280)]:
        oh, ow = smart_resize(h, w, f, lo, hi)
        man["qwen_sizes"].append([h, w, f, lo, hi, oh, ow])
    for h, w, le, p in [(30, 45, 32, 8), (1080, 1920, 1024, 16), (1920, 1080, 1540, 28), (100, 100, 1024, 16),
                        (1, 5000, 1024, 16), (1540, 1541, 1540, 28), (17, 16, 1024, 16)]:
        oh, ow = pixtral_size(h, w, le, p)
        man["pixtral_sizes"].append([h, w, le, p, oh, ow])
    # pan and scan's crop grids (height, width, min crop, max crops, min ratio -> crop w, h, count w, h; 0s: none)
    for h, w, mc, mx, mr in [(896, 896, 256, 4, 1.2), (600, 1500, 256, 4, 1.2), (300, 2000, 256, 4, 1.2),
                             (200, 1000, 256, 4, 1.2), (1000, 1100, 256, 4, 1.2), (1500, 600, 256, 4, 1.2),
                             (1000, 1250, 256, 4, 1.2), (768, 1024, 256, 4, 1.2), (1080, 1920, 256, 4, 1.2),
                             (3000, 700, 256, 4, 1.2), (500, 2000, 256, 2, 1.2), (400, 600, 100, 4, 1.5),
                             (512, 1281, 256, 4, 1.2)]:
        g = pan_scan_geometry(h, w, mc, mx, mr) or (0, 0, 0, 0)
        man["pan_scan_sizes"].append([h, w, mc, mx, mr] + list(g))
    # SmolVLM / Idefics3 sizes: (h, w, longest_edge, max_size) -> after the longest-edge resize (h1, w1), after
    # resize_for_vision_encoder (h2, w2), the split's rows and cols (0, 0: one frame)
    man["idefics3_sizes"] = []
    for h, w, le, ms in [(30, 45, 96, 32), (768, 1024, 2048, 512), (1024, 768, 2048, 512), (1080, 1920, 1536, 384),
                         (1, 5000, 2048, 512), (500, 500, 1456, 364), (17, 40, 64, 16), (40, 17, 64, 16),
                         (4000, 3000, 2048, 512), (10, 10, 2048, 512), (333, 1000, 1820, 364), (45, 61, 80, 32),
                         (45, 61, 40, 48), (300, 500, 1456, 364), (1000, 3000, 5000, 512), (5000, 1, 2048, 512),
                         (2, 3, 1536, 384)]:
        h1, w1 = idefics3_first_size(h, w, le)
        h2, w2 = idefics3_encoder_size(h1, w1, ms)
        man["idefics3_sizes"].append([h, w, le, ms, h1, w1, h2, w2] + list(idefics3_grid(h2, w2, ms)))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
        f.write("\n")
    if "--transformers" in sys.argv:
        with_transformers(cases, imgs)
    print("wrote", out)


if __name__ == "__main__":
    main()
