#!/usr/bin/env python3
"""Writes a deterministic JSONL dataset of about --size bytes to stdout-free
--output: records like {"id":…,"text":…,"score":…,"meta":{…}} with mixed
ASCII and non-ASCII text, escapes, big integers and floats, so that the
validator and hashing see realistic bytes. Same arguments, same bytes."""
import argparse
import random

WORDS = ("data juicer shard claim lease heartbeat merge ray head node filter mapper "
         "record manifest attempt publish validate token order balance stream").split()
WIDE = ["数据", "清洗", "分片", "节点", "über", "naïve", "café", "日本語", "😀"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--size", type=int, default=256 << 20)
    ap.add_argument("--seed", type=int, default=20261129)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    written = 0
    i = 0
    with open(a.output, "wb") as f:
        while written < a.size:
            n = rng.randint(10, 46)
            words = [rng.choice(WORDS) for _ in range(n)]
            if rng.random() < 0.2:
                words.insert(rng.randrange(len(words)), rng.choice(WIDE))
            text = " ".join(words)
            if rng.random() < 0.1:
                text += ' \\"quoted\\" line\\nbreak\\ttab \\u00e9'
            big = rng.getrandbits(80)
            line = ('{"id":%d,"text":"%s","score":%r,"meta":{"source":"src-%d","lang":"%s",'
                    '"tags":["t%d","t%d"],"big":%d,"ok":%s}}\n') % (
                i, text, rng.random(), rng.randrange(100), rng.choice(["en", "zh", "de"]),
                rng.randrange(10), rng.randrange(10), big, rng.choice(["true", "false", "null"]))
            data = line.encode("utf-8")
            f.write(data)
            written += len(data)
            i += 1


if __name__ == "__main__":
    main()
