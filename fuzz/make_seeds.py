#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/seeds/<target>/) from the repository's fixtures and from the
headers of real GGUF files, never their weights.

    python3 fuzz/make_seeds.py [GGUF ...]   (default: ~/.cache/augur/models/*.gguf)

A real GGUF becomes small seeds: its metadata with every array cut to its first entries (the merges to those
among the kept tokens), and for `gguf_config` its tensor table with each tensor shrunk to one block of zeros, so
that the file is consistent and the config is read from it. The seeds stay a few hundred KB in all.
"""
import glob
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")
KEEP_TOKENS = 400

# ggml type -> (block size, bytes per block)
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
          10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
          30: (1, 2)}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class R:
    def __init__(self, b):
        self.b, self.p = b, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.b[self.p:self.p + n]
        self.p += n
        return s

    def value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == 8:
            return self.string()
        et, n = self.take("<I"), self.take("<Q")
        return (et, [self.value(et) for _ in range(n)])


def read_gguf(path):
    with open(path, "rb") as f:
        head = f.read(64 << 20)
    r = R(head)
    assert r.take("<I") == 0x46554747 and r.take("<I") == 3, path
    nt, nkv = r.take("<Q"), r.take("<Q")
    kv = []
    for _ in range(nkv):
        k = r.string()
        t = r.take("<I")
        kv.append((k, t, r.value(t)))
    tensors = []
    for _ in range(nt):
        name = r.string()
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        ty = r.take("<I")
        r.take("<Q")
        tensors.append((name, dims, ty))
    return kv, tensors


def w_string(s):
    return struct.pack("<Q", len(s)) + s


def w_value(t, v):
    if t in SCALAR:
        return struct.pack(SCALAR[t], v)
    if t == 8:
        return w_string(v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(w_value(et, x) for x in items)


def shrink(kv):
    """Arrays cut to KEEP_TOKENS entries, plus the tokens that `*_token_id` keys name (renumbered); merges kept
    where both parts and the result are kept tokens."""
    tokens = next((v[1] for k, t, v in kv if k == b"tokenizer.ggml.tokens"), [])
    named = sorted({v for k, t, v in kv if k.endswith(b"_token_id") and t != 9 and KEEP_TOKENS <= v < len(tokens)})
    picked = list(range(min(KEEP_TOKENS, len(tokens)))) + named
    renumber = {old: new for new, old in enumerate(picked)}
    kept = set(tokens[i] for i in picked)
    out = []
    for k, t, v in kv:
        if t == 9 and k == b"tokenizer.ggml.merges":
            merges = [m for m in v[1] if len(m.split(b" ", 1)) == 2
                      and all(p in kept for p in m.split(b" ", 1)) and m.replace(b" ", b"", 1) in kept]
            v = (v[0], merges[:KEEP_TOKENS])
        elif t == 9 and len(v[1]) == len(tokens):
            v = (v[0], [v[1][i] for i in picked])
        elif t == 9:
            v = (v[0], v[1][:KEEP_TOKENS])
        elif k.endswith(b"_token_id") and v in renumber:
            v = renumber[v]
        out.append((k, t, v))
    return out


def write_gguf(path, kv, tensors):
    body = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kv))
    body += b"".join(w_string(k) + struct.pack("<I", t) + w_value(t, v) for k, t, v in kv)
    data = b""
    for name, dims, ty in tensors:
        block, size = BLOCKS[ty]
        # One block: the first dimension (fastest varying) holds it, the others are 1.
        body += w_string(name) + struct.pack("<I", len(dims)) + struct.pack("<Q", block)
        body += b"".join(struct.pack("<Q", 1) for _ in dims[1:])
        body += struct.pack("<IQ", ty, len(data))
        data += bytes(size) + bytes(-size % 32)
    body += bytes(-len(body) % 32)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(body + data)


def put(target, name, data):
    os.makedirs(os.path.join(SEEDS, target), exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(SEEDS, target, name), mode) as f:
        f.write(data)


def main():
    ggufs = sys.argv[1:] or sorted(glob.glob(os.path.expanduser("~/.cache/augur/models/*.gguf")))
    for g in ggufs:
        stem = os.path.basename(g).rsplit(".gguf", 1)[0]
        kv, tensors = read_gguf(g)
        small = shrink(kv)
        write_gguf(os.path.join(SEEDS, "gguf_config", stem), small, tensors)
        write_gguf(os.path.join(SEEDS, "gguf_tokenizer", stem), small, [])
        template = next((v for k, t, v in kv if k == b"tokenizer.chat_template"), None)
        if template is not None:
            put("chat_template", stem, template + b"\0system\0Be brief.\0user\0Hi\0assistant\0Hello!\0user\0Why?")
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    for d in sorted(os.listdir(fixtures)):
        fd = os.path.join(fixtures, d)
        if not os.path.isfile(os.path.join(fd, "config.json")):
            continue
        with open(os.path.join(fd, "config.json"), "rb") as f:
            put("config_json", d, f.read())
        tpl = os.path.join(fd, "chat_template.jinja")
        if os.path.isfile(tpl):
            with open(tpl, "rb") as f:
                put("chat_template", d, f.read() + b"\0user\0Hi\0assistant\0Hello!\0user\0Why?")
        st = os.path.join(fd, "model.safetensors")
        with open(st, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        # The three smallest tensors, with their data, as a safetensors file of its own.
        names = sorted((k for k in header if k != "__metadata__"),
                       key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0])[:3]
        out, blob = {}, b""
        for k in names:
            a, b = header[k]["data_offsets"]
            out[k] = dict(header[k], data_offsets=[len(blob), len(blob) + b - a])
            blob += data[a:b]
        h = json.dumps(out).encode()
        h += b" " * (-len(h) % 8)
        put("safetensors", d, struct.pack("<Q", len(h)) + h + blob)
        index = {"metadata": {"total_size": len(blob)},
                 "weight_map": {k: "model-0000%d-of-00002.safetensors" % (i % 2 + 1) for i, k in enumerate(names)}}
        put("safetensors", d + ".index.json", json.dumps(index, indent=2))


if __name__ == "__main__":
    main()
