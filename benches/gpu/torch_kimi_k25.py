"""transformers' side of issue [12]'s vision measurement, on a checkpoint from kimi_k25_shape.py.

1. Encoder throughput: the vision tower + projector (`get_image_features`) on the image's preprocessed pixels
   (`--images-per-call` copies in one call), `--iters` calls after `--warmup`; each call includes the pixels'
   copy to the device, as dayone's `vision-bench` uploads them. images/s = images / total time; TFLOP/s =
   encoder_flops() per image x images / time.
2. TTFT of one image + `--text-tokens` text tokens: the prompt `<|media_pad|>` + that many words (each one token of
   the stub tokenizer, so the prompt is image tokens + N), timed from the decoded RGB image and text through the
   processor (tokenise, resize/pad/normalise, expand the placeholder) and the forward pass to the first token's
   argmax; median over `--ttft-repeats` after one warm-up. Same prompt shape as `dayone bench --image FILE
   --prompt-len N`.
Prints one JSON object per measurement (`--json`) or a table. transformers' Kimi-K2.5 processors need torchvision;
without it the script preprocesses with PIL + numpy by the same rule (`FallbackProcessor`) and says so (`processor`).

usage: python3 benches/gpu/torch_kimi_k25.py CKPT IMAGE [--iters 20] [--text-tokens 100] [--attn sdpa]
"""

import argparse
import json
import math
import statistics
import time

import numpy as np
import torch
from PIL import Image
from transformers import AutoTokenizer, Kimi_K25ForConditionalGeneration, Kimi_K25Processor

PAD = "<|media_pad|>"


class FallbackProcessor:
    """Kimi-K2.5's image preprocessing without torchvision (vision.md §1.4): shrink only, to at most 16384 patches
    and 512 patches a side (PIL bicubic, as the original remote code; transformers' torchvision resize differs by
    <= 2 LSB), zero-pad bottom/right to multiples of 28, (x/255 - 0.5)/0.5, patches in raster order, (c, py, px)
    each; the prompt's `<|media_pad|>` expanded to (h/2)(w/2) copies before tokenising."""

    patch, merge = 14, 2

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def pixels(self, images):
        pv, grids = [], []
        for im in images:
            W, H = im.size
            p = self.patch
            s = min(1.0, math.sqrt(16384 / (max(1, W // p) * max(1, H // p))), 512 * p / W, 512 * p / H)
            w, h = max(1, int(W * s)), max(1, int(H * s))
            if (w, h) != (W, H):
                im = im.resize((w, h), Image.BICUBIC)
            cell = p * self.merge
            ph, pw = -(-h // cell) * cell, -(-w // cell) * cell
            canvas = np.zeros((ph, pw, 3), np.uint8)
            canvas[:h, :w] = np.asarray(im)
            x = (torch.from_numpy(canvas).float() / 255.0 - 0.5) / 0.5
            gh, gw = ph // p, pw // p
            pv.append(x.reshape(gh, p, gw, p, 3).permute(0, 2, 4, 1, 3).reshape(gh * gw, 3, p, p))
            grids.append([1, gh, gw])
        return {"pixel_values": torch.cat(pv), "image_grid_thw": torch.tensor(grids)}

    def __call__(self, text, images, return_tensors="pt"):
        out = self.pixels(images)
        tokens = [int(g[1] * g[2]) // self.merge**2 for g in out["image_grid_thw"]]
        parts = text[0].split(PAD)
        expanded = parts[0] + "".join(PAD * n + rest for n, rest in zip(tokens, parts[1:]))
        ids = self.tokenizer(expanded, return_tensors=return_tensors)
        from transformers import BatchFeature
        return BatchFeature(dict(ids, **out))


def processor(ckpt):
    """transformers' Kimi_K25Processor when torchvision is there, else FallbackProcessor; and its name."""
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    try:
        from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor
        from transformers.models.kimi_k25.video_processing_kimi_k25 import Kimi_K25VideoProcessor
        image_processor = Kimi_K25ImageProcessor()
        proc = Kimi_K25Processor(image_processor=image_processor, tokenizer=tokenizer,
                                 video_processor=Kimi_K25VideoProcessor())
        return proc, lambda images: image_processor(images=images, return_tensors="pt"), "Kimi_K25Processor"
    except ImportError:
        proc = FallbackProcessor(tokenizer)
        return proc, proc.pixels, "fallback (PIL + numpy: no torchvision)"


def encoder_flops(vision, text_hidden, grids, merge=(2, 2)):
    """FLOPs of MoonViT + projector for images of patch grids `grids` [(h, w)], 2 per multiply-add, matmuls only
    (LayerNorm, GELU, softmax, RoPE and the position add are elementwise and left out: < 1 %). Per image with
    N = h*w patches, C = hidden, F = MLP width, P = 3*patch^2, M = N / (mh*mw) merged tokens, D = text hidden:
      patch embed 2*N*P*C;  per layer: q/k/v 2*N*C*3C, scores QK^T 2*N*N*C and PV 2*N*N*C (all heads: heads*hd = C,
      attention within the image only), out projection 2*N*C*C, MLP 2*2*N*C*F;  merger 0 (the 2x2 merge of a single
      image is a reshape);  projector 2*M*4C*4C + 2*M*4C*D.
    The same formula is in benches/vision_bench.rs (`encoder_flops`)."""
    c, f, layers, p = vision["hidden_size"], vision["intermediate_size"], vision["num_hidden_layers"], vision["patch_size"]
    total = 0
    for h, w in grids:
        n, m = h * w, h * w // (merge[0] * merge[1])
        layer = 2 * n * c * 3 * c + 2 * 2 * n * n * c + 2 * n * c * c + 2 * 2 * n * c * f
        total += 2 * n * 3 * p * p * c + layers * layer + 2 * m * 4 * c * 4 * c + 2 * m * 4 * c * text_hidden
    return total


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("image")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa, eager, flash_attention_2")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--images-per-call", type=int, default=1)
    ap.add_argument("--text-tokens", type=int, default=100)
    ap.add_argument("--ttft-repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]
    t0 = time.time()
    model = Kimi_K25ForConditionalGeneration.from_pretrained(a.ckpt, dtype=dtype, device_map=a.device,
                                                             attn_implementation=a.attn).eval()
    load_s = time.time() - t0
    proc, pixels, proc_name = processor(a.ckpt)
    with Image.open(a.image) as im:
        image = im.convert("RGB")  # decoded before any timer, as dayone decodes before submitting
    vision = model.config.vision_config.to_dict()
    text_hidden = model.config.text_config.hidden_size
    common = {"impl": "transformers", "attn": a.attn, "dtype": a.dtype, "device": a.device,
              "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
              "processor": proc_name, "image": f"{image.width}x{image.height}", "load_s": round(load_s, 2)}

    # 1. Encoder throughput.
    pix = pixels([image] * a.images_per_call)
    pv, grid = pix["pixel_values"], pix["image_grid_thw"]
    grids = [(int(g[1]), int(g[2])) for g in grid]
    flops = encoder_flops(vision, text_hidden, grids)
    grid_dev = grid.to(a.device)
    times = []
    with torch.inference_mode():
        for i in range(a.warmup + a.iters):
            sync(a.device)
            t = time.perf_counter()
            out = model.model.get_image_features(pv.to(a.device, dtype), grid_dev).pooler_output
            sync(a.device)
            if i >= a.warmup:
                times.append(time.perf_counter() - t)
    tokens = sum(o.shape[0] for o in out)
    total = sum(times)
    enc = dict(common, measure="encoder", grid=f"{grids[0][0]}x{grids[0][1]}", patches=grids[0][0] * grids[0][1],
               image_tokens=tokens // a.images_per_call, images_per_call=a.images_per_call, iters=a.iters,
               ms_per_call_median=round(1e3 * statistics.median(times), 3),
               images_per_s=round(a.iters * a.images_per_call / total, 3),
               gflop_per_image=round(flops / a.images_per_call / 1e9, 3),
               tflops=round(flops * a.iters / total / 1e12, 2))

    # 2. TTFT of one image + text tokens: processor + forward to the first token.
    words = " ".join(f"t{(7919 * i + 13) % 150000 + 100}" for i in range(a.text_tokens))
    prompt = PAD + " " + words
    ttft, prompt_tokens = [], 0
    with torch.inference_mode():
        for i in range(1 + a.ttft_repeats):
            sync(a.device)
            t = time.perf_counter()
            inputs = proc(text=[prompt], images=[image], return_tensors="pt")
            inputs = inputs.to(a.device, dtype=dtype)  # casts the float pixels only, as vLLM does
            logits = model(**inputs, logits_to_keep=1).logits
            first = int(logits[0, -1].argmax())  # .item() waits for the device
            if i > 0:
                ttft.append(time.perf_counter() - t)
            prompt_tokens = inputs["input_ids"].shape[1]
    ttft_row = dict(common, measure="ttft", text_tokens=a.text_tokens, prompt_tokens=prompt_tokens,
                    image_tokens=prompt_tokens - a.text_tokens, repeats=a.ttft_repeats,
                    ttft_median_s=round(statistics.median(ttft), 5), ttft_min_s=round(min(ttft), 5),
                    first_token=first)
    for row in (enc, ttft_row):
        if a.json:
            print(json.dumps(row))
        else:
            print(" | ".join(f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
